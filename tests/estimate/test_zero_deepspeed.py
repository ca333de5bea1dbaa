"""DeepSpeed's ZeRO-2/3 model-state estimators: same defaults and bytes as DeepSpeed's formulas
(deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs and
stage_1_and_2.py estimate_zero2_model_states_mem_needs), values computed here by hand."""
import inspect
import io

from mindspore import nn

from mindspore_hyper.estimate import (cell_param_counts, estimate_zero2_model_states_mem_needs,
                                      estimate_zero2_model_states_mem_needs_all_cold,
                                      estimate_zero2_model_states_mem_needs_all_live,
                                      estimate_zero3_model_states_mem_needs,
                                      estimate_zero3_model_states_mem_needs_all_cold,
                                      estimate_zero3_model_states_mem_needs_all_live)

N, LARGEST = 2_000_000_000, 100_000_000  # 2 nodes x 8 GPUs below: 16 GPUs, gpus_factor 1/2


def test_signatures_and_defaults_match_deepspeed():
    z3 = inspect.signature(estimate_zero3_model_states_mem_needs).parameters
    assert list(z3) == ["total_params", "largest_layer_params", "num_gpus_per_node", "num_nodes", "cpu_offload",
                        "cpu_offload_params", "zero_init", "additional_buffer_factor"]
    assert [z3[k].default for k in list(z3)[2:]] == [1, 1, True, True, True, 1.5]
    z2 = inspect.signature(estimate_zero2_model_states_mem_needs).parameters
    assert list(z2) == ["total_params", "num_gpus_per_node", "num_nodes", "cpu_offload", "additional_buffer_factor"]
    assert [z2[k].default for k in list(z2)[1:]] == [1, 1, True, 1.5]


def test_zero3_every_branch_by_hand():
    def z3(offload, params, init):
        return estimate_zero3_model_states_mem_needs(N, LARGEST, 8, 2, offload, params, init)

    # gpu = 4 * largest = 4e8; cpu = N * 18 * (1/2) * 1.5
    assert z3(True, True, True) == (27_000_000_000, 400_000_000, 400_000_000)
    # cpu = N * max(4 * 8, 18 / 2) * 1.5
    assert z3(True, True, False) == (96_000_000_000, 400_000_000, 400_000_000)
    # gpu = 4e8 + 2N/16; cpu = N * 16 * (1/2) * 1.5
    assert z3(True, False, True) == (24_000_000_000, 650_000_000, 400_000_000)
    assert z3(True, False, False) == (96_000_000_000, 650_000_000, 400_000_000)
    # gpu = 4e8 + 18N/16; cpu = largest * 4 * 8 * 1.5 (zero_init) or N * 4 * 8 * 1.5
    assert z3(False, False, True) == (4_800_000_000, 2_650_000_000, 400_000_000)
    assert z3(False, False, False) == (96_000_000_000, 2_650_000_000, 400_000_000)


def test_zero3_defaults_and_truncation():
    # defaults: 1 GPU, 1 node, both offloads, zero_init: cpu = 1e9 * 18 * 1.5, gpu = 4 * 1e8
    assert estimate_zero3_model_states_mem_needs(1_000_000_000, 100_000_000) == (
        27_000_000_000, 400_000_000, 400_000_000)
    # int(2 * 1,000,000,007 / 3) = 666,666,671 (truncated, as DeepSpeed's int())
    _, gpu, _ = estimate_zero3_model_states_mem_needs(1_000_000_007, 10, 3, 1, True, False)
    assert gpu == 40 + 666_666_671


def test_zero2_both_branches_by_hand():
    # offload: gpu = 2N; cpu = N * max(4 * 16, 16) * 1.5
    assert estimate_zero2_model_states_mem_needs(N, 8, 2, True) == (192_000_000_000, 4_000_000_000)
    # no offload: gpu = 2N + 18N/16; cpu = N * 4 * 8 * 1.5
    assert estimate_zero2_model_states_mem_needs(N, 8, 2, False) == (96_000_000_000, 6_250_000_000)
    # defaults: 1 GPU, offload: cpu = N * 16 * 1.5
    assert estimate_zero2_model_states_mem_needs(N) == (48_000_000_000, 4_000_000_000)


def test_all_cold_tables_print_every_option_in_deepspeeds_order():
    out = io.StringIO()
    rows = estimate_zero3_model_states_mem_needs_all_cold(N, LARGEST, 8, 2, stream=out)
    assert [(r["cpu_offload"], r["cpu_offload_params"], r["zero_init"]) for r in rows] == [
        (True, True, True), (True, True, False), (True, False, True), (True, False, False),
        (False, False, True), (False, False, False)]
    assert [r["gpu_bytes"] for r in rows] == [400_000_000] * 2 + [650_000_000] * 2 + [2_650_000_000] * 2
    text = out.getvalue()
    assert "2000M parameters, largest layer 100M" in text
    # 27e9 B = 25.15 GiB, 4e8 B = 0.37 GiB
    assert "   25.15GB |   0.37GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1" in text
    out2 = io.StringIO()
    rows2 = estimate_zero2_model_states_mem_needs_all_cold(N, 8, 2, stream=out2)
    assert [(r["cpu_bytes"], r["gpu_bytes"]) for r in rows2] == [(192_000_000_000, 4_000_000_000),
                                                                 (96_000_000_000, 6_250_000_000)]
    assert "offload_optimizer=none" in out2.getvalue()


class Shared(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = nn.Dense(10, 20)   # 220 parameters
        self.b = nn.Dense(20, 5)    # 105
        self.again = self.a         # the same Cell twice: its parameters count once

    def construct(self, x):
        return self.b(self.again(self.a(x)))


def test_all_live_counts_a_mindspore_cell():
    model = Shared()
    assert cell_param_counts(model) == (325, 220)
    live, cold = io.StringIO(), io.StringIO()
    assert estimate_zero3_model_states_mem_needs_all_live(model, 4, 1, stream=live) == \
        estimate_zero3_model_states_mem_needs_all_cold(325, 220, 4, 1, stream=cold)
    assert live.getvalue() == cold.getvalue()
    assert estimate_zero2_model_states_mem_needs_all_live(model, 4, stream=io.StringIO()) == \
        estimate_zero2_model_states_mem_needs_all_cold(325, 4, stream=io.StringIO())
