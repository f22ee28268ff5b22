// Interval arithmetic on SymRange for the symbolic simplifier.
//
// A bound at the int64 limit means "unbounded": lo == INT64_MIN is -inf and hi == INT64_MAX
// is +inf. Results that leave int64 widen to those limits (a lower bound only ever moves down,
// an upper bound only up), so every computed interval contains every value the expression
// can take. Division and modulo ranges cover the values where the operation is defined
// (divisor != 0).
#pragma once

#include <cstdint>

#include "dvm/sym.h"

namespace dvm::shape {

inline constexpr int64_t kNegInf = INT64_MIN;
inline constexpr int64_t kPosInf = INT64_MAX;

SymRange range_add(SymRange a, SymRange b);
SymRange range_mul(SymRange a, SymRange b);
SymRange range_pow(SymRange a, int k);  // a^k, k >= 1
SymRange range_floordiv(SymRange a, SymRange b);
SymRange range_mod(SymRange a, SymRange b);
SymRange range_min(SymRange a, SymRange b);
SymRange range_max(SymRange a, SymRange b);

// Every value of `a` is <= every value of `b` (never true across an unbounded end).
bool range_le(SymRange a, SymRange b);
// The interval holds exactly one (finite) value.
bool range_is_point(SymRange r);
// Zero is not in the interval.
bool range_excludes_zero(SymRange r);

}  // namespace dvm::shape
