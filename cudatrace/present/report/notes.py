"""The text report's last section: truncated, lost and unreadable files, sealed chunks lost, and
the notes (analyze/documents/report/notes.py makes them)."""

from __future__ import annotations

from ...analyze.documents.report_types import Report
from ..text import secs_text, size_text
from .lines import Lines


def text_trailer(r: Report, o: Lines) -> None:
    """Truncated, lost and unreadable files; notes."""
    w = o.L.append
    if r["truncated_files"]:
        w("Truncated trace files:")
        o.mark("alert")
        for t in r["truncated_files"]:
            w("  %s (pid %d, %d events): %s" % (t["file"], t["pid"], t["events"], t["reason"]))
        w("")
    if r.get("lost"):
        w("Events lost (the trace could not be written; the program ran on untraced):")
        o.mark("alert")
        for x in r["lost"]:
            w(
                "  pid %d from %s on: %s  [%s]"
                % (x["pid"], secs_text(x["from_time"]), x["why"], x["file"])
            )
        w("")
    if r.get("lost_chunks"):
        w("Trace data lost (sealed chunks in neither the trace nor its sidecar; in no figure):")
        for lc in r["lost_chunks"]:
            w(
                "  pid %d: %d chunk(s), %s (chunks %s)  [%s]"
                % (
                    lc["pid"],
                    len(lc["chunks"]),
                    size_text(lc["bytes"]),
                    ", ".join(map(str, lc["chunks"])),
                    lc["file"],
                )
            )
        w("")
    if r["unreadable_files"]:
        w("Unreadable files:")
        o.mark("alert")
        for e in r["unreadable_files"]:
            w(f"  {e}")
        w("")
    if r["warnings"]:
        w("Notes:")
        o.mark("heading")
        for note in r["warnings"]:
            w(f"  - {note}")
