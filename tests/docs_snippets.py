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
