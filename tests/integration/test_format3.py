"""Traces of format version 3 (compact events written on the caller's thread) are still read.

tests/traces/format3/ holds two runs recorded by the shim and launcher of main at f0192cf (the
last format-3 shim; issue 42 moved to format 4), on the simulated driver:
    steps/    printf 'a 1m\\na 2m\\nn 500 4k\\nf\\na 3m\\nn 300 64k\\nq\\n' | cudatrace run
              --simulated -o steps -- steps        (tests/progs/steps.c)
    threads/  cudatrace run --simulated -o threads -- threads 2 300 4096
Their programs are gone (frames read by address only); what they allocated is not: today's
reader must find in them what today's shim and reader find in the same programs run now.
"""

import json
import shutil
import struct
from pathlib import Path

import pytest

from cudatrace.analyze.read.trace import C

HERE = Path(__file__).resolve().parent.parent / "traces" / "format3"
STEPS = "a 1m\na 2m\nn 500 4k\nf\na 3m\nn 300 64k\nq\n"


def _version(trace: Path) -> int:
    head = trace.read_bytes()[:12]
    assert head[:8] == b"CUDATRC\0"
    return struct.unpack_from("<I", head, 8)[0]


def _report(ct, d: Path) -> dict:
    r = ct.cli("report", "--json", d)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _counts(doc: dict) -> dict:
    keep = ("events", "allocs", "frees", "failed", "unmatched_frees", "null_frees")
    return {k: doc["counts"][k] for k in keep}


def _sites(doc: dict) -> list:
    return sorted((s["bytes"], s["count"], s["api_counts"]) for s in doc["sites"])


@pytest.fixture
def recorded(tmp_path):
    """A copy of the recorded runs (a reader may write its caches beside a trace)."""
    dst = tmp_path / "format3"
    shutil.copytree(HERE, dst)
    return dst


def test_the_fixtures_are_format_3(recorded):
    for d in ("steps", "threads"):
        (trace,) = (recorded / d).glob("*.ctrace")
        assert _version(trace) == 3 < C()["CT_FORMAT_VERSION"]


def test_a_format_3_run_reads_as_the_same_run_today(ct, sim, recorded):
    old = _report(ct, recorded / "steps")
    out = ct.new_dir()
    r = ct.cli("run", "-q", "-o", out, "--", sim.progs["steps"], input=STEPS)
    assert r.returncode == 0, r.stderr
    (trace,) = out.glob("*.ctrace")
    assert _version(trace) == C()["CT_FORMAT_VERSION"] > 3
    new = _report(ct, out)
    assert old["processes"][0]["status"] == "complete"
    assert old["processes"][0]["gaps"] == 0 and old["lost"] == []
    for k in ("peak_bytes", "end_bytes", "total_live_bytes", "total_live_count"):
        assert old[k] == new[k], k
    assert (
        _counts(old)
        == _counts(new)
        == {
            "events": 1604,
            "allocs": 803,
            "frees": 801,
            "failed": 0,
            "unmatched_frees": 0,
            "null_frees": 0,
        }
    )
    assert _sites(old) == _sites(new)
    assert (old["never_freed"]["bytes"], old["never_freed"]["count"]) == (
        new["never_freed"]["bytes"],
        new["never_freed"]["count"],
    )


def test_a_format_3_run_of_two_threads_reads_every_event(ct, sim, recorded):
    old = _report(ct, recorded / "threads")
    out = ct.new_dir()
    r = ct.cli("run", "-q", "-o", out, "--", sim.progs["threads"], "2", "300", "4096")
    assert r.returncode == 0, r.stderr
    new = _report(ct, out)
    assert _counts(old) == _counts(new)
    assert old["counts"]["events"] == 1200 and old["end_bytes"] == new["end_bytes"] == 0
    (p,) = old["processes"]
    assert (p["status"], p["gaps"], p["dropped_events"]) == ("complete", 0, 0)
