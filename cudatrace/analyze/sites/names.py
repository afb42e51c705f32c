"""Readable function names: demangled, and shortened for headlines.

The symbolizer already demangles (`symbols.demangle`, libstdc++'s __cxa_demangle); a name that
reaches us still mangled (a trace symbolized elsewhere, a module read without the demangler) is
demangled here. `short_name` then elides what makes C++ names unreadable in a table: the
argument list, template arguments, return types, ABI tags and clone suffixes:

    vt::cuda::(anonymous namespace)::AllocOnDevice(vt::Device, unsigned long)
        -> vt::cuda::(anon)::AllocOnDevice
    std::unique_ptr<Foo, std::default_delete<Foo> > make_foo<Foo>(int)
        -> make_foo<...>
    vllm::v1::GPUModelRunner::initialize_kv_cache(vllm::KVCacheConfig const&) [clone .cold]
        -> vllm::v1::GPUModelRunner::initialize_kv_cache

A lambda, a block or a local class is named by the function it is in, never by a bare
`operator()`:

    onnxruntime::BFCArena::Extend(unsigned long)::{lambda(unsigned long)#1}::operator()(...)
        -> onnxruntime::BFCArena::Extend::{lambda}
    invocation function for block in Foo::bar()  ->  Foo::bar::{block}

and `enclosing` gives that function for the boundary rule (layers.py), which scopes the local
entity by it.

`--full-names` shows the demangled signature instead. C names pass through unchanged.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import TextIO, overload

ANON = "(anonymous namespace)"
ANON_SHORT = "(anon)"
ELLIPSIS = "..."

_CLONE = re.compile(r"(\s*\[clone [^\]]*\])+$")
_ABI = re.compile(r"\[abi:[^\]]*\]")
_RUST_HASH = re.compile(r"::h[0-9a-f]{16}$")
# operator names whose symbols would read as brackets: kept whole
_OPERATOR = re.compile(
    r"operator(?:\(\)|\[\]|<=>|<<=|>>=|<<|>>|<=|>=|->\*|->|&&|\|\||==|!=|\+\+|--|"
    r"[-+*/%^&|~!=<>,]=?|\s+(?:new|delete)(?:\[\])?|\"\"\s*\w+)"
)


def demangle(name: str | None) -> str | None:
    """A still-mangled Itanium name demangled (unchanged if it is not one)."""
    if name and name.startswith("_Z"):
        from ...symbols import demangle as cxa

        return cxa(name)
    return name


_PY_NAMES = re.compile(r"<(?:module|lambda|genexpr|listcomp|dictcomp|setcomp|locals)>")
_QUALIFIERS = re.compile(r"^(\s*(const|volatile|&&|&|noexcept|throw\(\)))*\s*$")


def _split_top(s: str) -> tuple[str, str]:
    """(name part, rest) at the top-level '(' that opens the parameter list: the last group
    followed only by qualifiers (const, &, noexcept); earlier groups (a local entity's
    enclosing function, `foo(int)::{lambda()#1}`) are dropped from the name part."""
    groups = []
    depth = 0
    start = -1
    for i, c in enumerate(s):
        if c in "<[{":
            depth += 1
        elif c in ">]}":
            depth = max(0, depth - 1)
        elif c == "(" and depth == 0:
            depth = 1000
            start = i
        elif c == ")" and depth == 1000:
            depth = 0
            groups.append((start, i + 1))
        elif depth >= 1000:
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
    for a, b in reversed(groups):
        if a > 0 and _QUALIFIERS.match(s[b:]):
            head, rest = s[:a], s[a:]
            for x, y in reversed([g for g in groups if g[1] <= a]):
                head = head[:x] + head[y:]
            return head, rest
    return s, ""


def _elide_templates(s: str) -> str:
    """Template argument lists replaced by <...>; brackets inside {lambda(...)#1} left alone."""
    out = []
    depth = 0
    brace = 0
    for c in s:
        if brace:
            if c == "{":
                brace += 1
            elif c == "}":
                brace -= 1
            if depth == 0:
                out.append(c)
            continue
        if c == "{" and depth == 0:
            brace = 1
            out.append(c)
        elif c == "<":
            if depth == 0:
                out.append("<" + ELLIPSIS + ">")
            depth += 1
        elif c == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)


