"""RFC 6902 JSON Patch, the operations an admission webhook answers with (add, replace,
remove), applied as the API server applies them: to check what a patch does to a pod."""

from __future__ import annotations

import copy
from typing import Any


def _parts(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise ValueError(f"bad JSON pointer {pointer!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def apply(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """A patched copy of doc; ValueError on an operation that does not apply."""
    out = copy.deepcopy(doc)
    for op in ops:
        *path, last = _parts(op["path"])
        parent = out
        for p in path:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        kind = op["op"]
        if isinstance(parent, list):
            i = len(parent) if last == "-" else int(last)
            if kind == "add":
                if i > len(parent):
                    raise ValueError(f"{op['path']}: index out of range")
                parent.insert(i, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[i] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[i]
            else:
                raise ValueError(f"unsupported op {kind}")
        else:
            if kind == "replace" and last not in parent:
                raise ValueError(f"{op['path']}: replace of a missing member")
            if kind in ("add", "replace"):
                parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[last]
            else:
                raise ValueError(f"unsupported op {kind}")
    return out
