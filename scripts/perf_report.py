#!/usr/bin/env python3
"""Writes docs/performance.md from the benchmarks' JSON in bench_results/.

    python3 scripts/perf_report.py [--results bench_results] [--out docs/performance.md]

Reads, when present (standard library only, nothing is run):
- Google Benchmark JSON from bench/run_benchmarks.sh: encode_bench, vm_bench, vm_suite_bench,
  matmul_bench, gemm_bench, graph_bench (bench_results/<name>.json), with bench_results/machine.txt (CPU
  model, cores, SIMD, commit, load before the run);
- the Python harnesses' JSON: python/bench/matmul_bench.py (bench_results/matmul_bench.json,
  the same name as the C++ matmul_bench's: the format tells them apart), torch_bench.py,
  lazy_bench.py, weights_bench.py, subgraph_bench.py.

For each benchmark found it writes the machine and conditions recorded with it, the date and
commit (where the harness records them; otherwise the file's time and "not recorded"), and
tables of the figures with ratios against the baseline measured in the same run. A missing
file gets one line saying how to produce it.

Everything in the output file after the KEEP_MARKER line is kept as it is (figures carried
over from earlier runs that no harness regenerates).
"""

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP_MARKER = ("<!-- perf_report.py: everything below this line is kept as it is when the file "
               "is regenerated -->")

# ---------------------------------------------------------------------------------------------
# Formatting


def fmt(v, digits=2):
    """A number with `digits` decimals; '-' for missing values."""
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "-"
    if isinstance(v, int):
        return str(v)
    return f"{v:.{digits}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def geomean(values):
    vs = [v for v in values if v is not None and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in vs)) if vs else None


def table(headers, rows, numeric_from=1):
    """A Markdown table; columns from `numeric_from` on are right-aligned."""
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---" if i < numeric_from else "---:" for i in range(len(headers))) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return out


def elems(n):
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def load_text(v):
    if isinstance(v, (list, tuple)):
        return " / ".join(f"{x:.2f}" for x in v)
    return str(v)


def file_time(path):
    t = datetime.datetime.fromtimestamp(os.path.getmtime(path))
    return t.strftime("%Y-%m-%d %H:%M") + " (file time; the harness records no date)"


# ---------------------------------------------------------------------------------------------
# Inputs


UNREADABLE = object()  # a file that exists but holds no valid JSON


def read_json(path):
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return UNREADABLE


def is_gbench(data):
    return isinstance(data, dict) and "benchmarks" in data and "context" in data


def read_machine_txt(results, name="machine.txt"):
    """bench_results/machine.txt (or a benchmark's own <name>.machine.txt, written with its
    JSON by run_benchmarks.sh) as a dict (first line: the CPU model), or None."""
    path = os.path.join(results, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        lines = [l.rstrip("\n") for l in f if l.strip()]
    info = {"path": path, "mtime": os.path.getmtime(path)}
    for i, line in enumerate(lines):
        key, sep, val = line.partition(":")
        if i == 0 and not (sep and key in ("cores", "simd", "commit", "load before run")):
            info["cpu"] = line.strip()
        elif sep:
            info[key.strip()] = val.strip()
    return info


_DROP = re.compile(r"^(real_time|manual_time|process_time|(min_time|min_warmup_time|iterations|"
                   r"repeats|threads):.*)$")


def run_key(b):
    name = b.get("run_name") or b.get("name", "")
    return "/".join(p for p in name.split("/") if not _DROP.match(p))


def to_us(b, field="real_time"):
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}.get(b.get("time_unit", "ns"), 1e-3)
    v = b.get(field)
    return None if v is None else v * scale


