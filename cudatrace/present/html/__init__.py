"""`report --html` and `diff --html`: one self-contained page (page.py), its data (data.py: the
tables of frames, stacks and sites, the moments, the series), the ranks card (ranks.py: drawn in
Python), and its script and style (page.js, page.css, inlined into the page)."""

from __future__ import annotations

from .data import MAX_MOMENTS, MAX_ROWS, OTHER
from .page import render_diff_html, render_report_html, write_html

__all__ = [
    "MAX_MOMENTS",
    "MAX_ROWS",
    "OTHER",
    "render_diff_html",
    "render_report_html",
    "write_html",
]
