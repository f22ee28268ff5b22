"""torch.compile(model, backend="dvm"): whole models against eager, recompilation counts,
partitioning with ATen fallback, graph breaks, zero-copy parameters, backward fallback, errors.

Small models and few shapes keep this file within seconds per test (Dynamo + AOTAutograd cost
about a second per captured graph); Inductor is never used here.
"""

import importlib.metadata
import logging

import pytest

torch = pytest.importorskip("torch")

import dvm  # noqa: E402
import dvm.torch_backend as tb  # noqa: E402
from dvm.torch_backend.runtime import DvmPartition  # noqa: E402

nn = torch.nn
F = torch.nn.functional

tb.register()  # no-op when the installed entry point already provides "dvm"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    fast = torch.backends.mha.get_fastpath_enabled()
    # nn.TransformerEncoderLayer's inference fast path is one fused ATen op
    # (_transformer_encoder_layer_fwd) that DVM would only run in PyTorch
    torch.backends.mha.set_fastpath_enabled(False)
    tb.reset_stats()
    yield
    torch.backends.mha.set_fastpath_enabled(fast)
    torch._dynamo.reset()


def dynamo_graphs():
    return tb.stats().get("dynamo_graphs", 0)


class MLP(nn.Module):
    def __init__(self, d=32, h=64, o=16):
        super().__init__()
        self.fc1, self.fc2, self.ln = nn.Linear(d, h), nn.Linear(h, o), nn.LayerNorm(o)

    def forward(self, x):
        return self.ln(self.fc2(F.gelu(self.fc1(x))))


class ProjMLP(MLP):
    """MLP followed by a projection weight stored [K, N] (x @ W): packed as a constant where an
    nn.Linear weight [N, K] in f32 may be read in place instead (AVX-512)."""

    def __init__(self, o=16, n=24):
        super().__init__(o=o)
        self.proj = nn.Parameter(torch.randn(o, n) / o**0.5)

    def forward(self, x):
        return super().forward(x) @ self.proj


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=97, d=64, heads=4, layers=2, max_len=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def check(compiled, model, *args, rtol=1e-4, atol=1e-4):
    with torch.no_grad():
        got, want = compiled(*args), model(*args)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    return got


def test_entry_point_registered():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert "dvm" in eps.names, "pip install the package: the entry point registers 'dvm'"
    assert eps["dvm"].value == "dvm.torch_backend:dvm_backend"
    assert "dvm" in torch._dynamo.list_backends()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mlp(dtype):
    torch.manual_seed(0)
    model = MLP().eval().to(dtype)
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for n in (3, 5, 9):
        check(compiled, model, torch.randn(n, 32, dtype=dtype), rtol=tol, atol=tol)
    s = tb.stats()
    assert s["dynamo_graphs"] == 1
    assert s.get("fallback_nodes", 0) == 0 and s["dvm_partitions"] == 1


def test_transformer_encoder_layer():
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    for t in (5, 9, 13):
        check(compiled, model, torch.randn(2, t, 64))
    s = tb.stats()
    assert s["dynamo_graphs"] == 1
    assert s.get("fallback_nodes", 0) == 0
    assert s.get("runtime_fallbacks", 0) == 0


def test_cnn_block_without_convolutions():
    """Group norm, SiLU, max pooling with padding, inference batch norm, average pooling and
    ELU (its alpha a SymFloat under dynamic=True) in one DVM partition, at several image sizes.
    The pooled values feed a select (ELU): a view of in-kernel values once read unstored
    memory there (tests/repro/avg_pool_windows_then_select.graph)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.GroupNorm(4, 8), nn.SiLU(), nn.MaxPool2d(3, 2, 1),
                          nn.BatchNorm2d(8), nn.AvgPool2d(2), nn.ELU(0.7)).eval()
    with torch.no_grad():
        model[3].running_mean.uniform_(-1, 1)
        model[3].running_var.uniform_(0.5, 2)
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    for hw in (16, 20, 12):
        check(compiled, model, torch.randn(2, 8, hw, hw))
    s = tb.stats()
    assert s.get("fallback_nodes", 0) == 0 and s.get("runtime_fallbacks", 0) == 0
    assert s["dvm_partitions"] >= 1


def _stream(compiled, model, lengths, batch=2):
    torch.manual_seed(1)
    for t in lengths:
        ids = torch.randint(0, 97, (batch, t))
        check(compiled, model, ids)


def test_gpt_growing_sequence_dynamic_none():
    """Default dynamic=None: static first, symbolic after the first size change ("automatic
    dynamic"), then no recompile for 20 more sequence lengths."""
    torch.manual_seed(0)
    model = GPT().eval()
    compiled = torch.compile(model, backend="dvm")
    _stream(compiled, model, [4, 5])  # warm-up: the static graph, then the symbolic one
    warm = dynamo_graphs()
    assert warm == 2
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    _stream(compiled, model, range(6, 26))  # 20 new lengths
    assert dynamo_graphs() == warm, "a sequence length caused a recompile"
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames
    s = tb.stats()
    assert s.get("fallback_nodes", 0) == 0 and s.get("runtime_fallbacks", 0) == 0


def test_gpt_dynamic_true_one_compile():
    torch.manual_seed(0)
    model = GPT(layers=1).eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    # 20 lengths, compiled once. (Not starting at 2 == batch: Dynamo's duck sizing would make
    # the first graph assume seq == batch and recompile at the next length.)
    _stream(compiled, model, range(3, 23))
    assert dynamo_graphs() == 1
    assert tb.stats()["aot_graphs"] == 1


def test_mark_dynamic_one_compile():
    torch.manual_seed(0)
    model = GPT(layers=1).eval()
    compiled = torch.compile(model, backend="dvm")
    for t in (3, 8, 17):
        ids = torch.randint(0, 97, (2, t))
        torch._dynamo.mark_dynamic(ids, 1)
        check(compiled, model, ids)
    assert dynamo_graphs() == 1


class WithSort(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x):
        h = F.silu(self.a(x))
        h = torch.sort(h, dim=-1).values  # no DVM translation: runs in PyTorch
        return F.softmax(self.b(h) * 2.0, -1)


@pytest.mark.allow_fallback("torch.sort has no DVM translation: it runs in PyTorch between two "
                             "DVM partitions (the point)", kinds=("nodes",))
def test_unsupported_op_in_the_middle(caplog, monkeypatch):
    monkeypatch.setenv("DVM_LOG_FALLBACK", "1")
    torch.manual_seed(0)
    model = WithSort().eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    with caplog.at_level(logging.WARNING, logger="dvm"):
        for n in (3, 7):
            check(compiled, model, torch.randn(n, 16))
    s = tb.stats()
    assert s["dvm_partitions"] == 2, s  # before and after the sort
    assert s["fallback_nodes"] >= 1
    assert any("sort" in r.getMessage() and "no DVM translation" in r.getMessage()
               for r in caplog.records)


@pytest.mark.allow_fallback("a graph with no tensor op has nothing for DVM (the point)",
                            kinds=("no_dvm",))
def test_graph_without_tensor_ops_says_why(caplog, monkeypatch):
    """x.conj() of a real tensor is x: the graph has no node to log, yet DVM_LOG_FALLBACK still
    says why nothing ran in DVM."""
    monkeypatch.setenv("DVM_LOG_FALLBACK", "1")
    x = torch.randn(3, 4)
    with caplog.at_level(logging.WARNING, logger="dvm"):
        assert torch.compile(lambda t: t.conj(), backend="dvm")(x) is not None
    assert tb.stats().get("dynamo_graphs") == 1
    assert "nothing for DVM: the graph has no tensor op" in caplog.text


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if h.sum() > 0:  # data-dependent Python control flow: a graph break
            return self.b(h) * 2
        return self.b(-h) - 1


def test_data_dependent_control_flow():
    torch.manual_seed(0)
    model = Branchy().eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    x = torch.randn(5, 8)
    for sign in (1, -1, 1):
        h = torch.tanh(model.a(x))
        xs = x if (h.sum() > 0) == (sign > 0) else -x
        check(compiled, model, xs)
    assert dynamo_graphs() >= 2  # the graph break splits the frame


@pytest.mark.parametrize("freeze", [False, True])
def test_parameters_zero_copy(freeze):
    """DVM reads parameters in place: an in-place update shows in the next call, with no
    recompile, and the pointers DVM receives are the parameters' own. With freeze_weights the
    parameters are passed as dvm.Constant (weights packed once) and an update gives them a new
    version (packed again); without it nothing is packed ahead."""
    torch.manual_seed(0)
    dvm.clear_weight_cache()
    model = ProjMLP().eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True,
                             options={"freeze_weights": freeze})
    seen = []
    orig = DvmPartition.exe

    def spy_setter(self, exe):  # what each partition hands its executable, recorded
        orig.fset(self, exe)
        call = self._exe_call

        def spy(*ins):
            seen.extend((t.array if isinstance(t, dvm.Constant) else t).data_ptr() for t in ins)
            return call(*ins)

        self._exe_call = spy
        self._torch_call = None  # the C++ path would bypass the spy

    DvmPartition.exe = orig.setter(spy_setter)
    try:
        x = torch.randn(24, 32)  # > 16 rows: the weights are packed (fewer are read in place)
        check(compiled, model, x)
        ptrs = {p.data_ptr() for p in model.parameters()}
        assert ptrs <= set(seen)
        packs = dvm.weight_cache_stats().packs
        assert (packs > 0) == freeze
        w = model.proj
        ptr = w.data_ptr()
        with torch.no_grad():
            w.mul_(-2.0)
            model.ln.bias.add_(1.0)
        assert w.data_ptr() == ptr
        check(compiled, model, x)
        assert (dvm.weight_cache_stats().packs > packs) == freeze
    finally:
        DvmPartition.exe = orig
    assert dynamo_graphs() == 1


