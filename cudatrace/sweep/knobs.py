"""The knobs of a sweep: --values parsed, placeholders bound, runs named, points parsed."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..analyze.documents.sweep_types import SweepKnob
from ..errors import CudatraceError
from ..record.budget import BudgetError, parse_size

SCHEMA = "cudatrace.sweep/1"
MARGIN = 0.10  # the budget suggestion's headroom over the predicted peak
EXPECT_TOLERANCE = 0.10  # --expect: flag what grows more than 10% faster


class SweepError(CudatraceError):
    """Bad input: exit status 2, nothing run."""


# ---- the knobs -------------------------------------------------------------------------------

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUM_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


@dataclass
class Knob:
    name: str  # "" for the one unnamed list ({})
    texts: list[str]
    numbers: list[int | float]  # bytes when unit == "bytes"
    unit: str | None = None  # "bytes" when the values are sizes (512MiB)
    flag: str | None = None  # the option the placeholder is the value of, if any

    @property
    def placeholder(self) -> str:
        return f"{{{self.name}}}"

    @property
    def label(self) -> str:
        """How the knob is named in sentences: its flag, else its placeholder."""
        return self.flag or (self.placeholder if self.name else "the value")

    @property
    def key(self) -> str:
        """Its name in the JSON's value objects and directory names."""
        if self.name:
            return self.name
        return self.flag.lstrip("-") if self.flag else "value"

    def noun(self) -> str | None:
        """'block' for --num-blocks, 'layer' for --layers: what one unit of the knob is."""
        if self.unit or not self.flag:
            return None
        words = [w for w in re.split(r"[-_]+", self.flag.lstrip("-").lower()) if w]
        if len(words) >= 2 and words[0] in ("num", "n", "number", "nr") and words[1] != "of":
            words = words[1:]
        elif len(words) >= 3 and words[:2] == ["number", "of"]:
            words = words[2:]
        elif len(words) == 2 and words[1] == "count":
            return words[0]
        elif len(words) != 1:
            return None
        if (
            len(words) != 1
            or not words[0].isalpha()
            or not words[0].endswith("s")
            or words[0].endswith(("ss", "us", "is"))
            or len(words[0]) < 4
        ):
            return None
        w = words[0]
        if w.endswith(("ches", "shes", "xes", "sses")):
            return w[:-2]
        return w[:-1]

    def as_json(self) -> SweepKnob:
        return {
            "name": self.key,
            "placeholder": self.placeholder,
            "flag": self.flag,
            "unit": self.unit,
            "noun": self.noun(),
            "values": list(self.texts),
            "numbers": list(self.numbers),
        }


def parse_value(text: str) -> tuple[int | float, bool]:
    """(number, is_size): '64' -> (64, False), '1.5' -> (1.5, False), '512MiB' -> (bytes, True)."""
    t = text.strip()
    if _NUM_RE.match(t):
        v = float(t)
        if not math.isfinite(v):
            raise SweepError(f"{t!r} is too large: not a finite number")
        return (int(v) if v == int(v) and "." not in t and "e" not in t.lower() else v), False
    try:
        return parse_size(t), True
    except BudgetError as e:
        raise SweepError(f"{t!r} is not a number or a size (512MiB, 1.5GiB): {e.why}") from None


