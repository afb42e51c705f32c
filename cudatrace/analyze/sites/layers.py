"""Allocator layers, recognized from the call graph of the allocation stacks (docs/attribution.md).

Programs allocate through their own layers (tensor -> backend -> device); the innermost frame
of every stack is then the allocator, and the code that asked for the memory is further up.
This module finds the layers from the stacks alone, never from names:

* a *client* of a function g is a caller c of g (c != g) that reaches allocation only through
  g: every allocation stack holding c has g below c;
* g is a *layer* when it has at least MIN_CLIENTS (2) clients, or matches a `--fold` pattern;
* in one stack, the fold runs from the innermost frame up to the last layer of the first
  chain of layers: everything below the first layer folds with it (its implementation, the
  innermost helper often has a single caller), then upwards layer after layer, through
  *private* frames (whose only caller is the frame above) when a layer of the same module
  follows them;
* the frame above the fold is the site (the code that asked); the folded frames are its `via`.

Functions are compared by identity (module basename and demangled name; module and offset for
a frame that could not be symbolized), recursion (a function calling itself) is not a caller,
and frames are whatever the symbolizer gave (inlined frames included).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Sequence

MIN_CLIENTS = 2


class CallGraph:
    """Stacks (function identities, innermost first) -> layers. Add stacks, then ask."""

    def __init__(self, min_clients: int = MIN_CLIENTS):
        self.min_clients = min_clients
        self._stacks: set[tuple] = set()
        self._layers: set | None = None
        self._callers: dict[Hashable, set] = {}
        self._fan: dict[Hashable, set] = {}  # site -> the allocator's callers folded into it
        self.version = 0

    def add(self, stacks: Iterable[Sequence[Hashable]]) -> None:
        n = len(self._stacks)
        for s in stacks:
            if s:
                self._stacks.add(tuple(s))
        if len(self._stacks) != n:
            self._layers = None
            self.version += 1

    def _compute(self) -> set:
        callers: dict[Hashable, set] = {}
        below: dict[Hashable, set] = {}  # functions below c in every stack holding c
        for s in self._stacks:
            first: dict[Hashable, int] = {}
            for i, f in enumerate(s):
                first.setdefault(f, i)
                if i + 1 < len(s) and s[i + 1] != f:
                    callers.setdefault(f, set()).add(s[i + 1])
            for f, i in first.items():
                cur = below.get(f)
                if cur is None:
                    below[f] = set(s[:i])
                elif cur:
                    below[f] = {g for g in cur if first.get(g, i) < i}
        layers = set()
        for g, cs in callers.items():
            if len(cs) < self.min_clients:
                continue
            clients = sum(1 for c in cs if g in below.get(c, ()))
            if clients >= self.min_clients:
                layers.add(g)
        self._callers = callers
        self._layers = layers
        return layers

    def add_fan(self, site: Hashable, caller: Hashable) -> None:
        """The boundary rule folded the allocator's caller `caller` into `site` in one stack
        (layers.boundary_split)."""
        got = self._fan.setdefault(site, set())
        if caller not in got:
            got.add(caller)
            if len(got) == 2:  # the answers change once the fold fans out
                self.version += 1

    def fans_out(self, site: Hashable) -> bool:
        """The boundary rule folds several callers of the allocator into `site`: each is its
        stack's site (`eng::Attention::reserve` and `eng::Model::load`, never the function
        that called both)."""
        return len(self._fan.get(site, ())) >= 2

    @property
    def layers(self) -> set:
        if self._layers is None:
            return self._compute()
        return self._layers

    def callers(self, f: Hashable) -> set:
        if self._layers is None:
            self._compute()
        return self._callers.get(f, set())

    def is_private(self, f: Hashable, caller: Hashable) -> bool:
        """f's only caller (recursion aside) is `caller`."""
        cs = self.callers(f)
        return not cs or cs == {caller}

    def cut(self, stack: Sequence[Hashable], forced: Callable[[int], bool] | None = None) -> int:
        """How many frames of the stack (innermost first) fold into the allocator: 0 when no
        layer is in it. forced(i): frame i is a layer by --fold."""
        layers = self.layers
        n = len(stack)

        def is_layer(i: int) -> bool:
            return stack[i] in layers or (forced is not None and forced(i))

        first = next((i for i in range(n) if is_layer(i)), None)
        if first is None:
            return 0
        top = first
        i = first + 1
        while i < n:
            if is_layer(i):
                top = i
                i += 1
                continue
            # private frames between two layers fold with them
            j = i
            while (
                j < n and not is_layer(j) and j + 1 < n and self.is_private(stack[j], stack[j + 1])
            ):
                j += 1
            if j < n and is_layer(j) and j > i and _one_module(stack, i - 1, j):
                top = j
                i = j + 1
                continue
            break
        return top + 1


