"""Where the sources the tests build live: the one place that names those folders."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
SHIM = REPO / "native" / "include"  # the layout headers (trace_format.h, ledger.h, ...)
SIM = REPO / "sim"  # the simulated libcuda / libnvml
PROGS = TESTS / "progs"  # the test programs run under the shim
LEDGER_C = TESTS / "ledger"  # the ledger's C test driver
# the ledger's C (ledger.c, ledger_open.c, ledger_parts.c, ledger_group.c) and procstat.c: what a
# test that links the ledger's own source compiles
LEDGER_SOURCES = sorted((REPO / "native" / "common").glob("*.c"))
EXAMPLES = REPO / "examples"
GPU_TOOLS = REPO / "tools" / "gpu"  # the GPU suite's programs and workloads
