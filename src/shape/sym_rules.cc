#include "shape/sym_rules.h"

#include <algorithm>
#include <array>
#include <numeric>

#include "shape/sym_range.h"

namespace dvm::shape {
namespace {

using Opt = std::optional<SymExpr>;

std::optional<int64_t> const_of(const SymExpr& e) {
  if (!e.is_constant()) return std::nullopt;
  return e.constant_value();
}

bool is_const(const SymExpr& e, int64_t v) {
  return e.is_constant() && e.constant_value() == v;
}

// The divisor as a constant > 1 (the rules that need it run after the ones for 1 and < 0).
std::optional<int64_t> divisor_above_one(const SymExpr& b) {
  const auto d = const_of(b);
  if (!d || *d <= 1) return std::nullopt;
  return d;
}

uint64_t uabs(int64_t v) {
  return v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
}

std::vector<SymExpr> copy_factors(std::span<const SymExpr> f) {
  return {f.begin(), f.end()};
}

bool expr_less(const SymExpr& x, const SymExpr& y) {
  return compare(x, y) < 0;
}

// ---- floordiv and mod ---------------------------------------------------------------------

Opt div_fold(const SymExpr& a, const SymExpr& b) {
  const auto x = const_of(a), y = const_of(b);
  if (!x || !y || *y == 0 || (*x == INT64_MIN && *y == -1)) return std::nullopt;
  return SymExpr(floor_div(*x, *y));
}

Opt mod_fold(const SymExpr& a, const SymExpr& b) {
  const auto x = const_of(a), y = const_of(b);
  if (!x || !y || *y == 0) return std::nullopt;
  return SymExpr(floor_mod(*x, *y));
}

Opt div_by_one(const SymExpr& a, const SymExpr& b) {
  if (!is_const(b, 1)) return std::nullopt;
  return a;
}

Opt mod_by_unit(const SymExpr&, const SymExpr& b) {
  if (!is_const(b, 1) && !is_const(b, -1)) return std::nullopt;
  return SymExpr(0);
}

Opt div_negative_divisor(const SymExpr& a, const SymExpr& b) {
  const auto d = const_of(b);
  if (!d || *d >= 0 || *d == INT64_MIN) return std::nullopt;
  return floordiv(scale(a, -1), SymExpr(-*d));
}

Opt mod_negative_divisor(const SymExpr& a, const SymExpr& b) {
  const auto d = const_of(b);
  if (!d || *d >= 0 || *d == INT64_MIN) return std::nullopt;
  return scale(mod(scale(a, -1), SymExpr(-*d)), -1);
}

Opt zero_numerator(const SymExpr& a, const SymExpr&) {
  if (!is_const(a, 0)) return std::nullopt;
  return SymExpr(0);
}

Opt div_self(const SymExpr& a, const SymExpr& b) {
  if (a.is_constant() || a != b) return std::nullopt;
  return SymExpr(1);
}

Opt mod_self(const SymExpr& a, const SymExpr& b) {
  if (a.is_constant() || a != b) return std::nullopt;
  return SymExpr(0);
}

Opt div_nested(const SymExpr& a, const SymExpr& b) {
  const auto d = divisor_above_one(b);
  if (!d || a.node().kind != SymKind::kFloorDiv) return std::nullopt;
  const auto c = const_of(a.node().args[1]);
  int64_t cd = 0;
  if (!c || *c <= 0 || __builtin_mul_overflow(*c, *d, &cd)) return std::nullopt;
  return floordiv(a.node().args[0], SymExpr(cd));
}

// Splits every coefficient and the constant of `a` as c = d*(c//d) + c%d into Q and R.
// Returns false when R would be `a` itself (nothing to split off). A term whose split would
// write a monomial larger than `max_copied` nodes twice (in Q and in R) stays whole in R: the
// identity holds for any split of a into d*Q + R, and the canonical one is not worth an
// expression that doubles with each division.
bool split_by_constant(const SymExpr& a, int64_t d, uint64_t max_copied, SymExpr* q, SymExpr* r) {
  const PolyView v(a);
  if (v.size() == 0) return false;
  const auto splits = [&](size_t i) {
    const int64_t c = v.coeff(i);
    if (c >= 0 && c < d) return false;
    return floor_mod(c, d) == 0 || monomial_size(v.factors(i)) <= max_copied;
  };
  bool any = v.constant() < 0 || v.constant() >= d;
  for (size_t i = 0; i < v.size() && !any; ++i) any = splits(i);
  if (!any) return false;
  std::vector<SymTerm> qt, rt;
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t c = v.coeff(i);
    if (!splits(i)) {
      rt.push_back({c, copy_factors(v.factors(i))});
      continue;
    }
    if (floor_div(c, d) != 0) qt.push_back({floor_div(c, d), copy_factors(v.factors(i))});
    if (floor_mod(c, d) != 0) rt.push_back({floor_mod(c, d), copy_factors(v.factors(i))});
  }
  *q = make_poly_sorted(floor_div(v.constant(), d), std::move(qt));
  *r = make_poly_sorted(floor_mod(v.constant(), d), std::move(rt));
  return true;
}

Opt div_split_constant(const SymExpr& a, const SymExpr& b) {
  const auto d = divisor_above_one(b);
  SymExpr q, r;
  if (!d || !split_by_constant(a, *d, kMaxDuplicatedSize, &q, &r)) return std::nullopt;
  return q + floordiv(r, b);
}

Opt mod_split_constant(const SymExpr& a, const SymExpr& b) {
  const auto d = divisor_above_one(b);
  SymExpr q, r;
  // Q is dropped, so no term is written twice.
  if (!d || !split_by_constant(a, *d, UINT64_MAX, &q, &r)) return std::nullopt;
  return mod(r, b);
}

// g = gcd(d, every coefficient of a) > 1; a = g*A + r with 0 <= r < g (A takes the
// constant's quotient). False when g == 1.
bool common_factor(const SymExpr& a, int64_t d, int64_t* g_out, SymExpr* big_a, int64_t* r) {
  const PolyView v(a);
  if (v.size() == 0) return false;
  uint64_t g = static_cast<uint64_t>(d);
  for (size_t i = 0; i < v.size() && g > 1; ++i) g = std::gcd(g, uabs(v.coeff(i)));
  if (g <= 1) return false;
  const auto gi = static_cast<int64_t>(g);
  std::vector<SymTerm> terms;
  terms.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    terms.push_back({v.coeff(i) / gi, copy_factors(v.factors(i))});
  }
  *g_out = gi;
  *big_a = make_poly_sorted(floor_div(v.constant(), gi), std::move(terms));
  *r = floor_mod(v.constant(), gi);
  return true;
}

