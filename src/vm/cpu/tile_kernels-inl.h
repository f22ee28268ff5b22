// Per-target helpers of the CPU tile kernels: tails, the row drivers (Map1/2/3 over blocks of
// rows), the vector math and the prototypes of the exported kernels. Included by each kernel
// file (tile_kernels_*.cc) and by the dispatch tables (tile_kernels.cc) once per Highway target,
// hence the toggled guard instead of a plain include guard.
#if defined(DVM_VM_CPU_TILE_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)  // NOLINT
#ifdef DVM_VM_CPU_TILE_KERNELS_INL_H_
#undef DVM_VM_CPU_TILE_KERNELS_INL_H_
#else
#define DVM_VM_CPU_TILE_KERNELS_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

// clang-format off
#include <hwy/highway.h>
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
// clang-format on

#include "ops/scalar_ops.h"
#include "vm/cpu/tile_kernels.h"

namespace dvm::vm::cpu {
// set_stream_stores' flag, read once per driver call. (Not initial-exec: the Python module is
// loaded with dlopen after torch, whose libraries leave no static TLS space for it.)
extern constinit thread_local bool g_stream_stores;
extern constinit thread_local PrefetchQueue g_prefetch;

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

// A driver call's view of g_prefetch (thread-locals are read once per call): Step() prefetches
// the queue's next line, if any; the destructor writes back what is left. Only the drivers'
// prefetching variants (kAhead, chosen per call by Prefetching()) hold one: the loops of
// launches that neither stream nor queue stay as tight as without it (a branch in them cost
// 4K-64K launches 10-40%).
class PrefetchDrain {
 public:
  explicit PrefetchDrain(bool on) : on_(on) {
    if (on) q_ = g_prefetch;
  }
  ~PrefetchDrain() {
    if (on_) g_prefetch = q_;  // an exhausted queue too, or the next call would redo it
  }
  PrefetchDrain(const PrefetchDrain&) = delete;
  PrefetchDrain& operator=(const PrefetchDrain&) = delete;
  // Two lines per loop iteration: at one, a block's later passes covered only part of the
  // next block's rows (add_layernorm over 768 columns: ~660 iterations for ~1060 lines), and
  // that block's first pass waited on DRAM for the rest. At 16M elements, 1 thread, against
  // the plain loops: rmsnorm_c4096 1.45-1.61 -> 1.79-1.86x, rmsnorm_c64 1.08-1.14 ->
  // 1.16-1.34x, add_layernorm_c768 1.04-1.09 -> 1.14-1.21x; three lines gained no more.
  void Step() {
    for (int k = 0; k < 2; ++k) {
      if (q_.first == q_.spans) return;
      const char*& p = q_.next[q_.first];
      __builtin_prefetch(p, 0, 2);  // prefetcht1: to L2, not L1, where this block's rows live
      p += 64;
      if (p >= q_.end[q_.first] && ++q_.first == q_.spans) q_.first = q_.spans = 0;
    }
  }

 private:
  bool on_;
  PrefetchQueue q_;
};

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

// Does a row starting at `row` take streamed stores? set_stream_stores is on (`nt_ok`, read
// once per call) and the row starts on a vector boundary, so every full vector of it is
// aligned.
template <class D>
HWY_INLINE bool StreamRow(D d, bool nt_ok, const hn::TFromD<D>* row) {
  return nt_ok && reinterpret_cast<uintptr_t>(row) % (hn::Lanes(d) * sizeof(*row)) == 0;
}

// Streamed launches (set_stream_stores: the data exceed the last-level cache) read their
// sources from DRAM, and the hardware prefetchers alone left compute-heavy rows waiting on
// their loads: a gelu over 16M elements took its compute time plus its memory time, not the
// larger of the two. Their contiguous sources are prefetched this far ahead (that gelu:
// 13.4-16.6 -> 10.0-10.4 ms at 2 KiB, 10.4-11.3 at 4 KiB, 11.5 at 16 KiB).
constexpr int64_t kPrefetchAheadBytes = 2048;
// Only within the source's run: past a row's end lies another tile's data when rows are
// strided (a 64-wide tile of 1024-wide rows fetched a useless line for every line it read:
// transpose_add at 16M ran 1.2x slower); rows back to back (row stride = row length) run on.
template <typename T>
constexpr int64_t kPrefetchAhead = kPrefetchAheadBytes / static_cast<int64_t>(sizeof(T));
// Elements from the start of row r of a source with row stride `stride` to the end of its
// contiguous run, in a block of `rows` rows of n elements.
HWY_INLINE int64_t RunLength(int64_t stride, int64_t r, int64_t rows, int64_t n) {
  return stride == n ? (rows - r) * n : n;
}
// Every cache line of the `n` elements at row + i, that far ahead, when still in the run of
// `len` elements from row.
template <typename T>
HWY_INLINE void PrefetchAhead(const T* row, int64_t i, int64_t n, int64_t len) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  if (i + kPrefetchAhead<T> + n > len) return;
  for (int64_t k = 0; k < n; k += kLine) hwy::Prefetch(row + i + kPrefetchAhead<T> + k);
}

