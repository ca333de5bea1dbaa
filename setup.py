"""Build script: the Python package plus the C++ core compiled from ccsrc/ into mindspore_hyper._core."""
import runpy
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py as _build_py

try:
    from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
except ImportError as exc:  # pragma: no cover - only without the build requirement
    raise SystemExit("building mindspore_hyper needs pybind11: pip install pybind11") from exc

ROOT = Path(__file__).parent
CCSRC = ROOT / "ccsrc"
# MS_HYPER_BUILD_JOBS=N compiles the C++ core's sources N at a time (default: one at a time, as before)
ParallelCompile("MS_HYPER_BUILD_JOBS", default=1).install()
# What the package reads at run time (hardware presets, topology files, the CLI's GPT example):
# copied from configs/ and examples/ into mindspore_hyper/_data/ of every non-editable build.
DATA_SOURCES = runpy.run_path(str(ROOT / "mindspore_hyper" / "_resources.py"))["DATA_SOURCES"]


class build_py(_build_py):
    """The package's modules, plus DATA_SOURCES copied into mindspore_hyper/_data/ (an editable
    install reads them from the checkout instead)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        data_dir = Path(self.build_lib) / "mindspore_hyper" / "_data"
        for name, (source, suffix) in DATA_SOURCES.items():
            src, dst = ROOT / source, data_dir / name
            files = sorted(p for p in src.iterdir() if p.name.endswith(suffix)) if suffix else [src]
            if not files or not all(p.is_file() for p in files):
                raise SystemExit(f"package data {name!r}: nothing to ship from {src}")
            for path in files:
                target = dst / path.name if suffix else dst
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)


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
    cmdclass={"build_ext": build_ext, "build_py": build_py},
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
