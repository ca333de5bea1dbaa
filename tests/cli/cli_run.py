"""Run `mindspore-hyper ARGS` for the CLI tests: in this process through the console script's own
entry (`mindspore_hyper.cli:main`, as the script calls it), so a test does not pay a MindSpore
import per call; `cli_script` runs the installed script in a subprocess (the few tests of the
script itself)."""
import contextlib
import io
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(sys.executable), "mindspore-hyper")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def cli(*args, cwd=ROOT):
    """(exit code, stdout, stderr) of `mindspore-hyper ARGS` run in this process from `cwd`; the
    working directory, sys.path, mindspore_hyper's context and MindSpore's mode are restored after."""
    import mindspore as ms

    import mindspore_hyper as mh
    from mindspore_hyper.cli import main

    out, err = io.StringIO(), io.StringIO()
    here, path = os.getcwd(), list(sys.path)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's exits and the subcommands' parser.exit
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=sys.stderr)
    finally:
        os.chdir(here)
        sys.path[:] = path
        mh.reset_context()
        ms.set_context(mode=ms.PYNATIVE_MODE)
    return (0 if code is None else code), out.getvalue(), err.getvalue()


def cli_script(*args, cwd=ROOT, timeout=300):
    """(exit code, stdout, stderr) of the installed `mindspore-hyper ARGS` in a subprocess."""
    result = subprocess.run([SCRIPT, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)
    return result.returncode, result.stdout, result.stderr


def cli_json(*args, cwd=ROOT):
    """The parsed JSON of a successful `mindspore-hyper ARGS --json`."""
    code, out, err = cli(*args, "--json", cwd=cwd)
    assert code == 0, err
    return json.loads(out)