Opt div_common_factor(const SymExpr& a, const SymExpr& b) {
  const auto d = divisor_above_one(b);
  int64_t g = 0, r = 0;
  SymExpr big_a;
  if (!d || !common_factor(a, *d, &g, &big_a, &r)) return std::nullopt;
  return floordiv(big_a, SymExpr(*d / g));
}

Opt mod_common_factor(const SymExpr& a, const SymExpr& b) {
  const auto d = divisor_above_one(b);
  int64_t g = 0, r = 0;
  SymExpr big_a;
  if (!d || !common_factor(a, *d, &g, &big_a, &r)) return std::nullopt;
  return scale(mod(big_a, SymExpr(*d / g)), g) + SymExpr(r);
}

Opt mod_of_mod(const SymExpr& a, const SymExpr& b) {
  const auto d = divisor_above_one(b);
  if (!d) return std::nullopt;
  const PolyView v(a);
  for (size_t i = 0; i < v.size(); ++i) {
    const auto f = v.factors(i);
    if (f.size() != 1 || f[0].node().kind != SymKind::kMod) continue;
    const auto e = const_of(f[0].node().args[1]);
    int64_t ce = 0;
    if (!e || __builtin_mul_overflow(v.coeff(i), *e, &ce) || ce % *d != 0) continue;
    std::vector<SymTerm> rest;
    for (size_t j = 0; j < v.size(); ++j) {
      if (j != i) rest.push_back({v.coeff(j), copy_factors(v.factors(j))});
    }
    const SymExpr x = f[0].node().args[0];
    return mod(make_poly_sorted(v.constant(), std::move(rest)) + scale(x, v.coeff(i)), b);
  }
  return std::nullopt;
}

