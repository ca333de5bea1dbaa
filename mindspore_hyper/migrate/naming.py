"""Names in generated code: file stems, and identifiers that are valid and unique by construction.

Every name the generators write (classes, `__init__` arguments, attributes, local variables) goes
through `identifier`, which makes it a Python identifier that is no keyword, shadows no builtin or
module-level name of the generated file, and is not yet taken in its scope.
"""
import builtins
import keyword
import re
from typing import Iterable, MutableSet

__all__ = ["module_file_name", "identifier", "FILE_NAMES"]

# module-level names of a generated file (imports, build()); helpers are added by the generators
FILE_NAMES = frozenset({"ms", "mint", "ops", "nn", "np", "math", "os", "Tensor", "Parameter", "build", "MoE"})
_BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_"))


def module_file_name(class_name: str) -> str:
    """snake_case file stem of a class name: GPT2LMHeadModel -> gpt2_lm_head_model."""
    words = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", class_name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", words).lower()


def identifier(text: str, taken: MutableSet[str], reserved: Iterable[str] = (), suffix: str = "_") -> str:
    """A valid Python identifier from `text`, not a keyword, builtin, in `reserved` or in `taken`; it is added
    to `taken`. Clashes get `<suffix><n>` appended (n = 1, 2, ...; classes pass suffix="" to get `Name2`)."""
    base = re.sub(r"\W", "_", str(text)) or "v"
    if not (base[0].isalpha() or base[0] == "_"):
        base = f"v_{base}"
    reserved = set(reserved)

    def free(name: str) -> bool:
        return name not in taken and name not in reserved and name not in _BUILTINS and not keyword.iskeyword(name) \
            and name.isidentifier()

    candidate, i = base, (2 if suffix == "" else 1)
    while not free(candidate):
        candidate, i = f"{base}{suffix}{i}", i + 1
    taken.add(candidate)
    return candidate
