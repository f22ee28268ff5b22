"""Run-time side: one ``DvmPartition`` per DVM partition of a captured graph.

A partition is compiled once (symbolically) into a ``dvm.Executable``. Each call passes the
caller's tensors (activations, parameters, buffers) straight to the executable — DVM reads them
in place through their data pointers and strides, nothing is copied — and returns freshly
allocated outputs. Symbols that no tensor input binds (a size that reaches the partition only
as a SymInt argument, e.g. ``arange(s0)``) are bound through "carrier" inputs: stride-0 bool
views of shape ``[n]``, which cost no memory.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

import dvm

log = logging.getLogger("dvm.torch_backend")

_STATS_LOCK = threading.Lock()
STATS: dict[str, int] = {}


def bump(key: str, n: int = 1) -> None:
    with _STATS_LOCK:
        STATS[key] = STATS.get(key, 0) + n


def log_fallback(msg: str, *args) -> None:
    """What ran in PyTorch and why: at WARNING when DVM_LOG_FALLBACK=1, else at DEBUG."""
    if os.environ.get("DVM_LOG_FALLBACK", "") not in ("", "0"):
        log.warning(msg, *args)
    else:
        log.debug(msg, *args)


_CARRIER = torch.zeros(1, dtype=torch.bool)
_Parameter = torch.nn.Parameter
_constant = dvm.constant


try:  # the C++ call path for torch tensors (built when torch was installed at build time)
    from dvm._dvm_torch import call as _torch_call
    from dvm._dvm_torch import output_cache_stats as _output_cache_stats
    from dvm._dvm_torch import release_output_cache as _release_output_cache
except ImportError:  # pragma: no cover (an install built without torch)
    _torch_call = _output_cache_stats = _release_output_cache = None


def output_cache_stats() -> dict:
    """The blocks kept for compiled partitions' large outputs (1 MiB and up): ``hits`` and
    ``misses`` (allocations served by a kept block or by a new one), ``idle_bytes`` kept for
    reuse now, ``live_bytes`` in tensors now, ``budget_bytes`` (the most kept idle; env
    ``DVM_OUTPUT_CACHE_MB``, default 1024)."""
    if _output_cache_stats is None:  # pragma: no cover
        return {"hits": 0, "misses": 0, "idle_bytes": 0, "live_bytes": 0, "budget_bytes": 0}
    return _output_cache_stats()


def release_output_cache(budget_bytes: int = -1) -> None:
    """Frees every idle output block; ``budget_bytes >= 0`` sets a new budget (0: outputs
    come from torch's allocator from now on)."""
    if _release_output_cache is not None:
        _release_output_cache(int(budget_bytes))


class CarrierRangeError(ValueError):
    """A symbol value that no carrier can bind: a carrier binds its symbol as a dim (>= 0)."""


def carrier(n) -> torch.Tensor:
    n = int(n)
    if n < 0:
        # expand(-1) would keep the size 1, binding the symbol to 1 instead of -1 (a silently
        # wrong result: x + y * alpha with alpha = -1 as a dynamic int); expand(-5) raises
        raise CarrierRangeError(f"symbol value {n} is negative: a carrier input binds a symbol "
                                "as a dimension (>= 0)")
    return _CARRIER.expand(n)


_SCALARS: dict[float, torch.Tensor] = {}


def float_scalar(v) -> torch.Tensor:
    """A rank-0 f32 tensor holding the float v (a SymFloat argument), cached by value: models
    pass the same few constants on every call."""
    v = float(v)
    t = _SCALARS.get(v)
    if t is None:
        if len(_SCALARS) >= 1024:
            _SCALARS.clear()
        t = _SCALARS[v] = torch.tensor(v, dtype=torch.float32)
    return t


_FEED = {"arg": lambda a: a, "carrier": carrier, "float": float_scalar}


class DvmPartition(torch.nn.Module):
    """Calls one compiled DVM graph; falls back to the partition's ATen code on a run-time
    error (logged), so a DVM limitation never breaks the model."""

    def __init__(self, name, exe, in_plan, out_plan, out_dtypes, tuple_out, fallback, graph,
                 num_args, out_orders=None):
        super().__init__()
        self.name = name
        self.exe = exe
        self.graph = graph  # the dvm.Graph (to_string() for debugging)
        self.in_plan = in_plan  # ("arg", i) | ("carrier", i) | ("float", i)
        self.out_plan = out_plan  # ("dvm", k) | ("clone", i): per partition output
        self.out_dtypes = out_dtypes
        self.tuple_out = tuple_out
        self.fallback = fallback  # the ATen GraphModule of the partition
        self.num_args = num_args  # its arguments (symbol values may follow them)
        # calls, fallbacks: plain counters kept off nn.Module.__setattr__ (a microsecond a call)
        self._counts = [0, 0]
        self.ran = False  # ran in DVM at least once (stats()["partitions_run"])
        self.last_error = None
        # Outputs eager lays out permuted (a transposed view's product): DVM writes them in
        # that layout, so that code reading strides (as_strided after a graph break:
        # Longformer's chunking) sees eager's. None: all contiguous.
        self.out_orders = out_orders if out_orders and any(out_orders) else None
        # per output: (order, its inverse permutation) or None (contiguous)
        self._layouts = None if self.out_orders is None else [
            None if o is None else (o, tuple(sorted(range(len(o)), key=o.__getitem__)))
            for o in self.out_orders]
        self._simple = all(k == "arg" for k, _ in in_plan) and all(
            k == "dvm" for k, _ in out_plan
        ) and [i for _, i in out_plan] == list(range(len(out_plan))) and self.out_orders is None
        self._arg_idx = tuple(i for _, i in in_plan)
        # The inputs that are not tensors passed through (floats, carriers): (position, feed,
        # argument index); a call converts only these.
        self._converted = tuple((pos, _FEED[k], i) for pos, (k, i) in enumerate(in_plan)
                                if k != "arg")
        self.freeze_weights = False

    def _inputs(self, args):
        ins = [args[i] for i in self._arg_idx]
        for pos, feed, i in self._converted:
            ins[pos] = feed(args[i])
        # With freeze_weights, parameters (weights) are dvm.Constant: DVM packs a weight once as
        # a matmul operand instead of on every call; the version follows torch's version
        # counter, so an in-place update of the parameter (an optimizer step) repacks, but a
        # write through `.data` or a numpy alias is not seen (torch counts no version there),
        # hence opt-in. Made per call: a Constant kept on the tensor would outlive the extension
        # at interpreter exit.
        if not self.freeze_weights:
            return ins
        return [_constant(t) if isinstance(t, _Parameter) else t for t in ins]

    @property
    def exe(self):
        return self._exe

    @exe.setter
    def exe(self, exe):
        self._exe = exe
        self._exe_call = getattr(exe, "call", exe)  # one C++ call: bind, allocate, run
        # torch tensors read and outputs made in C++ (dvm._dvm_torch), when available
        self._torch_call = _torch_call if isinstance(exe, dvm.Executable) else None

    @property
    def calls(self):
        return self._counts[0]

    @property
    def fallbacks(self):
        return self._counts[1]

    def forward(self, *args):
        self._counts[0] += 1
        if self._simple and not self.freeze_weights:  # the common case, kept short
            outs = None
            try:
                if self._torch_call is not None:
                    try:
                        outs = self._torch_call(self._exe, args, self._arg_idx)
                    except NotImplementedError:  # an argument only the general path takes
                        pass
                if outs is None:
                    outs = self._exe_call(*[args[i] for i in self._arg_idx])
            except dvm.DvmError as e:
                return self._fall_back(args, e)
            self._mark_ran()
            return tuple(outs) if self.tuple_out else outs[0]
        try:
            ins = self._inputs(args)
        except CarrierRangeError as e:
            return self._fall_back(args, e)
        try:
            outs = None
            if self.out_orders is not None:
                outs = self._run_laid_out(ins)
            elif ins and self._torch_call is not None:
                # The C++ path also for converted arguments (a SymFloat's scalar, a carrier):
                # its outputs come from the output cache, where torch's allocator would map
                # (and fault in) a large output's pages on every call. A frozen weight (a
                # dvm.Constant) is no tensor: those calls take Executable.call.
                try:
                    outs = self._torch_call(self._exe, tuple(ins), tuple(range(len(ins))))
                except NotImplementedError:  # an argument only the general path takes
                    pass
            if outs is None and ins:
                outs = self._exe_call(*ins)
            elif outs is None:
                shapes = self.exe.output_shapes([])
                outs = [torch.empty(s, dtype=d) for s, d in zip(shapes, self.out_dtypes)]
                self.exe.run([], outs)
        except dvm.DvmError as e:
            return self._fall_back(args, e)
        self._mark_ran()
        if self._simple:
            res = outs
        else:
            res = [outs[i] if k == "dvm" else args[i].clone() for k, i in self.out_plan]
        if self.tuple_out:
            return tuple(res)
        return res[0]

    __call__ = forward

    def _run_laid_out(self, ins):
        """Runs into outputs allocated in eager's memory order (out_orders)."""
        shapes = self.exe.output_shapes(ins)
        outs = []
        for shape, dtype, layout in zip(shapes, self.out_dtypes, self._layouts):
            if layout is None:
                outs.append(torch.empty(shape, dtype=dtype))
                continue
            order, inverse = layout
            outs.append(torch.empty([shape[d] for d in order], dtype=dtype).permute(inverse))
        self.exe.run(list(ins), outs)
        return outs

    def _mark_ran(self):
        if not self.ran:
            self.ran = True
            bump("partitions_run")

    def _fall_back(self, args, e):
        self._counts[1] += 1
        self.last_error = str(e)
        bump("runtime_fallbacks")
        log_fallback("dvm: partition %s failed at run time, running it in PyTorch: %s",
                     self.name, e)
        return self.fallback(*args[: self.num_args])

    def extra_repr(self):
        return f"name={self.name}, inputs={len(self.in_plan)}, outputs={len(self.out_plan)}"
