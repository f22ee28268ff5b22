"""torch tensors crossing into DVM: zero-copy in and out, bf16 / f16 / bool, strided views,
allocation of torch outputs, and the errors a torch user can hit."""

import numpy as np
import pytest

import dvm
from conftest import kernel

torch = pytest.importorskip("torch")

F32, BF16 = dvm.DType.F32, dvm.DType.BF16


def scale_add_kernel(dtype):
    def body(kb):
        s = kb.symbol("S")
        x = kb.load("x", dtype, [s, kb.symbol("T")])
        b = kb.load("b", dtype, [kb.symbol("T")])
        kb.store("y", kb.add(kb.mul(x, 2.0), b))

    return kernel("scale_add", body)


@pytest.mark.parametrize("tdtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["f32", "f16", "bf16"])
def test_float_dtypes(tdtype):
    ck = scale_add_kernel(dvm.dtype_of(tdtype))
    g = torch.Generator().manual_seed(0)
    for shape in ((1, 1), (3, 17), (64, 40)):
        x = torch.randn(shape, generator=g).to(tdtype)
        b = torch.randn(shape[1:], generator=g).to(tdtype)
        y = ck(x, b)
        assert isinstance(y, torch.Tensor) and y.dtype == tdtype and y.shape == x.shape
        want = (x.float() * 2 + b.float()).to(tdtype)
        tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}[tdtype]
        torch.testing.assert_close(y.float(), want.float(), rtol=tol, atol=tol)


def test_bool_and_int():
    def body(kb):
        n = kb.symbol("N")
        m = kb.load("m", dvm.DType.BOOL, [n])
        i = kb.load("i", dvm.DType.I64, [n])
        kb.store("y", kb.select(m, i, kb.unary(dvm.UnaryOp.NEG, i)))
        kb.store("any", kb.max(m, 0))

    ck = kernel("bool_int", body)
    m = torch.tensor([True, False, True, False])
    i = torch.arange(4, dtype=torch.int64)
    y, any_ = ck(m, i)
    assert y.dtype == torch.int64 and any_.dtype == torch.bool
    assert y.tolist() == [0, -1, 2, -3] and bool(any_)


def test_outputs_written_in_place_zero_copy():
    ck = scale_add_kernel(F32)
    x = torch.randn(8, 16)
    b = torch.randn(16)
    out = torch.empty(8, 16)
    ptr = out.data_ptr()
    stats = ck.run([x, b], [out])
    assert out.data_ptr() == ptr
    torch.testing.assert_close(out, x * 2 + b)
    assert not stats.cache_hit
    # In place on the input itself: both cross as the same memory.
    expect = x * 2 + b
    ck.run([x, b], [x])
    torch.testing.assert_close(x, expect)


def test_strided_torch_views():
    ck = scale_add_kernel(F32)
    base = torch.randn(20, 30)
    b = torch.randn(60)[::4]  # stride 4, 15 elements
    x = base.t()[5:20:1, 2:20:2]  # transposed with an offset and a step
    assert not x.is_contiguous() and x.storage_offset() > 0
    out_base = torch.zeros(30, 40)
    out = out_base[::2, 3:12]
    torch.testing.assert_close(ck(x, b[:9]), x * 2 + b[:9])
    ck.run([x, b[:9]], [out])
    torch.testing.assert_close(out, x * 2 + b[:9])
    mask = torch.zeros_like(out_base, dtype=torch.bool)
    mask[::2, 3:12] = True
    assert torch.all(out_base[~mask] == 0)


def test_expanded_input():
    ck = scale_add_kernel(F32)
    row = torch.randn(1, 6)
    x = row.expand(5, 6)  # stride 0
    b = torch.randn(6)
    torch.testing.assert_close(ck(x, b), x * 2 + b)


def test_numpy_and_torch_mix():
    ck = scale_add_kernel(F32)
    x = np.ones((2, 3), np.float32)
    b = torch.ones(3)
    y = ck(x, b)  # any torch input: torch output
    assert isinstance(y, torch.Tensor) and y.tolist() == [[3.0] * 3] * 2
    out = np.empty((2, 3), np.float32)
    ck.run([torch.from_numpy(x), b.numpy()], [torch.from_numpy(out)])
    assert out.tolist() == [[3.0] * 3] * 2  # written through torch's view of numpy memory


def test_torch_errors():
    ck = scale_add_kernel(F32)
    x = torch.randn(2, 3)
    b = torch.randn(3)
    with pytest.raises(dvm.DvmError, match="dtype f16, expected f32"):
        ck(x.half(), b.half())
    with pytest.raises(dvm.DvmError, match="unsupported element type"):
        ck(x.double(), b.double())
    with pytest.raises(dvm.DvmError, match="expected a numpy array or a torch CPU tensor"):
        ck(x.tolist(), b)
    # A tensor that requires grad is read as data (DVM records no autograd graph).
    y = ck(x.clone().requires_grad_(), b)
    assert not y.requires_grad
    torch.testing.assert_close(y, x * 2 + b)
    with pytest.raises(dvm.DvmError, match=r"output 'y' has shape \[3, 2\]"):
        ck.run([torch.randn(2, 3), b], [torch.empty(3, 2)])
    with pytest.raises(dvm.DvmError, match="input 0 .'x'. is on device 'meta'"):
        ck(torch.empty(2, 3, device="meta"), b)


def test_parameters_and_empty_tensors():
    ck = scale_add_kernel(F32)
    w = torch.nn.Parameter(torch.randn(4, 5))
    b = torch.nn.Parameter(torch.randn(5))
    torch.testing.assert_close(ck(w, b), (w * 2 + b).detach())
    y = ck(torch.empty(0, 5), torch.randn(5))
    assert y.shape == (0, 5)


def test_concurrent_calls_with_torch_threads():
    import threading

    ck = scale_add_kernel(F32)
    xs = [torch.randn(32 + i, 64) for i in range(3)]
    b = torch.randn(64)
    outs = [torch.empty_like(x) for x in xs]

    def work(i):
        for _ in range(10):
            ck.run([xs[i], b], [outs[i]])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, o in zip(xs, outs):
        torch.testing.assert_close(o, x * 2 + b)
