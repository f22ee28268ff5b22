// Scalar semantics of every op of dvm/ops.def: the executable spec shared by the reference
// executor, the VM and constant folding. Small inline pure functions; the SIMD tile kernels
// (src/vm/cpu/tile_kernels.h) agree with them bit for bit for every non-transcendental op and
// within the bounds of docs/numerics.md for transcendentals.
//
// Conventions (PyTorch semantics where it has one):
// - f32 arithmetic (+ - * /, sqrt, min/max, rounding) computes in float; transcendentals
//   compute through the double std:: function and round once to float (the "exact" result).
// - Maximum/Minimum propagate NaN: a NaN operand gives that NaN (a's first). Otherwise
//   max(a, b) = a > b ? a : b and min(a, b) = a < b ? a : b, so max(+0, -0) = -0 (b) and
//   max(-0, +0) = +0 (b).
// - Relu propagates NaN; Relu(-0) = +0. Sign(NaN) = Sign(±0) = +0, as torch.sign.
// - Round is round-half-to-even (std::nearbyint in the default rounding mode).
// - FloorDiv f32 follows torch's div_floor_floating exactly (fmod-based, then floor-corrected,
//   b == 0 gives the IEEE quotient a / b). Remainder f32: r = fmod(a, b), r += b when r != 0 and
//   r, b differ in sign (torch).
// - Integers: add/sub/mul/neg/abs wrap (computed in unsigned, no UB); floor_divide and
//   remainder round toward -inf; division by zero is an error of the kernel's run (torch
//   raises ZeroDivisionError: the reference executor and the VM report it), these functions
//   giving 0 for it; INT_MIN / -1 wraps to INT_MIN and INT_MIN % -1 = 0. Pow by repeated squaring
//   (wrapping); a negative exponent gives 0, except base 1 -> 1 and base -1 -> +-1. Div (not
//   produced by the builder, which casts to f32) truncates toward zero with the same /0 and
//   overflow rules.
// - Comparisons and logical ops give i32 0/1; logical ops take any non-zero (NaN too) as true.
// - Conversions: f32 -> i32/i64 truncates toward zero, saturates, NaN -> 0; i64 -> i32 wraps;
//   int -> f32 rounds to nearest even. Bool storage is one byte 0/1 (non-zero -> 1).
// - f16 / bf16 conversions round to nearest even, overflow to inf, keep NaN quiet.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "dvm/dtype.h"
#include "dvm/kernel.h"
#include "ops/op_traits.h"

namespace dvm::ops {

// ------------------------------------------------------------------------------------------
// Bit helpers

inline uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// ------------------------------------------------------------------------------------------
// Integer wrapping helpers (two's complement, never UB).

template <typename T>
inline T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <typename T>
inline T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
}
template <typename T>
inline T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}
template <typename T>
inline T wrap_neg(T a) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(U{0} - static_cast<U>(a)));
}

// Truncating division: /0 -> 0, MIN / -1 -> MIN.
template <typename T>
inline T int_div(T a, T b) {
  if (b == 0) return 0;
  if (b == -1) return wrap_neg(a);
  return static_cast<T>(a / b);
}
// Floor division (toward -inf): /0 -> 0, MIN / -1 -> MIN.
template <typename T>
inline T int_floordiv(T a, T b) {
  if (b == 0) return 0;
  if (b == -1) return wrap_neg(a);
  T q = static_cast<T>(a / b);
  T r = static_cast<T>(a % b);
  if (r != 0 && ((r < 0) != (b < 0))) --q;
  return q;
}
// Remainder with the sign of the divisor: %0 -> 0, x % -1 -> 0.
template <typename T>
inline T int_remainder(T a, T b) {
  if (b == 0 || b == -1) return 0;
  T r = static_cast<T>(a % b);
  if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
  return r;
}
template <typename T>
inline T int_pow(T base, T exp) {
  if (exp < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exp & 1) ? T(-1) : T(1);
    return 0;
  }
  using U = std::make_unsigned_t<T>;
  U result = 1, b = static_cast<U>(base);
  U e = static_cast<U>(exp);
  while (e != 0) {
    if (e & 1u) result = static_cast<U>(result * b);
    b = static_cast<U>(b * b);
    e >>= 1;
  }
  return static_cast<T>(result);
}

// ------------------------------------------------------------------------------------------
// Float helpers

inline float nan_max(float a, float b) {
  if (std::isnan(a)) return a;
  return a > b ? a : b;
}
inline float nan_min(float a, float b) {
  if (std::isnan(a)) return a;
  return a < b ? a : b;
}

