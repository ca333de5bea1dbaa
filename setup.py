"""Build script: the Python package plus the C++ core compiled from ccsrc/ into mindspore_hyper._core."""
from pathlib import Path

from setuptools import find_packages, setup

try:
    from pybind11.setup_helpers import Pybind11Extension, build_ext
except ImportError as exc:  # pragma: no cover - only without the build requirement
    raise SystemExit("building mindspore_hyper needs pybind11: pip install pybind11") from exc

ROOT = Path(__file__).parent
CCSRC = ROOT / "ccsrc"


def core_sources() -> list:
    """Every library source under ccsrc/, in a stable order; test and tool programs are excluded."""
    sources = []
    for path in sorted(CCSRC.rglob("*.cc")):
        rel = path.relative_to(ROOT)
        if "tests" in rel.parts or "tools" in rel.parts or path.name.endswith("_test.cc"):
            continue
        sources.append(str(rel))
    return sources


core = Pybind11Extension(
    "mindspore_hyper._core",
    core_sources(),
    include_dirs=[str(CCSRC)],
    cxx_std=17,
    # Fixed flags only (no -march=native): the same library on every machine of this kind.
    extra_compile_args=["-O2", "-pthread", "-fno-strict-aliasing"],
    extra_link_args=["-pthread", "-lrt"],
)

setup(
    name="mindspore_hyper",
    version="0.1.0",
    description="HyperParallel for MindSpore: declare parallelism once; simulate, run under msrun, or go native",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["mindspore_hyper", "mindspore_hyper.*"]) + ["mindspore_hyper.ops"],
    package_dir={"mindspore_hyper.ops": "ops"},
    package_data={"mindspore_hyper": ["py.typed"]},
    ext_modules=[core],
    cmdclass={"build_ext": build_ext},
    install_requires=["mindspore==2.10.0", "numpy<2", "pyyaml>=6", "matplotlib>=3.7"],
    # torch for the side-by-side benchmarks (gloo, LocalTensor) and, with transformers and safetensors,
    # for the PyTorch -> MindSpore migration tests; the package itself never imports torch at import time;
    # pytest-xdist runs the suite on two workers (the msrun tests one at a time on one of them; its
    # loadgroup scheduling needs pytest < 9, which keeps node ids in `_nodeid`)
    extras_require={"test": ["pytest>=8,<9", "pytest-xdist>=3", "torch==2.13.0", "transformers", "safetensors"],
                    "bench": ["torch==2.13.0"]},
    entry_points={"console_scripts": ["mindspore-hyper=mindspore_hyper.cli:main"]},
    zip_safe=False,
)
