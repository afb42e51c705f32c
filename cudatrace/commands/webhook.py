"""`cudatrace webhook`: the mutating admission webhook that fences pods annotated
cudatrace.dev/budget (docs/kubernetes.md)."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import CudatraceError
from ..stopping import stop_on_signals


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
    "--listen",
    metavar="HOST:PORT",
    default="0.0.0.0:8443",
    show_default=True,
    help="Where to serve HTTPS (the Service in front of it targets this port).",
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
@click.option(
    "--on-exceed",
    type=click.Choice(["fail", "warn", "abort"]),
    default="fail",
    show_default=True,
    help="Over budget, unless the pod's cudatrace.dev/on-exceed says otherwise.",
)
@click.option(
    "--preload",
    type=click.Choice(["file", "env"]),
    default="file",
    show_default=True,
    help="file: /etc/ld.so.preload; env: LD_PRELOAD (sandboxed runtimes), after the "
    "container's own.",
)
def webhook(
    cert: Path,
    key: Path,
    listen: str,
    root: str,
    shim_id: str | None,
    gpu_resources: tuple[str, ...],
    on_exceed: str,
    preload: str,
) -> int:
    """Serve the mutating admission webhook over HTTPS: POST /mutate takes an AdmissionReview
    (admission.k8s.io/v1) and answers with a JSONPatch that fences the GPU containers of pods
    annotated cudatrace.dev/budget: SIZE; GET /healthz."""
    from ..deploy.install import shim_ident
    from ..deploy.webhook import GPU_RESOURCES, WebhookConfig, make_server
    from .metrics import parse_listen

    host, port = parse_listen(listen)
    cfg = WebhookConfig(
        root=root,
        ident=shim_id or shim_ident(),
        gpu_resources=tuple(gpu_resources) or GPU_RESOURCES,
        on_exceed=on_exceed,
        preload=preload,
    )
    say = lambda line: click.echo(f"cudatrace webhook: {line}", err=True)
    try:
        httpd = make_server(host, port, str(cert), str(key), cfg, say)
    except OSError as e:
        raise CudatraceError(f"cannot serve on {listen}: {e.strerror or e}") from None
    say(f"serving https://{listen}/mutate; pods mount {cfg.shim_dir}")
    try:
        with stop_on_signals():
            httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0
