"""pytest fixtures for the simulated CUDA driver; tests/conftest.py loads them as a plugin:

    pytest_plugins = ["support.sim_fixtures"]

`sim` (session scope) builds everything once (simbuild.build_all) into a folder every xdist
worker of the session shares (support/shared_build.py),
or into $CUDATRACE_SIM_BUILDDIR when that is set (kept between sessions: rebuilt only when sources
change), and returns a Sim:

    sim.lib            Path of the folder holding libcuda.so.1 and libnvidia-ml.so.1
    sim.progs          {program: Path | None}  (None: not buildable here, e.g. static_prog)
    sim.paths          everything build_all returned (libdir, libcuda, libnvml, libnext, ...)
    sim.libnext        Path of preload/libnext.so;  sim.libinterpose likewise
    sim.env(**opts)    a complete environment for subprocess: os.environ without any CUDASIM_*
                       or LD_PRELOAD, LD_LIBRARY_PATH starting with sim.lib, CUDATRACE_CACHE
                       the session's symbol cache (sim.symcache), and the simulator
                       options (simbuild.SIM_OPTIONS: state=, devices=, total_bytes=,
                       driver_version=, integrated=, fail_nth=, calls=, ctx_bytes=)
    sim.new_state()    a fresh path (not yet existing) for env(state=...): one simulated GPU
                       shared by every process given it
    sim.run(prog, *args, env=None, timeout=60, check=False, **opts)
                       children.run of a program (capture_output, text); env defaults to
                       sim.env(**opts); check=True raises on a non-zero exit with the output
    sim.stats(state)   the shared state after reclaiming dead processes' memory:
                       [{dev, total, used, hwm, free, pids: {pid: {used, hwm}}}] (simstat)
"""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest

from . import children, simbuild
from .shared_build import session_root, shared_build


def _built_path(paths: dict[str, Path | None], name: str) -> Path:
    p = paths[name]
    assert p is not None, f"the simulator's build has no {name}"
    return p


class Sim:
    def __init__(self, paths: dict[str, Path | None], scratch: Path, symcache: Path):
        self.paths = paths
        self.symcache = symcache  # the symbolizer's cache of every command the tests run
        self.lib: Path = _built_path(paths, "libdir")
        self.progs: dict[str, Path | None] = {name: paths.get(name) for name in simbuild.PROGRAMS}
        self.libnext: Path = _built_path(paths, "libnext")
        self.libinterpose: Path = _built_path(paths, "libinterpose")
        self._scratch = scratch
        self._counter = itertools.count()

    def env(self, **opts: object) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CUDASIM_") and k != "LD_PRELOAD"
        }
        add = simbuild.sim_env(self.lib, **opts)
        old = env.get("LD_LIBRARY_PATH")
        if old:
            add["LD_LIBRARY_PATH"] = f"{add['LD_LIBRARY_PATH']}:{old}"
        env.update(add)
        # one symbol cache for the session: each library is symbolized once, not once a test
        env.setdefault("CUDATRACE_CACHE", str(self.symcache))
        return env

    def new_state(self) -> Path:
        path = self._scratch / f"state-{os.getpid()}-{next(self._counter)}"
        path.unlink(missing_ok=True)
        return path

    def run(
        self,
        prog: str,
        *args: object,
        env: dict[str, str] | None = None,
        timeout: float = 60,
        check: bool = False,
        **opts: object,
    ) -> subprocess.CompletedProcess[str]:
        path = self.progs.get(prog)
        if path is None:
            pytest.fail(f"{prog} could not be built here")
        res = children.run(
            [str(path), *map(str, args)],
            env=env if env is not None else self.env(**opts),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise AssertionError(
                f"{prog} {' '.join(map(str, args))} exited {res.returncode}\n"
                f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}"
            )
        return res

    def stats(self, state: Path) -> list[dict]:
        res = self.run("simstat", env=self.env(state=state), check=True)
        return simbuild.parse_simstat(res.stdout)


_built: Sim | None = None  # one build per pytest process, however many modules import `sim`


@pytest.fixture(scope="session")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    global _built
    if _built is None:
        fixed = os.environ.get("CUDATRACE_SIM_BUILDDIR")
        if fixed:
            paths = simbuild.build_all(Path(fixed))
        else:  # once for every worker of the session
            built = shared_build(
                tmp_path_factory,
                "simbuild",
                lambda d: {k: str(v) if v else None for k, v in simbuild.build_all(d).items()},
            )
            paths = {k: Path(v) if v else None for k, v in built.items()}
        symcache = session_root(tmp_path_factory) / "symcache"
        _built = Sim(paths, tmp_path_factory.mktemp("simstate"), symcache)
    return _built