def _module(f: Hashable):
    """The module of a function identity (module basename, name or offset); None if unknown."""
    return f[0] if isinstance(f, tuple) and f else None


def _one_module(stack: Sequence[Hashable], lo: int, hi: int) -> bool:
    """Frames lo..hi lie in one module (or modules are unknown): private frames fold between
    two layers only inside a library, never across its API (a Python binding between ATen's
    dispatcher and the interpreter is where the program's code is)."""
    mods = {_module(stack[k]) for k in range(lo, hi + 1)}
    return len(mods) == 1


class Pattern:
    """A --fold value: REGEX folds the functions it matches as allocator layers; `!REGEX` says
    they are not allocators (the fold stops below them)."""

    def __init__(self, text: str):
        self.pattern = text
        self.negative = text.startswith("!")
        self.rx = re.compile(text[1:] if self.negative else text)

    def search(self, s: str):
        return self.rx.search(s)


def compile_patterns(patterns: Iterable[str]) -> list[Pattern]:
    """--fold REGEX values, compiled; raises ValueError naming a bad one."""
    out = []
    for p in patterns or ():
        try:
            out.append(Pattern(p))
        except re.error as e:
            raise ValueError(f"--fold {p!r}: {e}") from None
    return out


# ---- the boundary rule: one client is enough (docs/attribution.md) ----

# verbs and nouns of allocation: a library function named so, called from another library's
# code, is part of the allocator below it (an `empty` family over a caching allocator)
ALLOC_WORDS = re.compile(r"(?i)(alloc|empty|zeros|acquire|obtain|reserve)")
# where a stack ends without meeting a boundary: the C library, the loader, the C++ runtime
# and the interpreter (a program's code never lies there)
SYSTEM_MODULES = re.compile(
    r"^(libc\.so|libc-|ld-linux|ld64\.so|ld-musl|libstdc\+\+|libc\+\+|libgcc_s|libpthread|"
    r"libpython\d|python\d)"
)
SYSTEM_FUNCTIONS = frozenset(
    (
        "_start",
        "__libc_start_main",
        "__libc_start_call_main",
        "__libc_start_main_impl",
        "start_thread",
        "clone",
        "clone3",
    )
)
# the standard library's templates, inlined into whoever uses them: never a site, never a
# boundary (std::function's invoker between a function table and its target, make_unique);
# also still mangled, where the demangler at hand does not read a newer library's names
# (libc++'s `_ZNSt3__111make_uniqueB9nin220108...TnNS_9enable_if...`)
TRANSPARENT = re.compile(
    r"^(std::|__gnu_cxx::|__cxxabiv1::|__gnu_debug::|_ZN?[rVKRO]*(St|9__gnu_cxx|10__cxxabiv1))"
)


class BFrame:
    """What the boundary rule reads of one frame: its module's basename, its short name (None
    when not symbolized), whether the module is the program's executable, the function a
    lambda, block or local class is in (`enclosing`: the rule reads it as that function) and
    the frameworks the frame belongs to (frameworks.py: by library, else by namespace)."""

    __slots__ = ("module", "name", "exe", "family", "scope", "plain_c", "rule_name", "fw")

    def __init__(
        self,
        module: str,
        name: str | None,
        exe: bool = False,
        enclosing: str | None = None,
        fw: frozenset = frozenset(),
    ):
        self.module = module
        self.name = name
        self.exe = exe
        self.family = module_family(module)
        self.rule_name = enclosing or name
        parts = split_qualified(self.rule_name) if self.rule_name else []
        self.scope = namespace_scope(parts)
        self.plain_c = len(parts) == 1
        self.fw = fw

    @property
    def symbolized(self) -> bool:
        return self.name is not None

    def transparent(self) -> bool:
        return bool(self.name and TRANSPARENT.match(self.name))

    def system(self) -> bool:
        return bool(SYSTEM_MODULES.match(self.module)) or self.name in SYSTEM_FUNCTIONS

    def alloc_named(self) -> bool:
        """Its function or class says it allocates."""
        parts = split_qualified(self.rule_name) if self.rule_name else []
        return any(ALLOC_WORDS.search(p) for p in parts[-2:])


def module_family(basename: str) -> str:
    """A library's family: `libggml-cuda.so` and `libggml-base.so` are `ggml`,
    `libtorch_cuda.so` is `torch`; an executable's name is its own family."""
    b = basename[3:] if basename.startswith("lib") and len(basename) > 3 else basename
    return re.split(r"[-_.]", b, maxsplit=1)[0] or basename


