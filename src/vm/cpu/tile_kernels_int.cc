// Row kernels of the CPU VM on i32 and i64 values and the conversions between f32, i32 and
// i64 (see tile_kernels.h), compiled once per Highway target: plain loops over the scalar
// spec (vm/cpu/int_loops.h) that the compiler vectorises with each target's registers. Once
// compiled for baseline x86-64 only, they ran an element at a time: T5's relative-position
// buckets (i64 subtract, compare, abs, min, select and f32 <-> i64 casts over [T, T]) cost
// more than the attention they feed.
#include <cstdint>

#include "ops/scalar_ops.h"
#include "vm/cpu/int_loops.h"
#include "vm/cpu/kernel_targets.h"  // first: before any Highway header
#include "vm/cpu/tile_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vm/cpu/tile_kernels_int.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {

using namespace dvm::ops;  // the scalar semantics the loops implement  // NOLINT
using loops::loop1;
using loops::loop2;

template <typename T>
HWY_INLINE void unary_int_row(UnaryOp op, T* dst, const T* a, int ainc, int64_t n) {
  switch (op) {
    case UnaryOp::kNeg:
      return loop1(dst, a, ainc, n, [](T x) { return wrap_neg(x); });
    case UnaryOp::kAbs:
      return loop1(dst, a, ainc, n, [](T x) { return x < 0 ? wrap_neg(x) : x; });
    case UnaryOp::kRelu:
      return loop1(dst, a, ainc, n, [](T x) { return x > 0 ? x : T(0); });
    default:
      return loop1(dst, a, ainc, n, [op](T x) { return unary_int<T>(op, x); });
  }
}

template <typename T>
HWY_INLINE void binary_int_row(BinaryOp op, T* dst, const T* a, int ainc, const T* b, int binc,
                               int64_t n) {
  switch (op) {
    case BinaryOp::kAdd:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return wrap_add(x, y); });
    case BinaryOp::kSub:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return wrap_sub(x, y); });
    case BinaryOp::kMul:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return wrap_mul(x, y); });
    case BinaryOp::kMaximum:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return x > y ? x : y; });
    case BinaryOp::kMinimum:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return x < y ? x : y; });
    default:  // division, power, floor division, remainder: scalar either way
      return loop2(dst, a, ainc, b, binc, n, [op](T x, T y) { return binary_int<T>(op, x, y); });
  }
}

template <typename T>
HWY_INLINE void compare_int_row(BinaryOp op, int32_t* dst, const T* a, int ainc, const T* b,
                                int binc, int64_t n) {
  switch (op) {
    case BinaryOp::kEq:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{x == y}; });
    case BinaryOp::kLt:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{x < y}; });
    case BinaryOp::kGt:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{x > y}; });
    case BinaryOp::kNe:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{x != y}; });
    case BinaryOp::kLe:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{x <= y}; });
    case BinaryOp::kGe:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{x >= y}; });
    case BinaryOp::kLogicalAnd:  // bool tensors' & and | (HF's attention masks)
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{(x != 0) & (y != 0)}; });
    case BinaryOp::kLogicalOr:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{(x != 0) | (y != 0)}; });
    default:  // the switch inside the loop keeps it scalar: every compare has its case above
      return loop2(dst, a, ainc, b, binc, n, [op](T x, T y) { return compare<T>(op, x, y); });
  }
}

void ConvertRow(CType to, void* dst, CType from, const void* src, int sinc, int64_t n) {
  const auto conv = [&](auto* d, const auto* s, auto f) { loop1(d, s, sinc, n, f); };
  switch (from) {
    case CType::kF32: {
      const auto* s = static_cast<const float*>(src);
      switch (to) {
        case CType::kF32:
          return conv(static_cast<float*>(dst), s, [](float x) { return x; });
        case CType::kI32:
          return conv(static_cast<int32_t*>(dst), s, f32_to_i32);
        case CType::kI64:
          return conv(static_cast<int64_t*>(dst), s, f32_to_i64);
      }
      return;
    }
    case CType::kI32: {
      const auto* s = static_cast<const int32_t*>(src);
      switch (to) {
        case CType::kF32:
          return conv(static_cast<float*>(dst), s, i32_to_f32);
        case CType::kI32:
          return conv(static_cast<int32_t*>(dst), s, [](int32_t x) { return x; });
        case CType::kI64:
          return conv(static_cast<int64_t*>(dst), s, i32_to_i64);
      }
      return;
    }
    case CType::kI64: {
      const auto* s = static_cast<const int64_t*>(src);
      switch (to) {
        case CType::kF32:
          return conv(static_cast<float*>(dst), s, i64_to_f32);
        case CType::kI32:
          return conv(static_cast<int32_t*>(dst), s, i64_to_i32);
        case CType::kI64:
          return conv(static_cast<int64_t*>(dst), s, [](int64_t x) { return x; });
      }
      return;
    }
  }
}

