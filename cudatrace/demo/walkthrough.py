"""The walkthrough of `cudatrace demo`: the KV-pool sizing defect traced, reported, diffed,
stopped by a budget and swept, each step checked; it drives the command line itself
(`python3 -m cudatrace ...`) as a user would, and says each command and its output."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GiB = 1 << 30
MiB = 1 << 20

# The walkthrough at full scale (the report's numbers); a small GPU scales all sizes down.
LAYERS = 28
KV_CACHE_MEMORY = 1 * GiB
MODEL_BYTES = 1_400_000_000
WORKSPACE = 256 * MiB
BUDGET = 12 * GiB
SMALL_BLOCKS = 64
FALLBACK_BLOCKS = 256
SITE_FUNCTIONS = ("allocate_layer_kv", "allocate_kv_cache")


@dataclass
class Plan:
    """The sizes of the walkthrough: the report's, or all divided by `scale` on a small GPU."""

    scale: int = 1
    kv: int = KV_CACHE_MEMORY
    model: int = MODEL_BYTES
    workspace: int = WORKSPACE
    budget: int = BUDGET

    @classmethod
    def for_free_bytes(cls, free: int | None) -> Plan:
        need = LAYERS * KV_CACHE_MEMORY + MODEL_BYTES + WORKSPACE + 64 * MiB
        scale = 1
        while free is not None and need // scale > free * 0.8 and scale < 64:
            scale *= 2
        return cls(
            scale,
            KV_CACHE_MEMORY // scale,
            MODEL_BYTES // scale,
            WORKSPACE // scale,
            BUDGET // scale,
        )

    def sizes(self) -> list[str]:
        if self.scale == 1:
            return []
        return ["--model-bytes", str(self.model), "--workspace", str(self.workspace)]


