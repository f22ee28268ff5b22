// Row kernels of the CPU VM (see tile_kernels.h). The f32 hot paths (unary, binary,
// comparisons, select, fma, row reductions, accumulate) are Highway SIMD compiled for several
// targets and dispatched at run time; integer, i64, conversion and arg-reduction rows are plain
// loops over the scalar spec (src/ops/scalar_ops.h) compiled once.
//
// Tails: the last partial vector is loaded with a lane mask (or through a padded stack buffer
// where the target has no masked access) and run through the same SIMD code, so an element's
// result never depends on its position in the row.

// Keep the target list short: every target multiplies the compile time of this file.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3_DL)
#endif

#include "vm/cpu/tile_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ops/scalar_ops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>  // _mm_sfence (stream_fence)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vm/cpu/tile_kernels.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>
// clang-format on

namespace dvm::vm::cpu {
// set_stream_stores' flag, read once per driver call. (Not initial-exec: the Python module is
// loaded with dlopen after torch, whose libraries leave no static TLS space for it.)
extern thread_local bool g_stream_stores;
}  // namespace dvm::vm::cpu

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace dvm::ops;  // the scalar semantics the kernels implement  // NOLINT

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

// Math lambdas are inlined into their row loops: a call per vector serialises the
// polynomial evaluations that the out-of-order core would otherwise overlap.
#ifndef DVM_INL
#define DVM_INL __attribute__((always_inline))
#endif

// Lanes of the widest target (AVX3: 16 x 32-bit); sizes the tail buffers.
constexpr size_t kMaxLanes = 16;
static_assert(HWY_MAX_BYTES / 4 <= kMaxLanes, "tail buffers too small");

// ------------------------------------------------------------------------------------------
// Tile drivers: one call runs a kernel over a block of rows (cpu::Rows). The operand
// increments are resolved once per call into template parameters, so a row costs its vectors
// plus a few pointer updates, not a fresh setup (rows of 32-96 columns are common). A source
// of increment 0 is broadcast along its row (its row stride may still move it: a column
// vector); when every source is broadcast the row's value is computed once and replicated.

// The first m (0 < m < lanes) elements of a row as one vector (other lanes 0), and the
// matching partial store. AVX2 and AVX-512 mask the access in hardware (masked-off lanes never
// fault); other targets go through a padded stack buffer. 32-bit lanes only.
template <class D>
HWY_INLINE hn::Vec<D> LoadTail(D d, const hn::TFromD<D>* p, int64_t m) {
  static_assert(sizeof(hn::TFromD<D>) == 4, "32-bit lanes");
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return hn::MaskedLoad(hn::FirstN(d, static_cast<size_t>(m)), d, p);
#else
  HWY_ALIGN hn::TFromD<D> buf[kMaxLanes] = {};
  for (int64_t k = 0; k < m; ++k) buf[k] = p[k];
  return hn::Load(d, buf);
#endif
}

template <class D>
HWY_INLINE void StoreTail(hn::Vec<D> v, D d, hn::TFromD<D>* p, int64_t m) {
  static_assert(sizeof(hn::TFromD<D>) == 4, "32-bit lanes");
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  hn::BlendedStore(v, hn::FirstN(d, static_cast<size_t>(m)), d, p);
#else
  HWY_ALIGN hn::TFromD<D> buf[kMaxLanes];
  hn::Store(v, d, buf);
  for (int64_t k = 0; k < m; ++k) p[k] = buf[k];
#endif
}

// A full vector to memory: streamed around the caches (nt: set_stream_stores is on and the
// row starts on a vector boundary, so every full vector of it is aligned) or stored.
template <class D>
HWY_INLINE void StoreMaybeNt(hn::Vec<D> v, D d, hn::TFromD<D>* p, bool nt) {
  if (nt) {
    hn::Stream(v, d, p);
  } else {
    hn::StoreU(v, d, p);
  }
}

// Fills n elements with v (a broadcast row).
template <typename T>
HWY_INLINE void FillRow(T* dst, T v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = v;
}

// When every source's rows are back to back (Rows::flat_src; K sources with their row strides
// and increments) and the destination's too, the block runs as one row of rows * n elements:
// *g becomes that row, *n grows and incs[] take the run's increments. Otherwise unchanged.
template <size_t K>
HWY_INLINE void FlattenRows(const Rows& rs, const int64_t (&strides)[K], int (&incs)[K], Rows* g,
                            int64_t* n) {
  *g = rs;
  if (!rs.flat_dst(*n)) return;
  int flat[K];
  for (size_t k = 0; k < K; ++k)
    if (!Rows::flat_src(*n, incs[k], strides[k], &flat[k])) return;
  for (size_t k = 0; k < K; ++k) incs[k] = flat[k];
  *g = Rows{1, 0, 0, 0, 0};
  *n *= rs.rows;
}

template <bool kA, class DO, class DA, class F>
HWY_INLINE void Map1Grid(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                         const hn::TFromD<DA>* a, int64_t n, F f) {
  using TO = hn::TFromD<DO>;
  const int64_t N = static_cast<int64_t>(hn::Lanes(da));
  for (int64_t r = 0; r < rs.rows; ++r) {
    TO* dr = dst + r * rs.d;
    const hn::TFromD<DA>* ar = a + r * rs.a;
    if (!kA) {  // a broadcast row: one evaluation
      HWY_ALIGN TO out[kMaxLanes];
      hn::Store(f(hn::Set(da, ar[0])), dout, out);
      FillRow(dr, out[0], n);
      continue;
    }
    int64_t i = 0;
    for (; i + 2 * N <= n; i += 2 * N) {
      const auto x0 = hn::LoadU(da, ar + i);
      const auto x1 = hn::LoadU(da, ar + i + N);
      hn::StoreU(f(x0), dout, dr + i);
      hn::StoreU(f(x1), dout, dr + i + N);
    }
    if (i + N <= n) {
      hn::StoreU(f(hn::LoadU(da, ar + i)), dout, dr + i);
      i += N;
    }
    if (i < n) StoreTail(f(LoadTail(da, ar + i, n - i)), dout, dr + i, n - i);
  }
}

// Map1 over a block of rows; one run of rows * n elements when the rows are back to back.
template <class DO, class DA, class F>
HWY_INLINE void Map1Rows(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                         const hn::TFromD<DA>* a, int ainc, int64_t n, F f) {
  if (n <= 0 || rs.rows <= 0) return;
  int inc[1] = {ainc};
  Rows g;
  FlattenRows(rs, {rs.a}, inc, &g, &n);
  if (inc[0]) {
    Map1Grid<true>(dout, da, g, dst, a, n, f);
  } else {
    Map1Grid<false>(dout, da, g, dst, a, n, f);
  }
}

template <bool kA, bool kB, class DO, class DA, class F>
HWY_INLINE void Map2Grid(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                         const hn::TFromD<DA>* a, const hn::TFromD<DA>* b, int64_t n, F f) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(da));
  const bool nt_ok = g_stream_stores;
  for (int64_t r = 0; r < rs.rows; ++r) {
    hn::TFromD<DO>* dr = dst + r * rs.d;
    const hn::TFromD<DA>* ar = a + r * rs.a;
    const hn::TFromD<DA>* br = b + r * rs.b;
    const auto va = kA ? hn::Zero(da) : hn::Set(da, ar[0]);
    const auto vb = kB ? hn::Zero(da) : hn::Set(da, br[0]);
    int64_t i = 0;
    const bool nt = nt_ok && reinterpret_cast<uintptr_t>(dr) % (N * sizeof(*dr)) == 0;
    for (; i + 2 * N <= n; i += 2 * N) {  // two vectors: the next loads overlap this math
      const auto a0 = kA ? hn::LoadU(da, ar + i) : va;
      const auto a1 = kA ? hn::LoadU(da, ar + i + N) : va;
      const auto b0 = kB ? hn::LoadU(da, br + i) : vb;
      const auto b1 = kB ? hn::LoadU(da, br + i + N) : vb;
      StoreMaybeNt(f(a0, b0), dout, dr + i, nt);
      StoreMaybeNt(f(a1, b1), dout, dr + i + N, nt);
    }
    if (i + N <= n) {
      hn::StoreU(f(kA ? hn::LoadU(da, ar + i) : va, kB ? hn::LoadU(da, br + i) : vb), dout, dr + i);
      i += N;
    }
    if (i < n) {
      const int64_t m = n - i;
      StoreTail(f(kA ? LoadTail(da, ar + i, m) : va, kB ? LoadTail(da, br + i, m) : vb), dout,
                dr + i, m);
    }
  }
}

// Map2 over a block of rows (see cpu::Rows): one run when the rows are back to back. The
// kernels' single call site of the drivers (each op's math is inlined once per variant).
template <class DO, class DA, class F>
HWY_INLINE void Map2Rows(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                         const hn::TFromD<DA>* a, int ainc, const hn::TFromD<DA>* b, int binc,
                         int64_t n, F f) {
  using TO = hn::TFromD<DO>;
  if (n <= 0 || rs.rows <= 0) return;
  int inc[2] = {ainc, binc};
  Rows g;
  FlattenRows(rs, {rs.a, rs.b}, inc, &g, &n);
  const int fa = inc[0], fb = inc[1];
  if (fa && fb) {
    Map2Grid<true, true>(dout, da, g, dst, a, b, n, f);
  } else if (fa) {
    Map2Grid<true, false>(dout, da, g, dst, a, b, n, f);
  } else if (fb) {
    Map2Grid<false, true>(dout, da, g, dst, a, b, n, f);
  } else {  // both broadcast: one evaluation per row
    HWY_ALIGN TO out[kMaxLanes];
    for (int64_t r = 0; r < g.rows; ++r) {
      hn::Store(f(hn::Set(da, a[r * g.a]), hn::Set(da, b[r * g.b])), dout, out);
      FillRow(dst + r * g.d, out[0], n);
    }
  }
}

// Map3 over a block of rows with a contiguous and b, c contiguous (kB, kC) or broadcast.
template <bool kB, bool kC, class D, class F>
HWY_INLINE void Map3Grid(D d, const Rows& rs, hn::TFromD<D>* dst, const hn::TFromD<D>* a,
                         const hn::TFromD<D>* b, const hn::TFromD<D>* c, int64_t n, F f) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const bool nt_ok = g_stream_stores;
  for (int64_t r = 0; r < rs.rows; ++r) {
    hn::TFromD<D>* dr = dst + r * rs.d;
    const hn::TFromD<D>*ar = a + r * rs.a, *br = b + r * rs.b, *cr = c + r * rs.c;
    const auto vb = kB ? hn::Zero(d) : hn::Set(d, br[0]);
    const auto vc = kC ? hn::Zero(d) : hn::Set(d, cr[0]);
    const auto lb = [&](int64_t i) { return kB ? hn::LoadU(d, br + i) : vb; };
    const auto lc = [&](int64_t i) { return kC ? hn::LoadU(d, cr + i) : vc; };
    int64_t i = 0;
    const bool nt = nt_ok && reinterpret_cast<uintptr_t>(dr) % (N * sizeof(*dr)) == 0;
    for (; i + 2 * N <= n; i += 2 * N) {
      const auto r0 = f(hn::LoadU(d, ar + i), lb(i), lc(i));
      const auto r1 = f(hn::LoadU(d, ar + i + N), lb(i + N), lc(i + N));
      StoreMaybeNt(r0, d, dr + i, nt);
      StoreMaybeNt(r1, d, dr + i + N, nt);
    }
    if (i + N <= n) {
      hn::StoreU(f(hn::LoadU(d, ar + i), lb(i), lc(i)), d, dr + i);
      i += N;
    }
    if (i < n) {
      const int64_t m = n - i;
      const auto tb = kB ? LoadTail(d, br + i, m) : vb;
      const auto tc = kC ? LoadTail(d, cr + i, m) : vc;
      StoreTail(f(LoadTail(d, ar + i, m), tb, tc), d, dr + i, m);
    }
  }
}

