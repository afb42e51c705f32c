"""speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json).

One sampled profile of the memory live at the moment: each sample a stack (indices into the
shared frames, root first), each weight its bytes, unit "bytes", so speedscope's views show
bytes and the weights add up to the total at the moment. Frames carry report's names, with
the source file and line where the symbolizer found them. With several processes, each stack
starts with a frame naming its process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ... import __version__
from ...analyze.sites.group import NO_STACK

if TYPE_CHECKING:
    from .view import View

SCHEMA = "https://www.speedscope.app/file-format-schema.json"

Frame = dict[str, "str | int"]  # name; file and line where known


class Shared(TypedDict):
    frames: list[Frame]


class Profile(TypedDict):
    type: str
    name: str
    unit: str
    startValue: int
    endValue: int
    samples: list[list[int]]  # each a stack: indexes into the shared frames, root first
    weights: list[int]  # each sample's bytes


# the file (its first key is not a name: the functional form)
File = TypedDict(
    "File",
    {
        "$schema": str,
        "name": str,
        "exporter": str,
        "activeProfileIndex": int,
        "shared": Shared,
        "profiles": list[Profile],
    },
)


def build(view: View) -> File:
    stacks = view.live_stacks()
    view.prepare(stacks)
    frames: list[Frame] = []
    index: dict[tuple[str, str | None, int | None], int] = {}

    def frame(name: str, file: str | None = None, line: int | None = None) -> int:
        k = (name, file, line)
        i = index.get(k)
        if i is None:
            i = index[k] = len(frames)
            d: Frame = {"name": name}
            if file:
                d["file"] = file
            if line:
                d["line"] = line
            frames.append(d)
        return i

    samples: list[list[int]] = []
    weights: list[int] = []
    for (ti, leaf), (_count, nbytes) in sorted(stacks.items(), key=lambda kv: -kv[1][1]):
        if nbytes <= 0:
            continue
        st = [frame(view.process(ti))] if view.multi_process else []
        fr = view.frames(ti, leaf)
        if not fr:
            st.append(frame(NO_STACK))
        for f in reversed(fr):
            st.append(frame(f.label(), f.file, f.line))
        samples.append(st)
        weights.append(nbytes)
    total = sum(weights)
    return {
        "$schema": SCHEMA,
        "name": f"device memory of {view.command()}, live {view.moment_text()}",
        "exporter": f"cudatrace {__version__}",
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": [
            {
                "type": "sampled",
                "name": f"device memory live {view.moment_text()}",
                "unit": "bytes",
                "startValue": 0,
                "endValue": total,
                "samples": samples,
                "weights": weights,
            }
        ],
    }


def write(view: View, path: Path) -> dict[str, int]:
    doc = build(view)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    return {"samples": len(doc["profiles"][0]["samples"]), "frames": len(doc["shared"]["frames"])}
