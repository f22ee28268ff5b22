// Packed GEMM (see gemm.h). Layout of the packed operands, per K block of kc rows:
// - A: ceil(m / MR) panels of kc x MR floats; element (r, p) of a panel at [p * MR + r].
// - B: ceil(n / NR) panels of kc x NR floats; element (p, j) of a panel at [p * NR + j], columns
//   past n zero.
// Loop order (per NC column block, per K block): pack B and A, then for every A panel (stays in
// L1) run the micro-kernel over every B panel (streams from L2). The micro-kernel for the last A
// panel is instantiated for exactly the rows left, and a one-vector variant covers the last B
// panel when it is at most one vector wide, so edge tiles waste little work.

// Keep the target list short: every target multiplies the compile time of this file.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3_DL)
#endif

#include "vm/cpu/gemm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include "base/env.h"
#include "ops/scalar_ops.h"
#include "vm/cpu/avx512_transpose.h"
#include "vm/cpu/gemm_amx.h"

namespace dvm::vm::cpu::gemm_detail {
// Thread-local 64-byte aligned scratch of at least `floats` floats, grown on demand; slot 0 holds
// the packed A block (GemmWt: x's panels), slot 1 the packed B block (GemmWt: W's copied or
// packed rows), slot 2 partial sums (gemm_amx.cc), slot 3 the x panels GemmWtRows keeps for
// the next tile (KeptX).
float* scratch(int slot, size_t floats);

#ifndef DVM_GEMM_KEPT_X_DEFINED  // this file is included once per Highway target
#define DVM_GEMM_KEPT_X_DEFINED
// What slot 3 holds: the 32-row panels of every K block of x, for a caller's token (a promise
// that x is unchanged while the token is) and x's address, strides and shape.
struct KeptX {
  uint64_t token = 0;  // 0: nothing kept
  const void* a = nullptr;
  ptrdiff_t a_rs = 0, a_cs = 0;
  size_t m = 0, k = 0, elem_bytes = 0;
  bool operator==(const KeptX&) const = default;
};
#endif
KeptX& kept_x();
// The CPU has AVX512-BF16 and DVM_BF16_DOT is not 0 (or a test's override says so).
bool bf16_dot_enabled();
}  // namespace dvm::vm::cpu::gemm_detail

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vm/cpu/gemm.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace dvm::ops;  // the scalar semantics the kernels implement  // NOLINT

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Micro-tile: MR rows x NR = kNV vectors. MR * kNV accumulators + kNV B vectors + 1 broadcast
// must fit the register file (32 vector registers on AVX-512, 16 otherwise).
constexpr size_t kN = HWY_LANES(float);
// Preferred rows of a matmul tile (the encoder's M chunk). Every tile packs its own slice of
// B, so B is packed once per M chunk: nn.Linear's B is W^T, whose packing transposes 4 x 4
// blocks, and at 112 rows that packing cost BERT-base's layers 10% of their time. 512-row
// tiles pack B once for a whole short sequence (nn.Linear, one thread: eager/DVM 0.89-0.95
// -> 0.98-1.06 at M = 1024-2048; the BERT layer 0.99 -> 1.11); a plain row-major B, cheap to
// pack, runs within 5% either way.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr size_t kMR = 14;
#else
constexpr size_t kMR = 6;
#endif
constexpr size_t kTileM = 512 / kMR * kMR;  // whole micro-tiles
constexpr size_t kNV = 2;
constexpr size_t kNR = kNV * kN;
// K block: an A panel (kc x MR floats, 14 KiB on AVX-512) stays in L1 while B streams past.
constexpr size_t kKC = 256;
// Column block: the packed B block (kc x NC floats, 512 KiB) stays in L2.
constexpr size_t kNC = 512;
static_assert(kNC % kNR == 0, "column block must hold whole panels");
// Most A panels (of up to MR rows) for which a row-major f32 B is read in place (GemmImpl).
constexpr size_t kDirectBMaxPanels = 10;
// The K block of a product split into equal blocks of at most `max_block` (the order of each
// output's sum follows its blocks: GemvB keeps GemmImpl's by taking them from here too).
inline size_t EqualKBlock(size_t k, size_t max_block) {
  const size_t blocks = (k + max_block - 1) / max_block;
  return (k + blocks - 1) / blocks;
}

// Do the rows of an operand read side by side (A's MR rows by the micro-kernel, W's 14 rows by
// the in-place transposed-B kernel) fall into enough L1 sets at this row stride (floats)? At a
// stride that is a multiple of 4 KiB (K = 1024, 2048, 3072 f32 rows) all of them map to one
// of L1's 64 sets, more lines than a set has ways, and they evict each other (one thread,
// nn.Linear M = 512, N = 256, K = 1024: A in place 96-98 GF/s, packed 107-110; gemm_bench
// 1024^3 103 -> 112-124, 256 x 256 x 3072 98-103 -> 115-129). At 2 KiB (two sets, K = 512)
// both ways measure alike.
inline bool RowsSpreadInL1(ptrdiff_t rs) {
  const size_t bytes = static_cast<size_t>(rs < 0 ? -rs : rs) * sizeof(float);
  return bytes % 4096 != 0;
}

// c[0..kRows) x [0..ncols) (+)= A panel (kc x kMR, rows used: kRows) x B panel (kc rows of
// kCols vectors at stride bs floats). Every kernel sums each output's products in order of p
// into one accumulator: a panel's rows depend on how a thread count tiles the product, so a
// kernel that split its sums by the panel's size (even / odd p for fewer than 8 accumulators,
// as this one did) gave other bits at another thread count.
//
// Prefetch (kPf): step p also asks for two cache lines of the next B panel into L2, at
// pf + (p mod 2^pf_shift) * pf_rs + (p >> pf_shift) * 128 bytes, so that its reads from memory
// (or L3) overlap this panel's FMAs instead of stalling the next call: 2^pf_shift rows of
// pf_rs bytes (a cached packed panel, kc x NR contiguous floats seen as 32 rows; a row-major B
// read in place: shift 9, its 128-byte row p at each step).
struct Prefetch {
  const char* base = nullptr;
  ptrdiff_t rs = 0;
  unsigned shift = 5;
};

//
// A in place (kAIn): element (r, p) of A at ap[r * as + p] (rows of a row-major f32 A, read
// where they are instead of packed into MR-row panels: gemm_bench, one thread, 64^3 126 -> 138,
// 256^3 137-150 -> 153-155 GF/s). The same products in the same order: the bits do not
// depend on it.
template <size_t kRows, size_t kCols, bool kPf = false, bool kAIn = false>
HWY_NOINLINE void Kernel(size_t kc, const float* HWY_RESTRICT ap, const float* HWY_RESTRICT bp,
                         ptrdiff_t bs, float* HWY_RESTRICT c, ptrdiff_t ldc, bool add, size_t ncols,
                         Prefetch pf, ptrdiff_t as) {
  constexpr ptrdiff_t kAStep = kAIn ? 1 : static_cast<ptrdiff_t>(kMR);
  if constexpr (!kAIn) as = 1;
  const DF d;
  VF acc[kRows][kCols];
#pragma GCC unroll 16
  for (size_t r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (size_t v = 0; v < kCols; ++v) acc[r][v] = hn::Zero(d);
  }
  for (size_t p = 0; p < kc; ++p) {
    VF bv[kCols];
#pragma GCC unroll 4
    for (size_t v = 0; v < kCols; ++v) bv[v] = hn::LoadU(d, bp + v * kN);
#pragma GCC unroll 16
    for (size_t r = 0; r < kRows; ++r) {
      const VF av = hn::Set(d, ap[static_cast<ptrdiff_t>(r) * as]);
#pragma GCC unroll 4
      for (size_t v = 0; v < kCols; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
    ap += kAStep;
    bp += bs;
    if constexpr (kPf) {
      const char* line = pf.base +
                         static_cast<ptrdiff_t>(p & ((size_t{1} << pf.shift) - 1)) * pf.rs +
                         static_cast<ptrdiff_t>((p >> pf.shift) * 128);
      __builtin_prefetch(line, 0, 2);
      __builtin_prefetch(line + 64, 0, 2);
    }
  }
  if (ncols == kCols * kN) {
#pragma GCC unroll 16
    for (size_t r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
      for (size_t v = 0; v < kCols; ++v) {
        float* cp = c + static_cast<ptrdiff_t>(r) * ldc + v * kN;
        hn::StoreU(add ? hn::Add(hn::LoadU(d, cp), acc[r][v]) : acc[r][v], d, cp);
      }
    }
    return;
  }
  HWY_ALIGN float tmp[kCols * kN];
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t v = 0; v < kCols; ++v) hn::Store(acc[r][v], d, tmp + v * kN);
    float* cr = c + static_cast<ptrdiff_t>(r) * ldc;
    if (add) {
      for (size_t j = 0; j < ncols; ++j) cr[j] += tmp[j];
    } else {
      for (size_t j = 0; j < ncols; ++j) cr[j] = tmp[j];
    }
  }
}

using KernelFn = void (*)(size_t, const float*, const float*, ptrdiff_t, float*, ptrdiff_t, bool,
                          size_t, Prefetch, ptrdiff_t);

template <size_t kCols, bool kPf, bool kAIn, size_t... I>
constexpr std::array<KernelFn, sizeof...(I)> MakeKernels(std::index_sequence<I...>) {
  return {&Kernel<I + 1, kCols, kPf, kAIn>...};
}
// kKernels[0][v - 1][rows - 1]: the kernel for `rows` rows and v vectors of columns;
// kKernelsPf[0][rows - 1]: full-width panels, prefetching the next panel's source.
// [1]: the same with A read in place.
const std::array<KernelFn, kMR> kKernels[2][2] = {
    {MakeKernels<1, false, false>(std::make_index_sequence<kMR>()),
     MakeKernels<kNV, false, false>(std::make_index_sequence<kMR>())},
    {MakeKernels<1, false, true>(std::make_index_sequence<kMR>()),
     MakeKernels<kNV, false, true>(std::make_index_sequence<kMR>())},
};
const std::array<KernelFn, kMR> kKernelsPf[2] = {
    MakeKernels<kNV, true, false>(std::make_index_sequence<kMR>()),
    MakeKernels<kNV, true, true>(std::make_index_sequence<kMR>()),
};

