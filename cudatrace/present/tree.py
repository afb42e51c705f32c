"""`cudatrace report --tree` as text: the caller tree (analyze/documents/tree.py), top-down, one line per
node, chains of single children on one line (`a > b > c`), allocator layers marked [layer]
and the sites (the code that asked, just above the layers) marked <- site, each on a line of
its own under the chain that leads to it."""

from __future__ import annotations

from ..analyze.documents.report_types import ReportTree, ReportTreeNode
from ..analyze.sites.names import fit
from ..units import printable
from .text import percent, plural, secs_text, size_text, term_width


def _chain(n: ReportTreeNode) -> tuple[list[ReportTreeNode], ReportTreeNode]:
    """The node and its single-child descendants (that hold nothing themselves), and the last."""
    out = [n]
    while len(n["children"]) == 1 and not n["more"]["nodes"] and not n["self_count"]:
        n = n["children"][0]
        out.append(n)
    return out, n


def _bare(n: ReportTreeNode) -> str:
    """The function's name without file:line."""
    lab = n["label"]
    return lab[: lab.rindex(" (")] if n["file"] and " (" in lab else lab


def _chain_text(nodes: list[ReportTreeNode]) -> str:
    """`a > b (f.c:12) <- site via layer1 > layer2`: file:line on the site (or the last node
    when no site is in the chain), names alone elsewhere; the layers below a site after via."""
    site = next((k for k, x in enumerate(nodes) if x["site"]), None)
    shown = nodes if site is None else nodes[: site + 1]
    last = len(shown) - 1
    parts = [
        (x["label"] if k == last else _bare(x)) + (" [layer]" if x["layer"] else "")
        for k, x in enumerate(shown)
    ]
    text = " > ".join(parts)
    if site is not None:
        text += " <- site"
        below = nodes[site + 1 :]
        if below:
            text += " via " + " > ".join(_bare(x) for x in below) + " [layers]"
    return text


def render_tree(t: ReportTree, full: bool = False, width: int | None = None) -> str:
    width = width or term_width()
    at = t["at"]
    when = {"peak": "at the peak", "end": "at the end", "time": "at"}[at["kind"]]
    L = [
        "Caller tree {} ({}): {} in {}".format(
            when,
            secs_text(at["time"]),
            size_text(t["total_bytes"]),
            plural(t["total_count"], "allocation"),
        ),
        "  from main down; <- site: the code that asked, via the allocator layers it went through",
    ]
    total = t["total_bytes"]
    if not t["root"]["children"]:
        L.append("  (nothing live%s)" % ("" if not t["total_count"] else ": no stacks recorded"))
        return "\n".join(printable(x) for x in L) + "\n"

    def line(n: ReportTreeNode, depth: int) -> None:
        nodes, last = _chain(n)
        share = percent(n["bytes"] / total) if total else "    -"

        def head(d: int) -> str:
            return "%10s %s %7s  %s" % (
                size_text(n["bytes"]),
                share,
                "{:,}x".format(n["count"]),
                "  " * d,
            )

        site = next((k for k, x in enumerate(nodes) if x["site"]), None)
        if site:  # the site on its own line under the chain that leads to it: never cut off
            L.append(fit(head(depth) + _chain_text(nodes[:site]), width))
            depth += 1
            nodes = nodes[site:]
        L.append(fit(head(depth) + _chain_text(nodes), width))
        for c in last["children"]:
            line(c, depth + 1)
        m = last["more"]
        if m["nodes"]:
            L.append(
                fit(
                    "%10s %s %7s  %s(%d more callers, each under %s)"
                    % (
                        size_text(m["bytes"]),
                        percent(m["bytes"] / total) if total else "",
                        "{:,}x".format(m["count"]),
                        "  " * (depth + 1),
                        m["nodes"],
                        percent(0.001).strip(),
                    ),
                    width,
                )
            )

    for c in t["root"]["children"]:
        line(c, 0)
    if t["root"]["self_count"]:
        L.append(
            "%10s %s %7s  (no stack recorded)"
            % (
                size_text(t["root"]["self_bytes"]),
                percent(t["root"]["self_bytes"] / total),
                "{:,}x".format(t["root"]["self_count"]),
            )
        )
    return "\n".join(printable(x) for x in L) + "\n"  # a trace's names are data
