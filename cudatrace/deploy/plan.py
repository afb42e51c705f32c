"""The budgets a node offers to containers, and the edits a fenced container gets.

Two kinds of budget, each a device of its own CDI kind (cdi.py) or a pod annotation (webhook.py):

- a **size** (`cudatrace.dev/budget=8GiB`): the container's own budget. Its ledger lives in a
  small tmpfs mounted into that container alone, so every container given the device has its
  own 8 GiB, shared by all its processes;
- a **named group** from a small config (`cudatrace.dev/group=team-a`): one budget shared by
  every container given the group. Its ledger directory is a host directory of its own
  (`<state>/groups/<name>`, made by the node agent), mounted into that group's containers only.

Either way the container gets its fence as a sealed record (cudatrace/fence_record.py: the
group, the budget in bytes, the ledger directory, on-exceed, on-fence-error refuse), mounted
read-only at /etc/cudatrace/fence, which the preload library reads for itself: nothing the
container's processes set can raise it (docs/budgets.md, "The sealed fence"); the same fence in
the environment contract's variables ("Budgets without the launcher"), which the library then
only compares; the library itself through /etc/ld.so.preload (an application's own LD_PRELOAD
stays as it is), or through LD_PRELOAD for sandboxes that do not read /etc/ld.so.preload.

The groups config (INI):

    [team-a]
    budget = 40GiB
    [inference]
    budget = 0=20GiB,1=20GiB
    on-exceed = warn
"""

from __future__ import annotations

import configparser
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import CudatraceError
from ..fence_record import FenceRecord
from ..record.budget import BudgetError, parse_budget

DEFAULT_ROOT = "/var/lib/cudatrace"  # installed preload libraries (install.py)
DEFAULT_STATE = "/run/cudatrace"  # named groups' ledger directories (cleared at boot: tmpfs)
DEFAULT_CDI_DIR = "/etc/cdi"
VENDOR = "cudatrace.dev"  # CDI kinds <vendor>/budget and <vendor>/group; pod annotations
CONTAINER_LEDGER_DIR = "/run/cudatrace/ledger"  # where a fenced container sees its ledgers
CONTAINER_GROUP = "container"  # the group of a size device: the container's own
ON_EXCEED = ("fail", "warn", "abort")
PRELOAD_MODES = ("file", "env")  # /etc/ld.so.preload, or LD_PRELOAD (sandboxes)
LEDGER_TMPFS_SIZE = "4m"  # a ledger is 164 KiB; room for its lock file and a few more
_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,62}[A-Za-z0-9])?")
_VENDOR_RE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+")


class PlanError(CudatraceError):
    """A budget, a group or a config a node cannot offer; the message says why."""


@dataclass(frozen=True)
class Fence:
    """One budget a container can be given.

    name       the CDI device name (`8GiB`, `team-a`)
    group      the group's name, None for a size (each container its own)
    budget     CUDATRACE_BUDGET: bytes, `N` for every device and/or `DEV=N` items
    on_exceed  fail, warn or abort"""

    name: str
    group: str | None
    budget: str
    on_exceed: str = "fail"

    @property
    def kind(self) -> str:
        return "group" if self.group else "budget"

    @property
    def ledger_group(self) -> str:
        return self.group or CONTAINER_GROUP


def check_vendor(vendor: str) -> str:
    """A CDI vendor: a DNS name (cudatrace.dev, test1.cudatrace.dev)."""
    if not _VENDOR_RE.fullmatch(vendor) or len(vendor) > 200:
        raise PlanError(f"vendor {vendor!r} is not a DNS name such as {VENDOR}")
    return vendor


