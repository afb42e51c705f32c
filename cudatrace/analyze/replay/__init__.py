"""The second stage: the traces replayed (what was live when, peaks, failures: the C replay),
and what the device observed beside them (the sampler's NVML and /proc figures). Imports only
read/."""
