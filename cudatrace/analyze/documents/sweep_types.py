"""cudatrace.sweep/1 (sweep-1.json) as types: what `cudatrace sweep --json` prints (sweep/fits.py
builds it; report_types.py says how these classes are held to the schema)."""

from __future__ import annotations

from typing import Any, Literal, TypedDict


class SweepKnob(TypedDict):
    name: str
    placeholder: str
    flag: str | None
    unit: str | None
    noun: str | None
    values: list[str]
    numbers: list[int | float]


class _SweepRunEndedRequired(TypedDict):
    how: Literal[
        "exited",
        "signaled",
        "stopped",
        "killed",
        "failed_under_budget",
        "url_timeout",
        "no_trace",
        "not_started",
        "interrupted",
    ]
    text: str
    status: int | None


class SweepRunEnded(_SweepRunEndedRequired, total=False):
    message: str


class SweepRun(TypedDict):
    value: int | float | dict[str, Any]
    text: str
    command: list[str]
    directory: str
    output: str
    ended: SweepRunEnded
    included: bool
    seconds: float | None
    peak_bytes: int | None
    peak_time: float | None
    allocs: int | None
    denied: int | None


class SweepStop(TypedDict):
    after: float | None
    url: str | None
    settle: float | None
    grace: float


class SweepFit(TypedDict):
    slope: int | float
    intercept: int | float
    r2: float
    n: int
    stderr: float | None
    exact: bool


class SweepLaw(TypedDict):
    kind: str
    tested: bool
    detail: str
    points: list[list[Any]]
    text: str


class SweepSeries(TypedDict):
    label: str
    key: str | None
    bytes: list[int | None]
    fit: SweepFit | None
    law: SweepLaw
    contradicts_expectation: bool
    expectation: str | None


class SweepSite(SweepSeries):
    """A site's series: the peak's, and its count of allocations in each run."""

    count: list[int | None]


class SweepPredictionPeak(TypedDict):
    bytes: int
    stderr: float | None
    how: str


class SweepPredictionSite(TypedDict):
    label: str
    key: str
    bytes: int
    stderr: float | None
    how: str


class SweepPredictionBudget(TypedDict):
    bytes: int
    spec: str
    reason: str


class SweepPrediction(TypedDict):
    at: str
    extrapolated: bool
    peak: SweepPredictionPeak
    sites: list[SweepPredictionSite]
    budget: SweepPredictionBudget
    notes: list[str]


class Sweep(TypedDict):
    """The document `cudatrace sweep --json` and `sweep --from DIR --json` print (docs/sweep-json.md). Keys are only ever added within a version: objects may hold keys not listed here."""

    schema: Literal["cudatrace.sweep/1"]
    cudatrace_version: str
    command: list[str]
    directory: str
    knobs: list[SweepKnob]
    values: list[int | float | dict[str, Any]]
    runs: list[SweepRun]
    stop: SweepStop
    expect: float | dict[str, Any] | None
    expect_text: str | None
    expect_checked: bool | None
    peak: SweepSeries
    sites: list[SweepSite]
    more_sites: int
    prediction: SweepPrediction | None
    notes: list[str]
