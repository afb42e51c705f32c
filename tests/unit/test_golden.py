"""Golden outputs: `report` (text, --json, --tree), `diff` (text, --json) and `sweep --from`
(text, --json) of runs written by tracegen, run through the CLI and compared byte for byte with
tests/golden/ (support/goldens.py says how they read the same on any machine). After an
intended change: `pytest tests/unit/test_golden.py --update-goldens`, then review the diff."""

from __future__ import annotations

import json

import pytest

from support import goldens
from support.schemas import validate

CASES = {
    "report.txt": ("report", "{run}"),
    "report.json": ("report", "{run}", "--json"),
    "report-tree.txt": ("report", "{run}", "--tree"),
    "diff.txt": ("diff", "{a}", "{b}"),
    "diff.json": ("diff", "{a}", "{b}", "--json"),
    "sweep-from.txt": ("sweep", "--from", "{sweep}"),
    "sweep-from.json": ("sweep", "--from", "{sweep}", "--json"),
}


@pytest.fixture(scope="module")
def golden_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("golden")
    return base, goldens.write_runs(base)


def output(golden_runs, args) -> str:
    base, runs = golden_runs
    r = goldens.cli(base, *(a.format(**runs) for a in args))
    assert r.returncode == 0, f"cudatrace {' '.join(args)}: status {r.returncode}\n{r.stderr}"
    return goldens.normalize(r.stdout, base)


@pytest.mark.parametrize("name", list(CASES))
def test_output_matches_golden(golden_runs, name, request):
    got = output(golden_runs, CASES[name])
    if name.endswith(".json"):
        validate(json.loads(got))  # the shipped schema holds what is printed
    goldens.compare(name, got, goldens.updating(request.config))


def test_golden_files_are_all_checked():
    """No golden file left over from a case that was removed or renamed."""
    on_disk = {p.name for p in goldens.GOLDEN.iterdir() if p.is_file() and p.name != "README.md"}
    assert on_disk == set(CASES)


def test_a_changed_output_fails_with_a_diff(tmp_path, monkeypatch):
    monkeypatch.setattr(goldens, "GOLDEN", tmp_path)
    (tmp_path / "x.txt").write_text("peak 7.0 GiB\n")
    goldens.compare("x.txt", "peak 7.0 GiB\n", update=False)
    with pytest.raises(
        AssertionError, match=r"(?s)-peak 7.0 GiB.*\+peak 8.0 GiB.*--update-goldens"
    ):
        goldens.compare("x.txt", "peak 8.0 GiB\n", update=False)
    goldens.compare("x.txt", "peak 8.0 GiB\n", update=True)
    assert (tmp_path / "x.txt").read_text() == "peak 8.0 GiB\n"
