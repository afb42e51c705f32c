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

`--full-names` shows the demangled signature instead. C names pass through unchanged.
"""

from __future__ import annotations

import functools
import re

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
        from ..symbols import demangle as cxa

        return cxa(name)
    return name


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


@functools.lru_cache(maxsize=1 << 16)
def short_name(name: str | None) -> str | None:
    """The function name without arguments, template arguments or return type."""
    if not name:
        return name
    s = demangle(name) or name
    s = _CLONE.sub("", s)
    s = _ABI.sub("", s)
    if not any(c in s for c in "<( ") and ANON not in s:
        return _RUST_HASH.sub("", s)
    # protect what would read as brackets or spaces
    keep: list[str] = []

    def hold(m) -> str:
        keep.append(m.group(0))
        return "\x00%d\x00" % (len(keep) - 1)

    s = s.replace(ANON, "\x01")
    s = _OPERATOR.sub(hold, s)
    s = re.sub(r"(\x00\d+\x00) <", r"\1<", s)
    s = s.replace("(anonymous)", "\x02")
    head, _rest = _split_top(s)
    head = _elide_templates(head)
    head = _last_top_token(head.strip())
    head = head.replace("\x01", ANON_SHORT).replace("\x02", "(anon)")
    head = re.sub(r"\x00(\d+)\x00", lambda m: keep[int(m.group(1))].strip(), head)
    return _RUST_HASH.sub("", head) or name


def display_name(name: str | None, full: bool = False) -> str | None:
    """What a report shows for a function: shortened, or demangled whole with full."""
    if not name:
        return name
    return (demangle(name) or name) if full else short_name(name)


def fit(text: str, width: int) -> str:
    """text cut to width characters, ending in '...' when cut."""
    if width <= 0 or len(text) <= width:
        return text
    if width <= len(ELLIPSIS):
        return text[:width]
    return text[: width - len(ELLIPSIS)] + ELLIPSIS
