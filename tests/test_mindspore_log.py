"""The MindSpore log messages the package keeps off the console (mindspore_hyper/mindspore_log.py):
nn.Adam's deprecation of FusedSparseAdam is dropped once the package is imported (in a forked
child too), every other MindSpore message still prints, and a message silenced around a block
prints again after it."""
import subprocess
import sys

from mindspore import log as ms_log

from mindspore_hyper.mindspore_log import NN_ADAM_DEPRECATIONS, silenced

BUILD_ADAM = ("from mindspore import log, nn; nn.Adam(nn.Dense(2, 2).trainable_params()); "
              "log.warning('another MindSpore warning')")


def run(code: str) -> str:
    """stderr of `code` in a fresh interpreter (MindSpore logs each message once per process)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def test_mindspore_alone_prints_the_nn_adam_deprecation():
    """The control: without the package, building nn.Adam prints the message (so the test below
    shows the filter at work, and fails here once MindSpore stops printing it)."""
    assert NN_ADAM_DEPRECATIONS[0] in run(BUILD_ADAM)


def test_after_the_package_import_nn_adam_prints_nothing_and_other_messages_print():
    # the package is imported before MindSpore, then a forked child builds nn.Adam: its MindSpore
    # logger carries the child's pid in its name, so this covers the fork hook as well
    stderr = run("import os, mindspore_hyper\n"
                 "pid = os.fork()\n"
                 "if pid == 0:\n"
                 f"    {BUILD_ADAM}\n"
                 "    os._exit(0)\n"
                 "assert os.waitpid(pid, 0)[1] == 0\n")
    assert "FusedSparse" not in stderr, stderr
    assert "another MindSpore warning" in stderr, stderr


def test_silenced_drops_only_its_message_and_only_inside_the_block(capfd):
    with silenced("hyper test: silenced"):
        ms_log.warning("hyper test: silenced")
        ms_log.warning("hyper test: not silenced")
    ms_log.warning("hyper test: silenced")
    err = capfd.readouterr().err
    assert err.count("hyper test: silenced") == 1 and err.count("hyper test: not silenced") == 1, err
