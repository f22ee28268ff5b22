// Tile kernels (see tile_kernels.h), compiled once per Highway target: unary math and its
// predicates, binary math, activations folded with a preceding add/sub (UnaryPreF32).
#include "vm/cpu/kernel_targets.h"  // first: before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vm/cpu/tile_kernels_unary.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include "vm/cpu/tile_kernels-inl.h"
#include "vm/cpu/unary_ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {

// The vector maps (WithUnaryValueOp) run a tile's blocks (Rows::outer) themselves; the scalar
// fallbacks split them here.
void UnaryF32(UnaryOp op, const Rows& rs, float* dst, const float* a, int ainc, int64_t n) {
  const DF d;
  const auto run = [&](auto f) { Map1Rows(d, d, rs, dst, a, ainc, n, f); };
  if (WithUnaryValueOp(d, op, run)) return;
  switch (op) {
    case UnaryOp::kIsFinite:
    case UnaryOp::kIsNan:
    case UnaryOp::kLogicalNot:
      if (SplitOuter(rs, [&](const Rows& one, int64_t od, int64_t oa, int64_t, int64_t) {
            UnaryF32(op, one, dst + od, a + oa, ainc, n);
          }))
        return;
      for (int64_t r = 0; r < rs.rows; ++r)
        for (int64_t i = 0; i < n; ++i)
          dst[r * rs.d + i] = ops::unary_f32(op, a[r * rs.a + (ainc ? i : 0)]);
      return;
    default:
      return;
  }
}

void PredicateF32(UnaryOp op, int32_t* dst, const float* a, int ainc, int64_t n) {
  const DF d;
  const DI di;
  switch (op) {
    case UnaryOp::kIsFinite:
      return Map1Rows(di, d, Rows{}, dst, a, ainc, n,
                      [d](VF x) { return MaskToI32(d, hn::IsFinite(x)); });
    case UnaryOp::kIsNan:
      return Map1Rows(di, d, Rows{}, dst, a, ainc, n,
                      [d](VF x) { return MaskToI32(d, hn::IsNaN(x)); });
    case UnaryOp::kLogicalNot:
      return Map1Rows(di, d, Rows{}, dst, a, ainc, n,
                      [d](VF x) { return MaskToI32(d, hn::Eq(x, hn::Zero(d))); });
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = ops::predicate_f32(op, a[ainc ? i : 0]);
  }
}

// pow in double precision, as the scalar spec computes it (float(std::pow(double, double))),
// a vector of doubles at a time: |x|^y = exp(y * log|x|) with Highway's double log (4 ulp) and
// exp (1 ulp). Their error in double, at most ~100 ulp of double for any result a float can
// hold, is far below a float's half ulp: the float result is the spec's except where the exact
// power lies within that error of a rounding boundary between two floats (then 1 ulp apart).
// A negative x has a real power only for integer y (negative for odd y), else NaN. x must be
// finite and nonzero and y finite (PowRowF32 computes the other lanes by the spec).
using DD = hn::ScalableTag<double>;
using DFD = hn::Rebind<float, DD>;  // floats, as many lanes as DD
using VD = hn::Vec<DD>;

HWY_INLINE VD PowD(DD dd, VD x, VD y) {
  // exp's valid range ends at 706; e^200 is already beyond a float.
  const VD t = hn::Min(hn::Mul(y, hn::Log(dd, hn::Abs(x))), hn::Set(dd, 200.0));
  const VD r = hn::Exp(dd, t);
  const auto neg = hn::Lt(x, hn::Zero(dd));
  if (hn::AllFalse(dd, neg)) return r;
  const VD half = hn::Mul(y, hn::Set(dd, 0.5));
  const auto integral = hn::Eq(hn::Round(y), y);
  const auto odd = hn::And(integral, hn::Ne(hn::Round(half), half));  // exact: |y| < 2^128
  const VD signed_r = hn::IfThenElse(odd, hn::Neg(r), r);
  const VD of_neg =
      hn::IfThenElse(integral, signed_r, hn::Set(dd, std::numeric_limits<double>::quiet_NaN()));
  return hn::IfThenElse(neg, of_neg, r);
}

