"""The host path, eager PyTorch / TorchInductor / DVM side by side, in one run:

    python3 python/bench/host_bench.py                 # everything (Inductor included)
    python3 python/bench/host_bench.py --no-inductor   # skip Inductor (no C++ compiles)
    python3 python/bench/host_bench.py --only per_call

- per_call: five tiny graphs through torch.compile(dynamic=True) (rmsnorm, layernorm, gelu of a
  biased input, silu gate, a two-matmul MLP) at sizes whose kernels take well under 5 us, so
  the time is the host path: Dynamo's guards, the compiled function, DVM's call. Beside them a
  backend that does no work (`dynamo_floor`: Dynamo's own cost per call, which no backend
  goes below). Interleaved
  rounds in one process (--rounds); each sample is --calls back-to-back calls; medians.
- exe_call: calling an Executable from Python on a one-kernel graph (a cached binding):
  `exe(...)` (torch tensors go through `dvm._dvm_torch`), the `Executable.call` binding, and
  `dvm._dvm_torch.call` directly (what the torch backend uses).
- first_call: HuggingFace GPT-2, BERT, T5 encoder and Llama (2 layers each, random weights from
  their configs, batch 2 x 37 tokens, no_grad), a fresh process per model, backend and
  repetition: the first call (Dynamo's trace + the backend's compile + the run) with backend
  "eager" (Dynamo's trace alone), "dvm" and "inductor", each child with an empty Inductor cache
  folder (cold); the median over --first-call-reps repetitions, backends taking turns.

Writes bench_results/host_bench.json (machine, date, commit, threads, results) and prints it;
scripts/perf_report.py turns it into docs/performance.md's section.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_graphs():
    import torch
    import torch.nn.functional as F

    def rmsnorm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def layernorm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b)

    def gelu_bias(x, b):
        return F.gelu(x + b)

    def silu_gate(a, b):
        return F.silu(a) * b

    def mlp(x, w1, w2):
        return torch.relu(x @ w1) @ w2

    r = torch.randn
    return {
        "rmsnorm [n, 16]": (rmsnorm, lambda n: (r(n, 16), r(16))),
        "layernorm [n, 32]": (layernorm, lambda n: (r(n, 32), r(32), r(32))),
        "gelu(x + b) [n, 64]": (gelu_bias, lambda n: (r(n, 64), r(64))),
        "silu(a) * b [n, 64]": (silu_gate, lambda n: (r(n, 64), r(n, 64))),
        "mlp 32-64-32 [n, 32]": (mlp, lambda n: (r(n, 32), r(32, 64), r(64, 32))),
    }


def time_calls(fn, args, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls * 1e6


def floor_backend(gm, example_inputs):
    """A torch.compile backend that does no work: its compiled function returns the outputs of
    its first call. What a call through it costs is Dynamo's own part of every call (guards,
    the frame, the call of the compiled function), the floor no backend goes below."""
    outs = None

    def call(*args):
        nonlocal outs
        if outs is None:
            outs = gm(*args)
        return outs

    return call


def per_call(inductor, rounds, calls):
    import torch

    import dvm.torch_backend  # noqa: F401 (registers "dvm")

    out = {}
    for name, (fn, make) in tiny_graphs().items():
        torch._dynamo.reset()
        cfgs = {"eager": fn, "dvm": torch.compile(fn, backend="dvm", dynamic=True),
                "dynamo_floor": torch.compile(fn, backend=floor_backend, dynamic=True)}
        if inductor:
            cfgs["inductor"] = torch.compile(fn, backend="inductor", dynamic=True)
        with torch.no_grad():
            for n in (3, 7, 5):  # the first two compile (static, then symbolic); 5 is timed
                for c in cfgs.values():
                    c(*make(n))
            args = make(5)
            want = fn(*args)
            for k, c in cfgs.items():
                if k != "dynamo_floor":  # returns its first call's outputs
                    torch.testing.assert_close(c(*args), want, rtol=1e-4, atol=1e-5)
            samples = {k: [] for k in cfgs}
            for _ in range(rounds):
                for k, c in cfgs.items():
                    samples[k].append(time_calls(c, args, calls))
        med = {k: statistics.median(v) for k, v in samples.items()}
        out[name] = {"us": med, "eager_over_dvm": med["eager"] / med["dvm"],
                     "eager_over_floor": med["eager"] / med["dynamo_floor"]}
        if inductor:
            out[name]["inductor_over_dvm"] = med["inductor"] / med["dvm"]
        print(f"per_call {name}: " + ", ".join(f"{k} {v:.1f} us" for k, v in med.items()),
              flush=True)
    return out


def exe_call(rounds, calls):
    import torch

    import dvm

    gb = dvm.GraphBuilder("gelu_bias")
    s = gb.symbol("S")
    x = gb.input("x", dvm.DType.F32, [s, 64])
    b = gb.input("b", dvm.DType.F32, [64])
    gb.output("y", gb.gelu(gb.binary(dvm.BinaryOp.ADD, x, b)))
    exe = dvm.Executable.compile(gb.build())
    X, B = torch.randn(5, 64), torch.randn(64)
    Xn, Bn = X.numpy(), B.numpy()
    fns = {"exe(...) (torch tensors)": lambda: exe(X, B),
           "Executable.call (torch tensors)": lambda: exe.call(X, B),
           "Executable.call (numpy arrays)": lambda: exe.call(Xn, Bn)}
    try:
        from dvm import _dvm_torch

        args, idx = (X, B), (0, 1)
        fns["dvm._dvm_torch.call"] = lambda: _dvm_torch.call(exe, args, idx)
    except ImportError:
        pass
    for f in fns.values():
        f()
    samples = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            samples[k].append(time_calls(f, (), calls))
    med = {k: statistics.median(v) for k, v in samples.items()}
    print("exe_call: " + ", ".join(f"{k} {v:.2f} us" for k, v in med.items()), flush=True)
    return {"graph": "gelu(x + b), x [5, 64], one kernel, cached binding", "us": med}


MODELS = ("gpt2", "bert", "t5", "llama")


def hf_model(name):
    import torch
    import transformers as T

    torch.manual_seed(0)
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=2))
    if name == "bert":
        return T.BertModel(T.BertConfig(num_hidden_layers=2))
    if name == "t5":
        return T.T5EncoderModel(T.T5Config(num_layers=2))
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(hidden_size=512, num_hidden_layers=2,
                                                num_attention_heads=8, num_key_value_heads=4,
                                                intermediate_size=1376, vocab_size=32000))
    raise ValueError(name)


def first_call_child(model, backend):
    import torch

    import dvm.torch_backend  # noqa: F401

    m = hf_model(model).eval()
    c = torch.compile(m, backend=backend, dynamic=True)
    ids = torch.randint(0, 500, (2, 37))
    with torch.no_grad():
        t0 = time.perf_counter()
        c(ids)
        first = time.perf_counter() - t0
    print(json.dumps({"first_s": first}))


def first_call(inductor, reps):
    """Median over `reps` fresh processes per model and backend, the backends taking turns
    within each repetition (a shared machine's speed drifts by tens of percent over minutes)."""
    from models_bench import fresh_process_first_s  # this directory (the script's own)

    backends = ["eager", "dvm"] + (["inductor"] if inductor else [])
    out = {}
    for model in MODELS:
        samples = {be: [] for be in backends}
        for _ in range(reps):
            for be in backends:
                s = fresh_process_first_s([__file__, "--child", model, be],
                                          f"first_call {model} {be}")
                if s is not None:
                    samples[be].append(s)
        row = {be: statistics.median(v) if v else None for be, v in samples.items()}
        row["samples"] = samples
        if row.get("dvm") and row.get("eager"):
            row["dvm_over_dynamo_trace"] = row["dvm"] / row["eager"]
        if row.get("dvm") and row.get("inductor"):
            row["inductor_over_dvm"] = row["inductor"] / row["dvm"]
        out[model] = row
        print(f"first_call {model}: " + ", ".join(
            f"{k} {v:.2f}" for k, v in row.items() if isinstance(v, float)), flush=True)
    return out


def machine(threads):
    import torch

    m = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
         "torch": torch.__version__, "torch_threads": threads}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    m["cpu"] = line.split(":", 1)[1].strip()
                    break
        m["load"] = [float(v) for v in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        pass
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--only", nargs="*", choices=("per_call", "exe_call", "first_call"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--first-call-reps", type=int, default=3,
                    help="fresh processes per model and backend for the first call (median)")
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch (and so DVM) threads for the in-process parts (default 1)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench_results", "host_bench.json"))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    if a.child:
        return first_call_child(*a.child)
    parts = a.only or ["per_call", "exe_call", "first_call"]
    res = {}
    if "per_call" in parts:
        res["per_call"] = per_call(not a.no_inductor, a.rounds, a.calls)
    if "exe_call" in parts:
        res["exe_call"] = exe_call(a.rounds, a.calls * 4)
    if "first_call" in parts:
        res["first_call"] = first_call(not a.no_inductor, a.first_call_reps)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or None
    doc = {"machine": machine(a.threads), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "commit": commit, "settings": {"rounds": a.rounds, "calls": a.calls,
                                          "first_call_reps": a.first_call_reps,
                                          "inductor": not a.no_inductor}, "results": res}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
