"""A private view of /etc and /run for one command, so tests can put a sealed fence record where
the preload library looks (/etc/cudatrace/fence, /run/cudatrace/jobs/<id>) without touching the
machine's: the command runs in a mount namespace of its own (`unshare -m`, as root), where /etc
and /run are overlays on the host's with a tmpfs on top, then

  - the record file is bound read-only at /etc/cudatrace/fence (fence=), as a CDI spec mounts it;
  - a directory is bound at /run/cudatrace/jobs (jobs=), as a Slurm Prolog keeps it;
  - `setpriv` runs the command as another uid (user=), so the workload is not root.

    prefix(work, fence=..., jobs=..., user=...) + [cmd, ...]   the argv to run
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest


def need_root() -> None:
    why = None
    if os.geteuid() != 0:
        why = "private mount namespaces and other uids need root (CI runs as root)"
    for tool in ("unshare", "setpriv", "mount"):
        if not why and not shutil.which(tool):
            why = f"no {tool} (util-linux)"
    if why:
        pytest.fail(why)


SCRIPT = r"""set -e
w=$1; fence=$2; ro=$3; jobs=$4; who=$5; shift 5
mount --make-rprivate /
mount -t tmpfs -o mode=755 tmpfs "$w"
for d in etc run; do
    mkdir -p "$w/$d/up" "$w/$d/work"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$w/$d/up,workdir=$w/$d/work" "/$d"
done
mkdir -p -m 755 /etc/cudatrace /run/cudatrace
if [ -n "$fence" ]; then
    : > /etc/cudatrace/fence
    mount --bind "$fence" /etc/cudatrace/fence
    [ "$ro" = 1 ] && mount -o remount,bind,ro /etc/cudatrace/fence
fi
if [ -n "$jobs" ]; then
    mkdir -p -m 755 /run/cudatrace/jobs
    mount --bind "$jobs" /run/cudatrace/jobs
fi
if [ -n "$who" ]; then
    exec setpriv --reuid="$who" --regid="$who" --clear-groups -- "$@"
fi
exec "$@"
"""


def prefix(
    work: Path,
    fence: Path | None = None,
    jobs: Path | None = None,
    user: int | str | None = None,
    read_only: bool = True,
) -> list[str]:
    """The argv that runs what follows it in a private /etc and /run (module doc). work: an
    empty directory of the test's own (a tmpfs is mounted on it inside)."""
    need_root()
    work.mkdir(parents=True, exist_ok=True)
    return [
        "unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT, "sealroot", str(work),
        str(fence or ""), "1" if read_only else "0", str(jobs or ""), str(user or ""),
    ]  # fmt: skip


def shell(work: Path, script: str, **kw: Any) -> list[str]:
    """prefix(...) running a shell script (for what one argv cannot say)."""
    return [*prefix(work, **kw), "sh", "-c", script]


def quote(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
