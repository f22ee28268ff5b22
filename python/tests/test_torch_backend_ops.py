"""Per-op tests of the torch.compile backend's translator against eager PyTorch.

Each case is traced to core ATen with symbolic shapes (make_fx, the same decompositions the
backend gives AOTAutograd: fast, no Dynamo), partitioned and compiled by the backend, and run at
two sizes with the same compiled artifact. Every case asserts that its ops really ran in DVM
(every ATen compute node inside a DvmPartition: none in the outer graph nor in a partition whose
DVM build failed, no run-time fallback) and matches eager.
"""

import math
import operator

import pytest

torch = pytest.importorskip("torch")

import dvm  # noqa: E402
import dvm.torch_backend as tb  # noqa: E402
from dvm.torch_backend.partition import FREE_OPS, partition_and_compile  # noqa: E402
from dvm.torch_backend.runtime import DvmPartition  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

F = torch.nn.functional
F32, F16, BF16, I32, I64, BOOL = (torch.float32, torch.float16, torch.bfloat16, torch.int32,
                                 torch.int64, torch.bool)
FLOATS = (F32, F16, BF16)


def rand(shape, dtype, gen, lo=-3.0, hi=3.0):
    if dtype == BOOL:
        return torch.rand(shape, generator=gen) < 0.5
    if not dtype.is_floating_point:
        return torch.randint(int(lo) * 3, int(hi) * 3 + 1, shape, generator=gen, dtype=dtype)
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo).to(dtype)


def tol(dtype):
    return {F16: (1e-2, 1e-2), BF16: (3e-2, 3e-2)}.get(dtype, (2e-5, 2e-5))


def _is_compute(n):
    return (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and n.target not in FREE_OPS
            and isinstance(n.meta.get("val"), (torch.Tensor, tuple, list)))


def aten_left(gm):
    """ATen compute nodes that run in PyTorch: in the outer graph, and inside partition
    submodules that are not DvmPartitions (a partition whose DVM build failed stays a plain
    GraphModule in its call_module node and runs as ATen)."""
    left = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            sub = gm.get_submodule(n.target)
            if not isinstance(sub, DvmPartition):
                left += aten_left(sub)
        elif _is_compute(n):
            left.append(n)
    return left


def dvm_ops(gm):
    """ATen compute nodes that DVM runs: those inside DvmPartition submodules."""
    ops = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            sub = gm.get_submodule(n.target)
            if isinstance(sub, DvmPartition):
                ops += [m for m in sub.fallback.graph.nodes
                        if m.op == "call_function" and m.target is not operator.getitem]
    return ops


def compile_aten(fn, args):
    fn = torch.func.functionalize(fn)  # as AOTAutograd does: no in-place ops reach DVM
    gm = make_fx(fn, decomposition_table=tb.decompositions(), tracing_mode="symbolic")(*args)
    return partition_and_compile(gm, args, "t")


def assert_close(got, want, dtype=None):
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_close(g, w, dtype)
        return
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    if want.dtype.is_floating_point:
        rtol, atol = tol(want.dtype)
        torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol,
                                   equal_nan=True)
    else:
        assert torch.equal(got, want)


def run_case(fn, make_args, dtype):
    """Compiles once at size A, runs at sizes A and B, compares with eager."""
    gen = torch.Generator().manual_seed(0)
    args_a = make_args(dtype, gen, 0)
    before = tb.stats().get("runtime_fallbacks", 0)
    compiled = compile_aten(fn, args_a)
    left = aten_left(compiled)
    assert not left, f"ran in PyTorch: {[str(n.target) for n in left]}"
    assert dvm_ops(compiled), f"no DVM partition:\n{compiled.graph}"
    for variant in (0, 1):
        args = make_args(dtype, gen, variant)
        want = fn(*args)
        got = compiled(*args)
        assert_close(got, want, dtype)
    assert tb.stats().get("runtime_fallbacks", 0) == before


# sizes: variant 0 and 1 differ in every dynamic dim (and avoid 0/1, which PyTorch specialises)
def SZ(v):
    return (3, 5) if v == 0 else (6, 7)


def one(lo=-3.0, hi=3.0):
    return lambda dt, g, v: (rand(SZ(v), dt, g, lo, hi),)


def two(lo=-3.0, hi=3.0, dt2=None, bshape=None):
    def mk(dt, g, v):
        a = rand(SZ(v), dt, g, lo, hi)
        b = rand(bshape(v) if bshape else SZ(v), dt2 or dt, g, lo, hi)
        return a, b

    return mk