// Element converters for packing.
struct ConvF32 {
  float operator()(float x) const { return x; }
};
struct ConvF16 {
  float operator()(uint16_t x) const { return f16_bits_to_f32(x); }
};
struct ConvBF16 {
  float operator()(uint16_t x) const { return bf16_bits_to_f32(x); }
};

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Up to 16 consecutive elements (mask: which) as f32, the others zero: f32, bf16 or f16. (GCC
// 12 warns about the intrinsics' deliberately undefined lanes where they are inlined.)
#pragma GCC diagnostic push
#ifndef __clang__  // a GCC warning group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
HWY_INLINE __m512 LoadRow16(ConvF32, __mmask16 mask, const float* p) {
  return _mm512_maskz_loadu_ps(mask, p);
}
HWY_INLINE __m512 LoadRow16(ConvBF16, __mmask16 mask, const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
HWY_INLINE __m512 LoadRow16(ConvF16, __mmask16 mask, const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
}
#pragma GCC diagnostic pop

// panel[p * kWidth + off + r] = src[r * rs + p] for r < rows <= 16, p < kc: 16 x 16 blocks
// transposed in registers. Missing rows read as zero; stores cover `lanes` >= rows lanes (B
// panels store their zero padding with them, A panels exactly their rows), never past them.
// Half-precision rows (bf16 / f16 bits, Conv says which) are widened to f32 as they are read.
template <size_t kWidth, class Conv = ConvF32, typename T = float>
HWY_INLINE void PackRows16(size_t rows, size_t lanes, size_t kc, const T* src, ptrdiff_t rs,
                           float* HWY_RESTRICT panel) {
  const __mmask16 store_mask = static_cast<__mmask16>((1u << lanes) - 1);
  __m512 v[16];
  for (size_t p = 0; p < kc; p += 16) {
    const size_t n = std::min<size_t>(16, kc - p);
    const __mmask16 load_mask = static_cast<__mmask16>((1u << n) - 1);
    for (size_t r = 0; r < 16; ++r) {
      v[r] = r < rows ? LoadRow16(Conv(), load_mask, src + static_cast<ptrdiff_t>(r) * rs + p)
                      : _mm512_setzero_ps();
    }
    Transpose16x16(v);
    for (size_t q = 0; q < n; ++q)
      _mm512_mask_storeu_ps(panel + (p + q) * kWidth, store_mask, v[q]);
  }
}

// One panel of width kWidth (kMR: A; kNR: a transposed B) from `rows` <= kWidth f32 rows
// contiguous along p (row r at src + r * rs). A panels get exactly their rows; B panels are
// zero-padded to kWidth columns.
template <size_t kWidth = kMR, class Conv = ConvF32, typename T = float>
HWY_INLINE void PackRowsF32(size_t rows, size_t kc, const T* src, ptrdiff_t rs,
                            float* HWY_RESTRICT panel) {
  constexpr bool kPad = kWidth == kNR;
  for (size_t r0 = 0; r0 < kWidth; r0 += 16) {
    const size_t n = rows > r0 ? std::min<size_t>(16, rows - r0) : 0;
    if (n == 0 && !kPad) break;
    PackRows16<kWidth, Conv>(n, kPad ? std::min<size_t>(16, kWidth - r0) : n, kc,
                             src + static_cast<ptrdiff_t>(r0) * rs, rs, panel + r0);
  }
}

// Products with a transposed B (nn.Linear: x [M, K] times W [N, K]^T) with the roles of the
// operands swapped: the micro-tile is 32 rows of C (two vectors along M, from x packed into
// 32-row panels) by up to 14 columns, each column's value W[j, p] broadcast straight from W's
// row j. W is read in place, never packed: packing it for GemmImpl means transposing it, on
// the shuffle port the FMAs also need (5-8% of a linear layer). Each output is a chain of FMAs
// over p from zero per K block of at most kWtKC, the blocks added into C in order.
constexpr size_t kWtRows = 2 * kN;  // rows of C per micro-tile (x panel width)
constexpr size_t kWtCols = 14;      // columns of C per micro-tile (rows of W)

// c[0..rows) x [0..kCols) (+)= the micro-tile acc[h][j] (rows h * 16.. of C along the
// vector, column j of C per register): each 16-row half transposed back to rows of C
// (columns past kCols are zero, not stored).
template <size_t kCols, size_t kVecs>
HWY_INLINE void StoreWtTile(const VF (&acc)[kVecs][kCols], float* HWY_RESTRICT c, ptrdiff_t ldc,
                            bool add, size_t rows) {
  const __mmask16 cols_mask = static_cast<__mmask16>((1u << kCols) - 1);
  for (size_t h = 0; h < kVecs && h * kN < rows; ++h) {
    __m512 v[16];
    for (size_t j = 0; j < 16; ++j) v[j] = j < kCols ? acc[h][j].raw : _mm512_setzero_ps();
    Transpose16x16(v);
    const size_t n = std::min(kN, rows - h * kN);
    for (size_t r = 0; r < n; ++r) {
      float* cp = c + static_cast<ptrdiff_t>(h * kN + r) * ldc;
      const __m512 out = add ? _mm512_add_ps(_mm512_maskz_loadu_ps(cols_mask, cp), v[r]) : v[r];
      _mm512_mask_storeu_ps(cp, cols_mask, out);
    }
  }
}

// W's rows j < kWtCols as the in-place kernels read them, one element a step: in groups of
// three off one pointer each ([g + s], [g + 2s] address modes); `step` advances them and
// prefetches the next block's pf_rows (<= 16) rows at the same stride into L2, one line per
// step (row p mod 16), so that their reads from memory overlap the current block's products.
struct WtRowsInPlace {
  const float* g[5];
  ptrdiff_t rs;
  HWY_INLINE WtRowsInPlace(const float* w, ptrdiff_t w_rs) : rs(w_rs) {
    for (size_t q = 0; q < 5; ++q) g[q] = w + static_cast<ptrdiff_t>(3 * q) * w_rs;
  }
  HWY_INLINE float at(size_t j) const { return g[j / 3][static_cast<ptrdiff_t>(j % 3) * rs]; }
  HWY_INLINE void step(size_t p, const float* pf, size_t pf_rows) {
    if ((p & 15) < pf_rows) {
      __builtin_prefetch(pf + static_cast<ptrdiff_t>(p & 15) * rs + (p >> 4) * 16, 0, 2);
    }
#pragma GCC unroll 5
    for (size_t q = 0; q < 5; ++q) ++g[q];
  }
};

// c[0..rows) x [0..kCols) (+)= x panel (kc x 32, k-major; rows <= 16 * kVecs of it used) times
// rows j < kCols of W (row j at w + j * w_rs, read at [0, kc)). pf: the next pf_rows (<= 16)
// rows of W, at the same stride, to prefetch into L2 (one line per step, row p mod 16, so
// that their reads from memory overlap these FMAs).
template <size_t kCols, size_t kVecs>
HWY_NOINLINE void KernelWt(size_t kc, const float* HWY_RESTRICT xp, const float* w, ptrdiff_t w_rs,
                           float* HWY_RESTRICT c, ptrdiff_t ldc, bool add, size_t rows,
                           const float* pf, size_t pf_rows) {
  const DF d;
  VF acc[kVecs][kCols];
#pragma GCC unroll 16
  for (size_t j = 0; j < kCols; ++j) {
    for (size_t h = 0; h < kVecs; ++h) acc[h][j] = hn::Zero(d);
  }
  WtRowsInPlace wr(w, w_rs);
  for (size_t p = 0; p < kc; ++p) {
    VF x[kVecs];
    for (size_t h = 0; h < kVecs; ++h) x[h] = hn::Load(d, xp + h * kN);
#pragma GCC unroll 16
    for (size_t j = 0; j < kCols; ++j) {
      const VF b = hn::Set(d, wr.at(j));
      for (size_t h = 0; h < kVecs; ++h) acc[h][j] = hn::MulAdd(x[h], b, acc[h][j]);
    }
    wr.step(p, pf, pf_rows);
    xp += kWtRows;
  }
  StoreWtTile<kCols, kVecs>(acc, c, ldc, add, rows);
}

using KernelWtFn = void (*)(size_t, const float*, const float*, ptrdiff_t, float*, ptrdiff_t, bool,
                            size_t, const float*, size_t);
template <size_t kVecs, size_t... I>
constexpr std::array<KernelWtFn, sizeof...(I)> MakeKernelsWt(std::index_sequence<I...>) {
  return {&KernelWt<I + 1, kVecs>...};
}
// kKernelsWt[vectors - 1][cols - 1]: 16 (a panel's last rows, at most 16) or 32 rows of C.
const std::array<KernelWtFn, kWtCols> kKernelsWt[2] = {
    MakeKernelsWt<1>(std::make_index_sequence<kWtCols>()),
    MakeKernelsWt<2>(std::make_index_sequence<kWtCols>()),
};

// The end of step p of a packed-W kernel: step p asks for a line of W's next rows (pf_rows of
// them, at pf_rs bytes) into L2 and for the packed stream 16 steps ahead into L1, then both
// streams advance.
HWY_INLINE void EndWtPackedStep(size_t p, const char* pf, ptrdiff_t pf_rs, size_t pf_rows,
                                const float* HWY_RESTRICT& xp, const float*& wp) {
  if ((p & 15) < pf_rows) {
    __builtin_prefetch(pf + static_cast<ptrdiff_t>(p & 15) * pf_rs + (p >> 4) * 64, 0, 2);
  }
  __builtin_prefetch(wp + 16 * kN, 0, 3);
  xp += kWtRows;
  wp += kN;
}

// KernelWt with W's 14 rows packed k-major (16 floats per step, the last two zero): each
// broadcast is folded into its FMA (vfmadd231ps m32{1to16}), one fused uop where a separate
// vbroadcastss and two FMAs take three. The second use of each value reads it through an
// alias the compiler cannot see through, or it would load it once and broadcast it apart.
// The packed rows come from L2: each step prefetches the line 16 steps ahead into L1 (without
// it the first FMA of a step took 10% of the kernel's samples, waiting). pf, pf_rs (bytes),
// pf_rows: the next rows of W to prefetch into L2, as KernelWt's; without them the loop runs
// two steps per trip.
template <size_t kCols, size_t kVecs>
HWY_NOINLINE void KernelWtPacked(size_t kc, const float* HWY_RESTRICT xp, const float* wp,
                                 float* HWY_RESTRICT c, ptrdiff_t ldc, bool add, size_t rows,
                                 const char* pf, ptrdiff_t pf_rs, size_t pf_rows) {
  const DF d;
  VF acc[kVecs][kCols];
#pragma GCC unroll 16
  for (size_t j = 0; j < kCols; ++j) {
    for (size_t h = 0; h < kVecs; ++h) acc[h][j] = hn::Zero(d);
  }
  const auto step = [&](size_t q) HWY_ATTR {
    const float* wq = wp;
    asm("" : "+r"(wq));  // same address, another name: keeps the second load
    VF x[kVecs];
    for (size_t h = 0; h < kVecs; ++h) x[h] = hn::Load(d, xp + q * kWtRows + h * kN);
#pragma GCC unroll 16
    for (size_t j = 0; j < kCols; ++j) {
      acc[0][j] = hn::MulAdd(x[0], hn::Set(d, wp[q * kN + j]), acc[0][j]);
      if constexpr (kVecs == 2) acc[1][j] = hn::MulAdd(x[1], hn::Set(d, wq[q * kN + j]), acc[1][j]);
    }
  };
  size_t p = 0;
  if (pf_rows == 0) {
    for (; p + 2 <= kc; p += 2) {
      __builtin_prefetch(wp + 16 * kN, 0, 3);
      step(0);
      step(1);
      xp += 2 * kWtRows;
      wp += 2 * kN;
    }
  }
  for (; p < kc; ++p) {
    step(0);
    EndWtPackedStep(p, pf, pf_rs, pf_rows, xp, wp);
  }
  StoreWtTile<kCols, kVecs>(acc, c, ldc, add, rows);
}

using KernelWtPackedFn = void (*)(size_t, const float*, const float*, float*, ptrdiff_t, bool,
                                  size_t, const char*, ptrdiff_t, size_t);
template <size_t kVecs, size_t... I>
constexpr std::array<KernelWtPackedFn, sizeof...(I)> MakeKernelsWtPacked(
    std::index_sequence<I...>) {
  return {&KernelWtPacked<I + 1, kVecs>...};
}
const std::array<KernelWtPackedFn, kWtCols> kKernelsWtPacked[2] = {
    MakeKernelsWtPacked<1>(std::make_index_sequence<kWtCols>()),
    MakeKernelsWtPacked<2>(std::make_index_sequence<kWtCols>()),
};

// KernelWtPacked for bf16 x and W on CPUs with AVX512-BF16 (Zen 4 and later, Cooper Lake,
// Sapphire Rapids): each 32-bit element of the x panel and of the packed W rows is a pair of
// bf16 values adjacent along K, and VDPBF16PS adds both products of a pair to an f32 lane,
// twice the work of an FMA per instruction, with no widening. kc counts pairs. Per the ISA,
// each lane computes acc + x[2q+1] w[2q+1] + x[2q] w[2q] (bf16 products are exact in f32;
// the two sums rounded to nearest even) with denormal inputs and results flushed to zero.
#define DVM_BF16_DOT __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
template <size_t kCols, size_t kVecs>
DVM_BF16_DOT HWY_NOINLINE void KernelWtPackedDot(size_t kc, const float* HWY_RESTRICT xp,
                                                 const float* wp, float* HWY_RESTRICT c,
                                                 ptrdiff_t ldc, bool add, size_t rows,
                                                 const char* pf, ptrdiff_t pf_rs, size_t pf_rows) {
  VF acc[kVecs][kCols];
#pragma GCC unroll 16
  for (size_t j = 0; j < kCols; ++j) {
    for (size_t h = 0; h < kVecs; ++h) acc[h][j].raw = _mm512_setzero_ps();
  }
  for (size_t p = 0; p < kc; ++p) {
    const float* wq = wp;
    asm("" : "+r"(wq));  // same address, another name: keeps the second load (KernelWtPacked)
    const __m512bh x0 = (__m512bh)_mm512_load_ps(xp);
    const __m512bh x1 = (__m512bh)_mm512_load_ps(xp + kN);
#pragma GCC unroll 16
    for (size_t j = 0; j < kCols; ++j) {
      acc[0][j].raw = _mm512_dpbf16_ps(acc[0][j].raw, x0, (__m512bh)_mm512_set1_ps(wp[j]));
      if constexpr (kVecs == 2) {
        acc[1][j].raw = _mm512_dpbf16_ps(acc[1][j].raw, x1, (__m512bh)_mm512_set1_ps(wq[j]));
      }
    }
    EndWtPackedStep(p, pf, pf_rs, pf_rows, xp, wp);
  }
  StoreWtTile<kCols, kVecs>(acc, c, ldc, add, rows);
}
template <size_t kVecs, size_t... I>
constexpr std::array<KernelWtPackedFn, sizeof...(I)> MakeKernelsWtPackedDot(
    std::index_sequence<I...>) {
  return {&KernelWtPackedDot<I + 1, kVecs>...};
}
const std::array<KernelWtPackedFn, kWtCols> kKernelsWtPackedDot[2] = {
    MakeKernelsWtPackedDot<1>(std::make_index_sequence<kWtCols>()),
    MakeKernelsWtPackedDot<2>(std::make_index_sequence<kWtCols>()),
};

// KernelWt on bf16 pairs (w_rs in pairs): W's rows read in place, a pair broadcast per column
// and step into VDPBF16PS (GemmWt's bf16 path; packing W's rows per call for
// KernelWtPackedDot cost more than it saved, see GemmWt). The same products in the same order
// as KernelWtPackedDot.
template <size_t kCols, size_t kVecs>
DVM_BF16_DOT HWY_NOINLINE void KernelWtDot(size_t kc, const float* HWY_RESTRICT xp, const float* w,
                                           ptrdiff_t w_rs, float* HWY_RESTRICT c, ptrdiff_t ldc,
                                           bool add, size_t rows, const float* pf, size_t pf_rows) {
  VF acc[kVecs][kCols];
#pragma GCC unroll 16
  for (size_t j = 0; j < kCols; ++j) {
    for (size_t h = 0; h < kVecs; ++h) acc[h][j].raw = _mm512_setzero_ps();
  }
  WtRowsInPlace wr(w, w_rs);
  for (size_t p = 0; p < kc; ++p) {
    __m512bh x[kVecs];
    for (size_t h = 0; h < kVecs; ++h) x[h] = (__m512bh)_mm512_load_ps(xp + h * kN);
#pragma GCC unroll 16
    for (size_t j = 0; j < kCols; ++j) {
      const __m512bh b = (__m512bh)_mm512_set1_ps(wr.at(j));
      for (size_t h = 0; h < kVecs; ++h) acc[h][j].raw = _mm512_dpbf16_ps(acc[h][j].raw, x[h], b);
    }
    wr.step(p, pf, pf_rows);
    xp += kWtRows;
  }
  StoreWtTile<kCols, kVecs>(acc, c, ldc, add, rows);
}
template <size_t kVecs, size_t... I>
constexpr std::array<KernelWtFn, sizeof...(I)> MakeKernelsWtDot(std::index_sequence<I...>) {
  return {&KernelWtDot<I + 1, kVecs>...};
}
const std::array<KernelWtFn, kWtCols> kKernelsWtDot[2] = {
    MakeKernelsWtDot<1>(std::make_index_sequence<kWtCols>()),
    MakeKernelsWtDot<2>(std::make_index_sequence<kWtCols>()),
};

// K block of the in-place kernel: 14 rows of W (28 KiB) stay in L1 while the x panel streams
// past; longer blocks than GemmImpl's halve the transposes of C per FMA (nn.Linear shapes,
// one thread: 1-2% faster than 256).
constexpr size_t kWtKC = 512;
// Rows per call: x's block (256 x 512 floats) and C's rows stay in L2 together (M = 480,
// one thread: 183-191 -> 195-199 GF/s against one 480-row call).
constexpr size_t kWtMaxRows = 256;
// The same for bf16 pairs (KernelWtDot): a VM tile's 504 rows in one chunk, so W's rows are
// read once per tile, not twice (measured when they were packed per chunk, one thread, Zen 5,
// M = 504, K = 2048 / 8192: 405-415 -> 416-428 GF/s; 256-pair K blocks instead ran 385-400).
constexpr size_t kWtDotMaxRows = 512;
// Shortest K the in-place kernel takes: each call ends with two 16 x 16 transposes of C, which
// cost as much as the FMAs of a K of ~14 x 16; below 256 (attention's q @ k^T over a head's 64
// values) packing the transposed B, as GemmImpl does, costs less.
constexpr size_t kWtMinK = 256;
// Most rows of a product the in-place kernel takes: past ~300 rows, packing W^T once per tile
// is amortised over enough rows to cost less than the in-place kernel's C transposes and
// 16-row granularity (nn.Linear, one thread, cold weights: M = 64 148 -> 177-180 GF/s, M = 256
// 182-184 -> 189-197, M = 360 even, M = 486 188-193 -> 183-190).
constexpr size_t kWtMaxProductRows = 288;
// Fewest x panels (32 rows each) for which GemmWt packs W's rows (WtBlockPacked).
constexpr size_t kWtPackMinPanels = 4;

// x's rows [0, m) and its columns [pc, pc + kc) as 32-row panels (k-major, rows past m zero),
// f32 (halves widened).
template <class Conv, typename T>
void PackXBlock(size_t m, size_t kc, const T* a, ptrdiff_t a_rs, ptrdiff_t a_cs, float* xbuf) {
  const size_t panels = (m + kWtRows - 1) / kWtRows;
  const Conv conv;
  for (size_t ip = 0; ip < panels; ++ip) {
    const size_t rows = std::min(kWtRows, m - ip * kWtRows);
    const T* src = a + static_cast<ptrdiff_t>(ip * kWtRows) * a_rs;
    float* panel = xbuf + ip * kWtRows * kc;
    if (a_cs == 1) {
      PackRowsF32<kWtRows, Conv>(rows, kc, src, a_rs, panel);  // zero-pads rows past m
    } else {
      for (size_t p = 0; p < kc; ++p) {
        for (size_t r = 0; r < kWtRows; ++r) {
          panel[p * kWtRows + r] =
              r < rows
                  ? conv(src[static_cast<ptrdiff_t>(r) * a_rs + static_cast<ptrdiff_t>(p) * a_cs])
                  : 0.0f;
        }
      }
    }
  }
}

// Floats of the x panels of an m x k product: every K block's, one after another.
size_t WtPanelFloats(size_t m, size_t k) {
  return (m + kWtRows - 1) / kWtRows * kWtRows * k;
}

// One K block of GemmWt: C (+)= the x panels at xbuf (m rows, kc steps) times W's rows j < n
// (row j at w + j * w_rs, kc elements from w on: f32, or bf16 / f16 bits).
template <typename T>
struct WtBlockOf {
  size_t m, n, kc;
  const float* xbuf;
  const T* w;
  ptrdiff_t w_rs;
  float* c;
  ptrdiff_t ldc;
  bool add;
  size_t panels() const { return (m + kWtRows - 1) / kWtRows; }
  size_t rows(size_t ip) const { return std::min(kWtRows, m - ip * kWtRows); }
  const float* x(size_t ip) const { return xbuf + ip * kWtRows * kc; }
  const T* w_row(size_t j) const { return w + static_cast<ptrdiff_t>(j) * w_rs; }
  float* c_at(size_t ip, size_t j) const {
    return c + static_cast<ptrdiff_t>(ip * kWtRows) * ldc + static_cast<ptrdiff_t>(j);
  }
  // Rows of W after the block at j0 (blocks of `width` rows) that the first x panel prefetches.
  size_t next_rows(size_t j0, size_t width = kWtCols) const {
    return j0 + width < n ? std::min(width, n - j0 - width) : 0;
  }
};
using WtBlock = WtBlockOf<float>;

// W's rows read in place (up to three x panels; more take WtBlockPacked). One x panel against
// every block of W's rows, then the next panel: the x panel (32 values per step) is the wider
// operand, so it is the one that stays near the core while W's rows (14 values per step)
// stream past. Measured before packing took M >= 97 (in-process A/B, one thread, both of
// this machine's speed phases, M = 128-256, N = 768-4096, K = 256-768: 1-3% faster than the
// order of WtBlockCopied); at three panels or fewer the two orders differ little. The first
// panel prefetches the next block of rows.
// kDot: W's elements are pairs of bf16 values (KernelWtDot).
template <bool kDot>
void WtBlockInPlaceOf(const WtBlock& b, size_t width) {
  const auto& kernels = kDot ? kKernelsWtDot : kKernelsWt;
  for (size_t ip = 0; ip < b.panels(); ++ip) {
    for (size_t j0 = 0; j0 < b.n; j0 += width) {
      kernels[b.rows(ip) > kN ? 1 : 0][std::min(width, b.n - j0) - 1](
          b.kc, b.x(ip), b.w_row(j0), b.w_rs, b.c_at(ip, j0), b.ldc, b.add, b.rows(ip),
          b.w_row(j0 + width), ip == 0 ? b.next_rows(j0, width) : 0);
    }
  }
}
template <bool kDot>
void WtBlockInPlace(const WtBlock& b) {
  WtBlockInPlaceOf<kDot>(b, kWtCols);
}

// W's bf16 pair rows aliased in L1 (RowsSpreadInL1 false: a row stride a multiple of 4 KiB,
// K a multiple of 2048): read in place in blocks of kWtAliasedCols rows rather than copied
// (WtBlockCopied). The kernel reads its rows and prefetches the next block's at one offset
// per step, all in one L1 set; 14 of them overflow its 12 ways, 10 do not. One thread, Zen 4,
// W from memory, in-process alternation against the skinny path as a fixed yardstick, copied
// -> 10-row blocks: M = 16, K = 2048 / 4096 / 8192 1.28 / 1.35 / 1.54 -> 0.85 / 0.87 / 0.96
// (14-row blocks in place: 1.17 / 1.24 / 1.33); K = 2048, M = 64 / 96 / 128 / 256 1.16x /
// 1.12x / 1.08x / 1.01x faster. The same products per output in the same order: the width
// only groups the columns.
constexpr size_t kWtAliasedCols = 10;
template <bool kDot>
void WtBlockInPlaceAliased(const WtBlock& b) {
  WtBlockInPlaceOf<kDot>(b, kWtAliasedCols);
}

// W's rows aliased in L1 (RowsSpreadInL1): each block of the kernel's 14 rows is copied once
// to a stride a line longer than kc, and every x panel reads the copy (M = 232, N = 768, one
// thread: K = 1024 / 2048 / 3072 ran at 88-91 / 84-89 / 88 GF/s, their unaliased neighbours
// at 97-102 / 98-107 / 100). Block by block: copying the whole K block up front for
// WtBlockInPlace's order ran 2-4% slower (K = 1024-3072).
template <bool kDot>
void WtBlockCopied(const WtBlock& b) {
  const auto& kernels = kDot ? kKernelsWtDot : kKernelsWt;
  const size_t buf_rs = b.kc + 16;
  float* buf = gemm_detail::scratch(1, kWtCols * buf_rs);
  for (size_t j0 = 0; j0 < b.n; j0 += kWtCols) {
    const size_t cols = std::min(kWtCols, b.n - j0);
    for (size_t j = 0; j < cols; ++j)
      std::memcpy(buf + j * buf_rs, b.w_row(j0 + j), b.kc * sizeof(float));
    for (size_t ip = 0; ip < b.panels(); ++ip) {
      kernels[b.rows(ip) > kN ? 1 : 0][cols - 1](
          b.kc, b.x(ip), buf, static_cast<ptrdiff_t>(buf_rs), b.c_at(ip, j0), b.ldc, b.add,
          b.rows(ip), b.w_row(j0 + kWtCols), ip == 0 ? b.next_rows(j0) : 0);
    }
  }
}

// W's rows packed, 16 floats per step (KernelWtPacked), by the first x panel just before it
// uses each block (the block before prefetched them); the other panels read the packed
// blocks. Fewer uops per FMA than the in-place kernel: on this shared machine, while the core
// runs slow (other work on it: even a register-only FMA loop drops 30%), M = 256-512
// products run 11-18% faster; on an idle core 3-5% slower (the packing). Worth it from
// kWtPackMinPanels panels on: at two threads with W from memory, M = 128 runs 15-17% faster
// (2048 x 8192 either way; 8 - 10% at 768 x 768), M = 96 even; at M = 64 the packing costs
// more than it saves.
// Half-precision W widened to f32 (f16, and bf16 without the pair path) always takes this
// path: its rows are widened as they are packed.
template <class Conv, typename T>
void WtBlockPacked(const WtBlockOf<T>& b) {
  float* packed = gemm_detail::scratch(1, (b.n + kWtCols - 1) / kWtCols * kN * b.kc);
  const ptrdiff_t pf_rs = b.w_rs * static_cast<ptrdiff_t>(sizeof(T));
  for (size_t ip = 0; ip < b.panels(); ++ip) {
    for (size_t j0 = 0; j0 < b.n; j0 += kWtCols) {
      const size_t cols = std::min(kWtCols, b.n - j0);
      float* panel = packed + j0 / kWtCols * kN * b.kc;
      if (ip == 0) PackRows16<kN, Conv>(cols, kN, b.kc, b.w_row(j0), b.w_rs, panel);
      kKernelsWtPacked[b.rows(ip) > kN ? 1 : 0][cols - 1](
          b.kc, b.x(ip), panel, b.c_at(ip, j0), b.ldc, b.add, b.rows(ip),
          reinterpret_cast<const char*>(b.w_row(j0 + kWtCols)), pf_rs,
          ip == 0 ? b.next_rows(j0) : 0);
    }
  }
}

// C (+)= A times W^T (A element (i, p) at a[i * a_rs + p * a_cs], W row j at w + j * w_rs,
// contiguous along p), in equal K blocks of at most kWtKC. kept: every K block's x panels
// (WtPanelFloats), already packed (`packed`) or to be packed there; null: packed block by block
// into scratch. Every path computes each output's FMAs in the same order: the bits do not
// depend on the path.
template <class Conv, typename T, bool kDot>
void GemmWt(size_t m, size_t n, size_t k, const T* a, ptrdiff_t a_rs, ptrdiff_t a_cs, const T* w,
            ptrdiff_t w_rs, float* c, ptrdiff_t ldc, bool accumulate, float* kept, bool packed) {
  const size_t kc_max = EqualKBlock(k, kWtKC);
  const size_t panels = (m + kWtRows - 1) / kWtRows;
  float* block_buf = kept ? nullptr : gemm_detail::scratch(0, panels * kWtRows * kc_max);
  void (*block)(const WtBlockOf<T>&) = nullptr;
  if constexpr (kDot) {
    // bf16 pairs: W's rows read in place at every row count. Packing them (KernelWtPackedDot)
    // lost at every M measured: one thread, Zen 5, N = 2048, K = 5632: M = 16 282 -> 424 GF/s,
    // 128 413 -> 468, 384 431 -> 461, 504 408 -> 432; N = 8192, K = 4096 (rows through a
    // copy, aliasing in L1): M = 16 168 -> 181, 128 315 -> 399, 504 333 -> 400.
    block = RowsSpreadInL1(w_rs) ? &WtBlockInPlace<true> : &WtBlockInPlaceAliased<true>;
  } else {
    block = &WtBlockPacked<Conv, T>;
    if constexpr (std::is_same_v<T, float>) {
      if (panels < kWtPackMinPanels) {
        block = RowsSpreadInL1(w_rs) ? &WtBlockInPlace<false> : &WtBlockCopied<false>;
      }
    }
  }
  for (size_t pc = 0; pc < k; pc += kc_max) {
    const size_t kc = std::min(kc_max, k - pc);
    float* xbuf = kept ? kept + panels * kWtRows * pc : block_buf;
    if (!packed) {
      PackXBlock<Conv>(m, kc, a + static_cast<ptrdiff_t>(pc) * a_cs, a_rs, a_cs, xbuf);
    }
    block(WtBlockOf<T>{m, n, kc, xbuf, w + static_cast<ptrdiff_t>(pc), w_rs, c, ldc,
                       accumulate || pc > 0});
  }
}

// GemmWt's products: an f32 B^T (rows contiguous along p) over a K long enough, in a product
// of few enough rows (the whole product's: every tile, at any thread count, takes the same
// path, so the bits do not depend on the tiling).
inline bool ReadsTransposedBInPlace(size_t m_total, size_t k, ptrdiff_t b_rs, ptrdiff_t b_cs) {
  return b_rs == 1 && b_cs != 1 && k >= kWtMinK && m_total <= kWtMaxProductRows;
}

// Most floats of x panels kept from one tile for the next (8 MiB: 288 rows of a K of 7K).
constexpr size_t kKeptXMaxFloats = size_t{2} << 20;

// GemmWt over row chunks of at most kWtMaxRows, so that x's block and C's rows stay in L2
// (the order of each output's sum does not depend on them). token != 0: the caller promises
// that x is unchanged since the last call on this thread with the same token, address,
// strides and shape; the x panels packed then are read again. The VM's tiles of one row
// block over N (512 columns each) repacked x once per tile: a linear layer of 232 rows and
// 3072 outputs packed x six times.
template <class Conv, typename T, bool kDot = false>
void GemmWtRows(size_t m, size_t n, size_t k, const T* a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                const T* w, ptrdiff_t w_rs, float* c, ptrdiff_t ldc, bool accumulate,
                uint64_t token) {
  if (m == 0 || n == 0) return;
  const size_t max_rows = kDot ? kWtDotMaxRows : kWtMaxRows;
  const size_t chunks = (m + max_rows - 1) / max_rows;
  const size_t mc = ((m + chunks - 1) / chunks + kN - 1) / kN * kN;
  float* kept = nullptr;
  bool packed = false;
  if (token != 0 && k > 0 && (chunks * WtPanelFloats(mc, k) <= kKeptXMaxFloats)) {
    const gemm_detail::KeptX key{token, a, a_rs, a_cs, m, k, sizeof(T)};
    gemm_detail::KeptX& held = gemm_detail::kept_x();
    kept = gemm_detail::scratch(3, chunks * WtPanelFloats(mc, k));
    packed = held == key;
    held = key;
  }
  for (size_t i0 = 0; i0 < m; i0 += mc) {
    const size_t rows = std::min(mc, m - i0);
    GemmWt<Conv, T, kDot>(rows, n, k, a + static_cast<ptrdiff_t>(i0) * a_rs, a_rs, a_cs, w, w_rs,
                          c + static_cast<ptrdiff_t>(i0) * ldc, ldc, accumulate, kept, packed);
    if (kept) kept += WtPanelFloats(rows, k);
  }
}

// KernelWtPackedDot's W panel from a row-major bf16 B (element (p, j) at b[p * b_rs + j]):
// panel[q * 16 + j] = the pair (B[2q][j], B[2q + 1][j]) for columns j < cols <= 16, q < kc.
// Two rows of 16 values zero-extended and interleaved per step (lanes past cols zero).
#pragma GCC diagnostic push
#ifndef __clang__  // the intrinsics' undefined lanes (a GCC warning group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
HWY_INLINE void PackPairsOfRows(size_t cols, size_t kc, const uint16_t* b, ptrdiff_t b_rs,
                                float* HWY_RESTRICT panel) {
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  for (size_t q = 0; q < kc; ++q) {
    const uint16_t* even = b + static_cast<ptrdiff_t>(2 * q) * b_rs;
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, even));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, even + b_rs));
    _mm512_storeu_si512(panel + q * kN, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
}
#pragma GCC diagnostic pop

