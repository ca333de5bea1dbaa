"""The `convert` subcommand: through a subprocess (python -m mindspore_hyper.migrate convert) and,
for the error paths, in-process (same parser, faster)."""
import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate.__main__ import main
from mindspore_hyper.migrate.cli import add_parser
from mindspore_hyper.migrate.compare import cell_outputs, to_mindspore

MODELS = textwrap.dedent("""
    import torch

    class Net(torch.nn.Module):
        def __init__(self, dim=16, out=8):
            super().__init__()
            self.fc = torch.nn.Linear(dim, out)
            self.norm = torch.nn.LayerNorm(out)

        def forward(self, x):
            return self.norm(torch.relu(self.fc(x)))

    class Odd(torch.nn.Module):
        def forward(self, x):
            return torch.cummax(x, 0).values

    def broken():
        raise RuntimeError("no weights here")
""")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "cli_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_subprocess_converts_and_written_files_reproduce_torch(workdir):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "mindspore-hyper"), "convert", "cli_models:Net",
         "--input-shape", "4,12", "--init-args", '{"dim": 12}', "--check-shape", "7,12", "--out", "out"],
        cwd=workdir, env=env,
        capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stderr
    assert re.search(r"torch.nn.Linear +-> nn.Dense +x1", result.stdout)
    # issue 42: a readable summary, not "(s77, static)" and a Python dict
    lines = result.stdout.splitlines()
    assert "input x: dim 0 symbolic (may change between calls), dim 1 fixed at 12" in lines
    assert "fallbacks (modules written as their traced body, their class could not be generated): none" in lines
    assert re.search(r"check against torch: max relative error \S+ on the example inputs; max relative error \S+ on "
                     r"inputs of shape \(7, 12\)$", result.stdout, re.M)
    assert lines[-4:] == ["files written:", f"  {os.path.join('out', 'net.py')}  (MindSpore source: the Cell classes and "
                          "build(checkpoint))", f"  {os.path.join('out', 'net.ckpt')}  (the weights)",
                          f"  {os.path.join('out', 'net.report.json')}  (this report in full, JSON)"]
    assert "{" not in result.stdout and not re.search(r"\bs\d+\b", result.stdout)
    assert sorted(os.listdir(workdir / "out")) == ["net.ckpt", "net.py", "net.report.json"]
    report = json.loads((workdir / "out" / "net.report.json").read_text())
    assert report["classes"][0]["class"] == "Net" and report["check"]["second_shape"]["shapes"] == [[7, 12]]
    assert report["check"]["second_shape"]["max_relative_error"] <= 1e-5
    spec = importlib.util.spec_from_file_location("cli_written_net", workdir / "out" / "net.py")
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cell = written.build(str(workdir / "out" / "net.ckpt"))
    import cli_models

    torch.manual_seed(0)  # the CLI's default seed: the same weights
    model = cli_models.Net(dim=12).eval()
    x = torch.randn(3, 12)
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(cell_outputs(cell(to_mindspore(x)))[0], want, rtol=1e-5, atol=1e-6)


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as info:
        main(["convert", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("module:Class", "--input-shape", "--input-dtype", "--init-args", "--out", "--tracer", "--structure",
                 "--check-shape", "examples:"):
        assert flag in text


@pytest.mark.parametrize("argv,message", [
    (["convert", "cli_models:Net", "--input-shape", "4,16"], "the following arguments are required: --out"),
    (["convert", "cli_models", "--input-shape", "4", "--out", "o"], "expected module:Class"),
    (["convert", "cli_models:Net", "--input-shape", "4,x", "--out", "o"], "expected comma-separated positive"),
    (["convert", "cli_models:Net", "--input-shape", "4,0", "--out", "o"], "expected comma-separated positive"),
    (["convert", "cli_models:Net", "--input-shape", "4,16", "--input-dtype", "int8", "--out", "o"], "invalid choice"),
    (["convert", "cli_models:Net", "--input-shape", "4,16", "--init-args", "{dim", "--out", "o"], "expected JSON"),
    (["convert", "cli_models:Net", "--input-shape", "4,16", "--init-args", "3", "--out", "o"], "a JSON list or object"),
    (["convert", "cli_models:Net", "--input-shape", "4,16", "--int-high", "0", "--out", "o"], "positive integer"),
])
def test_bad_flags_exit_2(workdir, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv,status,message", [
    (["nowhere:Net"], 2, "cannot import module 'nowhere'"),
    (["cli_models:Missing"], 2, "module 'cli_models' has no attribute 'Missing'"),
    (["cli_models:broken"], 2, "cli_models:broken([]) failed: RuntimeError: no weights here"),
    (["cli_models:Net", "--input-dtype", "int64", "--input-dtype", "bool"], 2, "2 given for 1 --input-shape"),
    (["cli_models:Odd"], 1, "aten.cummax: no MindSpore mapping"),
    (["cli_models:Odd", "--structure", "flat"], 1, "torch.cummax: no MindSpore mapping"),
    (["cli_models:Net", "--tracer", "fx"], 2, "--tracer fx applies to --structure flat only"),
    (["cli_models:Net", "--check-shape", "2,16", "--check-shape", "3,16"], 2, "--check-shape: 2 given for 1"),
])
def test_run_errors(workdir, capsys, argv, status, message):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["convert"] + argv[:1] + ["--input-shape", "4,16", "--out", "out"] + argv[1:])
    assert args.func(args) == status
    assert message in capsys.readouterr().err
    assert not (workdir / "out").exists()


