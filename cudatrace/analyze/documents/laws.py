"""Sizing laws: how bytes follow a knob, fitted from a few runs. Pure math, no I/O.

`cudatrace sweep` runs a program at several values of a knob (a flag, or several flags: a grid)
and asks, for the peak and for each call site, what law the bytes live at the peak follow:

- `fit(rows, ys)`: least squares with a standard error for predictions. It computes with exact
  rationals (fractions.Fraction), so a law that is exact in the data (28 x 1 MiB per layer,
  intercept 0) comes out exact, not 0.9999999 and 3e-7.
- `classify(xs, ys)`: one knob. Flat, affine (exact or within a tolerance), or what it is when
  it is not affine: rounded up to powers of two, steps (piecewise constant), a power law
  (log-log fit), or irregular; with the points, always.
- `fit_grid(points, ys, names)`: several knobs. A multilinear law (every product of knobs is a
  term: bytes = c + a*x + b*y + d*x*y), exact for the usual "blocks x layers x page" sizing, the
  terms that are zero dropped; an additive law when the grid has too few runs for the products.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations
from typing import Any, Union

REL_TOL = 0.01  # "flat" and "affine within": residuals up to 1% of the largest value


# a knob value or a byte count: exact where it can be
Num = Union[int, float, Fraction]


def _frac(v: Num) -> Fraction:
    if isinstance(v, Fraction):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"not a finite number: {v!r}")
        return Fraction(v)
    return Fraction(v)


def _solve(a: list[list[Fraction]], b: list[Fraction]) -> list[Fraction] | None:
    """Gaussian elimination, exact; None when the system is singular."""
    n = len(a)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = next((r for r in range(col, n) if m[r][col] != 0), None)
        if piv is None:
            return None
        m[col], m[piv] = m[piv], m[col]
        p = m[col][col]
        for r in range(n):
            if r != col and m[r][col] != 0:
                f = m[r][col] / p
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def _inverse(a: list[list[Fraction]]) -> list[list[Fraction]] | None:
    n = len(a)
    cols = []
    for j in range(n):
        e = [Fraction(1) if i == j else Fraction(0) for i in range(n)]
        c = _solve(a, e)
        if c is None:
            return None
        cols.append(c)
    return [[cols[j][i] for j in range(n)] for i in range(n)]


@dataclass
class LSQ:
    """A least-squares fit of ys on the columns of rows (the first column is usually 1)."""

    coef: list[Fraction]
    n: int
    ss_res: Fraction
    ss_tot: Fraction
    xtx_inv: list[list[Fraction]] = field(repr=False)

    @property
    def p(self) -> int:
        return len(self.coef)

    @property
    def dof(self) -> int:
        return self.n - self.p

    @property
    def exact(self) -> bool:
        return self.ss_res == 0

    @property
    def r2(self) -> float:
        """1 - SSres/SStot; 1.0 for data a constant explains exactly."""
        if self.ss_tot == 0:
            return 1.0 if self.ss_res == 0 else 0.0
        return float(1 - self.ss_res / self.ss_tot)

    @property
    def stderr(self) -> float | None:
        """The residual standard error; None when no degree of freedom is left (2 points for a
        line): any such fit is exact and says nothing of its uncertainty."""
        if self.dof <= 0:
            return None
        return math.sqrt(float(self.ss_res / self.dof))

    def value(self, row: Sequence[Num]) -> Fraction:
        return sum((c * _frac(x) for c, x in zip(self.coef, row)), Fraction(0))

    def predict(self, row: Sequence[Num]) -> tuple[float, float | None]:
        """(value, standard error of a new observation there); the error is None with no
        degree of freedom left."""
        y = float(self.value(row))
        s = self.stderr
        if s is None:
            return y, None
        x = [_frac(v) for v in row]
        lev = sum(x[i] * self.xtx_inv[i][j] * x[j] for i in range(self.p) for j in range(self.p))
        return y, s * math.sqrt(float(1 + lev))


def fit(rows: Sequence[Sequence[Num]], ys: Sequence[Num]) -> LSQ | None:
    """Least squares of ys on rows (a list of equal-length rows); None when the columns are not
    independent on these rows (too few distinct points)."""
    X = [[_frac(v) for v in r] for r in rows]
    Y = [_frac(v) for v in ys]
    n = len(Y)
    if n == 0 or len(X) != n:
        return None
    p = len(X[0])
    if n < p:
        return None
    zero = Fraction(0)
    xtx = [[sum((X[k][i] * X[k][j] for k in range(n)), zero) for j in range(p)] for i in range(p)]
    xty = [sum((X[k][i] * Y[k] for k in range(n)), zero) for i in range(p)]
    inv = _inverse(xtx)
    if inv is None:
        return None
    coef = [sum((inv[i][j] * xty[j] for j in range(p)), zero) for i in range(p)]
    mean = sum(Y, zero) / n
    ss_res = Fraction(0)
    for r, y in zip(X, Y):
        e = y - sum(c * v for c, v in zip(coef, r))
        ss_res += e * e
    ss_tot = sum(((y - mean) ** 2 for y in Y), Fraction(0))
    return LSQ(coef, n, ss_res, ss_tot, inv)


# ---- one knob --------------------------------------------------------------------------------


@dataclass
class Affine:
    """y = slope * x + intercept, by least squares."""

    lsq: LSQ

    @property
    def slope(self) -> float:
        return float(self.lsq.coef[1])

    @property
    def intercept(self) -> float:
        return float(self.lsq.coef[0])

    @property
    def r2(self) -> float:
        return self.lsq.r2

    @property
    def n(self) -> int:
        return self.lsq.n

    @property
    def stderr(self) -> float | None:
        return self.lsq.stderr

    @property
    def exact(self) -> bool:
        return self.lsq.exact

    def predict(self, x: Num) -> tuple[float, float | None]:
        return self.lsq.predict([1, x])

    def as_json(self) -> dict[str, Any]:
        return {
            "slope": _num(self.lsq.coef[1]),
            "intercept": _num(self.lsq.coef[0]),
            "r2": self.r2,
            "n": self.n,
            "stderr": self.stderr,
            "exact": self.exact,
        }


def _num(v: Fraction) -> int | float:
    """An exact integer stays an int; anything else a float."""
    return int(v) if v.denominator == 1 else float(v)


def fit_affine(xs: Sequence[Num], ys: Sequence[Num]) -> Affine | None:
    """The affine least-squares law; None with fewer than two distinct xs."""
    if len({_frac(x) for x in xs}) < 2:
        return None
    got = fit([[1, x] for x in xs], ys)
    return Affine(got) if got is not None else None


@dataclass
class Power:
    """y = coef * x ** exponent, fitted on logs (x > 0, y > 0)."""

    coef: float
    exponent: float
    r2: float

    def predict(self, x: Num) -> float:
        result: float = self.coef * float(x) ** self.exponent
        return result


def fit_power(xs: Sequence[Num], ys: Sequence[Num]) -> Power | None:
    if len(xs) < 2 or any(float(x) <= 0 for x in xs) or any(float(y) <= 0 for y in ys):
        return None
    lx = [math.log(float(x)) for x in xs]
    ly = [math.log(float(y)) for y in ys]
    if len(set(lx)) < 2:
        return None
    n = len(lx)
    mx, my = sum(lx) / n, sum(ly) / n
    sxx = sum((a - mx) ** 2 for a in lx)
    sxy = sum((a - mx) * (b - my) for a, b in zip(lx, ly))
    k = sxy / sxx
    c = my - k * mx
    ss_tot = sum((b - my) ** 2 for b in ly)
    ss_res = sum((b - (c + k * a)) ** 2 for a, b in zip(lx, ly))
    r2 = 1.0 if ss_tot == 0 else 1.0 - ss_res / ss_tot
    return Power(math.exp(c), k, r2)


def _is_pow2(r: Fraction) -> bool:
    """r = 2^k for an integer k (k may be negative)."""
    if r <= 0:
        return False
    n, d = r.numerator, r.denominator
    return n & (n - 1) == 0 and d & (d - 1) == 0


@dataclass
class Law:
    """What the bytes of one series do along one knob.

    kind: "none" (no point), "one_point", "flat", "affine", "powers_of_two", "steps", "power",
    "irregular". `affine` (the least-squares line) is there whenever two distinct values were
    run, whatever the kind, so that slopes compare; `power` when it was fitted; `points` always.
    `tested`: False when two points make the line (any two points do), so affine is not a finding.
    """

    kind: str
    points: list[tuple[Any, ...]]
    affine: Affine | None = None
    power: Power | None = None
    tested: bool = True
    detail: str = ""

    @property
    def is_affine(self) -> bool:
        return self.kind in ("flat", "affine")

    def predict(self, x: Num) -> tuple[float | None, float | None, str]:
        """(value, standard error or None, how): by the power law when that is the law, else by
        the affine fit."""
        if self.kind == "power" and self.power is not None:
            return self.power.predict(x), None, "power law"
        if self.kind == "flat" and self.affine is None and self.points:
            return float(self.points[0][1]), None, "flat"
        if self.affine is None:
            if self.points:
                return float(self.points[-1][1]), None, "one point"
            return None, None, "no point"
        y, se = self.affine.predict(x)
        return y, se, "flat" if self.kind == "flat" else "affine fit"


def classify(xs: Sequence[Num], ys: Sequence[Num], rel_tol: float = REL_TOL) -> Law:
    """The law of ys (bytes) along xs (the knob's values, distinct)."""
    pts = sorted(zip(xs, ys), key=lambda p: _frac(p[0]))
    X = [_frac(x) for x, _ in pts]
    Y = [_frac(y) for _, y in pts]
    if not pts:
        return Law("none", [])
    if len(pts) == 1:
        return Law(
            "one_point",
            pts,
            tested=False,
            detail="one value: no law (run at least two, three to test it)",
        )
    top = max(abs(y) for y in Y)
    tol = Fraction(rel_tol) * top
    aff = fit_affine(X, Y)
    tested = len(pts) >= 3
    if max(Y) == min(Y):
        return Law("flat", pts, aff, tested=tested, detail="the same at every value")
    if max(Y) - min(Y) <= tol and not (tested and aff is not None and aff.r2 >= 0.9):
        # small changes that no line explains: noise around a constant. A small change a line
        # does explain (a growing site under a big flat one, in the peak) is a law: below.
        return Law("flat", pts, aff, tested=tested, detail="flat within %.0f%%" % (100 * rel_tol))
    if aff is None:
        return Law("irregular", pts, None, tested=False, detail="repeated values only")
    if not tested:
        return Law(
            "affine",
            pts,
            aff,
            tested=False,
            detail="two points: a line always fits them, so this is not tested",
        )
    res = [y - (aff.lsq.coef[0] + aff.lsq.coef[1] * x) for x, y in zip(X, Y)]
    worst = max(abs(r) for r in res)
    if worst == 0:
        return Law("affine", pts, aff, detail="exact")
    if worst <= tol:
        return Law("affine", pts, aff, detail=f"within {100 * rel_tol:.0f}% (r2 {aff.r2:.4f})")
    pw = fit_power(X, Y)
    pos = all(y > 0 for y in Y)
    if pos:
        y0 = min(Y)
        ratios = [y / y0 for y in Y]
        per = [y / x for x, y in zip(X, Y)] if all(x > 0 for x in X) else None
        rounded_up = (
            per is not None and max(per) / min(per) < 2 and all(b >= a for a, b in zip(Y, Y[1:]))
        )
        if all(_is_pow2(r) for r in ratios) and rounded_up:
            return Law(
                "powers_of_two",
                pts,
                aff,
                pw,
                detail="doubles in steps: rounded up to powers of two",
            )
    plateaus = sum(1 for a, b in zip(Y, Y[1:]) if a == b)
    if plateaus and len(set(Y)) >= 2:
        return Law(
            "steps",
            pts,
            aff,
            pw,
            detail="piecewise constant: %d distinct levels over %d values" % (len(set(Y)), len(Y)),
        )
    if pw is not None and pw.r2 >= 0.99 and pw.r2 > aff.r2 and abs(pw.exponent - 1) > 0.1:
        return Law(
            "power",
            pts,
            aff,
            pw,
            detail=f"grows as the knob to the power {pw.exponent:.2f}{_power_name(pw.exponent)}",
        )
    return Law("irregular", pts, aff, pw, detail=f"no simple law (the line's r2 is {aff.r2:.3f})")


def _power_name(k: float) -> str:
    for v, name in ((2, "quadratic"), (3, "cubic"), (0.5, "square root"), (-1, "inverse")):
        if abs(k - v) < 0.08:
            return f" ({name}?)"
    return ""


# ---- several knobs: a grid -------------------------------------------------------------------


@dataclass
class GridLaw:
    """bytes = intercept + sum of coefficient * product of knobs, over the terms kept.

    terms: tuples of knob indexes (() is the intercept); coef: one per term."""

    names: list[str]
    terms: list[tuple[Any, ...]]
    lsq: LSQ
    points: list[tuple[Any, ...]]
    model: str  # "multilinear" or "additive"

    def coefficient(self, term: tuple[Any, ...]) -> float:
        return float(self.lsq.coef[self.terms.index(term)]) if term in self.terms else 0.0

    @property
    def intercept(self) -> float:
        return self.coefficient(())

    @property
    def r2(self) -> float:
        return self.lsq.r2

    def row(self, values: Sequence[Num]) -> list[Fraction]:
        v = [_frac(x) for x in values]
        return [math.prod((v[i] for i in t), start=Fraction(1)) for t in self.terms]

    def predict(self, values: Sequence[Num]) -> tuple[float, float | None]:
        return self.lsq.predict(self.row(values))

    def partial_slope(self, knob: int, values: Sequence[Num]) -> float:
        """d bytes / d knob at the point `values` (the other knobs as given)."""
        v = [_frac(x) for x in values]
        s = Fraction(0)
        for t, c in zip(self.terms, self.lsq.coef):
            if knob in t:
                s += c * math.prod((v[i] for i in t if i != knob), start=Fraction(1))
        return float(s)

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "slope": {
                n: _num(self.lsq.coef[self.terms.index((i,))]) if (i,) in self.terms else 0
                for i, n in enumerate(self.names)
            },
            "intercept": _num(self.lsq.coef[0]) if () in self.terms else 0,
            "r2": self.r2,
            "n": self.lsq.n,
            "stderr": self.lsq.stderr,
            "exact": self.lsq.exact,
            "terms": [
                {"knobs": [self.names[i] for i in t], "coefficient": _num(c)}
                for t, c in zip(self.terms, self.lsq.coef)
            ],
        }


