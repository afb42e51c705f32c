"""The data the record floor gathers for the commands to print, as types: what `cudatrace
status` shows of the budget ledgers (record/ledger_status.py status_json, record/fence.py's unfenced
processes, record/denials.py's last denials), the denials a run names while it runs
(present/denials.py, kept by record/denials.py) and what `cudatrace doctor` probes
(record/doctor.py). present/ renders them (status.py, metrics.py, doctor.py); `--json` prints
them as they are. A leaf: types only, so that record/ and present/ both name them.

A key that only some of the objects have is in the class's total=False part;
tests/unit/test_record_types.py holds the classes against the data the functions build.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from .nvml import MemoryRow

# ---- `cudatrace status`: a ledger's snapshot (record/ledger.py Ledger.snapshot) -----------


class LedgerDevice(TypedDict):
    """A device of a ledger with a limit or anything counted."""

    device: int
    limit: int
    in_use: int
    dead_held: int  # held by members that exited and are not reclaimed yet
    peak: int
    denials: int
    over: int  # allocations let through over the limit (--on-exceed warn)
    contexts: int  # CUDA contexts counted, of the members alive
    allocations: int  # in_use less the contexts


class MemberDevice(TypedDict):
    held: int
    peak: int
    denials: int
    over: int
    context: int
    allocations: int  # held less the context


class DeniedGroup(TypedDict, total=False):
    """Denials of one site that a run named while it ran (present/denials.py), one line of
    denials.jsonl (record/denials.py, with wall_time), a member's last denial in status."""

    label: str
    via: list[str]  # the allocator layers, innermost first
    api: str
    count: int
    bytes: int
    pid: int
    limit: int
    in_use: int
    device: int
    time: float | None
    wall_time: float


class _LedgerMemberRequired(TypedDict):
    slot: int
    pid: int
    state: Literal["alive", "dead", "unknown"]
    other_pidns: bool
    pidns: int
    start_ticks: int
    joined: str | None
    share: str
    share_limit: int
    devices: dict[int, MemberDevice]


class LedgerMember(_LedgerMemberRequired, total=False):
    last_denial: DeniedGroup | None  # record/denials.py attach_last_denials
    uid: int  # the owner of the file it is a member of (a user's part, in a shared directory)


class _LedgerSnapshotRequired(TypedDict):
    path: str
    name: str
    group: str
    private: bool  # a `cudatrace run --budget` tree's own, not a named group
    version: int
    uid: int
    created: str | None
    on_exceed: str
    count_host: bool
    reclaimed: int
    devices: list[LedgerDevice]
    members: list[LedgerMember]


class LedgerPart(TypedDict):
    """One user's part of a group in a shared directory (record/ledger_status.py merge_parts)."""

    path: str
    uid: int


class LedgerSnapshot(_LedgerSnapshotRequired, total=False):
    # the node agent's (deploy/agent.py): its name for ledgers of one name in several
    # containers, and each member's (namespace, pod, container) by slot
    label: str
    member_labels: dict[int, tuple[str, str, str]]
    owner: int  # the file's owner (uid is its creator's)
    parts: list[LedgerPart]  # a group of several users' parts, shown as one (merge_parts)


class UnfencedProcess(TypedDict):
    gpu: int
    pid: int
    bytes: int | None  # None: NVML lists it without a figure (an integrated GPU, MIG)
    command: str


class Unfenced(TypedDict):
    """The processes on the GPUs that no ledger counts (record/fence.py unfenced)."""

    known: bool  # NVML could say
    why: str | None
    gpus: list[int]
    processes: list[UnfencedProcess]
    not_visible: int  # processes of other pid namespaces NVML names but this one cannot see


# ---- the watch: NVML's view of each GPU beside the ledgers' (record/gpuview.py, watch.py) --


class WatchMember(TypedDict):
    """The ledger slot that counts a process on a device (its CUDA ordinal there)."""

    group: str  # the group's name, or the reader's label for it (the node agent's)
    ledger: str  # the ledger's id in the view: that label, else its path
    path: str
    slot: int
    device: int  # the CUDA ordinal the member uses for this GPU
    held: int  # what the ledger counts: allocations + the CUDA context counted
    allocations: int
    context: int
    limit: int  # the group's budget on that ordinal (0: none)
    on_exceed: str  # the group's: fail, warn or abort
    share: str


class _WatchProcessRequired(TypedDict):
    pid: int  # as NVML names it: a pid of the host's pid namespace
    gpu: int
    bytes: int | None  # NVML's figure; None where NVML lists it without one (N/A)
    command: str
    # member; unfenced; not_visible (not in this pid namespace); elsewhere: maps a ledger the
    # view did not read (one made since, or another directory's: not judged)
    fence: Literal["member", "unfenced", "not_visible", "elsewhere"]
    member: WatchMember | None
    container: str  # the 64-hex id its cgroup names ("" none)
    shim: bool  # not a member, but maps the preload library: it joins at its first counted call