def test_weight_written_through_data_is_seen_by_default():
    """A write through `.data` bumps no version counter: by default DVM reads the weight as it
    is on every call, so the write is seen (a packed copy would be stale)."""
    torch.manual_seed(0)
    model = nn.Linear(32, 48).eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    x = torch.randn(16, 32)
    check(compiled, model, x)
    model.weight.data.mul_(-1.5)
    check(compiled, model, x)
    model.weight.detach().numpy()[:] = 0.25
    check(compiled, model, x)


@pytest.mark.allow_fallback("x[:, :n]: DVM's shape min(t, n) is not provably n (C++ sym "
                             "simplifier: no relation between symbols), so the slice (a free "
                             "view) runs in PyTorch; the arithmetic runs in DVM", kinds=("nodes",))
def test_symint_inputs():
    """Sizes passed as Python ints become SymInt graph inputs."""

    def f(x, n):
        return x[:, :n] * 2 + torch.arange(n, dtype=x.dtype)

    compiled = torch.compile(f, backend="dvm", dynamic=True)
    for t, n in ((6, 3), (9, 5), (12, 7)):
        x = torch.randn(3, t)
        torch.testing.assert_close(compiled(x, n), f(x, n))
    assert dynamo_graphs() == 1


@pytest.mark.allow_fallback("a negative int argument cannot be bound through a carrier input: "
                            "those calls run the partition's ATen code (the point)",
                            kinds=("runtime",))
def test_negative_int_arguments_run_in_pytorch(caplog):
    """An int argument that is a value rather than a size (index_add's alpha, a fill value)
    reaches DVM as a symbol bound through a carrier input, a stride-0 view with that many
    elements. A negative value cannot be bound so: the call runs the ATen code (found by the
    OpInfo sweep: expand(-1) kept size 1 and bound alpha = -1 as 1; expand(-5) raised)."""

    def f(x, y, alpha):
        return x + y * alpha

    compiled = torch.compile(f, backend="dvm", dynamic=True)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with caplog.at_level(logging.DEBUG, logger="dvm.torch_backend"):
        for alpha in (3, -1, -5, 7):
            torch.testing.assert_close(compiled(x, y, alpha), f(x, y, alpha))
    st = tb.stats()
    assert st.get("partitions_run", 0) == dynamo_graphs() == 1
    assert st.get("runtime_fallbacks", 0) == 2
    assert "symbol value -1 is negative" in caplog.text


@pytest.mark.allow_fallback("the grad-mode graph's backward is compiled (and would run) in "
                             "PyTorch", kinds=("backward",))
def test_inference_graphs_skip_aot_autograd():
    """No input needs a gradient: the graph is traced once without AOTAutograd (direct path),
    under no_grad and for plain tensors alike; parameters that require grad with grad mode on
    take AOTAutograd (the outputs must carry autograd history)."""
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    with torch.no_grad():
        for n in (3, 5):
            check(compiled, model, torch.randn(n, 32))
    assert tb.stats()["direct_graphs"] == 1 and tb.stats()["aot_graphs"] == 1
    out = compiled(torch.randn(4, 32))  # grad mode on: Dynamo recompiles, AOTAutograd path
    assert out.requires_grad
    assert tb.stats()["aot_graphs"] == 2 and tb.stats()["direct_graphs"] == 1

    def g(x, y):
        return torch.tanh(x) * y + 1

    cg = torch.compile(g, backend="dvm", dynamic=True)
    x, y = torch.randn(6, 8), torch.randn(8)
    torch.testing.assert_close(cg(x, y), g(x, y))
    assert not cg(x, y).requires_grad
    assert tb.stats()["direct_graphs"] == 2