// torch's div_floor_floating, in float.
inline float f32_floordiv(float a, float b) {
  if (b == 0.0f) return a / b;
  float mod = std::fmod(a, b);
  float div = (a - mod) / b;
  if (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) div -= 1.0f;
  if (div != 0.0f) {
    float fl = std::floor(div);
    if (div - fl > 0.5f) fl += 1.0f;
    return fl;
  }
  return std::copysign(0.0f, a / b);
}
inline float f32_remainder(float a, float b) {
  float mod = std::fmod(a, b);
  if (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) mod += b;
  return mod;
}

inline constexpr double kSqrt1_2 = 0.70710678118654752440;
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;

// ------------------------------------------------------------------------------------------
// Unary ops

inline float unary_f32(UnaryOp op, float x) {
  const double d = x;
  switch (op) {
    case UnaryOp::kNeg:
      return -x;
    case UnaryOp::kAbs:
      return std::fabs(x);
    case UnaryOp::kExp:
      return static_cast<float>(std::exp(d));
    case UnaryOp::kLog:
      return static_cast<float>(std::log(d));
    case UnaryOp::kLog1p:
      return static_cast<float>(std::log1p(d));
    case UnaryOp::kExpm1:
      return static_cast<float>(std::expm1(d));
    case UnaryOp::kSqrt:
      return std::sqrt(x);
    case UnaryOp::kRsqrt:
      return static_cast<float>(1.0 / std::sqrt(d));
    case UnaryOp::kReciprocal:
      return 1.0f / x;
    case UnaryOp::kTanh:
      return static_cast<float>(std::tanh(d));
    case UnaryOp::kSigmoid:
      return static_cast<float>(1.0 / (1.0 + std::exp(-d)));
    case UnaryOp::kRelu:
      return (x > 0.0f || std::isnan(x)) ? x : 0.0f;
    // gelu(x) = x/2 * (1 + erf(x/sqrt2)) = x/2 * erfc(-x/sqrt2): the erfc form keeps the
    // relative accuracy for negative x.
    case UnaryOp::kGeluErf:
      return static_cast<float>(0.5 * d * std::erfc(-d * kSqrt1_2));
    // gelu_tanh(x) = x/2 * (1 + tanh(y)) = x / (1 + e^(-2y)), y = sqrt(2/pi) (x + 0.044715 x^3).
    case UnaryOp::kGeluTanh:
      return static_cast<float>(d /
                                (1.0 + std::exp(-2.0 * kSqrt2OverPi * (d + 0.044715 * d * d * d))));
    case UnaryOp::kSilu:
      return static_cast<float>(d / (1.0 + std::exp(-d)));
    case UnaryOp::kErf:
      return static_cast<float>(std::erf(d));
    case UnaryOp::kSin:
      return static_cast<float>(std::sin(d));
    case UnaryOp::kCos:
      return static_cast<float>(std::cos(d));
    case UnaryOp::kFloor:
      return std::floor(x);
    case UnaryOp::kCeil:
      return std::ceil(x);
    case UnaryOp::kRound:
      return std::nearbyint(x);
    case UnaryOp::kTrunc:
      return std::trunc(x);
    case UnaryOp::kSign:  // NaN and -0 give +0, as torch.sign does
      return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    case UnaryOp::kIsFinite:
      return std::isfinite(x) ? 1.0f : 0.0f;
    case UnaryOp::kIsNan:
      return std::isnan(x) ? 1.0f : 0.0f;
    case UnaryOp::kLogicalNot:
      return x == 0.0f ? 1.0f : 0.0f;
  }
  return 0.0f;
}

template <typename T>
inline T unary_int(UnaryOp op, T x) {
  switch (op) {
    case UnaryOp::kNeg:
      return wrap_neg(x);
    case UnaryOp::kAbs:
      return x < 0 ? wrap_neg(x) : x;
    case UnaryOp::kRelu:
      return x > 0 ? x : T(0);
    case UnaryOp::kSign:
      return x > 0 ? T(1) : (x < 0 ? T(-1) : T(0));
    case UnaryOp::kFloor:
    case UnaryOp::kCeil:
    case UnaryOp::kRound:
    case UnaryOp::kTrunc:
      return x;
    case UnaryOp::kIsFinite:
      return 1;
    case UnaryOp::kIsNan:
      return 0;
    case UnaryOp::kLogicalNot:
      return x == 0 ? T(1) : T(0);
    default:
      return 0;  // float-only ops: never called on integers
  }
}
inline int32_t unary_i32(UnaryOp op, int32_t x) {
  return unary_int<int32_t>(op, x);
}
inline int64_t unary_i64(UnaryOp op, int64_t x) {
  return unary_int<int64_t>(op, x);
}

