"""Trainer state on disk without pickle: tensors in safetensors, everything else in JSON.

``save_state(state, directory)`` writes ``trainer_state.json`` (the structure, with plain values)
and ``trainer_state.safetensors`` (every tensor and NumPy array, by a path key). ``load_state``
rebuilds the same nested structure. Loading runs no code: JSON and safetensors hold data only.

Encoded beyond JSON: tensors and arrays (``{"__tensor__": key}``, ``{"__ndarray__": key}``), tuples
(``{"__tuple__": [...]}``) and dicts whose keys are not all strings (``{"__items__": [[k, v], ...]}``;
optimizer states are keyed by int). Anything else (a function, an object) is refused on save.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors.torch import load_file, save_file

STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = value.detach().cpu().contiguous()
        return {"__tensor__": key, "path": path}
    if isinstance(value, np.ndarray):  # stored as int64 / float64, its dtype kept (safetensors lacks uint32)
        key = f"t{len(tensors)}"
        wide = value.astype(np.float64 if value.dtype.kind == "f" else np.int64)
        tensors[key] = torch.from_numpy(np.ascontiguousarray(wide))
        return {"__ndarray__": key, "dtype": str(value.dtype), "path": path}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, f"{path}.{k}", tensors) for k, v in value.items()}
        items = [[_encode(k, path, tensors), _encode(v, f"{path}.{k}", tensors)] for k, v in value.items()]
        return {"__items__": items}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"trainer state at '{path}': {type(value).__name__} cannot be stored without pickle")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if "__ndarray__" in value:
        return tensors[value["__ndarray__"]].numpy().astype(value["dtype"])
    if "__tuple__" in value:
        return tuple(_decode(v, tensors) for v in value["__tuple__"])
    if "__items__" in value:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__items__"]}
    return {k: _decode(v, tensors) for k, v in value.items()}


def save_state(state: dict[str, Any], directory: Path) -> None:
    """Write ``state`` (nested dicts, lists, tuples, scalars, strings, tensors, arrays) to ``directory``."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(state, "state", tensors)
    save_file(tensors, str(directory / STATE_TENSORS))
    (directory / STATE_JSON).write_text(json.dumps(structure), encoding="utf-8")


def load_state(directory: Path) -> dict[str, Any]:
    """The state ``save_state`` wrote; no code runs while loading."""
    tensors = load_file(str(directory / STATE_TENSORS))
    structure = json.loads((directory / STATE_JSON).read_text(encoding="utf-8"))
    return cast("dict[str, Any]", _decode(structure, tensors))
