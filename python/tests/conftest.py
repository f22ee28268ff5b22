import math

import numpy as np
import pytest

import dvm

NP = {
    dvm.DType.F32: np.float32,
    dvm.DType.F16: np.float16,
    dvm.DType.I32: np.int32,
    dvm.DType.I64: np.int64,
    dvm.DType.BOOL: np.bool_,
}

_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x):
    return _erf(np.asarray(x, dtype=np.float64))


def tol(dtype):
    """(rtol, atol) of a result stored in `dtype` (f16 rounds to 11 bits)."""
    return {dvm.DType.F16: (2e-3, 2e-3), dvm.DType.BF16: (1e-2, 1e-2)}.get(dtype, (2e-5, 2e-6))


def random_array(rng, shape, dtype, low=-3.0, high=3.0):
    if dtype == dvm.DType.BOOL:
        return rng.random(shape) < 0.5
    if dtype in (dvm.DType.I32, dvm.DType.I64):
        return rng.integers(int(low) * 3, int(high) * 3 + 1, size=shape).astype(NP[dtype])
    return rng.uniform(low, high, size=shape).astype(NP[dtype])


def kernel(name, body, **compile_kwargs):
    """Builds with body(kb) and compiles."""
    kb = dvm.KernelBuilder(name)
    body(kb)
    return dvm.compile(kb.build(), **compile_kwargs)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ---------------------------------------------------------------------------------------------
# Did DVM run what it was meant to? Both PyTorch fronts fall back to PyTorch silently (the
# torch.compile backend runs a partition's ATen code when its DVM build or run fails, lazy mode
# runs an op eagerly when its handler refuses it), so a test comparing against eager would pass
# with DVM doing nothing. Around every test the counters of both are reset, and after it any
# fallback fails the test, unless it opts out:
#
#     @pytest.mark.allow_fallback("why this test expects PyTorch to run it")            # all
#     @pytest.mark.allow_fallback("sort has no DVM translation", kinds=("nodes",))     # some
#
# Kinds: "runtime" (a partition call failed in DVM and ran its ATen code), "partition" (a
# partition's DVM build failed: all of it runs in PyTorch), "nodes" (compute nodes left to
# PyTorch: no translation, unsupported dtype...), "backward" (a backward graph, always PyTorch),
# "lazy" (a lazy-mode handler refused an op: it ran eagerly), "lazy_unsupported" (an op with no
# lazy handler read a pending value: the trace was flushed for it and it ran in PyTorch),
# "no_dvm" (the test used the backend or lazy mode and nothing at all ran in DVM: no partition
# ran / no op was recorded).

FALLBACK_KINDS = ("runtime", "partition", "nodes", "backward", "lazy", "lazy_unsupported",
                  "no_dvm")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "allow_fallback(reason, kinds=...): the test expects work to run in PyTorch instead of "
        f"DVM; kinds (default: all) among {', '.join(FALLBACK_KINDS)} (see conftest.py)")


def _allowed(item):
    """The fallback kinds a test allows (its allow_fallback markers)."""
    allowed = set()
    for m in item.iter_markers("allow_fallback"):
        if not m.args or not isinstance(m.args[0], str) or not m.args[0].strip():
            raise pytest.UsageError(f"{item.nodeid}: allow_fallback needs a reason string")
        kinds = m.kwargs.get("kinds", FALLBACK_KINDS)
        kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        unknown = set(kinds) - set(FALLBACK_KINDS)
        if unknown:
            raise pytest.UsageError(f"{item.nodeid}: allow_fallback kinds {sorted(unknown)} "
                                    f"(known: {FALLBACK_KINDS})")
        allowed.update(kinds)
    return allowed


def pytest_collection_modifyitems(config, items):
    for item in items:  # a marker without a reason or with an unknown kind stops the run here
        _allowed(item)


