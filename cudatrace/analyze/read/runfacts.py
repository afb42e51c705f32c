"""What the launcher and the traces say of a run beside its allocations: how long it lasted
(`--at` names a moment within it), whether any process used the CUDA driver (and what to say
when none did), and the signal CMD died of as the launcher's wait saw it."""

from __future__ import annotations

from collections.abc import Sequence

from .trace import Trace, TraceDir


def run_seconds(td: TraceDir, ends_ns: list[int], start_ns: int) -> float:
    """How long the run lasted, from its start (start_ns): to the latest of ends_ns (its last
    event, each process's end: its exit record, or when the launcher saw it go), or to the
    launcher's own end when run.json says it ended later (its wall clock: one host's or
    another's alike)."""
    last = max(0.0, (max(ends_ns) - start_ns) / 1e9) if ends_ns else 0.0
    run = td.run
    t0, t1 = run.get("start_time"), run.get("end_time")
    if isinstance(t0, (int, float)) and isinstance(t1, (int, float)) and t1 >= t0:
        r = run.get("start_monotonic_ns")
        launched = (t1 - t0) - ((start_ns - r) / 1e9 if isinstance(r, int) and r > 0 else 0.0)
        return round(max(last, launched), 6)
    return round(last, 6)


def driver_used(traces: Sequence[Trace]) -> bool:
    """Whether a process of the run used the CUDA driver: a hooked call recorded (or an
    --aggregate snapshot), the driver's version read when its trace opened, or libcuda among
    the modules it mapped."""
    return any(
        t.n_events
        or t.snap_slots
        or t.info.get("driver_version")
        or any(m.path.rsplit("/", 1)[-1].startswith("libcuda.so") for m in t.modules)
        for t in traces
    )


def no_driver_sentence(found: str | None, simulated: bool, who: str, simulate: str) -> str:
    """What to say of a run (or a sweep) no process of which used the CUDA driver: found is
    where libcuda.so.1 is on this machine (None: nowhere), simulate how to run on cudatrace's
    simulated driver instead (`cudatrace run --simulated -- CMD`), said where there is none."""
    if simulated:
        return (
            f"{who} used the CUDA driver (cudatrace's simulated libcuda.so.1): the command never "
            "loaded it, or never asked it for memory"
        )
    if found is None:
        return (
            f"{who} used the CUDA driver: libcuda.so.1 is not on this machine (no NVIDIA "
            "driver), so nothing could load it. Without a GPU, run on cudatrace's simulated "
            f"driver: {simulate}"
        )
    return (
        f"{who} used the CUDA driver ({found}): the command never loaded it, or never asked it "
        "for memory"
    )


def launcher_saw_signal(td: TraceDir, t: Trace) -> int | None:
    """The signal that killed CMD (the launcher's own child), as the launcher's wait saw it,
    for CMD's last image when it left no exit record; None for any other process."""
    run = td.run
    rc, pid = run.get("returncode"), run.get("pid")
    if not isinstance(rc, int) or rc >= 0 or t.pid != pid or t.complete or t.stopped_ns:
        return None
    if len(td.dirs) > 1 and t.source != str(td.dirs[0]):
        return None  # run.json is the first directory's: its CMD is there
    if any(u.pid == pid and u.exec_index > t.exec_index for u in td.traces):
        return None  # an image that exec replaced: the signal came to a later one
    return -rc