// Rows further apart than their length (a permuted or sliced source: the heads of a
// [S, H, D] tensor read as [H, S, D]; a transposed tile's columns) end their runs within a
// few lines, so PrefetchAhead never fires, and the hardware prefetchers, which follow a
// stream within a page, meet a new page every row or two. Such a source's row `r + k` is
// fetched whole while row r is computed, k rows this many bytes ahead (permute_heads at 16M
// elements, 1 thread, against its plain loop: 0.9-1.2x without, 1.2-1.3x at 2 KiB, 1.6-1.7x
// at 8 KiB, 1.3-1.5x at 16 KiB, 1.1-1.2x at 32 KiB).
constexpr int64_t kPrefetchRowsAheadBytes = 8192;
template <typename T>
HWY_INLINE void PrefetchRowAhead(const T* base, int64_t stride, int64_t r, int64_t rows,
                                 int64_t n) {
  const int64_t row_bytes = n * static_cast<int64_t>(sizeof(T));
  if (n <= 0 || stride == n || stride == 0 || row_bytes >= kPrefetchAheadBytes) return;
  const int64_t ahead = r + (kPrefetchRowsAheadBytes + row_bytes - 1) / row_bytes;
  if (ahead >= rows) return;
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  const T* row = base + ahead * stride;
  for (int64_t k = 0; k < n; k += kLine) hwy::Prefetch(row + k);
}

