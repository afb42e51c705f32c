"""The files of a trace directory besides the shim's traces (*.ctrace): one list for the
launcher that writes them and the reader that reads them (a leaf: imports nothing).

Samples (record/sampler.py): a full run appends every sample to samples.jsonl; an --aggregate
run keeps its files bounded (recent samples, the run's thinned history, the samples at each
figure's extreme). The reader merges whichever are there, by time, each sample once.
The compressed copies of sealed chunks (`<trace>.ctrace.z`) are sidecar.py's.
"""

from __future__ import annotations

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