// Splits a = m*Q + R for a divisor m = c*monomial (no constant term): Q gathers the terms of
// a whose coefficient c divides and whose monomial contains m's. False when Q is empty.
bool split_by_monomial(const SymExpr& a, const SymExpr& b, SymExpr* q, SymExpr* r) {
  if (b.is_constant()) return false;
  const PolyView vb(b);
  if (vb.constant() != 0 || vb.size() != 1) return false;
  const int64_t c = vb.coeff(0);
  const auto m = vb.factors(0);
  const PolyView va(a);
  std::vector<SymTerm> qt, rt;
  int64_t q0 = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    const int64_t ci = va.coeff(i);
    const auto f = va.factors(i);
    const bool divides = !(ci == INT64_MIN && c == -1) && ci % c == 0 &&
                         std::includes(f.begin(), f.end(), m.begin(), m.end(), expr_less);
    if (!divides) {
      rt.push_back({ci, copy_factors(f)});
      continue;
    }
    std::vector<SymExpr> rest;
    std::set_difference(f.begin(), f.end(), m.begin(), m.end(), std::back_inserter(rest),
                        expr_less);
    if (rest.empty()) {
      q0 = ci / c;  // only one term of a has exactly m's monomial
    } else {
      qt.push_back({ci / c, std::move(rest)});
    }
  }
  if (qt.empty() && q0 == 0) return false;
  auto qe = make_poly(q0, std::move(qt));
  DVM_CHECK(qe.has_value());  // distinct monomials of a stay distinct after dividing by m
  *q = *qe;
  *r = make_poly_sorted(va.constant(), std::move(rt));
  return true;
}

Opt div_split_monomial(const SymExpr& a, const SymExpr& b) {
  SymExpr q, r;
  if (!split_by_monomial(a, b, &q, &r)) return std::nullopt;
  return q + floordiv(r, b);
}

Opt mod_split_monomial(const SymExpr& a, const SymExpr& b) {
  SymExpr q, r;
  if (!split_by_monomial(a, b, &q, &r)) return std::nullopt;
  return mod(r, b);
}

Opt div_range_point(const SymExpr& a, const SymExpr& b) {
  const SymRange r = range_floordiv(a.range(), b.range());
  if (!range_is_point(r)) return std::nullopt;
  return SymExpr(r.lo);
}

Opt mod_range_point(const SymExpr& a, const SymExpr& b) {
  const SymRange r = range_floordiv(a.range(), b.range());
  if (!range_is_point(r)) return std::nullopt;
  return a - scale(b, r.lo);
}

// ---- polynomials ----------------------------------------------------------------------------

// True when `g` is the monomial `m` times the atom floordiv(args[0], args[1]) (multisets of
// sorted factors).
bool is_monomial_times_div(std::span<const SymExpr> g, std::span<const SymExpr> m,
                           const std::vector<SymExpr>& args) {
  if (g.size() != m.size() + 1) return false;
  size_t k = 0;
  bool skipped = false;
  for (const SymExpr& f : g) {
    if (!skipped && f.node().kind == SymKind::kFloorDiv && f.node().args == args) {
      skipped = true;
    } else if (k == m.size() || f != m[k++]) {
      return false;
    }
  }
  return skipped;
}