class _FallbackWatch:
    """The counters of one test, across any reset_stats() the test itself makes, and the
    backend's fallback log lines (for the failure message)."""

    def __init__(self):
        self.backend = {}
        self.lazy_fallbacks = {}
        self.lazy_recorded = 0
        self.lazy_unsupported = 0
        self.lazy_modes = 0
        self.log = []

    def add_backend(self, tb):
        for k, v in tb.stats().items():
            self.backend[k] = self.backend.get(k, 0) + v

    def add_lazy(self, lazy):
        for k, v in lazy.handler_fallbacks().items():
            self.lazy_fallbacks[k] = self.lazy_fallbacks.get(k, 0) + v
        st = lazy.stats()
        self.lazy_recorded += st.ops_recorded
        self.lazy_unsupported += st.flushes_by_reason.get("unsupported", 0)

    def problems(self, allowed):
        b, out = self.backend, []

        def check(kind, n, what):
            if n and kind not in allowed:
                out.append(f"[{kind}] {what}")

        check("runtime", b.get("runtime_fallbacks", 0),
              f"{b.get('runtime_fallbacks')} DVM partition call(s) failed at run time and ran "
              "in PyTorch")
        check("partition", b.get("partition_fallbacks", 0),
              f"{b.get('partition_fallbacks')} DVM partition(s) failed to build and ran in "
              "PyTorch")
        check("nodes", b.get("fallback_nodes", 0),
              f"{b.get('fallback_nodes')} compute node(s) ran in PyTorch (the translator "
              "refused them; reasons in the log lines below)")
        check("backward", b.get("backward_graphs", 0),
              f"{b.get('backward_graphs')} backward graph(s) ran in PyTorch")
        used_backend = any(b.get(k, 0) for k in ("dynamo_graphs", "aot_graphs", "dvm_partitions",
                                                 "partition_fallbacks", "fallback_nodes"))
        check("no_dvm", used_backend and not b.get("partitions_run", 0),
              "the torch.compile backend was used but no DVM partition ran")
        n = sum(self.lazy_fallbacks.values())
        check("lazy", n, f"{n} lazy-mode op call(s) refused by their handler ran in PyTorch: "
              f"{self.lazy_fallbacks}")
        check("lazy_unsupported", self.lazy_unsupported,
              f"{self.lazy_unsupported} lazy trace flush(es) for an op with no lazy handler "
              "that read a pending value (it ran in PyTorch)")
        check("no_dvm", self.lazy_modes and not self.lazy_recorded,
              "lazy mode was used but DVM recorded no op")
        if out:
            shown = {k: v for k, v in b.items() if v}
            out.append(f"backend stats: {shown}")
            out += [f"  {line}" for line in self.log[:20]]
            out.append("(opt out with @pytest.mark.allow_fallback(reason, kinds=...) if the "
                       "fallback is the point of the test)")
        return out


@pytest.fixture(autouse=True)
def dvm_ran_what_it_was_meant_to(request):
    """Resets the torch.compile backend's and lazy mode's counters before the test, checks
    them after it (in pytest_runtest_call below, so a violation fails the test itself)."""
    import logging
    import sys

    from dvm import lazy

    watch = _FallbackWatch()
    mp = pytest.MonkeyPatch()
    lazy_reset = lazy.reset_stats

    def reset_lazy():
        watch.add_lazy(lazy)
        lazy_reset()

    mp.setattr(lazy, "reset_stats", reset_lazy)
    lazy_reset()
    enter = lazy.LazyMode.__enter__

    def counted_enter(self):
        watch.lazy_modes += 1
        return enter(self)

    mp.setattr(lazy.LazyMode, "__enter__", counted_enter)
    tb = None
    if "torch" in sys.modules:  # the backend only matters to tests that imported torch
        try:
            import dvm.torch_backend as tb
        except ImportError:
            tb = None
    handler = None
    if tb is not None:
        tb_reset = tb.reset_stats

        def reset_backend():
            watch.add_backend(tb)
            tb_reset()

        mp.setattr(tb, "reset_stats", reset_backend)
        tb_reset()

        class Lines(logging.Handler):
            def emit(self, record):
                watch.log.append(record.getMessage())

        handler = Lines(logging.DEBUG)
        backend_log = logging.getLogger("dvm.torch_backend")
        old_level = backend_log.level
        backend_log.setLevel(logging.DEBUG)
        backend_log.addHandler(handler)

    def collect():
        watch.add_lazy(lazy)
        if tb is not None:
            watch.add_backend(tb)
        return watch.problems(_allowed(request.node))

    request.node._dvm_fallback_check = collect
    try:
        yield watch
    finally:
        mp.undo()
        if handler is not None:
            backend_log.removeHandler(handler)
            backend_log.setLevel(old_level)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield  # re-raises when the test failed: nothing more to say then
    collect = getattr(item, "_dvm_fallback_check", None)
    if collect is not None:
        problems = collect()
        if problems:
            pytest.fail("DVM did not run what it was meant to:\n" + "\n".join(problems),
                        pytrace=False)
    return result
