"""Runs a Python-function worker and hands its return value back as data.

Spawn start method: the launcher writes a small JSON spec (module, qualname, the agent's
``sys.path``, the main script's path when the function lives in ``__main__``, the
arguments, where to write the result) and runs this file as a script::

    python <this file> <spec.json>

Fork start method: the forked child calls :func:`run_function` directly.

Arguments and return values travel as JSON, never pickle: nothing here runs code when
it is read.  Plain JSON values are themselves; what JSON lacks is written as an object
with one tag key (:func:`to_data`, read back by :func:`decode`, ``json.loads``'s
``object_hook``):

===================================  =====================================================
value                                written as
===================================  =====================================================
tuple                                ``{"__elastic_tuple__": [items]}``
bytes (and bytearray: back as bytes) ``{"__elastic_bytes__": "<base64>"}``
dict with a key that is not a str    ``{"__elastic_dict__": [[key, value], ...]}``
(or whose one key is a tag)
float NaN, inf, -inf                 ``{"__elastic_float__": "nan" | "inf" | "-inf"}``
torch tensor (as a CPU tensor)       ``{"__elastic_tensor__": {dtype, shape, data}}``
dataclass instance                   ``{"__elastic_dataclass__": {"type": "mod:Qual",
                                     "fields": {name: value}}}``
===================================  =====================================================

So ``{0: (1, b"x")}`` comes back as ``{0: (1, b"x")}``, as with torch's pickling.
Subclasses of int, float, str, list, tuple and dict come back as the base type.  A
dataclass instance comes back as an instance of its class when the reading process has
its module loaded already (a worker function's module is, in the agent): the object is
made as pickle makes it, ``__new__`` and its fields set, so no ``__init__`` or
``__post_init__`` runs and nothing is imported; otherwise as a
``types.SimpleNamespace`` of its fields.  Other objects (sets, numpy arrays…) are
refused.  The result file holds
``{"value": <data>}``.  A return value that cannot be written this way, or whose
encoding is over :data:`MAX_RESULT_BYTES`, fails the worker: :func:`run_function`
raises :class:`ReturnValueError` inside ``record`` (so the reason is in
``TORCHELASTIC_ERROR_FILE`` like any exception) and the worker exits 1.
The function runs under ``record`` so an exception is written to the error file like
torch's function workers.  Exit code: 0 on return, 1 on exception (or a return value
that cannot be sent back), the code of ``SystemExit`` otherwise.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import math
import os
import sys
import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_RESULT_BYTES",
    "MAX_SPEC_BYTES",
    "TENSOR_KEY",
    "ReturnValueError",
    "decode",
    "encode_result",
    "from_data",
    "run_function",
    "to_data",
    "write_result",
]

MAX_RESULT_BYTES = 64 << 20  # 64 MiB: what the agent holds per worker, briefly, to read it
MAX_SPEC_BYTES = 16 << 20
#: how deeply containers may nest in an argument or return value (a cycle hits it too)
MAX_DEPTH = 100


#: the one key of the JSON object that stands for a tensor
TENSOR_KEY = "__elastic_tensor__"
_TUPLE = "__elastic_tuple__"
_BYTES = "__elastic_bytes__"
_DICT = "__elastic_dict__"
_FLOAT = "__elastic_float__"
_DATACLASS = "__elastic_dataclass__"
_TAGS = frozenset({TENSOR_KEY, _TUPLE, _BYTES, _DICT, _FLOAT, _DATACLASS})
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class ReturnValueError(TypeError):
    """A worker function's return value cannot be sent back to the agent as data."""


def _encode_tensor(obj: Any) -> Any:
    t = obj.detach().cpu().contiguous()
    torch = sys.modules["torch"]
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {
        TENSOR_KEY: {
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "data": base64.b64encode(raw).decode("ascii"),
        }
    }


