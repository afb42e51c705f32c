"""Budget SPEC parsing, resolution and byte formatting (cudatrace/record/budget.py; sizes through
the ledger's C, the one grammar of budgets). No GPU."""

from __future__ import annotations

from fractions import Fraction

import pytest

from cudatrace.record.budget import (
    MAX_DEVICES,
    Amount,
    BudgetError,
    BudgetSpec,
    parse_budget,
    parse_size,
    resolve_limits,
    visible_ordinals,
)
from cudatrace.units import format_bytes

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10

SIZES = [
    ("1048576", 1 << 20),  # a number without a unit is bytes, from 1 MiB up
    ("4096B", 4096),
    ("17B", 17),
    ("17 b", 17),
    ("8GiB", 8 * GiB),
    ("8 GiB", 8 * GiB),
    ("8gib", 8 * GiB),
    ("512MiB", 512 * MiB),
    ("1.5GiB", 3 * GiB // 2),
    ("0.5TiB", 512 * GiB),
    ("4KiB", 4 * KiB),
    ("8G", 8 * GiB),  # short forms are binary
    ("8g", 8 * GiB),
    ("8M", 8 * MiB),
    ("2K", 2 * KiB),
    ("1T", 1 << 40),
    ("8GB", 8 * 10**9),  # decimal
    ("8gb", 8 * 10**9),
    ("512MB", 512 * 10**6),
    ("1KB", 1000),
    ("2TB", 2 * 10**12),
    ("0.3MiB", 314572),  # floored
    (".5GiB", GiB // 2),
    ("+1GiB", GiB),
]


@pytest.mark.parametrize("text,expected", SIZES)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


GOOD = [
    ("8GiB", Amount("bytes", 8 * GiB), {}),
    ("60%", Amount("total", Fraction(60)), {}),
    ("12.5%", Amount("total", Fraction(25, 2)), {}),
    ("60%free", Amount("free", Fraction(60)), {}),
    ("60% free", Amount("free", Fraction(60)), {}),
    ("60%FREE", Amount("free", Fraction(60)), {}),
    ("100%", Amount("total", Fraction(100)), {}),
    ("0=8GiB,1=4GiB", None, {0: Amount("bytes", 8 * GiB), 1: Amount("bytes", 4 * GiB)}),
    (" 0 = 8GiB , 1 = 50% ", None, {0: Amount("bytes", 8 * GiB), 1: Amount("total", Fraction(50))}),
    ("4GiB,0=10GiB", Amount("bytes", 4 * GiB), {0: Amount("bytes", 10 * GiB)}),
    ("15=1G", None, {15: Amount("bytes", GiB)}),
    ("2=30%free", None, {2: Amount("free", Fraction(30))}),
]


@pytest.mark.parametrize("text,default,per", GOOD)
def test_parse_budget_good(text, default, per):
    b = parse_budget(text)
    assert b.default == default
    assert b.per_device == per
    assert parse_budget(str(b)) == b  # canonical text parses back to the same budget


BAD = [
    ("", "empty"),
    ("   ", "empty"),
    ("-1GiB", "positive"),
    ("-5%", "positive"),
    ("0", "more than zero"),
    ("0GiB", "more than zero"),
    ("0%", "more than zero"),
    ("0%free", "more than zero"),
    ("101%", "100%"),
    ("100.5%free", "100%"),
    ("8XB", "unknown unit"),
    ("8GiBs", "unknown unit"),
    ("8 gigabytes", "unknown unit"),
    ("nan", "not a size"),
    ("NaN%", "not a share"),
    ("inf", "not a size"),
    ("1e9", "not a size"),
    ("0=1GiB,0=2GiB", "twice"),
    ("0=1GiB, 0=50%", "twice"),
    ("garbage", "not a size"),
    ("GiB", "not a size"),
    ("1.5", "whole"),
    ("1.5B", "whole"),
    ("0.1B", "whole"),
    ("16=1GiB", "below 16"),
    ("a=1GiB", "not a device index"),
    ("-1=1GiB", "not a device index"),
    ("=1GiB", "not a device index"),
    ("0=", "empty"),
    ("1GiB,2GiB", "more than one"),
    ("8GiB,", "empty item"),
    (",8GiB", "empty item"),
    ("8GiB,,0=1G", "empty item"),
    ("60%%", "not a share"),
    ("60%used", "not a share"),
    ("8G%", "not a share"),
    ("99999999999999999999TiB", "too large"),
    ("12", "no unit"),  # --budget 12 meant 12 GiB: refused, with the fix
    ("1000", "no unit"),
    ("1048575", "no unit"),
]


@pytest.mark.parametrize("text,why", BAD)
def test_parse_budget_bad(text, why):
    with pytest.raises(BudgetError) as ei:
        parse_budget(text)
    msg = str(ei.value)
    assert why in ei.value.why, ei.value.why
    # every rejection lists the accepted forms
    for form in ("8GiB", "60%", "60%free", "0=8GiB,1=4GiB", "8G = 8 GiB", "8GB"):
        assert form in msg, (form, msg)


def test_budget_error_is_value_error():
    with pytest.raises(ValueError):
        parse_budget("nope")


def test_parse_size_errors():
    for bad in ("", "x", "-1", "1%"):
        with pytest.raises(BudgetError):
            parse_size(bad)


TOTALS = {0: 80 * GiB, 1: 40 * GiB}
FREES = {0: 70 * GiB, 1: 10 * GiB}


@pytest.mark.parametrize(
    "text,expected",
    [
        ("8GiB", {0: 8 * GiB, 1: 8 * GiB}),
        ("50%", {0: 40 * GiB, 1: 20 * GiB}),
        ("50%free", {0: 35 * GiB, 1: 5 * GiB}),
        ("0=8GiB,1=4GiB", {0: 8 * GiB, 1: 4 * GiB}),
        ("1=25%", {1: 10 * GiB}),
        ("4GiB,0=10%", {0: 8 * GiB, 1: 4 * GiB}),
        ("100%", {0: 80 * GiB, 1: 40 * GiB}),
        ("33.3%", {0: int(80 * GiB * Fraction(333, 1000)), 1: int(40 * GiB * Fraction(333, 1000))}),
        ("5=1GiB", {5: GiB}),  # a size for a device the caller did not list still applies
    ],
)
def test_resolve(text, expected):
    assert parse_budget(text).resolve(TOTALS, FREES) == expected


def test_resolve_unknown_device():
    with pytest.raises(BudgetError, match="device 5"):
        parse_budget("5=50%").resolve(TOTALS, FREES)
    with pytest.raises(BudgetError, match="free memory"):
        parse_budget("50%free").resolve(TOTALS, {})


def test_resolve_limits_sizes_need_no_device():
    assert resolve_limits(parse_budget("8G")) == {d: 8 * GiB for d in range(MAX_DEVICES)}
    assert resolve_limits(parse_budget("1=1G")) == {1: GiB}
    assert resolve_limits(parse_budget("50%"), TOTALS, FREES) == {0: 40 * GiB, 1: 20 * GiB}
    assert not parse_budget("8G,1=2G").needs_device_memory()
    assert parse_budget("8G,1=2%").needs_device_memory()


def test_visible_ordinals():
    assert visible_ordinals(4, None) == [0, 1, 2, 3]
    assert visible_ordinals(4, "2,3") == [2, 3]
    assert visible_ordinals(4, "3, 1") == [3, 1]
    assert visible_ordinals(4, "1,9,2") == [1]  # CUDA stops at the first invalid entry
    assert visible_ordinals(4, "") == []
    assert visible_ordinals(4, "-1") == []
    with pytest.raises(BudgetError, match="UUID"):
        visible_ordinals(4, "GPU-8a3c")


@pytest.mark.parametrize(
    "n,text",
    [
        (0, "0 B"),
        (17, "17 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (512 * MiB, "512.0 MiB"),
        (GiB, "1.00 GiB"),
        (3 * GiB // 2, "1.50 GiB"),
        (10 * GiB, "10.0 GiB"),
        (GiB - 1, "1.00 GiB"),  # rounds up to the next unit, not "1024.0 MiB"
        (1 << 40, "1.00 TiB"),
        (-2048, "-2.00 KiB"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_spec_str_roundtrip_exact_units():
    assert str(parse_budget("8G")) == "8GiB"
    assert str(parse_budget("1=512M,4GiB")) == "4GiB,1=512MiB"
    assert str(parse_budget("8GB")) == "8GB"
    assert str(parse_budget("1000B")) == "1KB"
    assert str(parse_budget("1001B")) == "1001B"
    assert str(parse_budget("1048577")) == "1048577"
    assert str(parse_budget("12.5%free")) == "12.5%free"
    assert isinstance(parse_budget("8G"), BudgetSpec)


# ---- one grammar: the preload library reads CUDATRACE_BUDGET as `run --budget` reads its SPEC --

ONE_GRAMMAR = [
    "8GiB", "8 GiB", "8gib", "1.5GiB", ".5GiB", "0.3MiB", "512MB", "8G", "2TB", "4096B", "17 b",
    "1048576", "1073741824", "+1GiB", "0=8GiB,1=4GiB", " 0 = 8GiB , 1 = 1.5G ", "4GiB,0=10GiB",
    "15=1G", "3=2048MiB,1GiB",
    # refused by both
    "", "  ", "12", "1000", "1048575", "1.5", "1.5B", "0", "0GiB", "-1GiB", "8XB", "8GiBs",
    "8 gigabytes", "nan", "inf", "1e9", "GiB", "99999999999999999999TiB", "0=1GiB,0=2GiB",
    "16=1GiB", "a=1GiB", "-1=1GiB", "=1GiB", "0=", "1GiB,2GiB", "8GiB,", ",8GiB", "60%",
    "0=60%free", "0.0000001KiB",
]  # fmt: skip


def _c_budget(spec: str) -> dict[int, int] | None:
    from cudatrace import native

    ffi, lib = native.tools()
    out = ffi.new("uint64_t[]", lib.CT_LEDGER_MAX_DEVICES)
    err = ffi.new("char[]", 512)
    if lib.ct_ledger_parse_budget(spec.encode(), out, err, 512) != 0:
        assert ffi.string(err), spec  # a refusal always says why
        return None
    return {d: int(out[d]) for d in range(lib.CT_LEDGER_MAX_DEVICES) if out[d]}


def _py_budget(spec: str) -> dict[int, int] | None:
    try:
        b = parse_budget(spec)
    except BudgetError:
        return None
    if b.needs_device_memory():
        return None  # a share of device memory: the launcher resolves it, the C refuses it
    return resolve_limits(b)


@pytest.mark.parametrize("spec", ONE_GRAMMAR)
def test_one_grammar_for_c_and_python(spec):
    assert _c_budget(spec) == _py_budget(spec), spec


def test_one_grammar_constants():
    from cudatrace import native
    from cudatrace.record.budget import BARE_MIN, limits_spec

    assert BARE_MIN == native.tools()[1].CT_LEDGER_BARE_MIN
    # what the launcher hands the preload library reads back as the same limits
    for limits in ({d: 8 * GiB for d in range(MAX_DEVICES)}, {0: 3 * GiB, 5: 4096}):
        assert _c_budget(limits_spec(limits)) == limits


def test_a_unit_as_a_word_of_its_own():
    from cudatrace.commands.params import SIZE_UNIT_WORDS, split_unit
    from cudatrace.units import SIZE_UNITS

    assert set(SIZE_UNIT_WORDS) == set(SIZE_UNITS) - {""}
    assert split_unit(["--budget", "12", "GiB", "--", "prog"]) == [
        "--budget",
        "12 GiB",
        "--",
        "prog",
    ]
    assert split_unit(["-q", "--budget=3", "g", "prog"]) == ["-q", "--budget=3 g", "prog"]
    for same in (
        ["--budget", "12GiB", "G", "x"],  # a unit already: G is the command
        ["--budget", "60%", "GiB"],
        ["--", "--budget", "12", "GiB"],  # the command's own arguments
        ["--budget", "12"],
        ["--budget", "12", "prog"],
    ):
        assert split_unit(same) == same
