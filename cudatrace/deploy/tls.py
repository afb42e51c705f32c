"""TLS material for the admission webhook: a CA of its own and a server certificate for the
webhook's Service name, made with the `openssl` command (the standard library cannot sign).

    ca.crt    the CA (its base64 is the webhook configuration's caBundle)
    tls.crt   the server certificate, for the DNS names and IP addresses given
    tls.key   its key (0600)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import CudatraceError

DAYS = 3650


class TlsError(CudatraceError):
    """The TLS material cannot be made; the message says why."""


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise TlsError(
            "openssl is needed to make the webhook's certificates (apt-get install openssl)"
        )
    r = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise TlsError(f"openssl {args[0]} failed: {r.stderr.strip()[-400:]}")


def make_tls(out: Path, dns: list[str], ips: tuple[str, ...] = ()) -> dict[str, Path]:
    """Make ca.crt, tls.crt and tls.key in out (kept when all three are there already)."""
    out = Path(out)
    files = {n: out / n for n in ("ca.crt", "tls.crt", "tls.key")}
    if all(p.is_file() for p in files.values()):
        return files
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    san = ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips])
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        t = Path(tmp)
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                 "-out", "ca.crt", "-days", str(DAYS), "-subj", "/CN=cudatrace-webhook-ca",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=t)  # fmt: skip
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
                 "-subj", f"/CN={dns[0] if dns else ips[0]}", cwd=t)  # fmt: skip
        (t / "ext.cnf").write_text(
            f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        )
        _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", "tls.crt", "-days", str(DAYS),
                 "-extfile", "ext.cnf", cwd=t)  # fmt: skip
        os.chmod(t / "tls.key", 0o600)
        for name, dest in files.items():
            os.replace(t / name, dest)
    return files
