"""Finding the files for a recorded module: the module itself (under a sysroot, checked by
build-id), its separate debug file (by build-id in the debug dirs, else by .gnu_debuglink with
its CRC) and the dwz supplementary file (.gnu_debugaltlink)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from .elf import Elf, file_crc32


def under(root: str, path: str) -> str:
    return os.path.join(root, str(path).lstrip("/"))


def build_id_path(debug_dir: str, bid: bytes) -> str:
    return os.path.join(debug_dir, ".build-id", bid[:1].hex(), bid[1:].hex() + ".debug")


class DebugFiles:
    """warn(message) is called for every file found but not used, and for what is missing."""

    def __init__(
        self, debug_dirs: Iterable[str | Path], sysroot: str | None, warn: Callable[[str], None]
    ):
        self.sysroot = sysroot
        dirs: list[str] = []
        for d in debug_dirs:
            d = str(d)
            if d not in dirs:
                dirs.append(d)
            if sysroot:
                sd = under(sysroot, d)
                if sd not in dirs:
                    dirs.append(sd)
        self.debug_dirs = tuple(dirs)
        self.warn = warn

    def candidates(self, path: str, build_id: bytes | None) -> list[str]:
        if self.sysroot:
            c = [under(self.sysroot, path)]
            if build_id:  # the local file is safe to use only when its build-id can be checked
                c.append(path)
            return c
        return [path]

    def module_file(self, path: str, build_id: bytes | None) -> Elf | None:
        """The module's file whose build-id matches (any file when build_id is None)."""
        main = None
        mismatch = None
        for cand in self.candidates(path, build_id):
            if not os.path.isfile(cand):
                continue
            try:
                elf = Elf(cand)
            except Exception as e:
                self.warn(f"{cand}: not a readable ELF file ({e})")
                continue
            if build_id is not None and elf.build_id != build_id:
                if mismatch is None:
                    mismatch = elf
                else:
                    elf.close()
                continue
            main = elf
            break
        if main is not None and mismatch is not None:
            mismatch.close()
        if main is None:
            if mismatch is not None and build_id is not None:
                has = mismatch.build_id.hex() if mismatch.build_id else "none"
                self.warn(
                    f"build-id mismatch for {path}: trace has {build_id.hex()}, file has {has}"
                )
                mismatch.close()
            else:
                where = f" under sysroot {self.sysroot}" if self.sysroot else ""
                self.warn(f"{path}: file not found{where}")
        return main

    def _open_debug(self, path: str, cand: str, bid: bytes | None) -> Elf | None:
        try:
            elf = Elf(cand)
        except Exception as e:
            self.warn(f"{path}: unreadable debug file {cand} ({e})")
            return None
        if bid and elf.build_id is not None and elf.build_id != bid:
            self.warn(
                f"{path}: debug file {cand} has build-id {elf.build_id.hex()}, "
                f"expected {bid.hex()}; ignored"
            )
            elf.close()
            return None
        if elf.has_dwarf():
            return elf
        elf.close()
        return None

    def debug_file(self, path: str, main: Elf | None, bid: bytes | None) -> Elf | None:
        """A separate file with DWARF for the module recorded at path."""
        if bid and len(bid) >= 2:
            for d in self.debug_dirs:
                cand = build_id_path(d, bid)
                if os.path.isfile(cand):
                    elf = self._open_debug(path, cand, bid)
                    if elf is not None:
                        return elf
        if main is None or main.debuglink is None:
            return None
        name, crc = main.debuglink
        ddir = os.path.dirname(main.path)
        cands = [os.path.join(ddir, name), os.path.join(ddir, ".debug", name)]
        orig_dir = os.path.dirname(path)
        for d in self.debug_dirs:
            cands.append(os.path.join(d, orig_dir.lstrip("/"), name))
            if os.path.realpath(ddir) != os.path.realpath(orig_dir):
                cands.append(os.path.join(d, ddir.lstrip("/"), name))
        seen = set()
        for cand in cands:
            if cand in seen:
                continue
            seen.add(cand)
            if not os.path.isfile(cand) or os.path.realpath(cand) == os.path.realpath(main.path):
                continue
            try:
                got = file_crc32(cand)
            except OSError:
                continue
            if got != crc:
                self.warn(
                    f"{path}: .gnu_debuglink file {cand} has CRC {got:08x}, "
                    f"expected {crc:08x}; ignored"
                )
                continue
            elf = self._open_debug(path, cand, bid)
            if elf is not None:
                return elf
        return None

    def alt_file(self, debug: Elf) -> Elf | None:
        """The supplementary (dwz) file that debug's .gnu_debugaltlink names."""
        link = debug.read_altlink()
        if link is None:
            return None
        name, alt_bid = link
        cands = []
        if alt_bid:
            cands += [build_id_path(d, alt_bid) for d in self.debug_dirs]
        cands.append(
            name if os.path.isabs(name) else os.path.join(os.path.dirname(debug.path), name)
        )
        if self.sysroot and os.path.isabs(name):
            cands.append(under(self.sysroot, name))
        for cand in cands:
            if os.path.isfile(cand):
                try:
                    elf = Elf(cand)
                except Exception:
                    continue
                if alt_bid and elf.build_id is not None and elf.build_id != alt_bid:
                    elf.close()
                    continue
                return elf
        self.warn(
            f"{debug.path}: supplementary debug file {name} not found; some inlined names missing"
        )
        return None
