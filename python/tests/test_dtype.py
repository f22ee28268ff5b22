import numpy as np
import pytest

import dvm


def test_dtype_members_follow_dtype_names():
    assert [d.name for d in dvm.DType] == ["F32", "F16", "BF16", "I32", "I64", "BOOL"]
    for d in dvm.DType:
        assert dvm.dtype_name(d).upper() == d.name


def test_sizes_and_classes():
    sizes = {
        dvm.DType.F32: 4,
        dvm.DType.F16: 2,
        dvm.DType.BF16: 2,
        dvm.DType.I32: 4,
        dvm.DType.I64: 8,
        dvm.DType.BOOL: 1,
    }
    for d, s in sizes.items():
        assert dvm.dtype_size(d) == s
    assert dvm.is_float(dvm.DType.BF16) and not dvm.is_float(dvm.DType.I32)
    assert dvm.is_integer(dvm.DType.I64) and not dvm.is_integer(dvm.DType.BOOL)
    assert dvm.compute_type(dvm.DType.F16) == dvm.CType.F32
    assert dvm.compute_type(dvm.DType.BOOL) == dvm.CType.I32


@pytest.mark.parametrize(
    "a,b,r",
    [
        ("BOOL", "I32", "I32"),
        ("I32", "I64", "I64"),
        ("I64", "F16", "F16"),
        ("F16", "BF16", "F32"),
        ("F16", "F32", "F32"),
    ],
)
def test_promote_types(a, b, r):
    assert dvm.promote_types(dvm.DType[a], dvm.DType[b]) == dvm.DType[r]
    assert dvm.promote_types(dvm.DType[b], dvm.DType[a]) == dvm.DType[r]


def test_numpy_mapping_round_trips():
    for d in dvm.DType:
        if d == dvm.DType.BF16:
            with pytest.raises(dvm.DvmError, match="bf16"):
                dvm.numpy_dtype(d)
            continue
        nd = dvm.numpy_dtype(d)
        assert dvm.dtype_of(nd) == d
        assert dvm.dtype_of(np.zeros(2, nd)) == d
    with pytest.raises(dvm.DvmError, match="float64"):
        dvm.dtype_of(np.float64)


def test_torch_mapping_round_trips():
    torch = pytest.importorskip("torch")
    for d in dvm.DType:
        t = dvm.torch_dtype(d)
        assert dvm.dtype_of(t) == d
        assert dvm.dtype_of(torch.zeros(2, dtype=t)) == d
    with pytest.raises(dvm.DvmError):
        dvm.dtype_of(torch.float64)
