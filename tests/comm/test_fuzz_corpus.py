"""The fuzzer's regression corpus (tests/comm/fuzz_corpus, format in ccsrc/tools/comm_fuzz.cc):
every file is well formed, and every P2P frame gives its expected outcome through the Python
binding P2PChannel uses (the C++ driver, `make fuzz`, runs all targets under ASan + UBSan)."""
import os

import numpy as np
import pytest

from mindspore_hyper.comm._common import _C

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_corpus")


def _load(path: str) -> dict:
    entry = {"fields": []}
    with open(path) as f:
        for line in f:
            key, _, rest = line.strip().partition(" ")
            if not key or key.startswith("#"):
                continue
            if key == "words":
                entry["words"] = [int(w) for w in rest.split()]
            elif key == "field":
                entry["fields"].append(rest)
            else:
                entry[key] = rest
    return entry


ENTRIES = {name: _load(os.path.join(CORPUS, name)) for name in sorted(os.listdir(CORPUS)) if name.endswith(".txt")}


def test_corpus_files_are_well_formed():
    assert len(ENTRIES) >= 30
    for name, e in ENTRIES.items():
        assert e.get("target") in ("p2p", "header", "count", "segment"), name
        assert e.get("expect", "").split(" ")[0] in ("ok", "error"), name
        assert ("words" in e) == (e["target"] != "segment"), name
        if e["expect"].startswith("error"):
            assert len(e["expect"]) > len("error "), f"{name}: an error entry names the field it must report"


def test_p2p_corpus_through_the_python_binding():
    checked = 0
    for name, e in ENTRIES.items():
        if e["target"] != "p2p":
            continue
        limit, length, *descriptor = e["words"]
        outcome, _, reason = e["expect"].partition(" ")
        try:
            n = _C.p2p_descriptor_length(length)
            assert len(descriptor) >= n, f"{name}: the corpus entry holds fewer words than it announces"
            tag, meta, layout, payload = _C.parse_p2p_descriptor(np.array(descriptor[:n], np.int64), limit % (1 << 64))
        except _C.FrameError as exc:
            assert outcome == "error" and reason in str(exc), f"{name}: {exc}"
        else:
            assert outcome == "ok", f"{name}: accepted"
            assert 1 <= len(tag) <= 8 and payload <= limit % (1 << 64)
        checked += 1
    assert checked >= 15


@pytest.mark.parametrize("words", [[1, 5, 0, 0, 7], [2, 1], [], [1, 5, 0, 1, 0, 1]])
def test_malformed_descriptors_name_what_is_wrong(words):
    with pytest.raises(_C.FrameError, match="field '|words after its last field"):
        _C.parse_p2p_descriptor(np.array(words, np.int64), 1 << 30)
