"""cudatrace.diff/1 (diff-1.json) as types: what `cudatrace diff --json` prints
(documents/diff.py builds it; report_types.py says how these classes are held to the schema).
A frame is the report's."""

from __future__ import annotations

from typing import Literal, TypedDict

from .report_types import ReportFrame


class _DiffSideRequired(TypedDict):
    path: str
    command: list[str]
    peak_bytes: int
    peak_time: float | None
    end_bytes: int
    allocs: int
    failed: int
    denied: int
    processes: int
    truncated_files: list[str]


class DiffSide(_DiffSideRequired, total=False):
    paths: list[str]


class DiffPair(TypedDict):
    a: int
    b: int
    delta: int


class DiffTotals(TypedDict):
    peak_bytes: DiffPair
    end_bytes: DiffPair
    allocs: DiffPair
    failed: DiffPair
    denied: DiffPair


class DiffSiteAt(TypedDict):
    """A site's bytes and allocations live in each run at a moment (each run's peak, the end)."""

    a_bytes: int
    b_bytes: int
    delta_bytes: int
    a_count: int
    b_count: int
    delta_count: int


class DiffSiteRun(TypedDict):
    a_bytes: int
    b_bytes: int
    a_count: int
    b_count: int
    delta_count: int


class DiffSite(TypedDict):
    status: Literal["new", "gone", "grown", "shrunk", "same"]
    label: str
    key: str
    frames: list[ReportFrame]
    via: list[ReportFrame]
    peak: DiffSiteAt
    end: DiffSiteAt
    run: DiffSiteRun


class DiffRanks(TypedDict):
    label: str
    host: str
    a_peak_bytes: int | None
    b_peak_bytes: int | None
    delta_bytes: int


class _DiffRequired(TypedDict):
    schema: Literal["cudatrace.diff/1"]
    depth: int
    a: DiffSide
    b: DiffSide
    totals: DiffTotals
    status_counts: dict[str, int]
    sites: list[DiffSite]
    more_sites: int


class Diff(_DiffRequired, total=False):
    """The document `cudatrace diff --json` prints (docs/report-json.md). Keys are only ever added within a version: objects may hold keys not listed here."""

    ranks: list[DiffRanks] | None
