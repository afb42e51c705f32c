"""PyTorch allocations of known sizes, from named functions (GPU suite, tests/gpu/test_gpu.py).

Run with the default caching allocator (cudaMalloc -> cuMemAlloc_v2, one call per segment) and
with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (cuMemCreate + cuMemMap). Prints one JSON
object per line:
  {"event": "start", ...versions, "alloc_conf": ...}
  {"event": "meminfo", "free": F, "total": T}           torch.cuda.mem_get_info()
  {"event": "tensor", "name": N, "bytes": B, "ptr": P}  a tensor allocated (P = data_ptr())
  {"event": "freed", "name": N, "ptr": P}               its last reference dropped
  {"event": "stats", "when": W, "allocated": A, "reserved": R, ...}
  {"event": "empty_cache"}                              cached free segments given back
  {"event": "done"}
"""

import json
import os
import sys

import torch

GiB = 1 << 30
MiB = 1 << 20


def emit(**kw):
    print(json.dumps(kw), flush=True)


def allocate_big_tensor(nbytes):
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def allocate_activations():
    a = torch.empty(64 * MiB // 4, dtype=torch.float32, device="cuda")
    b = torch.zeros(24 * MiB // 4, dtype=torch.float32, device="cuda")
    c = torch.ones(1000, dtype=torch.float32, device="cuda")  # small pool (2 MiB segment)
    return {"act64": a, "act24": b, "small": c}


def stats(when):
    emit(
        event="stats",
        when=when,
        allocated=torch.cuda.memory_allocated(),
        reserved=torch.cuda.memory_reserved(),
        max_allocated=torch.cuda.max_memory_allocated(),
        max_reserved=torch.cuda.max_memory_reserved(),
    )


def main():
    if not torch.cuda.is_available():
        print("torch_alloc: CUDA is not available to torch", file=sys.stderr)
        return 2
    torch.cuda.init()
    emit(
        event="start",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        device=torch.cuda.get_device_name(0),
        alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    )
    free, total = torch.cuda.mem_get_info()
    emit(event="meminfo", free=free, total=total)

    big = allocate_big_tensor(1 * GiB)
    emit(event="tensor", name="big", bytes=big.numel() * big.element_size(), ptr=big.data_ptr())
    acts = allocate_activations()
    for name, t in acts.items():
        emit(event="tensor", name=name, bytes=t.numel() * t.element_size(), ptr=t.data_ptr())
    torch.cuda.synchronize()
    stats("allocated")

    p = acts["act64"].data_ptr()
    del acts["act64"]
    emit(event="freed", name="act64", ptr=p)
    torch.cuda.synchronize()
    stats("after_free")
    torch.cuda.empty_cache()  # gives act64's segment back to the driver
    emit(event="empty_cache")
    stats("after_empty_cache")
    free, total = torch.cuda.mem_get_info()
    emit(event="meminfo", free=free, total=total)
    del big, acts
    emit(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
