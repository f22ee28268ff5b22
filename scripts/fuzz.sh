#!/usr/bin/env bash
# Coverage-guided fuzzing of DVM with libFuzzer (clang), under ASan/UBSan.
#   scripts/fuzz.sh [seconds per target (default 600)] [targets... (default: graph kernel sym)]
# Builds build-fuzz with clang (installing clang and its runtime libraries from Debian when
# missing), then runs each target for the given time on both cores, growing its corpus in
# build-fuzz/corpus-<target> (seeded from fuzz/corpus/<target>; copy new inputs worth keeping
# back there). Crashing inputs are left as build-fuzz/crash-*; the script then fails.
# CI runs the same targets without libFuzzer (fuzz/standalone_main.cc) for a bounded time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_PER_TARGET="${1:-600}"
shift || true
TARGETS=("$@")
[ "${#TARGETS[@]}" -gt 0 ] || TARGETS=(graph kernel sym)

bash "$ROOT/scripts/setup.sh"
missing=()
for pkg in clang libclang-rt-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$' ||
    missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=()
  [ "$(id -u)" -eq 0 ] || SUDO=(sudo -n)
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends "${missing[@]}"
fi

BUILD="$ROOT/build-fuzz"
# One SIMD target (Highway's static one) instead of every target the library dispatches to:
# clang's ASan build of the kernels for all of them takes hours on two cores, and the fuzz
# targets search the encoder and VM's logic, which is the same on every target (the kernels'
# per-target arithmetic is checked by the tests, on every target the machine has).
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_FLAGS="-DHWY_COMPILE_ONLY_STATIC=1" -DDVM_SANITIZE=ON \
  -DDVM_LIBFUZZER=ON -DDVM_BUILD_TESTS=OFF -DDVM_BUILD_BENCHMARKS=OFF -DDVM_BUILD_TOOLS=OFF
cmake --build "$BUILD" -j "${DVM_JOBS:-2}" --target "${TARGETS[@]/#/fuzz_}"

status=0
for t in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus-$t"
  mkdir -p "$corpus"
  rm -f "$BUILD"/fuzz-[0-9]*.log  # the jobs' logs of the previous target
  echo "fuzz: $t for ${SECONDS_PER_TARGET} s"
  # A CompiledKernel keeps each thread's recent bindings (their encoded programs) alive by
  # design, so most fuzz_kernel inputs end with more mallocs than frees, and libFuzzer then
  # scans the heap for leaks after each of them: 9x fewer executions. Leaks are still reported
  # by LeakSanitizer at exit.
  leaks=1
  [ "$t" != kernel ] || leaks=0
  # malloc_context_size=0: ASan keeps no allocation stack per malloc. The simplifier's
  # recursion makes most of them unique, so the stack depot grew without bound (fuzz_sym:
  # 1.9 GiB in 10 minutes, libFuzzer's RSS limit) at 20% fewer executions. Rerun a crashing
  # input without it for the allocation stacks.
  (cd "$BUILD" && ASAN_OPTIONS="${ASAN_OPTIONS:-malloc_context_size=0}" \
    "$BUILD/fuzz/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" \
    -detect_leaks="$leaks" -rss_limit_mb=4096 \
    -jobs="${DVM_JOBS:-2}" -workers="${DVM_JOBS:-2}" -print_final_stats=1 \
    "$corpus" "$ROOT/fuzz/corpus/$t" > "$BUILD/fuzz-$t.log" 2>&1) || status=1
  # The jobs' logs when there are jobs (the main log repeats them), else the main log.
  logs=("$BUILD"/fuzz-[0-9]*.log)
  [ -e "${logs[0]}" ] || logs=("$BUILD/fuzz-$t.log")
  grep -h 'stat::number_of_executed_units' "${logs[@]}" 2>/dev/null |
    awk -v t="$t" '{s += $2} END {print "fuzz: " t ": " s " executions"}' || true
done
ls "$BUILD"/crash-* 2>/dev/null && status=1
exit "$status"