def human(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            v = n / size
            return ("%d%s" % (v, unit)) if v == int(v) else (f"{v:.2f}{unit}")
    return "%dB" % n


@dataclass
class Demo:
    work: Path
    label: str
    env: dict[str, str]
    kvpool: Path
    plan: Plan
    problems: list[str] = field(default_factory=list)

    def say(self, text: str = "") -> None:
        for line in text.splitlines() or [""]:
            sys.stdout.write(f"{self.label} {line}".rstrip() + "\n")
        sys.stdout.flush()

    def rel(self, p: Path) -> str:
        try:
            r = os.path.relpath(p)
            return r if not r.startswith("..") else str(p)
        except ValueError:
            return str(p)

    def cudatrace(self, *args: object, show: bool = True) -> tuple[int, str]:
        """`python3 -m cudatrace ARGS`, its output (stdout and stderr as they interleave)
        echoed with the label; returns (status, output)."""
        shown = ["cudatrace"] + [self.rel(a) if isinstance(a, Path) else str(a) for a in args]
        if show:
            self.say("$ " + shlex.join(shown))
        proc = subprocess.Popen(
            [sys.executable, "-m", "cudatrace", *map(str, args)],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
        out = []
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            out.append(line)
            if show:
                self.say("  " + line.rstrip("\n"))
        status = proc.wait()
        if show:
            self.say("  (exit status %d)" % status)
        return status, "".join(out)

    def trace(self, name: str, *flags: object, budget: str | None = None) -> tuple[Path, int, str]:
        out = self.work / name
        opts = ["run", "-o", out, "--force"]
        if budget:
            opts += ["--budget", budget]
        status, text = self.cudatrace(
            *opts, "--", self.kvpool, "--layers", LAYERS, *self.plan.sizes(), *flags
        )
        return out, status, text

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.problems.append(what)
            self.say("!! unexpected: " + what)

    def json_of(self, *args: object) -> Any:
        """`cudatrace ARGS --json`, not shown; the document, or None."""
        status, text = self.cudatrace(*args, "--json", show=False)
        if status != 0:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None

    def top_site(self, trace_dir: Path) -> tuple[str | None, int, int]:
        """(function, count, bytes) of the biggest call site live at the peak (report --json)."""
        doc = self.json_of("report", trace_dir)
        sites = (doc or {}).get("sites") or []
        if not sites or not sites[0].get("frames"):
            return None, 0, 0
        return (
            sites[0]["frames"][0].get("function"),
            sites[0].get("count", 0),
            sites[0].get("bytes", 0),
        )

    def run(self) -> int:
        """The walkthrough, step by step; 0 when every step went as expected, else 1."""
        self.intro()
        big, small = self.trace_step()
        self.report_step(big)
        self.diff_step(big, small)
        self.budget_step()
        law = self.sweep_step()
        self.say()

        if self.problems:
            self.say("The demo did not go as expected:")
            for pr in self.problems:
                self.say("  - " + pr)
            return 1
        self.say(
            "Done: the trace named allocate_layer_kv (%d allocations), the diff showed it "
            "shrink with --num-blocks %d," % (LAYERS, SMALL_BLOCKS)
        )
        self.say("the budget turned the runaway start-up into an error naming the function,")
        self.say(f"and the sweep gave the law: {law}.")
        return 0

    def intro(self) -> None:
        """The defect, in the words of its report."""
        p = self.plan
        kv = human(p.kv)
        self.say(
            "The bug: a C++ LLM server took ~27 GB of a Jetson's memory within 5 s of "
            "starting a 1.4 GB model, and never became ready."
        )
        self.say(
            "Its KV cache is one pool per attention layer; --kv-cache-memory was divided "
            "by the bytes of a block in ONE layer,"
        )
        self.say(
            "so %d layers turned a %s KV budget into %d x %s. kvpool (examples/kv-pool) "
            "starts the same way." % (LAYERS, kv, LAYERS, kv)
        )
        if p.scale > 1:
            self.say(
                "(sizes divided by %d so that the walkthrough fits this GPU's free memory)"
                % p.scale
            )
        self.say()

    def trace_step(self) -> tuple[Path, Path]:
        """1. The three sizing settings, traced: (the --kv-cache-memory run, the --num-blocks
        run)."""
        kv = human(self.plan.kv)
        self.say("1. Trace the three sizing settings the docs describe.")
        big, st, _ = self.trace(f"kv-cache-memory-{kv}", "--kv-cache-memory", kv)
        self.expect(st == 0, "kvpool --kv-cache-memory %s exited %d" % (kv, st))
        small, st, _ = self.trace("num-blocks-%d" % SMALL_BLOCKS, "--num-blocks", SMALL_BLOCKS)
        self.expect(st == 0, "kvpool --num-blocks %d exited %d" % (SMALL_BLOCKS, st))
        fallback, st, _ = self.trace("fallback-%d-blocks" % FALLBACK_BLOCKS)
        self.expect(st == 0, "kvpool (fallback sizing) exited %d" % st)
        self.say()
        return big, small

    def report_step(self, big: Path) -> None:
        """2. The report of the --kv-cache-memory run names allocate_layer_kv."""
        p = self.plan
        kv = human(p.kv)
        self.say(f"2. Who held the memory at the peak of the --kv-cache-memory {kv} run?")
        st, _ = self.cudatrace("report", big)
        self.expect(st == 0, "cudatrace report exited %d" % st)
        fn, count, nbytes = self.top_site(big)
        self.say(
            "-> kvpool allocates through its own layer (tensor_make > backend_acquire > "
            "device_carve); cudatrace recognized it from the call graph and names the code "
            "above it."
        )
        self.expect(
            fn in SITE_FUNCTIONS and count == LAYERS,
            "top site is %s with %d allocations, expected allocate_layer_kv with %d"
            % (fn, count, LAYERS),
        )
        if fn:
            self.say(
                "-> %s: %d allocations, %s: the pool is %d times the %s asked for."
                % (fn, count, human(nbytes), round(nbytes / p.kv) if p.kv else 0, kv)
            )
        self.say()

    def diff_step(self, big: Path, small: Path) -> None:
        """3. The diff against --num-blocks: allocate_layer_kv shrinks, as many allocations."""
        self.say("3. What changes with --num-blocks %d?" % SMALL_BLOCKS)
        st, text = self.cudatrace("diff", big, small)
        self.expect(st == 0, "cudatrace diff exited %d" % st)
        doc = self.json_of("diff", big, small) or {}
        site = next(
            (
                x
                for x in doc.get("sites", [])
                if str(x.get("label", "")).startswith("allocate_layer_kv")
            ),
            None,
        )
        self.expect(
            site is not None and site.get("status") == "shrunk",
            "the diff does not show allocate_layer_kv shrinking",
        )
        if site is not None and "peak" in site:
            pk = site["peak"]
            self.say(
                "-> allocate_layer_kv %s: %s -> %s at the peak, still %d allocations "
                "(one per layer): only num_blocks changed."
                % (
                    site.get("status"),
                    human(pk.get("a_bytes", 0)),
                    human(pk.get("b_bytes", 0)),
                    pk.get("b_count", 0),
                )
            )
        self.say()

    def budget_step(self) -> None:
        """4. Under --budget, the oversized pool fails at once, the call site named."""
        p = self.plan
        kv = human(p.kv)
        budget = human(p.budget)
        self.say(
            f"4. Bound it: with --budget {budget} the oversized pool fails at once, with the "
            "call site named, instead of eating the device."
        )
        _, st, text = self.trace(f"budget-{budget}", "--kv-cache-memory", kv, budget=budget)
        self.expect(st != 0, f"kvpool under --budget {budget} exited 0")
        line = next((l for l in text.splitlines() if "budget exceeded" in l), None)
        self.expect(
            line is not None and "allocate_layer_kv" in line,
            "no 'budget exceeded' line naming allocate_layer_kv",
        )
        named = next((l for l in text.splitlines() if l.startswith("cudatrace: denied ")), None)
        self.expect(
            named is not None and " at allocate_layer_kv " in named,
            "no 'cudatrace: denied' line naming allocate_layer_kv above its allocator",
        )
        if line is not None and st != 0:
            self.say(
                "-> the allocation over %s was refused at allocate_layer_kv, and kvpool "
                "exited with status %d instead of filling the device." % (budget, st)
            )
        self.say()

    def sweep_step(self) -> str:
        """5. `cudatrace sweep` of --kv-cache-memory over three values, --expect 1: the per-layer
        law, flagged. Returns the law in words."""
        p = self.plan
        vals = [human(p.kv // 8), human(p.kv // 4), human(p.kv // 2)]
        self.say(
            "5. The law: sweep --kv-cache-memory over {}; the flag is documented as the "
            "pool's size, so --expect 1 (byte per byte).".format(", ".join(vals))
        )
        out = self.work / "sweep"
        st, _ = self.cudatrace(
            "sweep",
            "--values",
            ",".join(vals),
            "--expect",
            "1",
            "-o",
            out,
            "--force",
            "--",
            self.kvpool,
            "--layers",
            LAYERS,
            *self.plan.sizes(),
            "--kv-cache-memory",
            "{}",
        )
        self.expect(st == 0, "cudatrace sweep exited %d" % st)
        try:
            doc = json.loads((out / "sweep.json").read_text())
        except (OSError, ValueError):
            doc = {}
        by = {str(s.get("label", "")).split(" ")[0]: s for s in doc.get("sites", [])}
        kv, w = by.get("allocate_layer_kv"), by.get("load_weights")
        slope = ((kv or {}).get("fit") or {}).get("slope")
        self.expect(
            slope == LAYERS and (kv or {}).get("contradicts_expectation") is True,
            "the sweep does not give allocate_layer_kv %d bytes per byte of the flag, "
            "flagged" % LAYERS,
        )
        self.expect(
            w is not None and w["law"]["kind"] == "flat" and not w["contradicts_expectation"],
            "the sweep does not show the weights flat",
        )
        law = (
            "allocate_layer_kv grows %s bytes per byte of --kv-cache-memory, the weights "
            "stay flat" % ((f"{slope:g}") if slope is not None else "?")
        )
        if slope is not None:
            self.say(
                "-> %s: one pool per layer, %d layers, where the docs promise one." % (law, LAYERS)
            )
        return law
