"""PyTorch's OpInfo database run through the torch.compile backend, against eager.

One *case* is an (OpInfo op, dtype) pair. Its first SAMPLES_PER_CASE sample inputs (seeded, so
every run sees the same tensors) each run once eagerly and once through
``torch.compile(fn, backend="dvm", dynamic=True)``; the case's status is the worst over its
samples:

    wrong      a sample's compiled result differs from eager (beyond the tolerances below)
    exception  the compiled call raised where eager did not
    dvm        every sample matched and at least one DVM partition ran
    fallback   every sample matched and nothing ran in DVM (the reasons are kept)
    no_samples no sample ran eagerly (the op raised on every one): nothing to compare

``dynamic=True`` because that is how the backend is meant to be used (symbolic shapes, one
compile for every size) and the path most of its code serves; a static compile would exercise
a subset. Dynamo's cache is reset before and after every case, so one case never reuses
another's graphs, and the samples of a case share one compiled function, as a model's calls do.

Comparison: results are flattened with pytree and compared leaf by leaf (same structure, dtype
and shape; values with ``torch.testing.assert_close`` at the per-dtype tolerances of TOL,
NaN == NaN, integers and bools exactly). A floating leaf outside them gets a second chance the
way Inductor's OpInfo test gives one: the op is run eagerly in float64 and the compiled result
passes if its error against that reference is at most twice eager's own plus atol (DVM computes
f16/bf16 in f32, so it is often *closer* to the truth than eager). A wrong result is then rerun
through the same decompositions with no DVM (AOTAutograd, eager ATen), which tells a DVM bug
from a decomposition's.

Used by python/tests/test_opinfo.py (the pytest cases) and scripts/opinfo_conformance.py (the
full sweep to JSON, one subprocess per chunk of cases so a crash cannot end the sweep).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import time

import torch
import torch.utils._pytree as pytree

import dvm.torch_backend as tb

SAMPLES_PER_CASE = 6

# Statuses of a failed case: the two run_case gives, and the two the sweep script gives when a
# case kills its worker process or runs past the time limit.
FAILURES = ("wrong", "exception", "crash", "timeout")

DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i32": torch.int32,
    "i64": torch.int64,
    "bool": torch.bool,
}

# (rtol, atol) against eager; beyond them see the float64 check in the module docstring
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float64: (1e-7, 1e-7),
}

EXPECTED_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opinfo_expected.json")

_RANDOM = "random: eager and compiled draw different numbers"
_UNDEFINED = "its output values are undefined (uninitialised memory)"

# Ops that cannot be meaningfully compared (by OpInfo name, with variant: "normal.in_place").
SKIPS = {
    **{name: _RANDOM for name in (
        "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial",
        "normal", "normal.in_place", "normal.number_mean", "uniform", "rand_like", "randint",
        "randint_like", "randn", "randn_like", "nn.functional.dropout",
        "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout.with_train", "nn.functional.rrelu",
        "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
        "svd_lowrank", "pca_lowrank")},
    **{name: _UNDEFINED for name in (
        "empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
        "new_empty_strided", "resize_", "resize_as_")},
    **{name: "sparse tensors: Dynamo does not trace them" for name in (
        "to_sparse", "sparse.sampled_addmm", "sparse.mm.reduce")},
    **{name: "jiterator: CUDA only" for name in (
        "jiterator_unary", "jiterator_binary", "jiterator_4inputs_with_extra_args",
        "jiterator_binary_return_by_ref", "jiterator_2inputs_2outputs")},
}

# The default pytest run: a few (op, dtype) cases per family of what the backend translates
# (elementwise, reductions, normalisations, matmul, indexing, views) and of what it leaves to
# PyTorch, small enough for about a minute on two cores. DVM_OPINFO=full runs every case.
QUICK = (
    # elementwise, float
    ("abs", "f32"), ("add", "f32"), ("add", "bf16"), ("mul", "f16"), ("sub", "i64"),
    ("div.no_rounding_mode", "f32"), ("div.floor_rounding", "i32"), ("exp", "f32"),
    ("exp", "bf16"), ("log", "f32"), ("tanh", "f16"), ("sigmoid", "f32"), ("sqrt", "f32"),
    ("rsqrt", "f32"), ("erf", "f32"), ("pow", "f32"), ("clamp", "f32"), ("where", "f32"),
    ("maximum", "i32"), ("eq", "f32"), ("lt", "i64"), ("logical_and", "bool"),
    ("nn.functional.gelu", "f32"), ("nn.functional.silu", "f32"), ("nn.functional.relu", "f16"),
    ("nn.functional.leaky_relu", "f32"), ("lerp", "f32"), ("nan_to_num", "f32"),
    ("to", "f32"), ("float", "i64"),
    # reductions and normalisations
    ("sum", "f32"), ("sum", "i64"), ("mean", "f32"), ("amax", "f32"), ("argmax", "f32"),
    ("var", "f32"), ("softmax", "f32"), ("log_softmax", "f32"), ("logsumexp", "f32"),
    ("nn.functional.layer_norm", "f32"), ("nn.functional.rms_norm", "f32"),
    # matmul
    ("mm", "f32"), ("bmm", "f32"), ("addmm", "f32"), ("nn.functional.linear", "f32"),
    # indexing and data movement
    ("index_select", "f32"), ("gather", "f32"), ("cat", "f32"), ("stack", "f32"),
    ("transpose", "f32"), ("expand", "f32"), ("flip", "f32"), ("tril", "f32"),
    ("nn.functional.embedding", "f32"), ("arange", "i64"), ("full_like", "f32"),
    # int arguments that are values, negative in some samples (bound through carriers only
    # when >= 0), and a Python meta function that needs the Python dispatcher (addbmm)
    ("index_add", "f32"), ("tril", "i64"), ("full", "i64"), ("addbmm", "f32"),
    # more dtypes
    ("softmax", "bf16"), ("nn.functional.layer_norm", "f16"), ("matmul", "f16"),
    ("sum", "i32"), ("any", "bool"), ("all", "bool"), ("clamp", "i64"), ("where", "bool"),
    ("masked_fill", "f32"), ("cat", "i64"), ("mean", "bf16"), ("var_mean", "f32"),
    ("std", "f32"), ("sigmoid", "bf16"), ("neg", "i32"), ("bitwise_and", "i64"),
    ("remainder", "i32"), ("floor_divide", "i64"), ("abs", "f16"), ("bool", "f32"),
    # left to PyTorch
    ("sort", "f32"), ("cumsum", "f32"), ("nonzero", "f32"), ("fft.rfft", "f32"),
    ("linalg.inv", "f32"), ("item", "f32"),
)


def op_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def op_by_name() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    return {op_name(op): op for op in op_db}


def all_cases(ops: dict) -> list[tuple[str, str]]:
    """Every (op, dtype) the op supports on CPU, skips included (the caller skips them)."""
    out = []
    for name, op in ops.items():
        supported = op.supported_dtypes("cpu")
        out += [(name, key) for key, dt in DTYPES.items() if dt in supported]
    return out


# -- expected lists ----------------------------------------------------------------------------


def load_expected(path: str = EXPECTED_PATH) -> dict:
    with open(path) as f:
        return json.load(f)


def expected_status(expected: dict, name: str, dtype: str) -> tuple[str, str]:
    """(status, reason) the expected lists give a case: "dvm" unless listed."""
    failure = expected.get("failures", {}).get(name, {}).get(dtype)
    if failure is not None:
        return failure["status"], failure["reason"]
    if name in expected.get("fallback", {}).get(dtype, ()):
        return "fallback", ""
    return "dvm", ""


def check_against_expected(result: dict, expected: dict) -> str | None:
    """None if the case did what the expected lists say, else what changed."""
    name, dtype, got = result["op"], result["dtype"], result["status"]
    want, why = expected_status(expected, name, dtype)
    if got == want or got == "no_samples":
        return None
    fix = ("update the expected lists: python3 scripts/opinfo_conformance.py "
           "--update-expected (then review the diff of python/tests/opinfo_expected.json)")
    if want == "dvm":
        return f"{name} {dtype}: newly {got}: {result['reason']}"
    if got == "dvm":
        return (f"{name} {dtype}: expected {want} ({why or 'listed'}) but it now passes in DVM: "
                f"{fix}")
    return (f"{name} {dtype}: expected {want} ({why or 'listed'}), got {got}: "
            f"{result['reason']}; if that is intended, {fix}")


def expected_from_results(results: list[dict], old: dict | None = None) -> dict:
    """The expected lists that make `results` pass; a failure's hand-written reason in `old`
    is kept while its status stays the same."""
    old = old or {}
    fallback: dict[str, list[str]] = {k: [] for k in DTYPES}
    failures: dict[str, dict[str, dict]] = {}
    for r in sorted(results, key=lambda r: (r["op"], list(DTYPES).index(r["dtype"]))):
        if r["status"] == "fallback":
            fallback[r["dtype"]].append(r["op"])
        elif r["status"] in FAILURES:
            prev = old.get("failures", {}).get(r["op"], {}).get(r["dtype"])
            reason = (prev["reason"] if prev and prev["status"] == r["status"]
                      else r["reason"].splitlines()[0][:200] if r["reason"] else "")
            failures.setdefault(r["op"], {})[r["dtype"]] = {"status": r["status"],
                                                            "reason": reason}
    return {
        "comment": "Generated by scripts/opinfo_conformance.py --update-expected; read by "
                   "python/tests/test_opinfo.py. fallback: per dtype, the OpInfo ops that run "
                   "entirely in PyTorch. failures: wrong results and exceptions, each with a "
                   "reason (edit it: it is kept while the status holds). Every other case must "
                   "run at least partly in DVM and match eager.",
        "samples_per_case": SAMPLES_PER_CASE,
        "fallback": {k: v for k, v in fallback.items() if v},
        "failures": failures,
    }


def dump_expected(expected: dict, path: str = EXPECTED_PATH) -> None:
    """One op per line, so a change to the lists reads as a small diff."""
    lines = ["{", f'  "comment": {json.dumps(expected["comment"])},',
             f'  "samples_per_case": {expected["samples_per_case"]},', '  "fallback": {']
    fb = list(expected["fallback"].items())
    for i, (dt, names) in enumerate(fb):
        lines.append(f"    {json.dumps(dt)}: [")
        lines += [f"      {json.dumps(n)}{',' if j + 1 < len(names) else ''}"
                  for j, n in enumerate(names)]
        lines.append("    ]" + ("," if i + 1 < len(fb) else ""))
    lines += ["  },", '  "failures": {']
    fl = list(expected["failures"].items())
    for i, (name, per_dtype) in enumerate(fl):
        items = list(per_dtype.items())
        lines.append(f"    {json.dumps(name)}: {{")
        lines += [f"      {json.dumps(dt)}: {json.dumps(v)}{',' if j + 1 < len(items) else ''}"
                  for j, (dt, v) in enumerate(items)]
        lines.append("    }" + ("," if i + 1 < len(fl) else ""))
    lines += ["  }", "}"]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


# -- one case ----------------------------------------------------------------------------------


class _Mismatch(AssertionError):
    pass


def _clone(tree):
    return pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def _upcast(tree):
    def up(x):
        if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16,
                                                       torch.float32):
            return x.detach().to(torch.float64)
        return x

    return pytree.tree_map(up, tree)


def _max_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |x - ref| where both are finite; inf if their NaN or inf patterns differ."""
    x, ref = x.double(), ref.double()
    if not torch.equal(torch.isnan(x), torch.isnan(ref)):
        return float("inf")
    fin = torch.isfinite(ref)
    if not torch.equal(x[~fin & ~torch.isnan(ref)], ref[~fin & ~torch.isnan(ref)]):
        return float("inf")
    if not fin.any():
        return 0.0
    return float((x[fin] - ref[fin]).abs().max())


