#!/usr/bin/env bash
# Builds and runs every benchmark binary, writes Google Benchmark JSON into bench_results/,
# and prints ratio tables (VM vs hand-fused loop, VM vs op-by-op; encode latency).
#
#   bench/run_benchmarks.sh [extra benchmark flags, e.g. --benchmark_filter=softmax]
# Env: BUILD_DIR (default build), DVM_BENCH_REPS (repetitions, default 3; the median is used),
#      DVM_NUM_THREADS (threads of the VM and of the *_mt baselines; default: all cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
OUT_DIR="$ROOT/bench_results"
REPS="${DVM_BENCH_REPS:-3}"

bash "$ROOT/scripts/setup.sh"
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDVM_BUILD_BENCHMARKS=ON \
  >/dev/null
mapfile -t BENCHES < <(cd "$ROOT/bench" && ls -1 *_bench.cc | sed 's/\.cc$//')
cmake --build "$BUILD_DIR" -j "${DVM_JOBS:-2}" --target "${BENCHES[@]}"

mkdir -p "$OUT_DIR"
{
  lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1
  echo "cores: $(nproc)"
  echo "simd: $(grep -m1 -o -w -E 'avx512f|avx2|fma|sse4_2|asimd|sve' /proc/cpuinfo | sort -u | tr '\n' ' ' || true)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "load before run: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT_DIR/machine.txt"
cat "$OUT_DIR/machine.txt"

# Each binary writes to a temporary file that replaces bench_results/<name>.json only when
# it holds benchmarks: a filter that matches nothing in a binary leaves that binary's last
# results (and their machine file) in place. <name>.machine.txt records the run that
# produced <name>.json (perf_report.py prefers it to machine.txt).
for b in "${BENCHES[@]}"; do
  echo "=== $b"
  tmp="$OUT_DIR/.$b.json.tmp"
  "$BUILD_DIR/bench/$b" --benchmark_out="$tmp" --benchmark_out_format=json \
    --benchmark_repetitions="$REPS" --benchmark_report_aggregates_only=true "$@"
  if python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("benchmarks") else 1)' \
    "$tmp" 2>/dev/null; then
    mv "$tmp" "$OUT_DIR/$b.json"
    cp -p "$OUT_DIR/machine.txt" "$OUT_DIR/$b.machine.txt"  # -p: older than the JSON
  else
    rm -f "$tmp"
  fi
done

python3 - "$OUT_DIR" <<'PY'
import json, os, sys
from collections import defaultdict

out = sys.argv[1]

def load(name):
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        return {}
    try:
        data = json.load(open(path))
    except ValueError:  # the filter matched nothing in this binary
        return {}
    runs = {}
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        key = [p for p in b["run_name"].split("/") if p not in ("real_time", "manual_time")]
        runs["/".join(key)] = b
    return runs

def gbps(b):
    if b is None or b.get("error_occurred"):
        return None
    return b.get("bytes_per_second", 0) / 1e9

def fmt(v, spec="{:.2f}"):  # None: missing or failed (failures are listed at the end)
    return "-" if v is None else spec.format(v)

def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b

enc = load("encode_bench")
if enc:
    print("\n## Encode latency (fresh CompiledKernel, first call misses the cache)")
    print(f"{'kernel':<16}{'encode med us':>14}{'p90 us':>9}{'max us':>9}{'1st call us':>13}{'hit us':>9}")
    for k, b in enc.items():
        if not k.startswith("encode/"):
            continue
        if b.get("error_occurred"):
            print(f"{k[7:]:<16}ERR {b.get('error_message', '')}")
            continue
        print(f"{k[7:]:<16}{b['encode_us']:>14.1f}{b['encode_us_p90']:>9.1f}{b['encode_us_max']:>9.1f}"
              f"{b['real_time']:>13.1f}{b['hit_us']:>9.1f}")
    print("\n## Cached call, y = tanh(x*0.5+0.25)")
    print(f"{'case':<34}{'ns/call':>10}")
    for k, b in enc.items():
        if k.startswith("call/"):
            t = None if b.get("error_occurred") else b["real_time"]
            print(f"{k[5:]:<34}{fmt(t, '{:.0f}'):>10}")
    def t(name):
        b = enc.get(name)
        return None if b is None or b.get("error_occurred") else b["real_time"]
    for n in (1, 1024):
        for sfx in ("", "_st"):
            a, v = t(f"call/tanh_affine/dvm{sfx}/{n}"), t(f"call/tanh_affine/vm_only{sfx}/{n}")
            if a is not None and v is not None:
                print(f"runtime overhead (dvm{sfx} - vm_only{sfx}) at n={n}: {a - v:.0f} ns/call")

