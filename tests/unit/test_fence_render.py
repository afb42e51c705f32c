"""The fence record's Python side (cudatrace/fence_record.py): fence.def read as the preload
library compiles it, one rendering for every integration (the record's text and the
environment that goes with it, LD_PRELOAD in one order), and a parser that refuses what the
library refuses (tests/support/fence_cases.py; the library's side: tests/integration/
test_fence_record.py)."""

from __future__ import annotations

import re

import pytest

from cudatrace import fence_record, settings
from cudatrace.fence_record import FenceRecord, FenceRecordError
from support.fence_cases import MALFORMED
from support.paths import REPO

BEGIN = (
    "<!-- BEGIN generated from native/include/fence.def: "
    "pytest tests/unit/test_fence_render.py --update-docs -->"
)
END = "<!-- END generated -->"


def test_budgets_page_lists_the_records_fields(request):
    """docs/budgets.md's table of the record's fields is written from fence.def."""
    path = REPO / "docs" / "budgets.md"
    text = path.read_text()
    start = text.find(BEGIN)
    end = text.find(END, start)
    assert start >= 0 and end > start, "the markers of the fields' table are missing"
    start += len(BEGIN) + 1
    want = "\n" + fence_record.markdown_table() + "\n"
    if request.config.getoption("--update-docs") or settings.value("UPDATE_DOCS"):
        path.write_text(text[:start] + want + text[end:])
        return
    assert text[start:end] == want, (
        "docs/budgets.md is stale against native/include/fence.def: "
        "pytest tests/unit/test_fence_render.py --update-docs"
    )


GiB = 1 << 30


def test_fence_def_is_read_whole_and_names_declared_settings():
    fields = fence_record.declared()
    assert list(fields)[:3] == ["GROUP", "LEDGER", "BUDGET"]
    keys = [f.key for f in fields.values()]
    assert len(keys) == len(set(keys)) and all(re.fullmatch(r"[a-z]+(-[a-z]+)*", k) for k in keys)
    for f in fields.values():  # the environment contract's variable of each field exists
        if f.setting is not None:
            assert settings.declared()[f.setting].reader in ("shim", "ledger"), f
    assert fence_record.path() == "/etc/cudatrace/fence"
    assert fence_record.jobs_dir() == "/run/cudatrace/jobs"
    assert fence_record.constant("CT_FENCE_MAX") == 4096


def test_render_gives_the_record_and_its_environment():
    rec = FenceRecord(group="slurm-gpu0", budget=str(8 * GiB), ledger_dir="/run/cudatrace/slurm",
                      share="41", share_budget=2 * GiB, share_label="slurm job 41 (alice)",
                      on_exceed="fail", on_fence_error="refuse", uid=1000,
                      owner="slurm job 41")  # fmt: skip
    r = fence_record.render(rec, "/opt/ct/libcudatrace.so", "/x.so /opt/ct/libcudatrace.so /y.so")
    assert r.text == (
        "cudatrace-fence 1\ngroup=slurm-gpu0\nbudget=8589934592\nledger-dir=/run/cudatrace/slurm\n"
        "share=41\nshare-budget=2147483648\nshare-label=slurm job 41 (alice)\non-exceed=fail\n"
        "on-fence-error=refuse\nuid=1000\nowner=slurm job 41\n"
    )
    assert r.env == [
        ("LD_PRELOAD", "/opt/ct/libcudatrace.so /x.so /y.so"),  # the library first, once
        ("CUDATRACE_GROUP", "slurm-gpu0"),
        ("CUDATRACE_BUDGET", "8589934592"),
        ("CUDATRACE_LEDGER_DIR", "/run/cudatrace/slurm"),
        ("CUDATRACE_SHARE", "41"),
        ("CUDATRACE_SHARE_BUDGET", "2147483648"),
        ("CUDATRACE_SHARE_LABEL", "slurm job 41 (alice)"),
        ("CUDATRACE_ON_EXCEED", "fail"),
        ("CUDATRACE_ON_FENCE_ERROR", "refuse"),
    ]
    assert fence_record.parse(r.text) == rec
    # /etc/ld.so.preload loads the library: no LD_PRELOAD
    assert "LD_PRELOAD" not in fence_record.render(rec).env_dict()


@pytest.mark.parametrize(
    "existing, want",
    [
        ("", "/s.so"),
        ("/s.so", "/s.so"),
        ("/a.so /s.so", "/s.so /a.so"),
        ("/a.so:/b.so", "/s.so /a.so /b.so"),
    ],
)
def test_one_preload_order(existing, want):
    assert fence_record.preload("/s.so", existing) == want


def test_render_refuses_what_the_library_would():
    ok = {"group": "g", "budget": "1GiB", "ledger_dir": "/d"}
    for bad, why in (
        ({"group": ".g"}, "group='.g' is not a group name"),
        ({"budget": "60%"}, "budget='60%' is not a budget in bytes"),
        ({"ledger_dir": "d"}, "ledger-dir='d' is not an absolute path"),
        ({"share": "123456789", "share_budget": GiB}, "is not a share name (1 to 8"),
        ({"share": "41"}, "gives share and share-budget apart"),
        ({"on_exceed": "bogus"}, "on-exceed='bogus' is not fail, warn or abort"),
        ({"owner": "a\nb"}, "'owner' holds a control character"),
        ({"ledger": "/l.ledger"}, "names neither a group nor a ledger, or both"),
        ({"budget": None}, "has no budget"),
    ):
        with pytest.raises(FenceRecordError, match=re.escape(why)):
            fence_record.render(FenceRecord(**{**ok, **bad}))
    # a fence error is kept on one line, whatever it said
    rec = FenceRecord(**ok).with_error("cannot\nread NVML:\tno GPU")
    assert "fence-error=cannot read NVML: no GPU\n" in fence_record.render(rec).text


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_parse_refuses_what_the_library_refuses(case):
    text, why = MALFORMED[case]
    with pytest.raises(FenceRecordError, match=re.escape(why)):
        fence_record.parse(text.replace("LEDGERS", "/run/cudatrace/ledger"))


def test_cgroup_job():
    v1 = "12:pids:/slurm/uid_1000/job_41/step_0/task_0\n11:memory:/slurm/uid_1000/job_41\n"
    v2 = "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n"
    assert fence_record.cgroup_job(v1) == "41" and fence_record.cgroup_job(v2) == "77"
    for none in ("0::/user.slice/session-3.scope\n", "0::/jobs_41/x\n", "0::/job_4a/x\n"):
        assert fence_record.cgroup_job(none) is None
