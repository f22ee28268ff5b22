"""Model-sized weights: DVM's packed-weight cache against its capacity, and against eager.

    python python/bench/weights_bench.py [--sizes-gib 0.5 1.25] [--rows 1 16 128] [--rounds 5]
                                         [--dtypes f32 bf16]

A stack of `x = x + Linear(F->H)(gelu(Linear(H->F)(x)))` blocks (H = 2048, F = 8192; f32 (128
MiB of weights per block) or bf16 weights and activations (64 MiB)) through torch.compile(backend="dvm", dynamic=True). Configurations,
measured in alternating rounds in one process (per-call medians over all rounds):

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
import json
import os
import platform
import statistics
import time

import torch

import dvm
import dvm.torch_backend  # noqa: F401  (registers "dvm" when not pip-installed)

HIDDEN, FFN = 2048, 8192


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, FFN)
        self.down = torch.nn.Linear(FFN, HIDDEN)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def make_model(gib, dtype):
    per_block = 2 * HIDDEN * FFN * dtype.itemsize
    blocks = max(1, round(gib * 2**30 / per_block))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block() for _ in range(blocks)]).to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, blocks * per_block


def time_call(fn, x):
    t = time.perf_counter()
    fn(x)
    return (time.perf_counter() - t) * 1e3


def bench(gib, rows, rounds, capacity, dtype_name):
    dtype = DTYPES[dtype_name]
    model, weight_bytes = make_model(gib, dtype)
    x = torch.randn(rows, HIDDEN, dtype=dtype)
    # bf16 results are rounded to 8 bits of mantissa, in a different order than eager's.
    tol = 1e-3 if dtype == torch.float32 else 1e-2
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
    with torch.no_grad():
        want = model(x)
        for name, fn in fns.items():  # compile + warm (and check) each
            dvm.set_weight_cache_capacity(caps.get(name, capacity))
            got = fn(x)
            if dtype == torch.float32:
                torch.testing.assert_close(got, want, rtol=tol, atol=tol)
            else:  # a few elements of many differ by more than bf16's rounding: a norm
                err = (got.float() - want.float()).norm() / want.float().norm()
                assert err < tol, f"{name}: relative error {err:.3g} of eager's bf16 result"
        for _ in range(rounds):
            for name, fn in fns.items():
                dvm.clear_weight_cache()
                dvm.set_weight_cache_capacity(caps.get(name, capacity))
                fn(x)  # first call after a clear fills the cache
                fn(x)
                before = dvm.weight_cache_stats()
                for _ in range(2):
                    samples[name].append(time_call(fn, x))
                after = dvm.weight_cache_stats()
                packs.setdefault(name, []).append((after.packs - before.packs) / 2)
                held[name] = after.bytes
    dvm.set_weight_cache_capacity(capacity)
    dvm.clear_weight_cache()
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "weights_gib": weight_bytes / 2**30,
        "dtype": dtype_name,
        "rows": rows,
        "ms": med,
        "speedup_vs_eager": {k: med["eager"] / v for k, v in med.items()},
        "packs_per_call": {k: statistics.median(v) for k, v in packs.items()},
        "cache_bytes": held,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-gib", type=float, nargs="+", default=[0.5, 1.25])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 128])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtypes", nargs="+", default=["f32"], choices=sorted(DTYPES))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    capacity = dvm.weight_cache_stats().capacity
    results = []
    for dtype_name in args.dtypes:
        for gib in args.sizes_gib:
            for rows in args.rows:
                r = bench(gib, rows, args.rounds, capacity, dtype_name)
                results.append(r)
                cells = "  ".join(f"{k} {v:.1f} ms ({r['speedup_vs_eager'][k]:.2f}x)"
                                  for k, v in r["ms"].items())
                print(f"{dtype_name} {r['weights_gib']:.2f} GiB  M={rows}: {cells}  "
                      f"packs/call {r['packs_per_call']}  cache MiB "
                      f"{ {k: v >> 20 for k, v in r['cache_bytes'].items()} }", flush=True)
    os.makedirs("bench_results", exist_ok=True)
    out = {
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "threads": torch.get_num_threads(), "load": os.getloadavg()},
        "torch": torch.__version__,
        "capacity_bytes": capacity,
        "results": results,
    }
    with open("bench_results/weights_bench.json", "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
