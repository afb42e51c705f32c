"""`cudatrace demo`: the KV-pool sizing defect, traced, reported, diffed, bounded and swept
(the engine: cudatrace/demo/)."""

from __future__ import annotations

from pathlib import Path

import click

from .params import OutputPath


@click.command("demo")
@click.option(
    "--simulated",
    "mode",
    flag_value="simulated",
    help="Run on the simulated CUDA driver even if there is a GPU.",
)
@click.option("--gpu", "mode", flag_value="gpu", help="Run on the GPU (an error if there is none).")
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=OutputPath(),
    help="Folder for the build and the traces (kept). Default: a temporary folder, "
    "removed at the end unless --keep.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary folder with the traces.")
def demo(mode: str | None, out_dir: Path | None, keep: bool) -> int:
    """Replay the KV-pool sizing defect cudatrace was built for: trace, report, diff, budget,
    sweep.

    Builds the example server (examples/kv-pool) and traces it with --kv-cache-memory 1GiB
    (28 layers x 1 GiB), --num-blocks 64 and the 256-block fallback; reports the first run,
    diffs it against the second, stops the oversized pool with --budget 12GiB, and sweeps
    --kv-cache-memory over three values to give the law of the KV cache (28 bytes per byte of
    the flag, flagged by --expect 1). Without a GPU it runs on cudatrace's simulated driver (a
    122 GiB Jetson-like device), and every line says [simulated].
    """
    from ..demo import run_demo

    return run_demo(mode, out_dir, keep)
