"""Budget specs: how much device memory a process tree (or a group of them) may hold.

A SPEC is a comma-separated list of items; each is an AMOUNT, or DEVICE=AMOUNT for one device.
A bare AMOUNT applies to every device; DEVICE=AMOUNT items override it for their device.

AMOUNT is one of
  a size        ``8GiB``, ``512MiB``, ``1.5GiB``, ``8 GiB``, ``4096B`` (bytes)
                binary units: B, KiB, MiB, GiB, TiB (powers of 1024)
                decimal units: KB, MB, GB, TB (powers of 1000)
                short units K, M, G, T mean the BINARY ones: ``8G`` = 8 GiB = 8*2**30 bytes,
                while ``8GB`` = 8*10**9 bytes. Units are case-insensitive (``8g``, ``8gib``).
                A number without a unit is bytes, refused below 1 MiB (``--budget 12`` meant
                12 GiB; ``12B`` says bytes). Sizes are read by the ledger's C
                (ct_ledger_parse_size), the grammar of CUDATRACE_BUDGET too: one grammar.
  ``60%``       a share of the device's total memory
  ``60%free``   a share of the memory free on the device when the run starts

Examples: ``8GiB``, ``60%``, ``0=8GiB,1=4GiB``, ``40%free``, ``4GiB,0=10GiB``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from .. import native
from ..errors import CudatraceError
from ..nvml import Nvml
from ..procfs import meminfo
from ..record_types import BudgetInfo
from ..units import NUMBER, UnitError, positive_number
from . import ledger as ledger_mod
from .run_ledger import open_run_ledger

NVML_ERROR_NOT_SUPPORTED = 3
MAX_DEVICES = native.constants()["CT_LEDGER_MAX_DEVICES"]  # native/include/ledger.h

FORMS_HELP = (
    "accepted budget forms: a size (8GiB, 512MiB, 1.5GiB, 4096B; units B KiB MiB GiB TiB, "
    "KB MB GB TB = powers of 1000, K M G T = KiB MiB GiB TiB, so 8G = 8 GiB and 8GB = 8*10^9 bytes; "
    "a number without a unit is bytes, 1048576 at least), "
    "a share of each device's total memory (60%), a share of its free memory at start (60%free), "
    "per device DEV=AMOUNT items (0=8GiB,1=4GiB), and a bare amount for every other device "
    "(4GiB,0=10GiB)"
)

_PCT_RE = re.compile(r"^\s*(" + NUMBER + r")\s*%\s*(free)?\s*$", re.I)


class BudgetError(CudatraceError, ValueError):
    """A budget spec that cannot be used; the message says why and lists the accepted forms."""

    def __init__(self, why: str, forms: bool = True):
        super().__init__(f"{why}; {FORMS_HELP}" if forms else why)
        self.why = why


def _number(text: str, what: str) -> Fraction:
    try:
        return positive_number(text, what)
    except UnitError as e:
        raise BudgetError(str(e)) from None


BARE_MIN = 1 << 20  # CT_LEDGER_BARE_MIN: a number without a unit below this is refused


def parse_size(text: str) -> int:
    """Bytes of a budget amount such as '8GiB', '1.5G', '512MB', '4096B', '1073741824': read
    by the ledger's C (ct_ledger_parse_size), the same grammar the preload library reads
    CUDATRACE_BUDGET with. Raises BudgetError."""
    if not isinstance(text, str) or "\0" in text:
        raise BudgetError(f"{text!r} is not a size")
    ffi, lib = native.tools()
    out = ffi.new("uint64_t *")
    err = ffi.new("char[]", 512)
    if lib.ct_ledger_parse_size(text.encode(errors="surrogateescape"), out, err, 512) != 0:
        raise BudgetError(ffi.string(err).decode(errors="replace"))
    return int(out[0])


def bytes_text(n: int) -> str:
    """n bytes as the budget grammar reads them back exactly ('8589934592', '4096B')."""
    return str(n) if n >= BARE_MIN else f"{n}B"


def limits_spec(limits: Mapping[int, int]) -> str:
    """The budget text of resolved limits (bytes per device; 0 or absent: none), as the
    launcher hands it to the preload library (CUDATRACE_BUDGET): one amount when every device
    the ledger counts has the same, else DEV=AMOUNT items."""
    vals = {int(limits.get(d, 0)) for d in range(MAX_DEVICES)}
    if len(vals) == 1 and 0 not in vals:
        return bytes_text(vals.pop())
    return ",".join(f"{d}={bytes_text(int(n))}" for d, n in sorted(limits.items()) if n)


@dataclass(frozen=True)
class Amount:
    """One budget amount: kind 'bytes' (value: int), 'total' or 'free' (value: percent)."""

    kind: str
    value: int | Fraction

    def resolve(self, dev: int, totals: Mapping[int, int], frees: Mapping[int, int]) -> int:
        if self.kind == "bytes":
            return int(self.value)
        src = totals if self.kind == "total" else frees
        if dev not in src or src[dev] is None:
            what = "total" if self.kind == "total" else "free"
            raise BudgetError(
                f"device {dev}: its {what} memory is unknown (no such device?), "
                f"so {self} cannot be resolved",
                forms=False,
            )
        n = int(Fraction(int(src[dev])) * Fraction(self.value) / 100)
        if n <= 0:
            raise BudgetError(f"device {dev}: {self} of {src[dev]} bytes is nothing", forms=False)
        return n

    def __str__(self) -> str:
        if self.kind == "bytes":
            n = int(self.value)
            forms = [bytes_text(n)] + [
                f"{n // mult}{unit}"
                for unit, mult in (
                    ("TiB", 1 << 40),
                    ("GiB", 1 << 30),
                    ("MiB", 1 << 20),
                    ("KiB", 1 << 10),
                    ("TB", 10**12),
                    ("GB", 10**9),
                    ("MB", 10**6),
                    ("KB", 10**3),
                )
                if n % mult == 0
            ]
            return min(forms, key=len)  # the shortest exact form; binary first on a tie
        v = Fraction(self.value)
        pct = str(v.numerator) if v.denominator == 1 else format(float(v), "g")
        return pct + ("%" if self.kind == "total" else "%free")


def parse_amount(text: str) -> Amount:
    t = text.strip()
    if not t:
        raise BudgetError("empty amount")
    m = _PCT_RE.match(t)
    if m:
        v = _number(m.group(1), f"'{t}'")
        if v > 100:
            raise BudgetError(f"'{t}': a share cannot be more than 100%")
        return Amount("free" if m.group(2) else "total", v)
    if "%" in t:
        raise BudgetError(f"'{t}' is not a share (write 60% or 60%free)")
    return Amount("bytes", parse_size(t))


@dataclass(frozen=True)
class BudgetSpec:
    """A parsed budget: a default amount for every device and per-device overrides."""

    default: Amount | None = None
    per_device: dict[int, Amount] = field(default_factory=dict)
    text: str = field(default="", compare=False)

    def resolve(
        self, totals: Mapping[int, int], frees: Mapping[int, int] | None = None
    ) -> dict[int, int]:
        """Limit in bytes per device. totals/frees: device -> bytes (frees: free at start).
        The default applies to every device in totals; per-device items to their device."""
        frees = frees or {}
        out: dict[int, int] = {}
        if self.default is not None:
            for dev in sorted(totals):
                if dev not in self.per_device:
                    out[dev] = self.default.resolve(dev, totals, frees)
        for dev, amount in sorted(self.per_device.items()):
            out[dev] = amount.resolve(dev, totals, frees)
        return dict(sorted(out.items()))

    def amounts(self) -> list[Amount]:
        return ([] if self.default is None else [self.default]) + list(self.per_device.values())

    def needs_device_memory(self) -> bool:
        """True when a share (%) needs the devices' total or free memory to resolve."""
        return any(a.kind != "bytes" for a in self.amounts())

    def __str__(self) -> str:
        items = [] if self.default is None else [str(self.default)]
        items += [f"{d}={a}" for d, a in sorted(self.per_device.items())]
        return ",".join(items)


