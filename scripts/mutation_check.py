#!/usr/bin/env python3
"""Plants known bugs in a scratch copy of the tree, one at a time, and shows which C++ tests
catch each: a check that the test suite can fail where a VM rewrite is likely to go wrong.

    python3 scripts/mutation_check.py [--keep] [--only NAME ...] [--scratch DIR]

The tree is copied to a scratch folder (default /tmp/dvm-mutants; with --keep it stays, and
the next run copies only what changed) and built there (Release, tests only); each mutant then edits one source file, rebuilds (one object and the
relinks), runs every ctest binary and records the failing test cases, and restores the file.
A mutant whose pattern is no longer found in the source is reported as stale (the code moved:
update the pattern). Exit status 1 when a mutant is caught by fewer than two test cases.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name, file, original text, mutated text, what it models
MUTANTS = [
    ("split_trips", "src/vm/interpreter.cc",
     "*end = t * (g + 1) / parts;",
     "*end = t * (g + 1) / parts - (g + 1 == parts ? 1 : 0);",
     "a split reduction's last block drops its last trip"),
    ("split_trips_begin", "src/vm/interpreter.cc",
     "*begin = t * g / parts;",
     "*begin = t * g / parts + (g > 0 && t % parts != 0 ? 1 : 0);",
     "uneven shares: later blocks skip their first trip"),
    ("fold_stride", "src/encoder/layout.cc",
     "f.inner = g.back();",
     "f.inner = g.size() > 2 ? g[1] : g.back();",
     "a folded group of three or more axes takes the stride of the wrong member"),
    ("chain_strip_offset", "src/vm/interpreter.cc",
     "((first + t) * o.os + r * o.rs + c0 * o.cs) * o.es);",
     "((first + t) * o.os + r * o.rs + (c0 ? c0 - 16 : 0) * o.cs) * o.es);",
     "chain strips after the first read 16 columns early"),
    ("gelu_tanh_coefficient", "src/vm/cpu/tile_kernels-inl.h",
     "hn::Set(d, 0.044715f)",
     "hn::Set(d, 0.04472f)",
     "the VM's tanh-gelu cubic coefficient differs from the spec"),
    ("mean_count", "src/encoder/emitter.cc",
     "double inv = 1.0 / static_cast<double>(count);",
     "double inv = 1.0 / static_cast<double>(count + count / 64);",
     "a mean over >= 64 elements divides by a slightly wrong count"),
    ("prod_drops_last", "src/vm/cpu/tile_kernels_reduce.cc",
     "      *ar = reduce_combine_f32(op, *ar, ReduceRowVec(d, a + r * rs.a, ainc, n, id, f, fold));",
     "      *ar = reduce_combine_f32(op, *ar, ReduceRowVec(d, a + r * rs.a, ainc,"
     " op == ReduceOp::kProd && n > 1024 ? n - 1 : n, id, f, fold));",
     "a product over a row longer than 1024 drops its last element"),
]


def run(cmd, cwd, **kw):
    return subprocess.run(cmd, cwd=cwd, text=True, capture_output=True, **kw)


def failing_cases(build):
    """Runs every test binary; returns the failing test names (or 'binary: crashed')."""
    failed = []
    tests = sorted((build / "tests").glob("*_test"))
    for t in tests:
        try:
            r = run([str(t), "--gtest_brief=1"], build, timeout=600)
        except subprocess.TimeoutExpired:
            failed.append(f"{t.name}: timed out")
            continue
        names = re.findall(r"^\[  FAILED  \] ([\w/.]+)", r.stdout, flags=re.M)
        names = sorted(set(n for n in names if "." in n))
        if r.returncode != 0 and not names:
            names = [f"(exit {r.returncode})"]
        failed += [f"{t.name}: {n}" for n in names]
    return failed


def sync_tree(root, dst):
    """Copies the files git knows (tracked and untracked, not ignored) that differ, so that a
    kept scratch build stays incremental."""
    files = run(["git", "ls-files", "-co", "--exclude-standard"], root).stdout.split()
    for rel in files:
        s, d = root / rel, dst / rel
        if not s.is_file():
            continue
        data = s.read_bytes()
        if d.exists() and d.read_bytes() == data:
            continue
        d.parent.mkdir(parents=True, exist_ok=True)
        d.write_bytes(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scratch", default="/tmp/dvm-mutants")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--keep", action="store_true", help="keep the scratch tree")
    args = ap.parse_args()
    scratch = Path(args.scratch)
    src = scratch / "src-tree"
    build = scratch / "build"
    sync_tree(ROOT, src)
    jobs = os.environ.get("DVM_JOBS", "2")
    cfg = run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja",
               "-DCMAKE_BUILD_TYPE=Release", "-DDVM_BUILD_BENCHMARKS=OFF",
               "-DDVM_BUILD_TOOLS=OFF"], src)
    if cfg.returncode:
        sys.exit(cfg.stdout + cfg.stderr)
    b = run(["cmake", "--build", str(build), "-j", jobs], src)
    if b.returncode:
        sys.exit(b.stdout[-4000:] + b.stderr[-4000:])
    base = failing_cases(build)
    if base:
        sys.exit("the unmutated tree fails: " + ", ".join(base))
    weak = 0
    for name, rel, old, new, what in MUTANTS:
        if args.only and name not in args.only:
            continue
        path = src / rel
        text = path.read_text()
        if text.count(old) != 1:
            print(f"{name}: STALE (pattern found {text.count(old)} times in {rel})")
            weak += 1
            continue
        path.write_text(text.replace(old, new))
        try:
            b = run(["cmake", "--build", str(build), "-j", jobs], src)
            if b.returncode:
                print(f"{name}: does not build: {b.stdout[-2000:]}")
                weak += 1
                continue
            failed = failing_cases(build)
        finally:
            path.write_text(text)
        status = "caught" if len(failed) >= 2 else ("WEAK" if failed else "MISSED")
        weak += status != "caught"
        print(f"{name} ({what}): {status} by {len(failed)}")
        for f in failed[:12]:
            print(f"    {f}")
        if len(failed) > 12:
            print(f"    ... {len(failed) - 12} more")
        sys.stdout.flush()
    run(["cmake", "--build", str(build), "-j", jobs], src)  # leave the build unmutated
    if not args.keep:
        shutil.rmtree(scratch)
    sys.exit(1 if weak else 0)


if __name__ == "__main__":
    main()