// C (+)= A B for bf16 A (rows of k2 pairs: the float view, a_rs in pairs) and a row-major
// bf16 B (b_rs in elements; k = 2 * k2 rows) on VDPBF16PS: GemmWt's loop (x in 32-row
// panels, W^T's 14-column blocks packed by the first panel) with B's pairs of rows
// interleaved into the packed blocks (PackPairsOfRows). Row chunks of kWtDotMaxRows, K blocks
// of kWtKC pairs; each output sums its pairs in order, whatever the rows of the call.
void GemmBRowsDot(size_t m, size_t n, size_t k2, const float* a, ptrdiff_t a_rs, const uint16_t* b,
                  ptrdiff_t b_rs, float* c, ptrdiff_t ldc, bool accumulate) {
  const size_t kc_max = EqualKBlock(k2, kWtKC);
  const size_t chunks = (m + kWtDotMaxRows - 1) / kWtDotMaxRows;
  const size_t mc = ((m + chunks - 1) / chunks + kN - 1) / kN * kN;
  float* xbuf = gemm_detail::scratch(0, WtPanelFloats(std::min(mc, m), kc_max));
  float* packed = gemm_detail::scratch(1, (n + kWtCols - 1) / kWtCols * kN * kc_max);
  for (size_t i0 = 0; i0 < m; i0 += mc) {
    const size_t rows = std::min(mc, m - i0);
    for (size_t pc = 0; pc < k2; pc += kc_max) {
      const size_t kc = std::min(kc_max, k2 - pc);
      PackXBlock<ConvF32>(rows, kc, a + static_cast<ptrdiff_t>(i0) * a_rs + pc, a_rs, 1, xbuf);
      const WtBlock blk{rows,
                        n,
                        kc,
                        xbuf,
                        nullptr,
                        0,
                        c + static_cast<ptrdiff_t>(i0) * ldc,
                        ldc,
                        accumulate || pc > 0};
      for (size_t ip = 0; ip < blk.panels(); ++ip) {
        for (size_t j0 = 0; j0 < n; j0 += kWtCols) {
          const size_t cols = std::min(kWtCols, n - j0);
          float* panel = packed + j0 / kWtCols * kN * kc;
          if (ip == 0) {
            PackPairsOfRows(cols, kc, b + static_cast<ptrdiff_t>(2 * pc) * b_rs + j0, b_rs, panel);
          }
          kKernelsWtPackedDot[blk.rows(ip) > kN ? 1 : 0][cols - 1](
              kc, blk.x(ip), panel, blk.c_at(ip, j0), ldc, blk.add, blk.rows(ip), nullptr, 0, 0);
        }
      }
    }
  }
}

