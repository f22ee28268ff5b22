"""sympy shape expressions (fake tensors' SymInt sizes) -> dvm.SymExpr.

Dynamo's ShapeEnv describes every dynamic dim as a sympy expression over symbols s0, s1, ...
(Add, Mul, Integer, Symbol, FloorDiv, Mod/PythonMod, Min, Max, PowByNatural, ...). DVM's
SymExpr is a canonical sum of products with floor division, modulo, min and max; symbols carry
the ShapeEnv's value range (a backed dynamic dim is [2, inf): DVM clamps inf to 2**40).
"""

from __future__ import annotations

import sympy
import torch

import dvm

SYM_MAX = 1 << 40


class Unsupported(Exception):
    """A node (or expression) that DVM cannot translate; the message says why."""


def _int_or_none(v):
    try:
        if v is None:
            return None
        if v in (sympy.oo, -sympy.oo) or str(v) in ("int_oo", "-int_oo", "oo", "-oo"):
            return None
        return int(v)
    except (TypeError, ValueError):
        return None


class SymConverter:
    """Converts sympy expressions to SymExprs of one GraphBuilder (symbols made once)."""

    def __init__(self, gb, shape_env=None):
        self.gb = gb
        self.shape_env = shape_env
        self.symbols: dict[str, object] = {}  # name -> SymExpr
        self.ranges: dict[str, tuple[int, int]] = {}

    def simplify(self, expr):
        """Applies the ShapeEnv's replacements (s1 -> s0 after a guard s0 == s1)."""
        env = self.shape_env
        if env is not None and isinstance(expr, sympy.Expr) and expr.free_symbols:
            try:
                expr = env.replace(expr)
            except Exception:  # noqa: BLE001 - best effort, the raw expression is still valid
                pass
        return expr

    def symbol(self, sym):
        name = str(sym)
        if name in self.symbols:
            return self.symbols[name]
        lo, hi = 0, SYM_MAX
        env = self.shape_env
        if env is not None:
            vr = env.var_to_range.get(sym)
            if vr is not None:
                l, h = _int_or_none(vr.lower), _int_or_none(vr.upper)
                if l is not None:
                    lo = max(lo, l)
                if h is not None:
                    hi = min(hi, h)
        if lo > hi:
            raise Unsupported(f"symbol {name} has an empty range [{lo}, {hi}]")
        s = self.gb.symbol(name, lo=lo, hi=hi)
        self.symbols[name] = s
        self.ranges[name] = (lo, hi)
        return s

    def __call__(self, value):
        """int | torch.SymInt | sympy.Expr -> int | dvm.SymExpr."""
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, torch.SymInt):
            expr = value.node.expr
        else:
            expr = value
        expr = self.simplify(sympy.sympify(expr))
        out = self._convert(expr)
        if not isinstance(out, int) and out.is_constant():
            return out.constant_value()
        return out

    def shape(self, sizes):
        return [self(s) for s in sizes]

    def _convert(self, e):
        from torch.utils._sympy import functions as F

        if isinstance(e, (int,)):
            return e
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            return self.symbol(e)
        if isinstance(e, sympy.Add):
            acc = None
            for a in e.args:
                v = self._convert(a)
                acc = v if acc is None else acc + v
            return acc
        if isinstance(e, sympy.Mul):
            acc = None
            for a in e.args:
                if a.is_Rational and not a.is_Integer:
                    raise Unsupported(f"rational factor in {e}")
                v = self._convert(a)
                acc = v if acc is None else acc * v
            return acc
        if isinstance(e, (sympy.Pow, F.PowByNatural)):
            base, exp = e.args
            if not exp.is_Integer or int(exp) < 0 or int(exp) > 16:
                raise Unsupported(f"power {e}")
            b = self._convert(base)
            acc = 1
            for _ in range(int(exp)):
                acc = b * acc if not isinstance(acc, int) or acc != 1 else b
            return acc
        if isinstance(e, F.FloorDiv):
            a, b = (self._convert(x) for x in e.args)
            return self._floordiv(a, b)
        if isinstance(e, F.ModularIndexing):  # (x // d) % m
            x, d, m = (self._convert(a) for a in e.args)
            return self._mod(self._floordiv(x, d), m)
        if isinstance(e, (F.Mod, F.PythonMod, sympy.Mod)):
            a, b = (self._convert(x) for x in e.args)
            return self._mod(a, b)
        if isinstance(e, (F.Min, sympy.Min)):
            return self._fold(e.args, dvm.sym_min)
        if isinstance(e, (F.Max, sympy.Max)):
            return self._fold(e.args, dvm.sym_max)
        if isinstance(e, F.CeilDiv):
            a, b = (self._convert(x) for x in e.args)
            return self._floordiv(a + self._sub1(b), b)
        raise Unsupported(f"shape expression {e} ({type(e).__name__}) has no DVM form")

    @staticmethod
    def _sub1(b):
        return b - 1

    @staticmethod
    def _floordiv(a, b):
        if isinstance(a, int) and isinstance(b, int):
            return a // b
        if isinstance(a, int):
            a = dvm.SymExpr(a)
        return a // b

    @staticmethod
    def _mod(a, b):
        if isinstance(a, int) and isinstance(b, int):
            return a % b
        if isinstance(a, int):
            a = dvm.SymExpr(a)
        return a % b

    def _fold(self, args, fn):
        vals = [self._convert(a) for a in args]
        acc = vals[0]
        for v in vals[1:]:
            if isinstance(acc, int) and isinstance(v, int):
                acc = min(acc, v) if fn is dvm.sym_min else max(acc, v)
            else:
                acc = fn(dvm.SymExpr(acc) if isinstance(acc, int) else acc,
                         dvm.SymExpr(v) if isinstance(v, int) else v)
        return acc


def sym_key(v):
    """A hashable key of an int | SymExpr (for equality tests)."""
    return ("i", v) if isinstance(v, int) else ("s", str(v))


def same_dim(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, int):
        return (not isinstance(b, int)) and b.is_constant() and b.constant_value() == a
    if isinstance(b, int):
        return a.is_constant() and a.constant_value() == b
    return a == b
