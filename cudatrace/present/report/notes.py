"""The text report's last section: truncated, lost and unreadable files, sealed chunks lost, and
the notes (analyze/documents/report/notes.py makes them)."""

from __future__ import annotations

from ...analyze.documents.report_types import Report
from ..text import secs_text, size_text
from .lines import Lines


def text_trailer(r: Report, o: Lines) -> None:
    """Truncated, lost and unreadable files; notes. Each a heading and its lines, when there
    is anything to list."""
    _listed(
        o,
        "Truncated trace files:",
        "alert",
        [
            "  %s (pid %d, %d events): %s" % (t["file"], t["pid"], t["events"], t["reason"])
            for t in r["truncated_files"]
        ],
    )
    _listed(
        o,
        "Events lost (the trace could not be written; the program ran on untraced):",
        "alert",
        [
            "  pid %d from %s on: %s  [%s]"
            % (x["pid"], secs_text(x["from_time"]), x["why"], x["file"])
            for x in r.get("lost") or []
        ],
    )
    _listed(
        o,
        "Trace data lost (sealed chunks in neither the trace nor its sidecar; in no figure):",
        None,
        [
            "  pid %d: %d chunk(s), %s (chunks %s)  [%s]"
            % (
                lc["pid"],
                len(lc["chunks"]),
                size_text(lc["bytes"]),
                ", ".join(map(str, lc["chunks"])),
                lc["file"],
            )
            for lc in r.get("lost_chunks") or []
        ],
    )
    _listed(o, "Unreadable files:", "alert", [f"  {e}" for e in r["unreadable_files"]])
    _listed(o, "Notes:", "heading", [f"  - {note}" for note in r["warnings"]])


def _listed(o: Lines, heading: str, style: str | None, lines: list[str]) -> None:
    """A heading (styled), its lines and a blank line; nothing when there are no lines."""
    if not lines:
        return
    o.L.append(heading)
    if style:
        o.mark(style)
    o.L.extend(lines)
    o.L.append("")