def with_nans(make):
    """Float arguments of `make` with about a third of their elements NaN."""
    def mk(dt, g, v):
        return tuple(t.masked_fill(torch.rand(t.shape, generator=g) < 0.3, float("nan"))
                     if t.dtype.is_floating_point else t for t in make(dt, g, v))

    return mk


ALL = FLOATS + (I32, I64)

# Known C++ limit (sym simplifier): split/slice of a symbolic dim s into (s+1)//2-sized parts has the DVM
# shape min(s, (s+1)//2), not provably (s+1)//2 (true for s >= 1), so the backend refuses the
# split (it runs in PyTorch); the DVM partition after it then receives parts of sizes
# (s+1)//2 and s - (s+1)//2 and Executable.bind solves s from the floor division as if it were
# linear (s = 3 for parts of 2 and 2): "dim 1 is s - (s + 1)//2 = 1 by the other inputs, got 2".
# The backend works around the second part by passing s itself (a carrier input). Repro: gb.symbol("s", lo=2); x = input [s]; gb.split(x, [(s+1)//2,
# s - (s+1)//2], 0)[0] has shape min(s, (s+1)//2); bind an input of shape [(s+1)//2] = [2].
CHUNK_NOTE = "C++: min(s, (s+1)//2) not simplified; bind solves floor-div dims as linear"
# Known C++ limit (sym simplifier, same family): x[:n] of a dim s where PyTorch's guards give
# n <= s has the DVM shape min(s, n), not provably n (SymExpr knows ranges of symbols, no
# relation between two), so the slice (a free view) runs in PyTorch, outside the partitions.
SLICE_NOTE = "C++: x[:n] with n <= s guarded by PyTorch: DVM's min(s, n) is not provably n"
FL = FLOATS


def _attention_heads_merged(qkv):
    """GPT-2's attention from its fused projection: heads split off, merged back."""
    b, s, _ = qkv.shape
    q, k, v = (t.view(b, s, 2, 8).transpose(1, 2) for t in qkv.split(16, dim=2))
    a = torch.softmax(q @ k.transpose(-1, -2) * 0.35, dim=-1)
    return (a @ v).transpose(1, 2).reshape(b, s, 16)