def split_qualified(name: str) -> list[str]:
    """`a::b<x::y>::c` -> [a, b<x::y>, c]: split at top-level `::`."""
    out: list[str] = []
    cur: list[str] = []
    depth = i = 0
    while i < len(name):
        c = name[i]
        if c in "<({[":
            depth += 1
        elif c in ">)}]" and depth:
            depth -= 1
        if c == ":" and depth == 0 and name.startswith("::", i):
            out.append("".join(cur))
            cur = []
            i += 2
            continue
        cur.append(c)
        i += 1
    out.append("".join(cur))
    return out


ANONS = ("(anon)", "(anonymous namespace)")


def _class_like(part: str, nxt: str | None) -> bool:
    """A qualifier that names a class: upper-case initial, template, or the constructor's (or
    destructor's) own name after it."""
    return part[:1].isupper() or "<" in part or nxt in (part, "~" + part)


def namespace_scope(parts: list[str]) -> tuple[str, ...]:
    """The namespaces of a qualified name: its qualifiers up to a local entity (`{lambda}`),
    without the classes that end them (upper-case initial, template, constructor name):
    `vt::cuda::(anon)::AllocOnDevice` -> (vt, cuda, (anon));
    `tensorrt_llm::runtime::BufferManager::gpu` -> (tensorrt_llm, runtime)."""
    quals = parts[:-1]
    for k, q in enumerate(quals):
        if ("{" in q or "(" in q) and q not in ANONS:
            quals = quals[:k]
            break
    while quals:
        last = quals[-1]
        if last in ANONS or not _class_like(last, parts[len(quals)]):
            break
        quals = quals[:-1]
    return tuple(quals)


def _continues(run_scopes: list, run_module: str, run_c: bool, f: BFrame) -> bool:
    """Does f (same family as the run) belong to the allocator's code? Its namespace must be
    one the run has been in, or one enclosing it (the library's own API: vt::Alloc over
    vt::cuda::..., vt::cuda::CudaBackend over vt::cuda::(anon)); never a namespace the run has
    not seen below it (a KV cache in tvm::runtime::relax_vm over tvm::runtime)."""
    same_mod = f.module == run_module
    s = f.scope
    if not any(r[: len(s)] == s for r in run_scopes):
        return False
    if not s:
        if any(not r for r in run_scopes):  # C functions, or global ones, all along
            return same_mod or (f.plain_c and run_c)
        # a global function over namespaced code: a library's C API, never the program's own
        return same_mod and not f.exe
    return same_mod or s in run_scopes


def boundary_cut(frames: Sequence[BFrame], keep: Callable[[int], bool] | None = None) -> int:
    """How many frames (innermost first) are the allocator's code by the boundary rule; 0 when
    the stack shows no boundary between an allocator and the code that called it.

    The innermost frames are the allocator; walking outwards, a frame is still the
    allocator's while it lies in the same library family and namespace (or an enclosing one of
    the same library); the first frame past that boundary is the code that asked. A boundary
    frame of another library whose function or class says it allocates (`empty`, `alloc`...)
    starts the allocator anew (an `empty` family over a caching allocator). std:: frames and
    frames without a symbol are never the site: the nearest named frame above them is.
    A walk that reaches the C library (plain C, one namespace throughout) finds no boundary.
    The entry point (main, a thread's start routine) is never the site while a frame of the
    program's own stands between it and the allocator (boundary_split).
    keep(i): frame i is not an allocator (`--fold '!REGEX'`): the fold stops below it."""
    return boundary_split(frames, keep)[0]


def boundary_split(
    frames: Sequence[BFrame], keep: Callable[[int], bool] | None = None
) -> tuple[int, int]:
    """(cut, caller): boundary_cut's answer, and the first frame below the site that joined the
    allocator only through an enclosing namespace of the same module (0: none): the caller of
    the allocator proper. Where the rule folds several such callers into one site (sites.py:
    the call graph's fan-out), each stack's caller is its site; where the walk ends at the
    program's entry point (main, a thread's start routine, or the C library past the program's
    own code) it is the site at once: `eng::Attention::reserve` over `eng::mem::DeviceBuffer<T>`,
    not main."""
    n = len(frames)
    if n < 2 or (keep is not None and keep(0)):
        return 0, 0
    i = 0
    while i < n and (frames[i].transparent() or not frames[i].symbolized):
        i += 1
        if i < n and frames[i].module != frames[0].module:
            break
    if i >= n:
        return 0, 0
    walk = _Walk(frames, i, keep)
    site = walk.run()
    if site is None:  # the C library, a thread's start: no boundary, unless the run widened
        return (walk.widened, 0) if walk.widened else (0, 0)
    site = _named_site(frames, site, keep)
    if site and _entry(frames, site) and walk.owned(site):
        # main is never the code that asked while the program's own code stands between
        w = walk.widened
        return (w if w and frames[w].module == frames[site].module else 0), 0
    return site, (walk.widened if site and walk.widened and walk.widened < site else 0)


