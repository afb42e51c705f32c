#!/usr/bin/env python3
"""tiny-train: a small "training" program that takes GPU memory through the CUDA driver API
(libcuda.so.1, by ctypes): the weights once, each layer's activations at every step, and a
history it never frees. It runs on a GPU, or without one on cudatrace's simulated driver:

    cudatrace run --simulated -- python3 examples/tiny-train/train.py [--layers N] [--batch N]

Its memory goes through one small allocator layer (device_alloc), as a framework's does: the
report names the code above it (load_weights, forward, remember), not the layer.
"""

from __future__ import annotations

import argparse
import ctypes
import sys

MiB = 1 << 20
cuda = ctypes.CDLL("libcuda.so.1")


def check(rc: int, what: str) -> None:
    if rc != 0:
        sys.exit(f"train.py: {what} failed (CUresult {rc})")


def init() -> None:
    check(cuda.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def device_alloc(nbytes: int) -> int:
    ptr = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), f"cuMemAlloc {nbytes}")
    return ptr.value


def device_free(ptr: int) -> None:
    check(cuda.cuMemFree_v2(ctypes.c_uint64(ptr)), "cuMemFree")


def load_weights(layers: int) -> list[int]:
    weights = []
    for _ in range(layers):
        weights.append(device_alloc(64 * MiB))
    return weights


def forward(layers: int, batch: int) -> list[int]:
    activations = []
    for _ in range(layers):
        activations.append(device_alloc(batch * 4 * MiB))
    return activations


def remember(batch: int) -> int:
    return device_alloc(batch * 2 * MiB)  # kept for "later": never freed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    init()
    weights = load_weights(args.layers)
    history = []
    for _ in range(args.steps):
        activations = forward(args.layers, args.batch)
        history.append(remember(args.batch))
        for p in activations:
            device_free(p)
    for p in weights:
        device_free(p)
    print(f"tiny-train: {args.steps} steps of {args.layers} layers, batch {args.batch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
