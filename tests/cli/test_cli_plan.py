"""`mindspore-hyper plan` through the console script: the GPT preset with the layout flags (the
simulated report and the estimate agree), a user model with a parallel config YAML, errors."""
import os

from cli_run import ROOT, cli, cli_json

TESTS = os.path.join(ROOT, "tests")

GPT_PARAMS = 117_504  # examples/models.py GPT with its defaults


def test_gpt_preset_json_report_and_estimate_agree():
    out = cli_json("plan", "--data", "2", "--pipeline", "2", "--zero", "1")
    assert out["report"]["mesh"] == {"data": 2, "tensor": 1, "pipeline": 2}
    assert len(out["strategy_table"]["parameters"]) == 29
    memory = out["report"]["memory"]
    assert len(memory) == 4
    # stage 0 (embedding + a layer, 59,200 parameters) and stage 1 (a layer + head, 58,304), fp32
    assert sorted({m["parameters"] for m in memory.values()}) == [58_304 * 4, 59_200 * 4]
    assert sum(m["parameters"] for m in memory.values()) == 2 * GPT_PARAMS * 4
    rows = out["estimate"]
    assert len(rows) == 4 * 4 and all(r["compared"] for r in rows)
    for r in rows:
        if r["kind"] != "activations":
            assert r["estimated"] == r["simulated"], r
        else:
            assert abs(r["estimated"] - r["simulated"]) / r["simulated"] < 0.05, r


def test_gpt_preset_text_with_tensor_parallelism(tmp_path):
    png = tmp_path / "plan.png"
    code, out, err = cli("plan", "--tensor", "2", "--init-args", '{"layers": 1}', "--batch", "4", "--plot", str(png))
    assert code == 0, err
    assert "StrategyTable: mesh (1, 2, 1)" in out and "blocks.0.attn.qkv.weight" in out
    assert "communication per step" in out and "AllReduce" in out
    assert "estimate (mindspore_hyper.estimate) vs simulated" in out
    assert "parameters" in out and "exact" in out and "not comparable" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


MLP_CONFIG = '''
parallel_config:
  device_matrix: [2, 4]
  alias_names: [data, tensor]
  module_level:
    - name: fc1
      strategy:
        tensor: (4,1)
    - name: fc2
      strategy:
        tensor: (1,4)
  parameter_level:
    - {name: fc2.bias, tensor_map: [None]}
'''


def test_user_model_with_a_parallel_config(tmp_path):
    """tests/sim_models.py's MLP (fc1, act, fc2), imported from the current directory."""
    (tmp_path / "tp.yaml").write_text(MLP_CONFIG)
    out = cli_json("plan", "--model", "sim_models:MLP", "--init-args", '{"d_in": 16, "d_hidden": 32, "d_out": 16}',
                   "--inputs", "float32:8x16", "--config", str(tmp_path / "tp.yaml"), "--forward-only",
                   "--optimizer", "sgd", cwd=TESTS)
    # fc1 weight (32,16)/4 + bias 32/4 + fc2 weight (16,32) split on dim 1 + bias 16 = 280 parameters
    assert all(m["parameters"] == 280 * 4 for m in out["report"]["memory"].values())
    assert out["report"]["comm"]["AllReduce"]["tensor"]["count"] == 1  # the row-parallel partial sums
    assert out["estimate"] == []


def test_user_model_with_the_data_and_zero_flags():
    """Issue 42: --model X --data 2 resolved the GPT preset's layout on X (an error naming
    'embed.embedding_table'); --data and --zero need no parameter names."""
    out = cli_json("plan", "--model", "sim_models:MLP", "--inputs", "float32:8x16", "--data", "2", "--zero", "1",
                   cwd=TESTS)
    assert out["report"]["mesh"] == {"data": 2}
    assert list(out["strategy_table"]["parameters"]) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    memory = out["report"]["memory"]["0"]
    assert memory["optimizer_states"] == memory["parameters"]  # Adam's 2 states, halved by ZeRO-1 over data 2
    check_usage_error(["plan", "--model", "sim_models:MLP", "--inputs", "float32:8x16", "--data", "2", "--tensor", "2"],
                      "--tensor 2: these flags split the GPT preset's parameters by their names; for --model "
                      "sim_models:MLP give a parallel config naming its Cells (--config YAML", cwd=TESTS)


def check_usage_error(args, fragment, cwd=None):
    code, out, err = cli(*args, **({"cwd": cwd} if cwd else {}))
    assert code == 2, (code, out, err)
    assert fragment in err, err


def test_errors_exit_2_naming_the_flag():
    check_usage_error(["plan"], "no strategy: give --config YAML, or --data/--tensor/--pipeline/--zero")
    check_usage_error(["plan", "--config", "x.yaml", "--data", "2"], "--config and --data both give the strategy")
    check_usage_error(["plan", "--data", "2", "--batch", "7"], "--batch 7 must divide by --data 2")
    check_usage_error(["plan", "--data", "2", "--init-args", "{layers: 2}"], "argument --init-args: expected a JSON")
    check_usage_error(["plan", "--data", "2", "--init-args", '{"depth": 2}'], "--init-args")
    check_usage_error(["plan", "--model", "nowhere.mod:Net", "--inputs", "float32:8x4", "--data", "2"],
                      "cannot import module 'nowhere.mod'")
    check_usage_error(["plan", "--model", "sim_models:MLP", "--config", "c.yaml"], "give its --inputs")
    check_usage_error(["plan", "--zero", "2"], "argument --zero: invalid choice: 2")
    check_usage_error(["plan", "--data", "2", "--batch", "4", "--inputs", "int32:4x16:128"],
                      "--batch sets the gpt preset's batch")
    check_usage_error(["plan", "--model", "sim_models:MLP", "--inputs", "float32:8", "--config", "c.yaml"],
                      "--config c.yaml: no such file", cwd=TESTS)
    check_usage_error(["plan", "--model", "sim_models:MLP", "--inputs", "complex:8x16", "--data", "2"],
                      "--inputs 'complex:8x16': expected DTYPE:SHAPE[:HIGH]", cwd=TESTS)