vm = load("vm_bench")
if vm:
    rows = defaultdict(dict)
    threads = None
    for k, b in vm.items():
        _, wl, var, n = k.split("/")
        rows[(wl, int(n))][var] = b
        if var.endswith("_mt") and not b.get("error_occurred"):
            threads = int(b.get("threads", 0))
    print(f"\n## VM execution, GB/s of x read + y written (mt = {threads} threads); ratio > 1: DVM faster")
    print("vm/triad mt: DVM bandwidth over the STREAM triad's (fused_mt triad, same size)")
    hdr = ["workload", "elems", "dvm_mt", "fused_mt", "eager_mt", "dvm_st", "fused_st",
           "vm/fused mt", "vm/fused st", "vm/eager mt", "vm/eager st", "vm/triad mt", "max_err"]
    print("".join(f"{h:>12}" if i > 1 else f"{h:<12}" for i, h in enumerate(hdr)))
    order = []
    for (wl, n) in rows:
        if wl not in order:
            order.append(wl)
    for wl in order:
        for n in sorted(n for (w, n) in rows if w == wl):
            r = rows[(wl, n)]
            g = {v: gbps(r.get(v)) for v in ("dvm_mt", "fused_mt", "eager_mt", "dvm_st", "fused_st", "eager_st")}
            err = r.get("dvm_mt", {}).get("max_err")
            cells = [g["dvm_mt"], g["fused_mt"], g["eager_mt"], g["dvm_st"], g["fused_st"],
                     ratio(g["dvm_mt"], g["fused_mt"]), ratio(g["dvm_st"], g["fused_st"]),
                     ratio(g["dvm_mt"], g["eager_mt"]), ratio(g["dvm_st"], g["eager_st"]),
                     ratio(g["dvm_mt"], gbps(rows.get(("triad", n), {}).get("fused_mt")))]
            print(f"{wl:<12}{n:>12}" + "".join(f"{fmt(c):>12}" for c in cells)
                  + f"{fmt(err, '{:.1e}'):>12}")

# Any other *_bench binary: its medians as they are (time, throughput and counters).
others = {}
for f in sorted(os.listdir(out)):
    name = f[:-5] if f.endswith(".json") else None
    if name and name not in ("encode_bench", "vm_bench"):
        others[name] = load(name)
skip = {"name", "run_name", "run_type", "family_index", "per_family_instance_index",
        "repetitions", "repetition_index", "threads", "iterations", "aggregate_name",
        "aggregate_unit", "cpu_time", "real_time", "time_unit", "error_occurred", "error_message"}
for name, runs in others.items():
    if not runs:
        continue
    print(f"\n## {name}")
    for k, b in runs.items():
        if b.get("error_occurred"):
            continue
        extra = []
        for c, v in b.items():
            if c in skip or not isinstance(v, (int, float)):
                continue
            if c == "bytes_per_second":
                extra.append(f"{v / 1e9:.2f} GB/s")
            elif c == "items_per_second":
                extra.append(f"{v / 1e9:.3f} G items/s")
            else:
                extra.append(f"{c}={v:.4g}")
        print(f"{k:<48}{b['real_time']:>12.1f} {b['time_unit']}  " + "  ".join(extra))

failed = [(k, b.get("error_message", "")) for runs in [enc, vm, *others.values()]
          for k, b in runs.items() if b.get("error_occurred")]
if failed:
    print("\n## Failed benchmarks")
    for k, msg in failed:
        print(f"{k}: {msg}")
PY
echo "JSON written to $OUT_DIR/"
