"""The services' certificates (cudatrace/deploy/tls.py): lifetimes (CA 5 years, a server
certificate 1 year), kept while they serve, renewed with the kept CA (the caBundle unchanged),
a new CA kept beside the old in the bundle, what is read of a certificate without openssl
matching what openssl reads, and a served pair read again when its files change."""

from __future__ import annotations

import datetime as dt
import shutil
import ssl
import subprocess

import pytest

from cudatrace.deploy import tls
from cudatrace.deploy.tls import ServingCert, cert_info, make_tls, pem_certs

NAMES = ["cudatrace-webhook", "cudatrace-webhook.cudatrace.svc"]


@pytest.fixture(scope="module", autouse=True)
def openssl():
    if not shutil.which("openssl"):
        pytest.fail("openssl is needed (apt-get install openssl)")


def openssl_text(*args) -> str:
    return subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True).stdout


def verifies(d, name="tls") -> bool:
    r = subprocess.run(["openssl", "verify", "-CAfile", d / "ca.crt", d / f"{name}.crt"],
                       capture_output=True, text=True)  # fmt: skip
    return r.returncode == 0


def test_lifetimes_and_what_is_read_of_a_certificate(tmp_path):
    f = make_tls(tmp_path, NAMES, ("127.0.0.1",))
    assert sorted(f) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert (f["ca.key"].stat().st_mode & 0o777) == 0o600 == (f["tls.key"].stat().st_mode & 0o777)
    info = cert_info(f["tls.crt"].read_text())
    assert info.names == {*NAMES, "127.0.0.1"}
    assert 364 < info.days_left() <= 365
    end = openssl_text("x509", "-in", f["tls.crt"], "-noout", "-enddate").strip()
    assert (
        dt.datetime.strptime(end, "notAfter=%b %d %H:%M:%S %Y GMT").replace(tzinfo=dt.timezone.utc)
        == info.not_after
    )
    assert 5 * 365 <= cert_info(f["ca.crt"].read_text()).days_left() <= 5 * 366
    assert verifies(tmp_path)
    with pytest.raises(tls.TlsError, match="not a certificate"):
        cert_info("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")


def test_kept_renewed_and_rotated(tmp_path):
    f = make_tls(tmp_path, NAMES)
    crt, ca = f["tls.crt"].read_text(), f["ca.crt"].read_text()
    assert make_tls(tmp_path, NAMES)["tls.crt"].read_text() == crt  # kept while it serves
    # renewed with the kept CA: the bundle (the webhook configuration's caBundle) is the same
    make_tls(tmp_path, NAMES, renew=True)
    assert f["tls.crt"].read_text() != crt and f["ca.crt"].read_text() == ca
    assert verifies(tmp_path)
    # names asked that the certificate does not have (another namespace): a new one
    make_tls(tmp_path, ["cudatrace-webhook.other.svc"])
    assert cert_info(f["tls.crt"].read_text()).names == {"cudatrace-webhook.other.svc"}
    # a new CA: the old stays in the bundle, so a server still on the old certificate is trusted
    old_serving = f["tls.crt"].read_text()
    make_tls(tmp_path, NAMES, new_ca=True)
    bundle = pem_certs(f["ca.crt"].read_text())
    assert len(bundle) == 2 and bundle[1].strip() == ca.strip()
    assert verifies(tmp_path)
    (tmp_path / "old.crt").write_text(old_serving)
    assert verifies(tmp_path, "old")
    # the node agent's certificate beside the webhook's, signed by the same CA
    m = make_tls(tmp_path, ["cudatrace-node.cudatrace.svc"], name="metrics")
    assert {"metrics.crt", "metrics.key"} <= set(m) and verifies(tmp_path, "metrics")
    assert f["ca.crt"].read_text() == m["ca.crt"].read_text()


def test_a_certificate_near_its_end_is_renewed(tmp_path, monkeypatch):
    f = make_tls(tmp_path, NAMES)
    crt = f["tls.crt"].read_text()
    monkeypatch.setattr(tls, "RENEW_DAYS", 400)  # as if it had fewer days left than that
    monkeypatch.setattr(tls, "CA_DAYS", 4000)
    make_tls(tmp_path, NAMES)
    assert f["tls.crt"].read_text() != crt and verifies(tmp_path)


def test_material_of_an_older_version_is_kept_then_rotated(tmp_path, monkeypatch):
    f = make_tls(tmp_path, NAMES)
    f["ca.key"].unlink()  # older versions threw the CA's key away
    crt, ca = f["tls.crt"].read_text(), f["ca.crt"].read_text()
    assert make_tls(tmp_path, NAMES)["tls.crt"].read_text() == crt
    make_tls(tmp_path, NAMES, renew=True)  # no key to sign with: a new CA, the old one kept
    bundle = pem_certs(f["ca.crt"].read_text())
    assert len(bundle) == 2 and bundle[1].strip() == ca.strip() and f["ca.key"].is_file()
    assert verifies(tmp_path)


def test_a_served_pair_is_read_again_when_its_files_change(tmp_path, monkeypatch):
    monkeypatch.setattr(tls, "RELOAD_EVERY", 0.0)
    f = make_tls(tmp_path, NAMES)
    said: list[str] = []
    served = ServingCert(f["tls.crt"], f["tls.key"], said.append)
    first = served.context()
    assert served.context() is first and said == []
    # a rotation caught half-way: the new certificate, the old key
    key = f["tls.key"].read_text()
    make_tls(tmp_path, NAMES, renew=True)
    f["tls.key"].write_text(key)
    assert served.context() is first
    assert "still serving the certificate loaded before" in said[-1]
    make_tls(tmp_path, NAMES, renew=True)
    now = served.context()
    assert now is not first and isinstance(now, ssl.SSLContext)
    assert "anew: valid until" in said[-1]
    with pytest.raises(tls.TlsError, match="cannot serve"):
        ServingCert(tmp_path / "missing.crt", f["tls.key"], said.append)


def test_an_expiring_certificate_is_said(tmp_path, monkeypatch):
    f = make_tls(tmp_path, NAMES)
    monkeypatch.setattr(tls, "RENEW_DAYS", 400)
    said: list[str] = []
    ServingCert(f["tls.crt"], f["tls.key"], said.append)
    assert len(said) == 1 and "expires in 36" in said[0] and "renew it" in said[0]
