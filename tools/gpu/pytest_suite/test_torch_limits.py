"""Run by tools/gpu/pytest_check.sh under `pytest --cudatrace` on a CUDA machine."""

import json
import os

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.limit_gpu_memory("64 MiB")
def test_torch_matmul_over_limit():
    a = torch.randn(2048, 2048, device="cuda")  # LINE:a 16 MiB
    b = torch.randn(2048, 2048, device="cuda")  # LINE:b 16 MiB
    c = a @ b  # LINE:mm cuBLAS handle and workspace, and 16 MiB
    d = torch.randn(4096, 4096, device="cuda")  # LINE:d 64 MiB
    torch.cuda.synchronize()
    assert c.shape == (2048, 2048) and d.shape == (4096, 4096)


def test_torch_blind_to_cupy():
    """torch.cuda.max_memory_allocated() sees only PyTorch's caching allocator: a CuPy array
    (and cuBLAS's own handle memory) are not in it; the plugin counts them."""
    cupy = pytest.importorskip("cupy")
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated()
    x = torch.ones(1024, 1024, device="cuda")  # LINE:torch4 4 MiB
    y = cupy.zeros(64 << 20, dtype=cupy.float32)  # LINE:cupy256 256 MiB
    cupy.cuda.Device().synchronize()
    seen = torch.cuda.max_memory_allocated() - before
    with open(os.environ["TORCH_FIGURE"], "w") as f:
        json.dump({"torch_max_memory_allocated": seen}, f)
    print(f"torch.cuda.max_memory_allocated() during the test: {seen} bytes")
    del x, y