def _last_top_token(s: str) -> str:
    """The qualified name, without a return type before it (split at top-level spaces)."""
    depth = 0
    cut = 0
    for i, c in enumerate(s):
        if c in "<({[":
            depth += 1
        elif c in ">)}]":
            depth = max(0, depth - 1)
        elif c == " " and depth == 0:
            cut = i + 1
    return s[cut:]


# a lambda's closure, as GCC (`{lambda(int)#2}`), LLVM (`'lambda'(int)`, `'lambda1'(int)`) and
# clang's older spelling (`$_0`) write it, with its call operator or static invoker after it
_LAMBDA = re.compile(
    r"(?:\{lambda\((?:[^(){}]|\([^()]*\))*\)#(\d+)\}|'lambda(\d*)'\((?:[^()]|\([^()]*\))*\)|"
    r"\$_(\d+))(?:::(?:operator\(\)|_FUN)(?=::|$))?"
)
_LOCAL_QUALS = re.compile(r"\s+(?:const|volatile|&&|&|noexcept)(?=::)")
_CALL_OPERATOR = re.compile(r"(\{lambda(?:#\d+)?\})::(?:operator\(\)|_FUN)(?:<\.\.\.>)?(?=::|$)")
_BLOCK = re.compile(r"^(?:invocation function for |)block in (.+)$")


def _lambda_label(m: re.Match[str]) -> str:
    gcc, llvm, clang = m.group(1), m.group(2), m.group(3)
    n = int(gcc) if gcc else (int(llvm) + 1 if llvm else int(clang) + 1 if clang else 1)
    return "{lambda}" if n == 1 else "{lambda#%d}" % n


@functools.lru_cache(maxsize=1 << 16)
def enclosing(name: str | None) -> str | None:
    """The short name of the function a lambda, block or local class is in (its scope for the
    boundary rule); None for any other function."""
    if not name:
        return None
    s = demangle(name) or name
    b = _BLOCK.match(s)
    if b:
        return short_name(b.group(1))
    if "::" not in s or "(" not in s:
        return None
    s = _CLONE.sub("", _ABI.sub("", s)).replace(ANON, "\x01")
    depth = 0
    for i, c in enumerate(s):
        if c in "<[{":
            depth += 1
        elif c in ">]}" and depth:
            depth -= 1
        elif c == "(" and depth == 0:
            if s.startswith("operator()", max(0, i - 8)) and s[i - 8 : i] == "operator":
                continue  # operator()'s own name
            close = _close_paren(s, i)
            if close < 0:
                return None
            rest = s[close + 1 :]
            rest = re.sub(r"^(\s*(const|volatile|&&|&|noexcept))*", "", rest)
            if rest.startswith("::"):
                return short_name(s[: close + 1].replace("\x01", ANON))
            return None
    return None


def _close_paren(s: str, i: int) -> int:
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "(":
            depth += 1
        elif s[j] == ")":
            depth -= 1
            if depth == 0:
                return j
    return -1


