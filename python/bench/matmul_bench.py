"""DVM matmul against torch.mm (and torch's linear for x @ W^T) in the same process.

    python python/bench/matmul_bench.py [--quick] [--threads N]

Shapes (issue 3): square 64..2048, BERT shapes (M = batch*seq for seq 1..512, K,N in {768,
3072}), skinny M = 1..16; plus gelu(x @ W + b) fused in one DVM kernel against torch's three
ops. Prints a table (GFLOP/s, ratio DVM/torch, > 1: DVM faster) and writes
bench_results/matmul_bench.json. Medians of repeated runs; the machine's load is recorded.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import numpy as np
import torch

import dvm


def median_ms(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def compare_ms(fns, reps, rounds=3):
    """Median ms of each function, measured in alternating rounds (load changes even out) with a
    pause before each: torch's OpenMP workers spin for a while after a parallel region and
    would otherwise take the cores from whatever runs next."""
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            time.sleep(0.02)
            samples[i].append(median_ms(fn, max(1, reps // rounds) + 1))
    return [statistics.median(s) for s in samples]


def matmul_exe(transpose_b, epilogue):
    gb = dvm.GraphBuilder("mm")
    m, n, k = gb.symbol("M"), gb.symbol("N"), gb.symbol("K")
    x = gb.input("x", dvm.DType.F32, [m, k])
    w = gb.input("w", dvm.DType.F32, [n, k] if transpose_b else [k, n])
    y = gb.matmul(x, w, False, transpose_b)
    if epilogue:
        b = gb.input("b", dvm.DType.F32, [n])
        y = gb.gelu(gb.binary(dvm.BinaryOp.ADD, y, b))
    gb.output("y", y)
    return dvm.Executable.compile(gb.build())


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="few shapes, few repetitions")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # DVM's kernels run on torch's intra-op pool; their part count follows DVM's own setting,
    # read when the first kernel compiles: the same thread count for both sides.
    os.environ["DVM_NUM_THREADS"] = str(args.threads)
    reps = 3 if args.quick else 9
    square = [64, 256, 1024] if args.quick else [64, 128, 256, 512, 1024, 2048]
    seqs = [1, 128] if args.quick else [1, 16, 128, 512]
    shapes = [("square", s, s, s, False) for s in square]
    for seq in seqs:
        for n, k in [(3072, 768), (768, 3072), (768, 768)]:
            shapes.append(("bert x@W^T", seq, n, k, True))
    for m in [1, 4, 16]:
        shapes.append(("skinny x@W^T", m, 3072, 768, True))
        shapes.append(("skinny", m, 3072, 768, False))

    exes = {(t, e): matmul_exe(t, e) for t in (False, True) for e in (False, True)}
    rng = np.random.default_rng(0)
    rows = []
    # "const W": W passed as dvm.constant(w) (a model weight): packed once, cached by DVM.
    print(f"{'kind':14} {'M':>5} {'N':>5} {'K':>5} {'dvm GF/s':>9} {'const W':>8} "
          f"{'torch GF/s':>10} {'ratio':>6} {'const':>6}")
    for kind, m, n, k, tb in shapes:
        x = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
        w = torch.from_numpy(rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32))
        out = torch.empty(m, n)
        exe = exes[(tb, False)]
        cw = dvm.constant(w)
        with torch.inference_mode():
            t_dvm, t_const, t_torch = compare_ms(
                [lambda: exe.run([x, w], [out]), lambda: exe.run([x, cw], [out]),
                 (lambda: torch.nn.functional.linear(x, w)) if tb else (lambda: torch.mm(x, w))],
                reps)
        ref = torch.nn.functional.linear(x, w) if tb else torch.mm(x, w)
        err = float((out - ref).abs().max())
        gf = 2.0 * m * n * k / 1e6
        row = dict(kind=kind, m=m, n=n, k=k, dvm_ms=t_dvm, dvm_const_ms=t_const,
                   torch_ms=t_torch, dvm_gflops=gf / t_dvm, dvm_const_gflops=gf / t_const,
                   torch_gflops=gf / t_torch, ratio=t_torch / t_dvm,
                   ratio_const=t_torch / t_const, max_abs_err=err)
        rows.append(row)
        print(f"{kind:14} {m:5d} {n:5d} {k:5d} {row['dvm_gflops']:9.1f} "
              f"{row['dvm_const_gflops']:8.1f} {row['torch_gflops']:10.1f} {row['ratio']:6.2f} "
              f"{row['ratio_const']:6.2f}")

    print("\ngelu(x @ W + b), K=768 N=3072: DVM one fused kernel vs torch's three ops")
    fused = []
    for m in [32, 128] if args.quick else [32, 128, 512]:
        x = torch.randn(m, 768)
        w = torch.randn(768, 3072)
        b = torch.randn(3072)
        out = torch.empty(m, 3072)
        exe = exes[(False, True)]
        cw = dvm.constant(w)
        with torch.inference_mode():
            t_dvm, t_const, t_torch = compare_ms(
                [lambda: exe.run([x, w, b], [out]), lambda: exe.run([x, cw, b], [out]),
                 lambda: torch.nn.functional.gelu(torch.mm(x, w) + b)], reps)
        fused.append(dict(m=m, dvm_ms=t_dvm, dvm_const_ms=t_const, torch_ms=t_torch,
                          ratio=t_torch / t_dvm, ratio_const=t_torch / t_const))
        print(f"  M={m:4d}: dvm {t_dvm:7.3f} ms (const W {t_const:7.3f})  torch {t_torch:7.3f} ms"
              f"  ratio {t_torch / t_dvm:.2f} (const W {t_torch / t_const:.2f})")

    big = [r["ratio"] for r in rows if min(r["m"], r["n"], r["k"]) >= 256]
    geo = float(np.exp(np.mean(np.log(big)))) if big else float("nan")
    big_c = [r["ratio_const"] for r in rows if min(r["m"], r["n"], r["k"]) >= 256]
    geo_c = float(np.exp(np.mean(np.log(big_c)))) if big_c else float("nan")
    print(f"\nM,N,K >= 256: geomean ratio {geo:.2f}, min {min(big):.2f}; with const W {geo_c:.2f}, "
          f"min {min(big_c):.2f} (target >= 0.9)")
    result = dict(machine=dict(cpu=cpu_model(), cores=os.cpu_count(), threads=args.threads,
                               load=os.getloadavg(), torch=torch.__version__),
                  matmul=rows, fused_gelu=fused, geomean_ge256=geo,
                  geomean_ge256_const_w=geo_c)
    os.makedirs("bench_results", exist_ok=True)
    with open("bench_results/matmul_bench.json", "w") as f:
        json.dump(result, f, indent=1)
    print("wrote bench_results/matmul_bench.json")


if __name__ == "__main__":
    main()
