"""Model-sized weights: DVM's packed-weight cache against its capacity, and against eager.

    python python/bench/weights_bench.py [--sizes-gib 0.5 1.25] [--rows 1 16 128] [--rounds 5]
                                         [--dtypes f32 bf16] [--models mlp llama] [--out F]

A stack of `x = x + Linear(F->H)(gelu(Linear(H->F)(x)))` blocks (H = 2048, F = 8192; f32 (128
MiB of weights per block) or bf16 weights and activations (64 MiB)), or with --models llama a
HuggingFace Llama built from its config (random weights; hidden 2048, FFN 5632, GQA 16/4
heads, as many layers as the size asks for; M = the tokens of one sequence), through
torch.compile(backend="dvm", dynamic=True). Configurations, measured in alternating rounds in
one process (per-call medians over all rounds):

- eager: PyTorch, op by op;
- dvm: default options (weights read as they are on every call, packed per tile);
- dvm frozen: options={"freeze_weights": True}, the cache at its default capacity
  (DVM_WEIGHT_CACHE_MB, 1 GiB);
- dvm frozen, no cache: the same with capacity 0.

For the frozen runs it records the cache's packs per call in steady state (a thrashing cache
packs every weight on every call) and the bytes it holds (the memory DVM adds). Writes
bench_results/weights_bench.json.
"""

import argparse
import copy
import json
import os
import statistics
import time

import torch

import dvm
import dvm.torch_backend  # noqa: F401  (registers "dvm" when not pip-installed)
from models_bench import cpu_model, git_commit  # this directory (the script's own)

HIDDEN, FFN = 2048, 8192


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, FFN)
        self.down = torch.nn.Linear(FFN, HIDDEN)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


# The Llama config: hidden 2048, FFN 5632, 16 heads, 4 KV heads (head dim 128), vocabulary
# 4096; layers as many as the weight size asks for (~90 MiB per layer in bf16).
LLAMA = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=4096, max_position_embeddings=1024)


def make_model(kind, gib, dtype):
    """(model, weight bytes, rows -> call arguments, output -> tensor)."""
    torch.manual_seed(0)
    if kind == "llama":
        import transformers

        h, f = LLAMA["hidden_size"], LLAMA["intermediate_size"]
        kv = h * LLAMA["num_key_value_heads"] // LLAMA["num_attention_heads"]
        per_layer = (2 * h * h + 2 * h * kv + 3 * h * f) * dtype.itemsize
        layers = max(1, round(gib * 2**30 / per_layer))
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(num_hidden_layers=layers, **LLAMA))
        args = lambda rows: {"input_ids": torch.randint(0, LLAMA["vocab_size"], (1, rows)),  # noqa: E731
                             "use_cache": False}
        out = lambda o: o.logits  # noqa: E731
    else:
        per_block = 2 * HIDDEN * FFN * dtype.itemsize
        model = torch.nn.Sequential(
            *[Block() for _ in range(max(1, round(gib * 2**30 / per_block)))])
        args = lambda rows: {"input": torch.randn(rows, HIDDEN, dtype=dtype)}  # noqa: E731
        out = lambda o: o  # noqa: E731
    model = model.to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return model, weight_bytes, args, out


def read_gbps(buf):
    """GB/s of one sum over `buf` (an f32 buffer far larger than the caches)."""
    t = time.perf_counter()
    buf.sum()
    return buf.numel() * 4 / (time.perf_counter() - t) / 1e9


def machine_roofline(dtypes):
    """What the machine reaches at this thread count, measured here with PyTorch's own kernels:
    the read bandwidth (a sum over a 1 GiB f32 buffer, best of 5) and a large GEMM's rate per
    dtype (a 2048^3 torch.mm, best of 5). Decode (M = 1) is bound by the first, prefill rows
    by the second; both DVM and eager are measured against them."""
    buf = torch.ones(2**28)
    buf.sum()
    read = [read_gbps(buf) for _ in range(5)]
    del buf
    gemm = {}
    for name in dtypes:
        a = torch.randn(2048, 2048, dtype=DTYPES[name])
        b = torch.randn(2048, 2048, dtype=DTYPES[name])
        torch.mm(a, b)
        rates = []
        for _ in range(5):
            t = time.perf_counter()
            torch.mm(a, b)
            rates.append(2 * 2048**3 / (time.perf_counter() - t) / 1e9)
        gemm[name] = max(rates)
    return {"read_gbps": max(read), "gemm_gflops": gemm}


def time_call(fn, kw):
    t = time.perf_counter()
    fn(**kw)
    return (time.perf_counter() - t) * 1e3


