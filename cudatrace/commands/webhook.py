"""`cudatrace webhook`: the mutating admission webhook that fences pods annotated
cudatrace.dev/budget (docs/kubernetes.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import click

from ..errors import CudatraceError
from ..stopping import stop_on_signals
from .options import (
    choice_option,
    listen_option,
    on_exceed_option,
    option_group,
    seconds_option,
)


class Serving(NamedTuple):
    """How the webhook holds under load, and what it answers a review it cannot read."""

    listen: str = "0.0.0.0:8443"
    on_error: str = "refuse"
    max_connections: int = 512
    timeout: float = 10.0

    @classmethod
    def options(cls) -> list[Any]:
        return [
            listen_option(
                "0.0.0.0:8443",
                "Where to serve HTTPS (the Service in front of it targets this port).",
            ),
            choice_option(
                "--on-error",
                ["refuse", "allow"],
                "A review that cannot be read or fenced (a malformed pod, an error of the "
                "webhook): refuse the pod with the reason, or allow it unfenced with a warning "
                "that says why (fail-open; pair it with failurePolicy: Ignore).",
            ),
            click.option(
                "--max-connections",
                type=click.IntRange(8, 65536),
                default=512,
                show_default=True,
                metavar="N",
                help="Connections held at once; at the bound, the one waiting longest without "
                "a whole request is closed.",
            ),
            seconds_option(
                "--timeout",
                10.0,
                "The most a connection may take to finish its TLS handshake, a request to "
                "arrive whole once begun, and an answer to be read.",
                0.1,
                300,
            ),
        ]


@click.command()
@click.option(
    "--cert",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The server certificate (PEM; its CA is the webhook configuration's caBundle).",
)
@click.option(
    "--key",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Its private key (PEM).",
)
@click.option(
    "--root",
    metavar="DIR",
    default="/var/lib/cudatrace",
    show_default=True,
    help="Where `cudatrace node` installs the preload library on the nodes (its --root).",
)
@click.option(
    "--shim-id",
    metavar="ID",
    help="The install the pods mount (default: this package's build, which `cudatrace node` "
    "of the same image installs).",
)
@click.option(
    "--gpu-resource",
    "gpu_resources",
    metavar="NAME",
    multiple=True,
    help="A resource that makes a container a GPU container (repeatable; NAME* a prefix). "
    "Default: nvidia.com/gpu, nvidia.com/mig-*; a container with a DRA claim always is.",
)
@on_exceed_option("Over budget, unless the pod's cudatrace.dev/on-exceed says otherwise.")
@choice_option(
    "--preload",
    ["file", "env"],
    "file: /etc/ld.so.preload; env: LD_PRELOAD (sandboxed runtimes), after the container's own.",
)
@option_group("serving", Serving, Serving.options())
def webhook(
    cert: Path,
    key: Path,
    root: str,
    shim_id: str | None,
    gpu_resources: tuple[str, ...],
    on_exceed: str,
    preload: str,
    serving: Serving,
) -> int:
    """Serve the mutating admission webhook over HTTPS: POST /mutate takes an AdmissionReview
    (admission.k8s.io/v1) and answers with a JSONPatch that fences the GPU containers of pods
    annotated cudatrace.dev/budget: SIZE; GET /healthz."""
    from ..deploy import admission
    from ..deploy.httpserver import Limits, Server
    from ..deploy.install import shim_ident
    from ..deploy.tls import ServingCert
    from ..deploy.webhook import GPU_RESOURCES, WebhookConfig
    from .metrics import parse_listen

    listen = serving.listen
    host, port = parse_listen(listen)
    cfg = WebhookConfig(
        root=root,
        ident=shim_id or shim_ident(),
        gpu_resources=tuple(gpu_resources) or GPU_RESOURCES,
        on_exceed=on_exceed,
        preload=preload,
    )
    say: Callable[[str], None] = lambda line: click.echo(f"cudatrace webhook: {line}", err=True)
    t = serving.timeout
    limits = Limits(serving.max_connections, handshake=t, request=t, idle=max(60.0, t), write=t)
    cert_files = ServingCert(cert, key, say)
    server = Server(
        host,
        port,
        admission.routes(cfg, serving.on_error, say),
        limits,
        tls=cert_files,
        log=say,
        error=lambda code, why: admission.status_response(code, f"cudatrace: {why}"),
        name="webhook",
    )
    try:
        server.start()
    except OSError as e:
        raise CudatraceError(f"cannot serve on {listen}: {e.strerror or e}") from None
    say(
        f"serving https://{listen}/mutate ({cert.name} {cert_files.validity()}; on error: "
        f"{serving.on_error}); pods mount {cfg.shim_dir}"
    )
    try:
        with stop_on_signals():
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