def _compare_leaf(got, want, ref_leaf, where):
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise _Mismatch(f"{where}: got {type(got).__name__}, want a tensor")
        if got.dtype != want.dtype or got.shape != want.shape:
            raise _Mismatch(f"{where}: got {got.dtype}{list(got.shape)}, want "
                            f"{want.dtype}{list(want.shape)}")
        if got.is_complex() or got.dtype.is_floating_point:
            rtol, atol = TOL.get(want.dtype, TOL[torch.float32])
            try:
                torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
                return
            except AssertionError as e:
                msg = str(e).strip().splitlines()
                if (isinstance(ref_leaf, torch.Tensor) and ref_leaf.shape == want.shape
                        and not got.is_complex()):
                    e_got, e_want = _max_err(got, ref_leaf), _max_err(want, ref_leaf)
                    if e_got <= 2 * e_want + atol:
                        return
                    msg.append(f"against float64: compiled error {e_got:.3g}, eager "
                               f"{e_want:.3g}")
                raise _Mismatch(f"{where}: " + " ".join(m.strip() for m in msg if m.strip()))
        if not torch.equal(got, want):
            bad = (got != want).nonzero()
            raise _Mismatch(f"{where}: {len(bad)} of {want.numel()} elements differ, first at "
                            f"{bad[0].tolist()}: got {got[tuple(bad[0])].item()}, want "
                            f"{want[tuple(bad[0])].item()}")
        return
    if isinstance(want, float) and isinstance(got, float):
        if not (got == want or (got != got and want != want) or abs(got - want) <= 1e-5 *
                (1 + abs(want))):
            raise _Mismatch(f"{where}: got {got}, want {want}")
        return
    if type(got) is not type(want) or got != want:
        raise _Mismatch(f"{where}: got {got!r}, want {want!r}")