#elif HWY_TARGET != HWY_SCALAR
// One panel of width kWidth from `rows` <= kWidth f32 rows contiguous along p (row r at
// src + r * rs): 4 x 4 blocks are transposed in registers (128-bit vectors exist on every
// target). Packs A panels (rows of A: exactly their rows) and B panels of a transposed B (its
// columns, zero-padded to kWidth), as the AVX-512 packer above.
template <size_t kWidth = kMR>
HWY_INLINE void PackRowsF32(size_t rows, size_t kc, const float* src, ptrdiff_t rs,
                            float* HWY_RESTRICT panel) {
  const hn::Full128<float> d4;
  const size_t kc4 = kc & ~size_t{3};
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* s0 = src + static_cast<ptrdiff_t>(r) * rs;
    const float* s1 = s0 + rs;
    const float* s2 = s1 + rs;
    const float* s3 = s2 + rs;
    float* out = panel + r;
    for (size_t p = 0; p < kc4; p += 4) {
      const auto r0 = hn::LoadU(d4, s0 + p), r1 = hn::LoadU(d4, s1 + p);
      const auto r2 = hn::LoadU(d4, s2 + p), r3 = hn::LoadU(d4, s3 + p);
      const auto t0 = hn::InterleaveLower(d4, r0, r1), t1 = hn::InterleaveLower(d4, r2, r3);
      const auto t2 = hn::InterleaveUpper(d4, r0, r1), t3 = hn::InterleaveUpper(d4, r2, r3);
      hn::StoreU(hn::ConcatLowerLower(d4, t1, t0), d4, out + (p + 0) * kWidth);
      hn::StoreU(hn::ConcatUpperUpper(d4, t1, t0), d4, out + (p + 1) * kWidth);
      hn::StoreU(hn::ConcatLowerLower(d4, t3, t2), d4, out + (p + 2) * kWidth);
      hn::StoreU(hn::ConcatUpperUpper(d4, t3, t2), d4, out + (p + 3) * kWidth);
    }
    for (size_t p = kc4; p < kc; ++p) {
      out[p * kWidth + 0] = s0[p];
      out[p * kWidth + 1] = s1[p];
      out[p * kWidth + 2] = s2[p];
      out[p * kWidth + 3] = s3[p];
    }
  }
  for (; r < rows; ++r) {
    const float* s = src + static_cast<ptrdiff_t>(r) * rs;
    for (size_t p = 0; p < kc; ++p) panel[p * kWidth + r] = s[p];
  }
  if constexpr (kWidth == kNR) {
    for (size_t p = 0; rows < kNR && p < kc; ++p) {
      for (size_t j = rows; j < kNR; ++j) panel[p * kNR + j] = 0.0f;
    }
  }
}
#endif