def test_convert_prints_no_warning_of_torch_export(workdir, capsys):
    """issue 42: `mindspore-hyper convert` printed torch 2.13's FutureWarning about pytree's
    `LeafSpec`, raised inside torch.export.export and torch.export.unflatten (the port's path)."""
    import warnings

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["convert", "cli_models:Net", "--input-shape", "4,16", "--out", "out"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a FutureWarning anywhere fails the conversion
        assert args.func(args) == 0, capsys.readouterr().err
    assert (workdir / "out").is_dir()


def test_summary_names_shared_symbols_fixed_sizes_and_failed_checks():
    """The summary's input and check lines from the report's fields (no conversion needed)."""
    from mindspore_hyper.migrate.report import ConversionReport

    report = ConversionReport(model="m.Net", tracer="torch.export (module-structured)",
                              symbolic={"input_ids": ["s0", "s1"], "mask": ["s0", None, "s1"], "flag": []},
                              static=["mask dimension 1 = 1"],
                              check={"max_relative_error": 3.1e-7,
                                     "second_shape": {"failed": "ValueError: shape", "shapes": [[5, 37], [5, 1, 37]]}},
                              fallbacks=[{"module": "blocks.0", "torch": "m.Block", "reason": "SyntaxError: x"}],
                              classes=[{"class": "Net", "torch": "m.Net", "modules": 1, "first": "",
                                        "hyperparameters": [], "lines": 3},
                                       {"class": "Block", "torch": "m.Block", "modules": 2, "first": "blocks.0",
                                        "hyperparameters": ["dim"], "lines": 9}])
    lines = str(report).splitlines()
    assert lines[1:4] == ["input input_ids: dim 0 symbolic (may change between calls), dim 1 symbolic (may change "
                          "between calls)",
                          "input mask: dim 0 symbolic (= input_ids dim 0), dim 1 fixed at 1, dim 2 symbolic "
                          "(= input_ids dim 1)",
                          "input flag: a scalar"]
    assert "  Net <- m.Net (1 module: the root)" in lines
    assert "  Block <- m.Block (2 modules, first 'blocks.0'; __init__(dim))" in lines
    assert "fallbacks (modules written as their traced body, their class could not be generated): 1" in lines
    assert "  blocks.0 (m.Block): SyntaxError: x" in lines
    assert lines[-1] == ("check against torch: max relative error 3.1e-07 on the example inputs; failed on inputs of "
                         "shape (5, 37) and (5, 1, 37): ValueError: shape")



def test_tensor_plan_is_written_and_printed(workdir, capsys):
    """--tensor-plan: tensor_parallel_plan of the model as YAML in the output directory and on stdout (a layer list
    with fc1 / fc2: column- then row-parallel; the Linear outside the list stays whole and is not named)."""
    (workdir / "plan_models.py").write_text(textwrap.dedent("""
        import torch

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

            def forward(self, x):
                return x + self.fc2(torch.relu(self.fc1(x)))

        class Stack(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.ModuleList([Block(), Block()])
                self.head = torch.nn.Linear(8, 3)

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return self.head(x)
    """))
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["convert", "plan_models:Stack", "--input-shape", "2,8", "--out", "out", "--tensor-plan"])
    assert args.func(args) == 0, capsys.readouterr().err
    text = (workdir / "out" / "tensor_plan.yaml").read_text()
    assert text in capsys.readouterr().out
    assert '  - {name: "layers.*.fc1", strategy: {tensor: (2, 1)}}' in text
    assert '  - {name: "layers.*.fc2.bias", tensor_map: [None]}' in text
    assert "head" not in text
