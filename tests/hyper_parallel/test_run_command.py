"""`mindspore-hyper run` and `install_hyper_parallel`: an upstream-style script, unchanged."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from paths import EXAMPLES

CLI = os.path.join(os.path.dirname(sys.executable), "mindspore-hyper")

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from mindspore import Tensor
    from hyper_parallel import init_device_mesh, DTensor
    from hyper_parallel.core.dtensor.placement_types import Shard, Replicate
    mesh = init_device_mesh("npu", (2,), mesh_dim_names=("tp",))
    d = DTensor.from_local(Tensor(np.ones((2, 3), np.float32)), mesh, [Shard(0)])
    print("global", d.full_tensor().asnumpy().sum(), "args", sys.argv[1:])
""")


def run(args, cwd=None):
    return subprocess.run([CLI, "run", *args], capture_output=True, text=True, timeout=240, cwd=cwd)


def test_a_script_runs_unchanged_in_simulation_with_the_report(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = run(["--devices", "2", "--json", str(tmp_path / "r.json"), str(script), "--steps", "3"])
    assert done.returncode == 0, done.stderr
    assert "global 12.0 args ['--steps', '3']" in done.stdout
    assert "mindspore-hyper: simulation, 2 devices" in done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["mode"] == "simulation" and report["devices"] == 2
    assert report["meshes"][0]["shape"] == [2] and report["meshes"][0]["dim_names"] == ["tp"]
    assert report["meshes"][0]["peak_bytes_per_device"] >= 2 * 3 * 4  # at least the one shard
    assert report["meshes"][0]["parameter_bytes_per_device"] == 0  # the script lays out no Parameter


def test_the_example_trains_like_one_device_under_run():
    done = run(["--devices", "2", str(EXAMPLES / "hyper_parallel_llama.py"), "--tp", "2", "--steps", "2"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK: tensor-parallel 2 trains like one device over 2 steps" in done.stdout


def test_rank_dependent_scripts_stop_with_the_reason(tmp_path):
    script = tmp_path / "ranked.py"
    script.write_text("from hyper_parallel import init_device_mesh\n"
                      "mesh = init_device_mesh('npu', (2,))\nprint(mesh.get_rank())\n")
    done = run(["--devices", "2", str(script)])
    assert done.returncode == 1
    assert "get_rank() differs per device" in done.stderr and "under msrun" in done.stderr
    missing = run(["--devices", "2", str(tmp_path / "nothing.py")])
    assert missing.returncode == 2 and "no script" in missing.stderr


def test_install_yields_to_a_real_hyper_parallel(tmp_path):
    real = tmp_path / "site" / "hyper_parallel"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    code = ("from mindspore_hyper.hyper_parallel import install_hyper_parallel\n"
            "print(install_hyper_parallel(verbose=True))\nimport hyper_parallel\nprint(hyper_parallel.REAL)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a real hyper_parallel is installed" in done.stdout and "False\nTrue" in done.stdout


def test_upstream_import_paths_resolve_and_missing_names_say_so():
    from mindspore_hyper.hyper_parallel import install_hyper_parallel
    from mindspore_hyper.hyper_parallel.install import MODULES
    from mindspore_hyper.hyper_parallel.refused_names import REFUSED

    assert install_hyper_parallel() is True
    import importlib

    import mindspore_hyper.hyper_parallel as ours
    from mindspore_hyper.hyper_parallel import checkpoint, hsdp_graph_pass

    elsewhere = {"save": checkpoint.save, "load": checkpoint.load,
                 "MindSporeHSDPScheduler": hsdp_graph_pass.MindSporeHSDPScheduler}
    for path, names in MODULES.items():
        module = importlib.import_module(path)
        for name in names:
            expected = elsewhere[name] if name in elsewhere else getattr(ours, name, None)
            if name != "get_platform" and name not in REFUSED:  # refused names: test_mindformers_imports.py
                assert getattr(module, name) is expected, f"{path}.{name}"
    from hyper_parallel.platform import get_platform

    assert get_platform().name == "mindspore"
    with pytest.raises(ImportError, match="SharedParameterInfo: not provided by mindspore_hyper yet"):
        from hyper_parallel.core.pipeline_parallel.stage import SharedParameterInfo  # noqa: F401
