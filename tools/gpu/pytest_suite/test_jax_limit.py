"""Run by tools/gpu/pytest_check.sh under `pytest --cudatrace`: with XLA's default
preallocation the first array operation takes 75% of the device; the limit names the line."""

import pytest

jnp = pytest.importorskip("jax.numpy")


@pytest.mark.limit_gpu_memory("8 GiB")
def test_jax_small_array():
    x = jnp.ones(1000)  # LINE:jax
    assert float(x.sum()) == 1000.0
