// The CPU tile kernels (src/vm/cpu/tile_kernels.h) against the scalar spec
// (src/ops/scalar_ops.h): every function, every increment pattern, sizes around the vector
// widths, special values, in-place aliasing. Transcendental bounds are in docs/numerics.md.
#include "vm/cpu/tile_kernels.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/scalar_ops.h"

namespace dvm::vm::cpu {
namespace {

using namespace dvm::ops;  // the scalar spec the kernels are checked against  // NOLINT

constexpr int64_t kSizes[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 64, 100, 1000, 4099};
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const std::vector<float>& specials() {
  static const std::vector<float> v = {
      0.0f,    -0.0f,    kInf,   -kInf,   kNaN,    -kNaN,   FLT_MAX,     -FLT_MAX,
      FLT_MIN, -FLT_MIN, 1e-45f, -1e-45f, 1e-30f,  -1e-30f, 1.0f,        -1.0f,
      0.5f,    -0.5f,    1.5f,   -1.5f,   2.5f,    -2.5f,   -1.0000001f, -2.0f,
      88.72f,  88.73f,   -87.5f, -103.9f, -104.5f, 120.0f,  39000.0f,    39001.0f,
      -1e10f,  1e10f,    3e9f,   -3e9f,   1e20f,   -1e20f,  16777217.0f, 0.9999999f};
  return v;
}

// Random values of mixed magnitudes with the special values sprinkled in.
std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -10.0f, float hi = 10.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::uniform_int_distribution<int> pick(0, 7);
  std::vector<float> v(static_cast<size_t>(n));
  const auto& s = specials();
  for (int64_t i = 0; i < n; ++i) {
    const int p = pick(rng);
    if (p == 0) {
      v[i] = s[rng() % s.size()];
    } else if (p == 1) {
      v[i] = std::ldexp(u(rng), static_cast<int>(rng() % 60) - 30);
    } else {
      v[i] = u(rng);
    }
  }
  return v;
}

std::string where(const char* what, int64_t n, int64_t i, int ainc = -1, int binc = -1) {
  return std::string(what) + " n=" + std::to_string(n) + " i=" + std::to_string(i) +
         " ainc=" + std::to_string(ainc) + " binc=" + std::to_string(binc);
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return f32_bits(a) == f32_bits(b);
}

// Distance in units in the last place (ordered bit patterns); NaN vs NaN is 0.
double ulp_diff(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return (std::isnan(a) && std::isnan(b)) ? 0.0 : 1e30;
  const auto ord = [](float x) {
    const int64_t u = f32_bits(x);
    return (u & 0x80000000) ? -(u & 0x7FFFFFFF) : u;
  };
  return std::fabs(static_cast<double>(ord(a) - ord(b)));
}

// ------------------------------------------------------------------------------------------
// Unary f32

constexpr UnaryOp kExactUnary[] = {
    UnaryOp::kNeg,   UnaryOp::kAbs,  UnaryOp::kSqrt,  UnaryOp::kRelu,  UnaryOp::kReciprocal,
    UnaryOp::kFloor, UnaryOp::kCeil, UnaryOp::kRound, UnaryOp::kTrunc, UnaryOp::kSign};

TEST(TileKernels, UnaryF32ExactOps) {
  for (UnaryOp op : kExactUnary) {
    for (int64_t n : kSizes) {
      const std::vector<float> a = random_floats(n + 1, 17 + static_cast<uint32_t>(n));
      for (int ainc : {0, 1}) {
        std::vector<float> dst(n + 1, 1234.5f);
        unary_f32(op, dst.data(), a.data(), ainc, n);
        for (int64_t i = 0; i < n; ++i) {
          const float want = ops::unary_f32(op, a[ainc ? i : 0]);
          ASSERT_TRUE(same_float(dst[i], want))
              << unary_op_name(op) << " " << where("", n, i, ainc) << " x=" << a[ainc ? i : 0]
              << " got " << dst[i] << " want " << want;
        }
        EXPECT_EQ(dst[n], 1234.5f) << "wrote past the row";
      }
      // In place.
      std::vector<float> io = a;
      unary_f32(op, io.data(), io.data(), 1, n);
      for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_float(io[i], ops::unary_f32(op, a[i])));
    }
  }
}

struct TransBound {
  UnaryOp op;
  double max_ulp;  // asserted where |spec| >= kUlpFloor
  double max_abs;  // where |spec| < kUlpFloor: the ulp bound or else this absolute bound
};
constexpr double kUlpFloor = 1e-6;
// Bounds asserted by the sweep below, in ulps of distance from the rounded spec on the
// dispatched target (sigmoid and silu: 4 on SSE4). The documented bounds, against the exact
// value on every target, are kUlpBounds (UlpBounds.TranscendentalsWithinDocumentedBounds).
constexpr TransBound kTransBounds[] = {
    {UnaryOp::kExp, 2, 1e-45},      {UnaryOp::kLog, 2, 1e-45},       {UnaryOp::kLog1p, 3, 1e-45},
    {UnaryOp::kExpm1, 4, 1e-45},    {UnaryOp::kRsqrt, 1, 1e-45},     {UnaryOp::kTanh, 2, 1e-45},
    {UnaryOp::kSigmoid, 5, 1e-44},  {UnaryOp::kSilu, 5, 1e-43},      {UnaryOp::kErf, 3, 1e-44},
    {UnaryOp::kGeluErf, 40, 4e-12}, {UnaryOp::kGeluTanh, 40, 4e-12}, {UnaryOp::kSin, 3, 1e-45},
    {UnaryOp::kCos, 3, 1e-45},
};

// Error of the SIMD result against the double-computed spec over every 257th float bit
// pattern (all signs and magnitudes, NaN and inf included) plus the special values.
TEST(TileKernels, UnaryF32TranscendentalSweep) {
  constexpr uint64_t kStride = 257;
  std::vector<float> x;
  x.reserve((1ull << 32) / kStride + 64);
  for (uint64_t u = 0; u < (1ull << 32); u += kStride) {
    x.push_back(bits_f32(static_cast<uint32_t>(u)));
  }
  for (float s : specials()) x.push_back(s);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size());
  for (const TransBound& b : kTransBounds) {
    unary_f32(b.op, y.data(), x.data(), 1, n);
    double max_ulp = 0, max_abs = 0;
    float worst_x = 0, worst_abs_x = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float want = ops::unary_f32(b.op, x[i]);
      if (std::isnan(want) || std::isinf(want) || std::isnan(y[i]) || std::isinf(y[i])) {
        ASSERT_TRUE(same_float(y[i], want) || (std::isnan(want) && std::isnan(y[i])))
            << unary_op_name(b.op) << " x=" << x[i] << " got " << y[i] << " want " << want;
        continue;
      }
      if (std::fabs(want) < kUlpFloor) {
        // Tails: within the ulp bound, or else within the absolute bound.
        if (ulp_diff(y[i], want) <= b.max_ulp) continue;
        const double e = std::fabs(static_cast<double>(y[i]) - want);
        if (e > max_abs) {
          max_abs = e;
          worst_abs_x = x[i];
        }
        continue;
      }
      const double e = ulp_diff(y[i], want);
      if (e > max_ulp) {
        max_ulp = e;
        worst_x = x[i];
      }
    }
    std::printf("  | %-10s | %3.0f ulp (x=%-12g) | %-9.3g (x=%-12g) |\n", unary_op_name(b.op),
                max_ulp, static_cast<double>(worst_x), max_abs, static_cast<double>(worst_abs_x));
    EXPECT_LE(max_ulp, b.max_ulp) << unary_op_name(b.op) << " worst x=" << worst_x;
    EXPECT_LE(max_abs, b.max_abs) << unary_op_name(b.op) << " worst x=" << worst_abs_x;
  }
}

