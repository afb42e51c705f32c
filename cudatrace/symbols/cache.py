"""The per-module disk cache: <cache_dir>/<build-id hex>.json holds the frames computed for a
module's offsets, with a signature of what produced them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# Bumped whenever the meaning of cached entries changes.
CACHE_FORMAT = 2  # 2: names of functions without a linkage name carry their scopes

# One frame as cached: (function or None, file or None, line or None, inlined). A plain alias
# (no unions evaluated at run time: Python 3.9 is supported).
CachedFrame = tuple[Any, ...]


def cache_path(cache_dir: Path, build_id: bytes | None, path: str) -> Path:
    """Keyed by build-id, else by the file's identity (real path, size, mtime)."""
    if build_id:
        name = build_id.hex()
    else:
        st = os.stat(path)
        ident = f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
        name = "nobid-" + hashlib.sha1(ident.encode()).hexdigest()[:24]
    return cache_dir / (name + ".json")


def load(path: Path, sig: list[Any]) -> dict[int, list[CachedFrame]]:
    """The cached frames by offset; empty when the file is missing, corrupt or made by
    something else (another signature)."""
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("sig") != sig:
            return {}
        return {
            int(k): [(fn, fl, ln, bool(inl)) for fn, fl, ln, inl in frames]
            for k, frames in data.get("frames", {}).items()
        }
    except Exception:
        return {}


def save(path: Path, sig: list[Any], results: dict[int, list[CachedFrame]]) -> None:
    """Write atomically (temp file + rename); raises OSError and the like."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "sig": sig,
        "frames": {str(o): [list(f) for f in frames] for o, frames in results.items()},
    }
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, path)
