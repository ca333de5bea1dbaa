"""The transformers sweep (migrate_sweep.py): a fast subset in the suite (GPT-NeoX, RoBERTa, Gemma, Qwen2 and
GPT-2: built from scaled-down configs, converted by the default `convert` at (2, 8), equal to torch at (3, 11)
and through 5 AdamW steps, <= 1e-4, the tolerance derived in migrate_sweep's docstring; then parallel as converted:
under auto_parallelize on a 2 x 2 data x tensor mesh in simulation with tensor_parallel_plan's splits on the torch
names, and the causal LMs with pipeline 2 over their layer list, one step's loss and gradients equal one
device's). The named list
(or every family) runs only on request: MIGRATE_SWEEP=named (or all) with `-m sweep`."""
import os

import numpy as np
import pytest
import torch

import migrate_sweep as sweep

pytestmark = pytest.mark.usefixtures("pynative")


@pytest.mark.parametrize("family, head", sweep.FAST)
def test_fast_subset_passes(family, head):
    row = sweep.sweep_one(family, head)
    assert row.status == "pass", row
    assert row.forward_error <= sweep.TOL and row.train_error <= sweep.TOL
    assert not row.fallbacks  # each class generated, none written as its traced body
    # parallel as converted: 2 x 2 data x tensor in simulation, one step (GPT-NeoX, Gemma, Qwen2 from transformers'
    # tp_plan, RoBERTa and GPT-2 by the module-name rules), and pipeline 2 for the causal LMs
    assert row.parallel_error <= sweep.TOL and not row.parallel_reason, row
    assert row.parallel_source == ("module names" if family in ("roberta", "gpt2") else "transformers tp_plan")
    assert (row.pipeline_error <= sweep.TOL) if head == "causal-lm" else row.pipeline_error is None