def budget_bytes(text: str, what: str) -> str:
    """The budget variable's value (settings.def BUDGET) for a budget SPEC: sizes only (`8GiB`, `0=8GiB,1=4GiB`), in bytes.
    A share (60%) is refused: a spec written once serves containers on any GPU."""
    try:
        spec = parse_budget(text)
    except BudgetError as e:
        raise PlanError(f"{what} {text!r}: {e}") from None
    if spec.needs_device_memory():
        raise PlanError(
            f"{what} {text!r}: give a size (8GiB); a share of a device's memory (60%) is not "
            "known when the spec is written"
        )
    items = [] if spec.default is None else [str(int(spec.default.value))]
    items += [f"{d}={int(a.value)}" for d, a in sorted(spec.per_device.items())]
    return ",".join(items)


def check_name(name: str, what: str) -> str:
    """A CDI device name that is also a group name: 1 to 64 of A-Z a-z 0-9 _ . -, beginning
    and ending with a letter or digit."""
    if not _NAME_RE.fullmatch(name):
        raise PlanError(
            f"{what} {name!r}: use 1 to 64 of A-Z a-z 0-9 _ . -, beginning and ending with a "
            "letter or digit"
        )
    return name


def check_on_exceed(value: str, what: str) -> str:
    if value not in ON_EXCEED:
        raise PlanError(f"{what}: on-exceed {value!r}: give one of {', '.join(ON_EXCEED)}")
    return value


def size_fence(text: str, on_exceed: str = "fail") -> Fence:
    """`--budget 8GiB`: the device `8GiB`, every container its own budget of that size."""
    name = text.strip()
    if "=" in name or "," in name:
        raise PlanError(f"budget {text!r}: a size device is one size; name groups for more")
    budget = budget_bytes(name, "budget")
    return Fence(check_name(name, "budget"), None, budget, check_on_exceed(on_exceed, name))


def read_groups(path: Path, on_exceed: str = "fail") -> list[Fence]:
    """The named groups of a config file (module doc). PlanError on anything it cannot use."""
    parser = configparser.ConfigParser(
        interpolation=None, default_section="\0no defaults\0", inline_comment_prefixes=("#", ";")
    )
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except OSError as e:
        raise PlanError(f"cannot read the groups config {path}: {e.strerror or e}") from None
    except (configparser.Error, UnicodeDecodeError) as e:
        raise PlanError(f"groups config {path}: {e}") from None
    out = []
    for name in parser.sections():
        where = f"{path}, group [{name}]"
        check_name(name, f"{path}: group")
        keys = dict(parser.items(name))
        unknown = sorted(set(keys) - {"budget", "on-exceed"})
        if unknown:
            raise PlanError(f"{where}: unknown key {unknown[0]!r} (known: budget, on-exceed)")
        if not keys.get("budget"):
            raise PlanError(f"{where}: no budget (budget = 40GiB)")
        out.append(
            Fence(
                name,
                name,
                budget_bytes(keys["budget"], where),
                check_on_exceed(keys.get("on-exceed", on_exceed), where),
            )
        )
    return out


def record(
    fence: Fence, ledger_dir: str = CONTAINER_LEDGER_DIR, owner: str | None = None,
    make_dir: bool = False,
) -> FenceRecord:  # fmt: skip
    """The sealed record of a fenced container: its group and budget, the ledger directory it
    sees (make_dir: its first member makes it, where its parent is the fence's alone), refuse
    on a fence error."""
    return FenceRecord(
        group=fence.ledger_group,
        budget=fence.budget,
        ledger_dir=ledger_dir,
        ledger_dir_make=True if make_dir else None,
        on_exceed=fence.on_exceed,
        on_fence_error="refuse",
        owner=owner or f"cudatrace.dev/{fence.kind}={fence.name}",
    )


def fences(
    budgets: Iterable[str], groups: Path | None, on_exceed: str = "fail", required: bool = True
) -> list[Fence]:
    """The budgets a node offers: a size device per --budget, a group per section of the
    groups config. required: none is an error (`cudatrace cdi`; the node agent of a
    Kubernetes node may offer none: the webhook fences its pods)."""
    out = [size_fence(b, on_exceed) for b in budgets]
    if groups is not None:
        out += read_groups(groups, on_exceed)
    if not out and required:
        raise PlanError("nothing to offer: give --budget SIZE or --groups FILE")
    return out