// The rows of A split into panels of at most MR rows, balanced (16 rows on AVX-512: 8 + 8, not
// 14 + 2: an 8-row kernel is far more efficient than a 2-row one).
struct Panels {
  size_t count, base, extra;  // panel i has base + (i < extra) rows
  explicit Panels(size_t m) : count((m + kMR - 1) / kMR), base(m / count), extra(m % count) {}
  size_t rows(size_t i) const { return base + (i < extra ? 1 : 0); }
  size_t start(size_t i) const { return i * base + std::min(i, extra); }
};

// Packs columns [0, kc) of A (element (i, p) at a[i * rs + p * cs]) into the panels of `pan`,
// panel i at dst + i * MR * kc. Rows past a panel's row count are left unset (its kernel reads
// only its rows).
template <typename T, class Conv>
void PackA(const Panels& pan, size_t kc, const T* a, ptrdiff_t rs, ptrdiff_t cs,
           float* HWY_RESTRICT dst, Conv conv) {
  for (size_t i = 0; i < pan.count; ++i) {
    const size_t rows = pan.rows(i);
    float* panel = dst + i * kMR * kc;
    const T* src = a + static_cast<ptrdiff_t>(pan.start(i)) * rs;
#if HWY_TARGET != HWY_SCALAR
    if constexpr (std::is_same_v<T, float>) {
      if (cs == 1) {
        PackRowsF32(rows, kc, src, rs, panel);
        continue;
      }
    }
#endif
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (!std::is_same_v<T, float>) {  // halves widened in 16 x 16 blocks
      if (cs == 1) {
        PackRowsF32<kMR, Conv>(rows, kc, src, rs, panel);
        continue;
      }
    }
#endif
    if (std::abs(cs) <= std::abs(rs) && cs != 0) {
      // Rows contiguous (or nearly): read along p.
      for (size_t r = 0; r < rows; ++r) {
        const T* s = src + static_cast<ptrdiff_t>(r) * rs;
        for (size_t p = 0; p < kc; ++p)
          panel[p * kMR + r] = conv(s[static_cast<ptrdiff_t>(p) * cs]);
      }
    } else {
      for (size_t p = 0; p < kc; ++p) {
        const T* s = src + static_cast<ptrdiff_t>(p) * cs;
        for (size_t r = 0; r < rows; ++r)
          panel[p * kMR + r] = conv(s[static_cast<ptrdiff_t>(r) * rs]);
      }
    }
  }
}

// Packs rows [0, kc) x columns [0, n) of B (element (p, j) at b[p * rs + j * cs]) into NR-column
// panels, zero-padding the columns past n.
template <typename T, class Conv>
void PackB(size_t kc, size_t n, const T* b, ptrdiff_t rs, ptrdiff_t cs, float* HWY_RESTRICT dst,
           Conv conv) {
  for (size_t j0 = 0; j0 < n; j0 += kNR) {
    const size_t cols = std::min(kNR, n - j0);
    float* panel = dst + j0 * kc;
    const T* src = b + static_cast<ptrdiff_t>(j0) * cs;
    if constexpr (std::is_same_v<T, float>) {
      if (cs == 1 && cols == kNR) {
        // Vector copies (a small memcpy would become `rep movs`, slow at this size).
        const DF d;
        for (size_t p = 0; p < kc; ++p) {
          const float* s = src + static_cast<ptrdiff_t>(p) * rs;
          float* out = panel + p * kNR;
#pragma GCC unroll 4
          for (size_t v = 0; v < kNV; ++v) hn::Store(hn::LoadU(d, s + v * kN), d, out + v * kN);
        }
        continue;
      }
    }
#if HWY_TARGET != HWY_SCALAR
    if constexpr (std::is_same_v<T, float>) {
      if (rs == 1) {  // a transposed B (linear weights [N, K]): columns contiguous along p
        PackRowsF32<kNR>(cols, kc, src, cs, panel);  // zero-pads the columns past n
        continue;
      }
    }
#endif
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (!std::is_same_v<T, float>) {  // halves widened in 16 x 16 blocks
      if (rs == 1) {
        PackRowsF32<kNR, Conv>(cols, kc, src, cs, panel);
        continue;
      }
    }
#endif
    if (std::abs(cs) <= std::abs(rs) && cs != 0) {
      for (size_t p = 0; p < kc; ++p) {
        float* out = panel + p * kNR;
        const T* s = src + static_cast<ptrdiff_t>(p) * rs;
        for (size_t j = 0; j < cols; ++j) out[j] = conv(s[static_cast<ptrdiff_t>(j) * cs]);
        for (size_t j = cols; j < kNR; ++j) out[j] = 0.0f;
      }
    } else {
      if (cols < kNR) {
        for (size_t p = 0; p < kc; ++p) {
          for (size_t j = cols; j < kNR; ++j) panel[p * kNR + j] = 0.0f;
        }
      }
      for (size_t j = 0; j < cols; ++j) {
        const T* s = src + static_cast<ptrdiff_t>(j) * cs;
        for (size_t p = 0; p < kc; ++p)
          panel[p * kNR + j] = conv(s[static_cast<ptrdiff_t>(p) * rs]);
      }
    }
  }
}

// The element types GemvT reads, widened to f32 as they are loaded: f32, or bf16 / f16 bits
// (uint16_t). Load: kN elements from p; One: one element.
struct RowF32 {
  using T = float;
  static VF Load(DF d, const float* p) { return hn::LoadU(d, p); }
  static float One(float x) { return x; }
};
struct RowBF16 {
  using T = uint16_t;
  static VF Load(DF d, const uint16_t* p) {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::RebindToUnsigned<DF> du;
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, p))));
  }
  static float One(uint16_t x) { return bf16_bits_to_f32(x); }
};
struct RowF16 {
  using T = uint16_t;
  static VF Load(DF d, const uint16_t* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(d, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(p)));
#else  // no F16C: by the scalar spec
    HWY_ALIGN float tmp[kN];
    for (size_t i = 0; i < kN; ++i) tmp[i] = f16_bits_to_f32(p[i]);
    return hn::Load(d, tmp);
#endif
  }
  static float One(uint16_t x) {
    return f16_bits_to_f32(x);
  }
};

// Skinny products with a transposed B (decode through a linear layer: x [m <= 16, K] times
// W [N, K]^T): every output is a dot product of two contiguous rows, so W streams once, in
// place, at memory bandwidth (as bf16 / f16: half the bytes of f32). Four W rows at a time
// share each load of x; up to 4 rows of x at a time share each load of W, and the next rows
// of x reuse the same four W rows from L1, so W is read from memory once whatever m is. Each
// output is summed lane-wise over K in vector steps, then across lanes, then its scalar
// tail: the same order for any m.
// kW W rows at a time: 4, or kGemvTWideRows for a single row of x over a short K (attention's
// q . k over a head, a small model's layers), whose loads of x are then shared by more rows,
// with more independent sums in flight (m = 1, one thread, W in L3: N = 4096, K = 256 77-79
// -> 88 GB/s; N = 2048, K = 64 67-70 -> 81-85). Long rows stream from memory better four at a
// time (K = 1024 / 2048 / 8192 from memory at 8 rows: 33 -> 31, 36 -> 35, 39 -> 33 GB/s).
template <class R, size_t kM, size_t kW = 4>
void GemvTRows(size_t j, size_t k, const typename R::T* a, ptrdiff_t a_rs,
               const typename R::T* const* w, float* c, ptrdiff_t ldc, bool accumulate) {
  const DF d;
  const size_t kv = k / kN * kN;
  VF acc[kM][kW];
  for (size_t i = 0; i < kM; ++i)
    for (size_t q = 0; q < kW; ++q) acc[i][q] = hn::Zero(d);
  for (size_t p = 0; p < kv; p += kN) {
    VF wv[kW];
    for (size_t q = 0; q < kW; ++q) wv[q] = R::Load(d, w[q] + p);
    for (size_t i = 0; i < kM; ++i) {
      const VF x = R::Load(d, a + static_cast<ptrdiff_t>(i) * a_rs + p);
      for (size_t q = 0; q < kW; ++q) acc[i][q] = hn::MulAdd(x, wv[q], acc[i][q]);
    }
  }
  for (size_t i = 0; i < kM; ++i) {
    const typename R::T* x = a + static_cast<ptrdiff_t>(i) * a_rs;
    for (size_t q = 0; q < kW; ++q) {
      float tail = 0.0f;
      for (size_t p = kv; p < k; ++p) tail += R::One(x[p]) * R::One(w[q][p]);
      const float v = hn::GetLane(hn::SumOfLanes(d, acc[i][q])) + tail;
      float& out = c[static_cast<ptrdiff_t>(i) * ldc + static_cast<ptrdiff_t>(j + q)];
      out = accumulate ? out + v : v;
    }
  }
}
constexpr size_t kGemvTWideRows = 8;
constexpr size_t kGemvTWideMaxK = 512;

