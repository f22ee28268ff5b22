#!/usr/bin/env bash
# The VM against the plain fused loops, each workload's two sides timed alternately in one
# process (vm_suite_bench --vs_fused): the figures to believe on a machine whose speed drifts
# between processes. Writes bench_results/vm_suite_vs_fused.json (1 and 2 threads) for
# scripts/perf_report.py.
#
#   bench/run_vs_fused.sh [rounds]       (default 7)
# Env: BUILD_DIR (default build).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
OUT_DIR="$ROOT/bench_results"
ROUNDS="${1:-7}"

bash "$ROOT/scripts/setup.sh"
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDVM_BUILD_BENCHMARKS=ON \
  >/dev/null
cmake --build "$BUILD_DIR" -j "${DVM_JOBS:-2}" --target vm_suite_bench
mkdir -p "$OUT_DIR"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for t in 1 2; do
  "$BUILD_DIR/bench/vm_suite_bench" --vs_fused --ab_threads="$t" --ab_rounds="$ROUNDS" \
    --ab_sizes=4096,65536,1048576,16777216 --vs_out="$tmp/t$t.json"
done
python3 - "$tmp" "$OUT_DIR/vm_suite_vs_fused.json" "$ROOT" <<'PY'
import datetime, json, subprocess, sys
tmp, out, root = sys.argv[1:4]
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=root).stdout.strip()
    except OSError:
        return ""
runs = [json.load(open(f"{tmp}/t{t}.json")) for t in (1, 2)]
json.dump({
    "machine": {"cpu": sh("lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1")
                       + " (family " + sh("lscpu | sed -n 's/^CPU family:[[:space:]]*//p' | head -1")
                       + ", model " + sh("lscpu | sed -n 's/^Model:[[:space:]]*//p' | head -1") + ")",
                "cores": sh("nproc"),
                "debian": sh("cat /etc/debian_version")},
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "commit": sh("git rev-parse --short HEAD"),
    "runs": runs,
}, open(out, "w"), indent=1)
print("wrote", out)
PY