// Three sources of one lane type T (fma: all f32; select: cond reinterpreted as T), over a
// block of rows: a contiguous source a gets a loop specialised for b and c contiguous or
// broadcast (Map3Grid); a broadcast a (rare) picks its sources per vector.
template <class D, class F>
HWY_INLINE void Map3Rows(D d, const Rows& rs, hn::TFromD<D>* dst, const hn::TFromD<D>* a, int ainc,
                         const hn::TFromD<D>* b, int binc, const hn::TFromD<D>* c, int cinc,
                         int64_t n, F f) {
  using T = hn::TFromD<D>;
  if (n <= 0 || rs.rows <= 0) return;
  int inc[3] = {ainc, binc, cinc};
  Rows g;
  FlattenRows(rs, {rs.a, rs.b, rs.c}, inc, &g, &n);
  const int fa = inc[0], fb = inc[1], fc = inc[2];
  if (fa && fb && fc) return Map3Grid<true, true>(d, g, dst, a, b, c, n, f);
  if (fa && fb) return Map3Grid<true, false>(d, g, dst, a, b, c, n, f);
  if (fa && fc) return Map3Grid<false, true>(d, g, dst, a, b, c, n, f);
  if (fa) return Map3Grid<false, false>(d, g, dst, a, b, c, n, f);
  // a broadcast (rare): each source picked per vector
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < g.rows; ++r) {
    T* dr = dst + r * g.d;
    const T *ar = a + r * g.a, *br = b + r * g.b, *cr = c + r * g.c;
    const auto ba = hn::Set(d, ar[0]), bb = hn::Set(d, br[0]), bc = hn::Set(d, cr[0]);
    for (int64_t i = 0; i < n; i += N) {
      const int64_t m = std::min(N, n - i);
      const auto vb = fb ? LoadTail(d, br + i, m) : bb;
      const auto vc = fc ? LoadTail(d, cr + i, m) : bc;
      StoreTail(f(ba, vb, vc), d, dr + i, m);
    }
  }
}

// ------------------------------------------------------------------------------------------
// f32 vector math

HWY_INLINE VF NanMax(VF a, VF b) {
  return hn::IfThenElse(hn::IsNaN(a), a, hn::IfThenElse(hn::Gt(a, b), a, b));
}
HWY_INLINE VF NanMin(VF a, VF b) {
  return hn::IfThenElse(hn::IsNaN(a), a, hn::IfThenElse(hn::Lt(a, b), a, b));
}

// Any lane NaN in x gives x (the spec propagates NaN through every value op).
HWY_INLINE VF KeepNaN(VF x, VF r) {
  return hn::IfThenElse(hn::IsNaN(x), x, r);
}

// relu(x) = x > 0 ? x : +0, NaN kept. On x86, max(0, x) returns its second operand when
// either is NaN (and for -0 against 0), so max(0, x) + 0 is the spec in two instructions
// (adding +0 turns -0 into +0 and changes nothing else).
HWY_INLINE VF ReluF(DF d, VF x) {
#if HWY_ARCH_X86
  return hn::Add(hn::Max(hn::Zero(d), x), hn::Zero(d));
#else
  return KeepNaN(x, hn::IfThenElse(hn::Gt(x, hn::Zero(d)), x, hn::Zero(d)));
#endif
}

// e^x, <= 2 ulp including subnormal results. x = n ln2 + r, |r| <= ln2/2 (n ln2 subtracted
// in two parts, exact for |n| <= 150), e^r by the Cephes expf polynomial, then the scaling
// by 2^n, which rounds once (so subnormal results round once and large x overflows to +inf
// there). Clamping x to [-104, 89] keeps n in [-150, 128] and still gives exactly 0 and +inf
// beyond. About twice as fast as Highway 1.0.3's Exp (no range blends, one polynomial).
//
// AVX-512 scales by vscalefps and orders the clamp's operands so that a NaN x passes through
// (vmaxps/vminps return their second operand when one is NaN): NaN in, NaN out. Other
// targets apply 2^n as 2^(n/2) * 2^(n - n/2), two normal factors for n in [-150, 128] whose
// first product is exact: the same bits. Their NaN lanes are unspecified (ExpF restores
// them).
#undef DVM_EXP_KEEPS_NAN  // per target (this file is compiled once for each)
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define DVM_EXP_KEEPS_NAN 1
#else
#define DVM_EXP_KEEPS_NAN 0
#endif
HWY_INLINE VF ExpCore(DF d, VF x) {
#if DVM_EXP_KEEPS_NAN
  const VF xc{_mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x.raw))};
#else
  const VF xc = hn::Min(hn::Max(x, hn::Set(d, -104.0f)), hn::Set(d, 89.0f));
#endif
  const VF n = hn::Round(hn::Mul(xc, hn::Set(d, 1.44269504088896341f)));
  VF r = hn::NegMulAdd(n, hn::Set(d, 0.693145751953125f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, 1.428606765330187045e-06f), r);
  VF p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  p = hn::MulAdd(p, hn::Mul(r, r), hn::Add(r, hn::Set(d, 1.0f)));
#if DVM_EXP_KEEPS_NAN
  return VF{_mm512_scalef_ps(p.raw, n.raw)};
#else
  const hn::RebindToSigned<DF> di;
  const auto ni = hn::ConvertTo(di, n);
  const auto n1 = hn::ShiftRight<1>(ni);  // arithmetic: floor(n / 2)
  const auto bias = hn::Set(di, 127);
  const VF s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const VF s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::Sub(ni, n1), bias)));
  return hn::Mul(hn::Mul(p, s1), s2);
#endif
}

HWY_INLINE VF ExpF(DF d, VF x) {
  return DVM_EXP_KEEPS_NAN ? ExpCore(d, x) : KeepNaN(x, ExpCore(d, x));
}
HWY_INLINE VF Expm1F(DF d, VF x) {
  VF r = hn::Expm1(d, x);
  r = hn::IfThenElse(hn::Gt(x, hn::Set(d, 100.0f)), hn::Set(d, HUGE_VALF), r);
  return KeepNaN(x, r);
}
HWY_INLINE VF LogF(DF d, VF x) {
  VF r = hn::Log(d, x);
  r = hn::IfThenElse(hn::Eq(x, hn::Set(d, HUGE_VALF)), x, r);
  r = hn::IfThenElse(hn::Eq(x, hn::Zero(d)), hn::Set(d, -HUGE_VALF), r);
  r = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Set(d, std::numeric_limits<float>::quiet_NaN()),
                     r);
  return KeepNaN(x, r);
}
HWY_INLINE VF Log1pF(DF d, VF x) {
  const VF m1 = hn::Set(d, -1.0f);
  VF r = hn::Log1p(d, x);
  r = hn::IfThenElse(hn::Eq(x, hn::Set(d, HUGE_VALF)), x, r);
  r = hn::IfThenElse(hn::Eq(x, m1), hn::Set(d, -HUGE_VALF), r);
  r = hn::IfThenElse(hn::Lt(x, m1), hn::Set(d, std::numeric_limits<float>::quiet_NaN()), r);
  return KeepNaN(x, r);
}

// sin/cos: Highway is accurate for |x| <= 39000; other rows (rare) use the scalar spec.
template <bool kSin>
HWY_INLINE VF SinCosF(DF d, VF x) {
  const VF r = kSin ? hn::Sin(d, x) : hn::Cos(d, x);
  const auto ok = hn::Le(hn::Abs(x), hn::Set(d, 39000.0f));
  if (HWY_LIKELY(hn::AllTrue(d, ok))) return r;
  HWY_ALIGN float xs[kMaxLanes];
  HWY_ALIGN float rs[kMaxLanes];
  hn::Store(x, d, xs);
  hn::Store(r, d, rs);
  for (size_t k = 0; k < hn::Lanes(d); ++k) {
    if (!(std::fabs(xs[k]) <= 39000.0f)) {
      rs[k] = ops::unary_f32(kSin ? UnaryOp::kSin : UnaryOp::kCos, xs[k]);
    }
  }
  return hn::Load(d, rs);
}

// sigmoid(x) = 1/(1+e^-x) for x >= 0 and e^x/(1+e^x) for x < 0: e = exp(-|x|) never
// overflows and the small side keeps its relative accuracy.
HWY_INLINE VF SigmoidF(DF d, VF x) {
  const VF one = hn::Set(d, 1.0f);
  const VF e = ExpCore(d, hn::Neg(hn::Abs(x)));
  const VF num = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), e, one);
  return KeepNaN(x, hn::Div(num, hn::Add(one, e)));
}

// erf / erfc of t = |z|, fitted in f32 (least squares on relative error, Chebyshev nodes):
//   t < 1:       erf(t) = t * P(t^2)              (P degree 6)
//   1 <= t < 9.5: erfc(t) = exp(-t^2 + R(u)), u = (t - 5.25) / 4.25   (R degree 12)
//   t >= 9.5:    erfc(t) = 0 (below the smallest subnormal)
struct ErfParts {
  VF erf;   // erf(t)
  VF erfc;  // erfc(t) = 1 - erf(t), accurate relative to itself for large t
};
HWY_INLINE ErfParts ErfAbs(DF d, VF t) {
  const VF one = hn::Set(d, 1.0f);
  const VF s = hn::Mul(t, t);
  VF p = hn::Set(d, 7.898201875e-05f);
  p = hn::MulAdd(p, s, hn::Set(d, -8.024351555e-04f));
  p = hn::MulAdd(p, s, hn::Set(d, 5.190053023e-03f));
  p = hn::MulAdd(p, s, hn::Set(d, -2.685480751e-02f));
  p = hn::MulAdd(p, s, hn::Set(d, 1.128361225e-01f));
  p = hn::MulAdd(p, s, hn::Set(d, -3.761262894e-01f));
  p = hn::MulAdd(p, s, hn::Set(d, 1.128379226e+00f));
  const VF erf_small = hn::Mul(t, p);

  const VF tc = hn::Min(hn::Max(t, one), hn::Set(d, 9.5f));
  const VF u = hn::Mul(hn::Sub(tc, hn::Set(d, 5.25f)), hn::Set(d, 1.0f / 4.25f));
  VF r = hn::Set(d, 4.199608520e-04f);
  r = hn::MulAdd(r, u, hn::Set(d, -1.536058146e-03f));
  r = hn::MulAdd(r, u, hn::Set(d, 2.502674470e-03f));
  r = hn::MulAdd(r, u, hn::Set(d, -3.643332282e-03f));
  r = hn::MulAdd(r, u, hn::Set(d, 7.049813401e-03f));
  r = hn::MulAdd(r, u, hn::Set(d, -1.362388022e-02f));
  r = hn::MulAdd(r, u, hn::Set(d, 2.431925386e-02f));
  r = hn::MulAdd(r, u, hn::Set(d, -4.309391975e-02f));
  r = hn::MulAdd(r, u, hn::Set(d, 7.775984704e-02f));
  r = hn::MulAdd(r, u, hn::Set(d, -1.453500390e-01f));
  r = hn::MulAdd(r, u, hn::Set(d, 2.965609729e-01f));
  r = hn::MulAdd(r, u, hn::Set(d, -7.825111747e-01f));
  r = hn::MulAdd(r, u, hn::Set(d, -2.247976303e+00f));
  VF e = ExpCore(d, hn::NegMulAdd(tc, tc, r));
  e = hn::IfThenElseZero(hn::Lt(t, hn::Set(d, 9.5f)), e);

  const auto small = hn::Lt(t, one);
  ErfParts out;
  out.erf = hn::IfThenElse(small, erf_small, hn::Sub(one, e));
  out.erfc = hn::IfThenElse(small, hn::Sub(one, erf_small), e);
  return out;
}

HWY_INLINE VF ErfF(DF d, VF x) {
  const ErfParts p = ErfAbs(d, hn::Abs(x));
  return KeepNaN(x, hn::CopySign(p.erf, x));
}