template <class R>
void GemvT(size_t m, size_t n, size_t k, const typename R::T* a, ptrdiff_t a_rs,
           const typename R::T* b, ptrdiff_t b_cs, float* c, ptrdiff_t ldc, bool accumulate) {
  using T = typename R::T;
  using RowsFn =
      void (*)(size_t, size_t, const T*, ptrdiff_t, const T* const*, float*, ptrdiff_t, bool);
  constexpr RowsFn kRows[] = {&GemvTRows<R, 1>, &GemvTRows<R, 2>, &GemvTRows<R, 3>,
                              &GemvTRows<R, 4>};
  const DF d;
  const size_t kv = k / kN * kN;
  size_t j = 0;
  for (; m == 1 && k <= kGemvTWideMaxK && j + kGemvTWideRows <= n; j += kGemvTWideRows) {
    const T* w[kGemvTWideRows];
    for (size_t q = 0; q < kGemvTWideRows; ++q) w[q] = b + static_cast<ptrdiff_t>(j + q) * b_cs;
    GemvTRows<R, 1, kGemvTWideRows>(j, k, a, a_rs, w, c, ldc, accumulate);
  }
  for (; j + 4 <= n; j += 4) {
    const T* w[4];
    for (size_t q = 0; q < 4; ++q) w[q] = b + static_cast<ptrdiff_t>(j + q) * b_cs;
    for (size_t i = 0; i < m; i += 4) {
      const T* ai = a + static_cast<ptrdiff_t>(i) * a_rs;
      float* ci = c + static_cast<ptrdiff_t>(i) * ldc;
      kRows[std::min<size_t>(4, m - i) - 1](j, k, ai, a_rs, w, ci, ldc, accumulate);
    }
  }
  for (; j < n; ++j) {
    const T* w = b + static_cast<ptrdiff_t>(j) * b_cs;
    for (size_t i = 0; i < m; ++i) {
      const T* x = a + static_cast<ptrdiff_t>(i) * a_rs;
      VF acc = hn::Zero(d);
      for (size_t p = 0; p < kv; p += kN)
        acc = hn::MulAdd(R::Load(d, x + p), R::Load(d, w + p), acc);
      float tail = 0.0f;
      for (size_t p = kv; p < k; ++p) tail += R::One(x[p]) * R::One(w[p]);
      const float v = hn::GetLane(hn::SumOfLanes(d, acc)) + tail;
      float& out = c[static_cast<ptrdiff_t>(i) * ldc + static_cast<ptrdiff_t>(j)];
      out = accumulate ? out + v : v;
    }
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// GemvTRows for bf16 on AVX512-BF16: 32 values of a row per load, their pairs multiplied by
// VDPBF16PS, so W streams without widening (one instruction per 32 values where widening took
// two shifts and two FMAs); kW W rows (4, or 1 for the last columns). The order of each
// output's sum depends on k alone: pairs in lanes over K in 32-value steps, the lanes, then
// the scalar tail (k mod 32), widened.
template <size_t kM, size_t kW>
DVM_BF16_DOT HWY_NOINLINE void GemvTDotRows(size_t j, size_t k, const uint16_t* a, ptrdiff_t a_rs,
                                            const uint16_t* const* w, float* c, ptrdiff_t ldc,
                                            bool accumulate) {
  const size_t kv = k / 32 * 32;
  __m512 acc[kM][kW];
  for (size_t i = 0; i < kM; ++i)
    for (size_t q = 0; q < kW; ++q) acc[i][q] = _mm512_setzero_ps();
  for (size_t p = 0; p < kv; p += 32) {
    __m512bh wv[kW];
    for (size_t q = 0; q < kW; ++q) wv[q] = (__m512bh)_mm512_loadu_si512(w[q] + p);
    for (size_t i = 0; i < kM; ++i) {
      const __m512bh x = (__m512bh)_mm512_loadu_si512(a + static_cast<ptrdiff_t>(i) * a_rs + p);
      for (size_t q = 0; q < kW; ++q) acc[i][q] = _mm512_dpbf16_ps(acc[i][q], x, wv[q]);
    }
  }
  const DF d;
  for (size_t i = 0; i < kM; ++i) {
    const uint16_t* x = a + static_cast<ptrdiff_t>(i) * a_rs;
    for (size_t q = 0; q < kW; ++q) {
      float tail = 0.0f;
      for (size_t p = kv; p < k; ++p) tail += bf16_bits_to_f32(x[p]) * bf16_bits_to_f32(w[q][p]);
      const float v = hn::GetLane(hn::SumOfLanes(d, VF{acc[i][q]})) + tail;
      float& out = c[static_cast<ptrdiff_t>(i) * ldc + static_cast<ptrdiff_t>(j + q)];
      out = accumulate ? out + v : v;
    }
  }
}

// GemvT<RowBF16> with GemvTDotRows.
void GemvTDot(size_t m, size_t n, size_t k, const uint16_t* a, ptrdiff_t a_rs, const uint16_t* b,
              ptrdiff_t b_cs, float* c, ptrdiff_t ldc, bool accumulate) {
  using RowsFn = void (*)(size_t, size_t, const uint16_t*, ptrdiff_t, const uint16_t* const*,
                          float*, ptrdiff_t, bool);
  constexpr RowsFn kRows4[] = {&GemvTDotRows<1, 4>, &GemvTDotRows<2, 4>, &GemvTDotRows<3, 4>,
                               &GemvTDotRows<4, 4>};
  constexpr RowsFn kRows1[] = {&GemvTDotRows<1, 1>, &GemvTDotRows<2, 1>, &GemvTDotRows<3, 1>,
                               &GemvTDotRows<4, 1>};
  for (size_t j = 0; j < n;) {
    const size_t cols = n - j >= 4 ? 4 : 1;
    const uint16_t* w[4];
    for (size_t q = 0; q < cols; ++q) w[q] = b + static_cast<ptrdiff_t>(j + q) * b_cs;
    for (size_t i = 0; i < m; i += 4) {
      const size_t rows = std::min<size_t>(4, m - i);
      (cols == 4 ? kRows4 : kRows1)[rows - 1](j, k, a + static_cast<ptrdiff_t>(i) * a_rs, a_rs, w,
                                              c + static_cast<ptrdiff_t>(i) * ldc, ldc, accumulate);
    }
    j += cols;
  }
}
#endif

// Products of a few rows with a row-major B (B [K, N] read in place: GPT-2's Conv1D weights,
// probabilities @ V in decode) as rows of B scaled and added into the outputs, B streamed row
// after row. The panel kernels walked B in strips of 64 columns down K, short runs a row
// stride apart (one thread, f32, against those kernels: M = 1, N = 1024, K = 256 with B in
// cache 56 -> 109 GB/s of B; N = 8192, K = 2048 from memory 19 -> 31; M = 4 36 -> 54 and 10
// -> 12.5). The same products in the same order as Kernel (per K block of GemmImpl's size,
// each output's FMAs in order of p from zero, then added to C), so the bits do not depend on
// the path. Partial sums of a K block live in scratch, four rows of B per pass over them.
constexpr size_t kGemvBMaxRows = 4;
constexpr size_t kGemvBUnroll = 4;

template <class Conv>
struct RowOf;
template <>
struct RowOf<ConvF32> {
  using type = RowF32;
};
template <>
struct RowOf<ConvBF16> {
  using type = RowBF16;
};
template <>
struct RowOf<ConvF16> {
  using type = RowF16;
};

// kU rows of B from row p of the block on (row u at w[u]), into the partial sums z (kM rows of
// nv vectors; the last `tail` elements wide where tail != 0).
template <class R, size_t kM, size_t kU>
HWY_INLINE void GemvBStep(const typename R::T* const* w, const float (&x)[kM][kGemvBUnroll],
                          size_t full, size_t tail, size_t nv, float* HWY_RESTRICT z) {
  using T = typename R::T;
  const DF d;
  VF xv[kM][kU];
  for (size_t r = 0; r < kM; ++r)
    for (size_t u = 0; u < kU; ++u) xv[r][u] = hn::Set(d, x[r][u]);
  const auto accumulate = [&](size_t v, const VF(&wv)[kU]) {
    for (size_t r = 0; r < kM; ++r) {
      float* zp = z + (r * nv + v) * kN;
      VF acc = hn::Load(d, zp);
      for (size_t u = 0; u < kU; ++u) acc = hn::MulAdd(xv[r][u], wv[u], acc);
      hn::Store(acc, d, zp);
    }
  };
  for (size_t v = 0; v < full; ++v) {
    VF wv[kU];
    for (size_t u = 0; u < kU; ++u) wv[u] = R::Load(d, w[u] + v * kN);
    accumulate(v, wv);
  }
  if (tail != 0) {  // the last columns through a zero-padded copy: no read past a row
    VF wv[kU];
    for (size_t u = 0; u < kU; ++u) {
      HWY_ALIGN T buf[kN] = {};
      std::memcpy(buf, w[u] + full * kN, tail * sizeof(T));
      wv[u] = R::Load(d, buf);
    }
    accumulate(full, wv);
  }
}

template <class R, size_t kM>
void GemvBRows(size_t n, size_t k, const typename R::T* a, ptrdiff_t a_rs, ptrdiff_t a_cs,
               const typename R::T* b, ptrdiff_t b_rs, float* c, ptrdiff_t ldc, bool accumulate) {
  using T = typename R::T;
  const DF d;
  const size_t kc_max = EqualKBlock(k, kKC);  // GemmImpl's K blocks
  const size_t full = n / kN, tail = n % kN, nv = full + (tail != 0 ? 1 : 0);
  float* z = gemm_detail::scratch(1, kM * nv * kN);
  for (size_t pc = 0; pc < k; pc += kc_max) {
    const size_t kc = std::min(kc_max, k - pc);
    std::fill_n(z, kM * nv * kN, 0.0f);
    const auto step = [&](size_t p, auto unroll) {
      constexpr size_t kU = decltype(unroll)::value;
      const T* w[kU];
      float x[kM][kGemvBUnroll];
      for (size_t u = 0; u < kU; ++u) {
        const ptrdiff_t row = static_cast<ptrdiff_t>(pc + p + u);
        w[u] = b + row * b_rs;
        for (size_t r = 0; r < kM; ++r)
          x[r][u] = R::One(a[static_cast<ptrdiff_t>(r) * a_rs + row * a_cs]);
      }
      GemvBStep<R, kM, kU>(w, x, full, tail, nv, z);
    };
    size_t p = 0;
    for (; p + kGemvBUnroll <= kc; p += kGemvBUnroll)
      step(p, std::integral_constant<size_t, kGemvBUnroll>());
    for (; p < kc; ++p) step(p, std::integral_constant<size_t, 1>());
    const bool add = accumulate || pc > 0;
    for (size_t r = 0; r < kM; ++r) {
      float* cr = c + static_cast<ptrdiff_t>(r) * ldc;
      const float* zr = z + r * nv * kN;
      for (size_t v = 0; v < full; ++v) {
        const VF sum = hn::Load(d, zr + v * kN);
        hn::StoreU(add ? hn::Add(hn::LoadU(d, cr + v * kN), sum) : sum, d, cr + v * kN);
      }
      for (size_t j = full * kN; j < n; ++j) cr[j] = add ? cr[j] + zr[j] : zr[j];
    }
  }
}

template <class R>
void GemvB(size_t m, size_t n, size_t k, const typename R::T* a, ptrdiff_t a_rs, ptrdiff_t a_cs,
           const typename R::T* b, ptrdiff_t b_rs, float* c, ptrdiff_t ldc, bool accumulate) {
  using T = typename R::T;
  using Fn = void (*)(size_t, size_t, const T*, ptrdiff_t, ptrdiff_t, const T*, ptrdiff_t, float*,
                      ptrdiff_t, bool);
  constexpr Fn kRows[] = {&GemvBRows<R, 1>, &GemvBRows<R, 2>, &GemvBRows<R, 3>, &GemvBRows<R, 4>};
  static_assert(std::size(kRows) == kGemvBMaxRows);
  kRows[m - 1](n, k, a, a_rs, a_cs, b, b_rs, c, ldc, accumulate);
}

// `packed`: B's panels (gemm.h PackedB) or null (B is packed here, per K block).
template <typename T, class Conv>
void GemmImpl(size_t m, size_t n, size_t k, const T* a, ptrdiff_t a_rs, ptrdiff_t a_cs, const T* b,
              ptrdiff_t b_rs, ptrdiff_t b_cs, float* c, ptrdiff_t ldc, bool accumulate, Conv conv,
              const float* packed = nullptr, size_t k_total = 0) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) {
      for (size_t i = 0; i < m; ++i) std::fill_n(c + static_cast<ptrdiff_t>(i) * ldc, n, 0.0f);
    }
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    // A caller that knows its whole product takes the skinny path for up to kSkinnyMaxRows
    // rows (gemm_f32_skinny); a product this small takes it here.
    if (b != nullptr && m <= 4 && gemm_skinny_in_place(m, a_cs, b_rs, b_cs)) {
      return GemvT<RowF32>(m, n, k, a, a_rs, b, b_cs, c, ldc, accumulate);
    }
  }
  if (b != nullptr && packed == nullptr && b_cs == 1 && m <= kGemvBMaxRows) {
    return GemvB<typename RowOf<Conv>::type>(m, n, k, a, a_rs, a_cs, b, b_rs, c, ldc, accumulate);
  }
  // Equal K blocks of at most kKC.
  const size_t kc_max = EqualKBlock(k, kKC);
  const Panels pan(m);
  // Few A panels reuse B little: read contiguous f32 B rows in place instead of packing them,
  // B panel by B panel (each stays in L1/L2 while the A panels pass over it; the first A
  // panel prefetches the next B panel's rows). Up to kDirectBMaxPanels A panels (x @ W + b,
  // W [K, N] cold, one thread, M = 32 / 64 / 128: 110-118 -> 114-143, 141-150 -> 143-173,
  // 162-168 -> 161-188 GF/s; at M = 256 packing is as fast). The same kernels in the same
  // order as with packed panels: the bits do not depend on the choice.
  const bool direct_b =
      packed == nullptr && std::is_same_v<T, float> && b_cs == 1 && pan.count <= kDirectBMaxPanels;
  // A row-major f32 A is read in place (see Kernel), except where its rows alias in L1
  // (RowsSpreadInL1).
  const bool a_in_place = std::is_same_v<T, float> && a_cs == 1 && RowsSpreadInL1(a_rs);
  const size_t nc_max = std::min(n, kNC);
  float* abuf = gemm_detail::scratch(0, a_in_place ? 0 : pan.count * kMR * kc_max);
  const size_t b_panels = packed != nullptr ? 0 : direct_b ? 1 : (nc_max + kNR - 1) / kNR;
  float* bbuf = gemm_detail::scratch(1, b_panels * kNR * kc_max);

  for (size_t jc = 0; jc < n; jc += kNC) {
    const size_t nb = std::min(kNC, n - jc);
    const size_t full = nb / kNR * kNR;
    for (size_t pc = 0; pc < k; pc += kc_max) {
      const size_t kc = std::min(kc_max, k - pc);
      const bool add = accumulate || pc > 0;
      const T* bblk =
          b == nullptr ? nullptr
                       : b + static_cast<ptrdiff_t>(pc) * b_rs + static_cast<ptrdiff_t>(jc) * b_cs;
      float* cblk = c + static_cast<ptrdiff_t>(jc);
      if (!a_in_place)
        PackA(pan, kc, a + static_cast<ptrdiff_t>(pc) * a_cs, a_rs, a_cs, abuf, conv);
      // One micro-kernel call: A panel ip x the B panel at bp (row stride bs), columns j0...
      // With a prefetch, the kernel also asks for the next panel's source (see Kernel).
      const auto tile = [&](size_t ip, size_t j0, const float* bp, ptrdiff_t bs, Prefetch pf = {}) {
        const size_t rows = pan.rows(ip);
        const size_t cols = std::min(kNR, nb - j0);
        const int in = a_in_place ? 1 : 0;
        const KernelFn fn = pf.base != nullptr && cols == kNR
                                ? kKernelsPf[in][rows - 1]
                                : kKernels[in][cols <= kN ? 0 : 1][rows - 1];
        const float* ap = abuf + ip * kMR * kc;
        if (a_in_place) {
          ap = reinterpret_cast<const float*>(a) + static_cast<ptrdiff_t>(pan.start(ip)) * a_rs +
               static_cast<ptrdiff_t>(pc);
        }
        fn(kc, ap, bp, bs,
           cblk + static_cast<ptrdiff_t>(pan.start(ip)) * ldc + static_cast<ptrdiff_t>(j0), ldc,
           add, cols, pf, a_rs);
      };
      if (direct_b) {
        if (full < nb) PackB(kc, nb - full, bblk + full, b_rs, b_cs, bbuf, conv);
        for (size_t j0 = 0; j0 < nb; j0 += kNR) {
          // T is float here (direct_b).
          const float* bp = j0 < full ? reinterpret_cast<const float*>(bblk) + j0 : bbuf;
          const ptrdiff_t bs = j0 < full ? b_rs : static_cast<ptrdiff_t>(kNR);
          Prefetch pf;  // the next panel's kc rows of 32 floats, one row per step
          if (j0 + 2 * kNR <= full) {
            pf = {reinterpret_cast<const char*>(reinterpret_cast<const float*>(bblk) + j0 + kNR),
                  static_cast<ptrdiff_t>(b_rs * sizeof(float)), 9};
          }
          tile(0, j0, bp, bs, pf);
          for (size_t ip = 1; ip < pan.count; ++ip) tile(ip, j0, bp, bs);
        }
      } else if (packed != nullptr) {
        // Panel of column jc + j0 over the whole K, from row pc on.
        const float* pblk = packed + jc * k_total + pc * kNR;
        // The first row of panels reads the block from memory: each kernel call prefetches
        // the next panel (kc x NR contiguous floats, seen as 32 rows of kc floats).
        for (size_t j0 = 0; j0 < nb; j0 += kNR) {
          Prefetch pf;
          if (j0 + kNR < nb) {
            pf = {reinterpret_cast<const char*>(pblk + (j0 + kNR) * k_total),
                  static_cast<ptrdiff_t>(kc * sizeof(float)), 5};
          }
          tile(0, j0, pblk + j0 * k_total, kNR, pf);
        }
        for (size_t ip = 1; ip < pan.count; ++ip) {
          for (size_t j0 = 0; j0 < nb; j0 += kNR) tile(ip, j0, pblk + j0 * k_total, kNR);
        }
      } else {
        PackB(kc, nb, bblk, b_rs, b_cs, bbuf, conv);
        for (size_t ip = 0; ip < pan.count; ++ip) {
          for (size_t j0 = 0; j0 < nb; j0 += kNR) tile(ip, j0, bbuf + j0 * kc, kNR);
        }
      }
    }
  }
}