def to_data(obj: Any, where: str = "value", depth: int = 0) -> Any:
    """``obj`` as a tree ``json.dumps`` writes unchanged (see the module's table).

    Raises ``TypeError`` naming the first part that is not data (``where`` is its path,
    e.g. ``value['a'][2]``), or ``ValueError`` past :data:`MAX_DEPTH` levels.
    """
    if obj is None or isinstance(obj, bool):
        return obj
    # the base type's own conversions: a subclass's __str__/__int__ cannot change the value
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, int):
        return int.__int__(obj)
    if isinstance(obj, float):
        if math.isfinite(obj):
            return float.__float__(obj)
        return {_FLOAT: "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}
    if depth >= MAX_DEPTH:
        raise ValueError(f"{where} nests more than {MAX_DEPTH} levels deep (or is a cycle)")
    if isinstance(obj, bytes | bytearray):
        return {_BYTES: base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, list):
        return [to_data(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {_TUPLE: [to_data(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(obj)]}
    if isinstance(obj, dict):
        if all(type(k) is str for k in obj) and not (len(obj) == 1 and next(iter(obj)) in _TAGS):
            return {k: to_data(v, f"{where}[{k!r}]", depth + 1) for k, v in obj.items()}
        return {
            _DICT: [
                [
                    to_data(k, f"{where} key {k!r}", depth + 1),
                    to_data(v, f"{where}[{k!r}]", depth + 1),
                ]
                for k, v in obj.items()
            ]
        }
    torch = sys.modules.get("torch")  # a worker that made a tensor imported torch
    if torch is not None and isinstance(obj, torch.Tensor):
        return _encode_tensor(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        return {
            _DATACLASS: {
                "type": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {
                    f.name: to_data(getattr(obj, f.name), f"{where}.{f.name}", depth + 1)
                    for f in dataclasses.fields(obj)
                },
            }
        }
    raise TypeError(f"{where} is a {type(obj).__qualname__}, which is not data")


def decode(obj: dict[str, Any]) -> Any:
    """``json.loads``'s ``object_hook``: rebuild what :func:`to_data` tagged (imports
    torch only when the value holds a tensor).  Raises ``ValueError`` for a tagged object
    whose fields do not fit together."""
    if len(obj) != 1:
        return obj
    ((tag, body),) = obj.items()
    if tag not in _TAGS:
        return obj
    if tag == TENSOR_KEY:
        return _decode_tensor(body)
    try:
        if tag == _TUPLE and isinstance(body, list):
            return tuple(body)
        if tag == _BYTES and isinstance(body, str):
            return base64.b64decode(body, validate=True)
        if tag == _FLOAT and body in _NON_FINITE:
            return _NON_FINITE[body]
        if tag == _DICT and isinstance(body, list):
            return dict(body)  # each item must be a [key, value] pair
        if tag == _DATACLASS and isinstance(body, dict):
            return _decode_dataclass(body["type"], body["fields"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"malformed {tag} in the data ({type(e).__name__}: {e})") from None
    raise ValueError(f"malformed {tag} in the data")


def _decode_dataclass(name: Any, fields: Any) -> Any:
    """The dataclass instance ``name`` (``module:qualname``) with ``fields``, made as
    pickle makes an object (no ``__init__``), if this process has loaded that module
    and the name is a dataclass there; else a ``SimpleNamespace`` of the fields."""
    if not isinstance(name, str) or not isinstance(fields, dict):
        raise TypeError("a dataclass is a type name and a dict of fields")
    module, _, qualname = name.partition(":")
    cls: Any = sys.modules.get(module)  # never imported here: reading runs no code
    for part in qualname.split("."):
        cls = getattr(cls, part, None) if cls is not None and part else None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return types.SimpleNamespace(**fields)
    known = {f.name for f in dataclasses.fields(cls)}
    if set(fields) != known:
        raise ValueError(f"the fields {sorted(fields)} are not {name}'s {sorted(known)}")
    obj = cls.__new__(cls)
    for key, value in fields.items():
        object.__setattr__(obj, key, value)  # a frozen dataclass too, as pickle does
    return obj


def from_data(tree: Any) -> Any:
    """What :func:`to_data` wrote, rebuilt from an already parsed JSON tree."""
    if isinstance(tree, list):
        return [from_data(v) for v in tree]
    if isinstance(tree, dict):
        return decode({k: from_data(v) for k, v in tree.items()})
    return tree


def _decode_tensor(spec: Any) -> Any:
    try:
        import torch
    except ImportError:
        raise ValueError("the value holds a tensor and torch is not importable here") from None
    try:
        dtype = getattr(torch, spec["dtype"])
        shape = [int(n) for n in spec["shape"]]
        raw = base64.b64decode(spec["data"], validate=True)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(spec["dtype"])
        if not raw:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
    except (KeyError, TypeError, AttributeError, RuntimeError, ValueError) as e:
        raise ValueError(f"malformed tensor in the result ({type(e).__name__}: {e})") from None


_WHAT_TO_RETURN = (
    "return JSON values (dict, list, str, int, float, bool, None), tuples, bytes, "
    "dataclasses or torch tensors from worker functions"
)


def encode_result(value: Any, fn_name: str = "the worker function") -> str:
    """The result file's text for ``value``; :class:`ReturnValueError` when it cannot be
    written as data or is over :data:`MAX_RESULT_BYTES` encoded."""
    try:
        body = json.dumps({"value": to_data(value)}, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ReturnValueError(
            f"the return value of {fn_name} cannot be sent back to the agent: {e}; "
            f"{_WHAT_TO_RETURN} (nothing is pickled)"
        ) from None
    size = len(body.encode())
    if size > MAX_RESULT_BYTES:
        raise ReturnValueError(
            f"the return value of {fn_name} is {size} bytes encoded, over the "
            f"{MAX_RESULT_BYTES}-byte limit: return a summary and write large data to a file"
        )
    return body


def _write(path: str, body: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(body)
    os.replace(tmp, path)


def write_result(path: str, value: Any) -> None:
    """Write the result file atomically (the agent reads it after the exit).

    A value that cannot be sent is written as a marker the agent reports
    (``unserialisable`` / ``too_large``); :func:`run_function` fails the worker instead.
    """
    try:
        body = encode_result(value)
    except ReturnValueError:
        try:
            body = json.dumps({"too_large": len(json.dumps({"value": to_data(value)}))})
        except (TypeError, ValueError):
            body = json.dumps({"unserialisable": type(value).__qualname__})
    _write(path, body)


def run_function(fn: Callable[..., Any], args: Sequence[Any], result_path: str) -> int:
    """Call ``fn(*args)`` under ``record``; write its return value; return the exit code.

    The value is encoded inside ``record``: one that cannot be sent back fails the worker
    (exit code 1) with :class:`ReturnValueError` in its error file, not a silent None.
    """
    from elastic.multiprocessing.errors import record

    name = f"{getattr(fn, '__qualname__', type(fn).__qualname__)}()"

    @functools.wraps(fn)
    def call_and_encode(*a: Any) -> str:
        return encode_result(fn(*a), name)

    try:
        body = record(call_and_encode)(*args)
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    _write(result_path, body if body is not None else encode_result(None))  # None: exit(0)
    return 0


def _resolve(spec: dict[str, Any]) -> Callable[..., Any]:
    module_name = spec["module"]
    if module_name == "__main__":
        import runpy

        # what multiprocessing's spawn does: re-run the main script under another name so
        # its `if __name__ == "__main__":` block does not start the agent again
        namespace = runpy.run_path(spec["main_path"], run_name="__mp_main__")
        obj: Any = namespace[spec["qualname"].split(".")[0]]
        rest = spec["qualname"].split(".")[1:]
    else:
        import importlib

        obj = importlib.import_module(module_name)
        rest = spec["qualname"].split(".")
    for part in rest:
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{module_name}.{spec['qualname']} is not callable")
    return obj  # type: ignore[no-any-return]


def main(argv: Sequence[str]) -> int:
    with open(argv[1], "rb") as f:
        raw = f.read(MAX_SPEC_BYTES + 1)
    if len(raw) > MAX_SPEC_BYTES:
        print(f"elastic: worker spec {argv[1]} is larger than {MAX_SPEC_BYTES}", file=sys.stderr)
        return 1
    spec = json.loads(raw)
    sys.path[:] = [p for p in spec["sys_path"] if isinstance(p, str)]
    # the arguments are decoded after sys.path is the agent's: a tensor needs torch
    args = from_data(spec["args"])
    fn = _resolve(spec)
    return run_function(fn, args, spec["result_path"])


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
