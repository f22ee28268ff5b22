import math

import numpy as np
import pytest

import dvm

NP = {
    dvm.DType.F32: np.float32,
    dvm.DType.F16: np.float16,
    dvm.DType.I32: np.int32,
    dvm.DType.I64: np.int64,
    dvm.DType.BOOL: np.bool_,
}

_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x):
    return _erf(np.asarray(x, dtype=np.float64))


def tol(dtype):
    """(rtol, atol) of a result stored in `dtype` (f16 rounds to 11 bits)."""
    return {dvm.DType.F16: (2e-3, 2e-3), dvm.DType.BF16: (1e-2, 1e-2)}.get(dtype, (2e-5, 2e-6))


def random_array(rng, shape, dtype, low=-3.0, high=3.0):
    if dtype == dvm.DType.BOOL:
        return rng.random(shape) < 0.5
    if dtype in (dvm.DType.I32, dvm.DType.I64):
        return rng.integers(int(low) * 3, int(high) * 3 + 1, size=shape).astype(NP[dtype])
    return rng.uniform(low, high, size=shape).astype(NP[dtype])


def kernel(name, body, **compile_kwargs):
    """Builds with body(kb) and compiles."""
    kb = dvm.KernelBuilder(name)
    body(kb)
    return dvm.compile(kb.build(), **compile_kwargs)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
