"""The runnable examples of the user docs (tests/integration/test_docs_examples.py).

A block of README.md, examples/kv-pool/README.md or docs/*.md is runnable when the line before
its fence is `<!-- runnable -->`:

    <!-- runnable -->
    ```console
    $ cudatrace run --simulated -o trace1 -- python3 examples/tiny-train/train.py
    tiny-train: 3 steps of 4 layers, batch 8
    ...
    ```

Each `$ ` line is a command (a line ending in `\\` goes on with the next), run by bash in a
folder of the file's own where `examples/` is the repository's; the lines after it, up to the
next command, are what it prints (stdout and stderr together). The blocks of a file run in
order in the same folder, so a block may read what an earlier one wrote. A line `...` in the
output stands for any number of lines (the rest of a long report).

Before comparing, both sides are normalized (normalize()): times, pids, sample counts, code
offsets and dated folder names vary from run to run; the folder's path reads `.`.

`pytest --update-docs` (or CUDATRACE_UPDATE_DOCS=1) writes the outputs of the commands into the
files instead of comparing, keeping each block's `...` elisions: lines before the first `...`
and after the last one are the run's first and last lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "<!-- runnable -->"
ELLIPSIS = "..."


@dataclass
class Command:
    line: str  # as written (after "$ "), continuation lines joined with newlines
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    start: int  # index of the fence's first line (```console) in the file's lines
    end: int  # index of the closing fence
    commands: list[Command]


def blocks(text: str) -> list[Block]:
    """The runnable blocks of a Markdown text."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == MARKER and i + 1 < len(lines) and lines[i + 1].startswith("```"):
            start = i + 1
            end = next(j for j in range(start + 1, len(lines)) if lines[j].startswith("```"))
            out.append(Block(start, end, _commands(lines[start + 1 : end])))
            i = end
        i += 1
    return out


def _commands(body: list[str]) -> list[Command]:
    cmds: list[Command] = []
    k = 0
    while k < len(body):
        line = body[k]
        if line.startswith("$ "):
            parts = [line[2:]]
            while parts[-1].endswith("\\") and k + 1 < len(body):
                k += 1
                parts.append(body[k])
            cmds.append(Command("\n".join(parts)))
        elif cmds:
            cmds[-1].expected.append(line)
        else:
            raise ValueError(f"a runnable block must start with a command ($ ...): {line!r}")
        k += 1
    return cmds


_RULES = [
    (re.compile(r"\b\d+\.\d{3} (s|ms)\b"), r"<T> \1"),  # a moment: 0.390 s
    (re.compile(r"[+-]\d+ ms\b"), "<+T> ms"),  # an offset: (+23 ms)
    (re.compile(r"~\d+ ms\b"), "~<T> ms"),  # a sampling interval
    (re.compile(r"\b\d+ samples?\b"), "<N> samples"),
    (re.compile(r"\b(p?pids?) \d+(,\d+)*"), r"\1 <PID>"),
    (re.compile(r"\b\d+\.\d+\.ctrace\b"), "<PID>.<N>.ctrace"),
    (re.compile(r"\+0x[0-9a-f]+\b"), "+0x<OFF>"),  # a code offset: (kvpool+0x2778)
    (re.compile(r"-\d{8}-\d{6}\b"), "-<DATE>"),  # a default trace directory's name
]


def normalize(line: str, cwd: str | None = None) -> str:
    """A line of output as compared: what varies between runs replaced by a placeholder."""
    if cwd:
        line = line.replace(cwd + "/", "").replace(cwd, ".")
    for rx, rep in _RULES:
        line = rx.sub(rep, line)
    return line.rstrip()


def matches(expected: list[str], actual: list[str]) -> bool:
    """actual against expected, both normalized; an `...` line matches any lines."""
    if not expected:
        return not actual
    if expected[0] == ELLIPSIS:
        return any(matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


def updated(expected: list[str], actual: list[str]) -> list[str]:
    """What to write for a command whose output is now `actual`: all of it, or with the
    block's `...` kept (as many first and last lines as it showed around them)."""
    if ELLIPSIS not in expected:
        return actual
    head = expected.index(ELLIPSIS)
    tail = len(expected) - 1 - max(i for i, x in enumerate(expected) if x == ELLIPSIS)
    if head + tail >= len(actual):
        return actual
    return actual[:head] + [ELLIPSIS] + (actual[len(actual) - tail :] if tail else [])


def rewrite(path: Path, results: dict[tuple[int, int], list[str]]) -> None:
    """Write the outputs of the commands, {(block index, command index): lines}, into path."""
    lines = path.read_text().split("\n")
    found = blocks("\n".join(lines))
    for bi in reversed(range(len(found))):
        b = found[bi]
        body: list[str] = []
        for ci, c in enumerate(b.commands):
            body.extend("$ " + x if i == 0 else x for i, x in enumerate(c.line.split("\n")))
            body.extend(updated(c.expected, results.get((bi, ci), c.expected)))
        lines[b.start + 1 : b.end] = body
    path.write_text("\n".join(lines))
