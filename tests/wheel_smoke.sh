#!/usr/bin/env bash
# Wheel smoke test (issue 39, item 1): what a user gets from `pip install` of the wheel, not from the
# editable checkout. Builds the wheel from a copy of the working tree (tracked and untracked files that
# git does not ignore: no build products of the checkout), installs it with its dependencies into a
# fresh venv outside the checkout, and from a directory outside the checkout runs: the C++ core import,
# `mindspore-hyper estimate --hardware`, `plan --search`, `plan` of the GPT preset (examples/models.py,
# shipped as package data), `timeline`, the hardware presets and topology files through the API, and
# the quickstart demo (copied out, so the checkout is not on sys.path). Called by .ci/run after
# `make test`; run by hand as `tests/wheel_smoke.sh` (a few minutes: the C++ core compiles).
#
# Environment: PY (the Python that builds the wheel; needs setuptools, wheel, pybind11; default
# .venv/bin/python, which `make test` made), PYTHON (the interpreter of the fresh venv; default
# python3), MS_HYPER_BUILD_JOBS (parallel compile jobs; default nproc), KEEP_WHEEL_SMOKE=1 keeps the
# temporary folder.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$REPO/.venv/bin/python}"
PYTHON="${PYTHON:-python3}"
export MS_HYPER_BUILD_JOBS="${MS_HYPER_BUILD_JOBS:-$(nproc)}"
START=$(date +%s)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ms_hyper_wheel.XXXXXX")"
case "$WORK/" in "$REPO"/*) echo "wheel_smoke: the work folder $WORK is inside the checkout" >&2; exit 2 ;; esac
cleanup() { if [ "${KEEP_WHEEL_SMOKE:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT
step() { echo "== wheel smoke [$(( $(date +%s) - START )) s]: $*"; }

step "copy the working tree to $WORK/src"
mkdir -p "$WORK/src" "$WORK/dist" "$WORK/run"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$WORK/src"

step "build the wheel (pip wheel . --no-deps --no-build-isolation, $MS_HYPER_BUILD_JOBS compile jobs)"
(cd "$WORK/src" && "$PY" -m pip wheel . --no-deps --no-build-isolation -q -w "$WORK/dist")
WHEEL="$(ls "$WORK"/dist/mindspore_hyper-*.whl)"
"$PY" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["mindspore_hyper/_data/hardware/a100-80gb.yaml", "mindspore_hyper/_data/topologies/node8.yaml",
        "mindspore_hyper/_data/examples/models.py", "mindspore_hyper/py.typed"]
missing = [n for n in need if n not in names]
assert not missing, f"the wheel lacks {missing}"
assert any(n.startswith("mindspore_hyper/_core") and n.endswith(".so") for n in names), "the wheel lacks the C++ core"
print(f"{sys.argv[1].rsplit('/', 1)[1]}: {len(names)} files")
EOF

step "fresh venv outside the checkout, install the wheel and its dependencies"
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q --upgrade pip
"$VPY" -m pip install -q "$WHEEL"

cd "$WORK/run"
unset PYTHONPATH
export MPLBACKEND=Agg
BIN="$WORK/venv/bin"

step "the installed package and its C++ core"
"$VPY" - "$REPO" <<'EOF'
import os, sys
repo = os.path.realpath(sys.argv[1])
assert all(not os.path.realpath(p or ".").startswith(repo) for p in sys.path), f"the checkout is on sys.path: {sys.path}"
import mindspore_hyper
from mindspore_hyper import _core
for module in (mindspore_hyper, _core):
    assert not os.path.realpath(module.__file__).startswith(repo), f"{module.__name__} from the checkout: {module.__file__}"
print("mindspore_hyper", mindspore_hyper.__file__, "| _core", _core.__file__)
EOF

step "mindspore-hyper estimate --hardware a100-80gb"
OUT="$("$BIN/mindspore-hyper" estimate --preset gpt3-175b --tensor 8 --pipeline 8 --microbatches 64 \
    --sequence-parallel --recompute selective --hardware a100-80gb)"
echo "$OUT" | tail -3
echo "$OUT" | grep -q "^step .* on a100-80gb" || { echo "estimate printed no step time" >&2; exit 1; }

step "mindspore-hyper plan --search"
OUT="$("$BIN/mindspore-hyper" plan --search --preset llama2-7b --devices 64 --hardware h100-80gb \
    --global-batch 256 --top 3 --json 2>/dev/null)"
"$VPY" -c 'import json, sys; r = json.loads(sys.argv[1])["results"]; assert len(r) == 3, r; print(len(r), "strategies")' "$OUT"

step "mindspore-hyper plan of the GPT preset (examples/models.py shipped in the package)"
"$BIN/mindspore-hyper" plan --data 2 --tensor 2 --init-args '{"layers": 1, "hidden": 32}' --batch 4 | tail -3

step "mindspore-hyper timeline"
"$BIN/mindspore-hyper" timeline 1f1b --stages 4 --microbatches 8 --trace trace.json | tail -2
test -s trace.json

step "presets and topology files through the API"
"$VPY" - <<'EOF'
import os
from mindspore_hyper.comm.topology import _CONFIG_DIR, Topology, load_topology
from mindspore_hyper.estimate import JobStrategy, estimate_step_time, preset
from mindspore_hyper.estimate.hardware import hardware_presets

presets = hardware_presets()
assert {"a100-80gb", "h100-80gb", "h200", "ascend-910b", "ascend-910c"} <= set(presets), presets
config = preset("gpt3-175b").with_(micro_batch=1)
step = estimate_step_time(config, JobStrategy(tensor=8, pipeline=8, microbatches=64), "a100-80gb")
assert step.seconds > 0, step
topologies = sorted(f for f in os.listdir(_CONFIG_DIR) if f.endswith(".yaml"))
assert topologies, _CONFIG_DIR
for name in topologies:
    Topology.from_yaml(os.path.join(_CONFIG_DIR, name))
load_topology("node8")
print(f"{len(presets)} hardware presets, {len(topologies)} topology files, gpt3-175b step {step.seconds:.2f} s")
EOF

step "the quickstart demo, copied out of the checkout"
cp "$REPO/examples/quickstart.py" "$REPO/examples/models.py" "$WORK/run/"
"$VPY" quickstart.py | tail -3

step "a HyperParallel-API script through mindspore-hyper run (import hyper_parallel from the wheel)"
cp "$REPO/examples/hyper_parallel_llama.py" "$WORK/run/"
"$BIN/mindspore-hyper" run --devices 2 hyper_parallel_llama.py --tp 2 --steps 1 | grep "OK: tensor-parallel 2"

step "passed in $(( $(date +%s) - START )) s"
