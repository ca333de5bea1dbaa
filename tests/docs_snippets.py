"""The ```python code blocks of README.md and docs/*.md, for tests/test_docs_snippets.py.

A block preceded (on the line before its fence) by an HTML comment

    <!-- docs-test: skip <reason> -->

is not run and is reported as skipped with that reason (blocks that need msrun, Ascend, a long
run, or that continue an earlier block). Every other block must run as written, alone, from the
repository root (its `configs/` and `examples/` reachable).

Run as a script (`python tests/docs_snippets.py OUT.json ID...`), it executes the named blocks one
after another in this interpreter, each in a fresh namespace with mindspore_hyper's context and
MindSpore's mode reset before it, and writes {id: {"ok", "error", "seconds"}} to OUT.json: one
MindSpore import for all blocks instead of one per block.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"<!--\s*docs-test:\s*skip\s+(?P<reason>.+?)\s*-->")
FENCE = re.compile(r"^```python\s*$")


@dataclass(frozen=True)
class Snippet:
    """One ```python block: `id` is "<file>:<line of its fence>"."""

    id: str
    path: str
    line: int
    code: str
    skip: Optional[str]  # the marker's reason, or None: the block must run


def doc_files() -> List[str]:
    docs = os.path.join(ROOT, "docs")
    return [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))


def snippets(paths: Optional[List[str]] = None) -> List[Snippet]:
    """Every ```python block of `paths` (default: README.md and docs/*.md) in file order."""
    out = []
    for path in paths or doc_files():
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        i = 0
        while i < len(lines):
            if not FENCE.match(lines[i]):
                i += 1
                continue
            start = i
            i += 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            marker = MARKER.search(lines[start - 1]) if start > 0 else None
            rel = os.path.relpath(path, ROOT)
            out.append(Snippet(f"{rel}:{start + 1}", rel, start + 1, "\n".join(body) + "\n",
                               marker.group("reason") if marker else None))
            i += 1
    return out


SHELL_FENCE = re.compile(r"^```(bash|sh|shell)\s*$")
SCRIPT = re.compile(r"(?<![\w/.<-])([\w./-]+\.py)(?![\w>])")  # a .py path not written as <...>
TARGET = re.compile(r"(?:\bconvert|--model)\s+([^\s<][^\s]*:[^\s]+)")  # module:Class not written as <...>


def shell_blocks(paths: Optional[List[str]] = None) -> List[Snippet]:
    """Every ```bash (sh, shell) block of `paths` (default: README.md and docs/*.md); not run."""
    out = []
    for path in paths or doc_files():
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        starts = [i for i, line in enumerate(lines) if SHELL_FENCE.match(line)]
        for start in starts:
            end = next(j for j in range(start + 1, len(lines)) if lines[j].startswith("```"))
            rel = os.path.relpath(path, ROOT)
            out.append(Snippet(f"{rel}:{start + 1}", rel, start + 1, "\n".join(lines[start + 1:end]) + "\n", None))
    return out


def unmarked_placeholders(command_text: str) -> List[str]:
    """The files a shell block's commands name that are not in the repository and not written as
    placeholders (`<your_train.py>`, `<your_module>:<YourTorchModel>`): scripts (*.py, from the
    repository root) and `convert`/`--model` targets (module:Class, importable from the root).
    Comments (from " #") are not commands."""
    import importlib.util

    missing = []
    for line in command_text.splitlines():
        command = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        for path in SCRIPT.findall(command):
            if not os.path.exists(os.path.join(ROOT, path)):
                missing.append(path)
        for target in TARGET.findall(command):
            module = target.split(":", 1)[0]
            sys.path.insert(0, ROOT)
            try:
                found = importlib.util.find_spec(module) is not None
            except ImportError:
                found = False
            finally:
                sys.path.remove(ROOT)
            if not found:
                missing.append(target)
    return missing


def _run(ids: List[str]) -> Dict[str, dict]:
    import mindspore as ms

    import mindspore_hyper as mh

    ms.runtime.launch_blocking()
    by_id = {s.id: s for s in snippets()}
    results = {}
    for sid in ids:
        snippet = by_id[sid]
        mh.reset_context()
        ms.set_context(mode=ms.PYNATIVE_MODE)
        ms.set_seed(0)
        start = time.perf_counter()
        try:
            exec(compile(snippet.code, f"{snippet.id}", "exec"), {"__name__": "__docs__"})
            results[sid] = {"ok": True, "error": None}
        except BaseException:  # noqa: B902 - every failure of a snippet is reported, none stops the others
            results[sid] = {"ok": False, "error": traceback.format_exc(limit=-4)}
        results[sid]["seconds"] = time.perf_counter() - start
        print(f"{sid}: {'ok' if results[sid]['ok'] else 'FAILED'} {results[sid]['seconds']:.1f}s", file=sys.stderr)
    return results


if __name__ == "__main__":
    out_path, *wanted = sys.argv[1:]
    with open(out_path, "w") as f:
        json.dump(_run(wanted), f)
