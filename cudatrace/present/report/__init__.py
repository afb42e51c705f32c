"""`cudatrace report` as text: rendered from the report's data (analyze/documents/report/
build_report, the JSON of --json), so text and JSON never disagree. One module per kind of
section, as the data's (documents/report/): run.py (what was run, the peak, the run's
details), sites.py (the sites, failures, never freed, call stacks), notes.py (the files and
notes at the end); words.py the phrases the HTML page shares, lines.py the lines being
written. SECTIONS is their order.
"""

from __future__ import annotations

from ...analyze.documents.report_types import Report
from ...analyze.sites.names import on_terminal
from ...units import printable, wrap_line
from ..text import styled, term_width
from .lines import CONTEXT_SITES, Lines
from .notes import text_trailer
from .run import (
    text_observed,
    text_peak,
    text_processes,
    text_queries,
    text_ranks,
    text_run,
    text_title,
)
from .sites import text_failures, text_never_freed, text_sites, text_stacks


def render_text(
    r: Report,
    top_context: int = CONTEXT_SITES,
    width: int | None = None,
    colour: bool = False,
    terminal: bool | None = None,
) -> str:
    """The text report from its dict (build_report), section by section: the answer first
    (the peak, the sites live then, failures, what was never freed, their call stacks), the
    run's details after. colour: ANSI styles for a terminal (text.use_colour); on a terminal
    (None: stdout is one) its prose is wrapped at the width (text.wrap_prose)."""
    o = Lines(width or term_width(), bool((r.get("attribution") or {}).get("full_names")))
    o.top_context = top_context
    for section in SECTIONS:
        section(r, o)
    while o.L and not o.L[-1]:
        o.L.pop()
    wrap = on_terminal() if terminal is None else terminal
    # whatever a trace held (argv, paths, names) reaches the terminal escaped, then styled
    return (
        "\n".join(
            styled(piece, o.styles.get(i), colour)
            for i, x in enumerate(o.L)
            for piece in (wrap_line(printable(x), o.width) if wrap else [printable(x)])
        )
        + "\n"
    )


# the report's sections in order (each pairs with a part of build_report's dict): the answer
# (the peak, who held it, what failed, what stayed), then how it came about and the details
SECTIONS = (
    text_title,
    text_peak,
    text_sites,
    text_failures,
    text_never_freed,
    text_stacks,
    text_ranks,
    text_run,
    text_observed,
    text_processes,
    text_queries,
    text_trailer,
)