CASES = [
    # pointwise binary (Tensor and Scalar overloads, broadcasting, promotion)
    ("add", lambda a, b: a + b, two(), ALL),
    ("add_alpha", lambda a, b: torch.add(a, b, alpha=2), two(), (F32, I64)),
    ("add_scalar", lambda a: a + 2, one(), ALL),
    ("add_bcast", lambda a, b: a + b, two(bshape=lambda v: (SZ(v)[1],)), (F32, I32)),
    ("add_promote", lambda a, b: a + b, two(dt2=F32), (I32, F16)),
    ("sub", lambda a, b: a - b, two(), ALL),
    ("rsub_scalar", lambda a: 1 - a, one(), (F32, I64)),
    ("mul", lambda a, b: a * b, two(), ALL),
    ("mul_scalar", lambda a: a * 0.5, one(), ALL),
    ("div", lambda a, b: a / b, two(0.5, 3.0), FL + (I64,)),
    ("div_scalar", lambda a: a / 4, one(), FL),
    ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), two(1, 4), (F32, I64)),
    # NaN-ignoring: DVM's maximum / minimum propagate NaN, fmax / fmin take the other operand
    ("fmax", torch.fmax, with_nans(two()), (F32, BF16, I32)),
    ("fmin", torch.fmin, with_nans(two()), (F32, I64)),
    ("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), two(0.5, 3), (F32,)),
    # integers rounded toward zero: operands of both signs, divisors never 0
    ("div_trunc_int", lambda a, b: torch.div(a, b * 2 + 1, rounding_mode="trunc"), two(-4, 4),
     (I32, I64)),
    ("div_trunc_int_scalar", lambda a: torch.div(a, -3, rounding_mode="trunc"), one(-4, 4),
     (I64,)),
    ("floor_divide", lambda a, b: torch.floor_divide(a, b), two(1, 4), (I32, I64)),
    ("remainder", lambda a, b: torch.remainder(a, b), two(1, 4), (F32, I64)),
    ("pow", lambda a, b: torch.pow(a, b), two(0.5, 2.0), (F32,)),
    ("pow_scalar", lambda a: a ** 2, one(), (F32, F16, I64)),
    ("pow_scalar_base", lambda a: 2.0 ** a, one(), (F32,)),
    ("maximum", lambda a, b: torch.maximum(a, b), two(), ALL),
    ("minimum", lambda a, b: torch.minimum(a, b), two(), ALL),
    # comparisons and logic
    ("eq", lambda a, b: a == b, two(-1, 1), (F32, I64, BOOL)),
    ("ne", lambda a, b: a != b, two(-1, 1), (F32, I32, BOOL)),
    ("lt", lambda a, b: a < b, two(), (F32, F16, I64)),
    ("le", lambda a, b: a <= b, two(), (F32, I32)),
    ("gt_scalar", lambda a: a > 0.5, one(), (F32, I64)),
    ("ge_scalar", lambda a: a >= 1, one(), (F32, I32)),
    ("logical_and", lambda a, b: torch.logical_and(a, b), two(), (BOOL, F32)),
    ("logical_or", lambda a, b: torch.logical_or(a, b), two(), (BOOL,)),
    ("logical_xor", lambda a, b: torch.logical_xor(a, b), two(), (BOOL,)),
    ("logical_not", lambda a: torch.logical_not(a), one(), (BOOL, F32)),
    ("bitwise_not_bool", lambda a: ~a, one(), (BOOL,)),
    ("bitwise_and_bool", lambda a, b: a & b, two(), (BOOL,)),
    ("where", lambda a, b: torch.where(a > 0, a, b), two(), ALL),
    ("where_scalar", lambda a: torch.where(a > 0, a, 0.0), one(), (F32,)),
    ("masked_fill", lambda a: a.masked_fill(a < 0, -1.0), one(), (F32, F16)),
    # pointwise unary
    ("neg", lambda a: -a, one(), ALL),
    ("abs", lambda a: a.abs(), one(), ALL),
    ("exp", torch.exp, one(), FL),
    ("exp_int", torch.exp, one(-1, 1), (I64,)),
    ("log", torch.log, one(0.1, 5), FL),
    ("log1p", torch.log1p, one(0, 5), (F32,)),
    ("expm1", torch.expm1, one(), (F32,)),
    ("log2", torch.log2, one(0.1, 5), (F32,)),
    ("sqrt", torch.sqrt, one(0, 5), FL),
    ("rsqrt", torch.rsqrt, one(0.1, 5), FL),
    ("reciprocal", torch.reciprocal, one(0.5, 5), (F32,)),
    ("tanh", torch.tanh, one(), FL),
    ("sigmoid", torch.sigmoid, one(), FL),
    ("relu", torch.relu, one(), ALL),
    ("gelu", lambda a: F.gelu(a), one(), FL),
    ("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"), one(), (F32,)),
    ("silu", lambda a: F.silu(a), one(), FL),
    ("erf", torch.erf, one(), (F32,)),
    ("sin", torch.sin, one(), (F32,)),
    ("cos", torch.cos, one(), (F32,)),
    ("floor", torch.floor, one(), (F32,)),
    ("ceil", torch.ceil, one(), (F32,)),
    ("round", torch.round, one(), (F32,)),
    ("trunc", torch.trunc, one(), (F32,)),
    ("sign", torch.sign, one(), (F32, I64)),
    ("isnan", lambda a: torch.isnan(a / a), one(), (F32,)),
    ("clamp", lambda a: a.clamp(-1, 1), one(), (F32, F16, I64)),
    ("clamp_min", lambda a: a.clamp(min=0.5), one(), (F32,)),
    ("clamp_tensor", lambda a, b: torch.clamp(a, min=b), two(), (F32,)),
    ("hardtanh", lambda a: F.hardtanh(a), one(), (F32,)),
    ("leaky_relu", lambda a: F.leaky_relu(a), one(), (F32,)),
    ("softplus", lambda a: F.softplus(a), one(), (F32,)),
    ("hardswish", lambda a: F.hardswish(a), one(), (F32,)),
    ("addcmul", lambda a, b: torch.addcmul(a, a, b, value=0.5), two(), (F32,)),
    ("lerp", lambda a, b: torch.lerp(a, b, 0.3), two(), (F32,)),
    # casts and copies
    ("to_f16", lambda a: a.to(torch.float16), one(), (F32, I64)),
    ("to_f32", lambda a: a.float(), one(), (F16, BF16, I32, BOOL)),
    ("to_i64", lambda a: a.long(), one(), (F32, I32, BOOL)),
    ("to_bool", lambda a: a.bool(), one(), (F32, I64)),
    ("clone", lambda a: a.clone() * 2, one(), (F32,)),
    # reductions
    ("sum", lambda a: a.sum(-1), one(), ALL + (BOOL,)),
    ("sum_all", lambda a: a.sum(), one(), (F32, I64)),
    ("sum_keepdim", lambda a: a.sum(0, keepdim=True), one(), (F32,)),
    ("mean", lambda a: a.mean(-1), one(), FL),
    ("mean_all", lambda a: a.mean(), one(), (F32,)),
    ("amax", lambda a: a.amax(-1), one(), ALL),
    ("amin", lambda a: a.amin(0, keepdim=True), one(), (F32, I64)),
    ("max_dim", lambda a: a.max(-1), one(), (F32, I64)),
    ("min_dim", lambda a: a.min(0), one(), (F32,)),
    ("max_all", lambda a: a.max(), one(), (F32,)),
    ("prod", lambda a: a.prod(-1), one(0.5, 1.5), (F32,)),
    ("argmax", lambda a: a.argmax(-1), one(), (F32, I64)),
    ("argmin", lambda a: a.argmin(0, keepdim=True), one(), (F32,)),
    ("any", lambda a: (a > 2).any(-1), one(), (F32,)),
    ("all", lambda a: (a > -2).all(-1), one(), (F32,)),
    ("var", lambda a: a.var(-1), one(), (F32,)),
    ("var_unbiased0", lambda a: a.var(-1, unbiased=False, keepdim=True), one(), (F32,)),
    ("std", lambda a: a.std(0), one(), (F32,)),
    ("var_mean", lambda a: torch.var_mean(a, -1), one(), (F32,)),
    # softmax and norms
    ("softmax", lambda a: a.softmax(-1), one(), FL),
    ("softmax_dim0", lambda a: a.softmax(0), one(), (F32,)),
    ("log_softmax", lambda a: a.log_softmax(-1), one(), (F32, F16)),
    ("layer_norm", lambda a: F.layer_norm(a, a.shape[-1:]), one(), (F32, BF16)),
    ("rms_norm", lambda a: F.rms_norm(a, a.shape[-1:], eps=1e-6), one(), (F32,)),
    # views, data movement
    ("view", lambda a: a.reshape(-1) * 2, one(), (F32, I64)),
    ("view_split_dim", lambda a: a.reshape(a.shape[0], -1, 1) + 1, one(), (F32,)),
    ("permute", lambda a: a.t() * 2, one(), (F32, BOOL)),
    ("transpose3", lambda a: a.unsqueeze(0).transpose(0, 2) + 1, one(), (F32,)),
    ("expand", lambda a: a[:, :1].expand(-1, 4) + 1, one(), (F32,)),
    ("unsqueeze", lambda a: a.unsqueeze(1) * 2, one(), (F32,)),
    ("squeeze", lambda a: a[:1].squeeze(0) * 2, one(), (F32,)),
    ("cat", lambda a, b: torch.cat([a, b * 2], -1), two(), (F32, I64, BOOL)),
    ("cat0", lambda a, b: torch.cat([a, b, a], 0), two(), (F16,)),
    ("split", lambda a: [t * 2 for t in a.split(2, 0)], lambda dt, g, v: (rand((4, SZ(v)[1]), dt,
                                                                              g),), (F32,)),
    ("split_sizes", lambda a: [t + 1 for t in a.split([1, 3], -1)],
     lambda dt, g, v: (rand((SZ(v)[0], 4), dt, g),), (F32,)),
    # the split itself runs in PyTorch (see CHUNK_NOTE), the rest in DVM
    ("chunk", lambda a: [t + 1 for t in a.chunk(2, -1)],
     lambda dt, g, v: (rand((SZ(v)[0], 4), dt, g),), (F32,)),
    ("unbind", lambda a: [t + 1 for t in a.unbind(-1)],
     lambda dt, g, v: (rand((SZ(v)[0], 2), dt, g),), (F32,)),
    ("slice", lambda a: a[:, 1:] + 1, one(), (F32, I64)),
    ("flip", lambda a: a.flip(0) * 2, one(), (F32, I64, BOOL)),
    ("flip_both", lambda a: a.unsqueeze(1).flip(-1, 0, 1) + 1, one(), (F32, BF16)),
    ("slice_step", lambda a: a[:, ::2] + 1, one(), (F32,)),
    ("slice_neg", lambda a: a[:, :-1] * 2, one(), (F32,)),
    ("slice_sym", lambda a: a[:, : a.shape[1] - 2] * 2, one(), (F32,)),
    ("select", lambda a: a[:, 0] + a[:, -1], one(), (F32,)),
    ("select_mid", lambda a: a[1] * 2, one(), (F32,)),
    ("narrow", lambda a: a.narrow(1, 1, 2) * 2, one(), (F32,)),
    # creation
    ("full", lambda a: a + torch.full((a.shape[1],), 2.0), one(), (F32,)),
    ("full_bool", lambda a: torch.logical_and(a > 0, torch.ones(a.shape, dtype=torch.bool)),
     one(), (F32,)),
    ("zeros_like", lambda a: a + torch.zeros_like(a), one(), (F32, I64)),
    ("ones", lambda a: a * torch.ones(a.shape[0], 1), one(), (F32,)),
    ("arange", lambda a: a + torch.arange(a.shape[1]), one(), (F32, I64)),
    ("arange_step", lambda a: a * torch.arange(0, a.shape[1] * 2, 2, dtype=torch.float32),
     one(), (F32,)),
    pytest.param("tril_mask", lambda a: a.masked_fill(
        torch.ones(a.shape[1], a.shape[1], dtype=torch.bool).tril()[: a.shape[0]]
        .logical_not(), 0.0) if a.shape[0] <= a.shape[1] else a, lambda dt, g, v: (
        rand((3, 5) if v == 0 else (4, 7), dt, g),), (F32,),
        marks=pytest.mark.allow_fallback(SLICE_NOTE, kinds=("nodes",))),
    ("scalar_tensor", lambda a: torch.where(a > 0, a, torch.tensor(-1.0)), one(), (F32,)),
    ("size_as_value", lambda a: a * a.shape[1], one(), (F32,)),
    # matmul family
    ("mm", lambda a, b: a @ b.t(), two(), (F32, F16, BF16)),
    ("bmm", lambda a, b: torch.bmm(a, b), lambda dt, g, v: (rand((2, SZ(v)[0], 4), dt, g),
                                                             rand((2, 4, SZ(v)[1]), dt, g)),
     (F32,)),
    ("matmul_4d", lambda a, b: a @ b.transpose(-1, -2),
     lambda dt, g, v: (rand((2, 4, SZ(v)[0], 8), dt, g), rand((2, 4, SZ(v)[1], 8), dt, g)),
     (F32,)),
    ("linear", lambda a, w, b: F.linear(a, w, b),
     lambda dt, g, v: (rand((SZ(v)[0], 8), dt, g), rand((4, 8), dt, g), rand((4,), dt, g)),
     (F32, BF16)),
    ("addmm", lambda b, x, w: torch.addmm(b, x, w),
     lambda dt, g, v: (rand((6,), dt, g), rand((SZ(v)[0], 8), dt, g), rand((8, 6), dt, g)),
     (F32,)),
    ("baddbmm", lambda b, x, w: torch.baddbmm(b, x, w, beta=0.5, alpha=2.0),
     lambda dt, g, v: (rand((2, SZ(v)[0], 6), dt, g), rand((2, SZ(v)[0], 8), dt, g),
                       rand((2, 8, 6), dt, g)), (F32,)),
    # gathers
    ("embedding", lambda w, i: F.embedding(i, w),
     lambda dt, g, v: (rand((10, 4), dt, g), torch.randint(0, 10, SZ(v), generator=g)), FL),
    ("index_select", lambda x, i: x.index_select(0, i),
     lambda dt, g, v: (rand((10, SZ(v)[1]), dt, g), torch.randint(0, 10, (SZ(v)[0],),
                                                                  generator=g)), (F32, I64)),
    ("gather", lambda x, i: torch.gather(x, 1, i),
     lambda dt, g, v: (rand(SZ(v), dt, g), torch.randint(0, SZ(v)[1], SZ(v), generator=g)),
     (F32,)),
    ("index_tensor", lambda x, i: x[i] * 2,
     lambda dt, g, v: (rand((10, 4), dt, g), torch.randint(0, 10, (SZ(v)[0],), generator=g)),
     (F32,)),
    # x[i] counts negative indices from the end (HF Falcon's fused_qkv[..., -2, :]); the
    # indexed dim is dynamic
    ("index_tensor_negative", lambda x, i: x[:, i] + 1,
     lambda dt, g, v: (rand(SZ(v), dt, g), torch.randint(-SZ(v)[1], SZ(v)[1], (4,),
                                                         generator=g)), (F32,)),
    # cumsum (native scan): integers and bool promote to int64 (HF's position ids from the mask)
    ("cumsum", lambda x: x.cumsum(-1) * 2, one(), (F32, BF16, I64)),
    ("cumsum_dim0_promotes", lambda x: torch.cumsum(x, 0), one(), (I32, BOOL)),
    ("cumsum_dtype", lambda x: x.cumsum(1, dtype=torch.float32) + 1, one(), (I64,)),
    # repeat: each dim tiled, a symbolic count too (BLOOM's alibi.repeat(batch, 1, 1))
    ("repeat", lambda x, y: x.repeat(2, 1, 3) + y.shape[0],
     lambda dt, g, v: (rand(SZ(v), dt, g), rand((SZ(v)[0] + 1,), dt, g)), (F32, I64)),
    ("repeat_symbolic", lambda x, y: x.repeat(y.shape[0], 2),
     lambda dt, g, v: (rand((4, 2), dt, g), rand((SZ(v)[1],), dt, g)), (F32,)),
    # several index tensors (HuggingFace's mask functions: mask[batch, head, q, kv]): one
    # gather at the flat index; indexed dims next to each other keep their place, separated
    # ones go first (torch's rule); indices broadcast, negative ones count from the end.
    # (Sizes chosen unequal at the first variant: symbolic tracing would tie equal ones.)
    ("index_two_adjacent", lambda x, i, j: x[i, j] * 2,
     lambda dt, g, v: (rand((8, SZ(v)[1], 2), dt, g), torch.randint(-8, 8, (SZ(v)[0], 1),
                                                                    generator=g),
                       torch.randint(-SZ(v)[1], SZ(v)[1], (4,), generator=g)), (F32, I64)),
    ("index_two_separated", lambda x, i, j: x[i, :, j] + 1,
     lambda dt, g, v: (rand((4, SZ(v)[1], 9), dt, g), torch.randint(0, 4, (SZ(v)[0],),
                                                                    generator=g),
                       torch.randint(-9, 9, (SZ(v)[0],), generator=g)), (F32,)),
    ("index_mask_function", lambda m, b, q, k: m[b, 0, q, k].logical_not(),
     lambda dt, g, v: (rand((2, 1, SZ(v)[0], SZ(v)[1]), BOOL, g),
                       torch.arange(2)[:, None, None], torch.arange(SZ(v)[0])[None, :, None],
                       torch.arange(SZ(v)[1])[None, None, :]), (BOOL,)),
    # attention
    # heads merged back as the partition's output ([B, H, S, D] -> [B, S, H * D] merges a
    # permuted view's dims: a copy kernel lays it out in the output; once an internal error
    # at run time, and the whole partition ran in PyTorch)
    ("attention_heads_merged", _attention_heads_merged,
     lambda dt, g, v: (rand((2, SZ(v)[1], 48), dt, g),), (F32,)),
    ("transpose_flatten", lambda a: (a * 2).t().reshape(-1), one(), (F32, I64)),
    ("input_transpose_flatten", lambda a: a.t().reshape(-1) + 0, one(), (F32,)),
    ("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
     lambda dt, g, v: tuple(rand((2, 2, SZ(v)[1], 8), dt, g) for _ in range(3)), (F32,)),
    ("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda dt, g, v: tuple(rand((2, 2, SZ(v)[1], 8), dt, g) for _ in range(3)), (F32, BF16)),
    # causal with different query and key lengths: top-left, as torch's is_causal (the rule
    # shared with lazy mode, dvm.aten_ops.attention_refusal)
    ("sdpa_causal_lq_lk", lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                          is_causal=True),
     lambda dt, g, v: (rand((2, 2, SZ(v)[0], 8), dt, g),) + tuple(
         rand((2, 2, SZ(v)[1], 8), dt, g) for _ in range(2)), (F32,)),
    ("sdpa_causal_lk_lq", lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                          is_causal=True),
     lambda dt, g, v: (rand((2, 2, SZ(v)[1], 8), dt, g),) + tuple(
         rand((2, 2, SZ(v)[0], 8), dt, g) for _ in range(2)), (F32,)),
    ("sdpa_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
     lambda dt, g, v: tuple(rand((1, 2, SZ(v)[1], 8), dt, g) for _ in range(3)) + (
         torch.randn(SZ(v)[1], SZ(v)[1], generator=g).to(dt),), (F32,)),
    ("vector_norm", lambda a: torch.linalg.vector_norm(a, dim=-1, keepdim=True) + 1, one(),
     (F32, BF16)),
    ("normalize", lambda a: F.normalize(a, dim=0), one(), (F32,)),
    ("vector_norm_inf", lambda a: torch.linalg.vector_norm(a, float("inf")), one(), (F32,)),
    ("vector_norm_1", lambda a: torch.linalg.vector_norm(a, 1, dim=(0, 1)), one(), (F32,)),
    ("dist", lambda a, b: torch.dist(a, b), two(bshape=lambda v: (SZ(v)[1],)), (F32,)),
    # in-place slice assignments, functionalized to slice_scatter / select_scatter (BART's
    # shift_tokens_right)
    ("slice_scatter", lambda a, b: torch.slice_scatter(a, b * 2, 1, 1, 3),
     lambda dt, g, v: (rand((SZ(v)[0], 6), dt, g), rand((SZ(v)[0], 2), dt, g)), (F32, I64)),
    ("slice_scatter_tail", lambda a: torch.slice_scatter(a, a[:, :-1] + 1, 1, 1), one(),
     (F32,)),
    ("select_scatter", lambda a, b: torch.select_scatter(a, b[:, 0] * 3, 1, 0), two(),
     (F32, I32)),
    # convolutional models: inference batch norm, constant padding (negative pads
    # crop), pooling with padding, strides and dilation (window slices), elu / selu / celu
    ("batch_norm_eval", lambda x, m, var, w, b: F.batch_norm(x, m, var, w, b, training=False,
                                                             eps=1e-3),
     lambda dt, g, v: (rand((SZ(v)[0], 4, SZ(v)[1], 2), dt, g), rand((4,), F32, g),
                       rand((4,), F32, g, 0.5, 2.0), rand((4,), F32, g), rand((4,), F32, g)),
     FLOATS),
    ("batch_norm_eval_no_affine", lambda x, m, var: F.batch_norm(x, m, var, training=False),
     lambda dt, g, v: (rand((SZ(v)[0], 4, SZ(v)[1]), dt, g), rand((4,), F32, g),
                       rand((4,), F32, g, 0.5, 2.0)), (F32,)),
    ("constant_pad", lambda x: F.pad(x, (1, 2, 0, 3), value=-1.5) * 2, one(), (F32, BF16, I64)),
    ("constant_pad_crop", lambda x: F.pad(x, (-1, 2)) + 1, one(), (F32,)),
    # up to a multiple of 4 (Swin's and Longformer's windows): a symbolic amount >= 0
    ("constant_pad_symbolic",
     lambda x: F.pad(x, (0, (4 - x.shape[1] % 4) % 4, (8 - x.shape[0]) % 8, 0)) * 2, one(),
     (F32, I64)),
    ("max_pool2d", lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
     lambda dt, g, v: (rand((2, 3, SZ(v)[0] + 4, SZ(v)[1] + 3), dt, g),), (F32, BF16)),
    ("max_pool2d_dilated_nan", lambda x: F.max_pool2d(x, 2, stride=1, dilation=2),
     with_nans(lambda dt, g, v: (rand((2, 3, SZ(v)[0] + 4, SZ(v)[1] + 3), dt, g),)), (F32,)),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
     lambda dt, g, v: (rand((2, 3, SZ(v)[0] + 4, SZ(v)[1] + 3), dt, g),), (F32, F16)),
    ("avg_pool2d_exclude_pad", lambda x: F.avg_pool2d(x, (2, 3), stride=(1, 2), padding=1,
                                                      count_include_pad=False),
     lambda dt, g, v: (rand((2, 3, SZ(v)[0] + 4, SZ(v)[1] + 3), dt, g),), (F32,)),
    ("avg_pool3d_divisor", lambda x: F.avg_pool3d(x, 2, divisor_override=3),
     lambda dt, g, v: (rand((2, 3, 4, SZ(v)[0] + 3, SZ(v)[1] + 4), dt, g),), (F32,)),
    ("elu", lambda x: F.elu(x, alpha=0.7), with_nans(one()), (F32, BF16)),
    ("selu", lambda x: F.selu(x), one(), (F32,)),
    ("celu", lambda x: F.celu(x, alpha=1.5), one(), (F32,)),
]

