"""What the package reads at run time resolves to files (mindspore_hyper/_resources.py): the copy
shipped in the package (a wheel: tests/wheel_smoke.sh builds and installs one) or, in the editable
checkout the suite runs from, configs/ and examples/."""
import os

import pytest

from mindspore_hyper._resources import DATA_SOURCES, resource_path


@pytest.mark.parametrize("name", sorted(DATA_SOURCES))
def test_every_shipped_resource_exists(name):
    path = resource_path(name)
    suffix = DATA_SOURCES[name][1]
    if suffix:
        assert [f for f in os.listdir(path) if f.endswith(suffix)], f"{path}: no {suffix} files to ship"
    else:
        assert os.path.isfile(path), path


def test_an_unknown_resource_is_named():
    with pytest.raises(KeyError, match="'nothing'"):
        resource_path("nothing")
