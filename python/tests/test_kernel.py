"""The kernel builder from Python: enums derived from ops.def, shapes and dtypes of values,
build errors, the text form."""

import pathlib
import re

import pytest

import dvm

OPS_DEF = pathlib.Path(__file__).resolve().parents[2] / "include" / "dvm" / "ops.def"


def ops_def_entries(kind):
    text = OPS_DEF.read_text()
    return re.findall(rf'^DVM_{kind}\((\w+), "([\w.]+)"', text, flags=re.M)


def snake_upper(camel):
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", camel).upper()


@pytest.mark.parametrize(
    "enum,kind,name_fn",
    [
        (dvm.UnaryOp, "UNARY", dvm.unary_op_name),
        (dvm.BinaryOp, "BINARY", dvm.binary_op_name),
        (dvm.ReduceOp, "REDUCE", dvm.reduce_op_name),
    ],
)
def test_op_enums_mirror_ops_def(enum, kind, name_fn):
    if not OPS_DEF.exists():
        pytest.skip("ops.def not found (installed without the source tree)")
    entries = ops_def_entries(kind)
    assert len(entries) == len(enum) > 0
    for (name, mnemonic), member in zip(entries, enum):
        assert member.name == snake_upper(name)
        assert name_fn(member) == mnemonic


def test_status_codes():
    assert [c.name for c in dvm.StatusCode] == [
        "OK",
        "INVALID_ARGUMENT",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "FAILED_PRECONDITION",
        "INTERNAL",
    ]
    assert dvm.status_code_name(dvm.StatusCode.OUT_OF_RANGE) == "OutOfRange"
    assert issubclass(dvm.DvmError, Exception)


def test_op_enum_names():
    assert dvm.UnaryOp.GELU_ERF.name == "GELU_ERF"
    assert dvm.unary_op_name(dvm.UnaryOp.GELU_ERF) == "gelu"
    assert dvm.BinaryOp.FLOOR_DIV in dvm.BinaryOp
    assert dvm.ReduceOp.ARG_MAX in dvm.ReduceOp


def test_dims_and_values():
    kb = dvm.KernelBuilder("k")
    s = kb.symbol("S")
    assert s.is_symbol and s.symbol_id == 0
    assert kb.symbol("S") == s  # same name, same symbol
    t = kb.symbol("T")
    assert t.symbol_id == 1
    assert dvm.Dim(5).value == 5 and not dvm.Dim(5).is_symbol
    assert repr(dvm.Dim(5)) == "Dim(5)" and repr(s) == "Dim.symbol(0)"
    x = kb.load("x", dvm.DType.F16, [s, 4])
    assert x.valid and repr(x) == f"Value(%{x.id})"
    assert kb.shape(x) == [s, dvm.Dim(4)]
    assert kb.dtype(x) == dvm.DType.F16 and kb.rank(x) == 2
    y = kb.load("y", dvm.DType.F32, [t, 1, 4])
    z = kb.add(x, y)  # f16 + f32 -> f32, [S,4] with [T,1,4] -> [T,S,4]
    assert kb.dtype(z) == dvm.DType.F32
    assert kb.shape(z) == [t, s, dvm.Dim(4)]
    assert kb.shape(kb.sum(z, -1)) == [t, s]
    assert kb.shape(kb.sum(z, [0, 2], keepdims=True)) == [dvm.Dim(1), s, dvm.Dim(1)]
    assert kb.shape(kb.sum(z)) == []
    assert kb.dtype(kb.reduce(dvm.ReduceOp.ARG_MAX, z, 1)) == dvm.DType.I64
    assert kb.dtype(kb.binary(dvm.BinaryOp.LT, z, 0.5)) == dvm.DType.BOOL
    assert kb.shape(kb.permute(z, [2, 0, 1])) == [dvm.Dim(4), t, s]
    assert kb.shape(kb.transpose(z, 0, 2)) == [dvm.Dim(4), s, t]
    assert kb.shape(kb.slice(z, 2, 1)) == [t, s, dvm.Dim(3)]
    assert kb.shape(kb.slice(z, 2, 0, None, 2)) == [t, s, dvm.Dim(2)]
    assert kb.rank(kb.reshape(kb.load("w", dvm.DType.F32, [6, 4]), [-1, 8])) == 2