def test_a_family_whose_linears_no_rule_splits_fails_the_parallel_check():
    """parallel_checks: Linears in the layer list but none the plan splits is a failure with that reason (only a
    family with no Linear in its layer lists at all runs data 4 only)."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mystery = torch.nn.Linear(4, 4)

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([Block(), Block()])
    row = sweep.SweepRow("toy", "causal-lm")
    with pytest.raises(sweep.ParallelCheckFailed, match=r"parallel: AssertionError: no Linear to split \(module "
                                                        r"names: 1 left whole, e.g. model.layers.\*.mystery: no "
                                                        r"column/row name rule") as failed:
        sweep.parallel_checks(row, model, "causal-lm", None, None, None)
    assert failed.value.stage == "parallel"
    assert row.parallel_reason.startswith("parallel: AssertionError: no Linear to split")
    assert sweep.parallel_cell(row).startswith("fail: parallel: AssertionError: no Linear to split")


def test_a_gradient_zero_in_exact_arithmetic_is_compared_above_a_floor():
    """_step_error: a gradient that is zero in exact arithmetic (BERT's attention key bias) is rounding of either
    sign, so it is compared against GRADIENT_FLOOR x the largest gradient; a real gradient against its own size."""
    want = [np.array([0.5, -0.25]), np.array([7e-13])]
    assert sweep._step_error(2.0, [want[0], np.array([-1.2e-12])], 2.0, want) == pytest.approx(1.9e-12 / 5e-4)
    assert sweep._step_error(2.0, [np.array([0.5, -0.2]), want[1]], 2.0, want) == pytest.approx(0.05 / 0.5)
    assert sweep._step_error(2.2, want, 2.0, want) == pytest.approx(0.1)  # the loss, relative


def test_the_table_has_a_parallel_column():
    row = sweep.SweepRow("llama", "causal-lm", "LlamaForCausalLM", "pass", "pipeline", forward_error=1e-7,
                         train_error=2e-7, loss_units=0.1, parameter_units=0.2, parallel_error=5.6e-7,
                         parallel_source="transformers tp_plan", pipeline_error=4.2e-7)
    conv = sweep.SweepRow("convnext", "image-classification", "C", "pass", "parallel", forward_error=1e-7,
                          train_error=2e-7, parameter_units=0.2, parallel_error=1e-7,
                          parallel_source="data 4 only: no Linear in the layer lists")
    lines = sweep.table([row, conv]).splitlines()
    assert lines[0].endswith("| parallel (simulation) |")
    assert lines[2].endswith("| pass: 2 x 2 data x tensor (transformers tp_plan) 5.6e-07; pipeline 2 4.2e-07 |")
    assert lines[3].endswith("| pass: data 4 only: no Linear in the layer lists 1.0e-07 |")


def test_a_wrong_conversion_fails_the_sweep(monkeypatch):
    """The check can fail: a converted GPT-NeoX with one norm weight off by 1% fails at the forward stage."""
    from mindspore_hyper.migrate import converter

    real = converter.convert

    def skewed(*args, **kwargs):
        cell, report = real(*args, **kwargs)
        gamma = next(p for n, p in cell.parameters_and_names() if n.endswith("final_layer_norm.gamma"))
        gamma.set_data(gamma * 1.01)
        return cell, report
    monkeypatch.setattr(converter, "convert", skewed)
    row = sweep.sweep_one("gpt_neox", "causal-lm")
    assert row.status == "fail" and row.stage == "forward" and "max_relative_error" in row.reason, row


def test_losses_get_the_float64_allowance_after_the_first_step_only():
    """loss_error: from the second step on a loss may differ from torch's by up to ROUNDING_FACTOR (3) x torch's own
    float32-to-float64 distance at that step (BatchNorm conv nets over tiny batches amplify rounding); the first
    step's loss (before any step amplifies anything) by TOL alone. Synthetic losses, so the numbers are exact up to
    double rounding (~1e-16), far inside pytest.approx's 1e-6."""
    want, exact = [1.0, 0.70, 0.60], [1.0, 0.80, 0.65]  # torch float32 0.10 and 0.05 from float64 at steps 2, 3
    got = [1.0, 0.90, 0.70]  # 0.20 and 0.10 off: 2/3 of 3 x (0.10, 0.05), ~3000 x TOL
    assert sweep.loss_error(want, got, exact) == pytest.approx(2 / 3)
    assert sweep.loss_error(want, got) == pytest.approx(0.2 / (sweep.TOL * 0.7))  # no reference: TOL only
    assert sweep.loss_error(want, [1.0, 0.70, 0.76], exact) == pytest.approx(0.16 / 0.15)  # over it at step 3
    assert sweep.loss_error.where == 2
    # the first step gets no allowance: 2e-4 off while torch float32 is 0.5 from float64 there fails
    assert sweep.loss_error([1.0, 0.7], [1.0002, 0.7], [0.5, 0.7]) == pytest.approx(2.0)
    assert sweep.loss_error.where == 0
    assert sweep.loss_error([1.0, 0.7], [1.0, float("nan")], [1.0, 0.6]) == float("inf")  # NaN fails
    with pytest.raises(ValueError, match="one loss per step; got lengths 2, 1 and None"):
        sweep.loss_error([1.0, 0.7], [1.0])


def test_a_mindspore_error_banner_is_left_out_of_the_reason():
    """MindSpore's errors open with banners; the row's reason is the first line after them (it read "TypeError:
    -----" for RecurrentGemma)."""
    exc = TypeError("\n" + "-" * 52 + "\n- Kernel select failed:\n" + "-" * 52 + "\nSelect CPU operator[Identity] fail! "
                    "Unsupported data type!\nThe supported data types are ...")
    assert sweep._first_line(exc) == "TypeError: Select CPU operator[Identity] fail! Unsupported data type!"


def test_inputs_of_models_without_an_image_size_or_named_inputs():
    """Conv nets whose config has no image size (PoolFormer) get the sweep's 32 x 32 images; Perceiver's masked LM,
    whose main input is `inputs`, gets token ids; Wav2Vec2-BERT gets (batch, frames, features) features (all three
    were "not built" before)."""
    pool = sweep.build_model("poolformer", "image-classification")
    assert tuple(sweep.inputs_for(pool, "image-classification", 2, 8, seed=0)[0].shape) == (2, 3, 32, 32)
    perceiver = sweep.build_model("perceiver", "masked-lm")
    ids = sweep.inputs_for(perceiver, "masked-lm", 2, 8, seed=0)[0]
    assert ids.dtype == torch.int64 and tuple(ids.shape) == (2, 8) and int(ids.max()) < perceiver.config.vocab_size
    bert = sweep.build_model("wav2vec2-bert", "audio-classification")  # (batch, frames, features) audio features
    assert tuple(sweep.inputs_for(bert, "audio-classification", 2, 8, seed=0)[0].shape) == (2, 8, 160)


def test_dropout_rates_given_per_stage_are_turned_off():
    """CvT's drop_path_rate is a list (0.0, 0.0, 0.1): stochastic depth samples at random in training, so the
    training check could never agree with torch; the scaled config sets every stage's rate to 0."""
    from transformers import AutoConfig

    assert sweep._scaled_kwargs(AutoConfig.for_model("cvt"))["drop_path_rate"] == [0.0, 0.0, 0.0]


def test_scaled_configs_of_vibevoice_zamba_zaya_and_xmod():
    """VibeVoice's audio tokenizers double their channels at each of 6 stages (~1e9 parameters at the default 32
    filters: out of memory in training): 4 filters and one block per stage; Zamba's and Zamba 2's default lists of
    layer kinds are longer than 2 whatever the depth (the config refused 2 layers): 2 hybrid layers (a Mamba layer
    after the shared transformer); ZAYA refuses 2 experts per
    token by name: its default (1); X-MOD's adapters need a default language: its first. All four were "not built"
    or out of memory before."""
    from transformers import AutoConfig

    tokenizer = sweep._scaled_kwargs(AutoConfig.for_model("vibevoice_asr"))["acoustic_tokenizer_encoder_config"]
    assert tokenizer["num_filters"] == 4 and tokenizer["depths"] == [1] * 7
    for family in ("zamba", "zamba2"):
        assert sweep.build_model(family, "causal-lm").config.layers_block_type == ["hybrid", "hybrid"]
    assert sweep.build_model("zaya", "causal-lm").config.num_experts_per_tok == 1  # refused 2: its default
    xmod = sweep.build_model("xmod", "masked-lm")
    with torch.no_grad():
        assert tuple(xmod(torch.randint(3, 100, (2, 8))).logits.shape) == (2, 8, sweep.VOCAB)


def test_the_wrapper_passes_the_masks_eager_builds_itself():
    """LongT5 and Switch Transformers leave their all-ones attention mask None under torch.export, and FSMT's
    default decoder mask branches on a value: the wrapper passes those masks itself; the model's output through
    the wrapper equals the model called as eager torch calls it (without them), on ids with and without pads."""
    for family, mask in (("longt5", "attention_mask"), ("fsmt", "decoder_attention_mask")):  # Switch: as LongT5
        assert family in sweep.ONES_ATTENTION_MASK + sweep.PAD_DECODER_MASK
        model = sweep.build_model(family, "seq2seq").eval()
        ids, decoder = sweep.inputs_for(model, "seq2seq", 2, 8, seed=0)
        decoder[0, -2:] = model.config.pad_token_id  # a padded decoder row (FSMT masks the pads)
        passed = []
        hook = model.register_forward_pre_hook(lambda m, a, k: passed.append(sorted(k)), with_kwargs=True)
        with torch.no_grad():
            got = sweep.wrapped(model, "seq2seq")(ids, decoder).logits
            hook.remove()
            want = model(input_ids=ids, decoder_input_ids=decoder).logits
        assert mask in passed[0], (family, passed)
        # the same ops on the same values, but the mask is a tensor (an added 0, a masked_fill of nothing) where
        # eager has none: exact
        assert torch.equal(got, want), family


def _requested():
    which = os.environ.get("MIGRATE_SWEEP", "")
    if which == "all":
        return sweep.all_families()
    return sweep.NAMED if which == "named" else []


@pytest.mark.sweep
@pytest.mark.skipif(not os.environ.get("MIGRATE_SWEEP"), reason="opt-in: MIGRATE_SWEEP=named or all")
@pytest.mark.parametrize("family, head", _requested() or [("(none)", "(none)")])
def test_sweep_family(family, head):
    row = sweep.sweep_one(family, head)
    if row.status == "not built":
        pytest.skip(f"{family} does not build offline from the scaled config: {row.reason}")
    assert row.status == "pass", f"{row.stage}: {row.reason}"


def test_nudged_inputs_tell_conditioning_from_a_wrong_layout():
    """nudged_step_error, named in a failing parallel check's reason: one device's loss and gradients with the
    inputs scaled by 1 +- 2^-23. A well-conditioned Dense moves by float32 rounding (its gradients are linear in the
    inputs: a few ulps); BatchNorm over a batch of nearly equal samples divides by their tiny spread and moves by
    orders of magnitude more (conditioning, not a layout error)."""
    from mindspore import nn

    def loss(out, inputs):
        return (out * out).sum()

    x = torch.tensor(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    dense = nn.Dense(3, 2)
    assert sweep.nudged_step_error(dense, (x,), loss) <= 64 * float(np.finfo(np.float32).eps)
    bn = nn.SequentialCell([nn.Dense(3, 3), nn.BatchNorm1d(3), nn.Dense(3, 2)])
    bn.set_train(True)
    near = torch.tensor(np.ones((4, 3), np.float32)) + 1e-4 * x  # the spread over the batch: 1e-4
    assert sweep.nudged_step_error(bn, (near,), loss) > sweep.TOL