// The term k*(x % y), alone in its monomial, whose partner k*y*(x//y) is also in `v`, where
// y is a constant or c*monomial: the index pair.
std::optional<std::pair<size_t, size_t>> find_div_mod_pair(const PolyView& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    const auto f = v.factors(i);
    if (f.size() != 1 || f[0].node().kind != SymKind::kMod) continue;
    const SymExpr& y = f[0].node().args[1];
    const PolyView vy(y);
    if (vy.size() > 1 || (vy.size() == 1 && vy.constant() != 0)) continue;
    const int64_t c = vy.size() == 0 ? vy.constant() : vy.coeff(0);
    const auto m = vy.size() == 0 ? std::span<const SymExpr>() : vy.factors(0);
    int64_t kc = 0;
    if (__builtin_mul_overflow(v.coeff(i), c, &kc)) continue;
    for (size_t j = 0; j < v.size(); ++j) {
      if (v.coeff(j) == kc && is_monomial_times_div(v.factors(j), m, f[0].node().args)) {
        return std::pair{i, j};
      }
    }
  }
  return std::nullopt;
}

Opt poly_div_mod_recombine(const SymExpr& p, const SymExpr&) {
  if (p.node().kind != SymKind::kPoly) return std::nullopt;
  const PolyView v(p);
  const auto pair = find_div_mod_pair(v);
  if (!pair) return std::nullopt;
  std::vector<SymTerm> rest;
  for (size_t j = 0; j < v.size(); ++j) {
    if (j != pair->first && j != pair->second) {
      rest.push_back({v.coeff(j), copy_factors(v.factors(j))});
    }
  }
  const SymExpr x = v.factors(pair->first)[0].node().args[0];
  return make_poly_sorted(v.constant(), std::move(rest)) + scale(x, v.coeff(pair->first));
}

// ---- min and max (pairwise: the result replaces both arguments) -----------------------------

Opt min_fold(const SymExpr& x, const SymExpr& y) {
  if (!x.is_constant() || !y.is_constant()) return std::nullopt;
  return SymExpr(std::min(x.constant_value(), y.constant_value()));
}

Opt max_fold(const SymExpr& x, const SymExpr& y) {
  if (!x.is_constant() || !y.is_constant()) return std::nullopt;
  return SymExpr(std::max(x.constant_value(), y.constant_value()));
}

Opt same(const SymExpr& x, const SymExpr& y) {
  if (x != y) return std::nullopt;
  return x;
}

Opt min_by_range(const SymExpr& x, const SymExpr& y) {
  if (range_le(x.range(), y.range())) return x;
  if (range_le(y.range(), x.range())) return y;
  return std::nullopt;
}

Opt max_by_range(const SymExpr& x, const SymExpr& y) {
  if (range_le(x.range(), y.range())) return y;
  if (range_le(y.range(), x.range())) return x;
  return std::nullopt;
}

// The sign of y - x over its range, when it has one: 1 for y >= x, -1 for y <= x.
int difference_sign(const SymExpr& x, const SymExpr& y) {
  if (x.is_constant() && y.is_constant()) return 0;
  const SymRange d = (y - x).range();
  if (d.lo >= 0 && d.lo != kNegInf) return 1;
  if (d.hi <= 0 && d.hi != kPosInf) return -1;
  return 0;
}

Opt min_by_difference(const SymExpr& x, const SymExpr& y) {
  const int s = difference_sign(x, y);
  if (s == 0) return std::nullopt;
  return s > 0 ? x : y;
}

Opt max_by_difference(const SymExpr& x, const SymExpr& y) {
  const int s = difference_sign(x, y);
  if (s == 0) return std::nullopt;
  return s > 0 ? y : x;
}