TEST(TileKernels, UnaryF32TranscendentalRows) {
  // Broadcast, tails and in place give the same per-element values as the full-vector path.
  for (const TransBound& b : kTransBounds) {
    for (int64_t n : kSizes) {
      const std::vector<float> a = random_floats(n + 1, 99 + static_cast<uint32_t>(n));
      std::vector<float> full(n), bcast(n), io = a;
      unary_f32(b.op, full.data(), a.data(), 1, n);
      unary_f32(b.op, bcast.data(), a.data(), 0, n);
      unary_f32(b.op, io.data(), io.data(), 1, n);
      for (int64_t i = 0; i < n; ++i) {
        float one;
        unary_f32(b.op, &one, a.data() + i, 1, 1);
        ASSERT_TRUE(same_float(full[i], one)) << unary_op_name(b.op) << where("", n, i);
        ASSERT_TRUE(same_float(io[i], one)) << unary_op_name(b.op) << where("inplace", n, i);
        ASSERT_TRUE(same_float(bcast[i], full[0])) << unary_op_name(b.op) << where("bc", n, i);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Accuracy of the f32 transcendentals against the exact value (the table of docs/numerics.md).

// The function evaluated in double (the spec's formulas before their rounding to float):
// within a few 1e-16 of the exact value, about 1e-8 of an f32 ulp.
double exact_f64(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::kExp:
      return std::exp(x);
    case UnaryOp::kExpm1:
      return std::expm1(x);
    case UnaryOp::kLog:
      return std::log(x);
    case UnaryOp::kLog1p:
      return std::log1p(x);
    case UnaryOp::kTanh:
      return std::tanh(x);
    case UnaryOp::kSigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case UnaryOp::kSilu:
      return x / (1.0 + std::exp(-x));
    case UnaryOp::kGeluErf:
      return 0.5 * x * std::erfc(-x * kSqrt1_2);
    case UnaryOp::kGeluTanh:
      return x / (1.0 + std::exp(-2.0 * kSqrt2OverPi * (x + 0.044715 * x * x * x)));
    case UnaryOp::kErf:
      return std::erf(x);
    case UnaryOp::kSin:
      return std::sin(x);
    case UnaryOp::kCos:
      return std::cos(x);
    case UnaryOp::kSqrt:
      return std::sqrt(x);
    case UnaryOp::kRsqrt:
      return 1.0 / std::sqrt(x);
    case UnaryOp::kReciprocal:
      return 1.0 / x;
    default:
      return std::numeric_limits<double>::quiet_NaN();
  }
}

// The f32 ulp at magnitude m: the spacing of floats in m's binade, 2^-149 below FLT_MIN.
double f32_ulp(double m) {
  m = std::fabs(m);
  if (m < FLT_MIN) return 0x1p-149;
  int e;
  std::frexp(m, &e);  // m = f * 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

// Asserted for every input with a finite result: |got - exact| <= ulp * f32_ulp(max(|exact|,
// floor)), i.e. the error in ulps of the exact result, where a result smaller in magnitude
// than `floor` counts in ulps of `floor` (an absolute bound of ulp * f32_ulp(floor)).
// floor = FLT_MIN is the plain f32 ulp (2^-149 for subnormal results). Each bound is the
// largest error found by denser runs of this test (DVM_ULP_STRIDE, DVM_ULP_RANGE below) on
// AVX3, AVX2, SSE4 and the scalar target plus about half an ulp of headroom, rounded up
// (sqrt and reciprocal are correctly rounded).
struct UlpBound {
  UnaryOp op;
  double ulp;
  double floor;
};
constexpr UlpBound kUlpBounds[] = {
    {UnaryOp::kExp, 2, FLT_MIN},
    {UnaryOp::kExpm1, 4, FLT_MIN},
    {UnaryOp::kLog, 2, FLT_MIN},
    {UnaryOp::kLog1p, 3, FLT_MIN},
    {UnaryOp::kTanh, 2, FLT_MIN},
    {UnaryOp::kSigmoid, 3, FLT_MIN},
    // x < -87: e^x is subnormal, x * e^x keeps its absolute (not relative) accuracy.
    {UnaryOp::kSilu, 4, 0x1p-121},
    // gelu carries x^2's rounding error into its exp (FMA targets: 6.4 ulp; SSE4 and
    // scalar, no exact x^2: 11.7). gelu_tanh rounds its exponent 2y to f32 before exp:
    // the error grows like |y| ulp as x -> -inf, the result shrinking; below 2^-24 (x < -5.2)
    // it is absolute.
    {UnaryOp::kGeluErf, 13, 0x1p-24},
    {UnaryOp::kGeluTanh, 50, 0x1p-24},
    {UnaryOp::kErf, 3, FLT_MIN},
    {UnaryOp::kSin, 3, FLT_MIN},
    {UnaryOp::kCos, 3, FLT_MIN},
    {UnaryOp::kSqrt, 0.5, FLT_MIN},
    {UnaryOp::kRsqrt, 2, FLT_MIN},
    {UnaryOp::kReciprocal, 0.5, FLT_MIN},
};
// The double reference's own error (~1e-8 ulp) is allowed for on top of the bound.
constexpr double kRefSlack = 1e-6;

// Ops whose result for x = -0 is +0 (the spec: -0); every other zero result has the spec's
// sign.
bool loses_sign_of_zero(UnaryOp op) {
  return op == UnaryOp::kExpm1 || op == UnaryOp::kSin;
}

// Every 8191st bit pattern (all signs and binades, ~1000 values per binade, NaN, inf and
// subnormals included), 2^19 points evenly over [-20, 20], every bit pattern within 256 of
// the points where a kernel switches method or its result over/underflows, and specials.
// Denser runs: DVM_ULP_STRIDE=61 (the bit-pattern stride), DVM_ULP_RANGE=-8,-4 (adds every
// float in [-8, -4]) or DVM_ULP_RANGE=-20,20,31 (every 31st float in [-20, 20]).
const std::vector<float>& ulp_inputs() {
  static const std::vector<float> v = [] {
    std::vector<float> x;
    uint64_t stride = 8191;
    if (const char* e = std::getenv("DVM_ULP_STRIDE")) stride = std::max(1, std::atoi(e));
    for (uint64_t u = 0; u < (1ull << 32); u += stride) {
      x.push_back(bits_f32(static_cast<uint32_t>(u)));
    }
    float lo = 0, hi = -1;
    int step = 1;
    if (const char* e = std::getenv("DVM_ULP_RANGE")) std::sscanf(e, "%f,%f,%d", &lo, &hi, &step);
    const auto ordered = [](float f) {  // the floats in order as integers
      const int64_t u = f32_bits(f);
      return (u & 0x80000000) ? -(u & 0x7FFFFFFF) : u;
    };
    for (int64_t o = ordered(lo); lo <= hi && o <= ordered(hi); o += std::max(step, 1)) {
      x.push_back(bits_f32(static_cast<uint32_t>(o < 0 ? (0x80000000 | -o) : o)));
    }
    constexpr int kGrid = 1 << 19;
    for (int i = 0; i <= kGrid; ++i) x.push_back(static_cast<float>(-20.0 + 40.0 * i / kGrid));
    const float edges[] = {
        88.7228391f,  // ln FLT_MAX: exp overflows
        87.3365479f,  // -ln FLT_MIN: e^-x becomes subnormal
        103.278929f,  // -ln 2^-149: e^-x underflows to 0
        103.972077f,  // -ln 2^-150
        104.0f,       // Highway's Exp returns 0 below -104
        100.0f,       // ExpF/Expm1F return inf above 100
        1.0f,         // log1p's pole (-1); erf's branch point
        0.34657359f,  // expm1's branch (ln 2 / 2)
        0.625f,       // tanh switches from its polynomial to exp
        9.5f,         // erfc is 0 beyond
        13.2f,        // gelu's result becomes subnormal
        14.5f,        // gelu clamps |x| (e^(-x^2/2) is 0 beyond)
        39000.0f,     // sin/cos use the scalar spec beyond
        FLT_MIN,      // subnormal inputs below
    };
    for (float c : edges) {
      for (float s : {c, -c}) {
        const int64_t b = f32_bits(s);
        for (int64_t k = -256; k <= 256; ++k) x.push_back(bits_f32(static_cast<uint32_t>(b + k)));
      }
    }
    for (float s : specials()) x.push_back(s);
    for (float s : {bits_f32(0x7F800001u), bits_f32(0xFFC12345u), bits_f32(0x007FFFFFu),
                    bits_f32(0x807FFFFFu), std::nextafter(FLT_MAX, 0.0f)}) {
      x.push_back(s);
    }
    return x;
  }();
  return v;
}

// The f32 transcendentals within kUlpBounds of the exact value, on every compiled target this
// machine runs; NaN and infinite results (NaN or inf in, overflow, poles, domain errors) and
// the sign of zero results are the spec's exactly.
TEST(UlpBounds, TranscendentalsWithinDocumentedBounds) {
  const std::vector<float>& x = ulp_inputs();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> t(x.size());
  std::vector<float> y(x.size());
  std::printf("  %lld inputs; max error in ulps (worst x), bound\n", static_cast<long long>(n));
  for (const UlpBound& b : kUlpBounds) {
    const char* name = unary_op_name(b.op);
    for (size_t i = 0; i < x.size(); ++i) t[i] = exact_f64(b.op, x[i]);
    // The measure is not vacuous: the result times 1 + 8 * ulp * 2^-23 must exceed the bound.
    const double off = 1.0 + 8 * b.ulp * 0x1p-23;
    hwy::SetSupportedTargetsForTest(0);
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      if (target == HWY_SSSE3 || target == HWY_AVX3_DL) continue;  // not compiled
      hwy::SetSupportedTargetsForTest(target);
      unary_f32(b.op, y.data(), x.data(), 1, n);
      double max_err = 0, max_off = 0;
      float worst_x = 0;
      int64_t bad = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const float got = y[i];
        if (!std::isfinite(t[i]) || !std::isfinite(static_cast<float>(t[i])) ||
            !std::isfinite(got) || (t[i] == 0 && !loses_sign_of_zero(b.op))) {
          const float want = ops::unary_f32(b.op, x[i]);
          if (!same_float(got, want) && bad++ < 5) {
            ADD_FAILURE() << name << " on " << simd_target_name() << ": x=" << x[i] << " got "
                          << got << " want " << want;
          }
          continue;
        }
        const double unit = f32_ulp(std::max(std::fabs(t[i]), b.floor));
        const double e = std::fabs(static_cast<double>(got) - t[i]) / unit;
        if (e > max_err) {
          max_err = e;
          worst_x = x[i];
        }
        max_off = std::max(max_off, std::fabs(got * off - t[i]) / unit);
      }
      std::printf("  | %-10s | %-6s | %6.3f (x=%-14.9g) | %g |\n", name, simd_target_name(),
                  max_err, static_cast<double>(worst_x), b.ulp);
      EXPECT_LE(max_err, b.ulp + kRefSlack)
          << name << " on " << simd_target_name() << ": worst x=" << worst_x;
      EXPECT_GT(max_off, b.ulp) << name;
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The gelus never make a subnormal result (each one costs a microcode assist per instruction
// on cores without flush-to-zero: 27% of gelu(x @ W + b)'s time with wide pre-activations):
// their tails below the documented absolute floor come out as signed zeros instead.
TEST(TileKernels, GelusMakeNoSubnormals) {
  std::vector<float> x;
  for (float v = -16.0f; v <= 16.0f; v += 1.0f / 64) x.push_back(v);
  for (float v : {-13.3f, -13.25f, -12.95f, -10.5f, -10.0f, -9.5f}) x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size());
  hwy::SetSupportedTargetsForTest(0);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (target == HWY_SSSE3 || target == HWY_AVX3_DL) continue;  // not compiled
    hwy::SetSupportedTargetsForTest(target);
    for (UnaryOp op : {UnaryOp::kGeluErf, UnaryOp::kGeluTanh}) {
      unary_f32(op, y.data(), x.data(), 1, n);
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_NE(std::fpclassify(y[i]), FP_SUBNORMAL)
            << unary_op_name(op) << " on " << simd_target_name() << ": x=" << x[i];
        if (x[i] <= -13.0f) {
          EXPECT_TRUE(y[i] == 0 && std::signbit(y[i])) << unary_op_name(op) << ": x=" << x[i];
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(TileKernels, PredicatesF32) {
  for (UnaryOp op : {UnaryOp::kIsFinite, UnaryOp::kIsNan, UnaryOp::kLogicalNot}) {
    for (int64_t n : kSizes) {
      const std::vector<float> a = random_floats(n + 1, 5 + static_cast<uint32_t>(n));
      for (int ainc : {0, 1}) {
        std::vector<int32_t> dst(n + 1, 77);
        predicate_f32(op, dst.data(), a.data(), ainc, n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(dst[i], ops::predicate_f32(op, a[ainc ? i : 0]))
              << unary_op_name(op) << where("", n, i, ainc);
        }
        EXPECT_EQ(dst[n], 77);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Binary f32

// Bit-exact against the spec (pow: within 1 ulp, PowWithinOneUlpOfTheSpec).
constexpr BinaryOp kArith[] = {BinaryOp::kAdd,      BinaryOp::kSub,      BinaryOp::kMul,
                               BinaryOp::kDiv,      BinaryOp::kMaximum,  BinaryOp::kMinimum,
                               BinaryOp::kFloorDiv, BinaryOp::kRemainder};
constexpr BinaryOp kCompare[] = {BinaryOp::kEq,         BinaryOp::kNe,       BinaryOp::kLt,
                                 BinaryOp::kLe,         BinaryOp::kGt,       BinaryOp::kGe,
                                 BinaryOp::kLogicalAnd, BinaryOp::kLogicalOr};

TEST(TileKernels, BinaryF32Exact) {
  for (BinaryOp op : kArith) {
    for (int64_t n : kSizes) {
      std::vector<float> a = random_floats(n + 1, 1 + static_cast<uint32_t>(n));
      std::vector<float> b = random_floats(n + 1, 1000 + static_cast<uint32_t>(n));
      for (int ainc : {0, 1}) {
        for (int binc : {0, 1}) {
          std::vector<float> dst(n + 1, 4321.0f);
          binary_f32(op, dst.data(), a.data(), ainc, b.data(), binc, n);
          for (int64_t i = 0; i < n; ++i) {
            const float x = a[ainc ? i : 0], y = b[binc ? i : 0];
            const float want = ops::binary_f32(op, x, y);
            ASSERT_TRUE(same_float(dst[i], want))
                << binary_op_name(op) << where("", n, i, ainc, binc) << " a=" << x << " b=" << y
                << " got " << dst[i] << " want " << want;
          }
          EXPECT_EQ(dst[n], 4321.0f);
        }
      }
      // In place on either operand.
      std::vector<float> io = a;
      binary_f32(op, io.data(), io.data(), 1, b.data(), 1, n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_TRUE(same_float(io[i], ops::binary_f32(op, a[i], b[i])));
      io = b;
      binary_f32(op, io.data(), a.data(), 1, io.data(), 1, n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_TRUE(same_float(io[i], ops::binary_f32(op, a[i], b[i])));
    }
  }
}

// pow's vector path (a double exp of y * log|x|) rounds to the spec's float except next to a
// rounding boundary (1 ulp); IEEE pow's special cases (zeros, infinities, NaNs, negative bases
// with integer and other exponents, overflow, underflow into subnormals) exactly.
TEST(TileKernels, PowWithinOneUlpOfTheSpec) {
  const auto check = [](const std::vector<float>& a, const std::vector<float>& b, double bound,
                        const char* what) {
    const int64_t n = static_cast<int64_t>(a.size());
    hwy::SetSupportedTargetsForTest(0);
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      if (target == HWY_SSSE3 || target == HWY_AVX3_DL) continue;  // not compiled
      hwy::SetSupportedTargetsForTest(target);
      for (int ainc : {0, 1}) {
        for (int binc : {0, 1}) {
          std::vector<float> dst(a.size() + 1, 4321.0f);
          binary_f32(BinaryOp::kPow, dst.data(), a.data(), ainc, b.data(), binc, n);
          for (int64_t i = 0; i < n; ++i) {
            const float x = a[ainc ? i : 0], y = b[binc ? i : 0];
            const float want = ops::binary_f32(BinaryOp::kPow, x, y);
            ASSERT_LE(ulp_diff(dst[i], want), bound)
                << what << hwy::TargetName(target) << where("", n, i, ainc, binc) << " x=" << x
                << " y=" << y << " got " << dst[i] << " want " << want;
          }
          EXPECT_EQ(dst[a.size()], 4321.0f);
        }
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  };
  // Every pair of these, each vector of 16 holding one special or unusual lane at most.
  const std::vector<float> sx = {0.0f, -0.0f, 1.0f,   -1.0f, kInf,   -kInf, kNaN,  2.0f,   -2.0f,
                                 0.5f, -0.5f, 1e-40f, 3e38f, -3e38f, 10.0f, -3.0f, 1.001f, 0.9999f};
  const std::vector<float> sy = {0.0f,   -0.0f,   1.0f,  -1.0f, 2.0f,       3.0f,  -3.0f,
                                 0.5f,   -0.5f,   kInf,  -kInf, kNaN,       1e10f, -1e10f,
                                 127.5f, -140.0f, 40.0f, 1e-8f, 16777217.0f};
  std::vector<float> gx, gy;
  for (float x : sx) {
    for (float y : sy) {
      for (int k = 0; k < 15; ++k) {  // vectors of usual lanes around it
        gx.push_back(1.5f + static_cast<float>(k));
        gy.push_back(0.25f * static_cast<float>(k));
      }
      gx.push_back(x);
      gy.push_back(y);
    }
  }
  check(gx, gy, 1, "specials ");
  for (int64_t n : kSizes) {
    // Mixed signs and magnitudes (negative bases: NaN but for integer exponents)...
    check(random_floats(n + 1, 7 + static_cast<uint32_t>(n)),
          random_floats(n + 1, 700 + static_cast<uint32_t>(n)), 1, "random ");
    // ... positive bases over many decades, and integer exponents of negative bases.
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::uniform_real_distribution<float> lg(-12.0f, 12.0f), ex(-9.0f, 9.0f);
    std::vector<float> x(static_cast<size_t>(n) + 1), y(x.size()), xn(x.size()), yi(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = std::exp(lg(rng));
      y[i] = ex(rng);
      xn[i] = -x[i];
      yi[i] = std::round(ex(rng));
    }
    check(x, y, 1, "positive ");
    check(xn, yi, 1, "negative, integer y ");
  }
}

TEST(TileKernels, PowSquareFastPathIsExact) {
  const std::vector<float> a = random_floats(4099, 3);
  const float two = 2.0f;
  std::vector<float> dst(a.size());
  binary_f32(BinaryOp::kPow, dst.data(), a.data(), 1, &two, 0, 4099);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(same_float(dst[i], ops::binary_f32(BinaryOp::kPow, a[i], 2.0f))) << a[i];
  }
}

TEST(TileKernels, MaxMinPropagateNaN) {
  const float a[] = {kNaN, 1.0f, kNaN, -kInf, 3.0f, 2.0f, 0.0f, -0.0f, 5, 5, 5, 5, 5, 5, 5, 5, 5};
  const float b[] = {1.0f, kNaN, kNaN, kNaN, 2.0f, 3.0f, -0.0f, 0.0f, 5, 5, 5, 5, 5, 5, 5, 5, 5};
  float mx[17], mn[17];
  binary_f32(BinaryOp::kMaximum, mx, a, 1, b, 1, 17);
  binary_f32(BinaryOp::kMinimum, mn, a, 1, b, 1, 17);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(mx[i]) && std::isnan(mn[i])) << i;
  EXPECT_EQ(mx[4], 3.0f);
  EXPECT_EQ(mx[5], 3.0f);
  EXPECT_EQ(mn[4], 2.0f);
}

// torch.sign: NaN and -0 give +0 (not NaN, not -0), in the spec and the SIMD kernel (a full
// vector and a tail).
TEST(TileKernels, SignOfNaNAndZeroIsPositiveZero) {
  const float a[] = {kNaN, -kNaN, -0.0f, 0.0f, -kInf, kInf, -2.5f, 2.5f, 5,
                     5,    5,     5,     5,    5,     5,    5,     kNaN};
  const float want[] = {0, 0, 0, 0, -1, 1, -1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
  float y[17];
  unary_f32(UnaryOp::kSign, y, a, 1, 17);
  for (int i = 0; i < 17; ++i) {
    EXPECT_TRUE(same_float(y[i], want[i])) << i << ": " << y[i];
    EXPECT_TRUE(same_float(ops::unary_f32(UnaryOp::kSign, a[i]), want[i])) << i;
  }
}

TEST(TileKernels, FloorDivRemainderF32Semantics) {
  EXPECT_EQ(ops::binary_f32(BinaryOp::kFloorDiv, -7.0f, 2.0f), -4.0f);
  EXPECT_EQ(ops::binary_f32(BinaryOp::kFloorDiv, 7.0f, -2.0f), -4.0f);
  EXPECT_EQ(ops::binary_f32(BinaryOp::kRemainder, -7.0f, 2.0f), 1.0f);
  EXPECT_EQ(ops::binary_f32(BinaryOp::kRemainder, 7.0f, -2.0f), -1.0f);
  EXPECT_EQ(ops::binary_f32(BinaryOp::kFloorDiv, 1.0f, 0.0f), kInf);
  EXPECT_TRUE(std::isnan(ops::binary_f32(BinaryOp::kRemainder, 1.0f, 0.0f)));
}

TEST(TileKernels, CompareF32) {
  for (BinaryOp op : kCompare) {
    for (int64_t n : kSizes) {
      std::vector<float> a = random_floats(n + 1, 11 + static_cast<uint32_t>(n));
      std::vector<float> b = random_floats(n + 1, 12 + static_cast<uint32_t>(n));
      for (int64_t i = 0; i < n; i += 3) b[i] = a[i];  // equal pairs
      for (int ainc : {0, 1}) {
        for (int binc : {0, 1}) {
          std::vector<int32_t> dst(n + 1, 9);
          compare_f32(op, dst.data(), a.data(), ainc, b.data(), binc, n);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(dst[i], ops::compare_f32(op, a[ainc ? i : 0], b[binc ? i : 0]))
                << binary_op_name(op) << where("", n, i, ainc, binc);
          }
          EXPECT_EQ(dst[n], 9);
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Integers

template <typename T>
std::vector<T> random_ints(int64_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  const T edge[] = {0,
                    1,
                    -1,
                    2,
                    -2,
                    7,
                    -7,
                    std::numeric_limits<T>::min(),
                    std::numeric_limits<T>::max(),
                    static_cast<T>(std::numeric_limits<T>::min() + 1)};
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    switch (r % 4) {
      case 0:
        v[i] = edge[(r >> 8) % 10];
        break;
      case 1:
        v[i] = static_cast<T>(static_cast<int64_t>((r >> 8) % 41) - 20);
        break;
      default:
        v[i] = static_cast<T>(r >> 3);
        break;
    }
  }
  return v;
}

template <typename T, typename KU, typename SU>
void check_unary_int(KU kernel, SU spec) {
  for (UnaryOp op : {UnaryOp::kNeg, UnaryOp::kAbs, UnaryOp::kRelu, UnaryOp::kSign, UnaryOp::kFloor,
                     UnaryOp::kCeil, UnaryOp::kRound, UnaryOp::kTrunc}) {
    for (int64_t n : kSizes) {
      const std::vector<T> a = random_ints<T>(n + 1, 7 + static_cast<uint32_t>(n));
      for (int ainc : {0, 1}) {
        std::vector<T> dst(n + 1, 55);
        kernel(op, dst.data(), a.data(), ainc, n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(dst[i], spec(op, a[ainc ? i : 0]))
              << unary_op_name(op) << where("", n, i, ainc);
        }
        EXPECT_EQ(dst[n], 55);
      }
      std::vector<T> io = a;
      kernel(op, io.data(), io.data(), 1, n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(io[i], spec(op, a[i]));
    }
  }
}

TEST(TileKernels, UnaryInt) {
  check_unary_int<int32_t>(unary_i32, ops::unary_i32);
  check_unary_int<int64_t>(unary_i64, ops::unary_i64);
  EXPECT_EQ(ops::unary_i32(UnaryOp::kNeg, INT_MIN), INT_MIN);
  EXPECT_EQ(ops::unary_i32(UnaryOp::kAbs, INT_MIN), INT_MIN);
  EXPECT_EQ(ops::unary_i64(UnaryOp::kSign, -5), -1);
}

TEST(TileKernels, PredicatesInt) {
  for (UnaryOp op : {UnaryOp::kIsFinite, UnaryOp::kIsNan, UnaryOp::kLogicalNot}) {
    for (int64_t n : kSizes) {
      const auto a32 = random_ints<int32_t>(n + 1, 3);
      const auto a64 = random_ints<int64_t>(n + 1, 4);
      for (int ainc : {0, 1}) {
        std::vector<int32_t> d32(n), d64(n);
        predicate_i32(op, d32.data(), a32.data(), ainc, n);
        predicate_i64(op, d64.data(), a64.data(), ainc, n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(d32[i], ops::predicate_i32(op, a32[ainc ? i : 0]));
          ASSERT_EQ(d64[i], ops::predicate_i64(op, a64[ainc ? i : 0]));
        }
      }
    }
  }
}

template <typename T, typename KB, typename SB, typename KC, typename SC>
void check_binary_int(KB kernel, SB spec, KC kcmp, SC scmp) {
  for (int64_t n : kSizes) {
    const std::vector<T> a = random_ints<T>(n + 1, 21 + static_cast<uint32_t>(n));
    std::vector<T> b = random_ints<T>(n + 1, 22 + static_cast<uint32_t>(n));
    for (int64_t i = 0; i < n; i += 5) b[i] = a[i];
    for (int ainc : {0, 1}) {
      for (int binc : {0, 1}) {
        for (BinaryOp op : kArith) {
          std::vector<T> dst(n + 1, 66);
          kernel(op, dst.data(), a.data(), ainc, b.data(), binc, n);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(dst[i], spec(op, a[ainc ? i : 0], b[binc ? i : 0]))
                << binary_op_name(op) << where("", n, i, ainc, binc);
          }
          EXPECT_EQ(dst[n], 66);
        }
        for (BinaryOp op : kCompare) {
          std::vector<int32_t> dst(n + 1, 66);
          kcmp(op, dst.data(), a.data(), ainc, b.data(), binc, n);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(dst[i], scmp(op, a[ainc ? i : 0], b[binc ? i : 0]))
                << binary_op_name(op) << where("", n, i, ainc, binc);
          }
        }
      }
    }
    for (BinaryOp op : kArith) {
      std::vector<T> io = a;
      kernel(op, io.data(), io.data(), 1, b.data(), 1, n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(io[i], spec(op, a[i], b[i]));
    }
  }
}

TEST(TileKernels, BinaryInt) {
  check_binary_int<int32_t>(binary_i32, ops::binary_i32, compare_i32, ops::compare_i32);
  check_binary_int<int64_t>(binary_i64, ops::binary_i64, compare_i64, ops::compare_i64);
}

TEST(TileKernels, IntegerSemantics) {
  using ops::binary_i32;
  EXPECT_EQ(binary_i32(BinaryOp::kFloorDiv, -7, 2), -4);
  EXPECT_EQ(binary_i32(BinaryOp::kFloorDiv, 7, -2), -4);
  EXPECT_EQ(binary_i32(BinaryOp::kFloorDiv, -8, 2), -4);
  EXPECT_EQ(binary_i32(BinaryOp::kRemainder, -7, 2), 1);
  EXPECT_EQ(binary_i32(BinaryOp::kRemainder, 7, -2), -1);
  EXPECT_EQ(binary_i32(BinaryOp::kRemainder, -8, 2), 0);
  EXPECT_EQ(binary_i32(BinaryOp::kFloorDiv, 5, 0), 0);
  EXPECT_EQ(binary_i32(BinaryOp::kRemainder, 5, 0), 0);
  EXPECT_EQ(binary_i32(BinaryOp::kDiv, 5, 0), 0);
  EXPECT_EQ(binary_i32(BinaryOp::kFloorDiv, INT_MIN, -1), INT_MIN);
  EXPECT_EQ(binary_i32(BinaryOp::kRemainder, INT_MIN, -1), 0);
  EXPECT_EQ(binary_i32(BinaryOp::kAdd, INT_MAX, 1), INT_MIN);
  EXPECT_EQ(binary_i32(BinaryOp::kMul, 65536, 65536), 0);
  EXPECT_EQ(binary_i32(BinaryOp::kPow, 2, 10), 1024);
  EXPECT_EQ(binary_i32(BinaryOp::kPow, 3, 0), 1);
  EXPECT_EQ(binary_i32(BinaryOp::kPow, 2, -1), 0);
  EXPECT_EQ(binary_i32(BinaryOp::kPow, 1, -5), 1);
  EXPECT_EQ(binary_i32(BinaryOp::kPow, -1, -3), -1);
  EXPECT_EQ(binary_i32(BinaryOp::kPow, -1, -4), 1);
  EXPECT_EQ(binary_i32(BinaryOp::kPow, 2, 31), INT_MIN);
  EXPECT_EQ(ops::binary_i64(BinaryOp::kPow, -3, 3), -27);
  EXPECT_EQ(ops::compare_i32(BinaryOp::kLogicalAnd, 2, -1), 1);
  EXPECT_EQ(ops::compare_i32(BinaryOp::kLogicalOr, 0, 0), 0);
  EXPECT_EQ(ops::compare_f32(BinaryOp::kLogicalAnd, kNaN, 1.0f), 1);
}

// ------------------------------------------------------------------------------------------
// Select, fma

TEST(TileKernels, Select) {
  for (int64_t n : kSizes) {
    const auto c = random_ints<int32_t>(n + 1, 31);
    const auto a4 = random_ints<int32_t>(n + 1, 32);
    const auto b4 = random_ints<int32_t>(n + 1, 33);
    const auto a8 = random_ints<int64_t>(n + 1, 34);
    const auto b8 = random_ints<int64_t>(n + 1, 35);
    for (int cinc : {0, 1}) {
      for (int ainc : {0, 1}) {
        for (int binc : {0, 1}) {
          std::vector<int32_t> d4(n + 1, 3);
          std::vector<int64_t> d8(n + 1, 3);
          select(4, d4.data(), c.data(), cinc, a4.data(), ainc, b4.data(), binc, n);
          select(8, d8.data(), c.data(), cinc, a8.data(), ainc, b8.data(), binc, n);
          for (int64_t i = 0; i < n; ++i) {
            const bool t = c[cinc ? i : 0] != 0;
            ASSERT_EQ(d4[i], t ? a4[ainc ? i : 0] : b4[binc ? i : 0])
                << where("4", n, i, ainc, binc);
            ASSERT_EQ(d8[i], t ? a8[ainc ? i : 0] : b8[binc ? i : 0])
                << where("8", n, i, ainc, binc);
          }
          EXPECT_EQ(d4[n], 3);
          EXPECT_EQ(d8[n], 3);
        }
      }
    }
    // In place (dst aliases a) with float payloads incl. NaN bit patterns.
    std::vector<float> fa = random_floats(n, 36), fb = random_floats(n, 37), io = fa;
    select(4, io.data(), c.data(), 1, io.data(), 1, fb.data(), 1, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_float(io[i], c[i] ? fa[i] : fb[i]));
  }
}

TEST(TileKernels, Fma) {
  for (int64_t n : kSizes) {
    const auto a = random_floats(n + 1, 41), b = random_floats(n + 1, 42),
               c = random_floats(n + 1, 43);
    for (int mask = 0; mask < 8; ++mask) {
      const int ai = mask & 1, bi = (mask >> 1) & 1, ci = (mask >> 2) & 1;
      std::vector<float> d(n + 1, 8.0f);
      fma_f32(d.data(), a.data(), ai, b.data(), bi, c.data(), ci, n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = std::fma(a[ai ? i : 0], b[bi ? i : 0], c[ci ? i : 0]);
        ASSERT_TRUE(same_float(d[i], want)) << where("fma", n, i, ai, bi);
      }
      EXPECT_EQ(d[n], 8.0f);
    }
    std::vector<float> io = c;
    fma_f32(io.data(), a.data(), 1, b.data(), 1, io.data(), 1, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_float(io[i], std::fma(a[i], b[i], c[i])));
  }
}

// ------------------------------------------------------------------------------------------
// Conversions

TEST(TileKernels, Convert) {
  for (int64_t n : kSizes) {
    std::vector<float> f = random_floats(n + 1, 51, -5e9f, 5e9f);
    for (int64_t i = 0; i < n; i += 4) f[i] = std::ldexp(f[i], 40);  // beyond i64 too
    const auto i32 = random_ints<int32_t>(n + 1, 52);
    const auto i64 = random_ints<int64_t>(n + 1, 53);
    for (int sinc : {0, 1}) {
      std::vector<float> of(n);
      std::vector<int32_t> oi(n);
      std::vector<int64_t> ol(n);
      convert(CType::kI32, oi.data(), CType::kF32, f.data(), sinc, n);
      convert(CType::kI64, ol.data(), CType::kF32, f.data(), sinc, n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(oi[i], f32_to_i32(f[sinc ? i : 0]));
        ASSERT_EQ(ol[i], f32_to_i64(f[sinc ? i : 0]));
      }
      convert(CType::kF32, of.data(), CType::kI32, i32.data(), sinc, n);
      convert(CType::kI64, ol.data(), CType::kI32, i32.data(), sinc, n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(of[i], static_cast<float>(i32[sinc ? i : 0]));
        ASSERT_EQ(ol[i], i32[sinc ? i : 0]);
      }
      convert(CType::kF32, of.data(), CType::kI64, i64.data(), sinc, n);
      convert(CType::kI32, oi.data(), CType::kI64, i64.data(), sinc, n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(of[i], static_cast<float>(i64[sinc ? i : 0]));
        ASSERT_EQ(oi[i], i64_to_i32(i64[sinc ? i : 0]));
      }
      convert(CType::kF32, of.data(), CType::kF32, f.data(), sinc, n);
      for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_float(of[i], f[sinc ? i : 0]));
    }
  }
  EXPECT_EQ(f32_to_i32(kNaN), 0);
  EXPECT_EQ(f32_to_i32(3e9f), INT_MAX);
  EXPECT_EQ(f32_to_i32(-3e9f), INT_MIN);
  EXPECT_EQ(f32_to_i32(-kInf), INT_MIN);
  EXPECT_EQ(f32_to_i32(-2.9f), -2);
  EXPECT_EQ(f32_to_i32(2147483520.0f), 2147483520);
  EXPECT_EQ(f32_to_i64(1e30f), INT64_MAX);
  EXPECT_EQ(f32_to_i64(-9.3e18f), INT64_MIN);
  EXPECT_EQ(i64_to_i32((int64_t{1} << 32) + 5), 5);
  EXPECT_EQ(i64_to_i32(int64_t{0xFFFFFFFF}), -1);
}

TEST(TileKernels, F16AndBf16) {
  // Every f16 / bf16 value round-trips through f32.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_bits_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(f)))) << h;
    } else {
      ASSERT_EQ(f32_to_f16_bits(f), h) << h;
    }
    const float g = bf16_bits_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(g)) {
      ASSERT_TRUE(std::isnan(round_bf16(g)));
    } else {
      ASSERT_EQ(f32_to_bf16_bits(g), h) << h;
    }
  }
  // Ties to even, subnormals, overflow.
  EXPECT_EQ(round_f16(1.0f + std::ldexp(1.0f, -11)), 1.0f);
  EXPECT_EQ(round_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp tie -> even
  EXPECT_EQ(f32_to_f16_bits(-std::ldexp(1.0f, -14)), 0x8400);
  EXPECT_EQ(round_f16(65504.0f), 65504.0f);
  EXPECT_EQ(round_f16(65519.0f), 65504.0f);
  EXPECT_EQ(round_f16(65520.0f), kInf);
  EXPECT_EQ(round_f16(-1e6f), -kInf);
  EXPECT_EQ(round_f16(1e-10f), 0.0f);
  EXPECT_TRUE(std::signbit(round_f16(-1e-10f)));
  EXPECT_TRUE(std::isnan(round_f16(kNaN)));
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(round_bf16(FLT_MAX), kInf);
  EXPECT_EQ(round_bf16(1e-45f), 0.0f);  // below half the smallest bf16 subnormal
  EXPECT_EQ(round_bf16(1e-40f), bf16_bits_to_f32(0x0001));
  EXPECT_TRUE(std::isnan(round_bf16(kNaN)));
  // A dense sweep of f32 against the definition: the result is one of the two neighbours and
  // the nearer one (ties: even mantissa).
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
    const float x = bits_f32(static_cast<uint32_t>(u));
    if (std::isnan(x) || std::fabs(x) > 65504.0f) continue;
    const float r = round_f16(x);
    const double e = std::fabs(static_cast<double>(r) - x);
    const uint16_t h = f32_to_f16_bits(x);
    const float other = f16_bits_to_f32(static_cast<uint16_t>(h ^ 1));
    ASSERT_LE(e, std::fabs(static_cast<double>(other) - x)) << x;
  }
  // Row kernels.
  for (int64_t n : kSizes) {
    const auto a = random_floats(n + 1, 61, -7e4f, 7e4f);
    for (int ainc : {0, 1}) {
      std::vector<float> d16(n), db(n);
      round_to_f16(d16.data(), a.data(), ainc, n);
      round_to_bf16(db.data(), a.data(), ainc, n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(same_float(d16[i], round_f16(a[ainc ? i : 0])));
        ASSERT_TRUE(same_float(db[i], round_bf16(a[ainc ? i : 0])));
      }
    }
  }
}

// Store every dtype through a strided scatter, load it back through a strided gather.
TEST(TileKernels, LoadStoreConvert) {
  for (int64_t n : kSizes) {
    const auto f = random_floats(n + 1, 71, -1e5f, 1e5f);
    const auto i32 = random_ints<int32_t>(n + 1, 72);
    const auto i64 = random_ints<int64_t>(n + 1, 73);
    for (int64_t stride : {1, 3}) {
      for (int sinc : {0, 1}) {
        for (DType t :
             {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kBool}) {
          const int sz = dtype_size(t);
          std::vector<uint8_t> mem(static_cast<size_t>((n + 1) * stride * sz + 8), 0xAB);
          const void* src = compute_type(t) == CType::kF32   ? static_cast<const void*>(f.data())
                            : compute_type(t) == CType::kI32 ? static_cast<const void*>(i32.data())
                                                             : static_cast<const void*>(i64.data());
          store_convert(t, mem.data(), stride, src, sinc, n);
          std::vector<int64_t> back(static_cast<size_t>(n) + 1);
          load_convert(back.data(), t, mem.data(), stride, n);
          for (int64_t i = 0; i < n; ++i) {
            const int64_t j = sinc ? i : 0;
            const std::string w = std::string(dtype_name(t)) + where("", n, i, sinc);
            switch (t) {
              case DType::kF32:
                ASSERT_TRUE(same_float(reinterpret_cast<float*>(back.data())[i], f[j])) << w;
                break;
              case DType::kF16:
                ASSERT_TRUE(same_float(reinterpret_cast<float*>(back.data())[i], round_f16(f[j])))
                    << w;
                break;
              case DType::kBF16:
                ASSERT_TRUE(same_float(reinterpret_cast<float*>(back.data())[i], round_bf16(f[j])))
                    << w;
                break;
              case DType::kI32:
                ASSERT_EQ(reinterpret_cast<int32_t*>(back.data())[i], i32[j]) << w;
                break;
              case DType::kBool:
                ASSERT_EQ(mem[static_cast<size_t>(i * stride)], i32[j] != 0 ? 1 : 0) << w;
                ASSERT_EQ(reinterpret_cast<int32_t*>(back.data())[i], i32[j] != 0 ? 1 : 0) << w;
                break;
              case DType::kI64:
                ASSERT_EQ(back[i], i64[j]) << w;
                break;
            }
            // Gaps between strided elements are untouched.
            if (stride > 1) {
              ASSERT_EQ(mem[static_cast<size_t>((i * stride + 1) * sz)], 0xAB) << w;
            }
          }
          ASSERT_EQ(mem[static_cast<size_t>(n * stride * sz)], 0xAB) << "wrote past the row";
        }
      }
    }
  }
  // Bool bytes other than 0/1 load as 1; a broadcast load (stride 0) repeats element 0.
  const uint8_t bytes[] = {2, 0, 255};
  int32_t out[3];
  load_convert(out, DType::kBool, bytes, 1, 3);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 0);
  EXPECT_EQ(out[2], 1);
  const uint16_t h = f32_to_f16_bits(1.5f);
  float fo[5];
  load_convert(fo, DType::kF16, &h, 0, 5);
  for (float v : fo) EXPECT_EQ(v, 1.5f);
}

// ------------------------------------------------------------------------------------------
// Reductions

TEST(TileKernels, ReduceRowF32) {
  for (int64_t n : kSizes) {
    const auto a = random_floats(n + 1, 81, -1.0f, 1.0f);
    std::vector<float> clean(a.size());
    std::mt19937 rng(82);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), near1(0.95f, 1.05f);
    for (auto& v : clean) v = u(rng);
    std::vector<float> prodin(a.size());
    for (auto& v : prodin) v = near1(rng);
    for (int ainc : {0, 1}) {
      // Sum: relative to a double-accumulated sum.
      float acc = 0.25f;
      reduce_row_f32(ReduceOp::kSum, &acc, clean.data(), ainc, n);
      double want = 0.25, mag = 0.25;
      for (int64_t i = 0; i < n; ++i) {
        want += clean[ainc ? i : 0];
        mag += std::fabs(clean[ainc ? i : 0]);
      }
      EXPECT_LE(std::fabs(acc - want), 1e-5 * mag) << where("sum", n, 0, ainc);
      // Deterministic.
      float acc2 = 0.25f;
      reduce_row_f32(ReduceOp::kSum, &acc2, clean.data(), ainc, n);
      EXPECT_TRUE(same_float(acc, acc2));
      // Prod.
      float p = 1.0f;
      reduce_row_f32(ReduceOp::kProd, &p, prodin.data(), ainc, n);
      double wp = 1.0;
      for (int64_t i = 0; i < n; ++i) wp *= prodin[ainc ? i : 0];
      if (std::fabs(wp) < 1e30 && std::fabs(wp) > 1e-30) {
        EXPECT_LE(std::fabs(p - wp), 2e-6 * static_cast<double>(n + 1) * std::fabs(wp))
            << where("prod", n, 0, ainc);
      } else {
        EXPECT_TRUE(std::isinf(p) || p == 0.0f || std::fabs(p - wp) <= 1e-6 * std::fabs(wp));
      }
      // Max / Min with NaN and specials: same as the sequential scalar fold.
      for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
        const std::vector<float>* srcs[] = {&a, &clean};
        for (const std::vector<float>* src : srcs) {
          float m = reduce_identity<float>(op);
          reduce_row_f32(op, &m, src->data(), ainc, n);
          float wm = reduce_identity<float>(op);
          for (int64_t i = 0; i < n; ++i) wm = reduce_combine_f32(op, wm, (*src)[ainc ? i : 0]);
          EXPECT_TRUE(std::isnan(m) ? std::isnan(wm) : m == wm)
              << reduce_op_name(op) << where("", n, 0, ainc) << " got " << m << " want " << wm;
        }
      }
      // Sum with a NaN or inf in the row.
      if (n > 0) {
        std::vector<float> s = clean;
        s[static_cast<size_t>(n - 1)] = kNaN;
        float sn = 0.0f;
        reduce_row_f32(ReduceOp::kSum, &sn, s.data(), 1, n);
        EXPECT_TRUE(std::isnan(sn));
        s[static_cast<size_t>(n - 1)] = kInf;
        float si = 0.0f;
        reduce_row_f32(ReduceOp::kSum, &si, s.data(), 1, n);
        EXPECT_EQ(si, kInf);
      }
    }
  }
}

template <typename T, typename KR, typename KA>
void check_reduce_int(KR reduce_row, KA accumulate) {
  for (int64_t n : kSizes) {
    const auto a = random_ints<T>(n + 1, 91);
    for (int ainc : {0, 1}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin}) {
        T acc = 3;
        reduce_row(op, &acc, a.data(), ainc, n);
        T want = 3;
        for (int64_t i = 0; i < n; ++i) want = reduce_combine_int<T>(op, want, a[ainc ? i : 0]);
        ASSERT_EQ(acc, want) << reduce_op_name(op) << where("", n, 0, ainc);
        std::vector<T> v = random_ints<T>(n, 92), w = v;
        accumulate(op, v.data(), a.data(), ainc, n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(v[i], reduce_combine_int<T>(op, w[i], a[ainc ? i : 0]));
        }
      }
    }
  }
}

TEST(TileKernels, ReduceInt) {
  check_reduce_int<int32_t>(reduce_row_i32, accumulate_i32);
  check_reduce_int<int64_t>(reduce_row_i64, accumulate_i64);
}

TEST(TileKernels, AccumulateF32) {
  for (int64_t n : kSizes) {
    const auto a = random_floats(n + 1, 101);
    for (int ainc : {0, 1}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin}) {
        std::vector<float> acc = random_floats(n + 1, 102), orig = acc;
        accumulate_f32(op, acc.data(), a.data(), ainc, n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(same_float(acc[i], reduce_combine_f32(op, orig[i], a[ainc ? i : 0])))
              << reduce_op_name(op) << where("", n, i, ainc);
        }
        ASSERT_TRUE(same_float(acc[n], orig[n]));
      }
    }
  }
}

// Blocks of rows into one accumulator row (a column reduction's trip), in row order: the
// same bits as combining row after row, across the row groups the kernel walks.
TEST(TileKernels, AccumulateF32Rows) {
  for (int64_t rows : {1, 7, 8, 9, 17, 64}) {
    for (int64_t n : {1, 17, 64, 100}) {
      const int64_t rs = n + 3;
      const auto a = random_floats(rows * rs, 103);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        std::vector<float> acc = random_floats(n + 1, 104), want = acc;
        accumulate_f32_rows(op, Rows{rows, 0, rs}, acc.data(), a.data(), 1, n);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < n; ++i) want[i] = reduce_combine_f32(op, want[i], a[r * rs + i]);
        for (int64_t i = 0; i <= n; ++i)
          ASSERT_TRUE(same_float(acc[i], want[i]))
              << reduce_op_name(op) << " rows=" << rows << " n=" << n << " at " << i;
      }
    }
  }
}

TEST(TileKernels, FillIdentity) {
  float f[5];
  int32_t i[5];
  int64_t l[5];
  fill_identity(ReduceOp::kMax, CType::kF32, f, 5);
  fill_identity(ReduceOp::kMin, CType::kI32, i, 5);
  fill_identity(ReduceOp::kArgMax, CType::kI64, l, 5);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(f[k], -kInf);
    EXPECT_EQ(i[k], INT_MAX);
    EXPECT_EQ(l[k], INT64_MIN);
  }
  fill_identity(ReduceOp::kSum, CType::kF32, f, 5);
  fill_identity(ReduceOp::kProd, CType::kI32, i, 5);
  fill_identity(ReduceOp::kArgMin, CType::kF32, f + 4, 1);
  EXPECT_EQ(f[0], 0.0f);
  EXPECT_EQ(i[0], 1);
  EXPECT_EQ(f[4], kInf);
}

// Reference arg reduction over a whole row: first extreme wins, first NaN wins.
template <typename T>
int64_t ref_arg(ReduceOp op, const std::vector<T>& a) {
  int64_t best = 0;
  for (size_t i = 1; i < a.size(); ++i) {
    const T v = a[i], b = a[static_cast<size_t>(best)];
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(b)) continue;
      if (std::isnan(v)) {
        best = static_cast<int64_t>(i);
        continue;
      }
    }
    if (op == ReduceOp::kArgMax ? v > b : v < b) best = static_cast<int64_t>(i);
  }
  return best;
}

template <typename T, typename KR, typename KA>
void check_arg(std::vector<T> (*gen)(int64_t, uint32_t), KR argreduce_row, KA argaccumulate) {
  for (int64_t n : kSizes) {
    if (n == 0) continue;
    for (ReduceOp op : {ReduceOp::kArgMax, ReduceOp::kArgMin}) {
      std::vector<T> a = gen(n, 111 + static_cast<uint32_t>(n));
      // Row split into chunks of 7 (as tiles), accumulator starts at the identity.
      T v = reduce_identity<T>(op);
      int64_t idx = 0;
      for (int64_t s = 0; s < n; s += 7) {
        argreduce_row(op, &v, &idx, a.data() + s, 1, std::min<int64_t>(7, n - s), s);
      }
      const int64_t want = ref_arg<T>(op, a);
      ASSERT_EQ(idx, want) << reduce_op_name(op) << " n=" << n;
      // Column-wise: rows of width 5, visited in increasing index order.
      const int64_t w = 5, rows = n / w;
      if (rows == 0) continue;
      std::vector<T> va(w, reduce_identity<T>(op));
      std::vector<int64_t> ia(w, 0);
      for (int64_t r = 0; r < rows; ++r)
        argaccumulate(op, va.data(), ia.data(), a.data() + r * w, 1, w, r);
      for (int64_t c = 0; c < w; ++c) {
        std::vector<T> col;
        for (int64_t r = 0; r < rows; ++r) col.push_back(a[r * w + c]);
        ASSERT_EQ(ia[c], ref_arg<T>(op, col)) << reduce_op_name(op) << " n=" << n << " c=" << c;
      }
    }
  }
}

std::vector<float> arg_floats(int64_t n, uint32_t seed) {
  std::vector<float> v = random_floats(n, seed);
  for (auto& x : v) x = std::round(x);  // many ties
  return v;
}
std::vector<float> arg_floats_no_nan(int64_t n, uint32_t seed) {
  std::vector<float> v = arg_floats(n, seed);
  for (auto& x : v) {
    if (std::isnan(x)) x = 1.0f;
  }
  return v;
}
std::vector<int32_t> arg_i32(int64_t n, uint32_t seed) {
  auto v = random_ints<int32_t>(n, seed);
  for (auto& x : v) x %= 5;
  return v;
}
std::vector<int64_t> arg_i64(int64_t n, uint32_t seed) {
  return random_ints<int64_t>(n, seed);
}

TEST(TileKernels, ArgReduce) {
  check_arg<float>(arg_floats, argreduce_row_f32, argaccumulate_f32);
  check_arg<float>(arg_floats_no_nan, argreduce_row_f32, argaccumulate_f32);
  check_arg<int32_t>(arg_i32, argreduce_row_i32, argaccumulate_i32);
  check_arg<int64_t>(arg_i64, argreduce_row_i64, argaccumulate_i64);
  // All values equal to the identity: index of the first element.
  const float ninf[3] = {-kInf, -kInf, -kInf};
  float v = -kInf;
  int64_t i = 0;
  argreduce_row_f32(ReduceOp::kArgMax, &v, &i, ninf, 1, 3, 0);
  EXPECT_EQ(i, 0);
}

// A transposed copy against the element-by-element definition: register blocks (8 x 8),
// their row and column edges, one-element and empty shapes, strides wider than the copy;
// nothing outside the copy is written. With from_dram the source's columns are prefetched
// ahead (the same result).
TEST(TileKernels, TransposeF32) {
  for (bool from_dram : {false, true})
    for (int64_t rows : {0, 1, 3, 8, 9, 16, 23}) {
      for (int64_t cols : {0, 1, 7, 8, 17, 24, 80}) {
        const int64_t scs = rows + 5, drs = cols + 3;  // wider than the copy
        std::vector<float> src(static_cast<size_t>(std::max<int64_t>(1, cols * scs)));
        for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f - 7.0f;
        std::vector<float> dst(static_cast<size_t>(std::max<int64_t>(1, rows * drs)), -1.0f);
        transpose_f32(dst.data(), drs, src.data(), scs, rows, cols, from_dram);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < drs; ++c) {
            const float want = c < cols ? src[c * scs + r] : -1.0f;  // padding untouched
            ASSERT_EQ(dst[r * drs + c], want) << rows << "x" << cols << " at " << r << "," << c;
          }
        }
      }
    }
}

