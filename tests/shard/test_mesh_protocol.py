"""Layout implements the `Mesh` protocol that TensorLayout, Strategy and ContextParallel name as
their mesh's type (shard/mesh_protocol.py: they cannot import layout.py, which builds them)."""
from typing import Protocol

from protocol_members import mismatched_members

from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.mesh_protocol import Mesh


def test_layout_provides_every_member_of_the_mesh_protocol():
    assert mismatched_members(Mesh, Layout((2, 2), ("data", "tensor"))) == []


def test_the_member_check_finds_what_differs():
    class Wanted(Protocol):
        label: str

        @property
        def size(self) -> int:
            """A value."""

        def group(self, rank: int) -> list:
            """A method."""

        def coords(self, rank: int) -> tuple:
            """A method."""

    class Given:
        def __init__(self):
            self.label = "x"

        def size(self):  # a method where a value is wanted
            return 1

        def group(self, ranks):  # another parameter name
            return []

    assert mismatched_members(Wanted, Given()) == [
        "size: expected a value (property or attribute), got a method",
        "group: parameters ['self', 'ranks'], expected ['self', 'rank']",
        "coords: missing"]
