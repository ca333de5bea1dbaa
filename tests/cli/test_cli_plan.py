"""`mindspore-hyper plan` through the console script: the GPT preset with the layout flags (the
simulated report and the estimate agree), a user model with a parallel config YAML, errors."""
from cli_run import cli, cli_json

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


MLP_MODULE = '''
from mindspore import nn


class MLP(nn.Cell):
    def __init__(self, dim=16, hidden=32):
        super().__init__()
        self.fc1 = nn.Dense(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Dense(hidden, dim)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))
'''

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
    (tmp_path / "mlp_model.py").write_text(MLP_MODULE)
    (tmp_path / "tp.yaml").write_text(MLP_CONFIG)
    out = cli_json("plan", "--model", "mlp_model:MLP", "--init-args", '{"dim": 16, "hidden": 32}',
                   "--inputs", "float32:8x16", "--config", "tp.yaml", "--forward-only", "--optimizer", "sgd",
                   cwd=str(tmp_path))
    # fc1 weight (32,16)/4 + bias 32/4 + fc2 weight (16,32) split on dim 1 + bias 16 = 280 parameters
    assert all(m["parameters"] == 280 * 4 for m in out["report"]["memory"].values())
    assert out["report"]["comm"]["AllReduce"]["tensor"]["count"] == 1  # the row-parallel partial sums
    assert out["estimate"] == []


def check_usage_error(args, fragment, cwd=None):
    code, out, err = cli(*args, **({"cwd": cwd} if cwd else {}))
    assert code == 2, (code, out, err)
    assert fragment in err, err


def test_errors_exit_2_naming_the_flag(tmp_path):
    check_usage_error(["plan"], "no strategy: give --config YAML, or --data/--tensor/--pipeline/--zero")
    check_usage_error(["plan", "--config", "x.yaml", "--data", "2"], "--config and --data both give the strategy")
    check_usage_error(["plan", "--data", "2", "--batch", "7"], "--batch 7 must divide by --data 2")
    check_usage_error(["plan", "--data", "2", "--init-args", "{layers: 2}"], "argument --init-args: expected a JSON")
    check_usage_error(["plan", "--data", "2", "--init-args", '{"depth": 2}'], "--init-args")
    check_usage_error(["plan", "--model", "nowhere.mod:Net", "--inputs", "float32:8x4", "--config", "c.yaml"],
                      "cannot import module 'nowhere.mod'")
    check_usage_error(["plan", "--model", "mlp_model:MLP", "--config", "c.yaml"], "give its --inputs")
    check_usage_error(["plan", "--zero", "2"], "argument --zero: invalid choice: 2")
    (tmp_path / "mlp_model.py").write_text(MLP_MODULE)
    check_usage_error(["plan", "--model", "mlp_model:MLP", "--inputs", "float32:8", "--config", "c.yaml"],
                      "No such file", cwd=str(tmp_path))
    check_usage_error(["plan", "--model", "mlp_model:MLP", "--inputs", "complex:8x16", "--data", "2"],
                      "--inputs 'complex:8x16': expected DTYPE:SHAPE[:HIGH]", cwd=str(tmp_path))