def compare(got, want, reference=None) -> None:
    """Raises _Mismatch naming the first output leaf that differs (see the module docstring);
    `reference`: a callable giving the float64 result, called only when needed."""
    g_leaves, g_spec = pytree.tree_flatten(got)
    w_leaves, w_spec = pytree.tree_flatten(want)
    if g_spec != w_spec:
        raise _Mismatch(f"output structure: got {g_spec}, want {w_spec}")
    refs = None
    for i, (g, w) in enumerate(zip(g_leaves, w_leaves)):
        where = f"output {i}" if len(w_leaves) > 1 else "output"
        try:
            _compare_leaf(g, w, None, where)
        except _Mismatch:
            if refs is None and reference is not None and isinstance(w, torch.Tensor) and (
                    w.dtype.is_floating_point):
                try:
                    r_leaves, r_spec = pytree.tree_flatten(reference())
                    refs = r_leaves if r_spec == w_spec else []
                except Exception:  # noqa: BLE001  (no float64 kernel: the mismatch stands)
                    refs = []
            _compare_leaf(g, w, refs[i] if refs else None, where)


class _LogLines(logging.Handler):
    """The backend's fallback log lines (DVM_LOG_FALLBACK's), normalised: graph and node names
    dropped so equal reasons compare equal across graphs."""

    _NODE = re.compile(r"^dvm: \S+: \S+ \((.*?)\) runs in PyTorch: (.*)$", re.S)
    _PART = re.compile(r"^dvm: partition \S+ \((\d+) nodes\) runs in PyTorch: (.*)$", re.S)
    _RUN = re.compile(r"^dvm: partition \S+ failed at run time, running it in PyTorch: (.*)$",
                      re.S)
    _NONE = re.compile(r"^dvm: \S+: (nothing for DVM: .*)$", re.S)

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        for pattern, fmt in ((self._NODE, "{0}: {1}"), (self._PART, "partition build: {1}"),
                             (self._RUN, "run time: {0}"), (self._NONE, "{0}")):
            m = pattern.match(msg)
            if m:
                r = fmt.format(*m.groups()).splitlines()[0][:300]
                if r.startswith("<built-in function getitem>: its producer"):
                    return  # the producer's own line says why
                target = m.group(1) + ": "
                if r.startswith(target + target):  # translator errors name the op again
                    r = r[len(target):]
                if r not in self.reasons:
                    self.reasons.append(r)
                return


