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

from typing import Any, Literal, TypedDict

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
    bytes: int
    command: str


class Unfenced(TypedDict):
    """The processes on the GPUs that no ledger counts (record/fence.py unfenced)."""

    known: bool  # NVML could say
    why: str | None
    gpus: list[int]
    processes: list[UnfencedProcess]
    not_visible: int  # processes of other pid namespaces NVML names but this one cannot see


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


# ---- `cudatrace doctor` (record/doctor.py) --------------------------------------------------


class DoctorDriver(TypedDict):
    available: bool
    why: str | None
    version: int | None
    version_text: str
    devices: list[dict[str, Any]]  # record/cudadrv.py Driver.devices: ordinal, name, total ...
    integrated: str | None  # integrated, mixed, discrete


class DoctorNvml(TypedDict):
    available: bool
    why: str | None
    driver: str | None
    devices: int
    memory: list[dict[str, Any]]  # nvml.py Nvml.memory()
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
