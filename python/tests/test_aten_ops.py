"""The ATen -> DVM op table shared by the torch.compile backend and lazy mode (dvm.aten_ops):
the kinds it reads off DVM are ops.def's columns, its keys exist in torch, and both fronts
handle only ops it lists."""

import pathlib
import re

import pytest

import dvm
from dvm import aten_ops as T

OPS_DEF = pathlib.Path(__file__).resolve().parents[2] / "include" / "dvm" / "ops.def"


def ops_def_kinds(kind):
    text = OPS_DEF.read_text()
    return [int(k) for k in re.findall(rf'^DVM_{kind}\(\w+, "[\w.]+", (\d)\)', text, flags=re.M)]


def test_kinds_are_ops_def_columns():
    if not OPS_DEF.exists():
        pytest.skip("ops.def not found (installed without the source tree)")
    unary = {0: T.SAME, 1: T.FLOAT_ONLY, 2: T.PREDICATE}
    assert [unary[k] for k in ops_def_kinds("UNARY")] == [T.unary_kind(op) for op in dvm.UnaryOp]
    binary = {1: T.CMP, 2: T.LOGIC}
    want = [binary.get(k, T.DIV if op == dvm.BinaryOp.DIV else T.ARITH)
            for k, op in zip(ops_def_kinds("BINARY"), dvm.BinaryOp)]
    assert want == [T.binary_kind(op) for op in dvm.BinaryOp]
    assert T.is_float_only(dvm.UnaryOp.EXP) and not T.is_float_only(dvm.UnaryOp.NEG)
    assert T.is_predicate(dvm.UnaryOp.IS_NAN) and not T.is_predicate(dvm.UnaryOp.RELU)


def test_direct_entries_name_meta_ops():
    for key, e in T.entries(direct=True, variant=None):
        assert isinstance(e.dvm, (dvm.UnaryOp, dvm.BinaryOp)), key
        if e.family == "comparison":
            assert T.binary_kind(e.dvm) == T.CMP, key


def test_attention_rule():
    assert T.attention_refusal(4, 4, 4) is None
    assert T.attention_refusal(2, 2, 2) is None
    assert "dropout" in T.attention_refusal(4, 4, 4, 0.1)
    assert "rank" in T.attention_refusal(4, 3, 4)
    assert "rank" in T.attention_refusal(1, 1, 1)


def test_keys_resolve_and_both_fronts_use_the_table():
    torch = pytest.importorskip("torch")
    missing = [k for k in T.TABLE if T.resolve(k) is None]
    assert not missing, f"not in torch {torch.__version__}: {missing}"
    with pytest.raises(KeyError):
        T.resolve("no_such_op.default")

    from dvm.torch_backend.ops import OPS

    for o, e in OPS.items():
        assert T.entry(o).family == e.family, o
    with torch.no_grad(), dvm.lazy():  # installs lazy mode's handlers
        assert float((torch.ones(3) * 2).sum()) == 6.0
    from dvm.lazy._handlers import HANDLERS

    for o in HANDLERS:
        T.entry(o)  # KeyError: a lazy handler for an op the table does not list
    # what lazy mode records, the backend translates, unless AOTAutograd decomposes it first
    # (lazy sees fewer ops otherwise: no in-place forms, composites decomposed before dispatch)
    import dvm.torch_backend as tb

    assert set(HANDLERS) - set(OPS) <= set(tb.decompositions())