class GBench:
    """One Google Benchmark JSON file: the median of every benchmark (the median aggregate when
    repetitions were run, else the iteration run with the median time)."""

    def __init__(self, path, data, machine):
        self.path, self.context = path, data.get("context", {})
        medians, runs = {}, {}
        for b in data.get("benchmarks", []):
            key = run_key(b)
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    medians[key] = b
            else:
                runs.setdefault(key, []).append(b)
        self.runs = dict(medians)
        for key, bs in runs.items():
            if key not in self.runs:
                ok = sorted((b for b in bs if not b.get("error_occurred")),
                            key=lambda b: b.get("real_time", 0))
                self.runs[key] = ok[len(ok) // 2] if ok else bs[0]
        self.reps = max([b.get("repetitions", 1) for b in data.get("benchmarks", [])] or [1])
        # machine.txt is written before the run's benchmarks: it describes this file only if
        # the file is not older than it.
        self.machine = machine if machine and os.path.getmtime(path) >= machine["mtime"] else None

    def get(self, key):
        b = self.runs.get(key)
        return None if b is None or b.get("error_occurred") else b

    def errors(self):
        return [(k, b.get("error_message", "")) for k, b in self.runs.items()
                if b.get("error_occurred")]

    def header(self):
        c, m = self.context, self.machine or {}
        cpu = m.get("cpu") or c.get("host_name", "?")
        cores = m.get("cores") or c.get("num_cpus", "?")
        parts = [f"CPU {cpu}", f"{cores} cores"]
        if m.get("simd"):
            parts.append(f"SIMD {m['simd']}")
        if c.get("mhz_per_cpu"):
            parts.append(f"{c['mhz_per_cpu']} MHz")
        if c.get("bench_threads"):
            parts.append(f"{c['bench_threads']} threads for the multi-threaded variants")
        load = m.get("load before run")
        if load:
            parts.append(f"load average before the run {load}")
        if c.get("load_avg"):
            parts.append(f"load average at the start of this binary {load_text(c['load_avg'])}")
        lines = ["- Machine: " + ", ".join(parts) + "."]
        build = c.get("library_build_type")
        lines.append(f"- Date: {c.get('date', '?')}. Commit: {m.get('commit', 'not recorded')}. "
                     f"Medians of {self.reps} repetition(s)"
                     + (f"; Google Benchmark library built as {build}." if build else "."))
        if not self.machine:
            lines.append("- No bench_results/machine.txt from the same run: the CPU model, SIMD "
                         "and commit are unknown.")
        return lines

    def error_lines(self):
        errs = self.errors()
        if not errs:
            return []
        return ["", "Failed in this run: " + "; ".join(f"`{k}` ({msg})" for k, msg in errs) + "."]


# ---------------------------------------------------------------------------------------------
# Sections: C++ benchmarks (bench/run_benchmarks.sh)


def section_encode(gb):
    out = ["Encode: `encode/<kernel>` creates a fresh `CompiledKernel` per iteration, so each "
           "first `run()` misses the cache; encode = `RunStats.encode_us` (median, p90, max over "
           "iterations), first call = the whole missing call, cached = a second call for the "
           "same shapes.", ""]
    rows = []
    for key in [k for k in gb.runs if k.startswith("encode/")]:
        b = gb.get(key)
        if b is None:
            continue
        rows.append([key[len("encode/"):], fmt(b.get("encode_us"), 1),
                     fmt(b.get("encode_us_p90"), 1), fmt(b.get("encode_us_max"), 1),
                     fmt(to_us(b), 1), fmt(b.get("hit_us"), 2)])
    out += table(["kernel", "encode µs (median)", "p90 µs", "max µs", "first call µs",
                  "cached call µs"], rows)
    out += ["", "Cached calls of `y = tanh(x*0.5 + 0.25)` (ns per call): `run()` with default "
            "threads, 1 thread (`_st`) and new buffers every call (`relocate`); `vm_only` launches "
            "the same program on the VM directly (no runtime); `fused_loop` is a hand-written "
            "loop (the compute floor). Overhead = run() − vm_only; × loop = run() / fused_loop.",
            ""]
    variants = ["dvm", "dvm_st", "dvm_relocate", "vm_only", "vm_only_st", "fused_loop"]
    sizes = sorted({int(k.rsplit("/", 1)[1]) for k in gb.runs
                    if k.startswith("call/") and k.rsplit("/", 1)[1].isdigit()})
    rows = []
    for n in sizes:
        t = {}
        for v in variants:
            b = gb.get(f"call/tanh_affine/{v}/{n}")
            t[v] = None if b is None else to_us(b) * 1e3
        over = None if t["dvm"] is None or t["vm_only"] is None else t["dvm"] - t["vm_only"]
        over_st = (None if t["dvm_st"] is None or t["vm_only_st"] is None
                   else t["dvm_st"] - t["vm_only_st"])
        rows.append([str(n)] + [fmt(t[v], 0) for v in variants]
                    + [fmt(over, 0), fmt(over_st, 0), fmt(ratio(t["dvm"], t["fused_loop"]), 2)])
    out += table(["elements"] + variants + ["overhead ns", "overhead ns (1 thread)", "× loop"],
                 rows)
    return out


def section_vm(gb):
    rows_by = {}
    threads = gb.context.get("bench_threads")
    for key, b in gb.runs.items():
        parts = key.split("/")
        if len(parts) != 4 or parts[0] != "vm" or not parts[3].isdigit():
            continue
        rows_by.setdefault((parts[1], int(parts[3])), {})[parts[2]] = b
        if threads is None and parts[2].endswith("_mt") and "threads" in b:
            threads = int(b["threads"])

    def gbps(r, v):
        b = r.get(v)
        return None if b is None or b.get("error_occurred") else b.get("bytes_per_second", 0) / 1e9

    out = [f"GB/s of x read + y written (the same nominal bytes for every variant, so ratios are "
           f"time ratios; > 1: DVM faster). Baselines in the same binary: `fused` = one "
           f"hand-fused Highway loop (`-O3 -march=native`), `op-by-op` = one pass over memory "
           f"per meta-op (as an eager framework), `triad` = the STREAM triad's fused loop at the "
           f"same size. mt = {threads or '?'} threads, 1t = one thread; max err = DVM against "
           f"the fused loop.", ""]
    order = []
    for wl, _ in rows_by:
        if wl not in order:
            order.append(wl)
    rows, at_1m = [], {"mt": [], "st": []}
    for wl in order:
        for n in sorted(n for (w, n) in rows_by if w == wl):
            r = rows_by[(wl, n)]
            g = {v: gbps(r, v) for v in
                 ("dvm_mt", "fused_mt", "eager_mt", "dvm_st", "fused_st", "eager_st")}
            triad = gbps(rows_by.get(("triad", n), {}), "fused_mt")
            vf_mt, vf_st = ratio(g["dvm_mt"], g["fused_mt"]), ratio(g["dvm_st"], g["fused_st"])
            if n >= (1 << 20) and wl != "triad":
                at_1m["mt"].append(vf_mt)
                at_1m["st"].append(vf_st)
            err = (r.get("dvm_mt") or {}).get("max_err")
            rows.append([wl, elems(n), fmt(g["dvm_mt"]), fmt(g["fused_mt"]), fmt(g["dvm_st"]),
                         fmt(g["fused_st"]), fmt(vf_mt), fmt(vf_st),
                         fmt(ratio(g["dvm_mt"], g["eager_mt"])),
                         fmt(ratio(g["dvm_st"], g["eager_st"])),
                         fmt(ratio(g["dvm_mt"], triad)),
                         "-" if err is None else f"{err:.1e}"])
    out += table(["workload", "elements", "DVM mt GB/s", "fused mt GB/s", "DVM 1t GB/s",
                  "fused 1t GB/s", "VM/fused mt", "VM/fused 1t", "VM/op-by-op mt",
                  "VM/op-by-op 1t", "VM/triad mt", "max err"], rows, numeric_from=2)
    gm_mt, gm_st = geomean(at_1m["mt"]), geomean(at_1m["st"])
    if gm_mt or gm_st:
        low = {k: min((v for v in vs if v), default=None) for k, vs in at_1m.items()}
        out += ["", f"VM/fused at ≥ 1M elements (workloads other than triad): geomean "
                f"{fmt(gm_mt)} (mt), {fmt(gm_st)} (1t); lowest {fmt(low['mt'])} (mt), "
                f"{fmt(low['st'])} (1t)."]
    return out


def section_suite(gb):
    """vm_suite_bench: every workload against its plain fused loop, 1 and N threads."""
    rows_by = {}
    threads = gb.context.get("bench_threads")
    for key, b in gb.runs.items():
        parts = key.split("/")
        if len(parts) != 4 or parts[0] != "suite" or not parts[3].isdigit() or parts[1] == "copy":
            continue
        rows_by.setdefault((parts[1], int(parts[3])), {})[parts[2]] = b

    def us(r, v):
        b = r.get(v)
        return None if b is None or b.get("error_occurred") else to_us(b)

    out = [f"Time ratio fused/VM (> 1: DVM faster) against one plain C++ loop per workload "
           f"(`-O3 -march=native -ffast-math`, the same thread count; 1t = one thread, mt = "
           f"{threads or '?'} threads). Times in µs; err = DVM's largest difference from the "
           f"loop, relative to the output's scale.", ""]
    order = []
    for wl, _ in rows_by:
        if wl not in order:
            order.append(wl)
    # f16_gelu's loop converts f16 <-> f32 per element in scalar code (no vector f16 in plain
    # C++), which flatters DVM ~10x: the geomean is also given without it.
    unfair = {"f16_gelu"}
    rows, big, fair = [], {"st": [], "mt": []}, {"st": [], "mt": []}
    every = {"st": [], "mt": []}  # every size, f16_gelu left out
    small_below = {"st": 0, "mt": 0}  # of those below 0.8, launches of 4K elements
    for wl in order:
        for n in sorted(n for (w, n) in rows_by if w == wl):
            r = rows_by[(wl, n)]
            t = {v: us(r, v) for v in ("dvm_st", "fused_st", "dvm_mt", "fused_mt")}
            st, mt = ratio(t["fused_st"], t["dvm_st"]), ratio(t["fused_mt"], t["dvm_mt"])
            if wl not in unfair:
                every["st"].append(st)
                every["mt"].append(mt)
                for k, v in (("st", st), ("mt", mt)):
                    small_below[k] += bool(v and v < 0.8 and n <= 4096)
            if n >= (1 << 20):
                big["st"].append(st)
                big["mt"].append(mt)
                if wl not in unfair:
                    fair["st"].append(st)
                    fair["mt"].append(mt)
            err = (r.get("dvm_st") or {}).get("max_rel_err")
            rows.append([wl, elems(n), fmt(t["dvm_st"], 1), fmt(t["fused_st"], 1), fmt(st),
                         fmt(t["dvm_mt"], 1), fmt(t["fused_mt"], 1), fmt(mt),
                         "-" if err is None else f"{err:.1e}"])
    out += table(["workload", "elements", "DVM 1t µs", "fused 1t µs", "fused/VM 1t",
                  "DVM mt µs", "fused mt µs", "fused/VM mt", "err"], rows, numeric_from=2)
    gst, gmt = geomean(big["st"]), geomean(big["mt"])
    if gst or gmt:
        low = {k: min((v for v in vs if v), default=None) for k, vs in big.items()}
        fair_st, fair_mt = geomean(fair["st"]), geomean(fair["mt"])
        out += ["", f"At ≥ 1M elements: geomean fused/VM {fmt(gst)} (1t), {fmt(gmt)} (mt); "
                f"without f16_gelu (its loop calls scalar erff: glibc has no vector erf) {fmt(fair_st)} (1t), "
                f"{fmt(fair_mt)} (mt); lowest {fmt(low['st'])} (1t), {fmt(low['mt'])} (mt). "
                f"Target: geomean ≥ 0.95, none below 0.8."]
        n_all = len([v for v in every["st"] if v])
        below = {k: sum(1 for v in vs if v and v < 0.8) for k, vs in every.items()}
        out += ["", f"Every size (4K-16M), without f16_gelu: geomean fused/VM "
                f"{fmt(geomean(every['st']))} (1t), {fmt(geomean(every['mt']))} (mt); below 0.8: "
                f"{below['st']} of {n_all} (1t), {below['mt']} of {n_all} (mt), of which "
                f"{small_below['st']} (1t) and {small_below['mt']} (mt) are 4K launches, where "
                f"DVM's fixed cost per call (argument checks, binding lookup, dispatch: ~0.3 µs) "
                f"is as large as the loop's whole time."]
    out += suite_bandwidth(gb, rows_by, order)
    return out


def suite_bandwidth(gb, rows_by, order):
    """At 16M elements: each workload's bandwidth (bytes read + written per second) against
    the machine's copy bandwidth (suite/copy: memcpy over the same pool)."""
    n = 1 << 24
    bw = {}
    for v in ("st", "mt"):
        got = [(gb.runs.get(f"suite/copy/{how}_{v}/{n}") or {}).get("bytes_per_second")
               for how in ("memcpy", "loop", "stream")]
        got = [g for g in got if g]
        bw[v] = max(got) if got else None
    if not bw["st"]:
        return []
    copies = [b for k, b in gb.runs.items() if k.startswith("suite/copy/")]
    separate = (" The copy baselines were measured in a separate run right after the suite."
                if any(b.get("label", "").startswith("measured in a separate run")
                       for b in copies) else "")
    def cache_rate(wl, v):
        """The fastest rate (bytes/s) either implementation reaches at 64K or 1M elements,
        where the data stay in the caches: what the kernel's own work allows."""
        rates = [((rows_by.get((wl, m)) or {}).get(f"{impl}_{v}") or {}).get("bytes_per_second")
                 for m in (1 << 16, 1 << 20) for impl in ("dvm", "fused")]
        rates = [x for x in rates if x]
        return max(rates) if rates else None

    parts, low = [], {"st": [], "mt": []}
    bound = {"st": [], "mt": []}  # compute-bound: even in cache slower than 0.9 of copy
    for wl in order:
        r = rows_by.get((wl, n))
        if not r:
            continue
        got = {}
        for v in ("st", "mt"):
            b = r.get(f"dvm_{v}") or {}
            if b.get("bytes_per_second") and bw[v]:
                got[v] = b["bytes_per_second"] / bw[v]
                rate = cache_rate(wl, v)
                if rate and rate < 0.9 * bw[v]:
                    bound[v].append(wl)
                else:
                    low[v].append((got[v], wl))
        parts.append(f"{wl} {fmt(got.get('st'))}/{fmt(got.get('mt'))}")
    above = {v: sum(1 for x, _ in low[v] if x >= 0.9) for v in low}
    under = {v: ", ".join(f"{wl} {fmt(x)}" for x, wl in sorted(low[v]) if x < 0.9) or "none"
             for v in low}
    return ["", f"At 16M elements, DVM's bandwidth (bytes read + written per second) over the "
            f"machine's copy bandwidth (the fastest of memcpy, a vectorised copy loop and a loop of "
            f"streaming stores, over the same threads: "
            f"{bw['st'] / 1e9:.1f} GB/s 1t, {(bw['mt'] or 0) / 1e9:.1f} GB/s mt), 1t/mt: "
            + ", ".join(parts) + ". Compute-bound (the fastest rate either implementation "
            "reaches with the data in cache, at 64K or 1M elements, is under 0.9 of the copy "
            "bandwidth, so no schedule reaches 0.9 at 16M): "
            f"{', '.join(bound['st']) or 'none'} (1t); {', '.join(bound['mt']) or 'none'} (mt). "
            f"Memory-bound kernels at ≥ 0.9: {above['st']} of {len(low['st'])} (1t), "
            f"{above['mt']} of {len(low['mt'])} (mt); below: {under['st']} (1t); "
            f"{under['mt']} (mt). Target: ≥ 0.9 for memory-bound kernels." + separate]


def gflops(b, counter):
    if b is None:
        return None
    v = b.get(counter)
    if v is None:
        return None
    return v / 1e9 if v > 1e5 else v  # matmul_bench's counter is in FLOP/s, gemm_bench's in GFLOP/s


def shape_of(key):
    nums = re.findall(r"(?:^|/)(?:[mnk]:)?(\d+)(?=/|$)", key)
    return tuple(int(x) for x in nums[-3:]) if len(nums) >= 3 else None


def section_matmul(gb):
    threads = gb.context.get("num_cpus", "?")
    out = [f"The whole stack (`CompiledKernel`, encoded once, cached calls, all {threads} threads) "
           f"against OpenBLAS `cblas_sgemm` with the same thread count, GFLOP/s (2·M·N·K per "
           f"call). `packed per call`: W is an ordinary input, packed on every call; `constant "
           f"W`: W passed with `TensorArg::version` (packed once, cached).", ""]
    shapes = []
    for key in gb.runs:
        if key.startswith(("BM_dvm_matmul/", "BM_openblas_sgemm/")):
            s = shape_of(key)
            if s and s not in shapes:
                shapes.append(s)
    rows = []
    for m, n, k in shapes:
        per = gflops(gb.get(f"BM_dvm_matmul/packed_per_call/{m}/{n}/{k}"), "GFLOPs")
        const = gflops(gb.get(f"BM_dvm_matmul/const_w/{m}/{n}/{k}"), "GFLOPs")
        blas = gflops(gb.get(f"BM_openblas_sgemm/{m}/{n}/{k}"), "GFLOPs")
        rows.append([f"{m}×{n}×{k}", fmt(per, 1), fmt(const, 1), fmt(blas, 1),
                     fmt(ratio(per, blas)), fmt(ratio(const, blas))])
    out += table(["M×N×K", "DVM, packed per call", "DVM, constant W", "OpenBLAS",
                  "packed / OpenBLAS", "constant / OpenBLAS"], rows)
    big = [ratio(gflops(gb.get(f"BM_dvm_matmul/const_w/{m}/{n}/{k}"), "GFLOPs"),
                 gflops(gb.get(f"BM_openblas_sgemm/{m}/{n}/{k}"), "GFLOPs"))
           for m, n, k in shapes if min(m, n, k) >= 256]
    if any(big):
        out += ["", f"Constant W / OpenBLAS over shapes with M, N, K ≥ 256: geomean "
                f"{fmt(geomean(big))}, lowest {fmt(min(v for v in big if v))}."]
    mlp = sorted({shape_of(k) for k in gb.runs if k.startswith("BM_mlp/")} - {None})
    if mlp:
        out += ["", "`gelu(x @ W + b)` as one fused DVM kernel against the same three ops as three "
                "DVM kernels (W constant in both), GFLOP/s of the matmul:", ""]
        rows = []
        for m, n, k in mlp:
            f = gflops(gb.get(f"BM_mlp/fused/{m}/{n}/{k}"), "GFLOPs")
            u = gflops(gb.get(f"BM_mlp/unfused/{m}/{n}/{k}"), "GFLOPs")
            rows.append([f"{m}×{n}×{k}", fmt(f, 1), fmt(u, 1), fmt(ratio(f, u))])
        out += table(["M×N×K", "fused", "three kernels", "fused / three kernels"], rows)
    return out


def section_gemm(gb):
    out = ["The GEMM kernel alone (`src/vm/cpu/gemm.h`, one thread) against OpenBLAS "
           "`cblas_sgemm` with one thread, GFLOP/s; `AVX2` runs DVM's AVX2 code path (what an "
           "AVX2-only machine runs). Row-major B packed per call (`DVM`); B prepacked, as the "
           "VM's cached constant weights (`B packed`: the micro-kernel and A's packing); B "
           "transposed, nn.Linear's weight [N, K] packed per call (`x @ W^T`) and read in place "
           "by the role-swapped kernel (`W^T in place`: AVX-512, the VM's path up to 288 rows "
           "and K >= 256). Columns a run did not measure show `-`.", ""]
    shapes = []
    for key in gb.runs:
        s = shape_of(key)
        if s and s not in shapes:
            shapes.append(s)
    rows = []
    for m, n, k in shapes:
        sfx = f"m:{m}/n:{n}/k:{k}"
        d = gflops(gb.get(f"BM_dvm/{sfx}"), "GFLOP/s")
        a = gflops(gb.get(f"BM_dvm_avx2/{sfx}"), "GFLOP/s")
        o = gflops(gb.get(f"BM_openblas/{sfx}"), "GFLOP/s")
        pk = gflops(gb.get(f"BM_dvm_packed/{sfx}"), "GFLOP/s")
        bt = gflops(gb.get(f"BM_dvm_bt/{sfx}"), "GFLOP/s")
        bi = gflops(gb.get(f"BM_dvm_bt_in_place/{sfx}"), "GFLOP/s")
        rows.append([f"{m}×{n}×{k}", fmt(d, 1), fmt(pk, 1), fmt(bt, 1), fmt(bi, 1), fmt(a, 1),
                     fmt(o, 1), fmt(ratio(d, o)), fmt(ratio(a, o))])
    out += table(["M×N×K", "DVM", "B packed", "x @ W^T", "W^T in place", "DVM AVX2", "OpenBLAS",
                  "DVM / OpenBLAS", "AVX2 / OpenBLAS"], rows)
    return out


GRAPH_PATTERNS = ["layernorm", "rmsnorm", "softmax", "gelu_mlp", "swiglu_mlp", "attention",
                  "residual_layernorm", "cross_entropy"]  # bench/graph_bench.cc kNames


def section_graph(gb):
    out = ["Subgraphs compiled fused against the same graph compiled unfused (one kernel per "
           "meta-op), same process, hidden 768; speedup = unfused time / fused time.", ""]
    cells = {}
    for key, b in gb.runs.items():
        p = key.split("/")
        if p[0] != "BM_Subgraph" or len(p) != 4 or b.get("error_occurred"):
            continue
        idx, fused, rows_ = int(p[1]), int(p[2]), int(p[3])
        name = b.get("label") or (GRAPH_PATTERNS[idx] if idx < len(GRAPH_PATTERNS) else str(idx))
        cells.setdefault(name, {})[(fused, rows_)] = b
    all_rows = sorted({r for c in cells.values() for (_, r) in c})
    rows, speedups = [], []
    for name in sorted(cells, key=lambda n: GRAPH_PATTERNS.index(n)
                       if n in GRAPH_PATTERNS else 99):
        c = cells[name]
        k = {f: next((int(b.get("kernels", 0)) for (ff, _), b in c.items() if ff == f), None)
             for f in (0, 1)}
        row = [name, f"{fmt(k[0])} → {fmt(k[1])}"]
        for r in all_rows:
            u, f = c.get((0, r)), c.get((1, r))
            s = ratio(to_us(u) if u else None, to_us(f) if f else None)
            speedups.append(s)
            row += [fmt(to_us(f) if f else None, 1), fmt(s)]
        rows.append(row)
    hdr = ["subgraph", "kernels unfused → fused"]
    for r in all_rows:
        hdr += [f"fused µs, rows={r}", f"speedup rows={r}"]
    out += table(hdr, rows, numeric_from=2)
    if any(speedups):
        out += ["", f"Geomean speedup: {fmt(geomean(speedups))}."]
    comp, new, cached = gb.get("BM_CompileBertLayer"), gb.get("BM_BertNewShape"), \
        gb.get("BM_BertCachedShape")
    lines = []
    if comp:
        lines.append(f"BERT-base encoder layer: whole-graph compile "
                     f"{fmt(to_us(comp) / 1e3, 3)} ms, {fmt(int(comp.get('kernels', 0)))} kernels.")
    if new:
        extra = ""
        if cached:
            extra = (f"; a cached call {fmt(to_us(cached), 0)} µs, so a new length costs "
                     f"{fmt(to_us(new) - to_us(cached), 0)} µs more")
        lines.append(f"First call at a new sequence length: {fmt(to_us(new), 0)} µs, of which "
                     f"encoding {fmt(new.get('encode_us'), 0)} µs{extra}.")
    for threads, label in (("0", "1 thread"), ("1", "the default pool")):
        call = gb.get("BM_CallOverhead/" + threads)
        if call:
            lines.append(f"Host cost of a cached call ({label}): a 7-kernel transformer layer at "
                         f"hidden 16 (kernels do next to nothing) {fmt(to_us(call))} µs, "
                         f"{fmt(to_us(call) / max(int(call.get('kernels', 7)), 1))} µs per "
                         f"kernel (target: 3 µs + 0.3 µs a kernel).")
    if lines:
        out += [""] + [" ".join(lines)]
    return out


CPP = [
    ("encode_bench", "Runtime operator compiler: encode latency and call overhead",
     section_encode),
    ("vm_bench", "VM execution against a hand-fused loop and op-by-op", section_vm),
    ("vm_suite_bench", "VM execution on model-shaped workloads against plain fused loops",
     section_suite),
    ("matmul_bench", "Matmul through the whole stack against OpenBLAS", section_matmul),
    ("gemm_bench", "GEMM kernel against OpenBLAS, one thread", section_gemm),
    ("graph_bench", "Graph compiler: fused against unfused, compile and new-shape cost",
     section_graph),
]

# ---------------------------------------------------------------------------------------------
# Sections: Python harnesses (python/bench/*.py)


def py_header(path, machine, extra=(), date=None, commit=None):
    m = machine or {}
    cpu = m.get("Model name") or m.get("cpu") or "?"
    if cpu in ("?", "x86_64", "aarch64", "AMD64", "arm64", "i386"):
        cpu += " (the harness records no CPU model)"
    parts = [f"CPU {cpu}"]
    cores = m.get("CPU(s)") or m.get("cores")
    if cores:
        parts.append(f"{cores} cores")
    if m.get("Flags") and m["Flags"] != "-":
        parts.append(f"SIMD {m['Flags']}")
    for label, key in (("torch", "torch"), ("torch threads", "threads"),
                       ("torch threads", "torch_threads"), ("DVM threads", "dvm_threads")):
        if key in m:
            parts.append(f"{label} {m[key]}")
    load = m.get("load") or m.get("loadavg") or m.get("load_average")
    if load:
        parts.append(f"load average (1, 5, 15 min, as recorded) {load_text(load)}")
    parts += list(extra)
    return ["- Machine: " + ", ".join(parts) + ".",
            f"- Date: {date or file_time(path)}. "
            f"Commit: {commit or 'not recorded by the harness'}."]


def section_py_matmul(path, d):
    out = py_header(path, d.get("machine"))
    out += ["", "DVM (`dvm.Executable`, one matmul) against `torch.mm` (or `torch.nn.functional."
            "linear` for x @ W^T) in the same process, measured in alternating rounds; GFLOP/s; "
            "ratio = torch time / DVM time (> 1: DVM faster). `constant W`: W passed as "
            "`dvm.constant(w)` (packed once).", ""]
    rows = []
    for r in d.get("matmul", []):
        rows.append([r["kind"], f"{r['m']}×{r['n']}×{r['k']}", fmt(r.get("dvm_gflops"), 1),
                     fmt(r.get("dvm_const_gflops"), 1), fmt(r.get("torch_gflops"), 1),
                     fmt(r.get("ratio")), fmt(r.get("ratio_const"))])
    out += table(["kind", "M×N×K", "DVM", "DVM, constant W", "torch", "ratio",
                  "ratio, constant W"], rows, numeric_from=2)
    out += ["", f"Geomean ratio over M, N, K ≥ 256: {fmt(d.get('geomean_ge256'))}; with "
            f"constant W {fmt(d.get('geomean_ge256_const_w'))}."]
    if d.get("fused_gelu"):
        out += ["", "`gelu(x @ W + b)` (K = 768, N = 3072): one fused DVM kernel against torch's "
                "three ops; ratio = torch time / DVM time.", ""]
        rows = [[str(r["m"]), fmt(r.get("dvm_ms"), 3), fmt(r.get("dvm_const_ms"), 3),
                 fmt(r.get("torch_ms"), 3), fmt(r.get("ratio")), fmt(r.get("ratio_const"))]
                for r in d["fused_gelu"]]
        out += table(["M", "DVM ms", "DVM ms, constant W", "torch ms", "ratio",
                      "ratio, constant W"], rows)
    return out


def section_torch(path, d):
    m = d.get("machine", {})
    dims = d.get("dims", {})
    extra = [f"batch {d.get('batch', '?')}", f"{len(d.get('lengths', []))} distinct sequence "
             f"lengths in random order" + (" (--quick: small models)" if d.get("quick") else "")]
    out = py_header(path, m, extra, commit=m.get("commit"))
    out += ["", f"Models: a BERT-base-style encoder layer (hidden {dims.get('hidden', '?')}, "
            f"{dims.get('heads', '?')} heads, ffn {dims.get('ffn', '?')}) and a GPT-style decoder "
            f"({dims.get('gpt_layers', '?')} layers, vocab {dims.get('vocab', '?')}). Total = one "
            "pass over the lengths, compiles included; overhead = total minus the steady-state "
            "latencies of those lengths; steady = median per length over repeated calls "
            "interleaved across configurations; × eager = geometric mean over lengths of eager "
            "time / config time; peak RSS = resident-set growth during the first pass (an upper "
            "bound).", ""]
    rows = []
    for r in d.get("rows", []):
        rows.append([r["model"], r["config"], fmt(r.get("total_s")), fmt(r.get("overhead_s")),
                     fmt(r.get("compiles")), fmt(r.get("steady_median_ms")),
                     fmt(r.get("speedup_vs_eager_geomean")), fmt(r.get("peak_rss_mib"), 0)])
    out += table(["model", "config", "total s", "overhead s", "compiles", "steady median ms",
                  "× eager", "peak RSS MiB"], rows, numeric_from=2)
    notes = []
    for model in dict.fromkeys(r["model"] for r in d.get("rows", [])):
        by = {r["config"]: r for r in d["rows"] if r["model"] == model}
        for dyn in ("None", "True"):
            ind, dv = by.get(f"inductor dyn={dyn}"), by.get(f"dvm dyn={dyn}")
            if ind and dv:
                total = ratio(ind["total_s"], dv["total_s"])
                over = ratio(ind.get("overhead_s"), dv.get("overhead_s"))
                notes.append(f"{model}, dynamic={dyn}: total {fmt(total, 1)}×, "
                             f"overhead {fmt(over, 1)}×")
    if notes:
        out += ["", "Inductor / DVM (> 1: DVM spends less): " + "; ".join(notes) + "."]
    err = d.get("max_abs_err_vs_eager")
    if err:
        out += ["", "Max |DVM − eager|: "
                + ", ".join(f"{k} {v:.1e}" for k, v in err.items()) + "."]
    return out


def section_lazy(path, d):
    m = d.get("machine", {})
    out = py_header(path, m, date=d.get("time"))
    out += ["", "Eager PyTorch against `dvm.lazy(freeze_weights=True)` in alternating rounds; "
            "every lazy round meets each sequence length for the first time, so every lazy step "
            "pays for encoding its programs. Per-step medians over all rounds; totals are the "
            "median round; speedup = eager / lazy.", ""]
    rows, parts = [], []
    names = {"gpt_greedy_decode": "GPT greedy decode", "data_dependent_loop": "data-dependent loop"}
    for key, r in d.get("results", {}).items():
        c = r.get("config", {})
        rows.append([names.get(key, key), fmt(r.get("eager_ms_per_step")),
                     fmt(r.get("lazy_ms_per_step")), fmt(r.get("speedup_per_step")),
                     f"{fmt(r.get('eager_total_ms'), 0)} / {fmt(r.get('lazy_total_ms'), 0)}",
                     f"{fmt(r.get('eager_aten_ops_per_step'))} / "
                     f"{fmt(r.get('lazy_kernels_per_step'), 1)}",
                     f"{fmt(r.get('plan_cache_hits'))} / {fmt(r.get('plan_cache_misses'))}",
                     "yes" if r.get("same_result") else "no"])
        cfg = ", ".join(f"{k} {v}" for k, v in c.items())
        parts.append(f"{names.get(key, key)} ({cfg}): lazy step = record "
                     f"{fmt(r.get('lazy_record_ms_per_step'))} + encode "
                     f"{fmt(r.get('lazy_encode_ms_per_step'))} + kernels "
                     f"{fmt(r.get('lazy_run_ms_per_step'))} ms (means)")
    out += table(["workload", "eager ms/step", "lazy ms/step", "speedup", "total eager / lazy ms",
                  "eager aten ops / lazy kernels per step", "plans hit / miss", "same result"],
                 rows)
    if parts:
        out += [""] + [p + "." for p in parts]
    return out


def section_weights(path, d):
    cap = d.get("capacity_bytes")
    m = dict(d.get("machine", {}))
    if "torch" in d:
        m["torch"] = d["torch"]
    extra = [f"cache capacity {cap >> 20} MiB" if cap is not None else "cache capacity ?"]
    roof = d.get("roofline")
    if roof:
        extra.append(f"measured read bandwidth {fmt(roof.get('read_gbps'), 1)} GB/s (a sum over "
                     "1 GiB), GEMM " + ", ".join(f"{k} {fmt(v, 0)} GFLOP/s" for k, v in
                                                 roof.get("gemm_gflops", {}).items())
                     + " (torch.mm 2048^3), same threads")
    out = py_header(path, m, extra, d.get("date"), d.get("commit"))
    out += ["", "mlp: a stack of `x + Linear(gelu(Linear(x)))` blocks (H = 2048, F = 8192); "
            "llama: HuggingFace's Llama from its config (hidden 2048, FFN 5632, 16/4 heads, "
            "layers to the size, M tokens of one sequence); f32, or bf16 weights and "
            "activations; through "
            "`torch.compile(backend=\"dvm\", dynamic=True)`, configurations in alternating "
            "rounds, per-call medians; × = eager time / config time; packs/call = packed-weight "
            "cache packs per call in steady state; cache MiB = bytes the cache holds; rate = "
            "the weights streamed per second at M = 1 (GB/s, against the read bandwidth "
            "measured in the same rounds, a sum over 1 GiB between the configurations), else the products' GFLOP/s (2 M x weights per call, against the "
            "measured GEMM rate).", ""]
    rows = []
    for r in d.get("results", []):
        for c, ms in r.get("ms", {}).items():
            held = r.get("cache_bytes", {}).get(c)
            rate = "-"
            if r.get("rows") == 1 and "weights_gbps" in r:
                rate = f"{fmt(r['weights_gbps'].get(c), 1)} GB/s"
                # the bandwidth measured in the point's own rounds, where the run recorded it
                read = r.get("read_gbps") or (roof or {}).get("read_gbps")
                if read:
                    rate += f" ({fmt(r['weights_gbps'].get(c) / read)})"
            elif "gflops" in r:
                rate = f"{fmt(r['gflops'].get(c), 0)} GF/s"
                peak = (roof or {}).get("gemm_gflops", {}).get(r.get("dtype", "f32"))
                if peak:
                    rate += f" ({fmt(r['gflops'].get(c) / peak)})"
            rows.append([r.get("model", "mlp"), r.get("dtype", "f32"), fmt(r.get("weights_gib")),
                         str(r.get("rows")), c, fmt(ms, 1),
                         fmt(r.get("speedup_vs_eager", {}).get(c)), rate,
                         fmt(r.get("packs_per_call", {}).get(c), 1),
                         "-" if held is None else str(held >> 20)])
    out += table(["model", "dtype", "weights GiB", "M", "config", "ms per call", "× eager",
                  "rate (of roofline)", "packs/call", "cache MiB"], rows, numeric_from=5)
    return out


def section_vs_fused(path, d):
    """bench/run_vs_fused.sh: each workload's DVM kernel and plain loop alternately, one process."""
    m = d.get("machine", {})
    runs = d.get("runs", [])
    out = [f"- Machine: CPU {m.get('cpu', '?')}, {m.get('cores', '?')} cores, Debian "
           f"{m.get('debian', '?')}.", f"- Date: {d.get('date', '?')}. Commit: "
           f"{d.get('commit', '?')}.", "",
           "The workloads of `vm_suite_bench` (above), each DVM kernel and its plain fused loop "
           "timed alternately in one process, "
           + ", ".join(f"{r.get('rounds', '?')} rounds at {r.get('threads', '?')} thread(s)"
                       for r in runs)
           + " (each sample ≥ 2 ms of back-to-back calls): the ratios to believe where the "
           "machine's speed drifts between processes, as it does on these VMs. Cells: fused/DVM, "
           "the median of the per-round ratios (> 1: DVM faster).", ""]
    by = {}
    order = []
    for r in runs:
        t = r.get("threads")
        for row in r.get("rows", []):
            key = (row["workload"], row["elements"])
            if key not in by:
                order.append(key)
            by.setdefault(key, {})[t] = row
    threads = [r.get("threads") for r in runs]
    has_launch = any("launch_ratio" in row for r in runs for row in r.get("rows", []))
    if has_launch:
        out += ["Column fused/launch: the same kernel through a prepared launch "
                "(`CompiledKernel::prepare_launch` once, then `run_launch`, what the graph executor "
                "calls per kernel), i.e. without `run()`'s per-call binding (argument checks, the "
                "shape key's lookup, the overlap proof).", ""]
    rows = []
    for key in order:
        cells = [key[0], elems(key[1])]
        for t in threads:
            row = by[key].get(t)
            cells += [fmt(row["dvm_us"], 2) if row else "-", fmt(row["fused_us"], 2) if row else "-",
                      fmt(row["ratio"]) if row else "-"]
            if has_launch:
                cells.append(fmt(row["launch_ratio"]) if row and "launch_ratio" in row else "-")
        rows.append(cells)
    headers = ["workload", "elements"]
    for t in threads:
        headers += [f"DVM {t}t µs", f"fused {t}t µs", f"fused/DVM {t}t"]
        if has_launch:
            headers.append(f"fused/launch {t}t")
    out += table(headers, rows, numeric_from=2)
    summary = []
    for t in threads:
        fair = [by[k][t]["ratio"] for k in order if t in by[k] and k[0] != "f16_gelu"]
        below = [k for k in order if t in by[k] and k[0] != "f16_gelu" and by[k][t]["ratio"] < 0.8]
        small = sum(1 for k in below if k[1] <= 4096)
        text = (f"{t} thread(s): geomean {fmt(geomean(fair))} over {len(fair)}, "
                f"{len(below)} below 0.8 ({small} of them 4K launches)")
        launch = [by[k][t]["launch_ratio"] for k in order
                  if t in by[k] and k[0] != "f16_gelu" and "launch_ratio" in by[k][t]]
        if launch:
            text += (f"; prepared launches: geomean {fmt(geomean(launch))}, "
                     f"{sum(1 for x in launch if x < 0.8)} below 0.8")
        summary.append(text)
    out += ["", "Without f16_gelu (its loop converts f16 per element in scalar code): "
            + "; ".join(summary) + ". Target: geomean ≥ 0.95, none below 0.8."]
    return out


def section_subgraph(path, d):
    m = d.get("machine", {})
    cfgs = d.get("configs", ["eager", "dvm", "inductor"])
    ind = "inductor" in cfgs
    extra = [f"SIMD {m['simd']}"] if m.get("simd") else []
    extra.append(f"{d.get('rounds', '?')} interleaved rounds")
    if m.get("worktree_dirty"):
        extra.append("uncommitted changes in the work tree")
    out = py_header(path, m, extra, date=m.get("date"), commit=m.get("commit"))
    out += ["", "Memory-bound subgraphs (plain functions of f32 CPU tensors) through "
            "`torch.compile(fn, backend=..., dynamic=True)`, each compiled once and run at 3 "
            "shapes; every configuration is called in turn at each shape in every round, a timed "
            "sample lasting ≥ " + fmt(d.get("min_sample_ms"), 0) + " ms; µs per call = median "
            "over rounds; × = other time / DVM time (> 1: DVM faster); first call = the first "
            "call at that shape (compilation at the first shape, recompilation or per-shape "
            "encoding at the others); DVM p75/p25 = the spread of DVM's samples over the rounds; "
            "check = output against eager (torch.testing.assert_close)."
            + ("" if ind else " Inductor skipped (--no-inductor).")
            + (" Inductor's FX graph cache was on: its first calls may load kernels an earlier "
               "run compiled (on disk)." if ind and d.get("inductor_fx_graph_cache") else ""), ""]
    rows = []
    for sg in d.get("subgraphs", []):
        for c in sg.get("shapes", []):
            us, sp, first = c.get("us", {}), c.get("speedup", {}), c.get("first_call_ms", {})
            bad = [f"{k} {v}" for k, v in c.get("check", {}).items() if v != "ok"]
            row = [sg["name"], c.get("label", "?"), fmt(us.get("eager"), 1),
                   fmt(us.get("dvm"), 1)]
            row += [fmt(us.get("inductor"), 1)] if ind else []
            row += [fmt(sp.get("eager/dvm"))] + ([fmt(sp.get("inductor/dvm"))] if ind else [])
            row += [fmt(first.get("dvm"), 1)] + ([fmt(first.get("inductor"), 1)] if ind else [])
            q = c.get("us_iqr", {}).get("dvm")
            row.append(fmt(ratio(q[1], q[0]) if q else None))
            row.append("; ".join(bad) or "ok")
            rows.append(row)
    hdr = ["subgraph", "shape", "eager µs", "DVM µs"] + (["Inductor µs"] if ind else [])
    hdr += ["eager / DVM"] + (["Inductor / DVM"] if ind else [])
    hdr += ["first call DVM ms"] + (["first call Inductor ms"] if ind else [])
    hdr += ["DVM p75/p25", "check"]
    t = table(hdr, rows, numeric_from=2)
    t[1] = t[1][:-len("---:|")] + "---|"  # check: text
    out += t
    threads, cores = m.get("threads"), m.get("cores")
    others = {sg["name"]: sg.get("other_processes_cores") for sg in d.get("subgraphs", [])}
    known = [v for v in others.values() if v is not None]
    if known:
        out += ["", f"Other processes kept {fmt(statistics.fmean(known))} cores busy on average "
                f"during the timed rounds (most: {fmt(max(known))}, /proc/stat)."]
        over = [k for k, v in others.items()
                if v is not None and isinstance(threads, int) and isinstance(cores, int)
                and v + threads > cores + 0.25]
        if over:
            out[-1] += (f" **Oversubscribed** ({', '.join(over)}: other processes' cores + "
                        f"{threads} threads > {cores} cores): PyTorch's OpenMP regions (eager, "
                        f"Inductor) then wait for preempted threads at every barrier, so their "
                        f"times and the ratios measure the contention more than the kernels; "
                        f"rerun on an idle machine or with `--threads 1`.")
    per = []
    for sg in d.get("subgraphs", []):
        g = sg.get("geomean", {})
        per.append(f"{sg['name']} {fmt(g.get('eager/dvm'))}"
                   + (f" / {fmt(g.get('inductor/dvm'))}" if ind else ""))
    g = d.get("geomean", {})
    what = "eager / DVM" + (" and Inductor / DVM" if ind else "")
    out += ["", f"Geomean {what} over all subgraphs and shapes: {fmt(g.get('eager/dvm'))}"
            + (f" and {fmt(g.get('inductor/dvm'))}" if ind else "")
            + "; per subgraph: " + "; ".join(per) + ". Cells whose check failed are left out."]
    fails = d.get("failures", [])
    if fails:
        out += ["", "Failed in this run: " + "; ".join(
            f"`{f['subgraph']}` {f['shape']} {f['config']} ({f['check']}: {f.get('error')})"
            for f in fails) + "."]
    return out


def section_host(path, d):
    m = d.get("machine", {})
    out = py_header(path, m, date=d.get("time"), commit=d.get("commit"))
    res = d.get("results", {})
    pc = res.get("per_call")
    if pc:
        out += ["", "Per call through `torch.compile(dynamic=True)` at a cached shape, graphs "
                "whose kernels take well under 5 us (the host path: Dynamo's guards, the "
                "compiled function, DVM's call); medians of interleaved rounds. Ratios > 1: "
                "DVM faster. Dynamo floor: a backend that does no work (its function returns "
                "the first call's outputs), Dynamo's own part of a call, which no backend goes "
                "below; eager/floor is the best eager/DVM any backend could reach.", ""]
        rows = []
        for name, r in pc.items():
            us = r.get("us", {})
            rows.append([name, fmt(us.get("eager"), 1), fmt(us.get("inductor"), 1),
                         fmt(us.get("dvm"), 1), fmt(us.get("dynamo_floor"), 1),
                         fmt(r.get("eager_over_dvm")), fmt(r.get("inductor_over_dvm")),
                         fmt(r.get("eager_over_floor"))])
        out += table(["graph", "eager us", "Inductor us", "DVM us", "Dynamo floor us",
                      "eager/DVM", "Inductor/DVM", "eager/floor"], rows)
        ind = [r["inductor_over_dvm"] for r in pc.values() if r.get("inductor_over_dvm")]
        eag = [r["eager_over_dvm"] for r in pc.values() if r.get("eager_over_dvm")]
        flo = [r["eager_over_floor"] for r in pc.values() if r.get("eager_over_floor")]
        if eag:
            out += ["", f"Geomean eager/DVM {fmt(geomean(eag))}"
                    + (f", Inductor/DVM {fmt(geomean(ind))}" if ind else "")
                    + (f", eager/floor {fmt(geomean(flo))}" if flo else "") + "."]
    ec = res.get("exe_call")
    if ec:
        when = (f" Measured separately: commit {ec['commit']}, {ec.get('time', '?')}."
                if ec.get("commit") else "")
        out += ["", f"Executable call from Python ({ec.get('graph')}): " + ", ".join(
            f"{k} {fmt(v)} us" for k, v in ec.get("us", {}).items()) + "." + when]
    fc = res.get("first_call")
    if fc:
        reps = d.get("settings", {}).get("first_call_reps", 1)
        how = (f"the median of {reps} fresh processes per model and backend (the backends "
               f"taking turns)" if reps > 1 else "one fresh process per model and backend")
        out += ["", "First call of HuggingFace models (2 layers, random weights, batch 2 x 37 "
                f"tokens, no_grad), {how}, seconds. Backend `eager` is Dynamo's trace alone.",
                ""]
        rows = []
        for name, r in fc.items():
            rows.append([name, fmt(r.get("eager")), fmt(r.get("dvm")), fmt(r.get("inductor")),
                         fmt(r.get("dvm_over_dynamo_trace")), fmt(r.get("inductor_over_dvm"))])
        out += table(["model", "Dynamo trace s", "DVM s", "Inductor s", "DVM / trace",
                      "Inductor / DVM"], rows)
    return out


def section_models(path, d):
    m = dict(d.get("machine", {}))
    if "torch" in d:
        m["torch"] = d["torch"]
    sz = d.get("sizes", {})
    out = py_header(path, m, [f"dtype {d.get('dtype', '?')}", f"{d.get('rounds', '?')} rounds"],
                    date=d.get("date"), commit=d.get("commit"))
    cfgs = [c for c in ("eager", "inductor", "dvm")
            if any(c in r.get("steady_ms", {}) for r in d.get("results", []))]
    lengths = d.get("lengths", [])
    out += ["", f"HuggingFace models built from their config classes with random weights "
            f"({sz.get('layers', '?')} layers, hidden {sz.get('hidden', '?')}, "
            f"{sz.get('heads', '?')} heads ({sz.get('kv_heads', '?')} KV heads where the model "
            f"groups them), FFN {sz.get('ffn', '?')}, vocabulary {sz.get('vocab', '?')}), batch 2 "
            f"x lengths {', '.join(str(x) for x in lengths)} (ViT: length / 16 images of 64 x "
            "64), no_grad, `torch.compile(dynamic=True)`: one compilation for all lengths. "
            "Steady = per length, configurations called in turn each round, medians; × eager = "
            "geometric mean over lengths of eager time / config time; first call = the compiled "
            "model's first call (Dynamo's trace and the backend's compile; Inductor "
            f"{'with its on-disk caches' if d.get('inductor_fx_cache') else 'cold: no FX graph cache, an empty kernel cache'}); err = relative "
            "error (2-norm) of the first call's output against eager.", ""]
    rows = []
    for r in d.get("results", []):
        sp, fc, err = r.get("speedup_vs_eager", {}), r.get("first_call_ms", {}), r.get(
            "rel_error", {})
        row = [r.get("model", "?")]
        for c in cfgs:
            if c != "eager":
                row.append(fmt(sp.get(c)))
        for c in cfgs:
            if c != "eager":
                row.append(fmt((fc.get(c) or 0) / 1e3))
        if "inductor" in cfgs and "dvm" in cfgs:
            row.append(fmt(sp["dvm"] / sp["inductor"]) if sp.get("inductor") else "-")
            row.append(fmt(fc["inductor"] / fc["dvm"]) if fc.get("dvm") else "-")
        row.append(f"{err['dvm']:.1e}" if "dvm" in err else "-")
        rows.append(row)
    head = ["model"] + [f"{c} × eager" for c in cfgs if c != "eager"] + [
        f"first call {c} s" for c in cfgs if c != "eager"]
    if "inductor" in cfgs and "dvm" in cfgs:
        head += ["DVM / Inductor (steady)", "Inductor / DVM (first call)"]
    head.append("DVM err")
    out += table(head, rows, numeric_from=1)
    cold = [r for r in d.get("results", []) if r.get("cold_first_call_s")]
    if cold:
        reps = d.get("cold_reps", 1)
        out += ["", f"First call in fresh processes (a cold start: {reps} process"
                f"{'es' if reps > 1 else ''} per model and backend, "
                f"{'the median, ' if reps > 1 else ''}batch 2 x {d.get('cold_length', '?')}, "
                "an empty Inductor cache each), seconds. Backend `eager` is Dynamo's trace "
                "alone: no backend's first call is shorter, so Inductor / trace bounds the "
                "Inductor / DVM any backend could reach.", ""]
        crows = []
        for r in cold:
            c = r["cold_first_call_s"]
            tr, dv, ind = c.get("eager"), c.get("dvm"), c.get("inductor")
            crows.append([r.get("model", "?"), fmt(tr), fmt(dv), fmt(ind),
                          fmt(dv / tr) if dv and tr else "-",
                          fmt(ind / dv) if ind and dv else "-",
                          fmt(ind / tr) if ind and tr else "-"])
        out += table(["model", "Dynamo trace s", "DVM s", "Inductor s", "DVM / trace",
                      "Inductor / DVM", "Inductor / trace"], crows, numeric_from=1)
    return out


def section_decode(path, d):
    sz = d.get("sizes", {})
    out = py_header(path, d.get("machine", {}), extra=[f"torch {d.get('torch', '?')}"],
                    date=d.get("date"), commit=d.get("commit"))
    cfgs = []
    for r in d.get("results", []):
        for c in r.get("per_token_ms", {}):
            if c not in cfgs:
                cfgs.append(c)
    names = {"eager": "eager", "inductor": "Inductor", "dvm": "DVM", "dynamo": "Dynamo + eager ops"}
    out += ["", f"Greedy decoding with HuggingFace's KV cache, batch 1, a prompt of "
            f"{d.get('prompt')} tokens then {d.get('steps')} one-token steps; models from their "
            f"configs with random weights ({sz.get('layers')} layers, hidden {sz.get('hidden')}, "
            f"{sz.get('heads')} heads ({sz.get('kv_heads')} KV heads for Llama), FFN "
            f"{sz.get('ffn')}, vocabulary {sz.get('vocab')}); `model.forward` through "
            "`torch.compile(dynamic=True)`. Per token = the median step of a round, the median "
            f"over {d.get('rounds')} rounds where the cache lengths repeat (cached lengths) and "
            "the first round, where every length is new (DVM encodes the programs of each new "
            "length); the configurations take turns within each round, in an order that rotates. First decode = the first "
            "prefill and two steps, compiles included. × eager = eager / config per token."
            + (" With Dynamo's `torch._dynamo.config.specialize_float = True` (every backend): "
               "the models' float settings are constants of the graph instead of a tensor made "
               "and passed in per call." if d.get("specialize_float") else ""), ""]
    rows = []
    for r in d.get("results", []):
        pt, new, sp = r.get("per_token_ms", {}), r.get("per_token_new_lengths_ms", {}), \
            r.get("speedup_vs_eager", {})
        for c in cfgs:
            if c not in pt:
                continue
            rows.append([r["model"], names.get(c, c), fmt(pt[c], 3), fmt(new.get(c), 3),
                         fmt(sp.get(c)), fmt(r.get("prefill_ms", {}).get(c)),
                         fmt(r.get("first_decode_s", {}).get(c)),
                         "yes" if r.get("same_tokens", {}).get(c) else "no"])
    out += table(["model", "config", "ms/token", "ms/token, new lengths", "× eager",
                  "prefill ms", "first decode s", "tokens = eager"], rows, numeric_from=2)
    ratios = []
    for r in d.get("results", []):
        sp = r.get("speedup_vs_eager", {})
        if "dvm" in sp and "inductor" in sp:
            ratios.append(f"{r['model']} {fmt(sp['dvm'] / sp['inductor'])}")
    if ratios:
        how = ("each compiled configuration in a process of its own beside eager, so the "
               "ratio is of the × eager figures; eager's ms/token is the first process's"
               if d.get("isolated") else "all configurations in one process")
        out += ["", f"Inductor / DVM per token (> 1: DVM faster; {how}): " + ", ".join(ratios)
                + "."]
    return out


PY = [
    ("matmul_bench", "Matmul against torch.mm (Python harness)", section_py_matmul,
     "python3 python/bench/matmul_bench.py [--quick] [--threads N]"),
    ("torch_bench", "torch.compile: eager, Inductor and DVM over a stream of lengths",
     section_torch, "python3 python/bench/torch_bench.py [--quick] [--no-inductor]"),
    ("lazy_bench", "Lazy mode against eager", section_lazy,
     "python3 python/bench/lazy_bench.py [--threads N] [--rounds R]"),
    ("weights_bench", "Model-sized weights: the packed-weight cache", section_weights,
     "python3 python/bench/weights_bench.py [--sizes-gib 0.5 1.25] [--rows 1 16 128] "
     "[--dtypes f32 bf16] [--models mlp llama]"),
    ("weights_bench_4gib", "Model-sized weights at 4 GiB (4x the cache's default capacity)",
     section_weights,
     "python3 python/bench/weights_bench.py --sizes-gib 4 --rows 1 16 --dtypes f32 bf16 "
     "--rounds 3 --out bench_results/weights_bench_4gib.json"),
    ("vm_suite_vs_fused", "VM against plain fused loops, interleaved in one process",
     section_vs_fused, "bash bench/run_vs_fused.sh [rounds]"),
    ("subgraph_bench", "torch.compile on memory-bound subgraphs: eager, DVM and Inductor",
     section_subgraph,
     "python3 python/bench/subgraph_bench.py [--rounds R] [--threads N] [--no-inductor]"),
    ("host_bench", "The host path: per call, Executable call and first call",
     section_host, "python3 python/bench/host_bench.py [--no-inductor] [--only ...]"),
    ("models_bench", "HuggingFace models: eager, Inductor and DVM, steady state and first call",
     section_models,
     "python3 python/bench/models_bench.py [--threads 2] [--configs eager inductor dvm]"),
    ("models_bench_bf16", "HuggingFace models in bf16: eager, Inductor and DVM",
     section_models, "python3 python/bench/models_bench.py --dtype bf16"),
    ("decode_bench", "Greedy decoding with a KV cache: eager, Inductor and DVM per token",
     section_decode, "python3 python/bench/decode_bench.py [--threads 2] [--models gpt2 llama]"),
    ("decode_bench_specialize_float",
     "Greedy decoding with a KV cache, Dynamo's specialize_float on: eager, Inductor and DVM",
     section_decode,
     "python3 python/bench/decode_bench.py --specialize-float [--threads 2] [--models gpt2 llama]"),
]

# ---------------------------------------------------------------------------------------------


CARRIED = "*Kept from the previous report: this run produced no `{}`.*"


def previous_sections(text):
    """The generated sections of an earlier report, {heading line: body lines}, so that a
    section whose JSON this run lacks keeps its last figures (with their own machine and date
    lines) instead of losing them. Keyed by the whole heading: the C++ and the Python
    matmul_bench write the same file name."""
    sections, name = {}, None
    for line in text.split("\n"):
        if line.startswith(KEEP_MARKER):
            break
        if re.match(r"^### .* \(`[a-z_0-9]+`\)$", line):
            name = line
            sections[name] = []
        elif line.startswith("## ") or line.startswith("# "):
            name = None
        elif name is not None:
            sections[name].append(line)
    for body in sections.values():
        while body and body[-1] == "":
            body.pop()
        while body and body[0] == "":
            body.pop(0)
    return sections


def carried(previous, heading, name, rel):
    """The previous report's body under `heading`, marked as kept; None if it had no figures."""
    body = list(previous.get(heading, []))
    if not body or "not present" in body[0] or body[0].startswith(f"`{rel}/{name}.json`"):
        return None
    note = CARRIED.format(f"{rel}/{name}.json")
    if body[0] != note:
        body = [note, ""] + body
    return body + [""]


def generate(results, previous=None):
    previous = previous or {}
    rel = os.path.relpath(results, ROOT) if results.startswith(ROOT) else results
    out = ["# Performance", "",
           "<!-- Generated by scripts/perf_report.py from " + rel + "/*.json: edit the script, "
           "not the generated part. -->", "",
           f"The sections below are generated by `python3 scripts/perf_report.py` from the JSON "
           f"the benchmarks write into `{rel}/`. Each states the machine and conditions recorded "
           f"with it; ratios compare figures measured in the same run. Absolute times depend on "
           f"the machine and its load; ratios taken within one run are the figures to compare. "
           f"A section whose JSON this run did not produce keeps the figures of the report "
           f"before, marked as kept. Figures from earlier runs that no benchmark has regenerated "
           f"yet are kept at the end.",
           ""]
    machine = read_machine_txt(results)
    out += ["## C++ benchmarks (`bash bench/run_benchmarks.sh`)", ""]
    for name, title, fn in CPP:
        path = os.path.join(results, name + ".json")
        data = read_json(path)
        heading = f"### {title} (`{name}`)"
        out += [heading, ""]
        kept = carried(previous, heading, name, rel) if data is None else None
        if kept:
            out += kept
            continue
        if not is_gbench(data):
            why = "not present"
            if data is UNREADABLE:
                why = "is not valid JSON (a filter that matched nothing leaves it empty)"
            elif data is not None:
                why = ("holds another format (python/bench/matmul_bench.py writes the same file "
                       "name)" if name == "matmul_bench" else "is not Google Benchmark JSON")
            out += [f"`{rel}/{name}.json` {why}: run `bash bench/run_benchmarks.sh` (or "
                    f"`bash bench/run_benchmarks.sh --benchmark_filter=...`) to produce it.", ""]
            continue
        gb = GBench(path, data, read_machine_txt(results, name + ".machine.txt") or machine)
        if not gb.runs:
            out += [f"`{rel}/{name}.json` holds no benchmarks (a filter matched nothing).", ""]
            continue
        out += gb.header() + [""] + fn(gb) + gb.error_lines() + [""]
    out += ["## Python harnesses (`python/bench/`)", ""]
    for name, title, fn, cmd in PY:
        path = os.path.join(results, name + ".json")
        data = read_json(path)
        heading = f"### {title} (`{name}`)"
        out += [heading, ""]
        kept = carried(previous, heading, name, rel) if data is None else None
        if kept:
            out += kept
            continue
        if data is None or data is UNREADABLE or is_gbench(data):
            why = "not present" if data is None else "is not valid JSON"
            if is_gbench(data):
                why = ("holds the C++ matmul_bench's Google Benchmark JSON (the same file name; "
                       "running the Python harness overwrites it)")
            out += [f"`{rel}/{name}.json` {why}: run `{cmd}` from the repository root to "
                    f"produce it.", ""]
            continue
        try:
            out += fn(path, data) + [""]
        except (KeyError, TypeError, ValueError) as e:
            out += [f"`{rel}/{name}.json` could not be read ({type(e).__name__}: {e}); rerun "
                    f"`{cmd}`.", ""]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=os.path.join(ROOT, "bench_results"),
                    help="folder of the benchmarks' JSON (default: bench_results/)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "performance.md"),
                    help="file to write (default: docs/performance.md); '-' for stdout")
    a = ap.parse_args()
    results = os.path.abspath(a.results)
    kept = [KEEP_MARKER, ""]
    previous = {}
    if a.out != "-" and os.path.exists(a.out):
        with open(a.out) as f:
            text = f.read()
        at = text.find(KEEP_MARKER)
        if at >= 0:
            kept = [text[at:].rstrip("\n")]
        previous = previous_sections(text)
    lines = generate(results, previous)
    while lines and lines[-1] == "":
        lines.pop()
    text = "\n".join(lines + [""] + kept) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(a.out)}")


if __name__ == "__main__":
    main()