class WatchProcess(_WatchProcessRequired, total=False):
    # the node agent's, where it could tell (deploy/identity.py): who the process is
    namespace: str
    pod: str
    pod_uid: str
    container_name: str
    verified: bool  # the API server confirmed the pod and container (else none of the above)


class WatchDevice(TypedDict):
    gpu: int  # NVML's index
    uuid: str
    name: str
    per_process: bool  # NVML gives each process's memory here
    reason: str | None  # why not (nvml.py PROCS_*): na, mig, unsupported, missing, error
    why: str | None
    listed: bool  # NVML lists the processes (with or without their memory)
    used: int | None  # the device's memory in use, from `source`; None where nothing says
    total: int | None
    source: str | None  # "nvml" (the device's figure) or "meminfo" (unified memory: the host's)
    ledgers: int  # what the ledgers count on this GPU (their members placed on it)
    context: int  # the largest CUDA context counted for a member here (0: none counted)
    fenced: bool  # a live member of a ledger uses it
    processes: list[WatchProcess]


class WatchFinding(TypedDict):
    """One breach (record/watch.py): kind outside_ledger (a member holds more by NVML than its
    ledger counts), unfenced (a process with no fence on a GPU a fence uses) or
    group_over_budget (a group's members hold more by NVML than its budget)."""

    kind: Literal["outside_ledger", "unfenced", "group_over_budget"]
    gpu: int
    uuid: str
    pid: int  # the process to stop (0: none to stop, e.g. a group over budget under warn)
    group: str
    bytes: int | None  # NVML's figure: the process's, or the group's members' together
    counted: int  # what the ledger counts for it (the member's figure, the group's budget)
    tolerance: int
    excess: int | None  # bytes less counted: a breach when above the tolerance
    message: str


class WatchPlacement(TypedDict):
    """Which GPU a ledger's CUDA ordinal names (slot -1: the group's, else a member's)."""

    ledger: str  # the ledger's label, else its path
    slot: int
    device: int
    gpu: int


class WatchReport(TypedDict):
    """The watch's view (record/watch.py report): NVML's figures beside the ledgers'."""

    known: bool  # NVML answered
    why: str | None
    devices: list[WatchDevice]
    findings: list[WatchFinding]
    placements: list[WatchPlacement]
    not_visible: int  # processes NVML names that this pid namespace cannot see
    tolerance: int  # the margin a member with a counted context is allowed (docs/budgets.md)


class UnusableLedger(TypedDict):
    path: str
    error: str


class _StatusRequired(TypedDict):
    ledgers: list[LedgerSnapshot]
    errors: list[UnusableLedger]


class Status(_StatusRequired, total=False):
    """What `cudatrace status` shows (record/ledger_status.py status_json), and the node agent's
    ledgers (deploy/agent.py: of every container, without a directory of their own)."""

    dir: str  # the ledger directory read
    unfenced: Unfenced | None  # record/fence.py status_with_unfenced: of the whole directory
    watch: WatchReport | None  # record/watch.py: NVML against the ledgers (None for a GROUP)


# ---- a run's budget: run.json's "budget" (record/run_budget.py join) -------------------------


class BudgetInfo(TypedDict, total=False):
    """The budget a run counts in, as run.json keeps it: its own or its group's ledger
    (record/run_ledger.py open_run_ledger), or the fence of an integration it runs inside
    (record/fence.py: a sealed record's or the environment's, lowered by --budget)."""

    group: str | None
    path: str  # the ledger's; a sealed fence's: its record's
    created: bool
    limits: dict[str, int]  # bytes per device ordinal (as text)
    on_exceed: str
    count_host: bool
    note: str  # the group's budget this run set, replacing a memberless group's
    spec: str | None  # --budget as given
    on_exceed_run: str  # --on-exceed as given
    # inside a fence (record/fence.py Fence, less its record)
    share: str | None
    share_limit: int
    bound: int
    label: str | None
    source: Literal["sealed", "environment"]
    ledger_dir: str | None


# ---- `cudatrace doctor` (record/doctor.py) --------------------------------------------------


class _DriverDeviceRequired(TypedDict):
    ordinal: int


class DriverDevice(_DriverDeviceRequired, total=False):
    """A device as the CUDA driver names it (record/cudadrv.py Driver.devices): what its
    queries answered."""

    name: str
    total: int
    integrated: bool


class DoctorDriver(TypedDict):
    available: bool
    why: str | None
    version: int | None
    version_text: str
    devices: list[DriverDevice]  # record/cudadrv.py Driver.devices
    integrated: str | None  # integrated, mixed, discrete


class DoctorNvml(TypedDict):
    available: bool
    why: str | None
    driver: str | None
    devices: int
    memory: list[MemoryRow]  # nvml.py Nvml.memory()
    per_process: bool | None
    memory_supported: bool | None


