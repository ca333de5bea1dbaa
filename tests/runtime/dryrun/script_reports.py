"""The HyperParallel-API meshes' reports of a script run by `mindspore-hyper run`'s runner, in
simulation or in the dry run, for comparing the two."""
import gc
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def api_reports(script: str, mode: str, tmp_path, devices: int = 4) -> list:
    """Run `script` (a file beside this one) on `devices` devices in `mode` ("simulation" or
    "dryrun"); its reports of the meshes the HyperParallel API made (JSON form)."""
    from mindspore_hyper.hyper_parallel.script_runner import run_script
    from mindspore_hyper.hyper_parallel.session import reset_session

    reset_session()
    gc.collect()  # models of earlier tests in this process would join the report while alive
    path = tmp_path / f"{mode}.json"
    assert run_script(os.path.join(HERE, script), [], devices, str(path), mode=mode) == 0
    return [m for m in json.loads(path.read_text())["meshes"] if m["source"] == "HyperParallel API"]