def fit_grid(
    points: Sequence[Sequence[Num]], ys: Sequence[Num], names: Sequence[str]
) -> GridLaw | None:
    """points: one tuple of knob values per run. The multilinear law when the grid determines
    it, else the additive one; terms whose coefficient is exactly zero are dropped and the rest
    refitted, so `1.75 MiB x blocks x layers` shows as one term. None when not even the additive
    law is determined."""
    k = len(names)
    all_terms = [t for r in range(k + 1) for t in combinations(range(k), r)]
    additive = [()] + [(i,) for i in range(k)]
    for model, terms in (("multilinear", all_terms), ("additive", additive)):
        got = _grid_fit(points, ys, terms)
        if got is None:
            continue
        if got.exact:
            kept = [t for t, c in zip(terms, got.coef) if c != 0 or t == ()]
            if kept != terms:
                again = _grid_fit(points, ys, kept)
                if again is not None:
                    terms, got = kept, again
        return GridLaw(
            list(names), list(terms), got, [tuple(p) + (y,) for p, y in zip(points, ys)], model
        )
    return None


def _grid_fit(
    points: Sequence[Sequence[Num]], ys: Sequence[Num], terms: Sequence[tuple[Any, ...]]
) -> LSQ | None:
    rows = [[math.prod((_frac(p[i]) for i in t), start=Fraction(1)) for t in terms] for p in points]
    return fit(rows, ys)
