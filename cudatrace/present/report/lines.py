"""The lines of a text report being written, and how."""

from __future__ import annotations

from ...analyze.sites.names import fit

CONTEXT_SITES = 5  # sites whose call stacks are listed


class Lines:
    """The lines of a text report being written, and how: the width, full names or not, and
    the style of the lines that carry the answer (shown on a terminal only)."""

    def __init__(self, width: int, full: bool):
        self.L: list[str] = []
        self.width = width
        self.full = full
        self.top_context = CONTEXT_SITES
        self.styles: dict[int, str] = {}  # line index -> style (text.STYLES)

    def wf(self, line: str) -> None:  # a line that names code: cut to the terminal, never wrapped
        self.L.append(fit(line, self.width))

    def mark(self, style: str) -> None:
        """Style the last line written."""
        self.styles[len(self.L) - 1] = style