// One row of pow(a, b); a source of increment 0 is a broadcast scalar. dst may be a or b.
void PowRowF32(float* dst, const float* a, int ainc, const float* b, int binc, int64_t n) {
  const DD dd;
  const DFD df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(dd));
  const auto spec = [&](int64_t i) {
    dst[i] = ops::binary_f32(BinaryOp::kPow, a[ainc ? i : 0], b[binc ? i : 0]);
  };
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VD x = hn::PromoteTo(dd, ainc ? hn::LoadU(df, a + i) : hn::Set(df, a[0]));
    const VD y = hn::PromoteTo(dd, binc ? hn::LoadU(df, b + i) : hn::Set(df, b[0]));
    const auto usual = hn::And(hn::And(hn::IsFinite(x), hn::Ne(x, hn::Zero(dd))), hn::IsFinite(y));
    if (hn::AllTrue(dd, usual)) {
      hn::StoreU(hn::DemoteTo(df, PowD(dd, x, y)), df, dst + i);
    } else {  // zeros, infinities, NaNs: IEEE pow's special cases, by the spec
      for (int64_t k = i; k < i + N; ++k) spec(k);
    }
  }
  for (; i < n; ++i) spec(i);
}

void BinaryF32(BinaryOp op, const Rows& rs, float* dst, const float* a, int ainc, const float* b,
               int binc, int64_t n) {
  const DF d;
  const auto run = [&](auto f) { Map2Rows(d, d, rs, dst, a, ainc, b, binc, n, f); };
  if (WithAddSubMul(op, run) || WithDivMaxMin(op, run)) return;
  switch (op) {
    case BinaryOp::kPow:
      // pow(x, 2) rounds x*x exactly like the double spec; other exponents: PowRowF32 below.
      if (binc == 0 && rs.b == 0 && (rs.outer == 1 || rs.ob == 0) && b[0] == 2.0f)
        return run([](VF x, VF) { return hn::Mul(x, x); });
      [[fallthrough]];
    default:
      if (SplitOuter(rs, [&](const Rows& one, int64_t od, int64_t oa, int64_t ob, int64_t) {
            BinaryF32(op, one, dst + od, a + oa, ainc, b + ob, binc, n);
          }))
        return;
      for (int64_t r = 0; r < rs.rows; ++r) {
        float* dr = dst + r * rs.d;
        const float *ar = a + r * rs.a, *br = b + r * rs.b;
        if (op == BinaryOp::kPow) {
          PowRowF32(dr, ar, ainc, br, binc, n);
          continue;
        }
        for (int64_t i = 0; i < n; ++i)
          dr[i] = ops::binary_f32(op, ar[ainc ? i : 0], br[binc ? i : 0]);
      }
  }
}

// dst[i] = op(a[i] + b[i]) (pre 1) or op(a[i] - b[i]) (pre 2): the add/sub stays in a vector
// register instead of making its own pass over the tile; the same bits as the two ops apart.
void UnaryPreF32(UnaryOp op, int pre, const Rows& rs, float* dst, const float* a, int ainc,
                 const float* b, int binc, int64_t n) {
  const DF d;
  const auto map = [&](auto g) { Map2Rows(d, d, rs, dst, a, ainc, b, binc, n, g); };
  const auto run = [&](auto f) {
    if (pre == 1) {
      map([&](VF x, VF y) DVM_INL { return f(hn::Add(x, y)); });
    } else {
      map([&](VF x, VF y) DVM_INL { return f(hn::Sub(x, y)); });
    }
  };
  if (WithActivation(d, op, run)) return;
  if (SplitOuter(rs, [&](const Rows& one, int64_t od, int64_t oa, int64_t ob, int64_t) {
        UnaryPreF32(op, pre, one, dst + od, a + oa, ainc, b + ob, binc, n);
      }))
    return;
  BinaryF32(pre == 1 ? BinaryOp::kAdd : BinaryOp::kSub, rs, dst, a, ainc, b, binc, n);
  UnaryF32(op, Rows{rs.rows, rs.d, rs.d, 0, 0}, dst, dst, 1, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();