@functools.lru_cache(maxsize=1 << 16)
def short_name(name: str | None, templates: bool = False) -> str | None:
    """The function name without arguments, template arguments or return type; a lambda's
    `{lambda(args)#1}::operator()` written `{lambda}` after its enclosing function.
    templates: keep the template arguments (`DeviceBuffer<float>::DeviceBuffer`), for the
    sites they alone tell apart."""
    if not name:
        return name
    s = demangle(name) or name
    s = _CLONE.sub("", s)
    s = _ABI.sub("", s)
    b = _BLOCK.match(s)
    if b:
        return (short_name(b.group(1)) or b.group(1)) + "::{block}"
    s = _LAMBDA.sub(_lambda_label, s)
    s = _LOCAL_QUALS.sub("", s)  # `operator()() const::{lambda}`: a nested local entity
    if not any(c in s for c in "<( ") and ANON not in s:
        return _RUST_HASH.sub("", s)
    # protect what would read as brackets or spaces
    keep: list[str] = []

    def hold(m: re.Match[str]) -> str:
        keep.append(m.group(0))
        return "\x00%d\x00" % (len(keep) - 1)

    s = s.replace(ANON, "\x01")
    s = _PY_NAMES.sub(hold, s)  # Python's <module>, <lambda>, <locals>: names, not templates
    s = _OPERATOR.sub(hold, s)
    s = re.sub(r"(\x00\d+\x00) <", r"\1<", s)
    s = s.replace("(anonymous)", "\x02")
    head, _rest = _split_top(s)
    if not templates:
        head = _elide_templates(head)
    head = _last_top_token(head.strip())
    head = head.replace("\x01", ANON_SHORT).replace("\x02", "(anon)")
    head = re.sub(r"\x00(\d+)\x00", lambda m: keep[int(m.group(1))].strip(), head)
    head = _CALL_OPERATOR.sub(r"\1", head)
    return _RUST_HASH.sub("", head) or name


# a comprehension's or generator expression's code object: CPython before 3.12 runs list, set
# and dict comprehensions in a function of their own; 3.12 inlines them (PEP 709)
_COMPREHENSION = re.compile(r"(?:^|\.)(?:<locals>\.)?<(?:listcomp|setcomp|dictcomp|genexpr)>$")


def comprehension_owner(qualname: str | None) -> str | None:
    """The function a comprehension or generator expression is written in, named by its
    qualified name (`load.<locals>.<listcomp>` -> `load`, `<genexpr>` at module level ->
    `<module>`); None for any other code."""
    if not qualname:
        return None
    m = _COMPREHENSION.search(qualname)
    if m is None:
        return None
    return qualname[: m.start()] or "<module>"


@overload
def display_name(name: str, full: bool = False) -> str: ...


@overload
def display_name(name: str | None, full: bool = False) -> str | None: ...
def display_name(name: str | None, full: bool = False) -> str | None:
    """What a report shows for a function: shortened, or demangled whole with full (a name
    in, a name out: None only for None)."""
    if not name:
        return name
    return (demangle(name) or name) if full else short_name(name)


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether text written to stream (stdout by default) reaches a terminal: only there are
    lines fitted to a width. In files and pipes a label is never cut."""
    stream = sys.stdout if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


# a qualified name in a line of text: `a::b::c`, with `(anon)` and `<...>` parts
_QUALIFIED = re.compile(r"[\w~$<>.()]+(?:::[\w~$<>.()\[\]:{}#]+)+")


def _elide_name(name: str) -> str | None:
    """One step shorter: the first namespace after the head goes into `...`
    (`vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer` -> `vllm::...::GPUModelRunner::
    CacheBuffer::CacheBuffer` -> ...), keeping the function and its class; None when only
    those are left."""
    from .layers import split_qualified

    parts = split_qualified(name)
    if len(parts) <= 3:
        return None
    if parts[1] == ELLIPSIS:
        if len(parts) <= 4:
            return None
        return "::".join(parts[:2] + parts[3:])
    return "::".join([parts[0], ELLIPSIS] + parts[2:])


def fit(text: str, width: int, terminal: bool | None = None) -> str:
    """text within width columns, for a terminal (`terminal`: None asks stdout): the middles
    of its qualified names elided first (namespaces; the longest name first), keeping each
    function, its class and `(file:line)`; only then the end of the line is cut, ending in
    '...'. Off a terminal (files, pipes) text is never cut: two sites never print alike."""
    if terminal is None:
        terminal = on_terminal()
    if not terminal or width <= 0 or len(text) <= width:
        return text
    while len(text) > width:
        names = sorted(_QUALIFIED.finditer(text), key=lambda m: (-len(m.group(0)), -m.start()))
        for m in names:
            short = _elide_name(m.group(0))
            if short is not None:
                text = text[: m.start()] + short + text[m.end() :]
                break
        else:
            break
    if len(text) <= width:
        return text
    if width <= len(ELLIPSIS):
        return text[:width]
    return text[: width - len(ELLIPSIS)] + ELLIPSIS
