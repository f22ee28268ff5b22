"""torch.compile backends over a stream of sequence lengths: eager vs Inductor vs DVM.

    python python/bench/torch_bench.py            # BERT-base layer + 4-layer GPT, 32 lengths
    python python/bench/torch_bench.py --quick    # small models, 6 lengths (smoke run)

For each model (a BERT-base encoder layer: hidden 768, 12 heads, ffn 3072, post-norm, GELU;
and a GPT-style decoder: pre-norm, causal attention, tanh-GELU, tied shapes, random weights)
and each configuration (PyTorch eager; torch.compile with Inductor, dynamic=None and
dynamic=True; torch.compile with backend="dvm", dynamic=None and dynamic=True), in one process:

- total: wall time of one pass over the stream of distinct sequence lengths (first calls, so
  it includes every compilation and recompilation);
- steady: per length, the median of --reps further calls, interleaved across configurations
  (each rep calls every configuration in turn at each length, so a shared machine's load hits
  all alike); reported as the median over lengths and as the geometric mean of eager/config
  ratios ("x eager");
- overhead: total minus the sum of the steady-state latencies of the stream's lengths (what
  compiling, recompiling and first-shape work cost);
- compiles: graphs Dynamo compiled (torch._dynamo counters "unique_graphs");
- peak memory: the largest resident-set growth (RSS, sampled every 2 ms by a thread) over the
  config's first pass (compiles included), relative to the RSS before it (MiB). RSS counts torch's and
  DVM's C++ allocations, which tracemalloc cannot see; freed pages may stay resident, so
  read it as an upper bound.

Writes bench_results/torch_bench.json and bench_results/torch_bench.png; prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BertLayer(nn.Module):
    def __init__(self, d=768, heads=12, ffn=3072):
        super().__init__()
        self.h = heads
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, -1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v)
        x = self.ln1(x + self.o(a.transpose(1, 2).reshape(b, t, d)))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class GPTBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=8192, d=768, heads=12, layers=4, max_len=1024):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(GPTBlock(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    def __enter__(self):
        self.base = rss_bytes()
        self.peak = self.base
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop = True
        self._t.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def mib(self):
        return (self.peak - self.base) / 2**20


def unique_graphs():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def make_configs(no_inductor):
    import dvm.torch_backend  # noqa: F401  (registers "dvm" when not pip-installed)

    dvm.torch_backend.register()
    cfgs = [("eager", None)]
    if not no_inductor:
        cfgs += [("inductor dyn=None", dict(backend="inductor", dynamic=None)),
                 ("inductor dyn=True", dict(backend="inductor", dynamic=True))]
    cfgs += [("dvm dyn=None", dict(backend="dvm", dynamic=None)),
             ("dvm dyn=True", dict(backend="dvm", dynamic=True))]
    return cfgs


def bench_model(name, model, make_input, lengths, configs, reps):
    """Phase 1, per config in turn: one pass over the stream (total time, compiles, peak RSS).
    Phase 2, interleaved: for each rep and length, one call of every config in turn, so the
    load of a shared machine hits all configs alike; steady = median over reps per length."""
    inputs = {t: make_input(t) for t in lengths}
    fns, rows = {}, []
    torch._dynamo.reset()
    for i, (cfg_name, kw) in enumerate(configs):
        if kw is None:
            fn = model
        else:
            # a fresh code object per config: Dynamo's caches and automatic-dynamic state are
            # per code object, so configs do not share compiled graphs or size history
            code = compile("lambda x: m(x)", f"<{name}:{cfg_name}>", "eval")
            fn = torch.compile(eval(code, {"m": model}), **kw)  # noqa: S307
        g0 = unique_graphs()
        with torch.no_grad(), PeakRss() as mem:
            t0 = time.perf_counter()
            for t in lengths:
                fn(inputs[t])
            total = time.perf_counter() - t0
        fns[cfg_name] = fn
        rows.append(dict(model=name, config=cfg_name, total_s=total,
                         compiles=unique_graphs() - g0, peak_rss_mib=mem.mib))
        print(f"  {name:>10} | {cfg_name:<18} | total {total:8.2f} s | "
              f"compiles {rows[-1]['compiles']:2d} | peak RSS +{mem.mib:7.1f} MiB", flush=True)
    g1 = unique_graphs()
    times = {c: {t: [] for t in lengths} for c in fns}
    with torch.no_grad():
        for _ in range(reps):
            for t in lengths:
                for c, fn in fns.items():
                    s = time.perf_counter()
                    fn(inputs[t])
                    times[c][t].append(time.perf_counter() - s)
    recompiles = unique_graphs() - g1
    eager = {t: statistics.median(v) for t, v in times["eager"].items()}
    for row in rows:
        steady = {t: statistics.median(v) for t, v in times[row["config"]].items()}
        row["steady_ms"] = {str(t): 1e3 * v for t, v in steady.items()}
        row["steady_median_ms"] = 1e3 * statistics.median(steady.values())
        # what the first pass cost beyond running each length once at steady-state speed:
        # compilation, recompilation, first-shape encoding, warm-up
        row["overhead_s"] = row["total_s"] - sum(steady.values())
        row["speedup_vs_eager_geomean"] = math.exp(statistics.fmean(
            math.log(eager[t] / steady[t]) for t in lengths))
        print(f"  {name:>10} | {row['config']:<18} | steady median "
              f"{row['steady_median_ms']:8.2f} ms | x eager "
              f"{row['speedup_vs_eager_geomean']:5.2f}", flush=True)
    rows[0]["recompiles_in_steady_phase_all_configs"] = recompiles
    return rows


def machine():
    info = {"python": sys.version.split()[0], "torch": torch.__version__,
            "threads": torch.get_num_threads(), "platform": platform.platform()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Flags"):
                info[k.strip()] = v.strip() if k.strip() != "Flags" else (
                    "avx512f" in v and "AVX-512" or "avx2" in v and "AVX2" or "-")
    except OSError:
        pass
    try:
        info["commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    info["loadavg"] = os.getloadavg()
    return info


def check_accuracy(model, x):
    import dvm.torch_backend  # noqa: F401

    torch._dynamo.reset()
    c = torch.compile(model, backend="dvm", dynamic=True)
    with torch.no_grad():
        return (c(x) - model(x)).abs().max().item()


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 8), squeeze=False)
    for j, m in enumerate(models):
        mr = [r for r in rows if r["model"] == m]
        ax = axes[0][j]
        ax.bar([r["config"] for r in mr], [r["total_s"] for r in mr], color="C0")
        ax.set_yscale("log")
        ax.set_ylabel("total time over the stream incl. compiles (s, log)")
        ax.set_title(f"{m}: total time")
        ax.tick_params(axis="x", rotation=25)
        ax = axes[1][j]
        for r in mr:
            ts = sorted(int(t) for t in r["steady_ms"])
            ax.plot(ts, [r["steady_ms"][str(t)] for t in ts], marker=".", label=r["config"])
        ax.set_xlabel("sequence length")
        ax.set_ylabel("steady-state latency (ms, median)")
        ax.set_title(f"{m}: steady state per length")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small models, 6 lengths")
    ap.add_argument("--no-inductor", action="store_true", help="skip Inductor (no C++ compile)")
    ap.add_argument("--lengths", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for PyTorch and DVM alike (0: all cores); 1 is steadier on a "
                         "shared machine")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench_results"))
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
        os.environ["DVM_NUM_THREADS"] = str(a.threads)  # read when DVM's pool starts
    torch.manual_seed(0)
    rnd = random.Random(0)
    if a.quick:
        d, heads, ffn, layers, vocab = 128, 4, 512, 2, 512
        n = min(a.lengths, 6)
        lengths = rnd.sample(range(8, 65), n)
    else:
        d, heads, ffn, layers, vocab = 768, 12, 3072, 4, 8192
        n = a.lengths
        lengths = rnd.sample(range(16, 257), n)  # distinct, in random order
    bert = BertLayer(d, heads, ffn).eval()
    gpt = GPT(vocab, d, heads, layers).eval()
    b = a.batch
    # batch must not equal a length at the first call (duck sizing would tie them)
    models = [
        ("bert_layer", bert, lambda t: torch.randn(b, t, d)),
        ("gpt", gpt, lambda t: torch.randint(0, vocab, (b, t))),
    ]
    configs = make_configs(a.no_inductor)
    info = machine()
    info["dvm_threads"] = os.environ.get("DVM_NUM_THREADS", "all")
    print(f"machine: {info.get('Model name', '?')}, {info.get('CPU(s)', '?')} CPUs, "
          f"load {info['loadavg']}, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads (DVM: {info['dvm_threads']}); "
          f"lengths ({len(lengths)}): {lengths}")
    rows, acc = [], {}
    for name, model, mk in models:
        acc[name] = check_accuracy(model, mk(lengths[0]))
        print(f"{name}: max |dvm - eager| = {acc[name]:.2e}")
        rows += bench_model(name, model, mk, lengths, configs, a.reps)
    os.makedirs(a.out, exist_ok=True)
    res = dict(machine=info, quick=a.quick, batch=b, lengths=lengths,
               dims=dict(hidden=d, heads=heads, ffn=ffn, gpt_layers=layers, vocab=vocab),
               max_abs_err_vs_eager=acc, rows=rows)
    jpath = os.path.join(a.out, "torch_bench.json")
    with open(jpath, "w") as f:
        json.dump(res, f, indent=1)
    ppath = os.path.join(a.out, "torch_bench.png")
    plot(rows, ppath)
    print("\n| model | config | total s | overhead s | compiles | steady median ms | "
          "steady x eager | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['config']} | {r['total_s']:.2f} | {r['overhead_s']:.2f} | "
              f"{r['compiles']} | "
              f"{r['steady_median_ms']:.2f} | {r.get('speedup_vs_eager_geomean', 1):.2f} | "
              f"{r['peak_rss_mib']:.0f} |")
    for m in dict.fromkeys(r["model"] for r in rows):
        by = {r["config"]: r for r in rows if r["model"] == m}
        for ind in ("inductor dyn=None", "inductor dyn=True"):
            if ind in by and "dvm dyn=None" in by:
                print(f"{m}: total time {ind} / dvm dyn=None = "
                      f"{by[ind]['total_s'] / by['dvm dyn=None']['total_s']:.1f}x")
    print(f"wrote {jpath} and {ppath}")


if __name__ == "__main__":
    main()
