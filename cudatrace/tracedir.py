"""The files of a trace directory besides the shim's traces (*.ctrace): one list for the
launcher that writes them and the reader that reads them (a leaf: imports nothing), and the
name of a new one.

Samples (record/sampler.py): a full run appends every sample to samples.jsonl; an --aggregate
run keeps its files bounded (recent samples, the run's thinned history, the samples at each
figure's extreme). The reader merges whichever are there, by time, each sample once.
The compressed copies of sealed chunks (`<trace>.ctrace.z`) are sidecar.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

RUN = "run.json"
DENIALS = "denials.jsonl"
SAMPLES = "samples.jsonl"
SAMPLES_PREV = "samples.prev.jsonl"
SAMPLES_HISTORY = "samples.history.jsonl"
SAMPLES_EXTREMES = "samples.extremes.jsonl"
SAMPLE_FILES = (SAMPLES_HISTORY, SAMPLES_EXTREMES, SAMPLES_PREV, SAMPLES)
# what the launcher read of the binaries for the shim's denial lines (record/hints.py)
HINTS = "hints.txt"
LAUNCHER_FILES = (RUN, DENIALS, HINTS, *SAMPLE_FILES)
# held (flock) by the launcher for the whole run: a second run into the directory is refused
LOCK = ".cudatrace.lock"


def fresh(cmd0: str, kind: str = "") -> Path:
    """A directory of the working directory that does not exist yet, named after the program
    and the time: cudatrace-[KIND-]PROGRAM-YYYYMMDD-HHMMSS[-N] (`run`'s and `sweep`'s default
    -o)."""
    base = "cudatrace-{}{}-{}".format(
        f"{kind}-" if kind else "", Path(cmd0).name or "run", time.strftime("%Y%m%d-%H%M%S")
    )
    p = Path.cwd() / base
    n = 1
    while p.exists():
        n += 1
        p = Path.cwd() / ("%s-%d" % (base, n))
    return p
