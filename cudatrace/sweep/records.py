"""What a sweep keeps of each run while it fits: how the run ended, what it measured, the run
itself; the records `runs` builds and `fits` reads (their JSON is sweep_types.py's SweepRun)."""

from __future__ import annotations

from typing import TypedDict


class _EndedHow(TypedDict):
    how: str  # exited, signaled, stopped, killed, failed_under_budget, url_timeout, ...


class Ended(_EndedHow, total=False):
    """How one run ended: `how`, and what that way of ending says (the keys of
    docs/sweep-json.md's `ended`, but its `text`)."""

    status: int | None  # the exit status (a launch that failed: the launcher's)
    why: str  # stopped: "time" or "url"; no_trace, not_started: the reason
    signal: str  # the signal that ended or stopped it (SIGINT, SIGKILL ...)
    seconds: float  # stopped after (--stop-after), or the URL's timeout
    url: str
    answered_after: float  # the URL answered this long after the start
    settle: float
    settled: bool  # the traced live memory settled before the stop
    live_bytes: int | None  # the traced live memory when the stop began
    after: float  # the stop began this long after the start
    denied: int  # failed_under_budget: allocations the budget denied
    message: str | None  # a run left out: the shim's budget line, or its output's last line


class MeasuredSite(TypedDict):
    """A site live at a run's peak, keyed as `diff` matches sites."""

    label: str
    key: str
    bytes: int
    count: int


class Measurement(TypedDict):
    """One traced run measured: its peak and the sites live at it."""

    peak_bytes: int
    peak_time: float | None
    end_bytes: int
    allocs: int
    denied: int
    failed: int
    processes: int
    untraced_bytes: int | None  # what NVML saw beyond the traced allocations
    context_bytes: int | None  # CUDA contexts as a budget counts them (the shim's figure)
    sites: dict[tuple[object, ...], MeasuredSite]  # by the site's key (analyze's Site.key)
    driver_used: bool
    simulated: bool


class _Run(TypedDict):
    index: int
    combo: tuple[int, ...]  # an index into each knob's values
    command: list[str]
    directory: str
    output: str
    ended: Ended
    included: bool  # the run enters the laws
    measured: Measurement | None


class Run(_Run, total=False):
    """One run of a sweep: its value, command and directory, how it ended, what it measured."""

    seconds: float | None