// gelu(x) = x/2 * (1 + erf(x/sqrt2)); for x < 0 that is x/2 * erfc(|x|/sqrt2), which avoids
// the cancellation of 1 + erf.
// gelu(x) = x/2 * (1 + erf(x/sqrt2)) = x/2 * (2 - erfc(z)) for x >= 0, x/2 * erfc(z) for
// x < 0, z = |x|/sqrt2. erfc by the Chebyshev fit of Numerical Recipes (erfcc: fractional
// error < 1.2e-7 for all z >= 0), one exp and one division: the negative tail keeps its
// relative accuracy and there is no branch to evaluate twice (2x cheaper than Erf's split).
HWY_INLINE VF GeluErfF(DF d, VF x) {
  const VF z = hn::Mul(hn::Abs(x), hn::Set(d, static_cast<float>(kSqrt1_2)));
  // t = 1 / (1 + z/2) in [0, 1]: the hardware's reciprocal estimate refined by two Newton
  // steps (relative error ~2^-46 from a 12-bit estimate, below f32 rounding) costs 4 FMAs
  // where a division blocks the divider for 5+ cycles per vector (3-5% on gelu). The clamp
  // keeps |x| = inf finite here (the estimate of 1/inf is 0, and 0 * inf is NaN); erfc is 0
  // long before it.
  const VF den = hn::Min(hn::MulAdd(hn::Set(d, 0.5f), z, hn::Set(d, 1.0f)), hn::Set(d, 1e30f));
  VF t = hn::ApproximateReciprocal(den);
  t = hn::Mul(t, hn::NegMulAdd(den, t, hn::Set(d, 2.0f)));
  t = hn::Mul(t, hn::NegMulAdd(den, t, hn::Set(d, 2.0f)));
  VF p = hn::Set(d, 0.17087277f);
  p = hn::MulAdd(p, t, hn::Set(d, -0.82215223f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.48851587f));
  p = hn::MulAdd(p, t, hn::Set(d, -1.13520398f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.27886807f));
  p = hn::MulAdd(p, t, hn::Set(d, -0.18628806f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.09678418f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.37409196f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.00002368f));
  p = hn::MulAdd(p, t, hn::Set(d, -1.26551223f));
  // The exponent -z^2 + P is large for large |x|: its rounding errors would scale the result
  // by up to |z^2| ulp. So z^2 = x^2 / 2 is carried as hi + lo (x^2 exact with an FMA), the
  // sum's rounding error recovered (Fast2Sum: |z^2| >= |P| where it matters), and both
  // applied as the factor 1 + c (|c| ~ ulp(z^2), so e^c = 1 + c to f32 precision).
  const VF half = hn::Set(d, 0.5f);
  const VF x2 = hn::Mul(x, x);
  const VF nz2 = hn::Mul(hn::Set(d, -0.5f), x2);  // exact
  const VF arg = hn::Add(nz2, p);
  VF c = hn::Sub(hn::Add(hn::Sub(nz2, arg), p), hn::Mul(half, hn::MulSub(x, x, x2)));
  c = hn::IfThenElseZero(hn::IsFinite(nz2), c);  // x^2 = inf: e = 0 and c would be NaN
  const VF e = ExpCore(d, arg);
  const VF erfc = hn::Mul(t, hn::MulAdd(e, c, e));
  const VF half_x = hn::Mul(hn::Set(d, 0.5f), x);
  const VF factor = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), erfc, hn::Sub(hn::Set(d, 2.0f), erfc));
  return KeepNaN(x, hn::Mul(half_x, factor));
}

// gelu_tanh(x) = x/2 * (1 + tanh(y)) = x * sigmoid(2y), y = sqrt(2/pi) * (x + 0.044715 x^3).
HWY_INLINE VF GeluTanhF(DF d, VF x) {
  const VF x3 = hn::Mul(hn::Mul(x, x), x);
  const VF y2 = hn::Mul(hn::MulAdd(x3, hn::Set(d, 0.044715f), x),
                        hn::Set(d, static_cast<float>(2.0 * kSqrt2OverPi)));
  return hn::Mul(x, SigmoidF(d, y2));
}

HWY_INLINE VF SignF(DF d, VF x) {
  const VF zero = hn::Zero(d);
  const VF r = hn::IfThenElse(hn::Gt(x, zero), hn::Set(d, 1.0f), zero);
  return hn::IfThenElse(hn::Lt(x, zero), hn::Set(d, -1.0f), r);  // NaN: 0, as the spec
}

// A 3-D block (rs.outer > 1) as `outer` 2-D calls of `kernel`, each operand moved by its outer
// stride; returns false for a 2-D block.
template <class K>
HWY_INLINE bool SplitOuter(const Rows& rs, K kernel) {
  if (rs.outer <= 1) return false;
  Rows one{rs.rows, rs.d, rs.a, rs.b, rs.c};
  for (int64_t k = 0; k < rs.outer; ++k) kernel(one, k * rs.od, k * rs.oa, k * rs.ob, k * rs.oc);
  return true;
}

// Floor/Ceil/Round/Trunc keep the sign of x (-0 stays -0 also where an emulated target
// loses it).
void UnaryF32(UnaryOp op, Rows rs, float* dst, const float* a, int ainc, int64_t n) {
  if (SplitOuter(rs, [&](const Rows& one, int64_t od, int64_t oa, int64_t, int64_t) {
        UnaryF32(op, one, dst + od, a + oa, ainc, n);
      }))
    return;
  const DF d;
  const auto run = [&](auto f) { Map1Rows(d, d, rs, dst, a, ainc, n, f); };
  switch (op) {
    case UnaryOp::kNeg:
      return run([](VF x) { return hn::Neg(x); });
    case UnaryOp::kAbs:
      return run([](VF x) { return hn::Abs(x); });
    case UnaryOp::kExp:
      return run([d](VF x) DVM_INL { return ExpF(d, x); });
    case UnaryOp::kLog:
      return run([d](VF x) DVM_INL { return LogF(d, x); });
    case UnaryOp::kLog1p:
      return run([d](VF x) DVM_INL { return Log1pF(d, x); });
    case UnaryOp::kExpm1:
      return run([d](VF x) DVM_INL { return Expm1F(d, x); });
    case UnaryOp::kSqrt:
      return run([](VF x) { return hn::Sqrt(x); });
    case UnaryOp::kRsqrt:
      return run([d](VF x) DVM_INL { return hn::Div(hn::Set(d, 1.0f), hn::Sqrt(x)); });
    case UnaryOp::kReciprocal:
      return run([d](VF x) DVM_INL { return hn::Div(hn::Set(d, 1.0f), x); });
    case UnaryOp::kTanh:
      return run([d](VF x) DVM_INL { return hn::Tanh(d, x); });
    case UnaryOp::kSigmoid:
      return run([d](VF x) DVM_INL { return SigmoidF(d, x); });
    case UnaryOp::kRelu:
      return run([d](VF x) DVM_INL { return ReluF(d, x); });
    case UnaryOp::kGeluErf:
      return run([d](VF x) DVM_INL { return GeluErfF(d, x); });
    case UnaryOp::kGeluTanh:
      return run([d](VF x) DVM_INL { return GeluTanhF(d, x); });
    case UnaryOp::kSilu:
      return run([d](VF x) DVM_INL { return hn::Mul(x, SigmoidF(d, x)); });
    case UnaryOp::kErf:
      return run([d](VF x) DVM_INL { return ErfF(d, x); });
    case UnaryOp::kSin:
      return run([d](VF x) DVM_INL { return SinCosF<true>(d, x); });
    case UnaryOp::kCos:
      return run([d](VF x) DVM_INL { return SinCosF<false>(d, x); });
    case UnaryOp::kFloor:
      return run([](VF x) { return hn::CopySign(hn::Floor(x), x); });
    case UnaryOp::kCeil:
      return run([](VF x) { return hn::CopySign(hn::Ceil(x), x); });
    case UnaryOp::kRound:
      return run([](VF x) { return hn::CopySign(hn::Round(x), x); });
    case UnaryOp::kTrunc:
      return run([](VF x) { return hn::CopySign(hn::Trunc(x), x); });
    case UnaryOp::kSign:
      return run([d](VF x) DVM_INL { return SignF(d, x); });
    case UnaryOp::kIsFinite:
    case UnaryOp::kIsNan:
    case UnaryOp::kLogicalNot:
      for (int64_t r = 0; r < rs.rows; ++r)
        for (int64_t i = 0; i < n; ++i)
          dst[r * rs.d + i] = ops::unary_f32(op, a[r * rs.a + (ainc ? i : 0)]);
      return;
  }
}

