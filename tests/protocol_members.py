"""Whether a class provides every member of a typing.Protocol it implements by shape alone.

Nothing checks a Protocol at run time, so an implementation could drift from the protocol the
lower modules name as its type (shard/mesh_protocol.py, schedule/timeline_view.py): this lists
what an instance lacks, or holds in another form (a method where the protocol has a property or
an attribute, different parameter names).
"""
import inspect
from typing import List


def mismatched_members(protocol: type, instance: object) -> List[str]:
    """Members of `protocol` that `instance` lacks or holds in another form (empty: it conforms)."""
    wrong = []
    names = [n for n in vars(protocol) if not n.startswith("_")] + list(getattr(protocol, "__annotations__", {}))
    for name in dict.fromkeys(names):
        declared = inspect.getattr_static(protocol, name, None)
        if not hasattr(instance, name):
            wrong.append(f"{name}: missing")
        elif inspect.isfunction(declared):
            given = inspect.getattr_static(type(instance), name, None)
            if not inspect.isfunction(given):
                wrong.append(f"{name}: expected a method, got {type(given).__name__}")
            elif list(inspect.signature(given).parameters) != list(inspect.signature(declared).parameters):
                wrong.append(f"{name}: parameters {list(inspect.signature(given).parameters)}, expected "
                             f"{list(inspect.signature(declared).parameters)}")
        elif callable(getattr(instance, name)):  # a property or attribute in the protocol: a value
            wrong.append(f"{name}: expected a value (property or attribute), got a method")
    return wrong
