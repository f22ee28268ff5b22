"""Greedy decoding with a KV cache through torch.compile: eager, Inductor and DVM per token.

    python python/bench/decode_bench.py [--threads 2] [--models gpt2 llama] [--prompt 32]
                                        [--steps 48] [--rounds 5] [--configs eager inductor dvm]

The decoder models of models_bench (HuggingFace configs, random weights: 2 layers, hidden 256,
4 heads, 2 KV heads for Llama, FFN 1024, vocabulary 4096), batch 1. A decode is one prefill of
the prompt, then `steps` calls of the model's forward on one new token against the growing
cache (HuggingFace's DynamicCache), the next token the argmax of the last logits. Each compiled
configuration wraps `model.forward` with torch.compile(dynamic=True) (dvm_stats in the JSON:
the Dynamo graphs DVM compiled, its partitions and fallbacks).

- first decode: the configuration's first decode (compiles included), seconds;
- per token: the median step time of a round. In the first timed round every step meets a cache
  length DVM has not encoded before (each length's programs are encoded on first sight: new
  lengths); in the later rounds the lengths repeat (cached lengths). The configurations take
  turns within each round, in an order that rotates from round to round; figures are medians
  over rounds;
- tokens: every configuration's tokens equal eager's.

Each compiled configuration runs in a process of its own beside eager (--shared-process puts
them all in one): × eager is a ratio within one process, and Inductor / DVM compares two such
ratios.

--specialize-float sets Dynamo's `torch._dynamo.config.specialize_float` in every process: the
models' float settings (epsilons, scales) become constants of the graph instead of a tensor
made per call and passed in (Dynamo's default for dynamic=True), for every backend alike.

Writes bench_results/decode_bench.json (decode_bench_specialize_float.json with the flag).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dvm.torch_backend  # noqa: E402,F401  (registers "dvm" when not pip-installed)
from models_bench import FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, VOCAB  # noqa: E402
from models_bench import cpu_model, git_commit, make_model  # noqa: E402

MODELS = ("gpt2", "llama", "qwen2", "mistral")


def decode(forward, prompt, steps):
    """Prefill + `steps` one-token steps. Returns (tokens, prefill seconds, step seconds)."""
    t = time.perf_counter()
    out = forward(input_ids=prompt, use_cache=True)
    cache = out.past_key_values
    tok = out.logits[:, -1:].argmax(-1)
    prefill = time.perf_counter() - t
    toks, times = [tok], []
    for _ in range(steps):
        t = time.perf_counter()
        out = forward(input_ids=tok, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        times.append(time.perf_counter() - t)
        toks.append(tok)
    return torch.cat(toks, 1), prefill, times


def forward_for(model, config):
    if config == "eager":
        return model.forward
    backend = {"inductor": "inductor", "dvm": "dvm", "dynamo": "eager"}[config]
    return torch.compile(model.forward, backend=backend, dynamic=True)


def bench_model(name, configs, prompt_len, steps, rounds):
    model = make_model(name).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    prompt = torch.randint(0, VOCAB, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    dvm.torch_backend.reset_stats()
    fwd = {c: forward_for(model, c) for c in configs}
    first_s, same, new_len, cached, prefill = {}, {}, {}, {c: [] for c in configs}, {}
    ref = None
    with torch.no_grad():
        for c in configs:  # first decode: compiles, then the first sight of every length
            t = time.perf_counter()
            toks, _, _ = decode(fwd[c], prompt[:, : prompt_len // 2], 2)
            first_s[c] = time.perf_counter() - t
        for r in range(rounds + 1):
            # The order rotates: a configuration right after Inductor's round ran ~25% slower
            # (Llama, 2 threads: its OpenMP workers still hold the cores), so none always follows
            # the same one.
            for c in configs[r % len(configs):] + configs[:r % len(configs)]:
                toks, pre, times = decode(fwd[c], prompt, steps)
                if ref is None:
                    ref = toks
                same[c] = same.get(c, True) and torch.equal(toks, ref)
                if r == 0:
                    new_len[c] = statistics.median(times)
                else:
                    cached[c].append(statistics.median(times))
                    prefill.setdefault(c, []).append(pre)
    per_token = {c: statistics.median(v) * 1e3 for c, v in cached.items()}
    res = {
        "model": name,
        "first_decode_s": first_s,
        "per_token_ms": per_token,
        "per_token_new_lengths_ms": {c: v * 1e3 for c, v in new_len.items()},
        "per_token_rounds_ms": {c: [x * 1e3 for x in v] for c, v in cached.items()},
        "prefill_ms": {c: statistics.median(v) * 1e3 for c, v in prefill.items()},
        "same_tokens": same,
        "dvm_stats": dict(dvm.torch_backend.stats()),
    }
    if "eager" in per_token:
        res["speedup_vs_eager"] = {c: per_token["eager"] / t for c, t in per_token.items()}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama"], choices=MODELS)
    ap.add_argument("--configs", nargs="+", default=["eager", "inductor", "dvm"],
                    choices=["eager", "inductor", "dvm", "dynamo"])
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shared-process", action="store_true",
                    help="every configuration in this process (default: one process per "
                         "compiled configuration, each beside eager)")
    ap.add_argument("--specialize-float", action="store_true",
                    help="torch._dynamo.config.specialize_float = True in every process")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.specialize_float:
        torch._dynamo.config.specialize_float = True
    compiled = [c for c in args.configs if c != "eager"]
    if not args.shared_process and not args.child and len(compiled) > 1:
        return isolated(args, compiled)
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False  # cold, as models_bench
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="decode_bench_")
    torch.set_num_threads(args.threads)
    results = []
    for name in args.models:
        r = bench_model(name, args.configs, args.prompt, args.steps, args.rounds)
        results.append(r)
        cells = "  ".join(f"{c} {r['per_token_ms'][c]:.3f} ms/token "
                          f"(new lengths {r['per_token_new_lengths_ms'][c]:.3f}, first "
                          f"{r['first_decode_s'][c]:.2f} s, same {r['same_tokens'][c]})"
                          for c in args.configs)
        print(f"{name}: {cells}", flush=True)
    os.makedirs("bench_results", exist_ok=True)
    out = {
        "machine": {"cpu": cpu_model(), "threads": torch.get_num_threads(),
                    "load": os.getloadavg()},
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_commit(),
        "prompt": args.prompt, "steps": args.steps, "rounds": args.rounds,
        "specialize_float": args.specialize_float,
        "sizes": {"hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "ffn": FFN,
                  "layers": LAYERS, "vocab": VOCAB},
        "results": results,
    }
    if args.child:
        print(CHILD_MARK + json.dumps(out))
        return
    with open(result_path(args), "w") as f:
        json.dump(out, f, indent=1)


CHILD_MARK = "@@decode "


def result_path(args):
    name = "decode_bench_specialize_float" if args.specialize_float else "decode_bench"
    return os.path.join("bench_results", name + ".json")


def isolated(args, compiled):
    """One process per compiled configuration, each with eager beside it (ratios within a
    process). In one process, the configuration compiled with Inductor slowed DVM's step
    (Llama 0.37 -> 0.50 ms/token at 2 threads), whatever the order of the rounds, while a
    second backend that runs ATen ops (Dynamo's "eager") did not; so each backend gets a
    process of its own."""
    import subprocess

    merged = None
    for c in compiled:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--threads",
               str(args.threads), "--models", *args.models, "--configs", "eager", c,
               "--prompt", str(args.prompt), "--steps", str(args.steps), "--rounds",
               str(args.rounds)] + (["--specialize-float"] if args.specialize_float else [])
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith(CHILD_MARK)][-1]
        out = json.loads(line[len(CHILD_MARK):])
        if merged is None:
            merged = out
            merged["isolated"] = True
            continue
        for mine, theirs in zip(merged["results"], out["results"]):
            for key, value in theirs.items():
                if isinstance(value, dict):
                    # eager's figures: the first process's (each process has its own)
                    mine.setdefault(key, {}).update(
                        {k: v for k, v in value.items() if k != "eager" or k not in mine[key]})
            mine.setdefault("eager_per_token_ms_by_process", {})[c] = \
                theirs["per_token_ms"]["eager"]
            mine["speedup_vs_eager"][c] = theirs["speedup_vs_eager"][c]
    for r in merged["results"]:
        r.setdefault("eager_per_token_ms_by_process", {})[compiled[0]] = \
            r["per_token_ms"]["eager"]
        print(f"{r['model']}: " + "  ".join(
            f"{c} x{r['speedup_vs_eager'][c]:.2f} eager ({r['per_token_ms'][c]:.3f} ms/token)"
            for c in compiled), flush=True)
    os.makedirs("bench_results", exist_ok=True)
    with open(result_path(args), "w") as f:
        json.dump(merged, f, indent=1)


if __name__ == "__main__":
    main()
