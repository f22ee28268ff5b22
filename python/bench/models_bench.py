"""HuggingFace models through torch.compile: eager, Inductor and DVM, steady state and first call.

    python python/bench/models_bench.py [--threads 2] [--lengths 32 64 128 256] [--rounds 5]
                                        [--models gpt2 bert ...] [--configs eager inductor dvm]
                                        [--dtype f32|bf16]

Models are built from their transformers config classes with random weights (nothing is
downloaded): 2 layers, hidden 256, 4 heads (2 KV heads where the model has grouped-query
attention), FFN 1024, vocabulary 4096; batch 2 x each sequence length (ViT: batch = length / 16
images of 64 x 64). Each compiled configuration uses dynamic=True, so one compilation serves all
lengths.

- first call: the compiled model's first call (Dynamo's trace and the backend's compile
  included), at the first length; Inductor starts cold: no FX graph cache, an empty kernel
  cache directory (a user's first run of a model; --inductor-cache keeps both). Measured twice:
  in this process, after the models before it (a warm process: imports done, Inductor's
  machinery started), and in fresh processes, one per model and backend (a cold start: a
  user's first compile; --cold-reps, the median), where backend "eager" gives Dynamo's trace
  alone, the bound below which no backend's first call goes;
- steady state: per length, the configurations are called in turn in each round (after a
  warm-up call at that length), median per configuration over the rounds;
- x eager: the geometric mean over lengths of eager time / config time.

Writes bench_results/models_bench.json (f32) or models_bench_bf16.json (--dtype bf16).
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

import dvm.torch_backend  # noqa: F401  (registers "dvm" when not pip-installed)

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, VOCAB = 256, 4, 2, 1024, 2, 4096


def make_model(name):
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB)
    decoder = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                   intermediate_size=FFN, **common)
    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                                n_inner=FFN, **common))
    if name == "bert":
        return tf.BertModel(tf.BertConfig(**decoder))
    if name == "distilbert":
        return tf.DistilBertModel(tf.DistilBertConfig(dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                                                      hidden_dim=FFN, **common))
    if name == "t5":
        return tf.T5EncoderModel(tf.T5Config(d_model=HIDDEN, d_kv=HIDDEN // HEADS,
                                             num_heads=HEADS, d_ff=FFN, num_layers=LAYERS,
                                             **common))
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(num_key_value_heads=KV_HEADS, **decoder))
    if name == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(num_key_value_heads=KV_HEADS, **decoder))
    if name == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(num_key_value_heads=KV_HEADS,
                                                      sliding_window=None, **decoder))
    if name == "vit":
        return tf.ViTModel(tf.ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                        num_attention_heads=HEADS, intermediate_size=FFN,
                                        image_size=64, patch_size=8))
    raise ValueError(name)


MODELS = ("gpt2", "bert", "distilbert", "t5", "llama", "qwen2", "mistral", "vit")
ENCODERS = ("bert", "distilbert", "t5", "vit")


def inputs(name, length, dtype):
    if name == "vit":
        return {"pixel_values": torch.randn(max(1, length // 16), 3, 64, 64, dtype=dtype)}
    kw = {} if name in ENCODERS else {"use_cache": False}
    return {"input_ids": torch.randint(0, VOCAB, (2, length)), **kw}


def first_tensor(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def compiled(model, config):
    if config == "eager":
        return model
    torch._dynamo.reset()
    return torch.compile(model, backend="inductor" if config == "inductor" else "dvm",
                         dynamic=True)


def cold_first_call(name, config, dtype_name):
    """Child process: the first call of one model and backend, in seconds (printed as JSON)."""
    dtype = torch.float32 if dtype_name == "f32" else torch.bfloat16
    model = make_model(name).to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    fn = torch.compile(model, backend=config, dynamic=True)
    kw = inputs(name, COLD_LENGTH, dtype)
    with torch.no_grad():
        t = time.perf_counter()
        fn(**kw)
        print(json.dumps({"first_s": time.perf_counter() - t}))


COLD_LENGTH = 32
COLD_BACKENDS = ("eager", "dvm", "inductor")  # "eager": Dynamo's trace alone


def fresh_process_first_s(argv, what):
    """Runs `python argv...` in a fresh process with an empty Inductor cache directory (a cold
    start: Inductor caches compiled graphs on disk) and returns the "first_s" of the JSON line
    it prints last; None, with its stderr printed, when it fails. (host_bench uses it too.)"""
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])["first_s"]
    except (IndexError, ValueError, KeyError):
        print(f"{what} failed:\n{r.stderr[-2000:]}", flush=True)
        return None


def cold_first_calls(name, reps, threads, dtype_name):
    """Median over `reps` fresh processes per backend (taking turns); {backend: seconds or
    None}."""
    samples = {be: [] for be in COLD_BACKENDS}
    for _ in range(reps):
        for be in COLD_BACKENDS:
            s = fresh_process_first_s([__file__, "--threads", str(threads), "--dtype", dtype_name,
                                       "--cold-child", name, be], f"cold first call {name} {be}")
            if s is not None:
                samples[be].append(s)
    return {be: statistics.median(v) if v else None for be, v in samples.items()}


def timed(fn, kw):
    t = time.perf_counter()
    out = fn(**kw)
    return (time.perf_counter() - t) * 1e3, out


def bench_model(name, configs, lengths, rounds, dtype):
    model = make_model(name).to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    fns, first_ms, errors = {}, {}, {}
    with torch.no_grad():
        for c in configs:
            # Dynamo's caches are per function object; each config gets a fresh one and its
            # first call is timed alone (reset between them: one compiled model at a time
            # would also re-trace the others on a new length).
            fn = compiled(model, c)
            torch.manual_seed(1)
            kw = inputs(name, lengths[0], dtype)
            first_ms[c], out = timed(fn, kw)
            torch.manual_seed(1)
            want = first_tensor(model(**inputs(name, lengths[0], dtype))).float()
            got = first_tensor(out).float()
            errors[c] = ((got - want).norm() / want.norm()).item()
            fns[c] = fn
        steady = {c: {} for c in configs}
        for length in lengths:
            kw = inputs(name, length, dtype)
            for c in configs:
                fns[c](**kw)  # warm-up at this length (recompiles, if any, happen here)
            samples = {c: [] for c in configs}
            for _ in range(rounds):
                for c in configs:
                    samples[c].append(timed(fns[c], kw)[0])
            for c in configs:
                steady[c][str(length)] = statistics.median(samples[c])
    speedup = {}
    for c in configs:
        if "eager" in steady:
            logs = [math.log(steady["eager"][k] / v) for k, v in steady[c].items()]
            speedup[c] = math.exp(sum(logs) / len(logs))
    return {"model": name, "first_call_ms": first_ms, "steady_ms": steady,
            "speedup_vs_eager": speedup, "rel_error": errors}


def cpu_model():
    """The CPU's model name, with its family and model numbers: virtual machines often name
    only the vendor line ("AMD EPYC"), which hides e.g. a Zen 4 (family 25) from a Zen 5 (26)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--configs", nargs="+", default=["eager", "inductor", "dvm"],
                    choices=["eager", "inductor", "dvm"])
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--inductor-cache", action="store_true")
    ap.add_argument("--cold-reps", type=int, default=1,
                    help="fresh processes per model and backend for the cold first call "
                         "(median; 0 skips it)")
    ap.add_argument("--cold-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cold_child:
        torch.set_num_threads(args.threads)
        return cold_first_call(*args.cold_child, args.dtype)
    if not args.inductor_cache:
        # Cold: no FX graph cache and a fresh directory for compiled kernels (else a rerun
        # loads the C++ Inductor built before).
        import tempfile

        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = False
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="models_bench_")
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    results = []
    for name in args.models:
        r = bench_model(name, args.configs, args.lengths, args.rounds, dtype)
        if args.cold_reps > 0:
            r["cold_first_call_s"] = cold_first_calls(name, args.cold_reps, args.threads,
                                                      args.dtype)
        results.append(r)
        cells = "  ".join(f"{c} x{r['speedup_vs_eager'].get(c, float('nan')):.2f} "
                          f"(first {r['first_call_ms'][c] / 1e3:.2f} s, err "
                          f"{r['rel_error'][c]:.1e})" for c in args.configs)
        print(f"{name}: {cells}", flush=True)
    os.makedirs("bench_results", exist_ok=True)
    out = {
        "machine": {"cpu": cpu_model(),
                    "threads": torch.get_num_threads(), "load": os.getloadavg()},
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_commit(),
        "dtype": args.dtype,
        "lengths": args.lengths,
        "rounds": args.rounds,
        "inductor_fx_cache": args.inductor_cache,
        "cold_reps": args.cold_reps, "cold_length": COLD_LENGTH,
        "sizes": {"hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "ffn": FFN,
                  "layers": LAYERS, "vocab": VOCAB},
        "results": results,
    }
    name = "models_bench.json" if args.dtype == "f32" else f"models_bench_{args.dtype}.json"
    with open(os.path.join("bench_results", name), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