HWY_INLINE VI MaskToI32(DF d, hn::Mask<DF> m) {
  const DI di;
  return hn::And(hn::BitCast(di, hn::VecFromMask(d, m)), hn::Set(di, 1));
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

// Calls run(f) with the vector op f of add, sub or mul (BinaryF32's commonest ops, and the
// maps that pair with a row reduction); false, run not called, for other ops.
template <class Run>
HWY_INLINE bool WithAddSubMul(BinaryOp op, Run run) {
  switch (op) {
    case BinaryOp::kAdd:
      return run([](VF x, VF y) { return hn::Add(x, y); }), true;
    case BinaryOp::kSub:
      return run([](VF x, VF y) { return hn::Sub(x, y); }), true;
    case BinaryOp::kMul:
      return run([](VF x, VF y) { return hn::Mul(x, y); }), true;
    default:
      return false;
  }
}

void BinaryF32(BinaryOp op, Rows rs, float* dst, const float* a, int ainc, const float* b, int binc,
               int64_t n) {
  if (SplitOuter(rs, [&](const Rows& one, int64_t od, int64_t oa, int64_t ob, int64_t) {
        BinaryF32(op, one, dst + od, a + oa, ainc, b + ob, binc, n);
      }))
    return;
  const DF d;
  const auto run = [&](auto f) { Map2Rows(d, d, rs, dst, a, ainc, b, binc, n, f); };
  if (WithAddSubMul(op, run)) return;
  switch (op) {
    case BinaryOp::kDiv:
      return run([](VF x, VF y) { return hn::Div(x, y); });
    case BinaryOp::kMaximum:
      return run([](VF x, VF y) { return NanMax(x, y); });
    case BinaryOp::kMinimum:
      return run([](VF x, VF y) { return NanMin(x, y); });
    case BinaryOp::kPow:
      // pow(x, 2) rounds x*x exactly like the double spec; other exponents stay exact.
      if (binc == 0 && rs.b == 0 && b[0] == 2.0f)
        return run([](VF x, VF) { return hn::Mul(x, x); });
      [[fallthrough]];
    default:
      for (int64_t r = 0; r < rs.rows; ++r)
        for (int64_t i = 0; i < n; ++i)
          dst[r * rs.d + i] =
              ops::binary_f32(op, a[r * rs.a + (ainc ? i : 0)], b[r * rs.b + (binc ? i : 0)]);
  }
}

// Calls run(f) with the vector math f of `op` if it is one of the ops that combine with a
// neighbour in one kernel (the common activations, fused_mul_supported); false otherwise.
// One list for the pre-op kernels and the fused pairs.
template <class Run>
HWY_INLINE bool WithActivation(DF d, UnaryOp op, Run run) {
  switch (op) {
    case UnaryOp::kNeg:
      return run([](VF x) { return hn::Neg(x); }), true;
    case UnaryOp::kExp:
      return run([d](VF x) DVM_INL { return ExpF(d, x); }), true;
    case UnaryOp::kTanh:
      return run([d](VF x) DVM_INL { return hn::Tanh(d, x); }), true;
    case UnaryOp::kSigmoid:
      return run([d](VF x) DVM_INL { return SigmoidF(d, x); }), true;
    case UnaryOp::kSilu:
      return run([d](VF x) DVM_INL { return hn::Mul(x, SigmoidF(d, x)); }), true;
    case UnaryOp::kGeluErf:
      return run([d](VF x) DVM_INL { return GeluErfF(d, x); }), true;
    case UnaryOp::kGeluTanh:
      return run([d](VF x) DVM_INL { return GeluTanhF(d, x); }), true;
    case UnaryOp::kRelu:
      return run([d](VF x) DVM_INL { return ReluF(d, x); }), true;
    default:
      return false;
  }
}

// dst[i] = op(a[i] + b[i]) (pre 1) or op(a[i] - b[i]) (pre 2): the add/sub stays in a vector
// register instead of making its own pass over the tile; the same bits as the two ops apart.
void UnaryPreF32(UnaryOp op, int pre, Rows rs, float* dst, const float* a, int ainc, const float* b,
                 int binc, int64_t n) {
  if (SplitOuter(rs, [&](const Rows& one, int64_t od, int64_t oa, int64_t ob, int64_t) {
        UnaryPreF32(op, pre, one, dst + od, a + oa, ainc, b + ob, binc, n);
      }))
    return;
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
  BinaryF32(pre == 1 ? BinaryOp::kAdd : BinaryOp::kSub, rs, dst, a, ainc, b, binc, n);
  UnaryF32(op, Rows{rs.rows, rs.d, rs.d, 0, 0}, dst, dst, 1, n);
}

// dst = g * c for a producer g that is a * b (kMul), op(a) (kUnary) or op(a +- b) (kUnaryPre,
// pre 1 / 2): two chain instructions in one pass, the intermediate never stored. The same
// bits as the two instructions apart (f32 throughout). Row strides: rs.a, rs.b of a and b,
// rs.c of c.
void FusedMulF32(int kind, UnaryOp op, int pre, Rows rs, float* dst, const float* a, int ainc,
                 const float* b, int binc, const float* c, int cinc, int64_t n) {
  if (SplitOuter(rs, [&](const Rows& one, int64_t od, int64_t oa, int64_t ob, int64_t oc) {
        FusedMulF32(kind, op, pre, one, dst + od, a + oa, ainc, b + ob, binc, c + oc, cinc, n);
      }))
    return;
  const DF d;
  if (kind == kFusedMul) {
    return Map3Rows(d, rs, dst, a, ainc, b, binc, c, cinc, n,
                    [](VF x, VF y, VF z) { return hn::Mul(hn::Mul(x, y), z); });
  }
  const auto run = [&](auto f) {
    if (kind == kFusedUnary) {
      Rows ac{rs.rows, rs.d, rs.a, rs.c};
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

// Four sources over a 3-D block (Rows: a, b by rows.a/oa, rows.b/ob; the third by rows.c/oc,
// the fourth by rows.e/oe): per row, row(dr, ar, br, cr, er) handles the columns it can (a
// fast loop for the common increments) and returns how many; the rest pick each source per
// vector (contiguous or broadcast) and go through f.
template <class F, class Row>
HWY_INLINE void Map4Rows(DF d, const Rows& rs, float* dst, const float* a, int ainc, const float* b,
                         int binc, const float* c, int cinc, const float* e, int einc, int64_t n,
                         F f, Row row) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t k = 0; k < rs.outer; ++k) {
    for (int64_t r = 0; r < rs.rows; ++r) {
      float* dr = dst + k * rs.od + r * rs.d;
      const float* ar = a + k * rs.oa + r * rs.a;
      const float* br = b + k * rs.ob + r * rs.b;
      const float* cr = c + k * rs.oc + r * rs.c;
      const float* er = e + k * rs.oe + r * rs.e;
      for (int64_t i = row(dr, ar, br, cr, er); i < n; i += N) {
        const int64_t m = std::min(N, n - i);
        const auto ld = [&](const float* s, int inc) {
          return inc ? LoadTail(d, s + i, m) : hn::Set(d, s[0]);
        };
        StoreTail(f(ld(ar, ainc), ld(br, binc), ld(cr, cinc), ld(er, einc)), d, dr + i, m);
      }
    }
  }
}

// The rows of a 2-D slice of MulAddRows with b and q the same for every row (rotary
// embedding's cos and sin, broadcast over the heads) and kV full vectors a row: b and q are
// loaded once per slice and stay in registers, so a row costs the loads of a and p only.
template <int kV, class F>
HWY_INLINE void MulAddRowsShared(DF d, const Rows& rs, float* dst, const float* a, const float* b,
                                 const float* p, const float* q, F f) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF bv[kV], qv[kV];
  for (int v = 0; v < kV; ++v) {
    bv[v] = hn::LoadU(d, b + v * N);
    qv[v] = hn::LoadU(d, q + v * N);
  }
  // Pointers stepped, not recomputed: fewer live registers (a spilled row counter cost a
  // store-to-load round trip per row).
  const int64_t sd = rs.d, sa = rs.a, sp = rs.c;
  for (int64_t r = rs.rows; r > 0; --r, dst += sd, a += sa, p += sp) {
    for (int v = 0; v < kV; ++v)
      hn::StoreU(f(hn::LoadU(d, a + v * N), bv[v], hn::LoadU(d, p + v * N), qv[v]), d, dst + v * N);
  }
}

// dst = p * q + (+-a) * b over a 3-D block; the all-contiguous case (rotary embedding,
// complex products) gets its own loop, other increments pick each source per vector.
template <bool kNeg>
HWY_INLINE void MulAddRows(const Rows& rs, float* dst, const float* a, int ainc, const float* b,
                           int binc, const float* p, int pinc, const float* q, int qinc,
                           int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto f = [](VF x, VF y, VF z, VF w)
                     DVM_INL { return hn::MulAdd(z, w, hn::Mul(kNeg ? hn::Neg(x) : x, y)); };
  const bool contiguous = ainc && binc && pinc && qinc;
  if (contiguous && rs.b == 0 && rs.e == 0 && n % N == 0 && n <= 4 * N) {
    for (int64_t k = 0; k < rs.outer; ++k) {
      float* dk = dst + k * rs.od;
      const float *ak = a + k * rs.oa, *bk = b + k * rs.ob, *pk = p + k * rs.oc,
                  *qk = q + k * rs.oe;
      switch (n / N) {
        case 1:
          MulAddRowsShared<1>(d, rs, dk, ak, bk, pk, qk, f);
          break;
        case 2:
          MulAddRowsShared<2>(d, rs, dk, ak, bk, pk, qk, f);
          break;
        case 3:
          MulAddRowsShared<3>(d, rs, dk, ak, bk, pk, qk, f);
          break;
        default:
          MulAddRowsShared<4>(d, rs, dk, ak, bk, pk, qk, f);
          break;
      }
    }
    return;
  }
  Map4Rows(d, rs, dst, a, ainc, b, binc, p, pinc, q, qinc, n, f,
           [&](float* dr, const float* ar, const float* br, const float* pr, const float* qr) {
             int64_t i = 0;
             for (; contiguous && i + N <= n; i += N) {
               hn::StoreU(f(hn::LoadU(d, ar + i), hn::LoadU(d, br + i), hn::LoadU(d, pr + i),
                            hn::LoadU(d, qr + i)),
                          d, dr + i);
             }
             return i;
           });
}

// dst = (a * b) * c + e over a 3-D block: a product feeding an fma's factor (layernorm's
// (x - mean) * rstd, then * weight + bias) in one pass, the product never stored. The same
// bits as the mul and the fma apart. a, c, e contiguous and b contiguous or one value per row
// (the common case) get their own loop; other increments pick each source per vector.
template <bool kB>
HWY_INLINE void MulFmaRow(DF d, float* dr, const float* ar, const float* br, const float* cr,
                          const float* er, int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vb = hn::Set(d, br[0]);
  const auto lb = [&](int64_t i) DVM_INL { return kB ? hn::LoadU(d, br + i) : vb; };
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const VF r0 = hn::MulAdd(hn::Mul(hn::LoadU(d, ar + i), lb(i)), hn::LoadU(d, cr + i),
                             hn::LoadU(d, er + i));
    const VF r1 = hn::MulAdd(hn::Mul(hn::LoadU(d, ar + i + N), lb(i + N)), hn::LoadU(d, cr + i + N),
                             hn::LoadU(d, er + i + N));
    hn::StoreU(r0, d, dr + i);
    hn::StoreU(r1, d, dr + i + N);
  }
  for (; i < n; i += N) {
    const int64_t m = std::min(N, n - i);
    const VF x = LoadTail(d, ar + i, m);
    const VF y = kB ? LoadTail(d, br + i, m) : vb;
    StoreTail(hn::MulAdd(hn::Mul(x, y), LoadTail(d, cr + i, m), LoadTail(d, er + i, m)), d, dr + i,
              m);
  }
}

void FusedMulFmaF32(Rows rs, float* dst, const float* a, int ainc, const float* b, int binc,
                    const float* c, int cinc, const float* e, int einc, int64_t n) {
  if (n <= 0) return;
  const DF d;
  const bool fast = ainc == 1 && cinc == 1 && einc == 1 && (binc == 0 || binc == 1);
  Map4Rows(
      d, rs, dst, a, ainc, b, binc, c, cinc, e, einc, n,
      [](VF x, VF y, VF z, VF w) DVM_INL { return hn::MulAdd(hn::Mul(x, y), z, w); },
      [&](float* dr, const float* ar, const float* br, const float* cr, const float* er) {
        if (!fast) return int64_t{0};
        if (binc) {
          MulFmaRow<true>(d, dr, ar, br, cr, er, n);
        } else {
          MulFmaRow<false>(d, dr, ar, br, cr, er, n);
        }
        return n;
      });
}

void FusedMulAddF32(bool negate, Rows rs, float* dst, const float* a, int ainc, const float* b,
                    int binc, const float* p, int pinc, const float* q, int qinc, int64_t n) {
  if (n <= 0) return;
  if (negate) return MulAddRows<true>(rs, dst, a, ainc, b, binc, p, pinc, q, qinc, n);
  MulAddRows<false>(rs, dst, a, ainc, b, binc, p, pinc, q, qinc, n);
}

// Two MulAddRowsShared bodies row by row: x's row, then y's, their shared rows of b and q
// in registers (4 * kV of them).
template <int kV, class FX, class FY>
HWY_INLINE void MulAddPairShared(DF d, const MulAddArgs& x, const MulAddArgs& y, int64_t k, FX fx,
                                 FY fy) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const Rows &rx = x.rows, &ry = y.rows;
  VF xb[kV], xq[kV], yb[kV], yq[kV];
  for (int v = 0; v < kV; ++v) {
    xb[v] = hn::LoadU(d, x.b + k * rx.ob + v * N);
    xq[v] = hn::LoadU(d, x.q + k * rx.oe + v * N);
    yb[v] = hn::LoadU(d, y.b + k * ry.ob + v * N);
    yq[v] = hn::LoadU(d, y.q + k * ry.oe + v * N);
  }
  float *xd = x.dst + k * rx.od, *yd = y.dst + k * ry.od;
  const float *xa = x.a + k * rx.oa, *xp = x.p + k * rx.oc;
  const float *ya = y.a + k * ry.oa, *yp = y.p + k * ry.oc;
  for (int64_t r = rx.rows; r > 0; --r) {
    for (int v = 0; v < kV; ++v)
      hn::StoreU(fx(hn::LoadU(d, xa + v * N), xb[v], hn::LoadU(d, xp + v * N), xq[v]), d,
                 xd + v * N);
    for (int v = 0; v < kV; ++v)
      hn::StoreU(fy(hn::LoadU(d, ya + v * N), yb[v], hn::LoadU(d, yp + v * N), yq[v]), d,
                 yd + v * N);
    xd += rx.d, xa += rx.a, xp += rx.c;
    yd += ry.d, ya += ry.a, yp += ry.c;
  }
}

template <bool kNegX, bool kNegY>
HWY_INLINE void MulAddPair(const MulAddArgs& x, const MulAddArgs& y, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto fx = [](VF a, VF b, VF p, VF q)
                      DVM_INL { return hn::MulAdd(p, q, hn::Mul(kNegX ? hn::Neg(a) : a, b)); };
  const auto fy = [](VF a, VF b, VF p, VF q)
                      DVM_INL { return hn::MulAdd(p, q, hn::Mul(kNegY ? hn::Neg(a) : a, b)); };
  for (int64_t k = 0; k < x.rows.outer; ++k) {
    switch (n / N) {
      case 1:
        MulAddPairShared<1>(d, x, y, k, fx, fy);
        break;
      case 2:
        MulAddPairShared<2>(d, x, y, k, fx, fy);
        break;
      case 3:
        MulAddPairShared<3>(d, x, y, k, fx, fy);
        break;
      default:
        MulAddPairShared<4>(d, x, y, k, fx, fy);
        break;
    }
  }
}

