"""`cudatrace export`: a trace in the formats other tools open.

One module per format, each a small `Exporter` (memray's reporters are the model): a name, a
one-line description, the tool that opens its files, the optional packages it needs, and
`write(view, path)`. Every exporter reads the same `View` (view.py): the moment chosen with
--at (parsed as `report --at` is), what is live then, and each allocation's frames as
`report` attributes them (the same Analysis, the same Stacks, CUDA's own frames folded). So
an export's total at the moment is `report --json`'s total_live_bytes at that moment.

    folded       flamegraph.pl, speedscope, Perfetto UI       (no extra packages)
    pprof        go tool pprof, pprof-compatible services     (protobuf)
    speedscope   speedscope.app                               (no extra packages)
    memory-viz   pytorch.org/memory_viz, torch.cuda._memory_viz (no extra packages)
    perfetto     ui.perfetto.dev, trace_processor             (perfetto, protobuf)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ...errors import CudatraceError

EXTRA = "export"  # pip install 'cudatrace[export]'


class ExportError(CudatraceError):
    """An export that cannot be made: exit status 2, with the message."""


@dataclass(frozen=True)
class Exporter:
    name: str  # the --format value
    module: str  # module of this package that writes it
    description: str
    opens_with: str  # the tool that opens the file
    suffix: str  # the usual file name ending
    needs: tuple[str, ...] = ()  # importable modules that the `export` extra installs

    def load(self) -> ModuleType:
        missing = [m for m in self.needs if not _importable(m)]
        if missing:
            raise ExportError(
                "--format {} needs {}: pip install 'cudatrace[{}]'".format(
                    self.name, " and ".join(missing), EXTRA
                )
            )
        return importlib.import_module("." + self.module, __name__)

    def write(self, view: object, path: Path) -> dict[str, int]:
        """Write the file of a view.View (typed in each exporter's module: view.py imports this
        package); returns a short summary (what was written, for the command's line: how many
        of each thing)."""
        write: Callable[[object, Path], dict[str, int]] = self.load().write
        return write(view, Path(path))


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False


EXPORTERS = {
    e.name: e
    for e in (
        Exporter(
            "folded",
            "folded",
            "folded stacks: 'root;...;leaf bytes' per line",
            "flamegraph.pl, speedscope, Perfetto UI",
            ".folded",
        ),
        Exporter(
            "pprof",
            "pprof",
            "gzipped profile.proto: inuse_space/objects at the moment, "
            "alloc_space/objects over the run",
            "go tool pprof",
            ".pb.gz",
            ("google.protobuf",),
        ),
        Exporter(
            "speedscope",
            "speedscope",
            "speedscope JSON: a sampled profile of the bytes live at the moment",
            "speedscope.app",
            ".speedscope.json",
        ),
        Exporter(
            "memory-viz",
            "memory_viz",
            "PyTorch memory snapshot pickle: segments and alloc/free traces per device",
            "pytorch.org/memory_viz, torch.cuda._memory_viz",
            ".pickle",
        ),
        Exporter(
            "perfetto",
            "perfetto",
            "Perfetto protobuf trace: live bytes per device and "
            "process, large allocations and denials",
            "ui.perfetto.dev",
            ".perfetto-trace",
            ("google.protobuf", "perfetto"),
        ),
    )
}

FORMATS = tuple(EXPORTERS)


def get(name: str) -> Exporter:
    try:
        return EXPORTERS[name]
    except KeyError:
        raise ExportError(
            "unknown export format {!r} (one of: {})".format(name, ", ".join(FORMATS))
        ) from None
