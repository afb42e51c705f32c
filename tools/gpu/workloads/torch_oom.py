"""Allocate tensors until torch.cuda.OutOfMemoryError; print where it happened (GPU suite).

Run under `cudatrace run --budget 4GiB`: the budget must stop it at about 4 GiB.
  python3 torch_oom.py [--chunk-mib 256] [--limit-gib 32]
--limit-gib stops the loop without an error (exit 1) so that a budget that does not work can
never fill the device. Prints JSON lines: "start", "meminfo", then "oom" (exit 0) or "no_oom"
(exit 1).
"""

import argparse
import json
import sys

import torch

MiB = 1 << 20
GiB = 1 << 30


def emit(**kw):
    print(json.dumps(kw), flush=True)


def grow_until_oom(chunk, limit):
    held = []
    total = 0
    while total + chunk <= limit:
        try:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError as e:
            return total, held, str(e)
        total += chunk
    return total, held, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk-mib", type=int, default=256)
    ap.add_argument("--limit-gib", type=float, default=32)
    a = ap.parse_args()
    torch.cuda.init()
    emit(event="start", torch=torch.__version__, device=torch.cuda.get_device_name(0))
    free, total = torch.cuda.mem_get_info()
    emit(event="meminfo", free=free, total=total)
    chunk = a.chunk_mib * MiB
    got, held, err = grow_until_oom(chunk, int(a.limit_gib * GiB))
    st = dict(allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved())
    if err is None:
        emit(event="no_oom", allocated_bytes=got, gib=got / GiB, chunks=len(held), **st)
        return 1
    emit(
        event="oom",
        allocated_bytes=got,
        gib=got / GiB,
        chunks=len(held),
        chunk=chunk,
        message=err.splitlines()[0][:400] if err else "",
        **st,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