// x and (x + r)//c with c >= 2 and 0 <= r < c: the quotient is the smaller one when x >= 1
// (x + r <= x + c - 1 <= c*x), or x >= 0 and r == 0. Returns true when `q` is such a quotient
// of `x` (so min(x, q) = q and max(x, q) = x).
bool shrinking_quotient(const SymExpr& x, const SymExpr& q) {
  const SymNode& n = q.node();
  if (n.kind != SymKind::kFloorDiv || !n.args[1].is_constant()) return false;
  const int64_t c = n.args[1].constant_value();
  const SymExpr r = n.args[0] - x;
  if (c < 2 || !r.is_constant()) return false;
  const int64_t rv = r.constant_value();
  if (rv < 0 || rv >= c) return false;
  return x.range().lo >= (rv == 0 ? 0 : 1);
}

// min / max of x and y where kBelow(a, b) proves b <= a.
template <bool (*kBelow)(const SymExpr&, const SymExpr&)>
Opt min_when_below(const SymExpr& x, const SymExpr& y) {
  if (kBelow(x, y)) return y;
  if (kBelow(y, x)) return x;
  return std::nullopt;
}

template <bool (*kBelow)(const SymExpr&, const SymExpr&)>
Opt max_when_below(const SymExpr& x, const SymExpr& y) {
  if (kBelow(x, y)) return x;
  if (kBelow(y, x)) return y;
  return std::nullopt;
}

// Is `y` = d*(x//d) for a constant d >= 1 (x rounded down to a multiple of d: the extent
// of whole windows a strided op covers)? Then y <= x wherever defined, so min(x, y) = y and
// max(x, y) = x.
bool rounded_down(const SymExpr& x, const SymExpr& y) {
  const SymNode& n = y.node();
  if (n.kind != SymKind::kPoly || n.value != 0 || n.terms.size() != 1 ||
      n.terms[0].factors.size() != 1) {
    return false;
  }
  const SymNode& q = n.terms[0].factors[0].node();
  if (q.kind != SymKind::kFloorDiv || !q.args[1].is_constant()) return false;
  const int64_t d = q.args[1].constant_value();
  return d >= 1 && n.terms[0].coeff == d && q.args[0] == x;
}

// min(x, max(x, y)) = x and max(x, min(x, y)) = x (absorption), in either argument order:
// clamps of clamps (a slice of a slice whose bounds PyTorch's guards fix) fold back to the
// clamped extent, so that re-simplifying an expression gives the same expression.
template <SymKind kInner>
Opt absorb(const SymExpr& a, const SymExpr& b) {
  const auto has_arg = [](const SymExpr& x, const SymExpr& y) {
    const SymNode& n = y.node();
    return n.kind == kInner && n.args.size() == 2 && (n.args[0] == x || n.args[1] == x);
  };
  if (has_arg(a, b)) return a;
  if (has_arg(b, a)) return b;
  return std::nullopt;
}

using K = SymKind;