// Rows of one block (outer index k) of a MulAddArgs, as a one-block call.
MulAddArgs BlockOf(const MulAddArgs& m, int64_t k) {
  MulAddArgs one = m;
  one.rows.outer = 1;
  one.dst += k * m.rows.od;
  one.a += k * m.rows.oa;
  one.b += k * m.rows.ob;
  one.p += k * m.rows.oc;
  one.q += k * m.rows.oe;
  return one;
}

void FusedMulAddPairF32(const MulAddArgs& x, const MulAddArgs& y, int64_t n) {
  if (n <= 0) return;
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const auto shared = [n, N](const MulAddArgs& m) {
    return m.ainc && m.binc && m.pinc && m.qinc && m.rows.b == 0 && m.rows.e == 0 && n % N == 0 &&
           n <= 4 * N;
  };
  if (!shared(x) || !shared(y)) {  // block by block, x's block then y's
    for (int64_t k = 0; k < x.rows.outer; ++k) {
      const MulAddArgs xk = BlockOf(x, k), yk = BlockOf(y, k);
      FusedMulAddF32(xk.negate, xk.rows, xk.dst, xk.a, xk.ainc, xk.b, xk.binc, xk.p, xk.pinc, xk.q,
                     xk.qinc, n);
      FusedMulAddF32(yk.negate, yk.rows, yk.dst, yk.a, yk.ainc, yk.b, yk.binc, yk.p, yk.pinc, yk.q,
                     yk.qinc, n);
    }
    return;
  }
  if (x.negate) {
    return y.negate ? MulAddPair<true, true>(x, y, n) : MulAddPair<true, false>(x, y, n);
  }
  return y.negate ? MulAddPair<false, true>(x, y, n) : MulAddPair<false, false>(x, y, n);
}

// Float != is unordered (NaN != x is true), so it is computed as !(x == y).
void CompareF32(BinaryOp op, int32_t* dst, const float* a, int ainc, const float* b, int binc,
                int64_t n) {
  const DF d;
  const DI di;
  const VI one = hn::Set(di, 1);
  const auto run = [&](auto f) { Map2Rows(di, d, Rows{}, dst, a, ainc, b, binc, n, f); };
  const auto nonzero = [d, one](VF x) {
    return hn::Xor(MaskToI32(d, hn::Eq(x, hn::Zero(d))), one);
  };
  switch (op) {
    case BinaryOp::kEq:
      return run([d](VF x, VF y) { return MaskToI32(d, hn::Eq(x, y)); });
    case BinaryOp::kNe:
      return run([d, one](VF x, VF y) { return hn::Xor(MaskToI32(d, hn::Eq(x, y)), one); });
    case BinaryOp::kLt:
      return run([d](VF x, VF y) { return MaskToI32(d, hn::Lt(x, y)); });
    case BinaryOp::kLe:
      return run([d](VF x, VF y) { return MaskToI32(d, hn::Le(x, y)); });
    case BinaryOp::kGt:
      return run([d](VF x, VF y) { return MaskToI32(d, hn::Gt(x, y)); });
    case BinaryOp::kGe:
      return run([d](VF x, VF y) { return MaskToI32(d, hn::Ge(x, y)); });
    case BinaryOp::kLogicalAnd:
      return run([nonzero](VF x, VF y) { return hn::And(nonzero(x), nonzero(y)); });
    case BinaryOp::kLogicalOr:
      return run([nonzero](VF x, VF y) { return hn::Or(nonzero(x), nonzero(y)); });
    default:
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = ops::compare_f32(op, a[ainc ? i : 0], b[binc ? i : 0]);
      }
  }
}

void Select32(uint32_t* dst, const int32_t* cond, int cinc, const uint32_t* a, int ainc,
              const uint32_t* b, int binc, int64_t n) {
  const DU du;
  using VU = hn::Vec<DU>;
  // The condition is reinterpreted as u32: non-zero iff the i32 is non-zero.
  const uint32_t* c = reinterpret_cast<const uint32_t*>(cond);
  Map3Rows(du, Rows{}, dst, c, cinc, a, ainc, b, binc, n,
           [du](VU vc, VU va, VU vb) { return hn::IfThenElse(hn::Ne(vc, hn::Zero(du)), va, vb); });
}

void FmaF32(Rows rs, float* dst, const float* a, int ainc, const float* b, int binc, const float* c,
            int cinc, int64_t n) {
  if (SplitOuter(rs, [&](const Rows& one, int64_t od, int64_t oa, int64_t ob, int64_t oc) {
        FmaF32(one, dst + od, a + oa, ainc, b + ob, binc, c + oc, cinc, n);
      }))
    return;
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
  // No fused multiply-add instruction: keep the single rounding of the spec.
  for (int64_t r = 0; r < rs.rows; ++r) {
    float* dr = dst + r * rs.d;
    const float *ar = a + r * rs.a, *br = b + r * rs.b, *cr = c + r * rs.c;
    for (int64_t i = 0; i < n; ++i) {
      dr[i] = std::fma(ar[ainc ? i : 0], br[binc ? i : 0], cr[cinc ? i : 0]);
    }
  }
#else
  const DF d;
  Map3Rows(d, rs, dst, a, ainc, b, binc, c, cinc, n,
           [](VF x, VF y, VF z) { return hn::MulAdd(x, y, z); });
#endif
}

// ------------------------------------------------------------------------------------------
// f32 reductions: four independent accumulators over full vectors, the tail padded with the
// identity, then a fixed-order fold of the lanes. Deterministic for a given n and target.

// The lanes of v combined as a balanced tree (lane k with lane k + N/2, then k + N/4, ...):
// a fixed order, and log2(N) dependent steps instead of N - 1. Through memory: the rare ops.
template <class C>
HWY_INLINE float FoldLanes(DF d, VF v, C comb) {
  constexpr int64_t kMax = static_cast<int64_t>(kMaxLanes);
  HWY_ALIGN float lanes[kMax];
  hn::Store(v, d, lanes);
  for (int64_t w = static_cast<int64_t>(hn::Lanes(d)) / 2; w >= 1; w /= 2)
    for (int64_t k = 0; k < w; ++k) lanes[k] = comb(lanes[k], lanes[k + w]);
  return lanes[0];
}

// Sum / max / min of the lanes in registers (a fixed shuffle tree per target). Max and min
// return the first NaN lane if there is one (the shuffles would drop it).
HWY_INLINE float FoldSum(DF d, VF v) {
  return hn::GetLane(hn::SumOfLanes(d, v));
}
HWY_INLINE float FirstNaN(DF d, VF v) {
  HWY_ALIGN float lanes[kMaxLanes];
  hn::Store(v, d, lanes);
  for (size_t k = 0; k < hn::Lanes(d); ++k)
    if (std::isnan(lanes[k])) return lanes[k];
  return lanes[0];
}
HWY_INLINE float FoldMax(DF d, VF v) {
  if (HWY_UNLIKELY(!hn::AllFalse(d, hn::IsNaN(v)))) return FirstNaN(d, v);
  return hn::GetLane(hn::MaxOfLanes(d, v));
}
HWY_INLINE float FoldMin(DF d, VF v) {
  if (HWY_UNLIKELY(!hn::AllFalse(d, hn::IsNaN(v)))) return FirstNaN(d, v);
  return hn::GetLane(hn::MinOfLanes(d, v));
}

// Reduces one row: four vector accumulators over full vectors, the tail's missing lanes set
// to the identity, then `fold` (vector -> float). `f` combines vectors.
template <class F, class Fold>
HWY_INLINE float ReduceRowVec(DF d, const float* a, int ainc, int64_t n, float identity, F f,
                              Fold fold) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF id = hn::Set(d, identity);
  const VF bcast = hn::Set(d, a[0]);
  const auto load = [&](int64_t i) { return ainc ? hn::LoadU(d, a + i) : bcast; };
  VF acc0 = id, acc1 = id, acc2 = id, acc3 = id;
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    acc0 = f(acc0, load(i));
    acc1 = f(acc1, load(i + N));
    acc2 = f(acc2, load(i + 2 * N));
    acc3 = f(acc3, load(i + 3 * N));
  }
  for (; i + N <= n; i += N) acc0 = f(acc0, load(i));
  if (i < n) {
    const int64_t m = n - i;
    const VF x = ainc ? LoadTail(d, a + i, m) : bcast;
    acc1 = f(acc1, hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(m)), x, id));
  }
  return fold(f(f(acc0, acc1), f(acc2, acc3)));
}

// Rows in order: an accumulator shared by several rows (row stride 0) combines them in turn.
void ReduceRowF32(ReduceOp op, Rows rs, float* acc, const float* a, int ainc, int64_t n) {
  if (n <= 0) return;
  const DF d;
  const float id = reduce_identity<float>(op);
  const auto run = [&](auto f, auto fold) {
    for (int64_t r = 0; r < rs.rows; ++r) {
      float* ar = acc + r * rs.d;
      *ar = reduce_combine_f32(op, *ar, ReduceRowVec(d, a + r * rs.a, ainc, n, id, f, fold));
    }
  };
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return run([](VF x, VF y) { return hn::Add(x, y); }, [d](VF v) { return FoldSum(d, v); });
    case ReduceOp::kProd:
      return run([](VF x, VF y) { return hn::Mul(x, y); },
                 [d](VF v) { return FoldLanes(d, v, [](float x, float y) { return x * y; }); });
    case ReduceOp::kMax:
    case ReduceOp::kArgMax:
      return run([](VF x, VF y) { return NanMax(x, y); }, [d](VF v) { return FoldMax(d, v); });
    case ReduceOp::kMin:
    case ReduceOp::kArgMin:
      return run([](VF x, VF y) { return NanMin(x, y); }, [d](VF v) { return FoldMin(d, v); });
  }
}

// *acc += sum a[i] * b[i], four vector accumulators combined in a fixed order. kSquare: b is
// a (same pointer and increment), so each vector is loaded once (the L1 load ports, not the
// FMAs, bound this loop).
template <bool kSquare>
HWY_INLINE void DotRowOne(DF d, float* acc, const float* a, int ainc, const float* b, int binc,
                          int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF ba = hn::Set(d, a[0]), bb = hn::Set(d, b[0]);
  const auto la = [&](int64_t i) { return ainc ? hn::LoadU(d, a + i) : ba; };
  const auto lb = [&](int64_t i) { return binc ? hn::LoadU(d, b + i) : bb; };
  const auto sq = [&](VF x, int64_t i, VF s) {
    if constexpr (kSquare) return hn::MulAdd(x, x, s);
    return hn::MulAdd(x, lb(i), s);
  };
  VF acc0 = hn::Zero(d), acc1 = hn::Zero(d), acc2 = hn::Zero(d), acc3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    acc0 = sq(la(i), i, acc0);
    acc1 = sq(la(i + N), i + N, acc1);
    acc2 = sq(la(i + 2 * N), i + 2 * N, acc2);
    acc3 = sq(la(i + 3 * N), i + 3 * N, acc3);
  }
  for (; i + N <= n; i += N) acc0 = sq(la(i), i, acc0);
  if (i < n) {  // missing lanes are 0 * 0 (a broadcast inf must not make 0 * inf = NaN)
    const int64_t m = n - i;
    const auto live = hn::FirstN(d, static_cast<size_t>(m));
    const VF xa = ainc ? LoadTail(d, a + i, m) : hn::IfThenElseZero(live, ba);
    const VF xb = binc ? LoadTail(d, b + i, m) : hn::IfThenElseZero(live, bb);
    acc1 = hn::MulAdd(xa, xb, acc1);
  }
  acc0 = hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3));
  *acc += FoldSum(d, acc0);
}

void DotRowF32(Rows rs, float* acc, const float* a, int ainc, const float* b, int binc, int64_t n) {
  if (n <= 0) return;
  const DF d;
  if (a == b && ainc == binc && rs.a == rs.b) {  // a sum of squares: each vector loaded once
    for (int64_t r = 0; r < rs.rows; ++r)
      DotRowOne<true>(d, acc + r * rs.d, a + r * rs.a, ainc, a + r * rs.a, ainc, n);
    return;
  }
  for (int64_t r = 0; r < rs.rows; ++r)
    DotRowOne<false>(d, acc + r * rs.d, a + r * rs.a, ainc, b + r * rs.b, binc, n);
}

