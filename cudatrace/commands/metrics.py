"""`cudatrace metrics`: budgets and traced runs served to Prometheus (docs/metrics.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import CudatraceError, OptionError
from ..stopping import stop_on_signals
from .options import listen_option, seconds_option, traces_option
from .params import ledger_dir_option

if TYPE_CHECKING:
    from ..present.metrics import Gpus

DEFAULT_LISTEN = "127.0.0.1:9478"


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionError(f"--listen {text!r}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host, int(port)


@click.command()
@listen_option(
    DEFAULT_LISTEN, "Where to serve /metrics (loopback by default: budgets name pids and commands)."
)
@ledger_dir_option
@traces_option(
    "Also export the runs being traced in DIR (a trace directory, or a folder of them); repeatable."
)
@click.option(
    "--top", default=10, show_default=True, type=click.IntRange(1, 100), help="Sites per run."
)
@seconds_option(
    "--trace-interval",
    10.0,
    "Read a run's traces again at most this often (and analyze them only when "
    "something was written since); a scrape waits for fresh figures 1 s at most.",
)
def metrics(listen: str, traces: tuple[Path, ...], top: int, trace_interval: float) -> int:
    """Serve budgets (every group's ledger) and, with --traces, the live sites of traced runs
    to Prometheus (docs/metrics.md). Needs the `metrics` extra (prometheus_client)."""
    host, port = parse_listen(listen)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise CudatraceError(
            "metrics needs the Prometheus client: pip install 'cudatrace[metrics]'"
        ) from None
    from ..present.metrics import Collector, TraceCache, serve
    from ..record.fence import status_with_unfenced

    cache = TraceCache(traces, top, trace_interval) if traces else None
    if cache is not None:
        cache.start()
    try:
        with stop_on_signals():
            serve(
                host,
                port,
                Collector(status_with_unfenced, cache, _gpus()),
                lambda url: click.echo(f"cudatrace: serving metrics on {url}", err=True),
            )
    except OSError as e:
        raise CudatraceError(f"cannot listen on {listen}: {e.strerror or e}") from None
    except KeyboardInterrupt:
        pass
    return 0


def _gpus() -> Gpus:
    """The gpu/UUID labels of devices: NVML's UUIDs (none without NVML), through this
    process's CUDA_VISIBLE_DEVICES."""
    import os

    from ..nvml import Nvml
    from ..present.metrics import Gpus

    nv = Nvml()
    try:
        uuids = nv.uuids() if nv.available else {}
    finally:
        if nv.available:
            nv.shutdown()
    return Gpus(uuids, os.environ.get("CUDA_VISIBLE_DEVICES"))