// In `algebra`, // and % are Python's (floor; sign of the divisor), c, d, e, g, k are
// integer constants, x, y, A, Q, R expressions, and "where defined" means the identity holds
// wherever the left side has no division by zero.
constexpr SymRule kRules[] = {
    // floordiv
    {K::kFloorDiv, "div_fold", "c//d = floor(c/d) for d != 0 (not INT64_MIN//-1)", div_fold},
    {K::kFloorDiv, "div_by_one", "x//1 = x", div_by_one},
    {K::kFloorDiv, "div_negative_divisor",
     "x//d = (-x)//(-d) for d < 0: floor(x/d) = floor((-x)/(-d))", div_negative_divisor},
    {K::kFloorDiv, "div_zero_numerator", "0//y = 0 where defined", zero_numerator},
    {K::kFloorDiv, "div_self", "x//x = 1 where defined", div_self},
    {K::kFloorDiv, "div_nested",
     "(x//c)//d = x//(c*d) for c, d > 0: floor(floor(x/c)/d) = floor(x/(c*d))", div_nested},
    {K::kFloorDiv, "div_split_constant",
     "(d*Q + R)//d = Q + R//d for d > 0, every coefficient and the constant c of the "
     "numerator split as c = d*(c//d) + c%d, so R's lie in [0, d) (a term whose monomial is "
     "larger than kMaxDuplicatedSize nodes is not split: it stays whole in R): d*Q is a "
     "multiple of d",
     div_split_constant},
    {K::kFloorDiv, "div_common_factor",
     "(g*A + r)//(g*e) = A//e for g = gcd(d, coefficients) > 1, d = g*e, 0 <= r < g: with "
     "A = e*q + t, 0 <= t < e, g*A + r = g*e*q + (g*t + r) and 0 <= g*t + r < g*e",
     div_common_factor},
    {K::kFloorDiv, "div_split_monomial",
     "(m*Q + R)//m = Q + R//m for m = c*monomial, where defined: floor(Q + R/m) = Q + "
     "floor(R/m); e.g. (x*y + z)//y = x + z//y, (x*y)//y = x",
     div_split_monomial},
    {K::kFloorDiv, "div_range_point",
     "x//y = k when floor(x/y) = k for all x, y in their ranges (y != 0), e.g. x//c = 0 for "
     "0 <= x < c",
     div_range_point},
    // mod
    {K::kMod, "mod_fold", "c%d = c - d*floor(c/d) for d != 0", mod_fold},
    {K::kMod, "mod_by_unit", "x%1 = x%(-1) = 0", mod_by_unit},
    {K::kMod, "mod_negative_divisor",
     "x%d = -((-x)%(-d)) for d < 0: x - d*floor(x/d) = -((-x) - (-d)*floor((-x)/(-d)))",
     mod_negative_divisor},
    {K::kMod, "mod_zero_numerator", "0%y = 0 where defined", zero_numerator},
    {K::kMod, "mod_self", "x%x = 0 where defined", mod_self},
    {K::kMod, "mod_split_constant",
     "(d*Q + R)%d = R%d for d > 0, coefficients and constant split as in div_split_constant "
     "(so (c*x)%c = 0)",
     mod_split_constant},
    {K::kMod, "mod_common_factor",
     "(g*A + r)%(g*e) = g*(A%e) + r for g = gcd(d, coefficients) > 1, d = g*e, 0 <= r < g "
     "(see div_common_factor)",
     mod_common_factor},
    {K::kMod, "mod_of_mod",
     "(k*(x%e) + R)%d = (k*x + R)%d for d > 0 dividing k*e: k*(x%e) = k*x - k*e*(x//e); so "
     "(x%c)%c = x%c",
     mod_of_mod},
    {K::kMod, "mod_split_monomial",
     "(m*Q + R)%m = R%m for m = c*monomial, where defined; e.g. (x*y + z)%y = z%y",
     mod_split_monomial},
    {K::kMod, "mod_range_point",
     "x%y = x - k*y when floor(x/y) = k for all x, y in their ranges (y != 0), e.g. x%c = x "
     "for 0 <= x < c",
     mod_range_point},
    // polynomials
    {K::kPoly, "poly_div_mod_recombine",
     "k*y*(x//y) + k*(x%y) + R = k*x + R where defined, y a constant or c*monomial: "
     "x = y*(x//y) + x%y",
     poly_div_mod_recombine},
    // min
    {K::kMin, "min_fold", "min(c, d) = the smaller constant", min_fold},
    {K::kMin, "min_same", "min(x, x) = x", same},
    {K::kMin, "min_by_range", "min(x, y) = x when x.hi <= y.lo (ranges)", min_by_range},
    {K::kMin, "min_by_difference",
     "min(x, y) = x when the range of the canonical y - x is >= 0, e.g. min(x, x + 1) = x",
     min_by_difference},
    {K::kMin, "min_shrinking_quotient",
     "min(x, (x + r)//c) = (x + r)//c for c >= 2, 0 <= r < c, x >= 1 (x >= 0 when r = 0): "
     "x + r <= x + c - 1 <= c*x, e.g. the halves of torch.chunk: min(s, (s + 1)//2)",
     min_when_below<shrinking_quotient>},
    {K::kMin, "min_rounded_down",
     "min(x, d*(x//d)) = d*(x//d) for d >= 1: floor(x/d)*d <= x, e.g. the input a convolution "
     "with stride = kernel d covers",
     min_when_below<rounded_down>},
    {K::kMin, "min_absorbs_max", "min(x, max(x, y)) = x: max(x, y) >= x", absorb<SymKind::kMax>},
    // max
    {K::kMax, "max_fold", "max(c, d) = the larger constant", max_fold},
    {K::kMax, "max_same", "max(x, x) = x", same},
    {K::kMax, "max_by_range", "max(x, y) = y when x.hi <= y.lo (ranges)", max_by_range},
    {K::kMax, "max_by_difference",
     "max(x, y) = y when the range of the canonical y - x is >= 0, e.g. max(x, x + 1) = x + 1",
     max_by_difference},
    {K::kMax, "max_shrinking_quotient",
     "max(x, (x + r)//c) = x for c >= 2, 0 <= r < c, x >= 1 (x >= 0 when r = 0), see "
     "min_shrinking_quotient",
     max_when_below<shrinking_quotient>},
    {K::kMax, "max_rounded_down", "max(x, d*(x//d)) = x for d >= 1, see min_rounded_down",
     max_when_below<rounded_down>},
    {K::kMax, "max_absorbs_min", "max(x, min(x, y)) = x: min(x, y) <= x", absorb<SymKind::kMin>},
};

