"""Files the package reads at run time: the hardware presets (configs/hardware/*.yaml), the topology
files (configs/topologies/*.yaml), the published runs of the held-out step-time validation
(configs/validation/*.yaml) and the GPT example model of the CLI's `--model gpt`
(examples/models.py).

The repository keeps them where people edit them (configs/, examples/); setup.py's build step copies
them into the package as `mindspore_hyper/_data/<name>`, so a wheel or a normal `pip install .` carries
them. An editable install (`make build`) has no `_data/` and reads them from the checkout. Imports
nothing but `os`: setup.py reads DATA_SOURCES from this file without importing the package.
"""
import os

__all__ = ["DATA_SOURCES", "DATA_DIR", "resource_path"]

# name under mindspore_hyper/_data -> (path in the checkout, file pattern when a folder)
DATA_SOURCES = {
    "hardware": ("configs/hardware", ".yaml"),
    "topologies": ("configs/topologies", ".yaml"),
    "validation": ("configs/validation", ".yaml"),
    "examples/models.py": ("examples/models.py", None),
}

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(_PACKAGE_DIR, "_data")
_CHECKOUT = os.path.dirname(_PACKAGE_DIR)


def resource_path(name: str) -> str:
    """The file or folder `name` (a key of DATA_SOURCES): the copy shipped in the package, else the
    source checkout's (an editable install). The path may not exist (neither is there); callers say so."""
    if name not in DATA_SOURCES:
        raise KeyError(f"resource {name!r} unknown; expected one of {', '.join(DATA_SOURCES)}")
    packaged = os.path.join(DATA_DIR, *name.split("/"))
    if os.path.exists(packaged):
        return packaged
    return os.path.join(_CHECKOUT, *DATA_SOURCES[name][0].split("/"))