// Predicates (IsFinite, IsNan, LogicalNot): 0/1.
inline int32_t predicate_f32(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::kIsFinite:
      return std::isfinite(x) ? 1 : 0;
    case UnaryOp::kIsNan:
      return std::isnan(x) ? 1 : 0;
    case UnaryOp::kLogicalNot:
      return x == 0.0f ? 1 : 0;
    default:
      return 0;
  }
}
template <typename T>
inline int32_t predicate_int(UnaryOp op, T x) {
  switch (op) {
    case UnaryOp::kIsFinite:
      return 1;
    case UnaryOp::kIsNan:
      return 0;
    case UnaryOp::kLogicalNot:
      return x == 0 ? 1 : 0;
    default:
      return 0;
  }
}
inline int32_t predicate_i32(UnaryOp op, int32_t x) {
  return predicate_int<int32_t>(op, x);
}
inline int32_t predicate_i64(UnaryOp op, int64_t x) {
  return predicate_int<int64_t>(op, x);
}

// ------------------------------------------------------------------------------------------
// Binary ops

inline float binary_f32(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::kAdd:
      return a + b;
    case BinaryOp::kSub:
      return a - b;
    case BinaryOp::kMul:
      return a * b;
    case BinaryOp::kDiv:
      return a / b;
    case BinaryOp::kPow:
      return static_cast<float>(std::pow(double{a}, double{b}));
    case BinaryOp::kMaximum:
      return nan_max(a, b);
    case BinaryOp::kMinimum:
      return nan_min(a, b);
    case BinaryOp::kFloorDiv:
      return f32_floordiv(a, b);
    case BinaryOp::kRemainder:
      return f32_remainder(a, b);
    default:
      return 0.0f;  // comparisons: see compare_f32
  }
}

template <typename T>
inline T binary_int(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::kAdd:
      return wrap_add(a, b);
    case BinaryOp::kSub:
      return wrap_sub(a, b);
    case BinaryOp::kMul:
      return wrap_mul(a, b);
    case BinaryOp::kDiv:
      return int_div(a, b);
    case BinaryOp::kPow:
      return int_pow(a, b);
    case BinaryOp::kMaximum:
      return a > b ? a : b;
    case BinaryOp::kMinimum:
      return a < b ? a : b;
    case BinaryOp::kFloorDiv:
      return int_floordiv(a, b);
    case BinaryOp::kRemainder:
      return int_remainder(a, b);
    default:
      return 0;
  }
}
inline int32_t binary_i32(BinaryOp op, int32_t a, int32_t b) {
  return binary_int<int32_t>(op, a, b);
}
inline int64_t binary_i64(BinaryOp op, int64_t a, int64_t b) {
  return binary_int<int64_t>(op, a, b);
}

template <typename T>
inline int32_t compare(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::kEq:
      return a == b;
    case BinaryOp::kNe:
      return a != b;
    case BinaryOp::kLt:
      return a < b;
    case BinaryOp::kLe:
      return a <= b;
    case BinaryOp::kGt:
      return a > b;
    case BinaryOp::kGe:
      return a >= b;
    case BinaryOp::kLogicalAnd:
      return (a != T(0)) && (b != T(0));
    case BinaryOp::kLogicalOr:
      return (a != T(0)) || (b != T(0));
    default:
      return 0;
  }
}
inline int32_t compare_f32(BinaryOp op, float a, float b) {
  return compare<float>(op, a, b);
}
inline int32_t compare_i32(BinaryOp op, int32_t a, int32_t b) {
  return compare<int32_t>(op, a, b);
}
inline int32_t compare_i64(BinaryOp op, int64_t a, int64_t b) {
  return compare<int64_t>(op, a, b);
}

// ------------------------------------------------------------------------------------------
// f16 / bf16

inline uint16_t f32_to_f16_bits(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7FFFFFFFu;
  if (absx >= 0x7F800000u) {  // inf or NaN
    if (absx > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((absx >> 13) & 0x3FFu));
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520
  if (absx < 0x38800000u) {               // below 2^-14: f16 subnormal or zero
    if (absx < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 is a tie -> 0)
    const uint32_t exp = absx >> 23;
    const uint32_t mant = (absx & 0x7FFFFFu) | 0x800000u;
    // value = mant * 2^(exp - 150); in units of the f16 subnormal step 2^-24 that is
    // mant >> (126 - exp), rounded to nearest even.
    const uint32_t s = 126u - exp;
    uint32_t q = mant >> s;
    const uint32_t rem = mant & ((1u << s) - 1u);
    const uint32_t half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent (127 -> 15) and round the mantissa from 23 to 10 bits.
  uint32_t r = absx - 0x38000000u;  // exponent - 112
  const uint32_t rem = r & 0x1FFFu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // may carry into exponent: fine
  return static_cast<uint16_t>(sign | r);
}

inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_f32(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    // Subnormal or zero: mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t f32_to_bf16_bits(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // qNaN
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7FFFu + lsb) >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) {
  return bits_f32(static_cast<uint32_t>(b) << 16);
}

inline float round_f16(float x) {
  return f16_bits_to_f32(f32_to_f16_bits(x));
}
inline float round_bf16(float x) {
  return bf16_bits_to_f32(f32_to_bf16_bits(x));
}

// ------------------------------------------------------------------------------------------
// Conversions between compute types

template <typename I>
inline I f32_to_int(float x) {
  if (std::isnan(x)) return 0;
  // 2^31 / 2^63 are exact floats; anything at or above saturates.
  constexpr float kLimit = static_cast<float>(std::numeric_limits<I>::max());  // 2^(bits-1)
  if (x >= kLimit) return std::numeric_limits<I>::max();
  if (x < -kLimit) return std::numeric_limits<I>::min();
  return static_cast<I>(x);  // in range: truncates toward zero
}
inline int32_t f32_to_i32(float x) {
  return f32_to_int<int32_t>(x);
}
inline int64_t f32_to_i64(float x) {
  return f32_to_int<int64_t>(x);
}
inline float i32_to_f32(int32_t x) {
  return static_cast<float>(x);
}
inline float i64_to_f32(int64_t x) {
  return static_cast<float>(x);
}
inline int32_t i64_to_i32(int64_t x) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(x)));
}
inline int64_t i32_to_i64(int32_t x) {
  return x;
}

