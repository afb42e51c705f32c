"""The rendered manifests as golden files (tests/golden/manifests/): the Kubernetes streams of
`cudatrace manifests kubernetes` (the webhook route with the agents' authorized metrics; the DRA
route with plain metrics) and the systemd unit of `manifests systemd`, byte for byte, so that
every change to RBAC, mounts, probes or security context is a YAML diff in review. The TLS
material (made afresh each run) reads `<base64 of FILE>`. After an intended change:

    pytest tests/unit/test_manifest_goldens.py --update-goldens   # then review the diff
"""

from __future__ import annotations

import base64
import json
import shutil

import pytest

from support import goldens
from support.cli import checkout_env, cudatrace
from support.kube import DRA_VERSION, K8S_VERSION, validate

THIS = "tests/unit/test_manifest_goldens.py"
IMAGE = "registry.example/cudatrace:1"
CASES = {
    "manifests/kubernetes.yaml": ("kubernetes", "--image", IMAGE, "--tls-dir", "{tls}",
                                  "--groups", "{groups}", "--budget", "8GiB",
                                  "--scraper-namespace", "monitoring"),
    "manifests/kubernetes-dra.yaml": ("kubernetes", "--image", IMAGE, "--dra", "--no-webhook",
                                      "--metrics-auth", "none", "--kubelet-dir",
                                      "/var/lib/k0s/kubelet"),
    "manifests/systemd.service": ("systemd", "--budget", "8GiB", "--cdi-dir", "/etc/cdi",
                                  "--exe", "/usr/local/bin/cudatrace"),
}  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.fail("openssl is needed (apt-get install openssl)")
    base = tmp_path_factory.mktemp("manifests")
    groups = base / "groups.conf"
    groups.write_text("[team-a]\nbudget = 40GiB\n")
    return {"tls": base / "tls", "groups": groups}


def render(inputs, args) -> str:
    r = cudatrace(checkout_env(), "manifests", *(a.format(**inputs) for a in args))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    tls = inputs["tls"]
    if tls.is_dir():
        for f in sorted(tls.iterdir()):
            out = out.replace(base64.b64encode(f.read_bytes()).decode(), f"<base64 of {f.name}>")
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_manifests_match_golden(inputs, name, request):
    got = render(inputs, CASES[name])
    if name.endswith(".yaml"):
        for part in got.split("---\n")[1:]:
            doc = json.loads(part)
            validate(doc, K8S_VERSION)
            validate(doc, DRA_VERSION)
    goldens.compare(name, got, goldens.updating(request.config), THIS)


def test_manifest_goldens_are_all_checked():
    on_disk = {f"manifests/{p.name}" for p in (goldens.GOLDEN / "manifests").iterdir()}
    assert on_disk == set(CASES)


def test_a_manifest_change_without_a_golden_update_fails(inputs, tmp_path, monkeypatch):
    """What a reviewer is shown: the YAML diff of the change, and how to accept it."""
    got = render(inputs, CASES["manifests/kubernetes.yaml"])
    monkeypatch.setattr(goldens, "GOLDEN", tmp_path)
    goldens.compare("manifests/kubernetes.yaml", got, update=True)
    changed = got.replace('"privileged": true', '"privileged": false', 1)
    with pytest.raises(AssertionError, match=r'(?s)-\s+"privileged": true.*\+\s+"privileged": '
                       r"false.*test_manifest_goldens.py --update-goldens"):  # fmt: skip
        goldens.compare("manifests/kubernetes.yaml", changed, update=False, test=THIS)