void UnaryI32(UnaryOp op, int32_t* dst, const int32_t* a, int ainc, int64_t n) {
  unary_int_row<int32_t>(op, dst, a, ainc, n);
}
void UnaryI64(UnaryOp op, int64_t* dst, const int64_t* a, int ainc, int64_t n) {
  unary_int_row<int64_t>(op, dst, a, ainc, n);
}
void PredicateI32(UnaryOp op, int32_t* dst, const int32_t* a, int ainc, int64_t n) {
  loop1(dst, a, ainc, n, [op](int32_t x) { return ops::predicate_i32(op, x); });
}
void PredicateI64(UnaryOp op, int32_t* dst, const int64_t* a, int ainc, int64_t n) {
  loop1(dst, a, ainc, n, [op](int64_t x) { return ops::predicate_i64(op, x); });
}
void BinaryI32(BinaryOp op, int32_t* dst, const int32_t* a, int ainc, const int32_t* b, int binc,
               int64_t n) {
  binary_int_row<int32_t>(op, dst, a, ainc, b, binc, n);
}
void BinaryI64(BinaryOp op, int64_t* dst, const int64_t* a, int ainc, const int64_t* b, int binc,
               int64_t n) {
  binary_int_row<int64_t>(op, dst, a, ainc, b, binc, n);
}
void CompareI32(BinaryOp op, int32_t* dst, const int32_t* a, int ainc, const int32_t* b, int binc,
                int64_t n) {
  compare_int_row<int32_t>(op, dst, a, ainc, b, binc, n);
}
void CompareI64(BinaryOp op, int32_t* dst, const int64_t* a, int ainc, const int64_t* b, int binc,
                int64_t n) {
  compare_int_row<int64_t>(op, dst, a, ainc, b, binc, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dvm::vm::cpu {

HWY_EXPORT(UnaryI32);
HWY_EXPORT(UnaryI64);
HWY_EXPORT(PredicateI32);
HWY_EXPORT(PredicateI64);
HWY_EXPORT(BinaryI32);
HWY_EXPORT(BinaryI64);
HWY_EXPORT(CompareI32);
HWY_EXPORT(CompareI64);
HWY_EXPORT(ConvertRow);

void unary_i32(UnaryOp op, int32_t* dst, const int32_t* a, int ainc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(UnaryI32)(op, dst, a, ainc, n);
}
void unary_i64(UnaryOp op, int64_t* dst, const int64_t* a, int ainc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(UnaryI64)(op, dst, a, ainc, n);
}
void predicate_i32(UnaryOp op, int32_t* dst, const int32_t* a, int ainc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(PredicateI32)(op, dst, a, ainc, n);
}
void predicate_i64(UnaryOp op, int32_t* dst, const int64_t* a, int ainc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(PredicateI64)(op, dst, a, ainc, n);
}
void binary_i32(BinaryOp op, int32_t* dst, const int32_t* a, int ainc, const int32_t* b, int binc,
                int64_t n) {
  HWY_DYNAMIC_DISPATCH(BinaryI32)(op, dst, a, ainc, b, binc, n);
}
void binary_i64(BinaryOp op, int64_t* dst, const int64_t* a, int ainc, const int64_t* b, int binc,
                int64_t n) {
  HWY_DYNAMIC_DISPATCH(BinaryI64)(op, dst, a, ainc, b, binc, n);
}
void compare_i32(BinaryOp op, int32_t* dst, const int32_t* a, int ainc, const int32_t* b, int binc,
                 int64_t n) {
  HWY_DYNAMIC_DISPATCH(CompareI32)(op, dst, a, ainc, b, binc, n);
}
void compare_i64(BinaryOp op, int32_t* dst, const int64_t* a, int ainc, const int64_t* b, int binc,
                 int64_t n) {
  HWY_DYNAMIC_DISPATCH(CompareI64)(op, dst, a, ainc, b, binc, n);
}
void convert(CType to, void* dst, CType from, const void* src, int sinc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ConvertRow)(to, dst, from, src, sinc, n);
}

}  // namespace dvm::vm::cpu
#endif  // HWY_ONCE
