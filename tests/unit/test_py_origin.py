"""Whose code a Python frame is (symbols/python.py origin) and where the framework that
allocated ends in a stack (framework_end): the rule that names the program's line above a
framework's own Python API (docs/python-frames.md)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cudatrace.symbols.python import framework_end, one_framework, origin

SP = "/opt/venv/lib/python3.12/site-packages"


@pytest.mark.parametrize(
    "path, kind, package, where",
    [
        (SP + "/cupy/_creation/basic.py", "library", "cupy", "cupy/_creation/basic.py"),
        ("/usr/lib/python3/dist-packages/numpy/core/x.py", "library", "numpy", "numpy/core/x.py"),
        (SP + "/six.py", "library", "six", "six.py"),
        (SP + "/foo-1.0-py3.12.egg/foo/bar.py", "library", "foo", "foo/bar.py"),
        ("/usr/lib/python3.12/json/decoder.py", "stdlib", None, "json/decoder.py"),
        (
            "/root/.pyenv/versions/3.13.0/lib/python3.13t/threading.py",
            "stdlib",
            None,
            "threading.py",
        ),
        ("<frozen importlib._bootstrap>", "stdlib", None, "<frozen importlib._bootstrap>"),
        ("/home/me/serve/model.py", "program", None, "model.py"),
        ("/home/me/lib/python-tools/model.py", "program", None, "model.py"),
        ("<string>", "program", None, "<string>"),
        ("", "program", None, ""),
    ],
)
def test_origin(path, kind, package, where):
    o = origin(path)
    assert (o.kind, o.package, o.where) == (kind, package, where)


def test_one_framework():
    assert one_framework("jax", "jaxlib") and one_framework("jaxlib", "jax")
    assert one_framework("cupy", "cupy_backends") and one_framework("_pytest", "pytest")
    assert not one_framework("torch", "torchvision")  # another distribution's package
    assert not one_framework("jax", "flax") and not one_framework("a", "b")


@dataclass
class F:
    file: str | None
    python: bool = True


def native(name="libx.so"):
    return F(name, python=False)


def test_framework_end():
    script = F("/w/serve.py")
    cupy = [F(SP + "/cupy/_creation/basic.py"), native(), F(SP + "/cupy_backends/x.py")]
    std = F("/usr/lib/python3.12/contextlib.py")
    # the program's own frame is innermost: nothing to skip
    assert framework_end([native(), script, native()], 1) == 1
    # a framework's frames (its sibling package and the stdlib between them) up to the program
    assert framework_end([native(), *cupy, std, script], 1) == 5
    # an installed application that calls the framework: the application's frame heads
    app = F(SP + "/vllm/worker/cache.py")
    assert framework_end([F(SP + "/torch/nn/m.py"), std, app, script], 0) == 2
    # nothing outside the framework and the stdlib: the innermost Python frame stays
    assert framework_end([*cupy, F("/usr/lib/python3.12/runpy.py")], 0) == 0
