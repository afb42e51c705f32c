"""Property-based fuzzing of the trace reader (issue 11): run as a subprocess by
tests/integration/test_fuzz_reader.py, under RLIMIT_AS, so a reader that grows without bound
fails the test instead of exhausting the machine.

    python -m support.fuzz_reader EXAMPLES LIMIT_BYTES TRACE...     (LIMIT_BYTES 0: none)

Each example takes one real trace, overwrites a few aligned 1-, 4- or 8-byte fields with values
that break lengths, ids and counts, optionally truncates it, and reads the directory (read_dir),
replays it (model.build) and walks every event's stack. Properties: no exception but TraceError
(which must name the file), memory traced by Python within a bound proportional to the file,
no example slower than a few seconds.
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NASTY = [
    0,
    1,
    7,
    8,
    255,
    0xFFFF,
    0x7FFFFFFF,
    0xFFFFFFFF,
    0x80000000,
    1 << 32,
    (1 << 63) - 1,
    (1 << 64) - 1,
]


def main() -> int:
    examples, limit = int(sys.argv[1]), int(sys.argv[2])
    sources = [Path(p).read_bytes() for p in sys.argv[3:]]
    if limit:  # 0: no bound (a sanitizer's shadow memory needs the address space)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    from cudatrace.analyze.read.rundir import read_dir
    from cudatrace.analyze.read.trace import TraceError
    from cudatrace.analyze.replay.model import build

    work = Path(tempfile.mkdtemp(prefix="ctfuzz-"))
    slowest = [0.0]

    mutation = st.tuples(
        st.integers(0, 1 << 30),
        st.sampled_from([1, 4, 8]),
        st.one_of(st.sampled_from(NASTY), st.integers(0, (1 << 64) - 1)),
    )

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        src=st.integers(0, len(sources) - 1),
        muts=st.lists(mutation, max_size=12),
        cut=st.one_of(st.none(), st.floats(0, 1)),
        in_records=st.booleans(),
    )
    def check(
        src: int, muts: list[tuple[int, int, int]], cut: float | None, in_records: bool
    ) -> None:
        data = bytearray(sources[src])
        # most records sit in the first KiBs (preamble, stacks): aim there half the time
        span = min(len(data), 16384) if in_records else len(data)
        for off, width, val in muts:
            off = (off % max(1, span - width)) // width * width
            data[off : off + width] = (val & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
        if cut is not None:
            data = data[: int(len(data) * cut)]
        d = work / "run"
        d.mkdir(exist_ok=True)
        f = d / "100.0.ctrace"
        f.write_bytes(bytes(data))
        tracemalloc.start()
        t0 = time.monotonic()
        try:
            td = read_dir(d)
            for e in td.errors:
                assert "100.0.ctrace" in e, e
            if td.traces:
                build(td)
                for t in td.traces:
                    for ev in t.events[:2000]:
                        t.stack(ev[8])
        except TraceError as e:
            assert "100.0.ctrace" in str(e) or "holds no trace" in str(e), e
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        dt = time.monotonic() - t0
        slowest[0] = max(slowest[0], dt)
        # the events array and per-record lists: a small multiple of the file, never more
        assert peak <= 64 * len(data) + (8 << 20), (peak, len(data))

    check()
    print("ok: %d examples, slowest %.2f s" % (examples, slowest[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