// A map and the row reduction of its result in one pass (cpu::map_reduce_f32_rows): y = f(a,
// b, c) stored as the map kernels store it, and per row out[r] = the reduction of y with
// exactly ReduceRowVec's (kRowSum, kRowMax) or DotRowOne's (kRowSumSquares) accumulators,
// tail and fold, so the same bits as the two instructions apart, without loading y again.
// row(r) gives row r's map: y(i, m), the vector at column i (m < 0: a full vector, else its
// first m lanes, the others unspecified).
template <class Row, class Step, class Merge, class Tail, class Fold>
HWY_INLINE void MapReduceGrid(DF d, const Rows& rs, float* dst, int64_t n, float* out, VF id,
                              Row row, Step step, Merge merge, Tail tail, Fold fold) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < rs.rows; ++r) {
    float* dr = dst + r * rs.d;
    const auto y = row(r);
    VF acc0 = id, acc1 = id, acc2 = id, acc3 = id;
    int64_t i = 0;
    for (; i + 4 * N <= n; i += 4 * N) {
      const VF y0 = y(i, -1), y1 = y(i + N, -1), y2 = y(i + 2 * N, -1), y3 = y(i + 3 * N, -1);
      hn::StoreU(y0, d, dr + i);
      hn::StoreU(y1, d, dr + i + N);
      hn::StoreU(y2, d, dr + i + 2 * N);
      hn::StoreU(y3, d, dr + i + 3 * N);
      acc0 = step(acc0, y0);
      acc1 = step(acc1, y1);
      acc2 = step(acc2, y2);
      acc3 = step(acc3, y3);
    }
    for (; i + N <= n; i += N) {
      const VF y0 = y(i, -1);
      hn::StoreU(y0, d, dr + i);
      acc0 = step(acc0, y0);
    }
    if (i < n) {
      const int64_t m = n - i;
      const VF yt = y(i, m);
      StoreTail(yt, d, dr + i, m);
      acc1 = step(acc1, tail(hn::FirstN(d, static_cast<size_t>(m)), yt));
    }
    out[r] = fold(merge(merge(acc0, acc1), merge(acc2, acc3)));
  }
}

// Row maps for MapReduceGrid: a contiguous; b and c contiguous (kB, kC) or one value per row.
template <bool kB, bool kC, class F>
HWY_INLINE auto RowMap(DF d, const Rows& rs, const float* a, const float* b, const float* c, F f) {
  return [=](int64_t r) DVM_INL {
    const float* ar = a + r * rs.a;
    const float* br = b + r * rs.b;
    const float* cr = c + r * rs.c;
    const VF vb = hn::Set(d, br[0]), vc = hn::Set(d, cr[0]);
    return [=](int64_t i, int64_t m) DVM_INL {
      const auto ld = [&](const float* p)
                          DVM_INL { return m < 0 ? hn::LoadU(d, p + i) : LoadTail(d, p + i, m); };
      return f(ld(ar), kB ? ld(br) : vb, kC ? ld(cr) : vc);
    };
  };
}

// The reduction half of MapReduceF32: accumulators, tail lanes and fold of `red`, over the
// row map `row`.
template <class Row>
HWY_INLINE bool MapReduceWith(DF d, int red, const Rows& rs, float* dst, int64_t n, float* out,
                              Row row) {
  const auto add = [](VF x, VF y) { return hn::Add(x, y); };
  switch (red) {
    case kRowSum: {
      const VF id = hn::Set(d, reduce_identity<float>(ReduceOp::kSum));
      MapReduceGrid(
          d, rs, dst, n, out, id, row, add, add,
          [id](auto live, VF y) { return hn::IfThenElse(live, y, id); },
          [d](VF v) { return FoldSum(d, v); });
      return true;
    }
    case kRowMax: {
      const VF id = hn::Set(d, reduce_identity<float>(ReduceOp::kMax));
      const auto mx = [](VF x, VF y) { return NanMax(x, y); };
      MapReduceGrid(
          d, rs, dst, n, out, id, row, mx, mx,
          [id](auto live, VF y) { return hn::IfThenElse(live, y, id); },
          [d](VF v) { return FoldMax(d, v); });
      return true;
    }
    case kRowSumSquares:
      MapReduceGrid(
          d, rs, dst, n, out, hn::Zero(d), row, [](VF s, VF y) { return hn::MulAdd(y, y, s); }, add,
          [](auto live, VF y) { return hn::IfThenElseZero(live, y); },
          [d](VF v) { return FoldSum(d, v); });
      return true;
    default:
      return false;
  }
}

// kind 0: y = a + b, a - b or a * b (BinaryOp op); kind 1: y = exp(a + b) / exp(a - b) (pre 1 /
// 2); kind 2: y = a * b + c (fma; c contiguous). Returns false, having done nothing, for other
// ops and operand forms.
bool MapReduceF32(int kind, int op, int pre, int red, Rows rs, float* dst, const float* a, int ainc,
                  const float* b, int binc, const float* c, int cinc, int64_t n, float* out) {
  if (rs.outer > 1 || n <= 0 || ainc != 1 || (binc != 0 && binc != 1)) return false;
  const DF d;
  // Two sources: c unused (a stands in, so that its first element can be read).
  const auto run = [&](auto f) {
    const auto g = [f](VF x, VF y, VF) DVM_INL { return f(x, y); };
    Rows two = rs;
    two.c = rs.a;
    return binc ? MapReduceWith(d, red, two, dst, n, out, RowMap<true, false>(d, two, a, b, a, g))
                : MapReduceWith(d, red, two, dst, n, out, RowMap<false, false>(d, two, a, b, a, g));
  };
  if (kind == 0) {
    bool done = false;
    WithAddSubMul(static_cast<BinaryOp>(op), [&](auto f) { done = run(f); });
    return done;
  }
  if (kind == 1 && static_cast<UnaryOp>(op) == UnaryOp::kExp) {
    if (pre == 1) return run([d](VF x, VF y) DVM_INL { return ExpF(d, hn::Add(x, y)); });
    if (pre == 2) return run([d](VF x, VF y) DVM_INL { return ExpF(d, hn::Sub(x, y)); });
  }
  if (kind == 2 && cinc == 1) {  // softmax's scores * scale + mask
    const auto f = [](VF x, VF y, VF z) { return hn::MulAdd(x, y, z); };
    return binc ? MapReduceWith(d, red, rs, dst, n, out, RowMap<true, true>(d, rs, a, b, c, f))
                : MapReduceWith(d, red, rs, dst, n, out, RowMap<false, true>(d, rs, a, b, c, f));
  }
  return false;
}

// acc[i] = combine(acc[i], a[r][i]) for rows r in order, a contiguous along the row (row
// stride rs.a). The accumulator stays in registers across the rows (four vectors at a time):
// one load and store of it per block instead of per row; the same order, so the same bits.
template <class F>
HWY_INLINE void AccumulateRowGroup(DF d, const Rows& rs, float* acc, const float* a, int64_t n,
                                   F f);

// Many rows go in groups of kAccumulateGroup, each group over all columns: the rows stream
// through L1 in memory order (a column block over all rows would walk them 4 KiB apart), and
// acc is loaded and stored once per group. Rows combine into acc in row order either way.
constexpr int64_t kAccumulateGroup = 8;

template <class F>
HWY_INLINE void AccumulateRows(DF d, const Rows& rs, float* acc, const float* a, int64_t n, F f) {
  for (int64_t r = 0; r < rs.rows; r += kAccumulateGroup) {
    Rows g = rs;
    g.rows = std::min(kAccumulateGroup, rs.rows - r);
    AccumulateRowGroup(d, g, acc, a + r * rs.a, n, f);
  }
}

template <class F>
HWY_INLINE void AccumulateRowGroup(DF d, const Rows& rs, float* acc, const float* a, int64_t n,
                                   F f) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    VF v0 = hn::LoadU(d, acc + i), v1 = hn::LoadU(d, acc + i + N);
    VF v2 = hn::LoadU(d, acc + i + 2 * N), v3 = hn::LoadU(d, acc + i + 3 * N);
    for (int64_t r = 0; r < rs.rows; ++r) {
      const float* ar = a + r * rs.a + i;
      v0 = f(v0, hn::LoadU(d, ar));
      v1 = f(v1, hn::LoadU(d, ar + N));
      v2 = f(v2, hn::LoadU(d, ar + 2 * N));
      v3 = f(v3, hn::LoadU(d, ar + 3 * N));
    }
    hn::StoreU(v0, d, acc + i);
    hn::StoreU(v1, d, acc + i + N);
    hn::StoreU(v2, d, acc + i + 2 * N);
    hn::StoreU(v3, d, acc + i + 3 * N);
  }
  for (; i < n; i += N) {
    const int64_t m = std::min(N, n - i);
    VF v = LoadTail(d, acc + i, m);
    for (int64_t r = 0; r < rs.rows; ++r) v = f(v, LoadTail(d, a + r * rs.a + i, m));
    StoreTail(v, d, acc + i, m);
  }
}

void AccumulateF32(ReduceOp op, Rows rs, float* acc, const float* a, int ainc, int64_t n) {
  const DF d;
  const auto run = [&](auto f) {
    if (ainc == 1) return AccumulateRows(d, rs, acc, a, n, f);
    for (int64_t r = 0; r < rs.rows; ++r)  // a broadcast row: rare
      Map2Rows(d, d, Rows{}, acc, acc, 1, a + r * rs.a, ainc, n, f);
  };
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return run([](VF x, VF y) { return hn::Add(x, y); });
    case ReduceOp::kProd:
      return run([](VF x, VF y) { return hn::Mul(x, y); });
    case ReduceOp::kMax:
    case ReduceOp::kArgMax:
      return run([](VF x, VF y) { return NanMax(x, y); });
    case ReduceOp::kMin:
    case ReduceOp::kArgMin:
      return run([](VF x, VF y) { return NanMin(x, y); });
  }
}

