"""`cudatrace doctor` as text, from record/doctor.py's data (--json prints that data as is)."""

from __future__ import annotations

from ..record_types import Doctor, DoctorCommand
from ..units import format_bytes, printable
from .text import wrap_prose

# a device's kind and a pid namespace's, as the probes give them (True, False or unknown)
INTEGRATED: dict[object, str] = {True: "integrated (unified memory)", False: "discrete"}
HOST_PIDNS: dict[object, str] = {True: "the host's", False: "not the host's"}


def _v(x: object) -> str:
    """A probe's figure as text: what could not be read reads "unknown", never Python's None."""
    return "unknown" if x is None or x == "" else str(x)


def render_doctor(r: Doctor) -> str:
    L = []
    d = r["driver"]
    if d["available"]:
        L.append(
            "CUDA driver   %s (%d device%s)"
            % (d["version_text"], len(d["devices"]), "" if len(d["devices"]) == 1 else "s")
        )
        for x in d["devices"]:
            L.append(
                "  device %d    %s, %s, %s"
                % (
                    x["ordinal"],
                    x.get("name", "?"),
                    format_bytes(x["total"]) if "total" in x else "total unknown",
                    INTEGRATED.get(x.get("integrated"), "integrated: unknown"),
                )
            )
    else:
        L.append("CUDA driver   none: {}".format(_v(d["why"])))
    n = r["nvml"]
    if n["available"]:
        mem = (
            "memory figures: yes"
            if n["memory_supported"]
            else "memory figures: not supported (as on integrated devices)"
            if n["memory_supported"] is False
            else "memory figures: no device"
        )
        L.append(
            "NVML          %s, %d device%s; %s; per-process figures: %s"
            % (
                n["driver"] or "version unknown",
                n["devices"],
                "" if n["devices"] == 1 else "s",
                mem,
                {True: "yes", False: "none listed now", None: "-"}[n["per_process"]],
            )
        )
    else:
        L.append("NVML          none: {}".format(_v(n["why"])))
    led = r["ledger"]
    where = "from CUDATRACE_LEDGER_DIR" if led["env"] else "default"
    if not led["ok"]:
        L.append("ledger dir    REFUSED: {}".format(_v(led["error"])))
    elif not led["exists"]:
        L.append("ledger dir    {} ({}): {}".format(_v(led["path"]), where, _v(led.get("note"))))
    else:
        L.append(
            "ledger dir    %s (%s): uid %d, mode %s, %s; %d ledger%s"
            % (
                led["path"],
                where,
                led["uid"],
                led["mode"],
                led.get("fs") or "file system unknown",
                len(led.get("ledgers", [])),
                "" if len(led.get("ledgers", [])) == 1 else "s",
            )
        )
    ns = r["namespace"]
    L.append(
        "namespace     pid namespace %s (%s; pid 1's: %s), uid %d, container: %s"
        % (
            _v(ns["pidns"]),
            HOST_PIDNS.get(ns["initial_pidns"], "unknown"),
            _v(ns["pidns_of_pid1"]),
            ns["uid"],
            ns["container"] or "none seen",
        )
    )
    if ns.get("cgroup"):
        L.append("  cgroup      {}".format(ns["cgroup"]))
    c = r.get("command")
    if c:
        L.append(
            "command       {} -> {}".format(
                printable(c["argv0"]), printable(c["path"] or "not found")
            )
        )
        L.extend(_command_lines(c, "  "))
    L.append("")
    L.append("What to do:" if r["advice"] else "Nothing to do.")
    L.extend("  - " + a for a in r["advice"])
    return wrap_prose("\n".join(L))


def _command_lines(c: DoctorCommand, ind: str) -> list[str]:
    out = []
    if c.get("kind") == "elf":
        out.append(
            "{}{} ELF, {}; needs {}".format(
                ind,
                _v(c.get("machine")),
                "STATIC" if c["static"] else "dynamic",
                ", ".join(c["needed"]) or "nothing",
            )
        )
        out.append(
            "{}CUDA runtime: {}; driver: {}".format(
                ind, c.get("cudart") or "not linked", c.get("driver") or "not referenced"
            )
        )
    elif c.get("kind") == "script" and c.get("interpreter"):
        i = c["interpreter"]
        out.append("{}script run by {}".format(ind, printable(i["path"] or i["argv0"])))
        out.extend(_command_lines(i, ind + "  "))
    out.extend(ind + x for x in c.get("notes", ()))
    out.append(
        "{}{}".format(
            ind, "can be entered" if c["ok"] else "CANNOT be entered: " + "; ".join(c["problems"])
        )
    )
    return out
