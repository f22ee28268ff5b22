"""PyTorch's OpInfo samples through torch.compile(backend="dvm") against eager, as PyTorch tests
Inductor (test/inductor/test_torchinductor_opinfo.py): one test per (op, dtype) case.

What a case runs and how it is judged: opinfo_harness.py. A case must end as
python/tests/opinfo_expected.json says: in DVM (at least one partition ran, every sample
matched eager) unless listed there as a fallback (everything ran in PyTorch) or a failure
(wrong result or exception, with its reason). Any change fails: a new failure or fallback, and
also a listed one that now runs in DVM, so the lists stay tight; after an intended change,
rewrite them with `python3 scripts/opinfo_conformance.py --update-expected` and review the diff.

By default a quick subset runs (opinfo_harness.QUICK); DVM_OPINFO=full runs every case (about
3,000: the sweep script runs the same cases in worker processes and writes JSON).
"""

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal needs it

import opinfo_harness as h  # noqa: E402

# The conftest check that fails any fallback does not apply: the expected lists decide. The
# ops' own warnings (degrees of freedom <= 0, deprecated overloads) say nothing about DVM.
pytestmark = [
    pytest.mark.allow_fallback(
        "OpInfo conformance: opinfo_expected.json lists the cases that run in PyTorch"),
    pytest.mark.filterwarnings("ignore"),
]

FULL = os.environ.get("DVM_OPINFO", "") == "full"
OPS = h.op_by_name()
EXPECTED = h.load_expected()
CASES = [c for c in h.all_cases(OPS) if c[0] not in h.SKIPS] if FULL else list(h.QUICK)


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_opinfo(name, dtype):
    want, why = h.expected_status(EXPECTED, name, dtype)
    if want in ("crash", "timeout"):
        pytest.skip(f"listed as {want} (it would end or stall the test run): {why}")
    result = h.run_case(OPS[name], name, dtype)
    if result["status"] == "no_samples":
        pytest.skip(f"{name} {dtype}: {result['reason']}")
    problem = h.check_against_expected(result, EXPECTED)
    detail = "\n".join(f"  sample {s['index']}: {s['outcome']} {s.get('detail', '')} "
                       f"[{s['sample'][:200]}]" for s in result["samples"])
    counters = {k: result[k] for k in h._COUNTERS if result[k]}
    if problem is not None:
        pytest.fail(f"{problem}\n{detail}\n  backend counters: {counters}", pytrace=False)


def test_expected_lists_name_real_cases():
    """Every listed case exists, is not skipped, has a reason if it fails; the lists were made
    with the harness's sample count (else they are not comparable)."""
    assert EXPECTED["samples_per_case"] == h.SAMPLES_PER_CASE, (
        "opinfo_expected.json was made with another sample count: regenerate it with "
        "scripts/opinfo_conformance.py --update-expected")
    cases = set(h.all_cases(OPS))
    listed = [(n, d) for d, names in EXPECTED["fallback"].items() for n in names]
    for name, per_dtype in EXPECTED["failures"].items():
        for d, entry in per_dtype.items():
            listed.append((name, d))
            assert entry["status"] in h.FAILURES, (name, d, entry)
            assert entry["reason"].strip(), f"{name} {d}: a listed failure needs a reason"
            assert name not in EXPECTED["fallback"].get(d, ()), f"{name} {d} listed twice"
    for name, d in listed:
        assert (name, d) in cases, f"{name} {d}: no such OpInfo case on CPU"
        assert name not in h.SKIPS, f"{name}: skipped ({h.SKIPS[name]}) yet listed"


def test_quick_subset_is_real():
    """The quick cases exist, none is skipped, and they include cases the lists expect to run
    in DVM and to fall back (so both directions of the check run by default)."""
    cases = set(h.all_cases(OPS))
    for name, d in h.QUICK:
        assert (name, d) in cases, f"{name} {d}: no such OpInfo case on CPU"
        assert name not in h.SKIPS, name
    statuses = {h.expected_status(EXPECTED, n, d)[0] for n, d in h.QUICK}
    assert {"dvm", "fallback"} <= statuses, statuses


def test_compare_catches_a_wrong_result():
    """The comparison itself: a value off by more than the tolerance, a dtype or shape change,
    an integer off by one and a NaN where eager has a number all fail; NaN == NaN passes, and
    a float16 result closer to the float64 truth than eager's passes."""
    import torch

    x = torch.tensor([1.0, 2.0, float("nan")])
    h.compare(x.clone(), x)
    for bad in (x + torch.tensor([0.0, 1e-3, 0.0]), x.double(), x[:2],
                torch.tensor([1.0, 2.0, 3.0])):
        with pytest.raises(h._Mismatch):
            h.compare(bad, x)
    with pytest.raises(h._Mismatch):
        h.compare(torch.tensor([1, 2]), torch.tensor([1, 3]))
    with pytest.raises(h._Mismatch):
        h.compare((x, 1), (x, 2))
    truth = torch.tensor([1.0 / 3.0], dtype=torch.float64)
    eager = torch.tensor([0.3315], dtype=torch.float16)  # a few ulps off, as eager may round
    exact = truth.half()
    h.compare(exact, eager, lambda: truth)
    with pytest.raises(h._Mismatch):
        h.compare(torch.tensor([0.34], dtype=torch.float16), eager, lambda: truth)