def _params():
    out = []
    for case in CASES:
        marks = ()
        if isinstance(case, type(pytest.param(0))):
            case, marks = case.values, case.marks
        name, fn, mk, dts = case
        for dt in dts:
            out.append(pytest.param(fn, mk, dt, id=f"{name}-{str(dt).split('.')[-1]}",
                                    marks=marks))
    return out


PARAMS = _params()


@pytest.mark.parametrize("fn,make_args,dtype", PARAMS)
def test_op(fn, make_args, dtype):
    run_case(fn, make_args, dtype)


def test_op_table_count():
    """The op table covers at least 80 core-ATen operators (overload packets)."""
    table = tb.op_table()
    packets = {str(o).rsplit(".", 1)[0] for o in table}
    families = sorted(set(table.values()))
    print(f"\nDVM op table: {len(table)} overloads, {len(packets)} ops, families {families}")
    assert len(packets) >= 80
    core = [o for o in table if isinstance(o, torch._ops.OpOverload)
            and torch.Tag.core in o.tags]
    print(f"core-ATen-tagged overloads: {len(core)}")
    assert len(core) >= 80


@pytest.mark.allow_fallback("an index out of range fails DVM's run; PyTorch then raises (the "
                             "point)", kinds=("runtime",))
def test_index_many_out_of_range_raises():
    """x[i, j] with j outside its own dim must raise as torch does, even where the merged flat
    index (i * n + j) would land inside x: a neighbouring row is never read."""
    def fn(x, i, j):
        return x[i, j] + 1

    gm = make_fx(fn, decomposition_table=tb.decompositions(), tracing_mode="symbolic")(
        torch.randn(5, 6, 7), torch.tensor([0, 1, 2]), torch.tensor([4]))
    compiled = partition_and_compile(gm, [torch.randn(5, 6, 7), torch.tensor([0, 1, 2]),
                                          torch.tensor([4])], "t")
    x = torch.randn(5, 6, 7)
    torch.testing.assert_close(compiled(x, torch.tensor([0, 4, 2]), torch.tensor([-6])),
                               fn(x, torch.tensor([0, 4, 2]), torch.tensor([-6])))
    for i, j in (([0, 1, 2], [6]), ([0, 1, 2], [-7]), ([5, 0, 0], [0])):
        with pytest.raises(IndexError):
            compiled(x, torch.tensor(i), torch.tensor(j))