def test_collector_paused_while_compiling_and_restored(monkeypatch):
    """The cyclic collector is off while the backend compiles a graph and back on after it,
    also when the compile raises; a caller that had it off keeps it off."""
    import gc

    from dvm.torch_backend import backend

    seen = []
    real = backend.partition_and_compile

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(backend, "partition_and_compile", spy)
    assert gc.isenabled()
    cf = torch.compile(lambda x: torch.tanh(x) + 1, backend="dvm", dynamic=True)
    x = torch.randn(4, 8)
    torch.testing.assert_close(cf(x), torch.tanh(x) + 1)
    assert seen == [False] and gc.isenabled()

    def boom(*a, **k):
        raise RuntimeError("compile failed")

    monkeypatch.setattr(backend, "_compile", boom)
    with pytest.raises(RuntimeError, match="compile failed"):
        backend.dvm_backend(torch.fx.symbolic_trace(lambda x: x + 1), [torch.randn(2)])
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    try:
        with pytest.raises(RuntimeError):
            backend.dvm_backend(torch.fx.symbolic_trace(lambda x: x + 1), [torch.randn(2)])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_compile_collects_its_own_cycles_and_keeps_a_programs_frozen_objects(monkeypatch):
    """While the backend compiles, the objects older than the compile are frozen; at its end the
    cycles the compile made are collected (the collection then finds no work left for later)
    and nothing stays frozen. Objects the program froze itself stay frozen."""
    import gc

    from dvm.torch_backend import backend

    class Cycle:
        def __init__(self):
            self.me = self

    frozen_during = []
    real = backend.partition_and_compile

    def spy(*a, **k):
        frozen_during.append(gc.get_freeze_count())
        Cycle()  # garbage the compile leaves behind
        return real(*a, **k)

    monkeypatch.setattr(backend, "partition_and_compile", spy)
    made = []

    def on_gc(phase, info):
        if phase == "stop":
            made.append(info["collected"])

    gc.collect()
    gc.callbacks.append(on_gc)
    try:
        cf = torch.compile(lambda x: torch.sin(x) * 2, backend="dvm", dynamic=True)
        x = torch.randn(3, 5)
        torch.testing.assert_close(cf(x), torch.sin(x) * 2)
    finally:
        gc.callbacks.remove(on_gc)
    assert frozen_during and frozen_during[0] > 0
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    assert sum(made) >= 1  # the cycle made inside the compile was collected

    torch._dynamo.reset()
    frozen_during.clear()
    gc.freeze()  # the program's own (a pre-fork server, say)
    try:
        mine = gc.get_freeze_count()
        cf = torch.compile(lambda x: torch.cos(x) - 1, backend="dvm", dynamic=True)
        torch.testing.assert_close(cf(x), torch.cos(x) - 1)
        # Not frozen again (the count only falls, as frozen objects die), nor unfrozen.
        assert len(frozen_during) == 1 and 0 < frozen_during[0] <= mine
        assert 0 < gc.get_freeze_count() <= mine
    finally:
        gc.unfreeze()


