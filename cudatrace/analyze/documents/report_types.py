"""The `--json` documents as types: cudatrace.report/1 here, cudatrace.diff/1 in diff_types.py,
cudatrace.sweep/1 in sweep_types.py, one TypedDict per object of their schemas
(cudatrace/schemas/*.json), named after where it sits (Report, ReportSite, ReportFrame ...; a
key the schema does not require is in the class's total=False part). The analysis builds them
(documents/report/, documents/diff.py, sweep/fits.py), present/ renders them.
tests/unit/test_documents.py holds every class against its schema: the same keys, the same
required ones, the same types; a key added to a schema is added here in the same change."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

# ---- cudatrace.report/1 (report-1.json) -------------------------------------------------


class _ReportVersionsRequired(TypedDict):
    driver: list[Any]
    shim: list[str]
    stack_depth: list[int]


class ReportVersions(_ReportVersionsRequired, total=False):
    nvml_driver: str | None
    simulated: int | None


class ReportAt(TypedDict):
    spec: str
    kind: Literal["peak", "end", "time"]
    time: float | None
    ts_ns: int | None
    device: int | None


class ReportAttribution(TypedDict):
    fold: bool
    patterns: list[str]
    layers: list[str]
    full_names: bool


class ReportSizes(TypedDict):
    min: int
    median: int
    max: int


class ReportFrame(TypedDict):
    """One stack frame, innermost first in every list."""

    module: str
    function: str | None
    file: str | None
    line: int | None
    address: int
    offset: int
    inlined: bool
    python: bool


class _SiteCore(TypedDict):
    """What every kind of site (live, failed, denied) says of itself."""

    rank: int
    label: str
    key: str
    bytes: int
    count: int
    api: list[str]
    api_counts: dict[str, int]
    sizes: ReportSizes
    pids: list[int]
    devices: list[int]
    first_time: float | None
    last_time: float | None
    frames: list[ReportFrame]
    context: list[ReportFrame]
    via: list[ReportFrame]


class _ReportSiteRequired(_SiteCore):
    share: float


class ReportSite(_ReportSiteRequired, total=False):
    device_labels: list[str]


class ReportNeverFreed(TypedDict):
    bytes: int
    count: int
    in_truncated_bytes: int
    sites: list[ReportSite]
    more_sites: int


class ReportFailedError(TypedDict):
    code: int
    name: str
    count: int


class _ReportFailedRequired(_SiteCore):
    errors: list[ReportFailedError]


class ReportFailed(_ReportFailedRequired, total=False):
    device_labels: list[str]


class _ReportDeniedRequired(_SiteCore):
    limit: int | None
    in_use: int | None


class ReportDenied(_ReportDeniedRequired, total=False):
    device_labels: list[str]


class _ReportProcessRequired(TypedDict):
    pid: int
    ppid: int
    exe: str
    argv: list[str]
    file: str
    exec_index: int
    status: Literal["complete", "truncated", "exec"]
    exit_code: int | None
    dropped_events: int | None
    gaps: int
    events: int
    allocs: int
    frees: int
    failed: int
    denied: int
    peak_bytes: int
    peak_time: float | None
    at_bytes: int
    end_bytes: int
    first_time: float | None
    last_time: float | None


class ReportProcess(_ReportProcessRequired, total=False):
    stopped: Any
    ended_time: float
    signal: int


class _ReportDeviceRequired(TypedDict):
    device: int
    peak_bytes: int
    peak_time: float
    peak_ts_ns: int
    end_bytes: int
    allocs: int


class ReportDevice(_ReportDeviceRequired, total=False):
    at_bytes: int
    budget: int | None
    host: str
    label: str
    ranks: list[str]


class ReportHostPinned(TypedDict):
    peak_bytes: int
    peak_time: float | None
    end_bytes: int
    allocs: int


class ReportMemoryQueriesLast(TypedDict):
    api: str
    time: float | None
    pid: int
    device: int
    free: int | None
    total: int | None
    device_free: int | None
    device_total: int | None
    virtualized: bool


class ReportMemoryQueries(TypedDict):
    count: int
    failed: int
    by_api: dict[str, int]
    virtualized: int
    last: ReportMemoryQueriesLast | None


class _ReportNearRequired(TypedDict):
    time: float
    ts_ns: int
    offset_ms: float
    traced_bytes: int
    tree_device_bytes: int | None
    untraced_bytes: int | None
    device_used: int | None
    device_total: int | None
    device_used_rise: int | None
    mem_available: int | None
    mem_available_drop: int | None
    tree_rss: int | None
    note: str | None


class ReportNear(_ReportNearRequired, total=False):
    mem_free: int | None
    mem_free_drop: int | None
    tree_pss: int | None


class _ReportMaxRequired(TypedDict):
    tree_device_bytes: int | None
    tree_device_time: float | None
    traced_bytes_then: int | None
    untraced_bytes: int | None
    untraced_max_bytes: int | None
    untraced_max_time: float | None
    device_used: int | None
    device_used_time: float | None
    tree_rss: int | None
    tree_rss_time: float | None
    mem_available_min: int | None
    mem_available_drop: int | None
    mem_available_time: float | None


class ReportMax(_ReportMaxRequired, total=False):
    tree_pss: int | None
    tree_pss_time: float | None


class ReportObservedBaseline(TypedDict, total=False):
    time: float | None
    mem_available: int | None
    device_used: int | None
    device_total: int | None
    tree_rss: int | None


class ReportObserved(TypedDict):
    samples: int
    nvml: bool
    nvml_why: str | None
    per_process: bool
    per_process_why: str | None
    interval_ms: float | None
    overlap: bool
    near_peak: ReportNear | None
    max: ReportMax | None
    baseline: ReportObservedBaseline | None
    traced_peak_bytes: int


class ReportBudgetBeyondTraces(TypedDict):
    denials: int
    peak_bytes: int


class _ReportBudgetRequired(TypedDict):
    limits: dict[str, int]
    on_exceed: Literal["fail", "warn", "abort"]


class ReportBudget(_ReportBudgetRequired, total=False):
    group: str | None
    share: str | None
    aborted: bool
    spec: Any
    contexts: dict[str, int]
    beyond_traces: ReportBudgetBeyondTraces | None


class ReportTruncatedFile(TypedDict):
    file: str
    pid: int
    reason: str
    events: int


class ReportPythonProcess(TypedDict):
    pid: int
    version: str | None
    status: str | None


class ReportPython(TypedDict):
    view: Literal["hybrid", "python", "native"]
    processes: list[ReportPythonProcess]
    allocs_with_frames: int
    allocs_without_frames: dict[str, int]


class ReportLost(TypedDict):
    file: str
    pid: int
    from_ts_ns: int
    from_time: float
    why: str | None
    exit_code: int | None


class ReportAggregate(TypedDict):
    files: list[dict[str, Any]]


class ReportTreeAt(TypedDict):
    spec: str
    kind: Literal["peak", "end", "time"]
    time: float | None


class ReportTreeNodeMore(TypedDict):
    nodes: int
    bytes: int
    count: int


class ReportTreeNode(TypedDict):
    label: str
    function: str | None
    file: str | None
    line: int | None
    module: str | None
    bytes: int
    count: int
    self_bytes: int
    self_count: int
    layer: bool
    site: Any
    children: list[ReportTreeNode]
    more: ReportTreeNodeMore


class ReportTree(TypedDict):
    """only with --tree: the caller tree at `at`"""

    at: ReportTreeAt
    total_bytes: int
    total_count: int
    root: ReportTreeNode


class ReportRanksHost(TypedDict):
    host: str
    dirs: list[str]
    ranks: list[str]
    processes: int
    clock_shift_ns: int


class ReportRank(TypedDict):
    label: str
    rank: int | None
    host: str
    local_rank: int | None
    world_size: int | None
    pids: list[int]
    files: list[str]
    dirs: list[str]
    devices: list[str]
    peak_bytes: int
    peak_time: float | None
    end_bytes: int
    allocs: int
    failed: int
    denied: int
    outlier: bool


class ReportRanksDevice(TypedDict):
    host: str
    device: str
    peak_bytes: int
    peak_time: float | None
    peak_ts_ns: int | None
    end_bytes: int
    allocs: int
    ranks: list[str]


class ReportRanksOutlier(TypedDict):
    label: str
    what: str
    bytes: int
    median_bytes: float


class ReportRanksSiteOutlier(TypedDict):
    label: str
    bytes: int
    median_bytes: float


class ReportRanksSite(TypedDict):
    label: str
    key: str
    ranks: int
    of_ranks: int
    total_bytes: int
    median_bytes: float
    min_bytes: int
    max_bytes: int
    count: int
    per_rank: dict[str, Any]
    outliers: list[ReportRanksSiteOutlier]


class ReportRanksMissing(TypedDict):
    ranks: list[int]
    world_size: int
    variable: str | None


class ReportRanks(TypedDict):
    split_devices: bool
    hosts: list[ReportRanksHost]
    sources: list[str]
    ranks: list[ReportRank]
    devices: list[ReportRanksDevice]
    peak: dict[str, Any] | None
    median_peak_bytes: float | None
    outliers: list[ReportRanksOutlier]
    sites: list[ReportRanksSite]
    more_sites: int
    rule: str
    missing: ReportRanksMissing | None


class _ReportRequired(TypedDict):
    schema: Literal["cudatrace.report/1"]
    cudatrace_version: str
    path: str
    command: list[str]
    start_ns: int
    duration: float
    versions: ReportVersions
    at: ReportAt
    by: Literal["site", "api", "library", "process", "rank"]
    depth: int
    device: int | None
    attribution: ReportAttribution
    peak_bytes: int
    peak_time: float | None
    peak_ts_ns: int | None
    end_bytes: int
    total_live_bytes: int
    total_live_count: int
    sites: list[ReportSite]
    more_sites: int
    never_freed: ReportNeverFreed
    failed: list[ReportFailed]
    denied: list[ReportDenied]
    processes: list[ReportProcess]
    devices: list[ReportDevice]
    host_pinned: ReportHostPinned
    memory_queries: ReportMemoryQueries
    observed: ReportObserved
    budget: ReportBudget | None
    counts: dict[str, int]
    truncated_files: list[ReportTruncatedFile]
    unreadable_files: list[str]
    warnings: list[str]
    start_time: float | None
    exit_status: int | None
    python: ReportPython | None
    lost: list[ReportLost]
    aggregate: ReportAggregate | None


class ReportLostChunks(TypedDict):
    file: str
    pid: int
    chunks: list[int]
    bytes: int


class Report(_ReportRequired, total=False):
    """The document `cudatrace report --json` prints (docs/report-json.md). Keys are only ever added within a version: objects may hold keys not listed here."""

    peak_scope: Literal["device"]
    run_seconds: float
    tree: ReportTree
    ranks: ReportRanks | None
    paths: list[str]
    lost_chunks: list[ReportLostChunks]
