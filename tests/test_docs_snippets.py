"""Every ```python block of README.md and docs/*.md runs as written (issue 42: documented commands
failed as written). A block marked `<!-- docs-test: skip <reason> -->` on the line before its fence
(msrun, Ascend, an excerpt, lines of a script run elsewhere) is reported as skipped with its reason.

The runnable blocks execute in one subprocess (tests/docs_snippets.py: one MindSpore import for
all), each in a fresh namespace with the context flags reset, from a scratch folder that sees the
repository's configs/ and examples/; each block is its own test here."""
import json
import os
import subprocess
import sys

import pytest

from docs_snippets import ROOT, shell_blocks, snippets, unmarked_placeholders

# one worker runs them all (make test: --dist loadgroup), so the blocks' subprocess runs once
pytestmark = pytest.mark.xdist_group("docs_snippets")

SNIPPETS = snippets()
RUNNABLE = [s for s in SNIPPETS if s.skip is None]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{snippet id: {"ok", "error", "seconds"}} of every runnable block, run once for the module."""
    folder = tmp_path_factory.mktemp("docs")
    for name in ("configs", "examples"):
        os.symlink(os.path.join(ROOT, name), folder / name)
    out = folder / "results.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "docs_snippets.py"), str(out),
                           *[s.id for s in RUNNABLE]], cwd=folder, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_blocks_are_found_and_markers_name_a_reason():
    ids = {s.id for s in SNIPPETS}
    assert "docs/config.md:7" in ids and "docs/checkpoint.md:11" in ids  # the two issue 42 named
    assert len(RUNNABLE) >= len(SNIPPETS) // 2, [s.id for s in SNIPPETS if s.skip]
    for s in SNIPPETS:
        assert s.skip is None or len(s.skip.split()) >= 3, f"{s.id}: say why it is not run"


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_documented_python_block_runs(snippet, results):
    if snippet.skip is not None:
        pytest.skip(f"{snippet.id}: {snippet.skip}")
    result = results[snippet.id]
    assert result["ok"], f"{snippet.id} fails as written:\n{result['error']}"


def test_shell_commands_name_files_that_exist_or_placeholders():
    """Issue 42: `convert mymodels:MLP`, `elastic ... train.py` read as if those files existed. A
    shell block's scripts and conversion targets are the repository's, or marked `<your_...>`."""
    blocks = shell_blocks()
    assert len(blocks) >= 10 and "README.md:3" in {b.id for b in blocks}
    unmarked = {b.id: unmarked_placeholders(b.code) for b in blocks}
    assert not {k: v for k, v in unmarked.items() if v}, "name the user's own files as <placeholders>"
    assert unmarked_placeholders("mindspore-hyper convert mymodels:MLP --out c/\nmsrun --join=True train.py") == \
        ["mymodels:MLP", "train.py"]
    assert unmarked_placeholders("mindspore-hyper convert <your_module>:<YourTorchModel> --out c/  # train.py\n"
                                 "elastic <your_train.py>\npython examples/quickstart.py") == []

