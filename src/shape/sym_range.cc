#include "shape/sym_range.h"

#include <algorithm>

namespace dvm::shape {
namespace {

// Bounds are computed in 128 bits where +-kWideInf stand for the infinite ends; finite values
// always come from int64, so a product of two finite bounds fits.
using Wide = __int128;
constexpr Wide kWideInf = static_cast<Wide>((static_cast<unsigned __int128>(1) << 127) - 1);

Wide lo_wide(int64_t lo) {
  return lo == kNegInf ? -kWideInf : Wide{lo};
}
Wide hi_wide(int64_t hi) {
  return hi == kPosInf ? kWideInf : Wide{hi};
}
bool is_inf(Wide v) {
  return v == kWideInf || v == -kWideInf;
}

// Clamping to int64 is sound for both ends: a lower bound above INT64_MAX becomes INT64_MAX
// (moves down), one below INT64_MIN becomes -inf; symmetrically for upper bounds.
int64_t clamp(Wide v) {
  if (v <= Wide{kNegInf}) return kNegInf;
  if (v >= Wide{kPosInf}) return kPosInf;
  return static_cast<int64_t>(v);
}

SymRange make(Wide lo, Wide hi) {
  return SymRange{clamp(lo), clamp(hi)};
}

Wide add_wide(Wide a, Wide b) {
  if (is_inf(a)) return a;
  if (is_inf(b)) return b;
  return a + b;
}

Wide mul_wide(Wide a, Wide b) {
  if (a == 0 || b == 0) return 0;
  if (is_inf(a) || is_inf(b)) return ((a < 0) != (b < 0)) ? -kWideInf : kWideInf;
  return a * b;
}

// floor(a / b) for b != 0 with infinite ends taken as limits.
Wide div_wide(Wide a, Wide b) {
  const bool negative = (a < 0) != (b < 0);
  if (is_inf(a)) return negative ? -kWideInf : kWideInf;
  if (is_inf(b)) return (a == 0 || !negative) ? 0 : -1;
  Wide q = a / b;
  if (q * b != a && negative) --q;
  return q;
}

SymRange corners(SymRange a, SymRange b, Wide (*op)(Wide, Wide)) {
  const Wide xs[2] = {lo_wide(a.lo), hi_wide(a.hi)};
  const Wide ys[2] = {lo_wide(b.lo), hi_wide(b.hi)};
  Wide lo = kWideInf, hi = -kWideInf;
  for (Wide x : xs) {
    for (Wide y : ys) {
      const Wide v = op(x, y);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  return make(lo, hi);
}

SymRange hull(SymRange a, SymRange b) {
  return {std::min(a.lo, b.lo), std::max(a.hi, b.hi)};
}

constexpr SymRange kFull{kNegInf, kPosInf};

}  // namespace

SymRange range_add(SymRange a, SymRange b) {
  return make(add_wide(lo_wide(a.lo), lo_wide(b.lo)), add_wide(hi_wide(a.hi), hi_wide(b.hi)));
}

SymRange range_mul(SymRange a, SymRange b) {
  return corners(a, b, mul_wide);
}

SymRange range_pow(SymRange a, int k) {
  SymRange r = a;
  for (int i = 1; i < k; ++i) r = range_mul(r, a);
  if (k % 2 == 0) r.lo = std::max<int64_t>(r.lo, 0);
  return r;
}

// floor(x/y) is monotone in x for a fixed-sign y and monotone in y for a fixed-sign x, so over
// each sign part of the divisor the extremes lie at the corners.
SymRange range_floordiv(SymRange a, SymRange b) {
  bool any = false;
  SymRange r{};
  if (b.lo <= -1) {
    r = corners(a, {b.lo, std::min<int64_t>(b.hi, -1)}, div_wide);
    any = true;
  }
  if (b.hi >= 1) {
    const SymRange p = corners(a, {std::max<int64_t>(b.lo, 1), b.hi}, div_wide);
    r = any ? hull(r, p) : p;
    any = true;
  }
  return any ? r : kFull;
}

// Python modulo takes the divisor's sign: x % d in [0, d-1] for d > 0, [d+1, 0] for d < 0,
// and x % d == x when x already lies in that half-open interval for every divisor value.
SymRange range_mod(SymRange a, SymRange b) {
  bool any = false;
  SymRange r{};
  if (b.hi >= 1) {
    const int64_t dlo = std::max<int64_t>(b.lo, 1);
    SymRange p{0, b.hi == kPosInf ? kPosInf : b.hi - 1};
    if (a.lo >= 0 && a.hi < dlo) {
      p = a;
    } else if (a.lo >= 0) {
      p.hi = std::min(p.hi, a.hi);
    }
    r = p;
    any = true;
  }
  if (b.lo <= -1) {
    const int64_t dhi = std::min<int64_t>(b.hi, -1);
    SymRange n{b.lo == kNegInf ? kNegInf : b.lo + 1, 0};
    if (a.hi <= 0 && a.lo > dhi) {
      n = a;
    } else if (a.hi <= 0) {
      n.lo = std::max(n.lo, a.lo);
    }
    r = any ? hull(r, n) : n;
    any = true;
  }
  return any ? r : kFull;
}

SymRange range_min(SymRange a, SymRange b) {
  return {std::min(a.lo, b.lo), std::min(a.hi, b.hi)};
}

SymRange range_max(SymRange a, SymRange b) {
  return {std::max(a.lo, b.lo), std::max(a.hi, b.hi)};
}

bool range_le(SymRange a, SymRange b) {
  return a.hi != kPosInf && b.lo != kNegInf && a.hi <= b.lo;
}

bool range_is_point(SymRange r) {
  return r.lo == r.hi && r.lo != kNegInf && r.hi != kPosInf;
}

bool range_excludes_zero(SymRange r) {
  return r.lo > 0 || r.hi < 0;
}

}  // namespace dvm::shape