// dst[r * drs + c] = src[c * scs + r] for r < rows, c < cols: a transposed copy (a tile read
// from, or written to, memory that is contiguous along the tile's rows). 8 x 8 blocks go
// through registers (eight 8-lane loads, 24 shuffles, eight stores) on targets with 256-bit
// vectors; the edges and other targets copy element by element.
void TransposeF32(float* dst, int64_t drs, const float* src, int64_t scs, int64_t rows,
                  int64_t cols) {
  int64_t r0 = 0, c0 = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::Full256<float> d8;
  const hn::Full256<double> d64;
  const auto il64 = [&](hn::Vec256<float> a, hn::Vec256<float> b) {
    return hn::BitCast(d8, hn::InterleaveLower(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  const auto iu64 = [&](hn::Vec256<float> a, hn::Vec256<float> b) {
    return hn::BitCast(d8, hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (int64_t c = 0; c < cols8; c += 8) {
    for (int64_t r = 0; r < rows8; r += 8) {
      // v[k]: source column c + k (8 consecutive rows r..r+7), i.e. tile column c + k.
      hn::Vec256<float> v[8];
      for (int k = 0; k < 8; ++k) v[k] = hn::LoadU(d8, src + (c + k) * scs + r);
      hn::Vec256<float> t[8], u[8];
      for (int k = 0; k < 8; k += 2) {
        t[k] = hn::InterleaveLower(d8, v[k], v[k + 1]);
        t[k + 1] = hn::InterleaveUpper(d8, v[k], v[k + 1]);
      }
      for (int k = 0; k < 8; k += 4) {
        u[k] = il64(t[k], t[k + 2]);
        u[k + 1] = iu64(t[k], t[k + 2]);
        u[k + 2] = il64(t[k + 1], t[k + 3]);
        u[k + 3] = iu64(t[k + 1], t[k + 3]);
      }
      // u[j] (j < 4) holds elements j and j + 4 of source columns c..c+3, u[j + 4] of c+4..c+7.
      for (int j = 0; j < 4; ++j) {
        hn::StoreU(hn::ConcatLowerLower(d8, u[j + 4], u[j]), d8, dst + (r + j) * drs + c);
        hn::StoreU(hn::ConcatUpperUpper(d8, u[j + 4], u[j]), d8, dst + (r + j + 4) * drs + c);
      }
    }
  }
  r0 = rows8;
  c0 = cols8;
#endif
  // The edges: the last rows of the blocked columns, then the last columns.
  for (int64_t c = 0; c < c0; ++c)
    for (int64_t r = r0; r < rows; ++r) dst[r * drs + c] = src[c * scs + r];
  for (int64_t c = c0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) dst[r * drs + c] = src[c * scs + r];
}

int64_t TargetId() {
  return HWY_TARGET;
}

// f16 / bf16 storage -> f32, n contiguous elements: exact conversions (bf16 is the high half
// of an f32; f16 widens exactly, F16C where the target has it).
void HalfToF32(DType from, float* dst, const uint16_t* src, int64_t n) {
  const DF d;
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<uint32_t, DF> du32;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (from == DType::kBF16) {
    for (; i + lanes <= n; i += lanes) {
      const auto u = hn::PromoteTo(du32, hn::LoadU(du16, src + i));
      hn::StoreU(hn::BitCast(d, hn::ShiftLeft<16>(u)), d, dst + i);
    }
    for (; i < n; ++i) dst[i] = bf16_bits_to_f32(src[i]);
    return;
  }
  const hn::Rebind<hwy::float16_t, DF> df16;
  const auto* h = reinterpret_cast<const hwy::float16_t*>(src);
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::PromoteTo(d, hn::LoadU(df16, h + i)), d, dst + i);
  for (; i < n; ++i) dst[i] = f16_bits_to_f32(src[i]);
}

// f32 -> bf16 storage, n contiguous elements, exactly as ops::f32_to_bf16_bits: round to
// nearest even, NaN kept quiet. (Highway 1.0's DemoteTo to bf16 truncates, so it is done
// here with integer ops.)
void F32ToBF16(uint16_t* dst, const float* src, int64_t n) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto u = hn::BitCast(du, hn::LoadU(d, src + i));
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), lsb)));
    // |x| bits > inf bits: NaN (both sides non-negative, so a signed compare is exact).
    const auto is_nan =
        hn::Gt(hn::BitCast(di, hn::And(u, hn::Set(du, 0x7FFFFFFFu))), hn::Set(di, 0x7F800000));
    const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
    const auto r = hn::IfThenElse(hn::RebindMask(du, is_nan), quiet, rounded);
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, r)), du16, dst + i);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16_bits(src[i]);
}

// f32 -> f16 storage bits, n contiguous elements, exactly as ops::f32_to_f16_bits (round to
// nearest even, subnormals, overflow to inf, NaN kept quiet). Vectorised only where the target
// converts in hardware (F16C: Highway's AVX2 and AVX-512 targets); Highway 1.0's software
// fallback truncates, so other targets use the scalar spec.
void F32ToF16(uint16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  const DF d;
  const hn::Rebind<hwy::float16_t, DF> df16;
  auto* h = reinterpret_cast<hwy::float16_t*>(dst);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::DemoteTo(df16, hn::LoadU(d, src + i)), df16, h + i);
#endif
  for (; i < n; ++i) dst[i] = f32_to_f16_bits(src[i]);
}

// x rounded to f16 (or bf16) and widened back to f32, n contiguous elements: the value a
// half-precision cast holds (ops::round_f16 / round_bf16).
void RoundHalfF32(DType t, float* dst, const float* a, int64_t n) {
  constexpr int64_t kStrip = 1024;
  HWY_ALIGN uint16_t bits[kStrip];
  for (int64_t i = 0; i < n; i += kStrip) {
    const int64_t m = std::min(kStrip, n - i);
    if (t == DType::kF16) {
      F32ToF16(bits, a + i, m);
    } else {
      F32ToBF16(bits, a + i, m);
    }
    HalfToF32(t, dst + i, bits, m);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dvm::vm::cpu {

thread_local bool g_stream_stores = false;

void set_stream_stores(bool on) {
  g_stream_stores = on;
}

void stream_fence() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_sfence();
#endif
}

using namespace dvm::ops;  // NOLINT

HWY_EXPORT(UnaryF32);
HWY_EXPORT(FusedMulAddPairF32);
HWY_EXPORT(UnaryPreF32);
HWY_EXPORT(PredicateF32);
HWY_EXPORT(BinaryF32);
HWY_EXPORT(CompareF32);
HWY_EXPORT(Select32);
HWY_EXPORT(FmaF32);
HWY_EXPORT(FusedMulF32);
HWY_EXPORT(FusedMulAddF32);
HWY_EXPORT(FusedMulFmaF32);
HWY_EXPORT(ReduceRowF32);
HWY_EXPORT(DotRowF32);
HWY_EXPORT(TransposeF32);
HWY_EXPORT(MapReduceF32);
HWY_EXPORT(AccumulateF32);
HWY_EXPORT(HalfToF32);
HWY_EXPORT(F32ToBF16);
HWY_EXPORT(F32ToF16);
HWY_EXPORT(RoundHalfF32);
HWY_EXPORT(TargetId);

namespace {

// Plain loops over the scalar spec; the op switch is hoisted out of the loop so that GCC can
// vectorise the simple cases.
template <typename TO, typename TA, typename F>
void loop1(TO* dst, const TA* a, int ainc, int64_t n, F f) {
  if (ainc) {
    for (int64_t i = 0; i < n; ++i) dst[i] = f(a[i]);
  } else if (n > 0) {
    const TO v = f(a[0]);
    for (int64_t i = 0; i < n; ++i) dst[i] = v;
  }
}
template <typename TO, typename TA, typename F>
void loop2(TO* dst, const TA* a, int ainc, const TA* b, int binc, int64_t n, F f) {
  if (ainc && binc) {
    for (int64_t i = 0; i < n; ++i) dst[i] = f(a[i], b[i]);
  } else if (ainc) {
    const TA y = b[0];
    for (int64_t i = 0; i < n; ++i) dst[i] = f(a[i], y);
  } else if (binc) {
    const TA x = a[0];
    for (int64_t i = 0; i < n; ++i) dst[i] = f(x, b[i]);
  } else if (n > 0) {
    const TO v = f(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) dst[i] = v;
  }
}

template <typename T>
void unary_int_row(UnaryOp op, T* dst, const T* a, int ainc, int64_t n) {
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
void binary_int_row(BinaryOp op, T* dst, const T* a, int ainc, const T* b, int binc, int64_t n) {
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
    default:
      return loop2(dst, a, ainc, b, binc, n, [op](T x, T y) { return binary_int<T>(op, x, y); });
  }
}

template <typename T>
void compare_int_row(BinaryOp op, int32_t* dst, const T* a, int ainc, const T* b, int binc,
                     int64_t n) {
  switch (op) {
    case BinaryOp::kEq:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{x == y}; });
    case BinaryOp::kLt:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{x < y}; });
    case BinaryOp::kGt:
      return loop2(dst, a, ainc, b, binc, n, [](T x, T y) { return int32_t{x > y}; });
    default:
      return loop2(dst, a, ainc, b, binc, n, [op](T x, T y) { return compare<T>(op, x, y); });
  }
}

template <typename T>
void reduce_row_int(ReduceOp op, T* acc, const T* a, int ainc, int64_t n) {
  T r = reduce_identity<T>(op);
  if (ainc) {
    for (int64_t i = 0; i < n; ++i) r = reduce_combine_int<T>(op, r, a[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) r = reduce_combine_int<T>(op, r, a[0]);
  }
  *acc = reduce_combine_int<T>(op, *acc, r);
}

template <typename T>
void accumulate_int(ReduceOp op, T* acc, const T* a, int ainc, int64_t n) {
  loop2(acc, acc, 1, a, ainc, n, [op](T x, T y) { return reduce_combine_int<T>(op, x, y); });
}

template <typename T>
void argreduce_row(ReduceOp op, T* vacc, int64_t* iacc, const T* a, int ainc, int64_t n,
                   int64_t base) {
  if (n <= 0) return;
  T best = a[0];
  int64_t bi = base;
  for (int64_t i = 1; i < n; ++i) {
    const T v = a[ainc ? i : 0];
    if (arg_better<T>(op, v, base + i, best, bi)) {
      best = v;
      bi = base + i;
    }
  }
  if (arg_better<T>(op, best, bi, *vacc, *iacc)) {
    *vacc = best;
    *iacc = bi;
  }
}

template <typename T>
void argaccumulate(ReduceOp op, T* vacc, int64_t* iacc, const T* a, int ainc, int64_t n,
                   int64_t index) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = a[ainc ? i : 0];
    if (arg_better<T>(op, v, index, vacc[i], iacc[i])) {
      vacc[i] = v;
      iacc[i] = index;
    }
  }
}

template <typename T>
T load_elem(DType from, const void* src, int64_t i) {
  switch (from) {
    case DType::kF32:
      return static_cast<const float*>(src)[i];
    case DType::kF16:
      return f16_bits_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::kBF16:
      return bf16_bits_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::kI32:
      return static_cast<const int32_t*>(src)[i];
    case DType::kI64:
      return static_cast<const int64_t*>(src)[i];
    case DType::kBool:
      return static_cast<const uint8_t*>(src)[i] != 0 ? 1 : 0;
  }
  return T{};
}

}  // namespace

void unary_pre_f32(UnaryOp op, int pre, float* dst, const float* a, int ainc, const float* b,
                   int binc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(UnaryPreF32)(op, pre, Rows{}, dst, a, ainc, b, binc, n);
}
void unary_f32(UnaryOp op, float* dst, const float* a, int ainc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(UnaryF32)(op, Rows{}, dst, a, ainc, n);
}
void unary_pre_f32_rows(UnaryOp op, int pre, const Rows& rows, float* dst, const float* a, int ainc,
                        const float* b, int binc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(UnaryPreF32)(op, pre, rows, dst, a, ainc, b, binc, n);
}
void unary_f32_rows(UnaryOp op, const Rows& rows, float* dst, const float* a, int ainc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(UnaryF32)(op, rows, dst, a, ainc, n);
}
void unary_i32(UnaryOp op, int32_t* dst, const int32_t* a, int ainc, int64_t n) {
  unary_int_row<int32_t>(op, dst, a, ainc, n);
}
void unary_i64(UnaryOp op, int64_t* dst, const int64_t* a, int ainc, int64_t n) {
  unary_int_row<int64_t>(op, dst, a, ainc, n);
}
void predicate_f32(UnaryOp op, int32_t* dst, const float* a, int ainc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(PredicateF32)(op, dst, a, ainc, n);
}
void predicate_i32(UnaryOp op, int32_t* dst, const int32_t* a, int ainc, int64_t n) {
  loop1(dst, a, ainc, n, [op](int32_t x) { return ops::predicate_i32(op, x); });
}
void predicate_i64(UnaryOp op, int32_t* dst, const int64_t* a, int ainc, int64_t n) {
  loop1(dst, a, ainc, n, [op](int64_t x) { return ops::predicate_i64(op, x); });
}

void binary_f32(BinaryOp op, float* dst, const float* a, int ainc, const float* b, int binc,
                int64_t n) {
  HWY_DYNAMIC_DISPATCH(BinaryF32)(op, Rows{}, dst, a, ainc, b, binc, n);
}
void binary_f32_rows(BinaryOp op, const Rows& rows, float* dst, const float* a, int ainc,
                     const float* b, int binc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(BinaryF32)(op, rows, dst, a, ainc, b, binc, n);
}
void binary_i32(BinaryOp op, int32_t* dst, const int32_t* a, int ainc, const int32_t* b, int binc,
                int64_t n) {
  binary_int_row<int32_t>(op, dst, a, ainc, b, binc, n);
}
void binary_i64(BinaryOp op, int64_t* dst, const int64_t* a, int ainc, const int64_t* b, int binc,
                int64_t n) {
  binary_int_row<int64_t>(op, dst, a, ainc, b, binc, n);
}
void compare_f32(BinaryOp op, int32_t* dst, const float* a, int ainc, const float* b, int binc,
                 int64_t n) {
  HWY_DYNAMIC_DISPATCH(CompareF32)(op, dst, a, ainc, b, binc, n);
}
void compare_i32(BinaryOp op, int32_t* dst, const int32_t* a, int ainc, const int32_t* b, int binc,
                 int64_t n) {
  compare_int_row<int32_t>(op, dst, a, ainc, b, binc, n);
}
void compare_i64(BinaryOp op, int32_t* dst, const int64_t* a, int ainc, const int64_t* b, int binc,
                 int64_t n) {
  compare_int_row<int64_t>(op, dst, a, ainc, b, binc, n);
}

