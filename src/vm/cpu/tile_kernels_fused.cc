// Tile kernels (see tile_kernels.h), compiled once per Highway target: the common activations
// folded with the multiply that follows them (FusedMulF32: every activation x every operand
// form, the heaviest kernel to compile, hence a file of its own).
#include "vm/cpu/kernel_targets.h"  // first: before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vm/cpu/tile_kernels_fused.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include "vm/cpu/tile_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {

// dst = g * c for a producer g that is a * b (kMul), op(a) (kUnary) or op(a +- b) (kUnaryPre,
// pre 1 / 2): two chain instructions in one pass, the intermediate never stored. The same
// bits as the two instructions apart (f32 throughout). Row strides: rs.a, rs.b of a and b,
// rs.c of c.
void FusedMulF32(int kind, UnaryOp op, int pre, const Rows& rs, float* dst, const float* a,
                 int ainc, const float* b, int binc, const float* c, int cinc, int64_t n) {
  const DF d;  // the maps run the tile's blocks (Rows::outer)
  if (kind == kFusedMul) {
    return Map3Rows(d, rs, dst, a, ainc, b, binc, c, cinc, n,
                    [](VF x, VF y, VF z) { return hn::Mul(hn::Mul(x, y), z); });
  }
  const auto run = [&](auto f) {
    if (kind == kFusedUnary) {
      Rows ac{rs.rows, rs.d, rs.a, rs.c};
      ac.outer = rs.outer;
      ac.od = rs.od;
      ac.oa = rs.oa;
      ac.ob = rs.oc;
      Map2Rows(d, d, ac, dst, a, ainc, c, cinc, n,
               [&](VF x, VF z) DVM_INL { return hn::Mul(f(x), z); });
    } else if (pre == 1) {
      Map3Rows(d, rs, dst, a, ainc, b, binc, c, cinc, n,
               [&](VF x, VF y, VF z) DVM_INL { return hn::Mul(f(hn::Add(x, y)), z); });
    } else {
      Map3Rows(d, rs, dst, a, ainc, b, binc, c, cinc, n,
               [&](VF x, VF y, VF z) DVM_INL { return hn::Mul(f(hn::Sub(x, y)), z); });
    }
  };
  WithActivation(d, op, run);  // fused_mul_supported(op): one of them
}

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();
