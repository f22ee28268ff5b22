"""The conftest fixture that fails a test in which DVM did not run what it was meant to: run on
planted fallbacks in an inner pytest session (a copy of conftest.py next to small tests), it
must fail them, and pass them once they opt out with allow_fallback."""

import pathlib

import pytest

pytest.importorskip("torch")

pytest_plugins = ["pytester"]

INNER = '''
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import dvm
import dvm.torch_backend as tb
from dvm.torch_backend.partition import partition_and_compile
from dvm.torch_backend.runtime import DvmPartition


def lazy_refused_add():
    x, y = torch.ones(3, dtype=torch.int16), torch.ones(3)
    with torch.no_grad(), dvm.lazy():
        x + x  # int16 is no DVM dtype: the add handler refuses it
        return y * 2.0  # recorded


def test_lazy_handler_fallback():
    lazy_refused_add()


@pytest.mark.allow_fallback("planted", kinds=("lazy",))
def test_lazy_handler_fallback_allowed():
    lazy_refused_add()


def test_lazy_nothing_recorded():
    with torch.no_grad(), dvm.lazy():
        torch.cumprod(torch.ones(4), 0)  # no lazy handler: nothing for DVM


def compiled_partition(plant):
    fn = lambda a: a * 2 + 1
    x = torch.randn(3, 5)
    gm = make_fx(fn, decomposition_table=tb.decompositions(), tracing_mode="symbolic")(x)
    gm = partition_and_compile(gm, [x], "t")
    if plant:
        class Raising:
            def __call__(self, *a):
                raise dvm.DvmError("planted")

        for m in gm.modules():
            if isinstance(m, DvmPartition):
                m.exe = Raising()
    torch.testing.assert_close(gm(x), fn(x))  # right either way: ATen fallback


def test_backend_runtime_fallback():
    compiled_partition(plant=True)


def test_backend_runs_in_dvm():
    compiled_partition(plant=False)
'''

EXPECT = {
    "test_lazy_handler_fallback": ("FAILED", "[lazy] 1 lazy-mode op call(s)"),
    "test_lazy_handler_fallback_allowed": ("PASSED", None),
    "test_lazy_nothing_recorded": ("FAILED", "[no_dvm] lazy mode was used but DVM recorded no op"),
    "test_backend_runtime_fallback": ("FAILED", "[runtime] 1 DVM partition call(s) failed"),
    "test_backend_runs_in_dvm": ("PASSED", None),
}


# The inner session's fallbacks reach this test's counters too (the fixtures nest).
@pytest.mark.allow_fallback("runs planted fallbacks in an inner pytest session")
def test_fixture_fails_planted_fallbacks(pytester):
    pytester.makeconftest((pathlib.Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_inner=INNER)
    r = pytester.runpytest("-q", "-rA", "-p", "no:cacheprovider")
    out = "\n".join(r.outlines)
    for name, (outcome, message) in EXPECT.items():
        assert f"{outcome} test_inner.py::{name}" in out, out
        if message:
            assert message in out, out
    r.assert_outcomes(failed=3, passed=2)