def test_kernel_signature_and_text():
    kb = dvm.KernelBuilder("sig")
    s = kb.symbol("S")
    x = kb.load("x", dvm.DType.F16, [s])
    a = kb.param("alpha", dvm.DType.F32)
    kb.store("y", kb.mul(x, a))
    kb.store("mask", kb.binary(dvm.BinaryOp.GT, x, 0.0))
    kb.store("y16", kb.add(x, 1.0), dvm.DType.F16)
    k = kb.build()
    assert (k.name, k.num_inputs, k.num_outputs, k.num_params) == ("sig", 1, 3, 1)
    assert k.symbols == ["S"]
    assert k.input_names == ["x"] and k.input_dtypes == [dvm.DType.F16]
    assert k.output_names == ["y", "mask", "y16"]
    assert k.output_dtypes == [dvm.DType.F32, dvm.DType.BOOL, dvm.DType.F16]
    assert k.param_names == ["alpha"] and k.param_dtypes == [dvm.DType.F32]
    text = str(k)
    assert text.startswith("kernel sig\n") and "load 'x'" in text and "store mask" in text
    assert k.to_string() == text
    assert "sig" in repr(k)


def test_build_errors_name_op_and_dims():
    kb = dvm.KernelBuilder("bad")
    x = kb.load("x", dvm.DType.F32, [3, 4])
    y = kb.load("y", dvm.DType.F32, [5])
    kb.store("z", kb.add(x, y))
    with pytest.raises(dvm.DvmError) as e:
        kb.build()
    assert e.value.code == dvm.StatusCode.INVALID_ARGUMENT
    assert "add" in e.value.message and "4" in e.value.message and "5" in e.value.message
    assert str(e.value).startswith("InvalidArgument: ")


@pytest.mark.parametrize(
    "body,match",
    [
        (lambda kb: kb.load("x", dvm.DType.F32, [3]), "no outputs"),
        (
            lambda kb: kb.store("y", kb.sum(kb.load("x", dvm.DType.F32, [3]), 1)),
            "axis out of range",
        ),
        (
            lambda kb: kb.store("y", kb.permute(kb.load("x", dvm.DType.F32, [3, 4]), [0, 0])),
            "permute",
        ),
        (
            lambda kb: kb.store(
                "y", kb.matmul(kb.load("a", dvm.DType.F32, [3, 4]), kb.load("b", dvm.DType.F32, [5, 6]))
            ),
            "matmul",
        ),
        (lambda kb: kb.store("y", kb.load("x", dvm.DType.F32, [-2])), "negative"),
        (lambda kb: kb.store("y", kb.unary(dvm.UnaryOp.EXP, dvm.Value())), "invalid value"),
        (lambda kb: kb.store("y", kb.load("x", dvm.DType.F32, [1] * 9)), "rank"),
    ],
)
def test_invalid_definitions_raise(body, match):
    kb = dvm.KernelBuilder("bad")
    body(kb)
    with pytest.raises(dvm.DvmError, match=match):
        kb.build()


def test_unbound_symbol():
    kb = dvm.KernelBuilder("k")
    t = kb.symbol("T")
    kb.store("y", kb.broadcast(kb.load("x", dvm.DType.F32, [1]), [t]))
    with pytest.raises(dvm.DvmError, match="symbol 'T'"):
        kb.build()


def test_builder_is_frozen_after_build():
    kb = dvm.KernelBuilder("k")
    x = kb.load("x", dvm.DType.F32, [2])
    kb.store("y", x)
    k = kb.build()
    for call in (
        lambda: kb.add(x, x),
        lambda: kb.store("z", x),
        lambda: kb.build(),
        lambda: kb.shape(x),
    ):
        with pytest.raises(dvm.DvmError, match="after build") as e:
            call()
        assert e.value.code == dvm.StatusCode.FAILED_PRECONDITION
    assert k.num_outputs == 1  # the built kernel is untouched


def test_python_type_errors_stay_type_errors():
    kb = dvm.KernelBuilder("k")
    with pytest.raises(TypeError):
        kb.load("x", "f32", [2])
    with pytest.raises(TypeError):
        kb.load("x", dvm.DType.F32, [2.5])


def test_star_import_keeps_builtins_and_exports_what_exists():
    ns = {}
    exec("from dvm import *", ns)  # noqa: S102
    assert "compile" not in ns  # the builtin stays; dvm.compile is called qualified
    assert dvm.compile is not None
    missing = [name for name in dvm.__all__ if not hasattr(dvm, name)]
    assert not missing
