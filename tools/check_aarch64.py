"""Check the shim on aarch64 (the Jetson's architecture) without an aarch64 machine.

Runs tests/integration/test_aarch64.py: the preload library (tools/cross-build-shim), the simulated driver
and the test programs cross-built with aarch64-linux-gnu-gcc, run under qemu-aarch64 with the
shim preloaded, every route, fork+exec, threads, a budget, symbolized stacks and the stack
cache checked against full unwinds (docs/aarch64.md). CI runs the same tests.

    apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user      # once
    python3 tools/check_aarch64.py [pytest options]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    return subprocess.call(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            str(REPO / "tests" / "integration" / "test_aarch64.py"),
            *sys.argv[1:],
        ],
        cwd=REPO,
    )


if __name__ == "__main__":
    sys.exit(main())