@pytest.mark.allow_fallback("sort has no DVM translation: it runs in PyTorch (the point)",
                             kinds=("nodes",))
def test_unsupported_op_reason():
    """An op DVM does not translate runs in PyTorch, with a reason."""
    from dvm.torch_backend.partition import DvmOperatorSupport

    def fn(a):
        return torch.sort(a, -1).values * 2 + 1

    args = (torch.randn(3, 5),)
    gm = make_fx(fn, decomposition_table=tb.decompositions(), tracing_mode="symbolic")(*args)
    sup = DvmOperatorSupport()
    sort = [n for n in gm.graph.nodes if n.op == "call_function" and "sort" in str(n.target)]
    assert sort and "no DVM translation" in sup.reason(sort[0])
    compiled = partition_and_compile(gm, list(args), "t")
    left = [str(n.target) for n in compiled.graph.nodes if n.op == "call_function"]
    assert "aten.sort.default" in left and "aten.mul.Tensor" not in left
    for shape in [(3, 5), (4, 9)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(compiled(x), fn(x))


@pytest.mark.allow_fallback("DVM's attention computes no logsumexp: an attention whose "
                             "logsumexp is used runs in PyTorch (the point)", kinds=("nodes",))
def test_attention_with_used_logsumexp_runs_in_pytorch():
    """DVM's attention returns no logsumexp (output 1 of the CPU flash-attention op). Unused, as
    in F.scaled_dot_product_attention, its dead getitem is dropped and the attention runs in DVM
    (the sdpa cases above); used, the attention node stays in PyTorch with a reason, and the
    ops around it still run in DVM."""
    from dvm.torch_backend.partition import DvmOperatorSupport

    def fn(q, k, v):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
        return out * 2, lse + 1

    gen = torch.Generator().manual_seed(0)
    args = [rand((2, 3, 5, 8), F32, gen) for _ in range(3)]
    gm = make_fx(fn, decomposition_table=tb.decompositions(), tracing_mode="symbolic")(*args)
    sup = DvmOperatorSupport()
    (attn,) = [n for n in gm.graph.nodes if "flash_attention" in str(n.target)]
    assert "output 1" in sup.reason(attn) and "not computed by DVM" in sup.reason(attn)
    compiled = partition_and_compile(gm, args, "t")
    assert [str(n.target) for n in aten_left(compiled)] == [str(attn.target)]
    assert {str(n.target) for n in dvm_ops(compiled)} == {"aten.mul.Tensor", "aten.add.Tensor"}
    for shape in [(2, 3, 5, 8), (3, 4, 7, 8)]:
        xs = [torch.randn(*shape) for _ in range(3)]
        assert_close(compiled(*xs), fn(*xs))


@pytest.mark.allow_fallback("f64 has no DVM dtype: all of it runs in PyTorch (the point)",
                             kinds=("nodes", "no_dvm"))
def test_f64_falls_back():
    """f64 has no DVM dtype: the graph runs in PyTorch and stays correct."""
    def fn(a):
        return (a * 2).exp()

    x = torch.randn(3, 5, dtype=torch.float64)
    compiled = compile_aten(fn, [x])
    assert len(aten_left(compiled)) == 2
    torch.testing.assert_close(compiled(x), fn(x))


def test_sym_expr_conversion():
    """sympy expressions of the ShapeEnv convert to canonical DVM SymExprs."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Max, Min, PythonMod

    from dvm.torch_backend.symbolic import SymConverter

    gb = dvm.GraphBuilder("s")
    c = SymConverter(gb)
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    assert str(c(s0 * s1 + 3)) == str(c(3 + s1 * s0))
    assert c(FloorDiv(s0 * 4, 2)) == c(2 * s0)
    assert c(sympy.Integer(7)) == 7
    assert str(c(PythonMod(s0, 4))) == "s0 % 4"
    assert str(c(Min(s0, 512))) == "min(s0, 512)"
    assert "max" in str(c(Max(s0, s1)))
    assert c(s0 ** 2) == c(s0 * s0)
    assert math.isfinite(c(s0 - 1).evaluate({"s0": 5, "s1": 1}))