bool GemmReadsTransposedBInPlace(int64_t m_total, int64_t k, int64_t b_rs, int64_t b_cs) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return ReadsTransposedBInPlace(static_cast<size_t>(m_total), static_cast<size_t>(k), b_rs, b_cs);
#else
  (void)m_total;
  (void)k;
  (void)b_rs;
  (void)b_cs;
  return false;
#endif
}

void GemmF32TransposedBInPlace(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs,
                               int64_t a_cs, const float* b, int64_t b_cs, float* c, int64_t ldc,
                               bool accumulate, uint64_t a_token) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (k > 0) {
    return GemmWtRows<ConvF32>(m, n, k, a, a_rs, a_cs, b, b_cs, c, ldc, accumulate, a_token);
  }
#else
  (void)a_token;
#endif
  GemmImpl<float>(m, n, k, a, a_rs, a_cs, b, 1, b_cs, c, ldc, accumulate, ConvF32());
}

// Can x's and W's rows be read as pairs of bf16 values along K (KernelWtDot)? An even K
// and even row strides, so that no pair straddles two rows (gemm_bf16_dot_fits).
inline bool BF16PairsFit(int64_t k, int64_t a_rs, int64_t a_cs, int64_t b_cs) {
  return k % 2 == 0 && a_cs == 1 && a_rs % 2 == 0 && b_cs % 2 == 0;
}

// bf16 A times a row-major bf16 B (b_cs 1) on VDPBF16PS where BF16PairsFit(k, a_rs, a_cs, 2)
// (gemm_bf16_dot_rows_fits); GemmImpl elsewhere.
void GemmBF16BRows(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                   const uint16_t* b, int64_t b_rs, float* c, int64_t ldc, bool accumulate) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (k > 0 && gemm_detail::bf16_dot_enabled() && BF16PairsFit(k, a_rs, a_cs, 2)) {
    return GemmBRowsDot(m, n, k / 2, reinterpret_cast<const float*>(a), a_rs / 2, b, b_rs, c, ldc,
                        accumulate);
  }
#endif
  GemmImpl<uint16_t>(m, n, k, a, a_rs, a_cs, b, b_rs, 1, c, ldc, accumulate, ConvBF16());
}

void GemmHalfTransposedBInPlace(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                                int64_t a_rs, int64_t a_cs, const uint16_t* b, int64_t b_cs,
                                float* c, int64_t ldc, bool accumulate, uint64_t a_token) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (k > 0) {
    if (in_type == DType::kF16) {
      return GemmWtRows<ConvF16>(m, n, k, a, a_rs, a_cs, b, b_cs, c, ldc, accumulate, a_token);
    }
    if (gemm_detail::bf16_dot_enabled() && BF16PairsFit(k, a_rs, a_cs, b_cs)) {
      // bf16 pairs along K as 32-bit elements: the f32 machinery over k / 2 steps.
      return GemmWtRows<ConvF32, float, true>(m, n, k / 2, reinterpret_cast<const float*>(a),
                                              a_rs / 2, 1, reinterpret_cast<const float*>(b),
                                              b_cs / 2, c, ldc, accumulate, a_token);
    }
    return GemmWtRows<ConvBF16>(m, n, k, a, a_rs, a_cs, b, b_cs, c, ldc, accumulate, a_token);
  }
#else
  (void)a_token;
