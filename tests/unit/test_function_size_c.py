"""Short functions in the C as in the Python (tests/unit/test_function_size.py): no function of
native/ or sim/ over HARD lines, and at most MAX_LONG over LONG lines, each named below and held
to its count of today (the list only shrinks).

A function is found the way .clang-format lays it out (BreakBeforeBraces: Linux): its body opens
with a `{` alone at column 0 and closes with the next `}` at column 0; its lines are counted from
the first line of its signature to that `}`. One-line functions are short by construction."""

from __future__ import annotations

import re
from pathlib import Path

from support.paths import REPO

HARD = 150
LONG = 100
MAX_LONG = 3

# "path:function" -> its lines today, for the functions over LONG. Split one and remove its
# line; never add one beyond MAX_LONG.
EXCEPTIONS = {
    # the stack walk's hot loops (an event's stack; instructions counted by
    # tools/bench_callgrind.sh): one CFA rule's evaluation
    "native/shim/unwind.c:run_cfa": 146,
}

CALL = re.compile(r"(\w+)\(")  # clang-format writes a function's name against its "("


def function_lengths(text: str) -> dict[str, int]:
    """function name -> lines, for every function of a C text whose body opens at column 0."""
    lines = text.splitlines()
    out: dict[str, int] = {}
    i = 0
    while i < len(lines):
        if lines[i] != "{":
            i += 1
            continue
        start = i - 1  # the signature: back to a blank line, a `}`, a `;`, a comment's end or a #
        while (
            start > 0
            and lines[start - 1].strip()
            and not re.match(r"^(\}|#|.*[;}]\s*$|.*\*/\s*$|//)", lines[start - 1])
        ):
            start -= 1
        end = i + 1
        while end < len(lines) and not lines[end].startswith("}"):
            end += 1
        names = [n for n in CALL.findall(" ".join(lines[start:i])) if n != "__attribute__"]
        if names:
            out[names[0]] = end - start + 1
        i = end + 1
    return out


def c_sources() -> list[Path]:
    return sorted(
        p for d in ("native", "sim") for p in (REPO / d).rglob("*") if p.suffix in (".c", ".h")
    )


def tree_lengths() -> dict[str, int]:
    """ "path:function" -> lines, over native/ and sim/."""
    out = {}
    for p in c_sources():
        rel = p.relative_to(REPO).as_posix()
        for name, n in function_lengths(p.read_text()).items():
            out[f"{rel}:{name}"] = n
    return out


def breaches(lengths: dict[str, int], exceptions: dict[str, int]) -> list[str]:
    """What breaks the rules: a function over HARD, one over LONG not listed, a listed one
    grown past its count, a listed one now short (take it off the list) or gone."""
    bad = []
    for q, n in sorted(lengths.items()):
        if n > HARD:
            bad.append(f"{q}: {n} lines (at most {HARD}, anywhere)")
        elif n > LONG and q not in exceptions:
            bad.append(f"{q}: {n} lines (at most {LONG}: one function per step or rule)")
        elif q in exceptions and n > exceptions[q]:
            bad.append(f"{q}: {n} lines, grown from {exceptions[q]} (split it)")
    for q in exceptions:
        if lengths.get(q, 0) <= LONG:
            bad.append(f"{q}: no longer over {LONG} lines (or gone): take it off the list")
    return bad


def test_no_long_c_functions():
    bad = breaches(tree_lengths(), EXCEPTIONS)
    assert not bad, "C functions too long:\n" + "\n".join(bad)


def test_few_exceptions():
    assert len(EXCEPTIONS) <= MAX_LONG
    assert all(n <= HARD for n in EXCEPTIONS.values())


def test_the_measure_finds_functions_and_their_lines():
    src = (
        "/* a comment */\n"
        "static int\n"
        "two_lines(int a,\n"
        "          int b)\n"
        "{\n"
        "    if (a) {\n"
        "        return b;\n"
        "    }\n"
        "    return a;\n"
        "}\n"
        "\n"
        "int one(void) { return 1; }\n"
        "void (*pick(int k))(void)\n"
        "{\n"
        "    return 0;\n"
        "}\n"
    )
    assert function_lengths(src) == {"two_lines": 9, "pick": 4}
    long_body = "int big(void)\n{\n" + "    x++;\n" * 200 + "}\n"
    assert function_lengths(long_body) == {"big": 203}
    assert breaches({"a.c:big": 203}, {}) == ["a.c:big: 203 lines (at most 150, anywhere)"]
    assert breaches({"a.c:f": 120}, {})[0].startswith("a.c:f: 120 lines (at most 100")
    assert breaches({"a.c:f": 120}, {"a.c:f": 120}) == []
    assert "take it off" in breaches({"a.c:f": 90}, {"a.c:f": 120})[0]


# Files as short as the functions (issue 43): no C file of native/ or sim/ over FILE_LINES, but
# those listed at their count of today (the list only shrinks).
FILE_LINES = 1300
FILE_EXCEPTIONS: dict[str, int] = {}


def test_no_long_c_files():
    bad = []
    for p in c_sources():
        rel = p.relative_to(REPO).as_posix()
        n = len(p.read_text().splitlines())
        cap = FILE_EXCEPTIONS.get(rel, FILE_LINES)
        if n > cap:
            bad.append(f"{rel}: {n} lines (at most {cap}: split it along its sections)")
        elif rel in FILE_EXCEPTIONS and n <= FILE_LINES:
            bad.append(f"{rel}: {n} lines, no longer over {FILE_LINES}: take it off the list")
    assert not bad, "\n".join(bad)
