"""The graph compiler from Python: symbolic dims, building, compiling once, running any
shape zero-copy, errors, text form and the reference models."""

import math

import numpy as np
import pytest

import dvm

F32 = dvm.DType.F32


def test_symbolic_expressions_are_canonical():
    gb = dvm.GraphBuilder("syms")
    s0, s1 = gb.symbol("s0"), gb.symbol("s1")
    assert s0 * s1 == s1 * s0
    assert (s0 * 4) // 2 == s0 * 2
    assert str(2 * s0 + 1) == "2*s0 + 1"
    assert (s0 + 3 - 3) == s0
    assert (s0 * 6 % 3).constant_value() == 0
    assert dvm.sym_max(s0, s0 + 1) == s0 + 1
    assert (s0 * s1 + 1).evaluate({"s0": 3, "s1": 5}) == 16
    a, b = dvm.SymExpr.symbol("a"), dvm.SymExpr.symbol("b")  # default range [0, SYM_MAX]
    assert dvm.parse_sym_expr("b*a + 0") == a * b
    with pytest.raises(dvm.DvmError, match="s1"):
        (s0 * s1).evaluate({"s0": 3})
    # the ranges the translator reads signs from (it raised before: no pair caster)
    s = gb.symbol("s", 2, 100)
    assert s.range() == (2, 100)
    assert (-s - 1).range() == (-101, -3)
    assert (s - 5).range() == (-3, 95)


def layernorm_gelu_graph():
    gb = dvm.GraphBuilder("ln_gelu")
    s = gb.symbol("S")
    x = gb.input("x", F32, [s, 32])
    w = gb.input("w", F32, [32])
    b = gb.input("b", F32, [32])
    y = gb.gelu(gb.layer_norm(x, w, b, eps=1e-5))
    assert [str(d) for d in gb.shape(y)] == ["S", "32"]
    gb.output("y", y)
    return gb.build()


def ref_ln_gelu(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    y = (x - m) / np.sqrt(v + 1e-5) * w + b
    erf = np.vectorize(math.erf)
    return 0.5 * y * (1 + erf(y / math.sqrt(2)))


def test_one_executable_runs_every_shape():
    exe = dvm.Executable.compile(layernorm_gelu_graph())
    assert exe.num_kernels == 1
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal(32, dtype=np.float32), rng.standard_normal(32, dtype=np.float32)
    for s in [1, 7, 64, 300, 7]:
        x = rng.standard_normal((s, 32), dtype=np.float32)
        (y,), stats = exe(x, w, b, stats=True)
        np.testing.assert_allclose(y, ref_ln_gelu(x, w, b), rtol=1e-4, atol=1e-5)
        assert stats.kernels_launched == 1
    assert stats.cache_hits == 1 and stats.programs_encoded == 0  # S=7 seen before
    assert exe.bind([x, w, b]) == {"S": 7}


def test_outputs_are_written_in_place_and_inputs_may_be_strided():
    exe = dvm.Executable.compile(layernorm_gelu_graph())
    rng = np.random.default_rng(1)
    big = rng.standard_normal((10, 64), dtype=np.float32)
    x = big[::2, ::2]  # strided view, no copy
    w, b = np.ones(32, np.float32), np.zeros(32, np.float32)
    y = np.empty((5, 32), np.float32)
    ptr = y.ctypes.data
    exe.run([x, w, b], [y])
    assert y.ctypes.data == ptr
    np.testing.assert_allclose(y, ref_ln_gelu(np.ascontiguousarray(x), w, b), rtol=1e-4, atol=1e-5)


def test_errors_name_the_input_and_dims():
    exe = dvm.Executable.compile(layernorm_gelu_graph())
    x = np.zeros((4, 31), np.float32)
    with pytest.raises(dvm.DvmError, match="dim 1"):
        exe(x, np.zeros(32, np.float32), np.zeros(32, np.float32))
    with pytest.raises(dvm.DvmError, match="dtype"):
        exe(np.zeros((4, 32), np.int32), np.zeros(32, np.float32), np.zeros(32, np.float32))
    gb = dvm.GraphBuilder("bad")
    a = gb.input("a", F32, [gb.symbol("A"), 4])
    b = gb.input("b", F32, [gb.symbol("B"), 4])
    gb.output("c", gb.binary(dvm.BinaryOp.ADD, a, b))
    with pytest.raises(dvm.DvmError, match=r"\[A, 4\]"):
        gb.build()
    with pytest.raises(dvm.DvmError, match="after build"):
        gb.constant(1.0)


def test_text_form_round_trips():
    g = layernorm_gelu_graph()
    text = g.to_string()
    assert dvm.parse_graph(text).to_string() == text
    with pytest.raises(dvm.DvmError, match="line"):
        dvm.parse_graph(text.replace("f32[S, 32]", "f32[S, 33]", 2))


def test_fused_and_unfused_transformer_layers_agree():
    cfg = dvm.models.TransformerConfig()
    cfg.hidden, cfg.heads, cfg.ffn = 64, 4, 128
    g = dvm.models.transformer_layer(cfg, "bert_small")
    fused = dvm.Executable.compile(g)
    unfused = dvm.Executable.compile(g, fuse=False)
    assert fused.num_kernels < unfused.num_kernels
    rng = np.random.default_rng(2)
    for seq in [1, 5, 17]:
        shapes = dvm.models.transformer_layer_input_shapes(cfg, 2, seq)
        ins = [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in shapes]
        np.testing.assert_allclose(fused(*ins)[0], unfused(*ins)[0], rtol=1e-4, atol=1e-4)


def test_torch_tensors_cross_zero_copy():
    torch = pytest.importorskip("torch")
    exe = dvm.Executable.compile(layernorm_gelu_graph())
    x = torch.randn(6, 32)
    w, b = torch.ones(32), torch.zeros(32)
    (y,) = exe(x, w, b)
    assert isinstance(y, torch.Tensor)
    ref = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (32,), w, b, 1e-5))
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    out = torch.empty(6, 32)
    exe.run([x, w, b], [out])
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_calling_with_torch_tensors_takes_the_cpp_path(monkeypatch):
    """exe(*tensors) reads torch tensors and makes its outputs in C++ (dvm._dvm_torch); an
    input that path does not take (a numpy array after a tensor, torch's negative bit) runs
    through Executable.call with the same results, and errors stay DvmError."""
    torch = pytest.importorskip("torch")
    from dvm import _graph

    exe = dvm.Executable.compile(layernorm_gelu_graph())
    tensor_type, call = _graph._torch_path()
    direct = []

    def spy(*args):
        direct.append(args[0])
        return call(*args)

    monkeypatch.setattr(_graph, "_TORCH", (tensor_type, spy))
    x = torch.randn(6, 32)
    w, b = torch.ones(32), torch.zeros(32)
    ref = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (32,), w, b, 1e-5))
    ys = exe(x, w, b)
    assert isinstance(ys, list) and len(direct) == 1
    torch.testing.assert_close(ys[0], ref, rtol=1e-4, atol=1e-5)
    for args in ((x, w.numpy(), b), (x, torch._neg_view(-w), b)):
        (y,) = exe(*args)
        assert isinstance(y, torch.Tensor)
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    assert len(direct) == 3  # tried, then the general path
    with pytest.raises(dvm.DvmError, match="dim"):
        exe(torch.randn(6, 31), w, b)