void select(int elem_bytes, void* dst, const int32_t* cond, int cinc, const void* a, int ainc,
            const void* b, int binc, int64_t n) {
  if (elem_bytes == 4) {
    HWY_DYNAMIC_DISPATCH(Select32)
    (static_cast<uint32_t*>(dst), cond, cinc, static_cast<const uint32_t*>(a), ainc,
     static_cast<const uint32_t*>(b), binc, n);
    return;
  }
  auto* d = static_cast<uint64_t*>(dst);
  const auto* x = static_cast<const uint64_t*>(a);
  const auto* y = static_cast<const uint64_t*>(b);
  for (int64_t i = 0; i < n; ++i) {
    d[i] = cond[cinc ? i : 0] != 0 ? x[ainc ? i : 0] : y[binc ? i : 0];
  }
}

void convert(CType to, void* dst, CType from, const void* src, int sinc, int64_t n) {
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

void round_to_f16(float* dst, const float* a, int ainc, int64_t n) {
  if (ainc == 1) return HWY_DYNAMIC_DISPATCH(RoundHalfF32)(DType::kF16, dst, a, n);
  loop1(dst, a, ainc, n, round_f16);
}
void round_to_bf16(float* dst, const float* a, int ainc, int64_t n) {
  if (ainc == 1) return HWY_DYNAMIC_DISPATCH(RoundHalfF32)(DType::kBF16, dst, a, n);
  loop1(dst, a, ainc, n, round_bf16);
}

void load_convert(void* dst, DType from, const void* src, int64_t sstride, int64_t n) {
  switch (compute_type(from)) {
    case CType::kF32: {
      auto* d = static_cast<float*>(dst);
      if (from == DType::kF32 && sstride == 1) {
        if (n > 0) std::memcpy(d, src, static_cast<size_t>(n) * sizeof(float));
        return;
      }
      if (from != DType::kF32 && sstride == 1) {
        return HWY_DYNAMIC_DISPATCH(HalfToF32)(from, d, static_cast<const uint16_t*>(src), n);
      }
      // Strided: one loop per source type (no per-element dispatch).
      if (from == DType::kF32) {
        const auto* s = static_cast<const float*>(src);
        for (int64_t i = 0; i < n; ++i) d[i] = s[i * sstride];
        return;
      }
      const auto* h = static_cast<const uint16_t*>(src);
      if (from == DType::kF16) {
        for (int64_t i = 0; i < n; ++i) d[i] = f16_bits_to_f32(h[i * sstride]);
      } else {
        for (int64_t i = 0; i < n; ++i) d[i] = bf16_bits_to_f32(h[i * sstride]);
      }
      return;
    }
    case CType::kI32: {
      auto* d = static_cast<int32_t*>(dst);
      if (from == DType::kI32 && sstride == 1) {
        if (n > 0) std::memcpy(d, src, static_cast<size_t>(n) * sizeof(int32_t));
        return;
      }
      for (int64_t i = 0; i < n; ++i) d[i] = load_elem<int32_t>(from, src, i * sstride);
      return;
    }
    case CType::kI64: {
      auto* d = static_cast<int64_t*>(dst);
      const auto* s = static_cast<const int64_t*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] = s[i * sstride];
      return;
    }
  }
}

void store_convert(DType to, void* dst, int64_t dstride, const void* src, int sinc, int64_t n) {
  const auto scatter = [&](auto* d, const auto* s, auto f) {
    for (int64_t i = 0; i < n; ++i) d[i * dstride] = f(s[sinc ? i : 0]);
  };
  const auto* sf = static_cast<const float*>(src);
  const auto* si = static_cast<const int32_t*>(src);
  switch (to) {
    case DType::kF32:
      return scatter(static_cast<float*>(dst), sf, [](float x) { return x; });
    case DType::kF16:
      if (dstride == 1 && sinc == 1) {
        return HWY_DYNAMIC_DISPATCH(F32ToF16)(static_cast<uint16_t*>(dst), sf, n);
      }
      return scatter(static_cast<uint16_t*>(dst), sf, f32_to_f16_bits);
    case DType::kBF16:
      if (dstride == 1 && sinc == 1) {
        return HWY_DYNAMIC_DISPATCH(F32ToBF16)(static_cast<uint16_t*>(dst), sf, n);
      }
      return scatter(static_cast<uint16_t*>(dst), sf, f32_to_bf16_bits);
    case DType::kI32:
      return scatter(static_cast<int32_t*>(dst), si, [](int32_t x) { return x; });
    case DType::kI64:
      return scatter(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src),
                     [](int64_t x) { return x; });
    case DType::kBool:
      return scatter(static_cast<uint8_t*>(dst), si, i32_to_bool);
  }
}

void reduce_row_f32(ReduceOp op, float* acc, const float* a, int ainc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ReduceRowF32)(op, Rows{}, acc, a, ainc, n);
}
void reduce_row_f32_rows(ReduceOp op, const Rows& rows, float* acc, const float* a, int ainc,
                         int64_t n) {
  HWY_DYNAMIC_DISPATCH(ReduceRowF32)(op, rows, acc, a, ainc, n);
}
void dot_row_f32(float* acc, const float* a, int ainc, const float* b, int binc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(DotRowF32)(Rows{}, acc, a, ainc, b, binc, n);
}
void dot_row_f32_rows(const Rows& rows, float* acc, const float* a, int ainc, const float* b,
                      int binc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(DotRowF32)(rows, acc, a, ainc, b, binc, n);
}
void transpose_f32(float* dst, int64_t drs, const float* src, int64_t scs, int64_t rows,
                   int64_t cols) {
  HWY_DYNAMIC_DISPATCH(TransposeF32)(dst, drs, src, scs, rows, cols);
}
bool map_reduce_f32_rows(int kind, int op, int pre, int red, const Rows& rows, float* dst,
                         const float* a, int ainc, const float* b, int binc, const float* c,
                         int cinc, int64_t n, float* out) {
  return HWY_DYNAMIC_DISPATCH(MapReduceF32)(kind, op, pre, red, rows, dst, a, ainc, b, binc, c,
                                            cinc, n, out);
}
void reduce_row_i32(ReduceOp op, int32_t* acc, const int32_t* a, int ainc, int64_t n) {
  reduce_row_int<int32_t>(op, acc, a, ainc, n);
}
void reduce_row_i64(ReduceOp op, int64_t* acc, const int64_t* a, int ainc, int64_t n) {
  reduce_row_int<int64_t>(op, acc, a, ainc, n);
}
void accumulate_f32(ReduceOp op, float* acc, const float* a, int ainc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AccumulateF32)(op, Rows{}, acc, a, ainc, n);
}
void accumulate_f32_rows(ReduceOp op, const Rows& rows, float* acc, const float* a, int ainc,
                         int64_t n) {
  HWY_DYNAMIC_DISPATCH(AccumulateF32)(op, rows, acc, a, ainc, n);
}
void accumulate_i32(ReduceOp op, int32_t* acc, const int32_t* a, int ainc, int64_t n) {
  accumulate_int<int32_t>(op, acc, a, ainc, n);
}
void accumulate_i64(ReduceOp op, int64_t* acc, const int64_t* a, int ainc, int64_t n) {
  accumulate_int<int64_t>(op, acc, a, ainc, n);
}

void fill_identity(ReduceOp op, CType t, void* dst, int64_t n) {
  switch (t) {
    case CType::kF32: {
      auto* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = reduce_identity<float>(op);
      return;
    }
    case CType::kI32: {
      auto* d = static_cast<int32_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = reduce_identity<int32_t>(op);
      return;
    }
    case CType::kI64: {
      auto* d = static_cast<int64_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = reduce_identity<int64_t>(op);
      return;
    }
  }
}

void argreduce_row_f32(ReduceOp op, float* vacc, int64_t* iacc, const float* a, int ainc, int64_t n,
                       int64_t base) {
  argreduce_row<float>(op, vacc, iacc, a, ainc, n, base);
}
void argreduce_row_i32(ReduceOp op, int32_t* vacc, int64_t* iacc, const int32_t* a, int ainc,
                       int64_t n, int64_t base) {
  argreduce_row<int32_t>(op, vacc, iacc, a, ainc, n, base);
}
void argreduce_row_i64(ReduceOp op, int64_t* vacc, int64_t* iacc, const int64_t* a, int ainc,
                       int64_t n, int64_t base) {
  argreduce_row<int64_t>(op, vacc, iacc, a, ainc, n, base);
}
void argaccumulate_f32(ReduceOp op, float* vacc, int64_t* iacc, const float* a, int ainc, int64_t n,
                       int64_t index) {
  argaccumulate<float>(op, vacc, iacc, a, ainc, n, index);
}
void argaccumulate_i32(ReduceOp op, int32_t* vacc, int64_t* iacc, const int32_t* a, int ainc,
                       int64_t n, int64_t index) {
  argaccumulate<int32_t>(op, vacc, iacc, a, ainc, n, index);
}
void argaccumulate_i64(ReduceOp op, int64_t* vacc, int64_t* iacc, const int64_t* a, int ainc,
                       int64_t n, int64_t index) {
  argaccumulate<int64_t>(op, vacc, iacc, a, ainc, n, index);
}

void fma_f32(float* dst, const float* a, int ainc, const float* b, int binc, const float* c,
             int cinc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(FmaF32)(Rows{}, dst, a, ainc, b, binc, c, cinc, n);
}
void fma_f32_rows(const Rows& rows, float* dst, const float* a, int ainc, const float* b, int binc,
                  const float* c, int cinc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(FmaF32)(rows, dst, a, ainc, b, binc, c, cinc, n);
}

bool fused_mul_supported(UnaryOp op) {
  // The ops of WithActivation (kept in step by VmFusedPairs and the random-kernel test).
  switch (op) {
    case UnaryOp::kNeg:
    case UnaryOp::kExp:
    case UnaryOp::kTanh:
    case UnaryOp::kSigmoid:
    case UnaryOp::kSilu:
    case UnaryOp::kGeluErf:
    case UnaryOp::kGeluTanh:
    case UnaryOp::kRelu:
      return true;
    default:
      return false;
  }
}

void fused_mul_f32_rows(int kind, UnaryOp op, int pre, const Rows& rows, float* dst, const float* a,
                        int ainc, const float* b, int binc, const float* c, int cinc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(FusedMulF32)(kind, op, pre, rows, dst, a, ainc, b, binc, c, cinc, n);
}

void fused_mul_fma_f32_rows(const Rows& rows, float* dst, const float* a, int ainc, const float* b,
                            int binc, const float* c, int cinc, const float* e, int einc,
                            int64_t n) {
  HWY_DYNAMIC_DISPATCH(FusedMulFmaF32)(rows, dst, a, ainc, b, binc, c, cinc, e, einc, n);
}

void fused_mul_add_f32_rows(bool negate, const Rows& rows, float* dst, const float* a, int ainc,
                            const float* b, int binc, const float* p, int pinc, const float* q,
                            int qinc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(FusedMulAddF32)
  (negate, rows, dst, a, ainc, b, binc, p, pinc, q, qinc, n);
}

void fused_mul_add_pair_f32_rows(const MulAddArgs& x, const MulAddArgs& y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(FusedMulAddPairF32)(x, y, n);
}

const char* simd_target_name() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(TargetId)());
}

}  // namespace dvm::vm::cpu
#endif  // HWY_ONCE