def parse_knobs(specs: Sequence[str]) -> list[Knob]:
    """--values V1,V2,... (one unnamed list, placeholder {}) or NAME=V1,V2 (several: a grid)."""
    if not specs:
        raise SweepError(
            "--values is required (--values 1,2,4, or --values a=1,2 --values b=8,16 for a grid)"
        )
    knobs: list[Knob] = []
    for spec in specs:
        name, _, body = (
            spec.partition("=") if re.match(r"^\s*[A-Za-z_]\w*\s*=", spec) else ("", "", spec)
        )
        name = name.strip()
        if name and not _NAME_RE.match(name):
            raise SweepError(f"--values {spec}: {name!r} is not a knob name (letters, digits, _)")
        items = [x.strip() for x in body.split(",")]
        if not body.strip() or any(not x for x in items):
            raise SweepError(f"--values {spec}: an empty value (write V1,V2,...)")
        if len(items) < 2:
            raise SweepError(
                f"--values {spec}: one value gives no law; give at least "
                "two (three to test the law)"
            )
        parsed = []
        for x in items:
            try:
                parsed.append(parse_value(x))
            except SweepError as e:
                raise SweepError(f"--values {spec}: {e}") from None
        sizes = {s for (v, s) in parsed if not (v == 0 and not s)}
        if len(sizes) > 1:
            raise SweepError(
                f"--values {spec} mixes sizes (512MiB) and plain numbers; "
                "write every value with its unit"
            )
        nums = [v for v, _ in parsed]
        seen = set()
        for x, v in zip(items, nums):
            if v in seen:
                raise SweepError(f"--values {spec}: {x} is repeated")
            seen.add(v)
        knobs.append(Knob(name, items, nums, "bytes" if sizes == {True} else None))
    unnamed = [k for k in knobs if not k.name]
    if unnamed and len(knobs) > 1:
        if len(unnamed) == len(knobs):
            raise SweepError(
                "%d unnamed --values lists: name each knob "
                "(--values a=1,2 --values b=8,16) and write {a} and {b} in the "
                "command" % len(knobs)
            )
        raise SweepError(
            "give either one unnamed --values list (for {}) or "
            "named lists (a=1,2 for {a}), not both"
        )
    names = [k.name for k in knobs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SweepError(f"--values {sorted(dup)[0]}=... given twice")
    return knobs


def bind_command(knobs: list[Knob], cmd: list[str]) -> None:
    """Check the placeholders against the command and find each knob's flag."""
    if not cmd:
        raise SweepError("no command: cudatrace sweep --values 1,2,4 -- CMD ... {}")
    for k in knobs:
        where = [i for i, a in enumerate(cmd) if k.placeholder in a]
        if not where:
            if k.name:
                raise SweepError(
                    f"the command has no {k.placeholder}: write it where the "
                    f"value of --values {k.name}=... goes"
                )
            raise SweepError(
                "the command has no {}: write {} where the value "
                "goes, e.g. cudatrace sweep --values 1,2,4 -- ./server "
                "--num-blocks {}"
            )
        i = where[0]
        arg = cmd[i]
        m = re.match(r"^(--?[A-Za-z][\w.-]*)=" + re.escape(k.placeholder) + "$", arg)
        if m:
            k.flag = m.group(1)
        elif arg == k.placeholder and i > 0 and re.match(r"^--?[A-Za-z][\w.-]*$", cmd[i - 1]):
            k.flag = cmd[i - 1]
    named = {k.name for k in knobs if k.name}
    if named:
        for a in cmd:
            for m in re.finditer(r"\{([A-Za-z_]\w*)\}", a):
                if m.group(1) not in named:
                    raise SweepError(
                        f"the command has {{{m.group(1)}}} but no --values {m.group(1)}=..."
                    )
            if "{}" in a:
                raise SweepError(
                    "the command has {{}} but the knobs are named "
                    "({}): write {{{}}} instead".format(", ".join(sorted(named)), sorted(named)[0])
                )


def substitute(cmd: list[str], knobs: list[Knob], combo: tuple[int, ...]) -> list[str]:
    out = []
    for a in cmd:
        for k, i in zip(knobs, combo):
            a = a.replace(k.placeholder, k.texts[i])
        out.append(a)
    return out


def combos(knobs: list[Knob]) -> list[tuple[int, ...]]:
    """Indexes into each knob's values: every value of one knob; the product of a grid."""
    return list(itertools.product(*(range(len(k.texts)) for k in knobs)))


def run_name(knobs: list[Knob], combo: tuple[int, ...]) -> str:
    name = ",".join(f"{k.key}={k.texts[i]}" for k, i in zip(knobs, combo))
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", name)


# ---- stopping servers ------------------------------------------------------------------------


def value_of(knobs: list[Knob], combo: tuple[int, ...]) -> float | dict[str, float]:
    if len(knobs) == 1:
        return knobs[0].numbers[combo[0]]
    return {k.key: k.numbers[i] for k, i in zip(knobs, combo)}


def text_of(knobs: list[Knob], combo: tuple[int, ...]) -> str:
    if len(knobs) == 1:
        return knobs[0].texts[combo[0]]
    return ",".join(f"{k.key}={k.texts[i]}" for k, i in zip(knobs, combo))


def parse_point(knobs: list[Knob], text: str) -> tuple[float, ...]:
    """--predict V (one knob) or NAME=V,NAME=V (a grid) -> one number per knob."""
    if len(knobs) == 1:
        k = knobs[0]
        t = text.strip()
        if "=" in t:
            name, _, t = t.partition("=")
            if name.strip() not in (k.key, k.name, k.flag):
                raise SweepError(f"--predict {text}: the knob is {k.label}")
        v, is_size = parse_value(t)
        if k.unit == "bytes" and not is_size and v != 0:
            raise SweepError(
                f"--predict {text}: the values swept are sizes; write it with its unit (2GiB)"
            )
        if k.unit is None and is_size:
            raise SweepError(f"--predict {text}: the values swept are plain numbers")
        return (v,)
    got = {}
    for item in text.split(","):
        name, eq, t = item.partition("=")
        if not eq:
            raise SweepError(
                "--predict {}: name every knob: {}".format(
                    text, ",".join(f"{k.key}=V" for k in knobs)
                )
            )
        got[name.strip()] = t
    out = []
    for k in knobs:
        if k.key not in got:
            raise SweepError(f"--predict {text}: no value for {k.key}")
        v, _ = parse_value(got.pop(k.key))
        out.append(v)
    if got:
        raise SweepError(f"--predict {text}: no knob named {sorted(got)[0]}")
    return tuple(out)


def parse_expect(text: str, knobs: list[Knob] | None = None) -> float | dict[str, float]:
    """--expect SLOPE: bytes per unit of the knob: '1', '0.5', '1MiB' -> a float. On a grid
    NAME=SLOPE,... (only those knobs) or one SLOPE for every knob -> {NAME: float}."""
    if not knobs or len(knobs) == 1:
        t = (
            text.split("=", 1)[1]
            if knobs
            and "=" in text
            and text.split("=", 1)[0].strip() in (knobs[0].key, knobs[0].name, knobs[0].flag)
            else text
        )
        v, _ = parse_value(t)
        return float(v)
    if "=" not in text:
        v, _ = parse_value(text)
        return {k.key: float(v) for k in knobs}
    out = {}
    names = {k.key for k in knobs}
    for item in text.split(","):
        name, eq, t = item.partition("=")
        name = name.strip()
        if not eq or name not in names:
            raise SweepError(
                "{!r}: write NAME=SLOPE with NAME one of {}".format(item, ", ".join(sorted(names)))
            )
        out[name] = float(parse_value(t)[0])
    return out