def test_a_layout_the_estimator_does_not_cover_is_said():
    out = cli_json("plan", "--tensor", "8", "--init-args", '{"layers": 1}', "--batch", "2")
    assert out["estimate"] == [] and "tensor=8: the attention heads (4) must divide" in out["estimate_unavailable"]
    assert len(out["report"]["memory"]) == 8


def test_search_progress_bar_only_on_a_terminal(monkeypatch):
    """Issue 42: `plan --search` wrote its progress bar into piped output."""
    import mindspore_hyper.cli.plan_search as plan_search

    args = ("plan", "--search", "--preset", "llama2-7b", "--devices", "256", "--global-batch", "256", "--top", "1")
    code, out, err = cli(*args)  # stderr captured: not a terminal
    assert code == 0 and "#1 " in out and "search [" not in err, err
    monkeypatch.setattr(plan_search, "is_terminal", lambda stream: True)
    code, out, err = cli(*args)
    assert code == 0 and "search [" in err and "layouts" in err


RLHF_CONFIG = os.path.join(ROOT, "configs", "rlhf_process_groups.yaml")
ROLES = ("plan", "--model", "group_models:ThreeRoles", "--config", RLHF_CONFIG)


def test_a_config_with_device_groups_plans_each_groups_mesh_and_rows():
    """Issue 40/h8: a config with device groups printed the config-level table (every parameter on
    the job mesh); plan builds the MPMD job and shows each group's own mesh and rows.
    configs/rlhf_process_groups.yaml: actor on ranks 0-7, critic 8-11, reward (reward_model) 12-15,
    each data parallel over its ranks with ZeRO-1 (optimizer.sharding); ThreeRoles has one
    Dense(4, 8) per role: weight (8, 4) + bias (8) = 40 float32 = 160 B."""
    out = cli_json(*ROLES, "--inputs", "float32:8x4", cwd=os.path.dirname(__file__))
    table = out["strategy_table"]
    ranks = {"actor": list(range(8)), "critic": [8, 9, 10, 11], "reward": [12, 13, 14, 15]}
    assert {g: m["ranks"] for g, m in table["group_meshes"].items()} == ranks
    assert {g: m["device_matrix"] for g, m in table["group_meshes"].items()} == {
        "actor": [8], "critic": [4], "reward": [4]}
    groups = out["report"]["mpmd"]["groups"]
    for group, cell in (("actor", "actor"), ("critic", "critic"), ("reward", "reward_model")):
        assert groups[group]["mesh"] == {"device_matrix": [len(ranks[group])], "alias_names": ["data"]}
        rows = groups[group]["parameters"]
        assert sorted(rows) == [f"{cell}.bias", f"{cell}.weight"]
        assert all(r["devices"] == ranks[group] and r["group"] == group for r in rows.values())
        assert table["parameters"][f"{cell}.weight"]["devices"] == ranks[group]
    memory = out["report"]["memory"]
    # Adam's 2 states of 40 floats, split over the group's ranks along dimension 0 (8 divides by 8 and 4):
    # 2 x 40 x 4 B / 8 = 40 B on an actor rank, / 4 = 80 B on a critic or reward rank
    assert {memory[str(r)]["optimizer_states"] for r in range(8)} == {40}
    assert {memory[str(r)]["optimizer_states"] for r in range(8, 16)} == {80}
    assert all(memory[str(r)]["parameters"] == 160 for r in range(16))

    code, text, err = cli(*ROLES, "--inputs", "float32:8x4", "--forward-only", cwd=os.path.dirname(__file__))
    assert code == 0, err
    lines = text.splitlines()
    heading = lines.index("group critic: tensor maps on its own mesh (4,) ('data',) (ranks [8, 9, 10, 11])")
    assert lines[heading + 1].split()[:6] == ["critic.weight", "(8,4)", "(8,4)", "Float32", "(None,", "None)"]
    assert lines[heading + 2].startswith("critic.bias ")
    assert "group actor: tensor maps on its own mesh (8,) ('data',) (ranks [0, 1, 2, 3, 4, 5, 6, 7])" in lines
    assert "MPMD groups:" in text


def test_a_group_that_does_not_fit_is_refused_naming_it():
    """The seed's multimodal config as written: 128 data-parallel ranks cannot split the text
    encoder's batch_size of 32; and a batch other than a group's batch_size."""
    check_usage_error(["plan", "--model", "mpmd_models:Multimodal", "--inputs", "float32:32x8", "float32:16x12",
                       "float32:16x4", "--config", os.path.join(ROOT, "configs", "multimodal_process_groups.yaml")],
                      "process_groups.text_encoder (data parallel over its 128 ranks): group 'text_encoder' (ranks "
                      "0-127) cannot split input 0 of its Cell 'text_encoder', shape (32, 8): the batch (dimension 0) "
                      "is 32, which does not divide over the 128 devices", cwd=os.path.join(TESTS, "mpmd"))
    check_usage_error([*ROLES, "--inputs", "float32:6x4"],
                      "process_groups.actor.batch_size: 8, but Cell 'actor' got input 0 with batch 6",
                      cwd=os.path.dirname(__file__))