def test_bad_graph_text_gets_a_clear_error():
    """Errors on user text never turn into another exception type: undecodable bytes in a
    message or a name become U+FFFD; an op with the wrong operand count is rejected where it is
    parsed."""
    text = ('graph g {\n  %0 = input {name="x"} : f32[4]\n  %1 = unary.exp(%0) : f32[4]\n'
            '  return y=%1\n}\n')
    assert dvm.parse_graph(text).num_nodes == 2
    bad = text.encode().replace(b"unary.exp", b"unary.\xff\xfe")  # not UTF-8
    with pytest.raises(dvm.DvmError, match="unknown op 'unary.\ufffd\ufffd'"):
        dvm.parse_graph(bad)
    with pytest.raises(dvm.DvmError, match="unknown op"):
        dvm.parse_graph(text.replace("unary.exp", "unary.ex\u00e9"))
    # names that are not UTF-8 are kept; Python shows them with U+FFFD instead of raising
    g = dvm.parse_graph(text.encode().replace(b'name="x"', b'name="x\xff"'))
    assert g.input_names == ["x\ufffd"] and 'name="x\ufffd"' in g.to_string()
    assert "x\ufffd" in str(g) and g.name == "g"
    exe = dvm.Executable.compile(g)
    assert "kernel" in exe.fusion_report().lower()
    operand = text.replace("unary.exp(%0)", 'input(%0) {name="z"}')
    with pytest.raises(dvm.DvmError, match="takes 0 operands, got 1"):
        dvm.parse_graph(operand)


@pytest.mark.parametrize("args", [("S", 16, 1), ("",), ("1 bad",)])
def test_invalid_symbols_are_errors_not_aborts(args):
    gb = dvm.GraphBuilder("g")
    gb.symbol(*args)
    with pytest.raises(dvm.DvmError, match="symbol"):
        gb.build()
    with pytest.raises(dvm.DvmError, match="symbol"):
        dvm.SymExpr.symbol(*args)


_PROFILE_SCRIPT = """
import numpy as np, dvm
gb = dvm.GraphBuilder("prof")
s = gb.symbol("S")
x = gb.input("x", dvm.DType.F32, [s, 64])
gb.output("y", gb.gelu(gb.binary(dvm.BinaryOp.MUL, x, x)))
exe = dvm.Executable.compile(gb.build())
for n in (3, 5, 5, 5):
    exe(np.ones((n, 64), np.float32))
print("ok")
"""


def test_profile_env_prints_a_table_per_kernel_at_exit():
    """DVM_PROFILE=1 times each kernel launch, first calls (with their encoding) and prepared
    calls alike, and prints one row per kernel when the process exits; unset, nothing."""
    import os
    import subprocess
    import sys

    def run(value):
        env = {**os.environ, "DVM_PROFILE": value}
        return subprocess.run([sys.executable, "-c", _PROFILE_SCRIPT], capture_output=True,
                              text=True, timeout=120, env=env)

    r = run("1")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    assert "DVM_PROFILE" in r.stderr, r.stderr
    rows = [line.split() for line in r.stderr.splitlines() if line.startswith("prof_k")]
    assert len(rows) == 1 and rows[0][1] == "4", r.stderr  # one kernel, four launches
    r = run("0")
    assert r.returncode == 0 and "DVM_PROFILE" not in r.stderr, r.stderr