def parse_budget(spec: str) -> BudgetSpec:
    """Parse a budget SPEC (see the module doc). Raises BudgetError."""
    if spec is None or not str(spec).strip():
        raise BudgetError("empty budget")
    spec = str(spec)
    default: Amount | None = None
    per: dict[int, Amount] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            raise BudgetError(f"empty item in '{spec}'")
        if "=" in item:
            dev_s, _, amt = item.partition("=")
            dev_s = dev_s.strip()
            if not re.fullmatch(r"\d+", dev_s):
                raise BudgetError(f"'{item}': '{dev_s}' is not a device index")
            dev = int(dev_s)
            if dev >= MAX_DEVICES:
                raise BudgetError(f"'{item}': device index must be below {MAX_DEVICES}")
            if dev in per:
                raise BudgetError(f"device {dev} is given twice")
            per[dev] = parse_amount(amt)
        else:
            if default is not None:
                raise BudgetError(
                    f"more than one amount for every device ('{default}' and '{item}')"
                )
            default = parse_amount(item)
    return BudgetSpec(default=default, per_device=per, text=spec.strip())


# ---- resolving a spec on this machine, for `cudatrace run` --------------------------------------


def visible_ordinals(n_physical: int, env: str | None) -> list[int]:
    """NVML index of each CUDA device ordinal under CUDA_VISIBLE_DEVICES (env; None: unset).
    Like CUDA, the list stops at the first entry that names no device. Entries given as UUIDs or
    MIG names cannot be mapped here: BudgetError."""
    if env is None:
        return list(range(n_physical))
    out: list[int] = []
    for item in env.split(","):
        item = item.strip()
        if not re.fullmatch(r"\d+", item):
            if item and not item.startswith("-") and not re.fullmatch(r"[+-]?\d+", item):
                raise BudgetError(
                    f"CUDA_VISIBLE_DEVICES names devices by UUID ({item}): give the budget "
                    "as sizes, not as shares of device memory",
                    forms=False,
                )
            break
        i = int(item)
        if i >= n_physical or i in out:
            break
        out.append(i)
    return out


