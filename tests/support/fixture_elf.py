"""Fixtures over tracegen's fixture program (a small gcc -g build whose functions stand for call
sites) for the unit tests that symbolize: import them where a test names them.

    elf        Path of the program, built once per module
    fake_sym   a FakeSymbolizer of it (names from its symbol table, made-up file and line)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from . import tracegen as tg


@pytest.fixture(scope="module")
def elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert shutil.which("gcc"), "gcc is needed to build the fixture program"
    return tg.build_fixture_elf(tmp_path_factory.mktemp("elf"))


@pytest.fixture(scope="module")
def fake_sym(elf: Path) -> tg.FakeSymbolizer:
    return tg.FakeSymbolizer(elf, tg.elf_symbols(elf))