constexpr size_t kNumRules = std::size(kRules);
std::array<std::atomic<uint64_t>, kNumRules> g_hits{};

Opt try_rule(size_t i, const SymExpr& a, const SymExpr& b) {
  Opt r = kRules[i].apply(a, b);
  if (r) g_hits[i].fetch_add(1, std::memory_order_relaxed);
  return r;
}

// One pass of the pairwise rules over `args`: true when a pair was replaced.
bool reduce_one_pair(SymKind op, std::vector<SymExpr>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    for (size_t j = i + 1; j < args.size(); ++j) {
      for (size_t k = 0; k < kNumRules; ++k) {
        if (kRules[k].op != op) continue;
        if (Opt r = try_rule(k, args[i], args[j])) {
          args[i] = std::move(*r);
          args.erase(args.begin() + static_cast<std::ptrdiff_t>(j));
          std::sort(args.begin(), args.end(), expr_less);
          return true;
        }
      }
    }
  }
  return false;
}

}  // namespace

std::span<const SymRule> sym_rules() {
  return kRules;
}

uint64_t sym_rule_hits(size_t index) {
  return g_hits[index].load(std::memory_order_relaxed);
}

std::optional<SymExpr> apply_sym_rules(SymKind op, const SymExpr& a, const SymExpr& b) {
  for (size_t k = 0; k < kNumRules; ++k) {
    if (kRules[k].op != op) continue;
    if (Opt r = try_rule(k, a, b)) return r;
  }
  return std::nullopt;
}

SymExpr simplify_min_max(SymKind op, const SymExpr& a, const SymExpr& b) {
  std::vector<SymExpr> args;
  for (const SymExpr* e : {&a, &b}) {
    if (e->node().kind == op) {
      args.insert(args.end(), e->node().args.begin(), e->node().args.end());
    } else {
      args.push_back(*e);
    }
  }
  std::sort(args.begin(), args.end(), expr_less);
  while (args.size() > 1 && reduce_one_pair(op, args)) {
  }
  if (args.size() == 1) return args[0];
  return make_atom(op, std::move(args));
}

}  // namespace dvm::shape
