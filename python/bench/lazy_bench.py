"""Lazy mode against eager PyTorch, in one run: a greedy decoding loop of a small GPT-2-style
model whose sequence grows every step, and a loop whose trip count depends on the data.

    python3 python/bench/lazy_bench.py [--quick] [--threads N] [--out bench_results/lazy.json]

Prints a table (time per step, total, kernels per step) and writes JSON under bench_results/.
The model follows HF GPT-2's eager code path: attention as q @ k^T, masked_fill, softmax, @ v,
and the tanh GELU written as elementwise ops (NewGELUActivation).
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import dvm


class NewGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Attention(nn.Module):
    def __init__(self, c, heads, max_len):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        hd = c // self.heads
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, c, heads, max_len):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c)
        self.attn = Attention(c, heads, max_len)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.act = NewGELU()
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(self.act(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=1024, c=256, heads=4, layers=4, max_len=512):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(max_len, c)
        self.blocks = nn.ModuleList(Block(c, heads, max_len) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        pos = torch.arange(t, dtype=torch.long)
        x = self.wte(ids) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def greedy_decode(model, prompt, steps):
    """Generates `steps` tokens; observes each (as a streaming decoder does). Returns the tokens
    and per-step times."""
    ids = prompt
    tokens, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = model(ids)
        nxt = logits[:, -1, :].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        tokens.append(nxt.item())
        times.append(time.perf_counter() - t0)
    return tokens, times


def refine(x, w, b, tol):
    """A fixed-point iteration (a contraction) that stops when the update is small: the trip
    count depends on the data. Returns the iterate and per-iteration times."""
    times = []
    for _ in range(500):
        t0 = time.perf_counter()
        y = 0.5 * x + 0.5 * torch.tanh(x @ w + b)
        delta = (y - x).abs().amax()
        x = y
        done = delta.item() < tol
        times.append(time.perf_counter() - t0)
        if done:
            break
    return x, times


def kernels_per_step(fn, steps):
    dvm.lazy.reset_stats()
    fn()
    s = dvm.lazy.stats()
    return (s.kernels_launched + s.native_launched) / steps, s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    ap.add_argument("--threads", type=int, default=0, help="torch and DVM threads (0: all)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="eager and lazy runs alternate this many times; per-step medians over "
                         "all rounds (the machine may be shared: interleaving evens out load)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
        os.environ["DVM_NUM_THREADS"] = str(a.threads)
    torch.manual_seed(0)
    steps = 12 if a.quick else 48
    rounds = 1 if a.quick else max(1, a.rounds)
    model = GPT().eval()
    prompt = torch.randint(0, 1024, (1, 16))
    rows, results = [], {}

    with torch.no_grad():
        # Warm-up both (first lazy call compiles the plan).
        greedy_decode(model, prompt, 3)
        with dvm.lazy(freeze_weights=True):
            greedy_decode(model, prompt, 3)
        t_e, t_l, s = [], [], None
        for _ in range(rounds):
            tok_e, t = greedy_decode(model, prompt, steps)
            t_e += t
            # Every round meets each length for the first time, as one decode does: plans are
            # recompiled at another length first (not timed), so each step encodes its programs.
            dvm.lazy.clear_plan_cache()
            with dvm.lazy(freeze_weights=True):
                greedy_decode(model, prompt[:, :8], 3)
            dvm.lazy.reset_stats()
            with dvm.lazy(freeze_weights=True):
                tok_l, t = greedy_decode(model, prompt, steps)
            t_l += t
            s = dvm.lazy.stats()  # of the last lazy round
        # Eager kernel count: aten ops per step, by a counting dispatch mode.
        n_ops = count_aten_ops(lambda: greedy_decode(model, prompt, 1))
        same = tok_e == tok_l
        results["gpt_greedy_decode"] = summarize(t_e, t_l, s, steps, n_ops, same,
                                                 {"prompt": 16, "steps": steps, "hidden": 256,
                                                  "layers": 4, "heads": 4, "vocab": 1024,
                                                  "rounds": rounds})

        w = torch.randn(256, 256) / 64
        b = torch.randn(256)
        x0 = torch.randn(512, 256)
        tol = 1e-3 if a.quick else 1e-6
        refine(x0, w, b, 1e-2)
        with dvm.lazy(freeze_weights=True):
            refine(x0, w, b, 1e-2)
        r_e, r_l = [], []
        for _ in range(rounds):
            xe, t = refine(x0, w, b, tol)
            r_e += t
            n_e = len(t)
            dvm.lazy.reset_stats()
            with dvm.lazy(freeze_weights=True):
                xl, t = refine(x0, w, b, tol)
            r_l += t
            n_l = len(t)
            s2 = dvm.lazy.stats()
        n_ops2 = count_aten_ops(lambda: refine(x0, w, b, 1e9))
        same2 = abs(n_e - n_l) <= 1 and torch.allclose(xe, xl, atol=1e-4)
        results["data_dependent_loop"] = summarize(r_e, r_l, s2, n_l, n_ops2, same2,
                                                   {"rows": 512, "hidden": 256, "tol": tol,
                                                    "iterations_eager": n_e,
                                                    "iterations_lazy": n_l, "rounds": rounds})

    print_table(results)
    write_json(results, a.out)


def count_aten_ops(fn):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def summarize(t_eager, t_lazy, s, steps, eager_ops, same, config):
    """t_eager / t_lazy: per-step times of every round; `s`: stats of the last lazy round
    (`steps` steps). Totals are per round (the median round)."""
    me, ml = statistics.median(t_eager), statistics.median(t_lazy)
    rounds = config.get("rounds", 1)
    per = lambda t: statistics.median(
        sum(t[i * len(t) // rounds:(i + 1) * len(t) // rounds]) for i in range(rounds))
    lazy_round = t_lazy[-len(t_lazy) // rounds:]
    return {
        "config": config,
        "steps": steps,
        "eager_ms_per_step": me * 1e3,
        "lazy_ms_per_step": ml * 1e3,
        "speedup_per_step": me / ml,
        "eager_total_ms": per(t_eager) * 1e3,
        "lazy_total_ms": per(t_lazy) * 1e3,
        "speedup_total": per(t_eager) / per(t_lazy),
        "eager_aten_ops_per_step": eager_ops,
        "lazy_kernels_per_step": (s.kernels_launched + s.native_launched) / max(steps, 1),
        "flushes": s.flushes,
        "plan_cache_hits": s.plan_cache_hits,
        "plan_cache_misses": s.plan_cache_misses,
        "intermediates_elided": s.intermediates_elided,
        "values_stored": s.values_stored,
        "compile_ms": s.compile_us / 1e3,
        "encode_ms": s.encode_us / 1e3,
        # Where a lazy step goes: recording (Python dispatch + handlers), encoding bytecode for
        # the new shapes, running the kernels; per step.
        "lazy_flush_ms_per_step": s.flush_us / 1e3 / max(steps, 1),
        "lazy_encode_ms_per_step": s.encode_us / 1e3 / max(steps, 1),
        "lazy_run_ms_per_step": (s.run_us - s.encode_us) / 1e3 / max(steps, 1),
        "lazy_record_ms_per_step": max(sum(lazy_round) * 1e3 - s.flush_us / 1e3, 0) / max(steps, 1),
        "same_result": bool(same),
    }


def print_table(results):
    hdr = f"{'workload':<22}{'eager ms/step':>14}{'lazy ms/step':>14}{'speedup':>9}{'eager total ms':>16}{'lazy total ms':>15}{'eager ops/step':>16}{'lazy kernels/step':>19}{'plan hit/miss':>15}{'same':>6}"
    print(hdr)
    print("-" * len(hdr))
    notes = []
    for name, r in results.items():
        print(f"{name:<22}{r['eager_ms_per_step']:>14.2f}{r['lazy_ms_per_step']:>14.2f}{r['speedup_per_step']:>8.2f}x"
              f"{r['eager_total_ms']:>16.1f}{r['lazy_total_ms']:>15.1f}{r['eager_aten_ops_per_step']:>16}"
              f"{r['lazy_kernels_per_step']:>19.1f}{str(r['plan_cache_hits']) + '/' + str(r['plan_cache_misses']):>15}{str(r['same_result']):>6}")
        notes.append(f"  {name}: lazy step = record {r['lazy_record_ms_per_step']:.2f} + encode "
                     f"{r['lazy_encode_ms_per_step']:.2f} + run {r['lazy_run_ms_per_step']:.2f} + other "
                     f"{r['lazy_flush_ms_per_step'] - r['lazy_encode_ms_per_step'] - r['lazy_run_ms_per_step']:.2f} ms (mean)")
    print("\n".join(notes))


def machine():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), "?")
    except OSError:
        model = platform.processor()
    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "dvm_threads": os.environ.get("DVM_NUM_THREADS", "all"),
            "load_average": os.getloadavg()}


def write_json(results, path):
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    path = path or os.path.join(root, "bench_results", "lazy_bench.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                   "results": results}, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
