"""TLS material for the admission webhook and the node agent's metrics: a CA of their own and
server certificates signed by it, made with the `openssl` command (the standard library cannot
sign); what the servers serve, read again when the files change (docs/kubernetes.md,
"Certificates and their rotation").

    ca.crt       the CA bundle the clients trust (the webhook configuration's caBundle): the
                 current CA first, then earlier ones while they are valid, so that a server
                 still serving a certificate of the previous CA is trusted during a rotation
    ca.key       the current CA's key (0600): kept to renew the server certificates
    tls.crt      the webhook's certificate, for the DNS names and IP addresses given
    tls.key      its key (0600)
    metrics.crt, metrics.key   the node agent's metrics certificate (make_tls(..., name="metrics"))

Lifetimes: the CA 5 years, a server certificate 1 year. make_tls keeps what is there while the
certificate has more than RENEW_DAYS left and names what it is asked to; else it signs a new
one with the kept CA (the caBundle is unchanged: nothing to roll out but the Secret). A CA with
less than a certificate's lifetime left, or without its key (material of an older version), is
replaced by a new one, the old one staying in the bundle until it expires.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import CudatraceError

CA_DAYS = 1826
CERT_DAYS = 365
RENEW_DAYS = 30  # a certificate with fewer days left is renewed (and the servers warn)
KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")  # fast to make and to serve
RELOAD_EVERY = 1.0  # seconds between two looks at the served files
_BEGIN, _END = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
_SAN_OID = bytes.fromhex("551d11")  # 2.5.29.17, subjectAltName


class TlsError(CudatraceError):
    """The TLS material cannot be made or read; the message says why."""


# ---- reading certificates (DER, without openssl) ---------------------------------------------


def _tlv(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the DER element at `at`."""
    if at + 2 > len(der):
        raise TlsError("a certificate ends early")
    tag, n = der[at], der[at + 1]
    at += 2
    if n & 0x80:
        k = n & 0x7F
        if not 0 < k <= 4 or at + k > len(der):
            raise TlsError("a certificate has a length it cannot have")
        n = int.from_bytes(der[at : at + k], "big")
        at += k
    if at + n > len(der):
        raise TlsError("a certificate ends early")
    return tag, at, at + n