def bench(gib, rows, rounds, capacity, dtype_name, kind="mlp"):
    dtype = DTYPES[dtype_name]
    model, weight_bytes, make_args, output = make_model(kind, gib, dtype)
    x = make_args(rows)
    tol = 1e-3
    torch._dynamo.reset()
    fns = {
        "eager": model,
        "dvm": torch.compile(model, backend="dvm", dynamic=True),
        "dvm frozen": torch.compile(model, backend="dvm", dynamic=True,
                                    options={"freeze_weights": True}),
    }
    fns["dvm frozen, no cache"] = fns["dvm frozen"]
    caps = {"dvm frozen": capacity, "dvm frozen, no cache": 0}
    samples = {k: [] for k in fns}
    packs = {}
    held = {}
    # Decode is bound by the read bandwidth, which moves by tens of percent over minutes on a
    # shared machine (44 and 74 GB/s an hour apart here): it is measured in every round, between
    # the configurations, and the rate compared with the median of those samples.
    reads = []
    read_buf = torch.ones(2**28) if rows == 1 else None
    with torch.no_grad():
        want = output(model(**x))
        if dtype != torch.float32:
            # bf16 results differ from eager's by its rounding of every op (DVM keeps f32 inside
            # a fused kernel): both are held against the model in f32, DVM within 1.5x eager's
            # own error (a relative 2-norm).
            x32 = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
                   for k, v in x.items()}
            ref = output(copy.deepcopy(model).float()(**x32)).float()
            err_of = lambda t: ((t.float() - ref).norm() / ref.norm()).item()  # noqa: E731
            bound = max(1.5 * err_of(want), 1e-3)
        for name, fn in fns.items():  # compile + warm (and check) each
            dvm.set_weight_cache_capacity(caps.get(name, capacity))
            got = output(fn(**x))
            if dtype == torch.float32:
                torch.testing.assert_close(got, want, rtol=tol, atol=tol)
            else:
                assert err_of(got) <= bound, f"{name}: error {err_of(got):.3g} > {bound:.3g}"
        for _ in range(rounds):
            for name, fn in fns.items():
                dvm.clear_weight_cache()
                dvm.set_weight_cache_capacity(caps.get(name, capacity))
                fn(**x)  # first call after a clear fills the cache
                fn(**x)
                before = dvm.weight_cache_stats()
                for _ in range(2):
                    samples[name].append(time_call(fn, x))
                after = dvm.weight_cache_stats()
                packs.setdefault(name, []).append((after.packs - before.packs) / 2)
                held[name] = after.bytes
            if read_buf is not None:
                reads.append(read_gbps(read_buf))
    del read_buf
    dvm.set_weight_cache_capacity(capacity)
    dvm.clear_weight_cache()
    med = {k: statistics.median(v) for k, v in samples.items()}
    # Each weight is read once per call: bytes / time is the weights' streaming rate (what
    # bounds decode); 2 * M * weights is the products' FLOP count (what bounds prefill).
    n_weights = weight_bytes / dtype.itemsize
    return {
        "weights_gbps": {k: weight_bytes / (v * 1e-3) / 1e9 for k, v in med.items()},
        "gflops": {k: 2 * rows * n_weights / (v * 1e-3) / 1e9 for k, v in med.items()},
        "weights_gib": weight_bytes / 2**30,
        "model": kind,
        "dtype": dtype_name,
        "rows": rows,
        "ms": med,
        "speedup_vs_eager": {k: med["eager"] / v for k, v in med.items()},
        "packs_per_call": {k: statistics.median(v) for k, v in packs.items()},
        "cache_bytes": held,
        **({"read_gbps": statistics.median(reads)} if reads else {}),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-gib", type=float, nargs="+", default=[0.5, 1.25])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 128])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtypes", nargs="+", default=["f32"], choices=sorted(DTYPES))
    ap.add_argument("--models", nargs="+", default=["mlp"], choices=["mlp", "llama"])
    ap.add_argument("--out", default="bench_results/weights_bench.json",
                    help="the JSON to write (perf_report.py reads the default one)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    capacity = dvm.weight_cache_stats().capacity
    roofline = machine_roofline(args.dtypes)
    print(f"machine: read {roofline['read_gbps']:.1f} GB/s, GEMM "
          + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in roofline["gemm_gflops"].items()),
          flush=True)
    results = []
    for kind in args.models:
        for dtype_name in args.dtypes:
            for gib in args.sizes_gib:
                for rows in args.rows:
                    r = bench(gib, rows, args.rounds, capacity, dtype_name, kind)
                    results.append(r)
                    cells = "  ".join(f"{k} {v:.1f} ms ({r['speedup_vs_eager'][k]:.2f}x)"
                                      for k, v in r["ms"].items())
                    rate = (f"weights {r['weights_gbps']['dvm']:.1f} GB/s (read "
                            f"{r['read_gbps']:.1f} GB/s meanwhile)" if rows == 1 else
                            f"{r['gflops']['dvm']:.0f} GFLOP/s")
                    print(f"{kind} {dtype_name} {r['weights_gib']:.2f} GiB  M={rows}: {cells}  "
                          f"dvm {rate}  "
                          f"packs/call {r['packs_per_call']}  cache MiB "
                          f"{ {k: v >> 20 for k, v in r['cache_bytes'].items()} }", flush=True)
    os.makedirs("bench_results", exist_ok=True)
    out = {
        "machine": {"cpu": cpu_model(), "threads": torch.get_num_threads(),
                    "load": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_commit(),
        "roofline": roofline,
        "torch": torch.__version__,
        "capacity_bytes": capacity,
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
