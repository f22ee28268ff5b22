"""Compiling and running kernels from Python against numpy: dtypes, shapes (empty, size 1,
broadcast, strided and negative-stride views), in-place zero-copy outputs, params, stats,
errors, disassembly, threads."""

import math
import threading

import numpy as np
import pytest

import dvm
from conftest import NP, erf, kernel, random_array, tol

F32, F16, I32, I64, BOOL = (dvm.DType.F32, dvm.DType.F16, dvm.DType.I32, dvm.DType.I64,
                            dvm.DType.BOOL)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# numpy references in float64, and the input domain each op needs.
UNARY_REF = {
    dvm.UnaryOp.NEG: (np.negative, None),
    dvm.UnaryOp.ABS: (np.abs, None),
    dvm.UnaryOp.EXP: (np.exp, None),
    dvm.UnaryOp.LOG: (np.log, (0.1, 5.0)),
    dvm.UnaryOp.LOG1P: (np.log1p, (-0.5, 5.0)),
    dvm.UnaryOp.EXPM1: (np.expm1, None),
    dvm.UnaryOp.SQRT: (np.sqrt, (0.0, 9.0)),
    dvm.UnaryOp.RSQRT: (lambda x: 1.0 / np.sqrt(x), (0.1, 9.0)),
    dvm.UnaryOp.RECIPROCAL: (np.reciprocal, (0.5, 4.0)),
    dvm.UnaryOp.TANH: (np.tanh, None),
    dvm.UnaryOp.SIGMOID: (sigmoid, None),
    dvm.UnaryOp.RELU: (lambda x: np.maximum(x, 0), None),
    dvm.UnaryOp.GELU_ERF: (lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))), None),
    dvm.UnaryOp.GELU_TANH: (
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        None,
    ),
    dvm.UnaryOp.SILU: (lambda x: x * sigmoid(x), None),
    dvm.UnaryOp.ERF: (erf, None),
    dvm.UnaryOp.SIN: (np.sin, None),
    dvm.UnaryOp.COS: (np.cos, None),
    dvm.UnaryOp.FLOOR: (np.floor, None),
    dvm.UnaryOp.CEIL: (np.ceil, None),
    dvm.UnaryOp.ROUND: (np.round, None),  # half to even, as torch
    dvm.UnaryOp.TRUNC: (np.trunc, None),
    dvm.UnaryOp.SIGN: (np.sign, None),
    dvm.UnaryOp.IS_FINITE: (np.isfinite, None),
    dvm.UnaryOp.IS_NAN: (np.isnan, None),
    dvm.UnaryOp.LOGICAL_NOT: (np.logical_not, None),
}

BINARY_REF = {
    dvm.BinaryOp.ADD: np.add,
    dvm.BinaryOp.SUB: np.subtract,
    dvm.BinaryOp.MUL: np.multiply,
    dvm.BinaryOp.DIV: np.divide,
    dvm.BinaryOp.POW: np.power,
    dvm.BinaryOp.MAXIMUM: np.maximum,
    dvm.BinaryOp.MINIMUM: np.minimum,
    dvm.BinaryOp.FLOOR_DIV: np.floor_divide,
    dvm.BinaryOp.REMAINDER: np.remainder,
    dvm.BinaryOp.EQ: np.equal,
    dvm.BinaryOp.NE: np.not_equal,
    dvm.BinaryOp.LT: np.less,
    dvm.BinaryOp.LE: np.less_equal,
    dvm.BinaryOp.GT: np.greater,
    dvm.BinaryOp.GE: np.greater_equal,
    dvm.BinaryOp.LOGICAL_AND: np.logical_and,
    dvm.BinaryOp.LOGICAL_OR: np.logical_or,
}

REDUCE_REF = {
    dvm.ReduceOp.SUM: np.sum,
    dvm.ReduceOp.MEAN: np.mean,
    dvm.ReduceOp.MAX: np.max,
    dvm.ReduceOp.MIN: np.min,
    dvm.ReduceOp.PROD: np.prod,
    dvm.ReduceOp.ARG_MAX: np.argmax,
    dvm.ReduceOp.ARG_MIN: np.argmin,
}


def check(got, want, dtype):
    rtol, atol = tol(dtype)
    if dtype in (BOOL, I32, I64):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


