"""The model a CLI command runs: a built-in preset or `module:Class`, its init arguments and inputs."""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from mindspore_hyper._resources import resource_path

__all__ = ["GPT_PRESET", "load_model_class", "build_model", "parse_input_spec", "make_inputs", "gpt_inputs",
           "GPT_DEFAULTS"]

GPT_PRESET = "gpt"
GPT_DEFAULTS = {"vocab": 128, "hidden": 64, "heads": 4, "layers": 2, "seq": 16}  # examples/models.py GPT's
EXAMPLES_MODELS = Path(resource_path("examples/models.py"))  # shipped in the package; the checkout's if editable
DTYPES = ("int32", "int64", "float16", "float32")
_INPUT_RE = re.compile(r"^(?P<dtype>\w+):(?P<shape>\d+(?:x\d+)*)(?::(?P<high>\d+))?$")


def load_model_class(spec: str):
    """The Cell class named by `spec`: "gpt" (examples/models.py's GPT, shipped in the package)
    or "package.module:Class" (the current directory is importable, as with `python -m`).

    Raises:
        ValueError: a malformed spec, a module or class that cannot be found.
    """
    if spec == GPT_PRESET:
        if not EXAMPLES_MODELS.is_file():
            raise ValueError(f"--model gpt: the GPT preset (examples/models.py, shipped in the package) is not found "
                             f"at {EXAMPLES_MODELS}; reinstall the package or give --model package.module:Class")
        module_spec = importlib.util.spec_from_file_location("mindspore_hyper_examples_models", EXAMPLES_MODELS)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module.GPT
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f"--model {spec!r}: expected 'gpt' or 'package.module:Class'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--model {spec!r}: cannot import module {module_name!r}: {exc}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"--model {spec!r}: module {module_name!r} has no {class_name!r}")
    return cls


def build_model(spec: str, init_args: Dict[str, Any]):
    """Instantiate the model class of `spec` with `init_args` (the GPT preset fills its defaults).

    Raises:
        ValueError: the class refuses the arguments (the message names --init-args).
    """
    cls = load_model_class(spec)
    kwargs = {**GPT_DEFAULTS, **init_args} if spec == GPT_PRESET else dict(init_args)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"--init-args {kwargs}: {cls.__name__} refuses them: {exc}") from None


def parse_input_spec(text: str) -> Tuple[str, Tuple[int, ...], int]:
    """"DTYPE:SHAPE[:HIGH]", e.g. "int32:8x16:128" (ints drawn from [0, HIGH)) or "float32:8x64"."""
    match = _INPUT_RE.match(text.strip())
    if not match or match["dtype"] not in DTYPES:
        raise ValueError(f"--inputs {text!r}: expected DTYPE:SHAPE[:HIGH] with DTYPE one of {', '.join(DTYPES)}, "
                         f"e.g. int32:8x16:128 or float32:8x64")
    shape = tuple(int(n) for n in match["shape"].split("x"))
    high = int(match["high"]) if match["high"] else 2
    if match["dtype"].startswith("int") and high < 1:
        raise ValueError(f"--inputs {text!r}: HIGH must be >= 1")
    return match["dtype"], shape, high


def make_inputs(specs: Sequence[str], seed: int = 0) -> List:
    """Random input tensors for the specs (ints in [0, HIGH), floats standard normal)."""
    import numpy as np
    from mindspore import Tensor

    rng = np.random.default_rng(seed)
    out = []
    for text in specs:
        dtype, shape, high = parse_input_spec(text)
        if dtype.startswith("int"):
            out.append(Tensor(rng.integers(0, high, shape).astype(dtype)))
        else:
            out.append(Tensor(rng.standard_normal(shape).astype(dtype)))
    return out


def gpt_inputs(init_args: Dict[str, Any], batch: int) -> List[str]:
    """Input specs of the GPT preset: token ids and labels of (batch, seq) below the vocabulary."""
    kwargs = {**GPT_DEFAULTS, **init_args}
    spec = f"int32:{batch}x{kwargs['seq']}:{kwargs['vocab']}"
    return [spec, spec]