def _children(der: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    while start < end:
        t = _tlv(der, start)
        out.append(t)
        start = t[2]
    return out


def _time(der: bytes, tag: int, start: int, end: int) -> _dt.datetime:
    text = der[start:end].decode("ascii")
    fmt = "%y%m%d%H%M%SZ" if tag == 0x17 else "%Y%m%d%H%M%SZ"  # UTCTime, GeneralizedTime
    return _dt.datetime.strptime(text, fmt).replace(tzinfo=_dt.timezone.utc)


@dataclass(frozen=True)
class CertInfo:
    """What the servers and make_tls read of a certificate."""

    not_after: _dt.datetime
    names: frozenset[str]  # its subjectAltName: DNS names and IP addresses

    def days_left(self, now: _dt.datetime | None = None) -> float:
        now = now or _dt.datetime.now(_dt.timezone.utc)
        return (self.not_after - now).total_seconds() / 86400


def cert_info(pem: str) -> CertInfo:
    """The first certificate of a PEM text. Raises TlsError."""
    try:
        der = ssl.PEM_cert_to_DER_cert(pem[pem.index(_BEGIN) : pem.index(_END) + len(_END)])
        _, s, e = _tlv(der, 0)
        _, ts, te = _children(der, s, e)[0]  # tbsCertificate
        fields = _children(der, ts, te)
        if fields[0][0] == 0xA0:  # [0] version
            fields = fields[1:]
        _, vs, ve = fields[3]  # serial, signature, issuer, validity
        (_, _, _), after = _children(der, vs, ve)
        not_after = _time(der, *after)
        names: set[str] = set()
        for tag, xs, _ in fields[6:]:
            if tag == 0xA3:  # [3] extensions
                names |= _san(der, *_tlv(der, xs)[1:])
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise TlsError(f"not a certificate: {e}") from None
    return CertInfo(not_after, frozenset(names))


def _san(der: bytes, start: int, end: int) -> set[str]:
    names: set[str] = set()
    for _, es, ee in _children(der, start, end):
        parts = _children(der, es, ee)
        if der[parts[0][1] : parts[0][2]] != _SAN_OID:
            continue
        _, os_, oe = parts[-1]  # extnValue: an OCTET STRING of GeneralNames
        _, gs, ge = _tlv(der, os_)
        for tag, ns, ne in _children(der, gs, ge):
            if tag == 0x82:
                names.add(der[ns:ne].decode("ascii"))
            elif tag == 0x87:
                names.add(str(ipaddress.ip_address(der[ns:ne])))
    return names


def pem_certs(text: str) -> list[str]:
    """The certificates of a PEM bundle, each a PEM text."""
    out = []
    for part in text.split(_BEGIN)[1:]:
        if _END in part:
            out.append(_BEGIN + part.split(_END, 1)[0] + _END + "\n")
    return out


# ---- making them ------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise TlsError("openssl is needed to make the certificates (apt-get install openssl)")
    r = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise TlsError(f"openssl {args[0]} failed: {r.stderr.strip()[-400:]}")


def _new_ca(t: Path) -> None:
    _openssl("req", "-x509", *KEY, "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", str(CA_DAYS), "-subj", f"/CN=cudatrace-ca-{int(time.time())}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=t)  # fmt: skip


def _sign(t: Path, name: str, dns: list[str], ips: tuple[str, ...]) -> None:
    """t/NAME.crt and t/NAME.key, signed by t/ca.pem and t/ca.key."""
    san = ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips])
    _openssl("req", *KEY, "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={dns[0] if dns else ips[0]}", cwd=t)  # fmt: skip
    (t / "ext.cnf").write_text(
        f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", str(CERT_DAYS),
             "-extfile", "ext.cnf", cwd=t)  # fmt: skip
    os.chmod(t / f"{name}.key", 0o600)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _usable_ca(out: Path, new_ca: bool) -> str:
    """The current CA's certificate when it can sign a certificate that lives its whole
    lifetime; '' when a new CA is needed."""
    certs = pem_certs(_read(out / "ca.crt"))
    if new_ca or not certs or not (out / "ca.key").is_file():
        return ""
    try:
        ok = cert_info(certs[0]).days_left() > CERT_DAYS + RENEW_DAYS
    except TlsError:
        return ""
    return certs[0] if ok else ""


def _keep_cert(out: Path, name: str, want: frozenset[str], ca: str) -> bool:
    try:
        info = cert_info(_read(out / f"{name}.crt"))
    except TlsError:
        return False
    return (
        bool(ca)
        and (out / f"{name}.key").is_file()
        and info.names == want
        and (info.days_left() > RENEW_DAYS)
    )


def make_tls(
    out: Path,
    dns: list[str],
    ips: tuple[str, ...] = (),
    name: str = "tls",
    renew: bool = False,
    new_ca: bool = False,
) -> dict[str, Path]:
    """ca.crt (the bundle), ca.key, NAME.crt and NAME.key in out: kept while they serve (see
    the module's docstring), else made. renew: a new NAME certificate now; new_ca: a new CA
    too (the old one stays in the bundle until it expires)."""
    out = Path(out)
    files = {n: out / n for n in ("ca.crt", "ca.key", f"{name}.crt", f"{name}.key")}
    want = frozenset(dns) | frozenset(str(ipaddress.ip_address(i)) for i in ips)
    legacy = not (out / "ca.key").exists() and all(
        files[n].is_file() for n in ("ca.crt", f"{name}.crt", f"{name}.key")
    )
    ca = _usable_ca(out, new_ca)
    kept = _keep_cert(out, name, want, ca) or _keep_legacy(out, name, want, legacy)
    if kept and not renew and not new_ca:
        return {n: p for n, p in files.items() if p.exists()}
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        t = Path(tmp)
        if ca:
            (t / "ca.pem").write_text(ca)
            shutil.copyfile(out / "ca.key", t / "ca.key")
        else:
            _new_ca(t)
        _sign(t, name, dns, ips)
        (t / "ca.crt").write_text(_bundle((t / "ca.pem").read_text(), _read(out / "ca.crt")))
        os.chmod(t / "ca.key", 0o600)
        for n, dest in files.items():
            os.replace(t / n, dest)
    return files


