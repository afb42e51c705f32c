"""The first stage: a trace directory read (its trace files through the C scanner, their sealed
chunks put back, --aggregate snapshots, run.json, the samples' lines). Imports no later stage."""
