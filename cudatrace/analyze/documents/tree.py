"""The caller tree of `cudatrace report --tree`: bytes live at a moment, top-down from the
program's entry (main when the stacks reach it), with the allocator layers marked.

For when one site per line is not enough: the tree shows who called whom, down to the
allocations, so that the sites (the frames just above the layers) sit where they are in the
program. CUDA's own frames are folded as everywhere; the layers are not, they are marked.
"""

from __future__ import annotations

from typing import Any

from .analysis import Analysis
from .report_types import ReportTree, ReportTreeNode

MIN_SHARE = 0.001  # children below this share of the total are gathered into one line


class _Node:
    __slots__ = ("frame", "bytes", "count", "self_bytes", "self_count", "children", "site")

    def __init__(self, frame: Any) -> None:
        self.frame = frame
        self.bytes = self.count = self.self_bytes = self.self_count = 0
        self.children: dict[str, Any] = {}
        self.site = False


def _entry(frames: list[Any]) -> list[Any]:
    """Outermost first, from main when it is there (what lies beyond is the C runtime)."""
    out = list(reversed(frames))
    for i, f in enumerate(out):
        if f.function == "main":
            return out[i:]
    return out


def build_tree(
    a: Analysis, at: str = "peak", device: int | None = None, min_share: float = MIN_SHARE
) -> ReportTree:
    """The tree as a JSON-able dict: {"at", "total_bytes", "total_count", "root"}; a node is
    {"label", "function", "file", "line", "module", "bytes", "count", "self_bytes",
    "self_count", "layer", "site", "children", "more"}."""
    mom = a.moment(at, device)
    live = a.live(mom)
    st = a.stacks
    rows = live.rows
    st.prepare({(r[0], r[1]) for r in rows if r[1]})
    root = _Node(None)
    layers = st.graph.layers if st.layers else set()
    for r in rows:
        ti, leaf, count, nbytes = r[0], r[1], r[5], r[6]
        root.bytes += nbytes
        root.count += count
        if not leaf:
            path, site_depth = [], -1
        else:
            via, rest = st.split(ti, leaf)
            frames = st.frames(ti, leaf)
            path = _entry(frames)
            # index (outermost first) of the responsible frame
            site_depth = len(path) - len(via) - 1 if via else -1
        node = root
        for i, f in enumerate(path):
            k = f.key()  # whole names: two instantiations of a template are two nodes
            child = node.children.get(k)
            if child is None:
                child = node.children[k] = _Node(f)
            child.bytes += nbytes
            child.count += count
            if i == site_depth:
                child.site = True
            node = child
        node.self_bytes += nbytes
        node.self_count += count

    total = root.bytes

    def emit(n: _Node) -> ReportTreeNode:
        f = n.frame
        kids = sorted(n.children.values(), key=lambda c: (-c.bytes, -c.count))
        keep = [c for c in kids if total and c.bytes >= min_share * total] or kids[:1]
        rest = kids[len(keep) :]
        return {
            "label": f.label(a.full_names) if f else "(all)",
            "function": f.function if f else None,
            "file": f.file if f else None,
            "line": f.line if f else None,
            "module": f.module if f else None,
            "bytes": n.bytes,
            "count": n.count,
            "self_bytes": n.self_bytes,
            "self_count": n.self_count,
            "layer": bool(f and (f.identity() in layers or st.forced(f))),
            "site": n.site,
            "children": [emit(c) for c in keep],
            "more": {
                "nodes": len(rest),
                "bytes": sum(c.bytes for c in rest),
                "count": sum(c.count for c in rest),
            },
        }

    return {
        "at": {"spec": mom["spec"], "kind": mom["kind"], "time": a.seconds(mom["ts_ns"])},
        "total_bytes": total,
        "total_count": root.count,
        "root": emit(root),
    }