def driver_memory(why: str) -> tuple[dict[int, int], dict[int, int]]:
    """(totals, frees) from the CUDA driver where NVML has no memory figures (integrated,
    unified-memory devices answer NOT_SUPPORTED): total as cuDeviceTotalMem reports it, free as
    MemFree of /proc/meminfo (what cuMemGetInfo calls free there). BudgetError if no driver."""
    from ..procfs import meminfo
    from .cudadrv import Driver

    drv = Driver()
    totals = {
        d["ordinal"]: d["total"] for d in drv.devices if "total" in d and d["ordinal"] < MAX_DEVICES
    }
    if not totals:
        raise BudgetError(
            "a share (%) of device memory needs NVML or the CUDA driver to read "
            "it: {}, and {}; give the budget as a size".format(
                why, drv.why or "the driver reports no device"
            ),
            forms=False,
        )
    # free: MemAvailable (what the system can give without swapping: page cache is reclaimable);
    # cuMemGetInfo there says MemFree, which counts the page cache as used
    mi = meminfo()
    free = mi.get("MemAvailable", mi.get("MemFree"))
    frees = {d: min(t, free) if free is not None else t for d, t in totals.items()}
    return totals, frees


def device_memory() -> tuple[dict[int, int], dict[int, int]]:
    """(totals, frees): CUDA device ordinal -> bytes, now, from NVML (honouring
    CUDA_VISIBLE_DEVICES), else from the driver (driver_memory). BudgetError when neither
    can tell."""
    nv = Nvml()
    if not nv.available:
        return driver_memory(nv.why or "NVML is unavailable")
    try:
        mem = nv.memory()
        rows = {r["index"]: r for r in mem if "total" in r}
        n = max([i for i, _ in nv.handles], default=-1) + 1
    finally:
        nv.shutdown()
    # An integrated device (Jetson/Tegra, the unified-memory platforms) has no memory of its own:
    # NVML answers NOT_SUPPORTED, and the device uses the system's DRAM, which is what CUDA's
    # cuMemGetInfo reports there. Shares are then of /proc/meminfo's MemTotal / MemAvailable.
    # The device's total is what the driver reports for it (cuDeviceTotalMem), else MemTotal.
    unified = [r["index"] for r in mem if r.get("error") == NVML_ERROR_NOT_SUPPORTED]
    if unified:
        try:
            dtotals, dfrees = driver_memory("NVML answers NOT_SUPPORTED (an integrated device)")
        except BudgetError:
            dtotals, dfrees = {}, {}
        mi = meminfo(("MemTotal", "MemAvailable"))
        for i in unified:
            total = dtotals.get(i) or mi.get("MemTotal")
            if total:
                free = dfrees.get(i, mi.get("MemAvailable") or total)
                rows[i] = {"index": i, "total": total, "free": min(total, free)}
    totals, frees = {}, {}
    for ordinal, idx in enumerate(visible_ordinals(n, os.environ.get("CUDA_VISIBLE_DEVICES"))):
        if ordinal >= MAX_DEVICES:
            break
        r = rows.get(idx)
        if r is not None:
            totals[ordinal], frees[ordinal] = int(r["total"]), int(r["free"])
    if not totals:
        return driver_memory("NVML reports no memory for any visible device")
    return totals, frees


def resolve_limits(
    spec: BudgetSpec,
    totals: Mapping[int, int] | None = None,
    frees: Mapping[int, int] | None = None,
) -> dict[int, int]:
    """Limits per device for this machine. Sizes need no device: a bare size applies to every
    device index the ledger counts. Shares read the devices (device_memory) unless given."""
    if totals is None:
        if spec.needs_device_memory():
            totals, frees = device_memory()
        else:
            totals, frees = {d: 0 for d in range(MAX_DEVICES)}, {}
    return spec.resolve(totals, frees or {})


def setup_ledger(
    spec: str | None,
    group: str | None,
    on_exceed: str = "fail",
    count_host: bool = False,
    notify: Callable[..., object] | None = None,
) -> tuple[ledger_mod.RunLedger, BudgetInfo]:
    """For `cudatrace run`: parse and resolve SPEC, then open the ledger the process tree will
    share (the group's, or a private one). Returns (RunLedger: .path .summary() .finish(),
    info dict for run.json). Raises BudgetError (bad or unresolvable spec) or
    ledger.LedgerError (the ledger cannot be used)."""
    parsed = parse_budget(spec) if spec is not None else None
    limits = resolve_limits(parsed) if parsed is not None else {}
    mode = "warn" if on_exceed == "warn" else "deny"
    run, info = open_run_ledger(
        limits, group, mode, count_host, set_limits=parsed is not None, notify=notify
    )
    info["spec"] = spec
    info["on_exceed_run"] = on_exceed
    return run, info
