"""Runs a Python-function worker and hands its return value back as JSON.

Spawn start method: the launcher writes a small JSON spec (module, qualname, the agent's
``sys.path``, the main script's path when the function lives in ``__main__``, the JSON
arguments, where to write the result) and runs this file as a script::

    python <this file> <spec.json>

Fork start method: the forked child calls :func:`run_function` directly.

Return values travel as JSON, never pickle: the result file holds ``{"value": <json>}``
or, when the value cannot be encoded, ``{"unserialisable": "<type name>"}`` (the agent
then records None and logs a warning).  A torch tensor anywhere in the value (torch's
function workers return them) is written as its dtype, shape and raw bytes (base64) under
the key :data:`TENSOR_KEY`, and the agent rebuilds it as a CPU tensor (:func:`decode`):
data only, nothing that runs code when read.  The function runs under ``record`` so an
exception is written to ``TORCHELASTIC_ERROR_FILE`` like torch's function workers.
Exit code: 0 on return, 1 on exception, the code of ``SystemExit`` otherwise.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "MAX_RESULT_BYTES",
    "MAX_SPEC_BYTES",
    "TENSOR_KEY",
    "decode",
    "run_function",
    "write_result",
]

MAX_RESULT_BYTES = 1 << 20  # 1 MiB: a return value is a summary, not a data set
MAX_SPEC_BYTES = 16 << 20


#: the one key of the JSON object that stands for a tensor
TENSOR_KEY = "__elastic_tensor__"


def _encode_tensor(obj: Any) -> Any:
    """``json.dumps``'s ``default``: a torch tensor as data; anything else is refused."""
    torch = sys.modules.get("torch")  # a worker that made a tensor imported torch
    if torch is None or not isinstance(obj, torch.Tensor):
        raise TypeError(type(obj).__qualname__)
    t = obj.detach().cpu().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {
        TENSOR_KEY: {
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "data": base64.b64encode(raw).decode("ascii"),
        }
    }


def decode(obj: dict[str, Any]) -> Any:
    """``json.loads``'s ``object_hook``: rebuild a tensor written by :func:`write_result`
    (imports torch only when the value holds one).  Raises ``ValueError`` for a tensor
    whose fields do not fit together."""
    if len(obj) != 1 or TENSOR_KEY not in obj:
        return obj
    spec = obj[TENSOR_KEY]
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


def write_result(path: str, value: Any) -> None:
    """Write the JSON result file atomically (the agent reads it after the exit)."""
    try:
        body = json.dumps({"value": value}, allow_nan=False, default=_encode_tensor)
    except (TypeError, ValueError):
        body = json.dumps({"unserialisable": type(value).__qualname__})
    if len(body.encode()) > MAX_RESULT_BYTES:
        body = json.dumps({"too_large": len(body.encode())})
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(body)
    os.replace(tmp, path)


def run_function(fn: Callable[..., Any], args: Sequence[Any], result_path: str) -> int:
    """Call ``fn(*args)`` under ``record``; write its return value; return the exit code."""
    from elastic.multiprocessing.errors import record

    try:
        value = record(fn)(*args)
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
    write_result(result_path, value)
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
    fn = _resolve(spec)
    return run_function(fn, spec["args"], spec["result_path"])


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
