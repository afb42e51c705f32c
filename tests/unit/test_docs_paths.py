"""The documents and the code's comments name files that exist: a move (the floors, the test
folders) leaves no stale path in docs/, README.md, examples/, nor in a comment or docstring of
the package, the native sources, the simulator, the tools or the tests."""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

from support.paths import REPO

PATH = re.compile(
    r"(?<![\w/.-])((?:cudatrace|native|tools|tests|sim)/[A-Za-z0-9_/.-]+\.(?:py|cu|c|h|sh|md))(?!\w)"
)
EXTS = "py|c|h|cpp|cu|sh|md|def|json|proto"
# a placeholder in a path names no file: commands/NAME.py, tools/gpu/X.sh
PLACEHOLDER = re.compile(r"(?:^|/)(?:NAME|X|N|FILE|DIR|OUTDIR|PID)(?:\.|/|$)")
SKIP_DIRS = {".git", "_native", "__pycache__", "node_modules", "golden"}


def test_every_named_file_exists():
    docs = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md", REPO / "CHANGELOG.md"]
    docs += sorted((REPO / "examples").rglob("*.md"))
    missing = []
    for d in docs:
        for m in PATH.finditer(d.read_text()):
            if not (REPO / m.group(1)).exists() and not PLACEHOLDER.search(m.group(1)):
                missing.append(f"{d.relative_to(REPO)}: {m.group(1)}")
    assert not missing, "paths named in the documents that do not exist:\n" + "\n".join(missing)


# ---- comments and docstrings -----------------------------------------------------------------


def _files() -> list[Path]:
    """The repository's files (tracked, or new and not ignored)."""
    r = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [REPO / line for line in sorted(set(r.stdout.splitlines())) if line]


def _folders() -> set[str]:
    """Names of the repository's folders: a path in a comment starts with one of them (the
    repository's own `cudatrace/...`, or one relative to a floor: `shim/writer.c`)."""
    return {
        part
        for f in _files()
        for part in f.relative_to(REPO).parts[:-1]
        if part not in SKIP_DIRS and not part.startswith(".")
    }


def _python_comments(text: str) -> list[tuple[int, str]]:
    """Comments, and strings standing as statements (docstrings)."""
    out = []
    prev = tokenize.NEWLINE
    skip = (tokenize.NL, tokenize.COMMENT)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string))
            elif tok.type == tokenize.STRING and prev in (
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
            ):
                out.append((tok.start[0], tok.string))
            if tok.type not in skip:
                prev = tok.type
    except (tokenize.TokenError, SyntaxError):
        pass
    return out


C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
HASH_COMMENT = re.compile(r"(?:^|\s)#[^\n]*")


def _c_comments(text: str) -> list[tuple[int, str]]:
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in C_COMMENT.finditer(text)]


def _hash_comments(text: str) -> list[tuple[int, str]]:
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in HASH_COMMENT.finditer(text)]


SOURCE_SUFFIXES = {".py", ".c", ".h", ".cpp", ".cu", ".def", ".sh"}


def _sources() -> list[Path]:
    """The code: the package, native/, sim/, tools/, tests/, examples/, the build files."""
    return [
        f
        for f in _files()
        if f.is_file()
        and (f.suffix in SOURCE_SUFFIXES or f.name in ("Makefile", "run"))
        and not (set(f.relative_to(REPO).parts) & SKIP_DIRS)
        and f.relative_to(REPO).parts[0] != "docs"
    ]


def comment_paths(path: Path, folders: set[str]) -> list[tuple[int, str]]:
    """(line, path) of every repository-looking path in a source file's comments."""
    text = path.read_text(errors="replace")
    heads = "|".join(sorted(map(re.escape, folders)))
    rx = re.compile(rf"(?<![\w/.~-])((?:{heads})/[A-Za-z0-9_/.-]*\.(?:{EXTS}))(?![\w/])")
    if not rx.search(text):
        return []
    if path.suffix == ".py":
        comments = _python_comments(text)
    elif path.suffix in (".c", ".h", ".cpp", ".cu", ".def"):
        comments = _c_comments(text)
    else:
        comments = _hash_comments(text)
    found = [
        (line, m.group(1))
        for line, c in comments
        for m in rx.finditer(c)
        if not PLACEHOLDER.search(m.group(1))
    ]
    return sorted(found)


def resolves(name: str, source: Path) -> bool:
    """A path in a comment is the repository's (cudatrace/analyze/replay/model.py), the package's or the
    native tree's (analyze/replay/model.py, shim/writer.c), or relative to the file or a folder above."""
    roots = [REPO, REPO / "cudatrace", REPO / "native", REPO / "tests"]
    roots += [p for p in source.parents if REPO in p.parents or p == REPO]
    return any((r / name).exists() for r in roots)


def test_every_file_named_in_a_comment_exists():
    folders = _folders()
    missing = [
        f"{src.relative_to(REPO)}:{line}: {name}"
        for src in _sources()
        for line, name in comment_paths(src, folders)
        if not resolves(name, src)
    ]
    assert not missing, "paths named in comments and docstrings that do not exist:\n" + "\n".join(
        missing
    )


def test_a_dead_path_in_a_comment_is_found(tmp_path):
    """The scanner sees comments and docstrings of each language, and only those."""
    folders = _folders()
    py = tmp_path / "m.py"
    py.write_text(
        '"""Reads shim/layout.h."""\n'
        "X = 'cudatrace/pprof/profile.proto'  # a name, not a path\n"
        "# see cudatrace/model.py, not commands/NAME.py\n"
    )
    assert [n for _, n in comment_paths(py, folders)] == ["shim/layout.h", "cudatrace/model.py"]
    c = tmp_path / "m.c"
    c.write_text(
        '/* from tests/test_ledger.py */\nconst char *s = "tests/x.py"; // shim/hooks.def\n'
    )
    assert [n for _, n in comment_paths(c, folders)] == ["tests/test_ledger.py", "shim/hooks.def"]
    assert not resolves("shim/layout.h", REPO / "cudatrace" / "analyze" / "trace.py")
    assert resolves("shim/writer.c", REPO / "cudatrace" / "analyze" / "trace.py")
    assert resolves("analyze/replay/model.py", REPO / "cudatrace" / "record" / "launcher.py")
