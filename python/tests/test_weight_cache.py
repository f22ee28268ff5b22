"""Constant matmul operands (dvm.constant / dvm.Constant): packed once, reused, repacked when
the weight is written; results always match the reference."""

import numpy as np
import pytest
import torch

import dvm


def linear_exe():
    """y = x @ w with w [96, 160] ([K, N]: packed on every CPU; an f32 w [N, K] used
    transposed is read in place where the GEMM can, never packed)."""
    gb = dvm.GraphBuilder("linear")
    s = gb.symbol("S")
    x = gb.input("x", dvm.DType.F32, [s, 96])
    w = gb.input("w", dvm.DType.F32, [96, 160])
    gb.output("y", gb.matmul(x, w))
    return dvm.Executable.compile(gb.build())


@pytest.fixture(autouse=True)
def fresh_cache():
    dvm.clear_weight_cache()
    yield
    dvm.clear_weight_cache()


def test_constant_weight_is_packed_once_and_follows_writes():
    exe = linear_exe()
    w = torch.randn(96, 160)
    for rows in (7, 33, 64, 120):
        x = torch.randn(rows, 96)
        (y,) = exe(x, dvm.constant(w))
        torch.testing.assert_close(y, x @ w, rtol=1e-4, atol=1e-4)
    s = dvm.weight_cache_stats()
    assert s.packs == 1 and s.entries == 1 and s.hits >= 3
    # An in-place write bumps torch's version counter: dvm.constant() gives a new version.
    with torch.no_grad():
        w.mul_(-2.0)
    x = torch.randn(40, 96)
    (y,) = exe(x, dvm.constant(w))
    torch.testing.assert_close(y, x @ w, rtol=1e-4, atol=1e-4)
    s = dvm.weight_cache_stats()
    assert s.packs == 2 and s.replaced == 1 and s.entries == 1  # the stale panels went at once


def test_numpy_constant_needs_explicit_version():
    exe = linear_exe()
    w = np.random.default_rng(0).standard_normal((96, 160), dtype=np.float32)
    x = np.random.default_rng(1).standard_normal((20, 96), dtype=np.float32)
    with pytest.raises(dvm.DvmError):
        dvm.constant(w)
    with pytest.raises(dvm.DvmError):
        dvm.Constant(w, 0)
    (y,) = exe(x, dvm.Constant(w, 7))
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)
    assert dvm.weight_cache_stats().packs == 1


def test_constant_output_is_an_error_and_capacity_zero_disables():
    exe = linear_exe()
    w = torch.randn(96, 160)
    x = torch.randn(20, 96)
    with pytest.raises(dvm.DvmError, match="Constant"):
        exe.run([x, w], [dvm.constant(torch.empty(20, 160))])
    dvm.set_weight_cache_capacity(0)
    try:
        (y,) = exe(x, dvm.constant(w))
        torch.testing.assert_close(y, x @ w, rtol=1e-4, atol=1e-4)
        assert dvm.weight_cache_stats().entries == 0
    finally:
        dvm.set_weight_cache_capacity(1 << 30)