def test_decomposition_table_keeps_dvm_composites():
    """The table decomposes what core ATen decomposes below autograd (addcmul) except DVM's
    own composites, and holds only aten ops (no sweep of other namespaces);
    CompositeImplicitAutograd ops (linear, layer_norm) trace to the same ATen ops as with
    torch's export table."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    from dvm.torch_backend import backend

    table = backend.decompositions()
    aten = torch.ops.aten
    assert aten.addcmul.default in table
    for op in (aten.silu.default, aten._fused_rms_norm.default):
        assert op not in table
    assert all(op.namespace == "aten" for op in table)

    def f(x, w, b):
        y = torch.nn.functional.linear(x, w, b)
        y = torch.nn.functional.layer_norm(y, (6,))
        return torch.addcmul(y, y, x[:, :6]).softmax(-1)

    args = (torch.randn(3, 8), torch.randn(6, 8), torch.randn(6))
    ours = make_fx(f, decomposition_table=table)(*args)
    export_table = backend.without_kept(core_aten_decompositions())
    theirs = make_fx(f, decomposition_table=export_table)(*args)

    def targets(g):
        return [str(n.target) for n in g.graph.nodes if n.op == "call_function"]

    assert targets(ours) == targets(theirs)
    assert "aten.addcmul.default" not in targets(ours)
    torch.testing.assert_close(ours(*args), f(*args))


def test_inplace_ops_on_intermediates_are_functionalized(monkeypatch):
    """An in-place op on a value the graph made (T5's `scores += position_bias`) keeps the
    direct path: replaced by its out-of-place form in the traced graph when nothing else sees
    the write, else the ATen trace is functionalized (a second trace: `k`, whose view taken
    before the write is read after it); the input is not written. F.linear on a 3-D input after
    the in-place op keeps every size symbolic: functionalizing Dynamo's graph instead made them
    constants (a recompile per length, DeBERTa-v2, BEiT)."""
    import torch.fx.experimental.proxy_tensor as pt

    traces = []
    make_fx = pt.make_fx

    def counting_make_fx(*args, **kwargs):
        traces.append(1)
        return make_fx(*args, **kwargs)

    monkeypatch.setattr(pt, "make_fx", counting_make_fx)

    def f(x, b):
        y = x * 2
        y.add_(b)
        y.mul_(0.5)
        return torch.tanh(y)

    def g(x, b):
        y = x * 2
        y += b  # operator.iadd in Dynamo's graph
        return torch.tanh(y)

    lin = nn.Linear(8, 8)

    def h(x, b):
        y = x * 2
        y.mul_(3)
        return lin(y.unsqueeze(0)) + b

    def k(x, b):
        y = x * 2
        v = y[0]  # a view of y, read after y is written: it must see the write
        y.add_(b)
        return torch.tanh(v) + y.sum(0)

    def m(x, b):
        y = torch.exp(x)
        z = y * 3  # reads y before the write
        y.masked_fill_(y > 2, 0.5)
        y.add_(b)
        return y + z

    for fn, want_traces in ((f, 1), (g, 1), (h, 1), (k, 2), (m, 1)):
        torch._dynamo.reset()
        tb.reset_stats()
        traces.clear()
        c = torch.compile(fn, backend="dvm", dynamic=True)
        with torch.no_grad():
            for n in (3, 6, 5):
                x, b = torch.randn(n, 8), torch.randn(8)
                x0 = x.clone()
                torch.testing.assert_close(c(x, b), fn(x0.clone(), b))
                torch.testing.assert_close(x, x0)
        assert tb.stats()["direct_graphs"] == 1 and tb.stats()["dynamo_graphs"] == 1, fn.__name__
        assert len(traces) == want_traces, fn.__name__


@pytest.mark.allow_fallback("the mutated input and the aliasing view stay in PyTorch",
                             kinds=("nodes", "no_dvm"))
def test_mutation_and_input_aliases_take_aot_autograd():
    """A graph that writes an input, or returns a view of one, needs AOTAutograd's handling:
    the direct path declines it and the results still match eager (the write happens once, the
    alias is an alias)."""

    def mutate(x):
        x.mul_(2)
        return torch.sigmoid(x) + 1

    def alias(x):
        return x.view(-1), torch.relu(x) * 3

    for fn in (mutate, alias):
        torch._dynamo.reset()
        tb.reset_stats()
        c = torch.compile(fn, backend="dvm", dynamic=True)
        for n in (3, 5):
            a = torch.randn(n, 4)
            b = a.clone()
            got, want = c(a), fn(b)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(a, b)
            if fn is alias:
                assert got[0].data_ptr() == a.data_ptr()
        assert tb.stats()["aot_graphs"] == 1 and tb.stats().get("direct_graphs", 0) == 0


@pytest.mark.allow_fallback("backward graphs run in PyTorch (the point)", kinds=("backward",))
def test_backward_falls_back_to_pytorch(caplog, monkeypatch):
    monkeypatch.setenv("DVM_LOG_FALLBACK", "1")
    torch.manual_seed(0)
    model = MLP()
    ref = MLP()
    ref.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    x = torch.randn(4, 32)
    with caplog.at_level(logging.WARNING, logger="dvm"):
        compiled(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4)
    assert tb.stats()["backward_graphs"] == 1
    assert any("backward graph runs in PyTorch" in r.getMessage() for r in caplog.records)


@pytest.mark.allow_fallback("f64 has no DVM dtype: all of it runs in PyTorch (the point)",
                             kinds=("nodes", "no_dvm"))
def test_f64_runs_in_pytorch():
    model = MLP().double().eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    check(compiled, model, torch.randn(3, 32, dtype=torch.float64))
    assert tb.stats().get("dvm_partitions", 0) == 0


def test_bad_input_clear_error():
    model = MLP().eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    check(compiled, model, torch.randn(3, 32))
    with pytest.raises(Exception) as e:
        with torch.no_grad():
            compiled(torch.randn(3, 31))
    msg = str(e.value)
    assert "31" in msg and ("shape" in msg or "size" in msg), msg


@pytest.mark.allow_fallback("a DVM run-time error runs the partition's ATen code (the point)",
                             kinds=("runtime",))
def test_runtime_error_falls_back(caplog, monkeypatch):
    """A DVM run-time error (here: inputs that contradict the graph) runs the partition's ATen
    code instead, and says why."""
    monkeypatch.setenv("DVM_LOG_FALLBACK", "1")
    model = MLP().eval()
    parts = []
    orig = DvmPartition.__init__

    def keep(self, *a, **k):
        orig(self, *a, **k)
        parts.append(self)

    DvmPartition.__init__ = keep
    try:
        compiled = torch.compile(model, backend="dvm", dynamic=True)
        check(compiled, model, torch.randn(3, 32))
    finally:
        DvmPartition.__init__ = orig
    (part,) = parts
    good = [a for a in part.fallback.graph.nodes if a.op == "placeholder"]
    args = [torch.zeros(*[int(s) if isinstance(s, int) else 3 for s in p.meta["val"].shape])
            if isinstance(p.meta["val"], torch.Tensor) else 3 for p in good]
    args[-1] = args[-1].to(torch.int32) if isinstance(args[-1], torch.Tensor) else args[-1]
    with caplog.at_level(logging.WARNING, logger="dvm"):
        try:
            part(*args)
        except RuntimeError:
            pass  # ATen may reject the contradiction too; what matters is the message
    assert part.fallbacks == 1 and "expected dtype" in part.last_error
    assert any("failed at run time" in r.getMessage() for r in caplog.records)


_EXIT_SCRIPT = """
import torch, dvm
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
cm = torch.compile(model, backend="dvm", dynamic=True)
y = cm(torch.randn(3, 8))  # grad mode: y's autograd graph holds the compiled partitions
y = cm(torch.randn(5, 8))
print("ok")
"""


@pytest.mark.allow_fallback("runs in a subprocess; its backward graph is compiled there",
                            kinds=("no_dvm",))
def test_process_exits_without_leak_warnings():
    """Objects that outlive the extension at exit (here: partitions held by a result's autograd
    graph) are not reported; DVM_LEAK_WARNINGS=1 brings nanobind's report back, so this test
    sees the case it guards."""
    import os
    import subprocess
    import sys

    def run(env):
        return subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], capture_output=True,
                              text=True, timeout=300, env={**os.environ, **env})

    r = run({"DVM_LEAK_WARNINGS": "0"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    assert "leaked" not in r.stderr, r.stderr
    r = run({"DVM_LEAK_WARNINGS": "1"})
    assert r.returncode == 0 and "leaked" in r.stderr


def test_partitions_follow_torch_thread_count(monkeypatch):
    """DVM's kernels run on torch's intra-op thread count (the two pools share the cores);
    DVM_NUM_THREADS, when set, decides instead."""
    from dvm.torch_backend.partition import torch_threads

    monkeypatch.delenv("DVM_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    seen = []
    orig = DvmPartition.exe

    def record(self, exe):
        orig.fset(self, exe)
        seen.append(exe.num_threads)

    DvmPartition.exe = orig.setter(record)
    try:
        torch.set_num_threads(1)
        f = torch.compile(lambda x: torch.sigmoid(x) * 3, backend="dvm", dynamic=True)
        x = torch.randn(4, 8)
        torch.testing.assert_close(f(x), torch.sigmoid(x) * 3)
        assert seen == [1]
        torch.set_num_threads(2)
        assert torch_threads() == 2
        monkeypatch.setenv("DVM_NUM_THREADS", "1")
        assert torch_threads() == 0  # the executable's default: DVM_NUM_THREADS
    finally:
        torch.set_num_threads(before)
        DvmPartition.exe = orig


def test_torch_call_path_reads_tensors_in_cpp():
    """dvm._dvm_torch.call runs an executable on torch tensors picked from an argument tuple:
    strided views as they are, outputs made by at::Tensor; what it does not take (torch's
    negative bit, a non-tensor) raises NotImplementedError so the partition uses the general
    path; DVM errors are dvm.DvmError."""
    from dvm import _dvm_torch

    gb = dvm.GraphBuilder("g")
    s = gb.symbol("S")
    x = gb.input("x", dvm.DType.F32, [s, 8])
    b = gb.input("b", dvm.DType.F32, [8])
    gb.output("y", gb.unary(dvm.UnaryOp.TANH, gb.binary(dvm.BinaryOp.ADD, x, b)))
    exe = dvm.Executable.compile(gb.build())
    xs = torch.randn(8, 5)
    bias = torch.randn(8)
    for xin in (torch.randn(5, 8), xs.t(), torch.randn(1, 8)):
        (y,) = _dvm_torch.call(exe, (None, xin, bias), (1, 2))
        torch.testing.assert_close(y, torch.tanh(xin + bias))
        assert y.dtype == torch.float32 and y.is_contiguous()
    with pytest.raises(NotImplementedError):
        _dvm_torch.call(exe, (torch._neg_view(xs.t()), bias), (0, 1))
    with pytest.raises(NotImplementedError):
        _dvm_torch.call(exe, (xs.t().numpy(), bias), (0, 1))
    with pytest.raises(IndexError):
        _dvm_torch.call(exe, (xs.t(), bias), (0, 2))
    with pytest.raises(TypeError):
        _dvm_torch.call("not an executable", (xs.t(), bias), (0, 1))
    with pytest.raises(dvm.DvmError, match="dim 1"):
        _dvm_torch.call(exe, (torch.randn(5, 7), bias), (0, 1))

    def f(x, b):
        return torch.tanh(x + b)

    c = torch.compile(f, backend="dvm", dynamic=True)
    for xin in (torch.randn(5, 8), torch._neg_view(torch.randn(6, 8))):
        torch.testing.assert_close(c(xin, bias), f(xin.resolve_neg(), bias))


def test_large_outputs_reuse_kept_blocks():
    """Outputs of 1 MiB and up come from blocks kept when their tensor dies: a second call of
    the same (or a slightly larger) shape reuses the first call's block, already mapped; the
    values are right, the storage resizes like any tensor's, a zero budget turns the cache
    off and the idle bytes never exceed the budget."""
    from dvm import _dvm_torch
    from dvm.torch_backend import output_cache_stats, release_output_cache

    gb = dvm.GraphBuilder("g")
    s = gb.symbol("S")
    x = gb.input("x", dvm.DType.F32, [s, 1024])
    gb.output("y", gb.binary(dvm.BinaryOp.MUL, x, x))
    exe = dvm.Executable.compile(gb.build())
    release_output_cache(64 << 20)
    try:
        before = output_cache_stats()
        xin = torch.randn(600, 1024)  # a 2.3 MiB output: its class holds 2.25-2.5 MiB
        (y,) = _dvm_torch.call(exe, (xin,), (0,))
        torch.testing.assert_close(y, xin * xin)
        ptr = y.data_ptr()
        del y
        mid = output_cache_stats()
        assert mid["misses"] == before["misses"] + 1 and mid["idle_bytes"] >= 2 << 20
        xin = torch.randn(620, 1024)  # 3% larger: the same size class
        (y,) = _dvm_torch.call(exe, (xin,), (0,))
        torch.testing.assert_close(y, xin * xin)
        after = output_cache_stats()
        assert y.data_ptr() == ptr and after["hits"] == mid["hits"] + 1
        assert after["live_bytes"] >= 2 << 20
        y.resize_(700, 1024)  # a storage that grows through the same allocator
        y[600:] = 1.0
        assert float(y[699, 0]) == 1.0
        small = _dvm_torch.call(exe, (torch.randn(4, 1024),), (0,))[0]
        assert output_cache_stats()["misses"] == after["misses"] + 1  # the resize
        del y, small
        many = [_dvm_torch.call(exe, (torch.randn(4096, 1024),), (0,))[0] for _ in range(20)]
        del many  # 20 x 16 MiB freed against a 64 MiB budget
        assert output_cache_stats()["idle_bytes"] <= 64 << 20
        release_output_cache(0)
        (y,) = _dvm_torch.call(exe, (xin,), (0,))
        torch.testing.assert_close(y, xin * xin)
        stats = output_cache_stats()
        assert stats["idle_bytes"] == 0 and stats["budget_bytes"] == 0
        del y
        assert output_cache_stats()["idle_bytes"] == 0
    finally:
        release_output_cache(1024 << 20)


@pytest.fixture
def direct_calls(monkeypatch):
    """The direct calls single_partition_call makes for the graphs compiled in the test (None
    where a graph is not one partition)."""
    from dvm.torch_backend import backend

    made = []
    orig = backend.single_partition_call

    def spy(fused):
        run = orig(fused)
        made.append(run)
        return run

    monkeypatch.setattr(backend, "single_partition_call", spy)
    return made


def test_single_partition_graph_is_called_directly(direct_calls):
    """A graph that is one partition fed by graph inputs compiles to the partition's call
    itself; inputs the C++ path declines (torch's negative bit) still run correctly."""
    made = direct_calls
    c = torch.compile(lambda x, y: torch.tanh(x) * y, backend="dvm", dynamic=True)
    y = torch.randn(8)
    for x in (torch.randn(3, 8), torch.randn(5, 8), torch._neg_view(torch.randn(5, 8))):
        torch.testing.assert_close(c(x, y), torch.tanh(x.resolve_neg()) * y)
    # the negative bit is a dispatch key Dynamo guards on: that input compiles a second graph
    assert len(made) == 2 and all(run is not None for run in made)
    assert [run.partition.calls for run in made] == [2, 1]


def test_single_partition_call_skips_the_partition_with_dynamic_sizes(direct_calls,
                                                                      monkeypatch):
    """With dynamic=True the graph passes SymInts beside the tensors; after the first call
    the direct path binds the tensors itself, never going through the partition's forward."""
    made = direct_calls

    def f(x, r, w, b):
        return torch.nn.functional.layer_norm(x + r, (x.shape[-1],), w, b)

    c = torch.compile(f, backend="dvm", dynamic=True)
    w, b = torch.randn(16), torch.randn(16)
    c(torch.randn(2, 3, 16), torch.randn(2, 3, 16), w, b)  # compiles; the partition's call
    assert len(made) == 1 and made[0] is not None
    part = made[0].partition
    forwards = []
    orig_call = type(part).__call__
    monkeypatch.setattr(type(part), "__call__", lambda *a: forwards.append(1) or orig_call(*a))
    for shape in ((2, 3, 16), (3, 5, 16), (4, 7, 16)):  # no size 1: Dynamo specializes it
        x, r = torch.randn(shape), torch.randn(shape)
        torch.testing.assert_close(c(x, r, w, b), f(x, r, w, b))
    assert forwards == [] and part.calls == 4


def test_dvm_and_torch_threads_run_concurrently():
    """A compiled DVM graph called from several Python threads while torch runs its own
    multi-threaded ops in others: every result equals eager, nothing deadlocks."""
    import threading

    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    xs = [torch.randn(n, 32) for n in (3, 9, 17, 40)]
    with torch.no_grad():
        want = [model(x) for x in xs]
        for x in xs:
            compiled(x)  # compile outside the threads
    errors = []

    def dvm_worker():
        try:
            with torch.no_grad():
                for _ in range(30):
                    for x, w in zip(xs, want):
                        torch.testing.assert_close(compiled(x), w, rtol=1e-4, atol=1e-5)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def torch_worker():
        try:
            a = torch.randn(256, 256)
            for _ in range(30):
                torch.testing.assert_close(torch.tanh(a @ a), torch.tanh(a @ a))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (dvm_worker, dvm_worker, torch_worker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread did not finish (deadlock?)"
    assert not errors, errors


@pytest.mark.allow_fallback("a zero divisor fails the DVM run; the ATen code then raises",
                            kinds=("runtime",))
@pytest.mark.parametrize("op", ["//", "%", "floor_divide", "remainder"])
def test_integer_division_by_zero_raises_like_eager(op):
    """Integer // and % by zero raise torch's ZeroDivisionError through the backend, as in
    eager (DVM reports the zero divisor; the partition's ATen code then raises it)."""
    fns = {"//": lambda a, b: a // b + 1, "%": lambda a, b: a % b + 1,
           "floor_divide": lambda a, b: torch.floor_divide(a, b) * 2,
           "remainder": lambda a, b: torch.remainder(a, b) * 2}
    f = fns[op]
    c = torch.compile(f, backend="dvm", dynamic=True)
    a = torch.tensor([5, -7, 9, 4, 11])
    for b in (torch.tensor([2, 3, -4, 1, 5]), torch.tensor([2, 3, -4, 1, 5, 6])[:5]):
        torch.testing.assert_close(c(a, b), f(a, b))
    b0 = torch.tensor([2, 0, -4, 1, 5])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a, b0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        c(a, b0)
    torch.testing.assert_close(c(a, b0 + 10), f(a, b0 + 10))  # and it still runs after


def test_lazy_integer_division_by_zero_fails_its_flush():
    """In lazy mode the zero divisor is found when the trace runs: the read that flushes it
    raises DvmError naming the op (eager raises RuntimeError at the op itself)."""
    a = torch.tensor([5, -7, 9, 4, 11])
    with dvm.lazy():
        ok = (a // torch.tensor([2, 3, -4, 1, 5]) + 1).tolist()
    assert ok == (a // torch.tensor([2, 3, -4, 1, 5]) + 1).tolist()
    with pytest.raises(dvm.DvmError, match="floordiv by zero"):
        with dvm.lazy():
            (a // torch.tensor([2, 0, -4, 1, 5]) + 1).tolist()


@pytest.mark.filterwarnings("ignore:var\\(\\)")
@pytest.mark.filterwarnings("ignore:std\\(\\)")
@pytest.mark.parametrize("shape,correction", [((1, 5), 1), ((1, 5), 2), ((3, 5), 4),
                                              ((0, 5), 1), ((4, 5), 1)])
def test_variance_divides_by_max_of_zero_and_n_minus_correction(shape, correction):
    # torch divides by max(0, N - correction): inf, or NaN for 0 / 0, never a negative
    # variance (found by the OpInfo sweep: DVM divided by N - correction).
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    # Literal corrections: a closed-over int is a SymInt under dynamic=True (DVM then leaves
    # the op to PyTorch, as it does for any symbolic correction).
    fns = {1: (lambda x: torch.var(x, 0, correction=1), lambda x: torch.std(x, 0, correction=1)),
           2: (lambda x: torch.var(x, 0, correction=2), lambda x: torch.std(x, 0, correction=2)),
           4: (lambda x: torch.var(x, 0, correction=4), lambda x: torch.std(x, 0, correction=4))}
    for fn in fns[correction]:
        torch._dynamo.reset()
        got = torch.compile(fn, backend="dvm", dynamic=True)(x)
        torch.testing.assert_close(got, fn(x), equal_nan=True)
    assert tb.stats().get("dvm_partitions", 0) >= 1


def test_kernels_share_torchs_threads_under_concurrent_torch_work():
    """With torch present DVM's kernels run on torch's intra-op pool (one pool on the cores
    instead of two competing ones): compiled DVM calls from several Python threads, while
    other threads run torch ops, give eager's results and finish (no deadlock between the
    pools)."""
    import threading

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        def fn(x, w):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

        compiled = torch.compile(fn, backend="dvm", dynamic=True)
        x, w = torch.randn(256, 1024), torch.randn(1024)
        want = fn(x, w)
        torch.testing.assert_close(compiled(x, w), want)
        a = torch.randn(192, 192)
        errors, stop = [], threading.Event()

        def dvm_loop():
            try:
                for _ in range(40):
                    torch.testing.assert_close(compiled(x, w), want)
            except Exception as e:  # noqa: BLE001  (reported below)
                errors.append(e)

        def torch_loop():
            while not stop.is_set():
                torch.mm(a, a)

        workers = [threading.Thread(target=dvm_loop) for _ in range(2)]
        others = [threading.Thread(target=torch_loop) for _ in range(2)]
        for t in others + workers:
            t.start()
        for t in workers:
            t.join(timeout=120)
        stop.set()
        for t in others:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in workers + others), "deadlock"
        assert not errors, errors[0]
    finally:
        torch.set_num_threads(before)


class _ScaledRmsNorm(torch.nn.Module):
    """Float attributes (an epsilon, a scale) that Dynamo passes as SymFloats under
    dynamic=True, as HF's RMSNorm and rotary embeddings do."""

    def __init__(self):
        super().__init__()
        self.eps = 1e-6
        self.scale = 0.1

    def forward(self, x):
        y = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype)
        return y * self.scale + self.scale


def test_converted_arguments_take_the_cxx_call_path():
    """A partition whose arguments are converted first (a SymFloat becomes a rank-0 tensor, as
    GPT-2's sqrt(2/pi) and every HF norm's epsilon do) is called through the C++ path too: its
    large outputs come from the kept blocks (once, torch's allocator mapped GPT-2's 8 MiB
    logits afresh on every call, 1,800 page faults a call, 18% of its time)."""
    from dvm.torch_backend import output_cache_stats

    torch._dynamo.reset()
    tb.reset_stats()
    m = _ScaledRmsNorm()
    c = torch.compile(m, backend="dvm", dynamic=True)
    x = torch.randn(2, 300, 1024)  # a 2.3 MiB output
    torch.testing.assert_close(c(x), m(x))
    before = output_cache_stats()
    for _ in range(3):
        torch.testing.assert_close(c(x), m(x))
    after = output_cache_stats()
    assert after["hits"] >= before["hits"] + 3, (before, after)
    st = tb.stats()
    assert st.get("partitions_run", 0) >= 1 and st.get("runtime_fallbacks", 0) == 0, st


class _DropoutNorm(torch.nn.Module):
    """Float attributes whose values the trace folds (dropout's p in eval mode, a layer norm's
    epsilon): Dynamo still reads each with .item() on every call."""

    def __init__(self):
        super().__init__()
        self.p = 0.1
        self.eps = 1e-5
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        x = torch.nn.functional.dropout(x, self.p, self.training)
        return torch.nn.functional.layer_norm(x, (8,), self.w, None, self.eps)


def test_unused_float_reads_leave_the_call(monkeypatch):
    """The .item() reads of float inputs whose values nothing uses are dropped from the graph
    the backend returns (14 per GPT-2 decode step, ~1 us of dispatch each), and the results
    stay eager's, also after an attribute changes."""
    from dvm.torch_backend import backend as backend_mod

    graphs = []
    real = backend_mod.partition_and_compile

    def keep(*args, **kwargs):
        graphs.append(real(*args, **kwargs))
        return graphs[-1]

    monkeypatch.setattr(backend_mod, "partition_and_compile", keep)
    torch._dynamo.reset()
    m = _DropoutNorm().eval()
    c = torch.compile(m, backend="dvm", dynamic=True)
    with torch.no_grad():
        for rows in (3, 5, 7):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(c(x), m(x))
        m.eps = 0.5
        x = torch.randn(4, 8) * 0.3
        torch.testing.assert_close(c(x), m(x))
    assert graphs
    reads = [n for g in graphs for n in g.graph.nodes
             if n.op == "call_function" and n.target is torch.ops.aten._local_scalar_dense.default]
    assert not reads, [str(n) for n in reads]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_symfloat_operands_run_in_dvm(dtype):
    # Once such nodes ran in PyTorch ("input _local_scalar_dense of type SymFloat"), splitting
    # every norm out of its kernel; now they are rank-0 f32 inputs of the partition. A new
    # value of the attribute reaches the kernel without a recompile. (bf16: the fused kernel
    # keeps f32 between the ops where eager rounds each result to bf16: a bf16 ulp apart.)
    torch._dynamo.reset()
    tb.reset_stats()
    m = _ScaledRmsNorm()
    c = torch.compile(m, backend="dvm", dynamic=True)
    for rows, scale in ((3, 0.1), (5, 0.1), (7, -2.5)):
        m.scale = scale
        x = torch.randn(2, rows, 64).to(dtype)
        want = m(x)
        ulp = 2.0**-7 * want.abs().max().item()  # bf16's spacing at the output's scale
        tol = dict(rtol=1.6e-2, atol=ulp) if dtype == torch.bfloat16 else dict(rtol=1e-5,
                                                                                 atol=1e-6)
        torch.testing.assert_close(c(x), want, **tol)
    st = tb.stats()
    assert st["dynamo_graphs"] == 1, st
    assert st.get("partition_fallbacks", 0) == 0 and st.get("runtime_fallbacks", 0) == 0, st


@pytest.mark.parametrize("conv, shape", [
    (lambda: torch.nn.Conv2d(3, 16, 8, stride=8), (2, 3, 64, 64)),  # ViT's patch embedding
    (lambda: torch.nn.Conv2d(3, 16, 4, stride=4, bias=False), (2, 3, 30, 34)),  # remainders
    (lambda: torch.nn.Conv2d(8, 5, 1), (2, 8, 7, 9)),  # pointwise
    (lambda: torch.nn.Conv1d(4, 6, 2, stride=2), (2, 4, 11)),
    (lambda: torch.nn.Conv3d(2, 3, 2, stride=2), (3, 2, 4, 6, 5)),
])
def test_convolution_with_non_overlapping_windows_runs_in_dvm(conv, shape):
    # A matmul over patches (reshape, permute, W read as nn.Linear's layout); the input past
    # the last whole window is dropped as the convolution drops it. Two batch sizes, one compile.
    torch._dynamo.reset()
    tb.reset_stats()
    torch.manual_seed(0)
    m = conv()
    c = torch.compile(m, backend="dvm", dynamic=True)
    with torch.no_grad():
        for n in (shape[0], shape[0] + 2):
            x = torch.randn(n, *shape[1:])
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    st = tb.stats()
    assert st["dynamo_graphs"] == 1 and st.get("partitions_run", 0) >= 1, st


@pytest.mark.allow_fallback("an overlapping (3 x 3, padded) convolution runs in PyTorch",
                            kinds=("nodes", "no_dvm"))
def test_convolution_with_overlapping_windows_falls_back_with_its_reason(caplog):
    torch._dynamo.reset()
    m = torch.nn.Conv2d(3, 8, 3, padding=1)
    c = torch.compile(m, backend="dvm", dynamic=True)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), caplog.at_level(logging.INFO):
        torch.testing.assert_close(c(x), m(x))
    assert tb.stats().get("fallback_nodes", 0) >= 1


def test_output_that_is_a_view_of_an_input_stays_that_view():
    """A graph returning a permuted view of an input beside DVM compute (HuggingFace's
    Longformer) takes AOTAutograd's path, which rebuilds such an output from the compiled
    output's size, strides and offset as a view of the input. A contiguous DVM copy there made
    the rebuilt output read the input with the wrong layout (Longformer 1.4% off eager); the
    view now stays a PyTorch view, in DVM only the compute."""

    def f(x, a, b):
        v = x.view(x.shape[0], x.shape[1], 4, 16).permute(1, 0, 2, 3)
        return (a + b).softmax(-1), v

    cf = torch.compile(f, backend="dvm", dynamic=True)
    with torch.no_grad():
        for s, t in ((5, 3), (7, 2), (9, 4)):
            x = torch.randn(s, t, 64)
            a, b = torch.randn(t, s, 4, 9), torch.randn(t, s, 1, 9)
            got, want = cf(x, a, b), f(x, a, b)
            for g_, w_ in zip(got, want):
                torch.testing.assert_close(g_, w_)
            assert got[1].stride() == want[1].stride()
            assert got[1].data_ptr() == x.data_ptr()  # an alias of x, as in eager
    st = tb.stats()
    assert st.get("partitions_run", 0) >= 1 and st.get("fallback_nodes", 0) == 0, st


def test_dynamic_float_arguments_of_clamps_run_in_dvm():
    """Under dynamic=True Dynamo passes model floats as SymFloats, nn.ReLU6's bounds included
    (HuggingFace's MobileNetV2 ran 35 ReLU6 nodes in PyTorch on a TypeError): hardtanh,
    clamp, leaky_relu's slope and scalar_tensor take them as rank-0 operands."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act, self.lin, self.slope = nn.ReLU6(), nn.Linear(8, 8), 0.2

        def forward(self, x, lo: float, hi: float):
            y = F.hardtanh(self.act(self.lin(x)) * 3, lo, hi) + F.leaky_relu(x, self.slope)
            return y + torch.clamp(x, lo, hi) + torch.scalar_tensor(lo)

    m = M().eval()
    cm = torch.compile(m, backend="dvm", dynamic=True)
    with torch.no_grad():
        for n, lo, hi in ((3, -0.5, 2.0), (5, -0.25, 1.5), (7, 0.0, 6.0)):
            x = torch.randn(n, 8) * 4
            x[0, 0] = float("nan")  # clamp keeps NaN
            torch.testing.assert_close(cm(x, lo, hi), m(x, lo, hi), equal_nan=True)
    st = tb.stats()
    assert st.get("fallback_nodes", 0) == 0 and st.get("partitions_run", 0) >= 1, st


@pytest.mark.allow_fallback("the setitem's rest (s - w - 1: its sign unknown to DVM) and the flip's "
                            "slice (min(s, w + 1)) run in PyTorch", kinds=("nodes",))
def test_slices_from_the_end_by_a_symbolic_amount():
    """x[:, -(w + 1):] with w a dynamic int: the start counts from the end (it was taken as an
    offset from the start: a negative-length iota at run time, the partition falling back),
    and a setitem there (slice_scatter) gives eager's values. A size used as data whose sign
    DVM cannot know is refused when translating, never run."""

    def f(x, w):
        y = x.clone()
        y[:, -(w + 1):] = 0.0
        return x[:, -(w + 1):] * 2, y * 2, x.flip(0)[:, : w + 1]

    cf = torch.compile(f, backend="dvm", dynamic=True)
    with torch.no_grad():
        for w in (4, 6, 3, 9):
            x = torch.randn(12, 12)
            for g_, w_ in zip(cf(x, w), f(x, w)):
                assert torch.equal(g_, w_)
    st = tb.stats()
    assert st.get("runtime_fallbacks", 0) == 0 and st.get("partitions_run", 0) >= 1, st
    assert st.get("dynamo_graphs") == 1, st


def test_outputs_keep_eager_memory_layout():
    """Elementwise ops on a transposed view keep its permuted layout in eager; DVM writes such
    an output in the same layout (it wrote it contiguous), so code that reads strides after the
    graph (Longformer chunks a tensor with as_strided from its strides, after a graph break)
    computes what it does in eager."""

    def f(x):
        b, s, _ = x.shape
        y = x.view(b, s, 4, 8).transpose(1, 2)
        return y * 2 + 1, torch.tanh(x)

    def chunk(t):  # Longformer's _chunk: overlapping windows through the strides
        size, stride = list(t.size()), list(t.stride())
        size[2], stride[2] = size[2] // 2, stride[2] * 2
        return t.as_strided(size, stride)

    cf = torch.compile(f, backend="dvm", dynamic=True)
    with torch.no_grad():
        for s in (6, 10, 8):
            x = torch.randn(2, s, 32)
            got, want = cf(x), f(x)
            assert got[0].stride() == want[0].stride(), (got[0].stride(), want[0].stride())
            assert got[1].is_contiguous()
            torch.testing.assert_close(chunk(got[0]), chunk(want[0]))
            torch.testing.assert_close(got[1], want[1])
    st = tb.stats()
    assert st.get("partitions_run", 0) >= 1 and st.get("fallback_nodes", 0) == 0, st
    assert st.get("dynamo_graphs") == 1, st


def test_size_expressions_of_any_sign_used_as_data():
    """A size expression used as a value whose sign DVM's ranges cannot tell (n*n - 4*n + 1,
    BEiT's relative-position counts are of this form) is computed from its symbols by integer
    ops: negative at n = 3, positive after; floor division, modulo and min too."""

    def f(x):
        n = x.shape[0]
        return (x * (n * n - 4 * n + 1) + (n // 2) % 3 - min(n, 4),
                torch.full((2,), n * n - 4 * n + 1) + x.sum())

    cf = torch.compile(f, backend="dvm", dynamic=True)
    with torch.no_grad():
        for n in (3, 5, 7, 9):
            x = torch.randn(n, 4)
            for g_, w_ in zip(cf(x), f(x)):
                torch.testing.assert_close(g_, w_)
    st = tb.stats()
    assert st.get("fallback_nodes", 0) == 0 and st.get("runtime_fallbacks", 0) == 0, st
    assert st.get("partitions_run", 0) >= 1 and st.get("dynamo_graphs") == 1, st


def test_padding_to_a_multiple_by_a_symbolic_amount():
    """F.pad up to a multiple of a window, (w - n % w) % w: a symbolic amount >= 0, zero at
    some lengths (an empty fill), in DVM at every length with one compile."""

    def f(x):
        p = (4 - x.shape[1] % 4) % 4
        return F.pad(x, (0, 0, 0, p), value=-1.0) * 2, F.pad(x, (1, p)) + 1

    cf = torch.compile(f, backend="dvm", dynamic=True)
    with torch.no_grad():
        for n in (5, 6, 8, 9, 12, 7):
            x = torch.randn(3, n, 4)
            for g_, w_ in zip(cf(x), f(x)):
                torch.testing.assert_close(g_, w_)
    st = tb.stats()
    assert st.get("fallback_nodes", 0) == 0 and st.get("runtime_fallbacks", 0) == 0, st
    assert st.get("dynamo_graphs") == 1, st