def test_every_op_has_a_reference():
    assert set(UNARY_REF) == set(dvm.UnaryOp)
    assert set(BINARY_REF) == set(dvm.BinaryOp)
    assert set(REDUCE_REF) == set(dvm.ReduceOp)


@pytest.mark.parametrize("op", list(dvm.UnaryOp), ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_unary_float(op, dtype, rng):
    ref, domain = UNARY_REF[op]
    low, high = domain or (-3.0, 3.0)

    def body(kb):
        s = kb.symbol("S")
        kb.store("y", kb.unary(op, kb.load("x", dtype, [s, 37])))

    ck = kernel("unary", body)
    for rows in (1, 3, 64):
        x = random_array(rng, (rows, 37), dtype, low, high)
        if op == dvm.UnaryOp.ROUND:
            x[0, :4] = np.array([0.5, 1.5, -2.5, 2.4], dtype=x.dtype)
        y = ck(x)
        out_dtype = ck.kernel.output_dtypes[0]
        assert y.dtype == dvm.numpy_dtype(out_dtype) and y.shape == x.shape
        check(y, ref(x.astype(np.float64)), dtype if out_dtype != BOOL else BOOL)


@pytest.mark.parametrize("op", [dvm.UnaryOp.NEG, dvm.UnaryOp.ABS, dvm.UnaryOp.RELU,
                                dvm.UnaryOp.SIGN], ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", [I32, I64], ids=["i32", "i64"])
def test_unary_integer(op, dtype, rng):
    def body(kb):
        kb.store("y", kb.unary(op, kb.load("x", dtype, [kb.symbol("N")])))

    ck = kernel("unary_int", body)
    x = random_array(rng, (1000,), dtype)
    y = ck(x)
    assert y.dtype == NP[dtype]
    np.testing.assert_array_equal(y, UNARY_REF[op][0](x))


def binary_inputs(rng, op, dtype, shape_a, shape_b):
    a = random_array(rng, shape_a, dtype)
    b = random_array(rng, shape_b, dtype)
    if op in (dvm.BinaryOp.DIV, dvm.BinaryOp.FLOOR_DIV, dvm.BinaryOp.REMAINDER):
        b = np.where(b == 0, 1, b).astype(b.dtype)
        if dtype in (F32, F16):
            b = np.where(np.abs(b) < 0.25, 0.5, b).astype(b.dtype)
    if op == dvm.BinaryOp.POW:
        a = np.abs(a) + 0.5 if dtype in (F32, F16) else np.abs(a)
        b = (b / 2 if dtype in (F32, F16) else np.abs(b) % 4).astype(b.dtype)
        a = a.astype(NP[dtype])
    if op in (dvm.BinaryOp.EQ, dvm.BinaryOp.NE, dvm.BinaryOp.LE, dvm.BinaryOp.GE):
        b[..., ::3] = a[..., ::3]  # make ties
    return a, b


@pytest.mark.parametrize("op", list(dvm.BinaryOp), ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", [F32, F16, I32, I64], ids=["f32", "f16", "i32", "i64"])
def test_binary(op, dtype, rng):
    if op == dvm.BinaryOp.DIV and dtype in (I32, I64):
        pytest.skip("integer true division promotes; covered by test_integer_division")

    def body(kb):
        s = kb.symbol("S")
        a = kb.load("a", dtype, [s, 33])
        b = kb.load("b", dtype, [s, 33])
        kb.store("y", kb.binary(op, a, b))

    ck = kernel("binary", body)
    for rows in (1, 5, 40):
        a, b = binary_inputs(rng, op, dtype, (rows, 33), (rows, 33))
        y = ck(a, b)
        out_dtype = ck.kernel.output_dtypes[0]
        want = BINARY_REF[op](a.astype(np.float64), b.astype(np.float64)) \
            if dtype in (F32, F16) else BINARY_REF[op](a, b)
        check(y, want, out_dtype if out_dtype == BOOL else dtype)


def test_integer_division(rng):
    def body(kb):
        a = kb.load("a", I32, [kb.symbol("N")])
        b = kb.load("b", I32, [kb.symbol("N")])
        kb.store("q", kb.binary(dvm.BinaryOp.FLOOR_DIV, a, b))
        kb.store("r", kb.binary(dvm.BinaryOp.REMAINDER, a, b))

    ck = kernel("intdiv", body)
    a = np.array([7, -7, 7, -7, 0, 5], np.int32)
    b = np.array([2, 2, -2, -2, 3, 5], np.int32)
    q, r = ck(a, b)
    np.testing.assert_array_equal(q, np.floor_divide(a, b))
    np.testing.assert_array_equal(r, np.remainder(a, b))
    # A zero divisor is an error, as torch raises ZeroDivisionError (numpy gives 0).
    b[3] = 0
    with pytest.raises(dvm.DvmError, match="(floordiv|rem) by zero"):
        ck(a, b)


@pytest.mark.parametrize("op", [dvm.BinaryOp.LOGICAL_AND, dvm.BinaryOp.LOGICAL_OR],
                         ids=lambda o: o.name)
def test_bool_inputs(op, rng):
    def body(kb):
        a = kb.load("a", BOOL, [kb.symbol("N")])
        b = kb.load("b", BOOL, [kb.symbol("N")])
        kb.store("y", kb.binary(op, a, b))
        kb.store("n", kb.unary(dvm.UnaryOp.LOGICAL_NOT, a))

    ck = kernel("bools", body)
    a, b = rng.random(100) < 0.5, rng.random(100) < 0.5
    y, n = ck(a, b)
    assert y.dtype == np.bool_ and n.dtype == np.bool_
    np.testing.assert_array_equal(y, BINARY_REF[op](a, b))
    np.testing.assert_array_equal(n, ~a)


@pytest.mark.parametrize("op", list(dvm.ReduceOp), ids=lambda o: o.name)
@pytest.mark.parametrize("axis", [0, 1, -1, None], ids=["a0", "a1", "a-1", "all"])
@pytest.mark.parametrize("dtype", [F32, I32], ids=["f32", "i32"])
def test_reduce(op, axis, dtype, rng):
    arg = op in (dvm.ReduceOp.ARG_MAX, dvm.ReduceOp.ARG_MIN)
    if arg and axis is None:
        pytest.skip("argmax/argmin take exactly one axis")

    def body(kb):
        x = kb.load("x", dtype, [kb.symbol("R"), kb.symbol("C")])
        kb.store("y", kb.reduce(op, x, axis))
        kb.store("k", kb.reduce(op, x, axis, keepdims=True))

    ck = kernel("reduce", body)
    for shape in ((1, 1), (3, 70), (65, 9)):
        x = random_array(rng, shape, dtype, -1.5, 1.5)
        if op == dvm.ReduceOp.PROD and dtype == I32:
            x = np.clip(x, -2, 2)
        y, k = ck(x)
        ref = REDUCE_REF[op]
        want = ref(x.astype(np.float64) if dtype == F32 else x, axis=axis)
        want_k = ref(x.astype(np.float64) if dtype == F32 else x, axis=axis, keepdims=True)
        out = ck.kernel.output_dtypes[0]
        check(y, np.asarray(want), F32 if out in (F32, F16) else out)
        check(k, np.asarray(want_k), F32 if out in (F32, F16) else out)


def test_broadcast_size_one_and_scalars(rng):
    def body(kb):
        s, t = kb.symbol("S"), kb.symbol("T")
        a = kb.load("a", F32, [s, 1])
        b = kb.load("b", F32, [1, t])
        c = kb.load("c", F32, [])
        kb.store("y", kb.add(kb.mul(a, b), kb.sub(c, 2.0)))
        kb.store("z", kb.sub(1.0, kb.broadcast(a, [s, t])))

    ck = kernel("bcast", body)
    for s, t in ((1, 1), (1, 7), (9, 1), (17, 130)):
        a = random_array(rng, (s, 1), F32)
        b = random_array(rng, (1, t), F32)
        c = np.array(0.75, np.float32)
        y, z = ck(a, b, c)
        assert y.shape == (s, t) and z.shape == (s, t)
        check(y, a.astype(np.float64) * b + (0.75 - 2.0), F32)
        check(z, np.broadcast_to(1.0 - a.astype(np.float64), (s, t)), F32)


def test_empty_tensors():
    def body(kb):
        s = kb.symbol("S")
        x = kb.load("x", F32, [s, 4])
        kb.store("y", kb.unary(dvm.UnaryOp.EXP, x))
        kb.store("r", kb.sum(x, 1))

    ck = kernel("empty", body)
    x = np.zeros((0, 4), np.float32)
    assert ck.infer_output_shapes([x]) == [(0, 4), (0,)]
    y, r = ck(x)
    assert y.shape == (0, 4) and r.shape == (0,)


def test_empty_reduction_axis():
    def body(kb):
        kb.store("y", kb.sum(kb.load("x", F32, [3, kb.symbol("N")]), 1))

    ck = kernel("empty_axis", body)
    y = ck(np.zeros((3, 0), np.float32))
    np.testing.assert_array_equal(y, np.zeros(3, np.float32))


def strided_views(rng, shape):
    """Views of `shape` with various layouts over larger buffers."""
    base = random_array(rng, (shape[0] * 2, shape[1] * 3), F32)
    yield "contiguous", np.ascontiguousarray(base[: shape[0], : shape[1]])
    yield "rows_cols_step", base[::2, ::3]
    yield "offset", base[1 : shape[0] + 1, 2 : shape[1] + 2]
    yield "transposed", random_array(rng, shape[::-1], F32).T
    yield "reversed", base[: shape[0], : shape[1]][::-1, ::-1]
    yield "broadcast", np.broadcast_to(base[0, : shape[1]], shape)
    yield "fortran", np.asfortranarray(base[: shape[0], : shape[1]])


@pytest.mark.parametrize("layout", ["contiguous", "rows_cols_step", "offset", "transposed",
                                    "reversed", "broadcast", "fortran"])
def test_non_contiguous_inputs(layout, rng):
    def body(kb):
        s, t = kb.symbol("S"), kb.symbol("T")
        x = kb.load("x", F32, [s, t])
        kb.store("y", kb.unary(dvm.UnaryOp.TANH, kb.mul(x, 2.0)))
        kb.store("m", kb.max(x, 1))

    ck = kernel("strided", body)
    for shape in ((5, 8), (1, 33)):
        x = dict(strided_views(rng, shape))[layout]
        assert x.shape == shape
        y, m = ck(x)
        check(y, np.tanh(2.0 * x.astype(np.float64)), F32)
        check(m, x.max(axis=1).astype(np.float64), F32)


@pytest.mark.parametrize("layout", ["step", "transposed", "reversed", "column"])
def test_non_contiguous_outputs_are_written_in_place(layout, rng):
    def body(kb):
        x = kb.load("x", F32, [kb.symbol("S"), kb.symbol("T")])
        kb.store("y", kb.add(x, 1.0))

    ck = kernel("strided_out", body)
    x = random_array(rng, (6, 10), F32)
    base = np.full((12, 30), -7.0, np.float32)
    out = {
        "step": base[::2, ::3],
        "transposed": base[:10, :6].T,
        "reversed": base[:6, :10][::-1, ::-1],
        "column": base[:6, 5:15],
    }[layout]
    mask = np.zeros(base.shape, bool)
    {
        "step": mask[::2, ::3],
        "transposed": mask[:10, :6].T,
        "reversed": mask[:6, :10][::-1, ::-1],
        "column": mask[:6, 5:15],
    }[layout][...] = True
    ck.run([x], [out])
    check(out, x.astype(np.float64) + 1.0, F32)
    assert np.all(base[~mask] == -7.0)  # nothing outside the view was written


def test_outputs_are_zero_copy_and_inplace(rng):
    def body(kb):
        x = kb.load("x", F32, [kb.symbol("N")])
        kb.store("y", kb.mul(x, 3.0))

    ck = kernel("inplace", body)
    x = random_array(rng, (1000,), F32)
    expect = x * 3.0
    out = np.empty_like(x)
    ptr = out.ctypes.data
    ck.run([x], [out])
    assert out.ctypes.data == ptr
    check(out, expect.astype(np.float64), F32)
    # Input and output the same memory (identical elementwise positions are allowed):
    # only a zero-copy crossing of both can give this result.
    ck.run([x], [x])
    check(x, expect.astype(np.float64), F32)
    # Returned outputs are the arrays passed as out=.
    y = np.empty_like(x)
    assert ck(x, out=y) is y


def test_inputs_are_zero_copy(rng):
    # An input view into a buffer that the kernel's output also covers: the kernel reads the
    # input through the same pointer numpy gives (a copy would read the stale values).
    def body(kb):
        x = kb.load("x", F32, [kb.symbol("N")])
        kb.store("y", kb.add(x, 1.0))

    ck = kernel("zero_copy_in", body)
    buf = np.arange(8, dtype=np.float32)
    ck.run([buf[::2]], [buf[::2]])
    np.testing.assert_array_equal(buf, [1, 1, 3, 3, 5, 5, 7, 7])


def test_f16(rng):
    def body(kb):
        s = kb.symbol("S")
        x = kb.load("x", F16, [s, 64])
        g = kb.load("g", F16, [64])
        mu = kb.mean(x, -1, keepdims=True)
        d = kb.sub(x, mu)
        var = kb.mean(kb.mul(d, d), -1, keepdims=True)
        y = kb.mul(kb.mul(d, kb.unary(dvm.UnaryOp.RSQRT, kb.add(var, 1e-5))), g)
        kb.store("y", y, F16)
        kb.store("y32", y, F32)

    ck = kernel("layernorm16", body)
    x = random_array(rng, (7, 64), F16)
    g = random_array(rng, (64,), F16)
    y, y32 = ck(x, g)
    assert y.dtype == np.float16 and y32.dtype == np.float32
    xd = x.astype(np.float64)
    want = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * g
    check(y, want, F16)
    np.testing.assert_allclose(y32, want, rtol=1e-4, atol=1e-4)


def test_casts_and_select(rng):
    def body(kb):
        n = kb.symbol("N")
        x = kb.load("x", F32, [n])
        i = kb.load("i", I64, [n])
        c = kb.binary(dvm.BinaryOp.GT, x, 0.0)
        kb.store("sel", kb.select(c, x, kb.cast(i, F32)))
        kb.store("trunc", kb.cast(x, I32))
        kb.store("mask", c)
        kb.store("count", kb.sum(c, 0))

    ck = kernel("casts", body)
    x = random_array(rng, (50,), F32)
    i = random_array(rng, (50,), I64)
    sel, trunc, mask, count = ck(x, i)
    np.testing.assert_array_equal(sel, np.where(x > 0, x, i.astype(np.float32)))
    np.testing.assert_array_equal(trunc, x.astype(np.int32))
    np.testing.assert_array_equal(mask, x > 0)
    assert count.dtype == np.int64 and count == np.sum(x > 0)


def test_data_movement(rng):
    def body(kb):
        s = kb.symbol("S")
        x = kb.load("x", F32, [s, 6])
        kb.store("perm", kb.permute(kb.reshape(x, [s, 2, 3]), [2, 0, 1]))
        kb.store("sl", kb.slice(x, 1, 1, None, 2))
        kb.store("cat", kb.concat([x, kb.slice(x, 1, 0, 2)], 1))
        kb.store("flat", kb.reshape(x, [-1]))

    ck = kernel("movement", body)
    for s in (1, 4):
        x = random_array(rng, (s, 6), F32)
        perm, sl, cat, flat = ck(x)
        np.testing.assert_array_equal(perm, x.reshape(s, 2, 3).transpose(2, 0, 1))
        np.testing.assert_array_equal(sl, x[:, 1::2])
        np.testing.assert_array_equal(cat, np.concatenate([x, x[:, :2]], 1))
        np.testing.assert_array_equal(flat, x.reshape(-1))


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
def test_matmul_with_epilogue(ta, tb, rng):
    def body(kb):
        m, k = kb.symbol("M"), kb.symbol("K")
        a = kb.load("a", F32, [k, m] if ta else [m, k])
        b = kb.load("b", F32, [40, k] if tb else [k, 40])
        bias = kb.load("bias", F32, [40])
        kb.store("y", kb.unary(dvm.UnaryOp.RELU, kb.add(kb.matmul(a, b, ta, tb), bias)))

    ck = kernel("mm", body)
    for m, k in ((1, 1), (5, 17), (33, 64)):
        a = random_array(rng, (k, m) if ta else (m, k), F32)
        b = random_array(rng, (40, k) if tb else (k, 40), F32)
        bias = random_array(rng, (40,), F32)
        am = a.T if ta else a
        bm = b.T if tb else b
        want = np.maximum(am.astype(np.float64) @ bm + bias, 0)
        np.testing.assert_allclose(ck(a, b, bias), want, rtol=1e-4, atol=1e-4)


def test_params_never_reencode(rng):
    def body(kb):
        x = kb.load("x", F32, [kb.symbol("N")])
        a = kb.param("alpha", F32)
        k = kb.param("k", I32)
        kb.store("y", kb.add(kb.mul(x, a), kb.cast(k, F32)))

    ck = kernel("params", body)
    x = random_array(rng, (100,), F32)
    out = np.empty_like(x)
    first = ck.run([x], [out], [2.0, 3])
    check(out, x.astype(np.float64) * 2 + 3, F32)
    assert not first.cache_hit and first.encode_us > 0 and first.programs >= 1
    again = ck.run([x], [out], (np.float32(-1.5), np.int64(7)))
    check(out, x.astype(np.float64) * -1.5 + 7, F32)
    assert again.cache_hit and again.encode_us == 0
    assert ck.cached_programs == 1
    check(ck(x, params=[0.5, 0]), x.astype(np.float64) * 0.5, F32)
    with pytest.raises(dvm.DvmError, match="2 params; got 1, 1, 0"):
        ck.run([x], [out])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 2.0**40, 2**40, 1.5])
def test_integer_param_out_of_range_is_an_error(rng, bad):
    def body(kb):
        kb.store("y", kb.add(kb.load("x", I32, [kb.symbol("N")]), kb.param("k", I32)))

    ck = kernel("int_param", body)
    x = np.arange(5, dtype=np.int32)
    out = np.full(5, -7, dtype=np.int32)
    with pytest.raises(dvm.DvmError, match=r"param 'k' \(i32\) cannot hold"):
        ck.run([x], [out], [bad])
    assert np.all(out == -7)
    ck.run([x], [out], [3.0])  # an integral float is fine
    np.testing.assert_array_equal(out, x + 3)


@pytest.mark.parametrize("bad", ["3", None, [1], 2**70])
def test_param_of_the_wrong_type_names_the_param(bad):
    def body(kb):
        x = kb.load("x", F32, [kb.symbol("N")])
        kb.store("y", kb.mul(x, kb.param("alpha", F32)))

    ck = kernel("typed_param", body)
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(dvm.DvmError, match=r"param 0 \('alpha'\): expected an int or a float"):
        ck.run([x], [np.empty_like(x)], [bad])


def test_negative_bit_tensors_are_read_as_their_values():
    torch = pytest.importorskip("torch")

    def body(kb):
        kb.store("y", kb.add(kb.load("x", F32, [kb.symbol("N")]), 1.0))

    ck = kernel("neg_bit", body)
    base = torch.arange(6, dtype=torch.float32)
    x = torch._neg_view(base)
    assert x.is_neg()
    out = torch.empty(6)
    ck.run([x], [out])
    torch.testing.assert_close(out, -base + 1.0)
    with pytest.raises(dvm.DvmError, match="negative bit"):
        ck.run([base], [torch._neg_view(torch.empty(6))])


def test_stats_and_cache_per_shape(rng):
    def body(kb):
        kb.store("y", kb.unary(dvm.UnaryOp.EXP, kb.load("x", F32, [kb.symbol("N")])))

    ck = kernel("cache", body)
    for n in (10, 20, 10, 20):
        x = random_array(rng, (n,), F32)
        y, stats = ck(x, stats=True)
        check(y, np.exp(x.astype(np.float64)), F32)
        assert stats.bytes_moved > 0 and stats.blocks >= 1
        assert "cache_hit" in repr(stats)
    assert ck.cached_programs == 2


def test_compile_options_and_reference(rng):
    def body(kb):
        s = kb.symbol("S")
        x = kb.load("x", F32, [s, 300])
        kb.store("y", kb.unary(dvm.UnaryOp.SILU, kb.sub(x, kb.max(x, 1, keepdims=True))))

    opts = dvm.CompileOptions(num_threads=1, cache_capacity=4)
    assert opts.num_threads == 1 and opts.cache_capacity == 4
    kb = dvm.KernelBuilder("ref")
    body(kb)
    k = kb.build()
    ck = dvm.CompiledKernel.create(k, opts)
    assert ck.kernel.name == "ref"
    x = random_array(rng, (9, 300), F32)
    y = ck(x)
    ref = np.empty_like(y)
    dvm.run_reference(k, [x], [ref])
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_disassembly():
    def body(kb):
        x = kb.load("x", F32, [kb.symbol("S"), 8])
        b = kb.load("b", F32, [8])
        kb.store("y", kb.unary(dvm.UnaryOp.GELU_ERF, kb.add(x, b)))

    ck = kernel("bias_gelu", body)
    x, b = np.ones((5, 8), np.float32), np.ones(8, np.float32)
    y = np.empty((5, 8), np.float32)
    text = ck.disassemble([x, b], [y])
    assert text.startswith("program 'bias_gelu")
    assert "gelu" in text and "extent 5" in text
    assert ck.cached_programs == 1  # disassembling encoded (and cached) the program


def test_run_errors(rng):
    def body(kb):
        x = kb.load("x", F32, [kb.symbol("S"), 4])
        kb.store("y", kb.add(x, 1.0))

    ck = kernel("errs", body)
    x = np.zeros((3, 4), np.float32)
    y = np.zeros((3, 4), np.float32)
    cases = [
        (lambda: ck.run([], [y]), "expected 1 inputs, 1 outputs, 0 params; got 0, 1, 0"),
        (lambda: ck.run([x, x], [y]), "got 2, 1, 0"),
        (lambda: ck.run([x], []), "got 1, 0, 0"),
        (lambda: ck.run([x], [y, y]), "got 1, 2, 0"),
        (lambda: ck.run([np.zeros((3, 5), np.float32)], [y]), "input 'x' dim 1 is 5"),
        (lambda: ck.run([np.zeros(4, np.float32)], [y]), "rank"),
        (lambda: ck.run([x], [np.zeros((3, 5), np.float32)]), r"shape \[3, 5\], expected \[3, 4\]"),
        (lambda: ck.run([x.astype(np.int32)], [y]), "dtype i32, expected f32"),
        (lambda: ck.run([x], [y.astype(np.float16)]), "dtype f16, expected f32"),
        (lambda: ck.run([x.astype(np.float64)], [y]), "unsupported element type"),
        (lambda: ck.run([x.astype(np.complex64)], [y]), "unsupported element type"),
        (lambda: ck.run([[1.0, 2.0]], [y]), "input 0 .'x'.: expected a numpy array"),
        (lambda: ck.run([x], [None]), "output 0 .'y'.: expected"),
        (lambda: ck.run(x, [y]), "list or tuple"),
        (lambda: ck.run([x], [np.broadcast_to(np.zeros(4, np.float32), (3, 4))]), "writable"),
        (lambda: ck(x, params=[1.0]), "got 1, 1, 1"),
    ]
    for call, match in cases:
        with pytest.raises(dvm.DvmError, match=match) as e:
            call()
        assert e.value.code in (dvm.StatusCode.INVALID_ARGUMENT, dvm.StatusCode.OUT_OF_RANGE)
        assert e.value.message in str(e.value)
    assert np.all(y == 0)  # on error no output element is written


def test_reshape_mismatch_is_a_run_error():
    def body(kb):
        kb.store("y", kb.reshape(kb.load("x", F32, [kb.symbol("N")]), [-1, 4]))

    ck = kernel("reshape_err", body)
    assert ck(np.zeros(8, np.float32)).shape == (2, 4)
    with pytest.raises(dvm.DvmError, match="reshape"):
        ck(np.zeros(6, np.float32))


def test_bf16_needs_torch_for_outputs():
    def body(kb):
        kb.store("y", kb.load("x", F32, [2]), dvm.DType.BF16)

    ck = kernel("bf16_out", body)
    try:
        import torch
    except ImportError:
        with pytest.raises(ImportError):
            ck(np.ones(2, np.float32))
        return
    y = ck(np.ones(2, np.float32))
    assert y.dtype == torch.bfloat16 and y.tolist() == [1.0, 1.0]


def test_concurrent_calls_release_the_gil(rng):
    def body(kb):
        x = kb.load("x", F32, [kb.symbol("S"), 256])
        kb.store("y", kb.unary(dvm.UnaryOp.TANH, kb.mul(x, 0.5)))

    ck = kernel("threads", body, num_threads=1)
    xs = [random_array(rng, (64 + 8 * i, 256), F32) for i in range(4)]
    results = [None] * len(xs)
    errors = []

    def work(i):
        try:
            for _ in range(20):
                results[i] = ck(xs[i])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for x, y in zip(xs, results):
        check(y, np.tanh(0.5 * x.astype(np.float64)), F32)
