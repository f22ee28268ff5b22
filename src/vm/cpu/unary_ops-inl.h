// The vector math of every value-producing f32 unary op (and of div, maximum and minimum),
// shared by the tile kernels (tile_kernels_unary.cc) and the row programs (row_program.cc):
// one list, the same bits.
// Per-target inline code: included after tile_kernels-inl.h in a foreach_target file.
#if defined(DVM_VM_CPU_UNARY_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)  // NOLINT
#ifdef DVM_VM_CPU_UNARY_OPS_INL_H_
#undef DVM_VM_CPU_UNARY_OPS_INL_H_
#else
#define DVM_VM_CPU_UNARY_OPS_INL_H_
#endif

#include "vm/cpu/tile_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {

// Calls run(f) with the vector map f of `op` and returns true; false, run not called, for the
// predicates (IsFinite, IsNan, LogicalNot), whose results are not floats. Floor/Ceil/Round/
// Trunc keep the sign of x (-0 stays -0 also where an emulated target loses it).
template <class Run>
HWY_INLINE bool WithUnaryValueOp(DF d, UnaryOp op, const Run& run) {
  switch (op) {
    case UnaryOp::kNeg:
      return run([](VF x) { return hn::Neg(x); }), true;
    case UnaryOp::kAbs:
      return run([](VF x) { return hn::Abs(x); }), true;
    case UnaryOp::kExp:
      return run([d](VF x) DVM_INL { return ExpF(d, x); }), true;
    case UnaryOp::kLog:
      return run([d](VF x) DVM_INL { return LogF(d, x); }), true;
    case UnaryOp::kLog1p:
      return run([d](VF x) DVM_INL { return Log1pF(d, x); }), true;
    case UnaryOp::kExpm1:
      return run([d](VF x) DVM_INL { return Expm1F(d, x); }), true;
    case UnaryOp::kSqrt:
      return run([](VF x) { return hn::Sqrt(x); }), true;
    case UnaryOp::kRsqrt:
      return run([d](VF x) DVM_INL { return hn::Div(hn::Set(d, 1.0f), hn::Sqrt(x)); }), true;
    case UnaryOp::kReciprocal:
      return run([d](VF x) DVM_INL { return hn::Div(hn::Set(d, 1.0f), x); }), true;
    case UnaryOp::kTanh:
      return run([d](VF x) DVM_INL { return TanhF(d, x); }), true;
    case UnaryOp::kSigmoid:
      return run([d](VF x) DVM_INL { return SigmoidF(d, x); }), true;
    case UnaryOp::kRelu:
      return run([d](VF x) DVM_INL { return ReluF(d, x); }), true;
    case UnaryOp::kGeluErf:
      return run([d](VF x) DVM_INL { return GeluErfF(d, x); }), true;
    case UnaryOp::kGeluTanh:
      return run([d](VF x) DVM_INL { return GeluTanhF(d, x); }), true;
    case UnaryOp::kSilu:
      return run([d](VF x) DVM_INL { return hn::Mul(x, SigmoidF(d, x)); }), true;
    case UnaryOp::kErf:
      return run([d](VF x) DVM_INL { return ErfF(d, x); }), true;
    case UnaryOp::kSin:
      return run([d](VF x) DVM_INL { return SinCosF<true>(d, x); }), true;
    case UnaryOp::kCos:
      return run([d](VF x) DVM_INL { return SinCosF<false>(d, x); }), true;
    case UnaryOp::kFloor:
      return run([](VF x) { return hn::CopySign(hn::Floor(x), x); }), true;
    case UnaryOp::kCeil:
      return run([](VF x) { return hn::CopySign(hn::Ceil(x), x); }), true;
    case UnaryOp::kRound:
      return run([](VF x) { return hn::CopySign(hn::Round(x), x); }), true;
    case UnaryOp::kTrunc:
      return run([](VF x) { return hn::CopySign(hn::Trunc(x), x); }), true;
    case UnaryOp::kSign:
      return run([d](VF x) DVM_INL { return SignF(d, x); }), true;
    case UnaryOp::kIsFinite:  // every op listed: a new one fails to compile here (-Wswitch)
    case UnaryOp::kIsNan:
    case UnaryOp::kLogicalNot:
      return false;
  }
  return false;
}

// Calls run(f) with the vector math of div, maximum or minimum (NaN-propagating) and returns
// true; false for any other op. With WithAddSubMul, the f32 binary ops that the tile kernels
// and the row programs share.
template <class Run>
HWY_INLINE bool WithDivMaxMin(BinaryOp op, const Run& run) {
  switch (op) {
    case BinaryOp::kDiv:
      return run([](VF x, VF y) { return hn::Div(x, y); }), true;
    case BinaryOp::kMaximum:
      return run([](VF x, VF y) { return NanMax(x, y); }), true;
    case BinaryOp::kMinimum:
      return run([](VF x, VF y) { return NanMin(x, y); }), true;
    default:
      return false;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();

#endif  // DVM_VM_CPU_UNARY_OPS_INL_H_
