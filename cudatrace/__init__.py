"""cudatrace: see, explain and bound GPU memory in programs you did not write.

The in-process API (cudatrace/api.py, docs/pytest.md) is reached from here, loaded on first
use so that `import cudatrace` stays cheap: active(), stats(), snapshot(), mark(), track(),
NotTracedError.
"""

__version__ = "0.1.0"

_API = ("active", "stats", "snapshot", "mark", "track", "NotTracedError", "Tracker", "Mark")


def __getattr__(name: str) -> object:
    if name in _API:
        # loaded by name on first use: the API's own imports (analyze/, which reads
        # __version__ from here) never run at `import cudatrace`
        import importlib

        return getattr(importlib.import_module("cudatrace.api"), name)
    raise AttributeError(f"module 'cudatrace' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_API))