class _DoctorLedgerRequired(TypedDict):
    env: str | None  # CUDATRACE_LEDGER_DIR as set
    path: str | None
    exists: bool
    ok: bool
    error: str | None


class DoctorLedger(_DoctorLedgerRequired, total=False):
    note: str
    uid: int
    mode: str
    fs: str | None
    ledgers: list[str]


class DoctorNamespace(TypedDict):
    pidns: int | None
    pidns_of_pid1: int | None
    initial_pidns: bool | None
    pid: int
    uid: int
    container: str | None
    cgroup: str | None


class DoctorElf(TypedDict, total=False):
    """What a command's ELF file says (record/doctor.py _elf): part of DoctorCommand."""

    kind: str | None
    static: bool
    needed: list[str]
    cudart: str | None
    driver: str | None
    machine: str


class _DoctorCommandRequired(TypedDict):
    argv0: str
    path: str | None
    ok: bool
    problems: list[str]
    kind: str | None  # elf, script, unknown


class DoctorCommand(_DoctorCommandRequired, total=False):
    notes: list[str]
    interpreter: DoctorCommand  # a script's
    static: bool  # an ELF's, from here on
    needed: list[str]
    cudart: str | None
    driver: str | None
    machine: str


class Doctor(TypedDict):
    """What `cudatrace doctor` says (record/doctor.py diagnose)."""

    driver: DoctorDriver
    nvml: DoctorNvml
    ledger: DoctorLedger
    namespace: DoctorNamespace
    command: DoctorCommand | None
    advice: list[str]


# ---- `cudatrace top`: the box now (record/top.py Gatherer.snapshot) --------------------------


class TopProcess(TypedDict):
    """A process NVML lists on a GPU (record/gpuview.py's WatchProcess), with its group and the
    run being traced that it writes."""

    pid: int
    gpu: int
    bytes: int | None  # NVML's figure; None where NVML lists it without one
    command: str
    fence: Literal["member", "unfenced", "not_visible", "elsewhere"]
    group: str  # the group (ledger) counting it; "" none
    counted: int | None  # what that ledger counts for it on this GPU; None: no ledger counts it
    container: str  # the 64-hex id its cgroup names ("" none)
    run: str  # the trace directory it writes (CUDATRACE_DIR); "" none


class TopDevice(TypedDict):
    gpu: int  # NVML's index
    uuid: str
    name: str
    used: int | None  # the device's memory in use (NVML's; the host's on unified memory)
    total: int | None
    source: str | None  # "nvml" or "meminfo"
    per_process: bool  # NVML gives each process's memory here
    why: str | None  # why not
    ledgers: int  # what the ledgers count on it
    processes: list[TopProcess]


class TopGroupDevice(TypedDict):
    device: int  # the CUDA ordinal the ledger counts
    gpu: int | None  # the NVML index it names (watch's placement); None: cannot tell
    limit: int  # 0: none
    in_use: int
    peak: int
    denials: int


class TopMember(TypedDict):
    pid: int
    state: Literal["alive", "dead", "unknown"]
    held: int  # over every device
    denials: int
    command: str
    run: str  # the trace directory it writes; "" none


class TopGroup(TypedDict):
    name: str  # the group's name, or the ledger's ("run 1234" for a run's own budget)
    path: str
    on_exceed: str
    devices: list[TopGroupDevice]  # those with a limit or a figure
    members: list[TopMember]  # alive or unknown
    unfenced: list[int]  # pids NVML lists on the group's GPUs that no ledger counts


class TopSite(TypedDict):
    label: str
    bytes: int


class TopRunDevice(TypedDict):
    device: int  # the CUDA ordinal
    gpu: str  # the physical device it names (an index or a UUID; "" unknown)
    live: int
    sites: list[TopSite]  # the largest first; the rest summed under "other"


class TopRun(TypedDict):
    """A run being traced, as analyze/documents/live.py reads it now."""

    run: str  # the directory's name
    path: str
    command: str
    devices: list[TopRunDevice]


class TopDenial(TypedDict):
    """A budget denial: from a run's denials.jsonl (the launcher attributed it: `label` is the
    code that asked), or a member's count in its ledger where no launcher kept its site
    (`label` None)."""

    wall_time: float | None  # when it was kept (None: the ledger does not say)
    pid: int
    group: str
    label: str | None
    api: str
    bytes: int | None
    count: int
    device: int | None
    limit: int | None
    in_use: int | None
    run: str


class TopNvml(TypedDict):
    known: bool  # NVML answered
    why: str | None


class TopSnapshot(TypedDict):
    """What `cudatrace top` shows at one moment; `--once --json` prints it as it is."""

    time: float  # wall-clock time of the reading
    host: str
    nvml: TopNvml
    devices: list[TopDevice]
    groups: list[TopGroup]
    runs: list[TopRun]
    denials: list[TopDenial]  # the latest first
    findings: list[WatchFinding]  # the watch's breaches (record/watch.py), confirmed
    errors: list[str]  # what could not be read (a ledger, a run), with the reason