// Bool storage byte from a compute value (non-zero, NaN included, -> 1).
inline uint8_t f32_to_bool(float x) {
  return x != 0.0f ? 1 : 0;
}
inline uint8_t i32_to_bool(int32_t x) {
  return x != 0 ? 1 : 0;
}
inline uint8_t i64_to_bool(int64_t x) {
  return x != 0 ? 1 : 0;
}

// ------------------------------------------------------------------------------------------
// Reductions

template <typename T>
inline T reduce_identity(ReduceOp op) {
  constexpr bool kFloat = std::is_floating_point_v<T>;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return T(0);
    case ReduceOp::kProd:
      return T(1);
    case ReduceOp::kMax:
    case ReduceOp::kArgMax:
      if constexpr (kFloat)
        return -std::numeric_limits<T>::infinity();
      else
        return std::numeric_limits<T>::min();
    case ReduceOp::kMin:
    case ReduceOp::kArgMin:
      if constexpr (kFloat)
        return std::numeric_limits<T>::infinity();
      else
        return std::numeric_limits<T>::max();
  }
  return T(0);
}

// combine(acc, x). Max/Min propagate NaN (the accumulator's NaN first).
inline float reduce_combine_f32(ReduceOp op, float acc, float x) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return acc + x;
    case ReduceOp::kProd:
      return acc * x;
    case ReduceOp::kMax:
    case ReduceOp::kArgMax:
      return binary_f32(BinaryOp::kMaximum, acc, x);
    case ReduceOp::kMin:
    case ReduceOp::kArgMin:
      return binary_f32(BinaryOp::kMinimum, acc, x);
  }
  return acc;
}
template <typename T>
inline T reduce_combine_int(ReduceOp op, T acc, T x) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return wrap_add(acc, x);
    case ReduceOp::kProd:
      return wrap_mul(acc, x);
    case ReduceOp::kMax:
    case ReduceOp::kArgMax:
      return acc > x ? acc : x;
    case ReduceOp::kMin:
    case ReduceOp::kArgMin:
      return acc < x ? acc : x;
  }
  return acc;
}
inline int32_t reduce_combine_i32(ReduceOp op, int32_t acc, int32_t x) {
  return reduce_combine_int<int32_t>(op, acc, x);
}
inline int64_t reduce_combine_i64(ReduceOp op, int64_t acc, int64_t x) {
  return reduce_combine_int<int64_t>(op, acc, x);
}

// Arg reductions. `op` is ArgMax or ArgMin. NaN is the most extreme value; among equals
// (both NaN, or equal values) the smaller index wins, so the first extreme element wins.
// Returns true when candidate (v, i) should replace the current best (cur_v, cur_i).
template <typename T>
inline bool arg_better(ReduceOp op, T v, int64_t i, T cur_v, int64_t cur_i) {
  if constexpr (std::is_floating_point_v<T>) {
    const bool vn = std::isnan(v), cn = std::isnan(cur_v);
    if (vn || cn) return vn && (!cn || i < cur_i);
  }
  if (v == cur_v) return i < cur_i;
  return op == ReduceOp::kArgMin ? v < cur_v : v > cur_v;
}

// Element value as a double, from its stored bytes (f16/bf16 widened, bool as 0/1).
inline double load_element(const void* p, DType t) {
  switch (t) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return t == DType::kF16 ? f16_bits_to_f32(v) : bf16_bits_to_f32(v);
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<double>(v);
    }
    case DType::kBool:
      return *static_cast<const uint8_t*>(p) != 0 ? 1.0 : 0.0;
  }
  return 0;
}

}  // namespace dvm::ops