def _entry(frames: Sequence[BFrame], k: int) -> bool:
    """Frame k is the program's entry point: main, or the outermost frame of the program's
    code below the C library (a thread's start routine); std:: and unnamed frames aside."""
    if frames[k].name == "main":
        return True
    rest = [f for f in frames[k + 1 :] if f.symbolized and not f.transparent()]
    return bool(rest) and rest[0].system()


class _Walk:
    """The boundary rule's walk outwards from the allocator's first named frame i (see
    boundary_split). run() -> the first frame past the boundary (the code that asked), or None
    when the walk finds none. A frame of the framework the run is in (frameworks.py) always
    belongs to it, whatever its library or namespace; a run in a framework that reaches the
    system's own code names the framework's entry (its outermost frame: a Python binding, a
    thread it started). A frame of the program just above the framework that only forwards to
    its API (its name is the API's: `CreateTensor` over `OrtApis::CreateTensorAsOrtValue`) is
    a layer. widened: the first frame that joined the run through an enclosing namespace."""

    def __init__(self, frames: Sequence[BFrame], i: int, keep: Callable[[int], bool] | None):
        self.frames, self.i, self.keep = frames, i, keep
        self.widened = 0
        self.forwarders: set[int] = set()  # the program's helpers that only forwarded

    def owned(self, k: int) -> bool:
        """A frame of the program's own (named, of frame k's module, no framework's) lies
        between frame k and the allocator's call."""
        m = self.frames[k].module
        return any(
            f.module == m and f.symbolized and not f.transparent() and not f.fw
            for j, f in enumerate(self.frames[:k])
            if j not in self.forwarders
        )

    def run(self) -> int | None:
        frames, i, keep = self.frames, self.i, self.keep
        n = len(frames)
        run = frames[i]
        run_scopes, run_module, run_c, family = [run.scope], run.module, run.plain_c, run.family
        run_fw = run.fw or (frames[0].fw if i else frozenset())
        # an allocator without symbols in a module of its own: its caller is the boundary
        if i and run.module != frames[0].module and not (run.fw & frames[0].fw):
            return i
        last = i
        for k in range(i + 1, n):
            f = frames[k]
            if f.system():
                return last if run_fw and last > i and not frames[last].transparent() else None
            if keep is not None and keep(k):
                return k
            if run_fw and f.fw & run_fw:
                if f.symbolized and not f.transparent():
                    last = k
                continue
            if not f.symbolized and f.module != run_module:
                return k
            if f.transparent() or not f.symbolized:
                continue
            if run_fw and forwards(f, frames[last]):
                self.forwarders.add(k)  # the program's helper that only forwards to its API
                continue
            if f.family == family and not run_fw:
                if _continues(run_scopes, run_module, run_c, f):
                    if f.scope not in run_scopes:
                        run_scopes.append(f.scope)
                        self.widened = self.widened or k
                    run_module, run_c = f.module, f.plain_c
                    last = k
                    continue
            elif not f.exe and f.alloc_named() and (f.family != family or f.fw):
                run_scopes, run_module, run_c, family = [f.scope], f.module, f.plain_c, f.family
                run_fw, last = f.fw, k
                self.widened = 0
                continue
            return k
        return None


_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def name_words(name: str | None) -> list[str]:
    """The words of a function's own name (its last component, template arguments aside),
    lower-case: `CreateTensorAsOrtValue` -> [create, tensor, as, ort, value],
    `ggml_backend_alloc_buffer` -> [ggml, backend, alloc, buffer]."""
    if not name:
        return []
    last = split_qualified(name)[-1]
    depth, plain = 0, []
    for c in last:
        if c == "<":
            depth += 1
        elif c == ">" and depth:
            depth -= 1
        elif not depth:
            plain.append(c)
    return [w.lower() for w in _WORD.findall("".join(plain))]


def forwards(helper: BFrame, api: BFrame) -> bool:
    """helper, outside a framework and called just above its frame api, only forwards to it:
    its name is the API's, or the API's is the start of its own (`CreateTensor` over
    `CreateTensorAsOrtValue`, `Value::CreateTensor`; `empty_buffer` over `torch::empty`)."""
    if helper.system() or helper.fw:
        return False
    h, a = name_words(helper.rule_name), name_words(api.rule_name)
    if not h or not a:
        return False
    return a[: len(h)] == h or h[: len(a)] == a


def _named_site(frames: Sequence[BFrame], site: int, keep) -> int:
    """The site is a named frame of the caller's code: past std:: and unsymbolized frames
    (0: none before the system's own code)."""
    n = len(frames)
    while site < n and (frames[site].transparent() or not frames[site].symbolized):
        if keep is not None and keep(site):
            break
        site += 1
    if site >= n or frames[site].system():
        return 0
    return site