// Two fused mul-adds row by row in one pass: the same bits as the two calls apart, and
// p * q + (+-a) * b by the spec; rotary-shaped blocks (b and q shared by the rows of a block,
// 1 to 4 vectors wide), wider and tail rows and per-row b (the block-by-block fallback).
TEST(TileKernels, FusedMulAddPair) {
  std::mt19937 rng(91);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (int64_t n : {0, 7, 16, 20, 32, 48, 64, 80}) {
    for (bool shared : {true, false}) {
      const int64_t rows = 5, outer = 3, rs = 2 * n + 3, os = rows * rs + 1;
      const int64_t bs = shared ? 0 : rs, bos = shared ? n + 1 : os;
      const size_t size = static_cast<size_t>(outer * os + 2 * n + 8);
      std::vector<float> src(size), b0(size), b1(size);
      for (float& v : src) v = dist(rng);
      for (float& v : b0) v = dist(rng);
      for (float& v : b1) v = dist(rng);
      // x: dst[0:n] = -src[n:2n] * b0 + src[0:n] * b1; y: dst[n:2n] = src[0:n] * b0' + ...
      auto args = [&](bool x, float* dst) {
        MulAddArgs m;
        m.negate = x;
        m.rows = Rows{rows, rs, rs, bs, rs};
        m.rows.e = bs;
        m.rows.outer = outer;
        m.rows.od = m.rows.oa = m.rows.oc = os;
        m.rows.ob = m.rows.oe = bos;
        m.dst = dst + (x ? 0 : n);
        m.a = src.data() + (x ? n : 0);
        m.p = src.data() + (x ? 0 : n);
        m.b = b0.data() + (x ? 0 : n);
        m.q = b1.data() + (x ? 0 : n);
        return m;
      };
      std::vector<float> pair(size, -9.0f), apart(size, -9.0f);
      fused_mul_add_pair_f32_rows(args(true, pair.data()), args(false, pair.data()), n);
      for (bool x : {true, false}) {
        const MulAddArgs m = args(x, apart.data());
        fused_mul_add_f32_rows(m.negate, m.rows, m.dst, m.a, 1, m.b, 1, m.p, 1, m.q, 1, n);
      }
      for (size_t i = 0; i < size; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(pair[i]), std::bit_cast<uint32_t>(apart[i]))
            << "n=" << n << " shared=" << shared << " at " << i;
      for (bool x : {true, false}) {
        const MulAddArgs m = args(x, apart.data());
        for (int64_t k = 0; k < outer; ++k)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < n; ++c) {
              const float a = m.a[k * os + r * rs + c], b = m.b[k * bos + r * bs + c];
              const float want =
                  std::fma(m.p[k * os + r * rs + c], m.q[k * bos + r * bs + c], (x ? -a : a) * b);
              ASSERT_NEAR(m.dst[k * os + r * rs + c], want, 1e-5f)
                  << "n=" << n << " shared=" << shared << " x=" << x;
            }
      }
    }
  }
}