_COUNTERS = ("dynamo_graphs", "dvm_partitions", "dvm_nodes", "partitions_run",
             "fallback_nodes", "partition_fallbacks", "runtime_fallbacks")


def _stats_delta(before):
    now = tb.stats()
    return {k: now.get(k, 0) - before.get(k, 0) for k in _COUNTERS}


def _graph_breaks() -> list[str]:
    from torch._dynamo.utils import counters

    return [str(k).splitlines()[0][:200] for k in counters["graph_break"]]


def _one_line(e: BaseException) -> str:
    """The exception in one line; for a backend failure, the backend's own exception and the
    innermost frame of the dvm package it passed through."""
    inner = getattr(e, "inner_exception", None)
    where = ""
    if inner is not None:
        import traceback

        frames = [f for f in traceback.extract_tb(inner.__traceback__)
                  if f"{os.sep}dvm{os.sep}" in f.filename]
        if frames:
            f = frames[-1]
            where = f" (in {os.path.basename(f.filename)}:{f.lineno} {f.name})"
        e = inner
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}{where}: {s[0][:300] if s else ''}"


def _without_dvm(fn, args, kwargs, want) -> str:
    """Is it DVM's doing? The sample through Dynamo and AOTAutograd with the backend's
    decompositions, run as eager ATen (no DVM): "matches" eager, is "also wrong", or "raises"."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                           decompositions=tb.decompositions())
    torch._dynamo.reset()
    try:
        got = torch.compile(fn, backend=backend, dynamic=True)(*_clone(args), **_clone(kwargs))
        compare(got, want)
        return "matches"
    except _Mismatch:
        return "also wrong"
    except Exception as e:  # noqa: BLE001
        return f"raises {_one_line(e)}"
    finally:
        torch._dynamo.reset()


def samples_of(op, dtype: torch.dtype, n: int = SAMPLES_PER_CASE) -> list:
    torch.manual_seed(0)
    return list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=False), n))


def run_case(op, name: str, dtype_key: str, n_samples: int = SAMPLES_PER_CASE) -> dict:
    """Runs one case; returns its record (status, reason, per-sample outcomes, the backend's
    counters over the case, fallback reasons, seconds)."""
    t0 = time.perf_counter()
    dtype = DTYPES[dtype_key]
    result = {"op": name, "dtype": dtype_key, "status": "no_samples", "reason": "",
              "samples": [], "fallback_reasons": [], "graph_breaks": []}
    if name in SKIPS:
        result.update(status="skipped", reason=SKIPS[name])
        return result
    func = op.get_op()

    def fn(*args, **kwargs):
        return func(*args, **kwargs)

    lines = _LogLines()
    log = logging.getLogger("dvm.torch_backend")
    old_level = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(lines)
    from torch._dynamo.utils import counters

    counters.clear()
    torch._dynamo.reset()
    before = tb.stats()
    try:
        with torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=4096,
                                        fail_on_recompile_limit_hit=True):
            compiled = torch.compile(fn, backend="dvm", dynamic=True)
            for k, sample in enumerate(samples_of(op, dtype, n_samples)):
                result["samples"].append(_run_sample(fn, compiled, sample, k))
    finally:
        torch._dynamo.reset()
        log.removeHandler(lines)
        log.setLevel(old_level)
    result.update(_stats_delta(before))
    result["fallback_reasons"] = lines.reasons
    result["graph_breaks"] = _graph_breaks()
    result["status"], result["reason"] = _case_status(result)
    result["time_s"] = round(time.perf_counter() - t0, 3)
    return result


def _run_sample(fn, compiled, sample, k) -> dict:
    args, kwargs = [sample.input, *sample.args], dict(sample.kwargs)
    rec = {"index": k, "sample": sample.summary()[:300] if hasattr(sample, "summary") else ""}
    try:
        want = fn(*_clone(args), **_clone(kwargs))
    except Exception as e:  # noqa: BLE001  (the op refuses this sample eagerly: not compared)
        rec.update(outcome="eager_raises", detail=_one_line(e))
        return rec
    try:
        got = compiled(*_clone(args), **_clone(kwargs))
    except Exception as e:  # noqa: BLE001
        rec.update(outcome="exception", detail=_one_line(e),
                   without_dvm=_without_dvm(fn, args, kwargs, want))
        return rec
    try:
        compare(got, want, lambda: fn(*_upcast(_clone(args)), **_upcast(_clone(kwargs))))
    except _Mismatch as e:
        rec.update(outcome="wrong", detail=str(e)[:500],
                   without_dvm=_without_dvm(fn, args, kwargs, want))
        return rec
    rec["outcome"] = "ok"
    return rec


def _case_status(result) -> tuple[str, str]:
    samples = result["samples"]
    for outcome in ("wrong", "exception"):
        bad = [s for s in samples if s["outcome"] == outcome]
        if bad:
            s = bad[0]
            extra = ""
            if s.get("without_dvm", "matches") != "matches":
                extra = (" [without DVM (Dynamo + AOTAutograd + the backend's decompositions, "
                         f"eager ATen): {s['without_dvm']}]")
            return outcome, f"sample {s['index']}: {s['detail']}{extra}"
    if not any(s["outcome"] == "ok" for s in samples):
        return "no_samples", "eager raises on every sample" if samples else "no samples"
    if result["partitions_run"] > 0:
        return "dvm", ""
    # reasons that name a refusal first; views left alone because nothing else ran, after
    why = sorted(result["fallback_reasons"], key=lambda r: "no DVM compute around it" in r)
    breaks = "; ".join(result["graph_breaks"][:2])
    if not result["dynamo_graphs"]:
        why.insert(0, "Dynamo gave the backend no graph" + (
            f" (graph breaks: {breaks})" if breaks else ""))
    elif breaks:
        why.append(f"graph breaks: {breaks}")
    return "fallback", "; ".join(why[:4]) or "no reason logged"
