"""Memory-bound subgraphs through torch.compile: eager vs DVM vs Inductor, at dynamic shapes.

    python python/bench/subgraph_bench.py                  # 7 subgraphs x 3 shapes, 20 rounds
    python python/bench/subgraph_bench.py --rounds 10 --threads 1
    python python/bench/subgraph_bench.py --no-inductor    # skip Inductor (no C++ compile)
    python python/bench/subgraph_bench.py --only rmsnorm softmax_mask

Each subgraph is a plain Python function of f32 CPU tensors, the kind of fragment a model's
graph is made of between its matmuls: residual add + LayerNorm, RMSNorm, masked scaled softmax
over attention scores, silu(a) * b, GELU(x + bias), cross-entropy from logits, rotary
embedding (rotate_half by slices + cat, as HF Llama). Each runs at 3 shapes (batch 2-4,
sequence lengths 128 / 301 / 1024) under these configurations, in one process:

- eager: the function itself, op by op;
- dvm: torch.compile(fn, backend="dvm", dynamic=True);
- inductor: torch.compile(fn, backend="inductor", dynamic=True) (--no-inductor skips it).

Per subgraph (torch._dynamo.reset() between subgraphs; a fresh code object per configuration,
so configurations share no Dynamo cache entries), each configuration is compiled once and called
at each shape in turn: the first call's time is recorded separately (first-call ms: compilation
at the first shape; recompilation or DVM's per-shape encoding at the others), and its output is
checked against eager (torch.testing.assert_close, rtol 1e-4 / atol 1e-5; cross-entropy
rtol 2e-4 / atol 1e-4): a mismatch or an exception is recorded as a failure, not raised.
Steady state is then measured interleaved: for R rounds (--rounds), every configuration is called
in turn at each shape; a timed sample is enough back-to-back calls (time.perf_counter) to last
>= --min-sample-ms (2 ms), divided by their number. Reported: the median over rounds (µs per
call), speedups eager/dvm and inductor/dvm (> 1: DVM faster), their geometric means per subgraph
(over shapes) and overall (over every subgraph and shape; failed cells left out).

--threads N (default: torch.get_num_threads()) sets torch.set_num_threads(N) and
DVM_NUM_THREADS=N before dvm is imported, so both sides run on the same number of threads. On a
machine where other processes keep cores busy (their use + N > cores), PyTorch's OpenMP regions
(eager, Inductor) wait for preempted threads at every barrier and run many times slower than
alone; the figures then measure that, not the kernels. So the harness records, per subgraph, the
cores other processes kept busy during its timed rounds (/proc/stat less this process's CPU
time); perf_report.py marks oversubscribed runs. Use --threads 1 or an idle machine.

Writes bench_results/subgraph_bench.json (machine, date, commit, settings; per subgraph: the
graphs compiled, recompiles in the timed rounds, DVM's partition/fallback counters, other
processes' CPU use; per shape: medians, fastest sample and p25/p75, first calls, checks, max
|diff| against eager, speedups; geomeans; failures) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---------------------------------------------------------------------------------------------
# Subgraphs


def add_layernorm(x, res, w, b):
    return F.layer_norm(x + res, (x.shape[-1],), w, b, eps=1e-12)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def softmax_mask(scores, mask):
    return torch.softmax(scores * 0.125 + mask, dim=-1)  # 0.125 = 1/sqrt(head dim 64)


def silu_mul(a, b):
    return F.silu(a) * b


def gelu_bias(x, bias):
    return F.gelu(x + bias)


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(q, cos, sin):
    return q * cos + rotate_half(q) * sin


def _padding_mask(b, s, g):
    """[b, 1, 1, s] additive mask as HF builds it: 0 where attended, finfo.min on padding (batch
    row i > 0 pads its last i * s / 8 keys)."""
    m = torch.zeros(b, 1, 1, s)
    for i in range(1, b):
        m[i, ..., s - i * s // 8:] = torch.finfo(torch.float32).min
    return m


def _rope(s, d=64):
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos(), emb.sin()


def _inputs(name, shape, g):
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    if name == "add_layernorm":
        b, s, h = shape
        return r(b, s, h), r(b, s, h), 1 + 0.1 * r(h), 0.1 * r(h)
    if name == "rmsnorm":
        b, s, h = shape
        return r(b, s, h), 1 + 0.1 * r(h)
    if name == "softmax_mask":
        b, nh, s = shape
        return 4 * r(b, nh, s, s), _padding_mask(b, s, g)
    if name == "silu_mul":
        b, s, f = shape
        return r(b, s, f), r(b, s, f)
    if name == "gelu_bias":
        b, s, f = shape
        return r(b, s, f), r(f)
    if name == "cross_entropy":
        n, v = shape
        return 3 * r(n, v), torch.randint(0, v, (n,), generator=g)
    if name == "rotary":
        b, nh, s, d = shape
        cos, sin = _rope(s, d)
        return r(b, nh, s, d), cos, sin
    raise KeyError(name)


# name, function, description, shapes (no two different dimensions equal at the first shape:
# Dynamo's duck sizing would tie them and recompile at the next), tolerance (rtol, atol)
F32_TOL = (1e-4, 1e-5)
SUBGRAPHS = [
    ("add_layernorm", add_layernorm, "LayerNorm(x + res) with weight, bias; [B, S, 768]",
     [(2, 128, 768), (3, 301, 768), (4, 1024, 768)], F32_TOL),
    ("rmsnorm", rmsnorm, "x * rsqrt(mean(x^2) + eps) * w; [B, S, 4096]",
     [(2, 128, 4096), (3, 301, 4096), (4, 1024, 4096)], F32_TOL),
    ("softmax_mask", softmax_mask,
     "softmax(scores * 1/8 + mask) over [B, 12, S, S], additive padding mask [B, 1, 1, S]",
     [(4, 12, 128), (3, 12, 301), (2, 12, 1024)], F32_TOL),
    ("silu_mul", silu_mul, "silu(a) * b; [B, S, 11008] (Llama-7B MLP)",
     [(2, 128, 11008), (3, 301, 11008), (2, 1024, 11008)], F32_TOL),
    ("gelu_bias", gelu_bias, "gelu(x + bias) (erf); [B, S, 3072] (BERT-base FFN)",
     [(2, 128, 3072), (3, 301, 3072), (4, 1024, 3072)], F32_TOL),
    ("cross_entropy", cross_entropy, "F.cross_entropy(logits [N, V], int64 targets [N]), mean",
     [(256, 8192), (903, 8192), (4096, 8192)], (2e-4, 1e-4)),
    ("rotary", rotary, "q * cos + rotate_half(q) * sin; q [B, 32, S, 64], cos/sin [S, 64]",
     [(2, 32, 128, 64), (3, 32, 301, 64), (4, 32, 1024, 64)], F32_TOL),
]


def shape_label(shape):
    return "x".join(str(d) for d in shape)


# ---------------------------------------------------------------------------------------------
# Measurement


def cpu_sample():
    """(wall s, busy CPU s of the whole machine from /proc/stat, CPU s of this process)."""
    busy = None
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    return time.perf_counter(), busy, t.user + t.system


def others_cores(a, b):
    """Cores other processes kept busy on average between two cpu_sample()s."""
    if a[1] is None or b[1] is None or b[0] <= a[0]:
        return None
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / (b[0] - a[0]))


def unique_graphs():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def make_fn(name, fn, cfg):
    if cfg == "eager":
        return fn
    # a fresh code object per config: Dynamo's cache entries and automatic-dynamic state are per
    # code object, so the configurations do not share compiled graphs
    code = compile("lambda *a: f(*a)", f"<{name}:{cfg}>", "eval")
    return torch.compile(eval(code, {"f": fn}), backend=cfg, dynamic=True)  # noqa: S307


def short_error(e):
    """The exception's type and first lines (assert_close: the mismatch counts and largest
    differences), at most 300 characters."""
    msg = " / ".join(l.strip() for l in str(e).strip().splitlines()[:4] if l.strip())
    return f"{type(e).__name__}: {msg[:300]}"


def max_abs_err(out, ref):
    try:
        return float((out.double() - ref.double()).abs().max())
    except Exception:  # noqa: BLE001
        return None


def bench_subgraph(name, fn, shapes, tol, configs, rounds, min_sample_s, dvm_stats):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    labels = [shape_label(s) for s in shapes]
    inputs = {lab: _inputs(name, s, g) for lab, s in zip(labels, shapes)}
    cells = {lab: {"shape": list(s), "first_call_ms": {}, "check": {}, "max_abs_err": {},
                   "errors": {}} for lab, s in zip(labels, shapes)}
    fns, graphs, dvm_counts = {}, {}, None
    ref = {}
    with torch.no_grad():
        for cfg in configs:
            fns[cfg] = make_fn(name, fn, cfg)
            g0 = unique_graphs()
            if cfg == "dvm":
                dvm_stats("reset")
            for lab in labels:
                c = cells[lab]
                try:
                    t0 = time.perf_counter()
                    out = fns[cfg](*inputs[lab])
                    c["first_call_ms"][cfg] = 1e3 * (time.perf_counter() - t0)
                except Exception as e:  # noqa: BLE001
                    c["check"][cfg] = "error"
                    c["errors"][cfg] = short_error(e)
                    continue
                if cfg == "eager":
                    ref[lab] = out
                    c["check"][cfg] = "ok"
                    continue
                if lab not in ref:  # eager itself failed: nothing to compare against
                    c["check"][cfg] = "unchecked"
                    continue
                c["max_abs_err"][cfg] = max_abs_err(out, ref[lab])
                try:
                    torch.testing.assert_close(out, ref[lab], rtol=tol[0], atol=tol[1])
                    c["check"][cfg] = "ok"
                except AssertionError as e:
                    c["check"][cfg] = "mismatch"
                    c["errors"][cfg] = short_error(e)
                for _ in range(2):  # warm: caches, allocator, DVM's per-shape plan
                    fns[cfg](*inputs[lab])
            graphs[cfg] = unique_graphs() - g0
            if cfg == "dvm":
                dvm_counts = dvm_stats("get")
        # calls per timed sample, per config and shape
        reps = {}
        for lab in labels:
            for cfg in configs:
                if cells[lab]["check"].get(cfg) == "error":
                    continue
                ts = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    fns[cfg](*inputs[lab])
                    ts.append(time.perf_counter() - t0)
                reps[(cfg, lab)] = max(1, math.ceil(min_sample_s / max(min(ts), 1e-7)))
        g1 = unique_graphs()
        c0 = cpu_sample()
        samples = {k: [] for k in reps}
        for _ in range(rounds):
            for lab in labels:
                args = inputs[lab]
                for cfg in configs:
                    n = reps.get((cfg, lab))
                    if n is None:
                        continue
                    f = fns[cfg]
                    t0 = time.perf_counter()
                    for _ in range(n):
                        f(*args)
                    samples[(cfg, lab)].append((time.perf_counter() - t0) / n)
        steady_recompiles = unique_graphs() - g1
        others = others_cores(c0, cpu_sample())
    rows = []
    for lab in labels:
        c = cells[lab]
        c["us"] = {cfg: 1e6 * statistics.median(samples[(cfg, lab)])
                   for cfg in configs if (cfg, lab) in samples}
        # spread over rounds (noise on a shared machine): fastest sample and interquartile range
        c["us_min"] = {cfg: 1e6 * min(samples[(cfg, lab)])
                       for cfg in configs if (cfg, lab) in samples}
        quart = {cfg: statistics.quantiles(samples[(cfg, lab)], n=4)
                 for cfg in configs if len(samples.get((cfg, lab), ())) >= 2}
        c["us_iqr"] = {cfg: [1e6 * q[0], 1e6 * q[2]] for cfg, q in quart.items()}  # p25, p75
        c["calls_per_sample"] = {cfg: reps[(cfg, lab)] for cfg in configs if (cfg, lab) in reps}
        us, ok = c["us"], c["check"]
        c["speedup"] = {}
        if "dvm" in us:
            for base in ("eager", "inductor"):
                if base in us:
                    c["speedup"][f"{base}/dvm"] = us[base] / us["dvm"]
        # a speedup counts (geomeans) only when both sides matched eager
        c["valid"] = {k: ok.get("dvm") == "ok" and ok.get(k.split("/")[0]) == "ok"
                      for k in c["speedup"]}
        rows.append(dict(label=lab, **c))
    res = dict(name=name, function=fn.__name__, description=None, tolerance=list(tol),
               graphs_compiled=graphs, steady_phase_recompiles=steady_recompiles,
               other_processes_cores=others,
               dvm_stats=dvm_counts, shapes=rows)
    res["geomean"] = {k: geomean([r["speedup"].get(k) for r in rows if r["valid"].get(k)])
                      for k in ("eager/dvm", "inductor/dvm")}
    return res


def geomean(values):
    vs = [v for v in values if v is not None and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in vs)) if vs else None


# ---------------------------------------------------------------------------------------------
# Machine


def machine(threads, dvm_threads):
    info = {"python": sys.version.split()[0], "torch": torch.__version__,
            "platform": platform.platform(), "threads": threads, "dvm_threads": dvm_threads,
            "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k.strip() == "model name":
                    info["cpu"] = v.strip()
                elif k.strip() == "flags" and "simd" not in info:
                    fl = v.split()
                    info["simd"] = "AVX-512" if "avx512f" in fl else "AVX2" if "avx2" in fl \
                        else "NEON" if "asimd" in fl else "-"
    except OSError:
        pass
    info["cpu"] = info.get("cpu") or platform.processor() or platform.machine()
    info["loadavg"] = list(os.getloadavg())
    info["date"] = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    try:
        git = ["git", "-C", ROOT]
        info["commit"] = subprocess.run(git + ["rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True).stdout.strip() or None
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        info["worktree_dirty"] = bool(dirty)
    except OSError:
        info["commit"] = None
    return info


# ---------------------------------------------------------------------------------------------


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for PyTorch and DVM alike (default: torch.get_num_threads())")
    ap.add_argument("--no-inductor", action="store_true", help="skip Inductor (no C++ compile)")
    ap.add_argument("--min-sample-ms", type=float, default=2.0,
                    help="a timed sample repeats the call until it lasts at least this long")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="run only these subgraphs: " + ", ".join(s[0] for s in SUBGRAPHS))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench_results"))
    a = ap.parse_args()

    threads = a.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    os.environ["DVM_NUM_THREADS"] = str(threads)  # read when DVM's pool starts: before import
    import dvm  # noqa: F401
    import dvm.torch_backend

    dvm.torch_backend.register()

    def dvm_stats(what):
        if what == "reset":
            dvm.torch_backend.reset_stats()
            return None
        return dvm.torch_backend.stats()

    configs = ["eager", "dvm"] + ([] if a.no_inductor else ["inductor"])
    subgraphs = [s for s in SUBGRAPHS if not a.only or s[0] in a.only]
    info = machine(threads, threads)
    print(f"machine: {info.get('cpu')}, {info['cores']} cores, {info.get('simd', '?')}, torch "
          f"{info['torch']}, {threads} threads (torch and DVM), load {info['loadavg']}, "
          f"commit {info.get('commit')}{' (dirty)' if info.get('worktree_dirty') else ''}; "
          f"{a.rounds} rounds", flush=True)
    t_start = time.perf_counter()
    results = []
    for name, fn, desc, shapes, tol in subgraphs:
        t0 = time.perf_counter()
        r = bench_subgraph(name, fn, shapes, tol, configs, a.rounds, a.min_sample_ms / 1e3,
                           dvm_stats)
        r["description"] = desc
        results.append(r)
        for c in r["shapes"]:
            fails = ", ".join(f"{k} {v}" for k, v in c["check"].items() if v != "ok")
            print(f"  {name:<14} {c['label']:>14} | "
                  + " ".join(f"{k} {fmt(c['us'].get(k), 1):>9} us" for k in configs)
                  + " | " + " ".join(f"{k} {fmt(v)}" for k, v in c["speedup"].items())
                  + (f" | FAILED: {fails}" if fails else ""), flush=True)
        print(f"  {name:<14} geomean "
              + " ".join(f"{k} {fmt(v)}" for k, v in r["geomean"].items())
              + f" | graphs {r['graphs_compiled']} | steady recompiles "
              f"{r['steady_phase_recompiles']} | other processes "
              f"{fmt(r['other_processes_cores'])} cores | {time.perf_counter() - t0:.0f} s",
              flush=True)

    overall = {k: geomean([c["speedup"].get(k) for r in results for c in r["shapes"]
                           if c["valid"].get(k)]) for k in ("eager/dvm", "inductor/dvm")}
    failures = [dict(subgraph=r["name"], shape=c["label"], config=k, check=c["check"][k],
                     error=c["errors"].get(k)) for r in results for c in r["shapes"]
                for k in c["check"] if c["check"][k] != "ok"]
    info["loadavg_end"] = list(os.getloadavg())
    import torch._inductor.config as inductor_config
    out = dict(machine=info, rounds=a.rounds, min_sample_ms=a.min_sample_ms, configs=configs,
               inductor_skipped=a.no_inductor,
               # on, Inductor's first calls may load kernels compiled by an earlier run from disk
               inductor_fx_graph_cache=bool(inductor_config.fx_graph_cache),
               wall_s=time.perf_counter() - t_start, subgraphs=results, geomean=overall,
               failures=failures)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "subgraph_bench.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)

    hdr = ["subgraph", "shape", "eager µs", "DVM µs"] + (["Inductor µs"] if "inductor" in
                                                          configs else [])
    hdr += ["eager/DVM"] + (["Inductor/DVM"] if "inductor" in configs else [])
    hdr += ["first call ms DVM"] + (["first call ms Inductor"] if "inductor" in configs else [])
    hdr += ["DVM p75/p25", "check"]
    print("\n| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---" for _ in hdr) + "|")
    for r in results:
        for c in r["shapes"]:
            row = [r["name"], c["label"]] + [fmt(c["us"].get(k), 1) for k in configs]
            row += [fmt(c["speedup"].get(f"{k}/dvm")) for k in configs if k != "dvm"]
            row += [fmt(c["first_call_ms"].get(k), 1) for k in configs if k != "eager"]
            q = c["us_iqr"].get("dvm")
            row.append(fmt(q[1] / q[0] if q and q[0] > 0 else None))
            bad = [f"{k} {v}" for k, v in c["check"].items() if v != "ok"]
            row.append("; ".join(bad) or "ok")
            print("| " + " | ".join(row) + " |")
    print("\ngeomean per subgraph (eager/DVM, Inductor/DVM; > 1: DVM faster):")
    for r in results:
        print(f"  {r['name']:<14} {fmt(r['geomean']['eager/dvm'])}  "
              f"{fmt(r['geomean']['inductor/dvm'])}")
    print(f"overall geomean: eager/DVM {fmt(overall['eager/dvm'])}, Inductor/DVM "
          f"{fmt(overall['inductor/dvm'])}")
    if failures:
        print("failures:")
        for fl in failures:
            print(f"  {fl['subgraph']} {fl['shape']} {fl['config']}: {fl['check']}: "
                  f"{fl['error']}")
    print(f"wrote {os.path.relpath(path)} ({out['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