// The elementwise kernels run a tile's blocks (Rows::outer) in one call: the same bits as
// one call per block, whatever the layout: blocks that continue each other's rows (merged into
// one block), blocks of one row, blocks apart (a permute's heads), a source broadcast per block
// (row stride 0, outer stride 1); nothing written outside the blocks.
TEST(TileKernels, OuterBlocksMatchBlockByBlock) {
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  struct Layout {
    const char* name;
    int64_t rows, rs, os;
  };
  // Row stride and outer stride of the destination and the full sources.
  for (int64_t n : {1, 7, 16, 33, 64, 100}) {
    const Layout layouts[] = {{"merged", 3, n, 3 * n},
                              {"row of one", 1, 5 * n + 2, n + 3},
                              {"apart", 3, n + 5, 3 * (n + 5) + 2},
                              {"interleaved", 3, 5 * n, n}};
    for (const Layout& l : layouts) {
      const int64_t outer = 5;
      const size_t size = static_cast<size_t>(outer * l.os + l.rows * l.rs + n + 16);
      std::vector<float> a(size), b(size), c(size);
      for (float& v : a) v = dist(rng);
      for (float& v : b) v = dist(rng);
      for (float& v : c) v = std::fabs(dist(rng)) + 0.5f;
      for (bool bcast_b : {false, true}) {
        // b broadcast per block: one value per block (inc 0, row stride 0, outer stride 1).
        const int binc = bcast_b ? 0 : 1;
        const int64_t brs = bcast_b ? 0 : l.rs, bos = bcast_b ? 1 : l.os;
        Rows all{l.rows, l.rs, l.rs, brs, l.rs};
        all.outer = outer;
        all.od = all.oa = all.oc = l.os;
        all.ob = bos;
        const Rows one{l.rows, l.rs, l.rs, brs, l.rs};
        using Call = std::function<void(const Rows&, float*, int64_t, int64_t)>;
        // Each kernel: called on (rows, dst, offset of the block's dst/a/c, of b).
        const std::vector<std::pair<std::string, Call>> kernels = {
            {"unary exp",
             [&](const Rows& r, float* d, int64_t o, int64_t) {
               unary_f32_rows(UnaryOp::kExp, r, d + o, a.data() + o, 1, n);
             }},
            {"binary mul",
             [&](const Rows& r, float* d, int64_t o, int64_t ob) {
               binary_f32_rows(BinaryOp::kMul, r, d + o, a.data() + o, 1, b.data() + ob, binc, n);
             }},
            {"binary div",
             [&](const Rows& r, float* d, int64_t o, int64_t ob) {
               binary_f32_rows(BinaryOp::kDiv, r, d + o, a.data() + o, 1, b.data() + ob, binc, n);
             }},
            {"unary_pre silu",
             [&](const Rows& r, float* d, int64_t o, int64_t ob) {
               unary_pre_f32_rows(UnaryOp::kSilu, 2, r, d + o, a.data() + o, 1, b.data() + ob, binc,
                                  n);
             }},
            {"fma",
             [&](const Rows& r, float* d, int64_t o, int64_t ob) {
               fma_f32_rows(r, d + o, a.data() + o, 1, b.data() + ob, binc, c.data() + o, 1, n);
             }},
            {"fused mul",
             [&](const Rows& r, float* d, int64_t o, int64_t ob) {
               fused_mul_f32_rows(kFusedMul, UnaryOp::kNeg, 0, r, d + o, a.data() + o, 1,
                                  b.data() + ob, binc, c.data() + o, 1, n);
             }},
            {"fused gelu",
             [&](const Rows& r, float* d, int64_t o, int64_t ob) {
               fused_mul_f32_rows(kFusedUnary, UnaryOp::kGeluTanh, 0, r, d + o, a.data() + o, 1,
                                  b.data() + ob, binc, c.data() + o, 1, n);
             }},
        };
        for (const auto& [name, call] : kernels) {
          std::vector<float> got(size, -7.0f), want(size, -7.0f);
          call(all, got.data(), 0, 0);
          for (int64_t k = 0; k < outer; ++k) call(one, want.data(), k * l.os, k * bos);
          for (size_t i = 0; i < size; ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                << name << " " << l.name << " n=" << n << " bcast_b=" << bcast_b << " at " << i;
        }
      }
    }
  }
}

TEST(TileKernels, TargetName) {
  const char* name = simd_target_name();
  ASSERT_NE(name, nullptr);
  EXPECT_GT(std::strlen(name), 0u);
  std::printf("  SIMD target: %s\n", name);
}

}  // namespace
}  // namespace dvm::vm::cpu

namespace dvm::vm::cpu {
namespace {

// Strided f32 rows (a strided slice's load): every element from its own place, for the
// constant-stride path (2) and the general one, rows padded in the destination.
TEST(TileKernels, LoadStridedF32Rows) {
  for (int64_t scs : {2, 3, 7}) {
    for (int64_t cols : {1, 5, 16, 33}) {
      const int64_t rows = 4, srs = cols * scs + 3, drs = cols + 2;
      std::vector<float> src(static_cast<size_t>(rows * srs));
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f;
      std::vector<float> dst(static_cast<size_t>(rows * drs), -1.0f);
      load_strided_f32_rows(dst.data(), drs, src.data(), srs, scs, rows, cols);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < drs; ++i) {
          const float want = i < cols ? src[static_cast<size_t>(r * srs + i * scs)] : -1.0f;
          ASSERT_EQ(dst[static_cast<size_t>(r * drs + i)], want)
              << "stride " << scs << " cols " << cols << " row " << r << " col " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dvm::vm::cpu
