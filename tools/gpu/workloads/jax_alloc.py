"""JAX's first array operation: the XLA client preallocates a share of the device's memory
(75% of the total cuMemGetInfo reports, by default) in one piece (GPU suite).

Prints JSON lines: {"event": "devices", ...}, {"event": "result", "sum": S, "memory_stats": ...}.
Under `cudatrace run --budget 8GiB` the preallocation must fit the budget, since the budget is
what cuMemGetInfo reports.
"""

import json
import sys

import jax
import jax.numpy as jnp


def emit(**kw):
    print(json.dumps(kw), flush=True)


def first_array_op():
    x = jnp.arange(1000, dtype=jnp.float32)
    return float(x.sum())


def main():
    devs = jax.devices()
    emit(
        event="devices",
        devices=[str(d) for d in devs],
        backend=jax.default_backend(),
        jax=jax.__version__,
    )
    if jax.default_backend() != "gpu":
        print("jax_alloc: JAX found no GPU backend", file=sys.stderr)
        return 2
    s = first_array_op()
    stats = {}
    try:
        ms = devs[0].memory_stats() or {}
        stats = {
            k: ms[k]
            for k in (
                "bytes_limit",
                "bytes_in_use",
                "bytes_reserved",
                "peak_bytes_in_use",
                "largest_alloc_size",
                "pool_bytes",
            )
            if k in ms
        }
    except Exception as e:  # memory_stats is optional per backend
        stats = {"error": str(e)}
    emit(event="result", sum=s, expected=499500.0, memory_stats=stats)
    return 0 if s == 499500.0 else 1


if __name__ == "__main__":
    sys.exit(main())