#endif
  if (in_type == DType::kF16) {
    return GemmImpl<uint16_t>(m, n, k, a, a_rs, a_cs, b, 1, b_cs, c, ldc, accumulate, ConvF16());
  }
  GemmImpl<uint16_t>(m, n, k, a, a_rs, a_cs, b, 1, b_cs, c, ldc, accumulate, ConvBF16());
}

void GemmF32(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
             const float* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, bool accumulate) {
  GemmImpl<float>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate, ConvF32());
}

void GemmF32Skinny(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, const float* b,
                   int64_t b_cs, float* c, int64_t ldc, bool accumulate) {
  GemvT<RowF32>(m, n, k, a, a_rs, b, b_cs, c, ldc, accumulate);
}

void GemmHalfSkinny(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs,
                    const uint16_t* b, int64_t b_cs, float* c, int64_t ldc, bool accumulate) {
  if (in_type == DType::kF16) {
    GemvT<RowF16>(m, n, k, a, a_rs, b, b_cs, c, ldc, accumulate);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  } else if (gemm_detail::bf16_dot_enabled()) {
    GemvTDot(m, n, k, a, a_rs, b, b_cs, c, ldc, accumulate);
#endif
  } else {
    GemvT<RowBF16>(m, n, k, a, a_rs, b, b_cs, c, ldc, accumulate);
  }
}

void GemmHalf(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs,
              int64_t a_cs, const uint16_t* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc,
              bool accumulate) {
  if (in_type == DType::kF16) {
    GemmImpl<uint16_t>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate, ConvF16());
  } else {
    GemmImpl<uint16_t>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate, ConvBF16());
  }
}

void GemmF32Packed(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                   const float* b, int64_t b_rs, int64_t b_cs, const float* packed, int64_t k_total,
                   float* c, int64_t ldc, bool accumulate) {
  GemmImpl<float>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate, ConvF32(), packed,
                  k_total);
}

void GemmHalfPacked(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs,
                    int64_t a_cs, const float* packed, int64_t k_total, float* c, int64_t ldc,
                    bool accumulate) {
  const uint16_t* no_b = nullptr;
  if (in_type == DType::kF16) {
    GemmImpl<uint16_t>(m, n, k, a, a_rs, a_cs, no_b, 0, 0, c, ldc, accumulate, ConvF16(), packed,
                       k_total);
  } else {
    GemmImpl<uint16_t>(m, n, k, a, a_rs, a_cs, no_b, 0, 0, c, ldc, accumulate, ConvBF16(), packed,
                       k_total);
  }
}

void PackBFull(DType dtype, int64_t k, int64_t n, const void* b, int64_t b_rs, int64_t b_cs,
               float* packed) {
  if (k <= 0 || n <= 0) return;
  switch (dtype) {
    case DType::kF16:
      return PackB(k, n, static_cast<const uint16_t*>(b), b_rs, b_cs, packed, ConvF16());
    case DType::kBF16:
      return PackB(k, n, static_cast<const uint16_t*>(b), b_rs, b_cs, packed, ConvBF16());
    default:
      return PackB(k, n, static_cast<const float*>(b), b_rs, b_cs, packed, ConvF32());
  }
}

size_t PackedBFloats(int64_t k, int64_t n) {
  return static_cast<size_t>(std::max<int64_t>(k, 0)) *
         ((std::max<int64_t>(n, 0) + kNR - 1) / kNR) * kNR;
}

GemmTile MicroTile() {
  return {static_cast<int64_t>(kMR), static_cast<int64_t>(kNR)};
}
// 512 columns: every tile packs its own rows x K slice of A (a transpose for row-major
// activations), so wider tiles pack A fewer times (interleaved A/B against 256, one thread:
// 1.03-1.07x at M = 128-1024, equal at M = 512).
GemmTile PreferredTile() {
  return {static_cast<int64_t>(kTileM), 512};
}

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dvm::vm::cpu {

using namespace dvm::ops;  // NOLINT

HWY_EXPORT(GemmF32);
HWY_EXPORT(GemmReadsTransposedBInPlace);
HWY_EXPORT(GemmF32TransposedBInPlace);
HWY_EXPORT(GemmHalfTransposedBInPlace);
HWY_EXPORT(GemmBF16BRows);
HWY_EXPORT(GemmF32Skinny);
HWY_EXPORT(GemmHalfSkinny);
HWY_EXPORT(GemmHalf);
HWY_EXPORT(GemmF32Packed);
HWY_EXPORT(GemmHalfPacked);
HWY_EXPORT(PackBFull);
HWY_EXPORT(PackedBFloats);
HWY_EXPORT(MicroTile);
HWY_EXPORT(PreferredTile);

namespace gemm_detail {

float* scratch(int slot, size_t floats) {
  struct Buffer {
    float* data = nullptr;
    size_t size = 0;
    ~Buffer() { ::operator delete (data, std::align_val_t{64}); }
  };
  thread_local Buffer buffers[4];
  Buffer& buf = buffers[slot];
  if (buf.size < floats) {
    ::operator delete (buf.data, std::align_val_t{64});
    buf.data = nullptr;
    const size_t size = std::max(floats, buf.size * 3 / 2);
    buf.data = static_cast<float*>(::operator new (size * sizeof(float), std::align_val_t{64}));
    buf.size = size;
  }
  return buf.data;
}

KeptX& kept_x() {
  thread_local KeptX kept;
  return kept;
}

namespace {
std::atomic<int> bf16_dot_override{-1};

bool detect_bf16_dot() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (eax & (1u << 5)) != 0 && hwy::SupportedTargets() & HWY_AVX3;  // AVX512_BF16
#else
  return false;
#endif
}
}  // namespace

bool bf16_dot_enabled() {
  static const bool available = base::env().bf16_dot && detect_bf16_dot();
  const int forced = bf16_dot_override.load(std::memory_order_relaxed);
  return forced < 0 ? available : forced != 0 && detect_bf16_dot();
}

}  // namespace gemm_detail

void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
              const float* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmF32)
  (m, n, k < 0 ? 0 : k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
}

bool gemm_trivial(int64_t m, int64_t n, int64_t k, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return true;
  if (k > 0) return false;
  if (!accumulate) {
    for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
  }
  return true;
}

void gemm_f32_skinny(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, const float* b,
                     int64_t b_cs, float* c, int64_t ldc, bool accumulate) {
  if (gemm_trivial(m, n, k, c, ldc, accumulate)) return;
  HWY_DYNAMIC_DISPATCH(GemmF32Skinny)(m, n, k, a, a_rs, b, b_cs, c, ldc, accumulate);
}

void gemm_half_skinny(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                      int64_t a_rs, const uint16_t* b, int64_t b_cs, float* c, int64_t ldc,
                      bool accumulate) {
  if (gemm_trivial(m, n, k, c, ldc, accumulate)) return;
  HWY_DYNAMIC_DISPATCH(GemmHalfSkinny)(in_type, m, n, k, a, a_rs, b, b_cs, c, ldc, accumulate);
}

void gemm_half(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs,
               int64_t a_cs, const uint16_t* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc,
               bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (gemm_half_on_amx(in_type)) {
    return gemm_bf16_amx(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
  }
  HWY_DYNAMIC_DISPATCH(GemmHalf)
  (in_type, m, n, k < 0 ? 0 : k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
}

void set_bf16_dot_for_testing(int enabled) {
  gemm_detail::bf16_dot_override.store(enabled, std::memory_order_relaxed);
}

bool gemm_bf16_dot_enabled() {
  return gemm_detail::bf16_dot_enabled();
}

namespace {
// What both bf16 pair paths need of the product: bf16 off AMX with the dot product enabled,
// enough rows, and x's rows readable as pairs along K (an even K and row stride).
bool bf16_pairs_fit(DType in_type, int64_t m_total, int64_t k, int64_t a_rs, int64_t a_cs) {
  return in_type == DType::kBF16 && m_total >= kBf16DotMinRows && k >= 2 && k % 2 == 0 &&
         a_cs == 1 && a_rs % 2 == 0 && !gemm_half_on_amx(in_type) &&
         gemm_detail::bf16_dot_enabled();
}
}  // namespace

bool gemm_bf16_dot_rows_fits(DType in_type, int64_t m_total, int64_t k, int64_t a_rs, int64_t a_cs,
                             int64_t b_cs) {
  return b_cs == 1 && bf16_pairs_fit(in_type, m_total, k, a_rs, a_cs);
}

void gemm_bf16_b_rows(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs,
                      int64_t a_cs, const uint16_t* b, int64_t b_rs, float* c, int64_t ldc,
                      bool accumulate) {
  if (m <= 0 || n <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmBF16BRows)
  (m, n, k < 0 ? 0 : k, a, a_rs, a_cs, b, b_rs, c, ldc, accumulate);
}

bool gemm_bf16_dot_fits(DType in_type, int64_t m_total, int64_t k, int64_t a_rs, int64_t a_cs,
                        int64_t b_rs, int64_t b_cs) {
  return b_rs == 1 && b_cs % 2 == 0 && bf16_pairs_fit(in_type, m_total, k, a_rs, a_cs);
}

bool gemm_half_on_amx(DType in_type) {
  return in_type == DType::kBF16 && amx_bf16_enabled();
}

size_t packed_b_floats(int64_t k, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(PackedBFloats)(k, n);
}

void pack_b(DType dtype, int64_t k, int64_t n, const void* b, int64_t b_rs, int64_t b_cs,
            float* packed) {
  HWY_DYNAMIC_DISPATCH(PackBFull)(dtype, k, n, b, b_rs, b_cs, packed);
}

void gemm_f32_packed(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                     const float* b, int64_t b_rs, int64_t b_cs, PackedB packed, float* c,
                     int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmF32Packed)
  (m, n, k < 0 ? 0 : k, a, a_rs, a_cs, b, b_rs, b_cs, packed.panels, packed.k_total, c, ldc,
   accumulate);
}

void gemm_half_packed(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                      int64_t a_rs, int64_t a_cs, PackedB packed, float* c, int64_t ldc,
                      bool accumulate) {
  if (m <= 0 || n <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmHalfPacked)
  (in_type, m, n, k < 0 ? 0 : k, a, a_rs, a_cs, packed.panels, packed.k_total, c, ldc, accumulate);
}

bool gemm_f32_reads_b_in_place(int64_t m_total, int64_t k, int64_t b_rs, int64_t b_cs) {
  return HWY_DYNAMIC_DISPATCH(GemmReadsTransposedBInPlace)(m_total, k, b_rs, b_cs);
}

void gemm_f32_bt_in_place(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs,
                          int64_t a_cs, const float* b, int64_t b_cs, float* c, int64_t ldc,
                          bool accumulate, uint64_t a_token) {
  HWY_DYNAMIC_DISPATCH(GemmF32TransposedBInPlace)
  (m, n, k, a, a_rs, a_cs, b, b_cs, c, ldc, accumulate, a_token);
}

void gemm_half_bt_in_place(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                           int64_t a_rs, int64_t a_cs, const uint16_t* b, int64_t b_cs, float* c,
                           int64_t ldc, bool accumulate, uint64_t a_token) {
  if (m <= 0 || n <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmHalfTransposedBInPlace)
  (in_type, m, n, k < 0 ? 0 : k, a, a_rs, a_cs, b, b_cs, c, ldc, accumulate, a_token);
}

GemmTile gemm_preferred_tile() {
  return HWY_DYNAMIC_DISPATCH(PreferredTile)();
}
GemmTile gemm_micro_tile() {
  return HWY_DYNAMIC_DISPATCH(MicroTile)();
}

}  // namespace dvm::vm::cpu
#endif  // HWY_ONCE