def _keep_legacy(out: Path, name: str, want: frozenset[str], legacy: bool) -> bool:
    """Material of an older version (no ca.key): kept while its certificate serves."""
    if not legacy:
        return False
    try:
        info = cert_info(_read(out / f"{name}.crt"))
    except TlsError:
        return False
    return info.names == want and info.days_left() > RENEW_DAYS


def _bundle(current: str, before: str) -> str:
    """The current CA, then the earlier ones of `before` that are still valid."""
    now = _dt.datetime.now(_dt.timezone.utc)
    keep = [current]
    for c in pem_certs(before):
        try:
            if cert_info(c).not_after > now and c.strip() != current.strip():
                keep.append(c)
        except TlsError:
            continue
    return "".join(c if c.endswith("\n") else c + "\n" for c in keep)


# ---- serving them -------------------------------------------------------------------------------


class ServingCert:
    """A certificate and key a server serves, read again when either file changes (a Secret
    volume's files are swapped by the kubelet when the Secret is updated): the new pair is
    served from the next handshake on. A pair that cannot be loaded (the two files of a
    rotation caught between their updates) leaves the old one served, and is said."""

    def __init__(self, cert: Path, key: Path, log: Callable[[str], None]):
        self.cert, self.key, self.log = Path(cert), Path(key), log
        self._stamp: tuple[object, ...] = ()
        self._looked = 0.0
        self._warned = 0.0
        self._ctx = self._load(first=True)  # raises TlsError: no server starts without one
        self._stamp = self._files_stamp()

    def _files_stamp(self) -> tuple[object, ...]:
        out: list[object] = []
        for p in (self.cert, self.key):
            try:
                st = os.stat(p)
                out += [st.st_ino, st.st_mtime_ns, st.st_size]
            except OSError as e:
                out.append(e.errno)
        return tuple(out)

    def _load(self, first: bool = False) -> ssl.SSLContext:
        """The context of the files now; the first load's validity is the caller's to say."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(str(self.cert), str(self.key))
            info = cert_info(self.cert.read_text())
        except (OSError, ssl.SSLError, TlsError) as e:
            raise TlsError(f"cannot serve {self.cert} with {self.key}: {e}") from None
        self.info = info
        if not first:
            self.log(f"serving {self.cert} anew: {self.validity()}")
        self._warned = 0.0
        self._warn(info)
        return ctx

    def _warn(self, info: CertInfo) -> None:
        """Said at a load and once a day while the certificate has less than RENEW_DAYS."""
        left = info.days_left()
        now = time.monotonic()
        if left >= RENEW_DAYS or (self._warned and now - self._warned < 86400):
            return
        self._warned = now
        what = "has expired" if left <= 0 else f"expires in {left:.0f} days"
        self.log(f"the certificate {self.cert} {what}: renew it (docs/kubernetes.md)")

    def validity(self) -> str:
        return f"valid until {self.info.not_after:%Y-%m-%d %H:%M} UTC"

    def context(self) -> ssl.SSLContext:
        """The context to serve now (looking at the files at most once a second)."""
        now = time.monotonic()
        if now - self._looked < RELOAD_EVERY:
            return self._ctx
        self._looked = now
        stamp = self._files_stamp()
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._ctx = self._load()
            except TlsError as e:
                self.log(f"{e}; still serving the certificate loaded before")
        else:
            self._warn(self.info)
        return self._ctx
