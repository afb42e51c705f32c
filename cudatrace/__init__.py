"""cudatrace: see, explain and bound GPU memory in programs you did not write."""

__version__ = "0.1.0"