// Does this driver call prefetch (its launch streams, or a next block is queued)?
HWY_INLINE bool Prefetching() {
  return g_stream_stores || g_prefetch.spans != 0;
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

// The blocks of a tile (Rows::outer) as few blocks as may be: a block of one row is a row of
// the outer loop, and blocks that continue each other's rows in every operand (outer stride =
// rows x row stride, `sources` sources) are one block of outer x rows rows. A loop of chains
// over short rows (a permute's heads, decode's single rows) then runs one block, not one
// kernel call per trip (permute_heads at 4K elements: 12 calls of 5 rows). Elementwise maps
// only: every element is computed alone, so any grouping gives the same bits.
HWY_INLINE Rows MergeOuter(const Rows& rs, int sources) {
  if (rs.outer <= 1) return rs;
  if (rs.rows == 1) return Rows{rs.outer, rs.od, rs.oa, rs.ob, rs.oc};
  const int64_t row[4] = {rs.d, rs.a, rs.b, rs.c};
  const int64_t outer[4] = {rs.od, rs.oa, rs.ob, rs.oc};
  for (int k = 0; k <= sources; ++k)
    if (outer[k] != rs.rows * row[k]) return rs;
  return Rows{rs.rows * rs.outer, rs.d, rs.a, rs.b, rs.c};
}

template <bool kA, bool kAhead, class DO, class DA, class F>
HWY_INLINE void Map1Grid(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                         const hn::TFromD<DA>* a, int64_t n, F f) {
  using TO = hn::TFromD<DO>;
  const int64_t N = static_cast<int64_t>(hn::Lanes(da));
  const bool ahead = kAhead && g_stream_stores;
  PrefetchDrain queue(kAhead);
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
    if (ahead) PrefetchRowAhead(a, rs.a, r, rs.rows, n);
    for (; i + 2 * N <= n; i += 2 * N) {
      if constexpr (kAhead) {
        if (ahead) PrefetchAhead(ar, i, 2 * N, RunLength(rs.a, r, rs.rows, n));
        queue.Step();
      }
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
template <bool kAhead, class DO, class DA, class F>
HWY_INLINE void Map1Block(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                          const hn::TFromD<DA>* a, int ainc, int64_t n, F f) {
  int inc[1] = {ainc};
  Rows g;
  FlattenRows(rs, {rs.a}, inc, &g, &n);
  if (inc[0]) {
    Map1Grid<true, kAhead>(dout, da, g, dst, a, n, f);
  } else {
    Map1Grid<false, false>(dout, da, g, dst, a, n, f);
  }
}
// Map1 over the blocks of a tile (Rows::outer).
template <bool kAhead, class DO, class DA, class F>
HWY_INLINE void Map1RowsImpl(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                             const hn::TFromD<DA>* a, int ainc, int64_t n, F f) {
  if (n <= 0 || rs.rows <= 0) return;
  const Rows m = MergeOuter(rs, 1);
  for (int64_t k = 0; k < m.outer; ++k)
    Map1Block<kAhead>(dout, da, m, dst + k * m.od, a + k * m.oa, ainc, n, f);
}
// The prefetching variants, kept out of line: inlined, their code made the compiler stop
// inlining the plain drivers into their kernels (a call per kernel call: 4K launches 16% more
// instructions).
template <class DO, class DA, class F>
HWY_NOINLINE void Map1RowsAhead(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                                const hn::TFromD<DA>* a, int ainc, int64_t n, F f) {
  Map1RowsImpl<true>(dout, da, rs, dst, a, ainc, n, f);
}
template <class DO, class DA, class F>
HWY_INLINE void Map1Rows(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                         const hn::TFromD<DA>* a, int ainc, int64_t n, F f) {
  if (Prefetching()) return Map1RowsAhead(dout, da, rs, dst, a, ainc, n, f);
  Map1RowsImpl<false>(dout, da, rs, dst, a, ainc, n, f);
}

template <bool kA, bool kB, bool kAhead, class DO, class DA, class F>
HWY_INLINE void Map2Grid(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                         const hn::TFromD<DA>* a, const hn::TFromD<DA>* b, int64_t n, F f) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(da));
  const bool nt_ok = g_stream_stores;
  PrefetchDrain queue(kAhead);
  for (int64_t r = 0; r < rs.rows; ++r) {
    hn::TFromD<DO>* dr = dst + r * rs.d;
    const hn::TFromD<DA>* ar = a + r * rs.a;
    const hn::TFromD<DA>* br = b + r * rs.b;
    const auto va = kA ? hn::Zero(da) : hn::Set(da, ar[0]);
    const auto vb = kB ? hn::Zero(da) : hn::Set(da, br[0]);
    int64_t i = 0;
    const bool nt = StreamRow(dout, nt_ok, dr);
    if constexpr (kAhead) {
      if (nt_ok && kA) PrefetchRowAhead(a, rs.a, r, rs.rows, n);
      if (nt_ok && kB) PrefetchRowAhead(b, rs.b, r, rs.rows, n);
    }
    for (; i + 2 * N <= n; i += 2 * N) {  // two vectors: the next loads overlap this math
      if constexpr (kAhead) {
        if (nt_ok) {
          if (kA) PrefetchAhead(ar, i, 2 * N, RunLength(rs.a, r, rs.rows, n));
          if (kB) PrefetchAhead(br, i, 2 * N, RunLength(rs.b, r, rs.rows, n));
        }
        queue.Step();
      }
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
template <bool kAhead, class DO, class DA, class F>
HWY_INLINE void Map2Block(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                          const hn::TFromD<DA>* a, int ainc, const hn::TFromD<DA>* b, int binc,
                          int64_t n, F f) {
  using TO = hn::TFromD<DO>;
  int inc[2] = {ainc, binc};
  Rows g;
  FlattenRows(rs, {rs.a, rs.b}, inc, &g, &n);
  const int fa = inc[0], fb = inc[1];
  if (fa && fb) {
    Map2Grid<true, true, kAhead>(dout, da, g, dst, a, b, n, f);
  } else if (fa) {
    Map2Grid<true, false, kAhead>(dout, da, g, dst, a, b, n, f);
  } else if (fb) {
    Map2Grid<false, true, kAhead>(dout, da, g, dst, a, b, n, f);
  } else {  // both broadcast: one evaluation per row
    HWY_ALIGN TO out[kMaxLanes];
    for (int64_t r = 0; r < g.rows; ++r) {
      hn::Store(f(hn::Set(da, a[r * g.a]), hn::Set(da, b[r * g.b])), dout, out);
      FillRow(dst + r * g.d, out[0], n);
    }
  }
}
// Map2 over the blocks of a tile (Rows::outer).
template <bool kAhead, class DO, class DA, class F>
HWY_INLINE void Map2RowsImpl(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                             const hn::TFromD<DA>* a, int ainc, const hn::TFromD<DA>* b, int binc,
                             int64_t n, F f) {
  if (n <= 0 || rs.rows <= 0) return;
  const Rows m = MergeOuter(rs, 2);
  for (int64_t k = 0; k < m.outer; ++k)
    Map2Block<kAhead>(dout, da, m, dst + k * m.od, a + k * m.oa, ainc, b + k * m.ob, binc, n, f);
}

template <class DO, class DA, class F>
HWY_NOINLINE void Map2RowsAhead(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                                const hn::TFromD<DA>* a, int ainc, const hn::TFromD<DA>* b,
                                int binc, int64_t n, F f) {
  Map2RowsImpl<true>(dout, da, rs, dst, a, ainc, b, binc, n, f);
}
template <class DO, class DA, class F>
HWY_INLINE void Map2Rows(DO dout, DA da, const Rows& rs, hn::TFromD<DO>* dst,
                         const hn::TFromD<DA>* a, int ainc, const hn::TFromD<DA>* b, int binc,
                         int64_t n, F f) {
  if (Prefetching()) return Map2RowsAhead(dout, da, rs, dst, a, ainc, b, binc, n, f);
  Map2RowsImpl<false>(dout, da, rs, dst, a, ainc, b, binc, n, f);
}

// Map3 over a block of rows with a contiguous and b, c contiguous (kB, kC) or broadcast.
template <bool kB, bool kC, bool kAhead, class D, class F>
HWY_INLINE void Map3Grid(D d, const Rows& rs, hn::TFromD<D>* dst, const hn::TFromD<D>* a,
                         const hn::TFromD<D>* b, const hn::TFromD<D>* c, int64_t n, F f) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const bool nt_ok = g_stream_stores;
  PrefetchDrain queue(kAhead);
  for (int64_t r = 0; r < rs.rows; ++r) {
    hn::TFromD<D>* dr = dst + r * rs.d;
    const hn::TFromD<D>*ar = a + r * rs.a, *br = b + r * rs.b, *cr = c + r * rs.c;
    const auto vb = kB ? hn::Zero(d) : hn::Set(d, br[0]);
    const auto vc = kC ? hn::Zero(d) : hn::Set(d, cr[0]);
    const auto lb = [&](int64_t i) { return kB ? hn::LoadU(d, br + i) : vb; };
    const auto lc = [&](int64_t i) { return kC ? hn::LoadU(d, cr + i) : vc; };
    int64_t i = 0;
    const bool nt = StreamRow(d, nt_ok, dr);
    if constexpr (kAhead) {
      if (nt_ok) {
        PrefetchRowAhead(a, rs.a, r, rs.rows, n);
        if (kB) PrefetchRowAhead(b, rs.b, r, rs.rows, n);
        if (kC) PrefetchRowAhead(c, rs.c, r, rs.rows, n);
      }
    }
    for (; i + 2 * N <= n; i += 2 * N) {
      if constexpr (kAhead) {
        if (nt_ok) {
          PrefetchAhead(ar, i, 2 * N, RunLength(rs.a, r, rs.rows, n));
          if (kB) PrefetchAhead(br, i, 2 * N, RunLength(rs.b, r, rs.rows, n));
          if (kC) PrefetchAhead(cr, i, 2 * N, RunLength(rs.c, r, rs.rows, n));
        }
        queue.Step();
      }
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
template <bool kAhead, class D, class F>
HWY_INLINE void Map3Block(D d, const Rows& rs, hn::TFromD<D>* dst, const hn::TFromD<D>* a, int ainc,
                          const hn::TFromD<D>* b, int binc, const hn::TFromD<D>* c, int cinc,
                          int64_t n, F f) {
  using T = hn::TFromD<D>;
  int inc[3] = {ainc, binc, cinc};
  Rows g;
  FlattenRows(rs, {rs.a, rs.b, rs.c}, inc, &g, &n);
  const int fa = inc[0], fb = inc[1], fc = inc[2];
  if (fa && fb && fc) return Map3Grid<true, true, kAhead>(d, g, dst, a, b, c, n, f);
  if (fa && fb) return Map3Grid<true, false, kAhead>(d, g, dst, a, b, c, n, f);
  if (fa && fc) return Map3Grid<false, true, kAhead>(d, g, dst, a, b, c, n, f);
  if (fa) return Map3Grid<false, false, kAhead>(d, g, dst, a, b, c, n, f);
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
// Map3 over the blocks of a tile (Rows::outer).
template <bool kAhead, class D, class F>
HWY_INLINE void Map3RowsImpl(D d, const Rows& rs, hn::TFromD<D>* dst, const hn::TFromD<D>* a,
                             int ainc, const hn::TFromD<D>* b, int binc, const hn::TFromD<D>* c,
                             int cinc, int64_t n, F f) {
  if (n <= 0 || rs.rows <= 0) return;
  const Rows m = MergeOuter(rs, 3);
  for (int64_t k = 0; k < m.outer; ++k)
    Map3Block<kAhead>(d, m, dst + k * m.od, a + k * m.oa, ainc, b + k * m.ob, binc, c + k * m.oc,
                      cinc, n, f);
}

template <class D, class F>
HWY_NOINLINE void Map3RowsAhead(D d, const Rows& rs, hn::TFromD<D>* dst, const hn::TFromD<D>* a,
                                int ainc, const hn::TFromD<D>* b, int binc, const hn::TFromD<D>* c,
                                int cinc, int64_t n, F f) {
  Map3RowsImpl<true>(d, rs, dst, a, ainc, b, binc, c, cinc, n, f);
}
template <class D, class F>
HWY_INLINE void Map3Rows(D d, const Rows& rs, hn::TFromD<D>* dst, const hn::TFromD<D>* a, int ainc,
                         const hn::TFromD<D>* b, int binc, const hn::TFromD<D>* c, int cinc,
                         int64_t n, F f) {
  if (Prefetching()) return Map3RowsAhead(d, rs, dst, a, ainc, b, binc, c, cinc, n, f);
  Map3RowsImpl<false>(d, rs, dst, a, ainc, b, binc, c, cinc, n, f);
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
// 2^n * e^r for |r| <= ln2/2 (plus a little) and integral n in [-152, 128]: the Cephes
// polynomial 1 + r + r^2 P(r), P evaluated by Estrin's scheme (two short chains instead of
// one of five dependent FMAs: the activations that call exp are latency-bound, not
// throughput-bound), then the scaling, rounded once. Lanes in `zero` give +0 without
// scaling (see ExpCore).
HWY_INLINE VF ExpOfReduced(DF d, VF n, VF r, hn::Mask<DF> zero) {
  const VF r2 = hn::Mul(r, r);
  const VF p01 = hn::MulAdd(hn::Set(d, 1.6666665459e-1f), r, hn::Set(d, 5.0000001201e-1f));
  const VF p23 = hn::MulAdd(hn::Set(d, 8.3334519073e-3f), r, hn::Set(d, 4.1665795894e-2f));
  const VF p45 = hn::MulAdd(hn::Set(d, 1.9875691500e-4f), r, hn::Set(d, 1.3981999507e-3f));
  const VF p = hn::MulAdd(hn::MulAdd(p45, r2, p23), r2, p01);
  const VF er = hn::MulAdd(p, r2, hn::Add(r, hn::Set(d, 1.0f)));
#if DVM_EXP_KEEPS_NAN
  return VF{_mm512_maskz_scalef_ps(static_cast<__mmask16>(~zero.raw), er.raw, n.raw)};
#else
  const hn::RebindToSigned<DF> di;
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  // There ConvertTo is a C++ cast, undefined for NaN (an input's NaN lane reaches n): such a
  // lane scales by 2^0 and stays NaN through `er`, as the SIMD conversions' integer leaves it.
  const auto ni = hn::ConvertTo(di, hn::IfThenZeroElse(hn::Or(zero, hn::IsNaN(n)), n));
#else
  const auto ni = hn::ConvertTo(di, hn::IfThenZeroElse(zero, n));
#endif
  const auto n1 = hn::ShiftRight<1>(ni);  // arithmetic: floor(n / 2)
  const auto bias = hn::Set(di, 127);
  const VF s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const VF s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::Sub(ni, n1), bias)));
  return hn::IfThenZeroElse(zero, hn::Mul(hn::Mul(er, s1), s2));
#endif
}

// ln 2 in two parts: n * kLn2Hi is exact for |n| <= 2^8.
constexpr float kLn2Hi = 0.693145751953125f;
constexpr float kLn2Lo = 1.428606765330187045e-06f;

// Lanes below -104 are exactly 0 and are zeroed rather than scaled there: a result that
// underflows costs a microcode assist (~150 cycles an instruction on Intel cores without
// flush-to-zero), and masked attention rows (finfo.min, -inf) send every row through it
// (a masked softmax ran 1.6x slower). The other lanes compute from the same clamped x.
HWY_INLINE VF ExpCore(DF d, VF x) {
  const auto zero = hn::Lt(x, hn::Set(d, -104.0f));
#if DVM_EXP_KEEPS_NAN
  const VF xc{_mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x.raw))};
#else
  const VF xc = hn::Min(hn::Max(x, hn::Set(d, -104.0f)), hn::Set(d, 89.0f));
#endif
  const VF n = hn::Round(hn::Mul(xc, hn::Set(d, 1.44269504088896341f)));
  VF r = hn::NegMulAdd(n, hn::Set(d, kLn2Hi), xc);
  r = hn::NegMulAdd(n, hn::Set(d, kLn2Lo), r);
  return ExpOfReduced(d, n, r, zero);
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

// tanh(x): x + x^3 P(x^2) for |x| < 0.625 (P degree 5, fitted to the relative error of the
// result), and (1 - e) / (1 + e), e = exp(-2|x|) in (0, 0.29], beyond; x's sign last. e never
// overflows (inf gives e = 0, so +-1) and 1 - e cancels at most 0.29 of itself. One exp and
// one division like sigmoid, both branches for every lane (no blends by data): Highway's
// Tanh, an expm1 and a division, ran 1.25x the time of this (AVX-512, data in L1).
HWY_INLINE VF TanhF(DF d, VF x) {
  const VF one = hn::Set(d, 1.0f);
  const VF a = hn::Abs(x);
  const VF e = ExpCore(d, hn::Mul(a, hn::Set(d, -2.0f)));
  const VF big = hn::Div(hn::Sub(one, e), hn::Add(one, e));
  const VF s = hn::Mul(x, x);
  const VF s2 = hn::Mul(s, s);
  const VF p01 = hn::MulAdd(hn::Set(d, 1.333320141e-01f), s, hn::Set(d, -3.333333135e-01f));
  const VF p23 = hn::MulAdd(hn::Set(d, 2.169829607e-02f), s, hn::Set(d, -5.394627154e-02f));
  const VF p45 = hn::MulAdd(hn::Set(d, 2.138384152e-03f), s, hn::Set(d, -8.171978407e-03f));
  const VF p = hn::MulAdd(hn::MulAdd(p45, s2, p23), s2, p01);
  const VF small = hn::MulAdd(hn::Mul(a, s), p, a);  // of |x|: -0 keeps its sign below
  const VF r = hn::CopySignToAbs(hn::IfThenElse(hn::Lt(a, hn::Set(d, 0.625f)), small, big), x);
  return DVM_EXP_KEEPS_NAN ? r : KeepNaN(x, r);
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

// gelu(x) = x/2 * (1 + erf(x/sqrt2)) = x/2 * (2 - erfc(z)) for x >= 0 and x/2 * erfc(z) for
// x < 0, z = |x|/sqrt2: the negative tail keeps its relative accuracy (no cancellation in
// 1 + erf) and there is no branch to evaluate twice.
// erfc(z) = e^(-z^2) * erfcx(z), erfcx(z) = t Q(t) with t = 1 / (1 + 0.55 z) in (0.15, 1]
// (Q of degree 9, fitted to the relative error of erfcx in double: 0.11 ulp before f32
// rounding). The two factors are independent chains that the core overlaps (one exp and one
// division deep rather than exp after the polynomial, which ran latency-bound at 1.7x the
// time), and both polynomials go by Estrin's scheme.
// e^(-z^2) = e^(-x^2/2) takes x^2 as hi + lo (an FMA) into exp's own reduction: its
// argument's rounding would otherwise become a relative error growing like x^2 in the tail.
// From |x| = 12.9 on, e^(-x^2/2) is taken as 0: x < 0 gives -0 and x >= 0 gives x (inf
// included), as the spec; -inf gives NaN (-inf * 0), as the spec. Computing it there would
// make subnormals (e^(-x^2/2) < 2^-126 past |x| = 13.2, the result past ~13.4), and every
// instruction that makes or reads one takes a microcode assist (~150 cycles) on cores without
// flush-to-zero: gelu was 27% of gelu(x @ W + b), 6.5 ns per element, at pre-activations ~9 wide.
// The result dropped is below 3e-37 in magnitude (the asserted floor is absolute below 2^-24).
// |x| is clamped at 14.5 for the rest (t stays in range).
HWY_INLINE VF GeluErfF(DF d, VF x) {
  const VF a = hn::Min(hn::Abs(x), hn::Set(d, 14.5f));
  const VF den = hn::MulAdd(a, hn::Set(d, static_cast<float>(0.55 * kSqrt1_2)), hn::Set(d, 1.0f));
  const VF t = hn::Div(hn::Set(d, 1.0f), den);
  const VF t2 = hn::Mul(t, t);
  const VF t4 = hn::Mul(t2, t2);
  const VF q01 = hn::MulAdd(hn::Set(d, 3.106635809e-01f), t, hn::Set(d, 3.102920949e-01f));
  const VF q23 = hn::MulAdd(hn::Set(d, 2.020525038e-01f), t, hn::Set(d, 2.588196397e-01f));
  const VF q45 = hn::MulAdd(hn::Set(d, 3.639741838e-01f), t, hn::Set(d, -9.500081837e-02f));
  const VF q67 = hn::MulAdd(hn::Set(d, 7.812601924e-01f), t, hn::Set(d, -8.534466028e-01f));
  const VF q89 = hn::MulAdd(hn::Set(d, 5.804845691e-02f), t, hn::Set(d, -3.366632164e-01f));
  const VF q0_3 = hn::MulAdd(q23, t2, q01);
  const VF q4_7 = hn::MulAdd(q67, t2, q45);
  const VF q = hn::MulAdd(hn::MulAdd(q89, t4, q4_7), t4, q0_3);
  const VF erfcx = hn::Mul(t, q);

  const VF x2 = hn::Mul(a, a);
  const VF x2_lo = hn::MulSub(a, a, x2);  // a^2 = x2 + x2_lo exactly (an FMA)
  const VF h = hn::Mul(x2, hn::Set(d, -0.5f));
  const VF n = hn::Round(hn::Mul(h, hn::Set(d, 1.44269504088896341f)));
  VF r = hn::NegMulAdd(n, hn::Set(d, kLn2Hi), h);
  r = hn::NegMulAdd(n, hn::Set(d, kLn2Lo), r);
  r = hn::MulAdd(x2_lo, hn::Set(d, -0.5f), r);
  const VF erfc = hn::Mul(erfcx, ExpOfReduced(d, n, r, hn::Ge(a, hn::Set(d, 12.9f))));

  const VF factor = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), erfc, hn::Sub(hn::Set(d, 2.0f), erfc));
  return KeepNaN(x, hn::Mul(hn::Mul(hn::Set(d, 0.5f), x), factor));
}

// gelu_tanh(x) = x/2 * (1 + tanh(y)) = x * sigmoid(2y), y = sqrt(2/pi) * (x + 0.044715 x^3).
// Below 2y = -86 (x < -9.93) sigmoid(2y) is taken as +0, so x < 0 gives -0, as the spec for
// x -> -inf: computing it would make subnormals there (x in [-10.7, -10.0]), each a microcode
// assist (see GeluErfF). The result dropped is below 5e-37 in magnitude.
HWY_INLINE VF GeluTanhF(DF d, VF x) {
  const VF x3 = hn::Mul(hn::Mul(x, x), x);
  const VF y2 = hn::Mul(hn::MulAdd(x3, hn::Set(d, 0.044715f), x),
                        hn::Set(d, static_cast<float>(2.0 * kSqrt2OverPi)));
  const VF lo = hn::Set(d, -86.0f);
  const VF s = SigmoidF(d, hn::Max(y2, lo));  // NaN y2 (NaN x) gives NaN through x below
  return hn::Mul(x, hn::IfThenZeroElse(hn::Lt(y2, lo), s));
}

HWY_INLINE VF SignF(DF d, VF x) {
  const VF zero = hn::Zero(d);
  const VF r = hn::IfThenElse(hn::Gt(x, zero), hn::Set(d, 1.0f), zero);
  return hn::IfThenElse(hn::Lt(x, zero), hn::Set(d, -1.0f), r);  // NaN: 0, as the spec
}

// A 3-D block (rs.outer > 1) as `outer` 2-D calls of `kernel`, each operand moved by its outer
// stride; returns false for a 2-D block.
template <class K>
HWY_INLINE bool SplitOuter(const Rows& rs, const K& kernel) {
  if (rs.outer <= 1) return false;
  Rows one{rs.rows, rs.d, rs.a, rs.b, rs.c};
  for (int64_t k = 0; k < rs.outer; ++k) kernel(one, k * rs.od, k * rs.oa, k * rs.ob, k * rs.oc);
  return true;
}

HWY_INLINE VI MaskToI32(DF d, hn::Mask<DF> m) {
  const DI di;
  return hn::And(hn::BitCast(di, hn::VecFromMask(d, m)), hn::Set(di, 1));
}

// Calls run(f) with the vector op f of add, sub or mul (BinaryF32's commonest ops, and the
// maps that pair with a row reduction); false, run not called, for other ops.
template <class Run>
HWY_INLINE bool WithAddSubMul(BinaryOp op, const Run& run) {
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

// Calls run(f) with the vector math f of `op` if it is one of the ops that combine with a
// neighbour in one kernel (the common activations, fused_mul_supported); false otherwise.
// One list for the pre-op kernels and the fused pairs.
template <class Run>
HWY_INLINE bool WithActivation(DF d, UnaryOp op, const Run& run) {
  switch (op) {
    case UnaryOp::kNeg:
      return run([](VF x) { return hn::Neg(x); }), true;
    case UnaryOp::kExp:
      return run([d](VF x) DVM_INL { return ExpF(d, x); }), true;
    case UnaryOp::kTanh:
      return run([d](VF x) DVM_INL { return TanhF(d, x); }), true;
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

// f32 lanes -> bf16 storage bits as ops::f32_to_bf16_bits: round to nearest even, NaN kept
// quiet. (Highway 1.0's DemoteTo to bf16 truncates, so it is done with integer ops.)
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> BF16Bits(DF d, VF v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), lsb)));
  // |x| bits > inf bits: NaN (both sides non-negative, so a signed compare is exact).
  const auto is_nan =
      hn::Gt(hn::BitCast(di, hn::And(u, hn::Set(du, 0x7FFFFFFFu))), hn::Set(di, 0x7F800000));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  const auto r = hn::IfThenElse(hn::RebindMask(du, is_nan), quiet, rounded);
  (void)d;
  return hn::DemoteTo(du16, hn::BitCast(di, r));
}

// ---- the exported kernels (HWY_EXPORT in tile_kernels.cc), defined in tile_kernels_*.cc ----
void UnaryF32(UnaryOp op, const Rows& rs, float* dst, const float* a, int ainc, int64_t n);
void FusedMulAddPairF32(const MulAddArgs& x, const MulAddArgs& y, int64_t n);
void UnaryPreF32(UnaryOp op, int pre, const Rows& rs, float* dst, const float* a, int ainc,
                 const float* b, int binc, int64_t n);
void PredicateF32(UnaryOp op, int32_t* dst, const float* a, int ainc, int64_t n);
void BinaryF32(BinaryOp op, const Rows& rs, float* dst, const float* a, int ainc, const float* b,
               int binc, int64_t n);
void CompareF32(BinaryOp op, int32_t* dst, const float* a, int ainc, const float* b, int binc,
                int64_t n);
void Select32(uint32_t* dst, const int32_t* cond, int cinc, const uint32_t* a, int ainc,
              const uint32_t* b, int binc, int64_t n);
void FmaF32(const Rows& rs, float* dst, const float* a, int ainc, const float* b, int binc,
            const float* c, int cinc, int64_t n);
void FusedMulF32(int kind, UnaryOp op, int pre, const Rows& rs, float* dst, const float* a,
                 int ainc, const float* b, int binc, const float* c, int cinc, int64_t n);
void FusedMulAddF32(bool negate, const Rows& rs, float* dst, const float* a, int ainc,
                    const float* b, int binc, const float* p, int pinc, const float* q, int qinc,
                    int64_t n);
void FusedMulFmaF32(const Rows& rs, float* dst, const float* a, int ainc, const float* b, int binc,
                    const float* c, int cinc, const float* e, int einc, int64_t n);
void ReduceRowF32(ReduceOp op, const Rows& rs, float* acc, const float* a, int ainc, int64_t n);
void DotRowF32(const Rows& rs, float* acc, const float* a, int ainc, const float* b, int binc,
               int64_t n);
void TransposeF32(float* dst, int64_t drs, const float* src, int64_t scs, int64_t rows,
                  int64_t cols, bool from_dram);
bool MapReduceF32(int kind, int op, int pre, int red, const Rows& rs, float* dst, const float* a,
                  int ainc, const float* b, int binc, const float* c, int cinc, int64_t n,
                  float* out);
void AccumulateF32(ReduceOp op, const Rows& rs, float* acc, const float* a, int ainc, int64_t n);
void HalfToF32(DType from, float* dst, const uint16_t* src, int64_t n);
void F32ToBF16(uint16_t* dst, const float* src, int64_t n);
void F32ToF16(uint16_t* dst, const float* src, int64_t n);
void RoundHalfF32(DType t, float* dst, const float* a, int64_t n);
int64_t TargetId();
bool HalfMapF32(const HalfMapArgs& m);

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();

#endif  // DVM_VM_CPU_TILE_KERNELS_INL_H_
