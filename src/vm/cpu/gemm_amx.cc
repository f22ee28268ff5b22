// bf16 GEMM on AMX tiles (see gemm_amx.h).
//
// Tile registers: tmm0-3 accumulate a 32 x 32 block of C (2 x 2 tiles of 16 x 16 f32), tmm4-5
// hold two row tiles (16 rows x 32 K of bf16), tmm6-7 two VNNI tiles (16 K pairs x 16 columns).
// Per 32-element K step the micro-kernel loads four tiles and issues four TDPBF16PS. The tile
// instructions are written as inline assembly with a memory clobber (GCC's AMX intrinsics have
// none: the compiler could move the packing stores past a tile load that reads them).
#include "vm/cpu/gemm_amx.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "base/env.h"
#include "vm/cpu/gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#define DVM_AMX_SUPPORTED 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

// GCC 12 warns about the intrinsics' deliberately undefined lanes where they are inlined.
#pragma GCC diagnostic push
#ifndef __clang__  // a GCC warning group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "vm/cpu/avx512_transpose.h"
#endif

namespace dvm::vm::cpu {

namespace gemm_detail {
// Thread-local 64-byte aligned scratch (defined in gemm.cc; slots 0-2, 0 and 1 shared with the f32
// GEMM: a thread runs one GEMM at a time).
float* scratch(int slot, size_t floats);
}  // namespace gemm_detail

#ifdef DVM_AMX_SUPPORTED

namespace {

#define DVM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

constexpr int64_t kTileRows = 16;                   // rows of every tile
constexpr int64_t kTileK = 32;                      // bf16 values per row-tile row (64 bytes)
constexpr int64_t kTileElems = kTileRows * kTileK;  // bf16 per tile: 1 KiB
constexpr int64_t kTileBytes = kTileElems * 2;
constexpr int64_t kBlock = 2 * kTileRows;  // rows / columns of C per micro-kernel call

#define DVM_TILE_ZERO(t) asm volatile("tilezero %%tmm" #t ::: "memory")
#define DVM_TILE_LOAD(t, base, stride) \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(stride) : "memory")
#define DVM_TILE_STORE(t, base, stride) \
  asm volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(stride) : "memory")
// tmm<c> += tmm<l> (row tile) x tmm<r> (VNNI tile).
#define DVM_TILE_DP(c, l, r) \
  asm volatile("tdpbf16ps %%tmm" #r ", %%tmm" #l ", %%tmm" #c ::: "memory")

// Palette 1, all eight tiles 16 rows x 64 bytes (loaded once per GEMM call, released after it
// so that the thread carries no tile state between calls).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

class TileScope {
 public:
  TileScope() {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = static_cast<uint16_t>(kTileK * 2);
      cfg.rows[t] = static_cast<uint8_t>(kTileRows);
    }
    asm volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
  }
  ~TileScope() { asm volatile("tilerelease" ::: "memory"); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

bool detect_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool tile = (edx >> 24) & 1u, bf16 = (edx >> 22) & 1u;
  if (!tile || !bf16) return false;
  // Linux enables the 8 KiB tile data state per process on request (and refuses where the
  // kernel or the hypervisor does not support it).
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// A tile operand: tile kb (of the K steps) at base + kb * step bytes, rows stride bytes apart.
struct TileSrc {
  const char* base = nullptr;
  int64_t stride = 0;
  int64_t step = 0;
};

// Group `group` of packed tiles laid out group by group, kbs K steps each (tile kb of group g
// at tile index g * kbs + kb).
TileSrc packed_tiles(const uint16_t* tiles, int64_t group, int64_t kbs) {
  return {reinterpret_cast<const char*>(tiles + group * kbs * kTileElems), kTileK * 2, kTileBytes};
}

TileSrc advanced(TileSrc t, int64_t steps) {
  t.base += steps * t.step;
  return t;
}

// Source rows to prefetch into L2 while computing: at K step kb, the 64 bytes at
// base + q * stride + kb * 64 for q < rows (the next block's W rows, spread over the x blocks).
struct Prefetch {
  const char* base = nullptr;
  int64_t stride = 0;
  int64_t rows = 0;
};

// acc (32 x 32 f32, row stride 128 bytes) (+)= L (nl row tiles: rows) x R (nr VNNI tiles:
// columns) over kbs K steps; `resume` continues the sums already in acc (tile stores and loads
// of f32 are exact: blocking K changes no bit).
template <int kNL, int kNR>
void micro_kernel(int64_t kbs, const TileSrc* l, const TileSrc* r, float* acc, bool resume,
                  Prefetch pf) {
  const int64_t ld = kBlock * static_cast<int64_t>(sizeof(float));
  float* const acc1 = acc + kTileRows;
  float* const acc2 = acc + kTileRows * kBlock;
  float* const acc3 = acc2 + kTileRows;
  if (resume) {
    DVM_TILE_LOAD(0, acc, ld);
    if constexpr (kNR == 2) DVM_TILE_LOAD(1, acc1, ld);
    if constexpr (kNL == 2) DVM_TILE_LOAD(2, acc2, ld);
    if constexpr (kNL == 2 && kNR == 2) DVM_TILE_LOAD(3, acc3, ld);
  } else {
    DVM_TILE_ZERO(0);
    if constexpr (kNR == 2) DVM_TILE_ZERO(1);
    if constexpr (kNL == 2) DVM_TILE_ZERO(2);
    if constexpr (kNL == 2 && kNR == 2) DVM_TILE_ZERO(3);
  }
  const char *l0 = l[0].base, *l1 = l[1].base, *r0 = r[0].base, *r1 = r[1].base;
  for (int64_t kb = 0; kb < kbs; ++kb) {
    DVM_TILE_LOAD(4, l0, l[0].stride);
    if constexpr (kNL == 2) DVM_TILE_LOAD(5, l1, l[1].stride);
    DVM_TILE_LOAD(6, r0, r[0].stride);
    if constexpr (kNR == 2) DVM_TILE_LOAD(7, r1, r[1].stride);
    DVM_TILE_DP(0, 4, 6);
    if constexpr (kNR == 2) DVM_TILE_DP(1, 4, 7);
    if constexpr (kNL == 2) DVM_TILE_DP(2, 5, 6);
    if constexpr (kNL == 2 && kNR == 2) DVM_TILE_DP(3, 5, 7);
    for (int64_t q = 0; q < pf.rows; ++q) {
      _mm_prefetch(pf.base + q * pf.stride + kb * kTileK * 2, _MM_HINT_T1);
    }
    l0 += l[0].step, l1 += l[1].step, r0 += r[0].step, r1 += r[1].step;
  }
  DVM_TILE_STORE(0, acc, ld);
  if constexpr (kNR == 2) DVM_TILE_STORE(1, acc1, ld);
  if constexpr (kNL == 2) DVM_TILE_STORE(2, acc2, ld);
  if constexpr (kNL == 2 && kNR == 2) DVM_TILE_STORE(3, acc3, ld);
}

void run_micro(int64_t nl, int64_t nr, int64_t kbs, const TileSrc* l, const TileSrc* r, float* acc,
               bool resume, Prefetch pf = {}) {
  if (nl == 2) {
    return nr == 2 ? micro_kernel<2, 2>(kbs, l, r, acc, resume, pf)
                   : micro_kernel<2, 1>(kbs, l, r, acc, resume, pf);
  }
  return nr == 2 ? micro_kernel<1, 2>(kbs, l, r, acc, resume, pf)
                 : micro_kernel<1, 1>(kbs, l, r, acc, resume, pf);
}

__mmask32 k_mask(int64_t len) {
  return len >= 32 ? ~__mmask32{0} : (__mmask32{1} << len) - 1;
}

// Row tiles of a `rows` x k operand, element (i, p) at src[i * rs + p * cs]: group g's tile kb
// holds rows 16g.. and K values 32kb.., zero past rows and k.
DVM_AVX512 void pack_row_tiles(int64_t rows, int64_t k, const uint16_t* src, int64_t rs, int64_t cs,
                               uint16_t* dst) {
  const int64_t groups = (rows + kTileRows - 1) / kTileRows, kbs = (k + kTileK - 1) / kTileK;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < kTileRows; ++r) {
      const int64_t i = g * kTileRows + r;
      const uint16_t* row = src + i * rs;
      for (int64_t kb = 0; kb < kbs; ++kb) {
        uint16_t* d = dst + (g * kbs + kb) * kTileElems + r * kTileK;
        const int64_t p0 = kb * kTileK, len = std::min(kTileK, k - p0);
        if (i >= rows) {
          _mm512_storeu_si512(d, _mm512_setzero_si512());
        } else if (cs == 1) {
          _mm512_storeu_si512(d, _mm512_maskz_loadu_epi16(k_mask(len), row + p0));
        } else {
          for (int64_t q = 0; q < kTileK; ++q) d[q] = q < len ? row[(p0 + q) * cs] : 0;
        }
      }
    }
  }
}

// pack_vnni_tiles for a B whose rows (over the columns) are contiguous (x @ W with W [K, N]):
// rows p and p + 1 interleaved, 32 columns per pair of loads, each row read as one run.
DVM_AVX512 void pack_vnni_rows(int64_t cols, int64_t k, const uint16_t* src, int64_t ps,
                               uint16_t* dst) {
  const int64_t groups = (cols + kTileRows - 1) / kTileRows, kbs = (k + kTileK - 1) / kTileK;
  alignas(64) static constexpr uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                   37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                   11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo_idx = _mm512_load_si512(kLo);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  for (int64_t p = 0; p < kbs * kTileK; p += 2) {
    const int64_t kb = p / kTileK, kp = (p % kTileK) / 2;
    const uint16_t* r0 = src + p * ps;
    for (int64_t u = 0; u < groups; u += 2) {
      const int64_t j0 = u * kTileRows, nc = std::min(2 * kTileRows, cols - j0);
      const __mmask32 cmask = k_mask(nc);
      const __m512i a = p < k ? _mm512_maskz_loadu_epi16(cmask, r0 + j0) : _mm512_setzero_si512();
      const __m512i b =
          p + 1 < k ? _mm512_maskz_loadu_epi16(cmask, r0 + ps + j0) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + (u * kbs + kb) * kTileElems + kp * kTileK,
                          _mm512_permutex2var_epi16(a, lo_idx, b));
      if (u + 1 < groups) {
        _mm512_storeu_si512(dst + ((u + 1) * kbs + kb) * kTileElems + kp * kTileK,
                            _mm512_permutex2var_epi16(a, hi_idx, b));
      }
    }
  }
}

// VNNI tiles of a k x cols operand, element (p, j) at src[p * ps + j * js]: group u's tile kb
// holds, in row kp, the pairs (p, p + 1) = (32kb + 2kp, + 1) of columns 16u.. side by side;
// zero past cols and k.
DVM_AVX512 void pack_vnni_tiles(int64_t cols, int64_t k, const uint16_t* src, int64_t ps,
                                int64_t js, uint16_t* dst) {
  const int64_t groups = (cols + kTileRows - 1) / kTileRows, kbs = (k + kTileK - 1) / kTileK;
  if (js == 1 && ps != 1) return pack_vnni_rows(cols, k, src, ps, dst);
  for (int64_t u = 0; u < groups; ++u) {
    const int64_t j0 = u * kTileRows, nc = std::min(kTileRows, cols - j0);
    for (int64_t kb = 0; kb < kbs; ++kb) {
      uint16_t* d = dst + (u * kbs + kb) * kTileElems;
      const int64_t p0 = kb * kTileK, len = std::min(kTileK, k - p0);
      if (ps == 1) {
        // Each column's 32 K values are one 64-byte row of 16 pairs: a 16 x 16 transpose of
        // 32-bit elements puts pair kp of every column into row kp.
        __m512 v[16];
        for (int64_t jj = 0; jj < kTileRows; ++jj) {
          v[jj] = jj < nc ? _mm512_castsi512_ps(
                                _mm512_maskz_loadu_epi16(k_mask(len), src + (j0 + jj) * js + p0))
                          : _mm512_setzero_ps();
        }
        Transpose16x16(v);
        for (int64_t kp = 0; kp < kTileRows; ++kp) _mm512_storeu_ps(d + kp * kTileK, v[kp]);
      } else {
        for (int64_t kp = 0; kp < kTileRows; ++kp) {
          for (int64_t jj = 0; jj < kTileRows; ++jj) {
            for (int64_t q = 0; q < 2; ++q) {
              const int64_t p = p0 + 2 * kp + q;
              d[kp * kTileK + jj * 2 + q] =
                  jj < nc && p < k ? src[p * ps + (j0 + jj) * js] : uint16_t{0};
            }
          }
        }
      }
    }
  }
}

// C[i0 + r, j0 + c] (+)= out[r, c] for r < rows, c < cols.
DVM_AVX512 void store_block(const float* out, int64_t rows, int64_t cols, float* c, int64_t ldc,
                            bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < cols; h += kTileRows) {
      const __mmask16 mask =
          static_cast<__mmask16>(cols - h >= 16 ? 0xFFFFu : (1u << (cols - h)) - 1);
      __m512 v = _mm512_loadu_ps(out + r * kBlock + h);
      float* dst = c + r * ldc + h;
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, dst));
      _mm512_mask_storeu_ps(dst, mask, v);
    }
  }
}

// C[c, r] (+)= out[r, c] for r < rows, c < cols (out holds C transposed), 16 x 16 blocks
// transposed in registers.
DVM_AVX512 void store_block_transposed(const float* out, int64_t rows, int64_t cols, float* c,
                                       int64_t ldc, bool accumulate) {
  for (int64_t g = 0; g < rows; g += kTileRows) {
    const int64_t nr = std::min(kTileRows, rows - g);
    const __mmask16 mask = static_cast<__mmask16>(nr >= 16 ? 0xFFFFu : (1u << nr) - 1);
    for (int64_t u = 0; u < cols; u += kTileRows) {
      __m512 v[16];
      for (int64_t rr = 0; rr < kTileRows; ++rr)
        v[rr] = _mm512_loadu_ps(out + (g + rr) * kBlock + u);
      Transpose16x16(v);
      const int64_t nc = std::min(kTileRows, cols - u);
      for (int64_t cc = 0; cc < nc; ++cc) {
        float* dst = c + (u + cc) * ldc + g;
        __m512 x = v[cc];
        if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask, dst));
        _mm512_mask_storeu_ps(dst, mask, x);
      }
    }
  }
}

uint16_t* scratch_bf16(int slot, int64_t elems) {
  return reinterpret_cast<uint16_t*>(
      gemm_detail::scratch(slot, static_cast<size_t>(elems + 1) / 2));
}

// K steps per block of the packed-B path: B's packed block (512 K values x the tile's columns)
// stays in L2 while the x blocks pass over it; the sums wait in `partial` between K blocks.
// The in-place W^T path does not block K: through the VM (cold W, x @ W^T 2048 -> 8192, one
// thread) 16-step blocks lost 25-30% at 128 and 512 rows.
constexpr int64_t kKSteps = 16;

// C (+)= x B over `width` columns of C (rows of C^T when swapped) and `rows` rows: x as packed
// tiles `inner` (16-row groups), the B side's tiles from outer(j0, kb0, steps, tiles), which
// fills tiles[0..1] for the (at most) 32 columns from j0 and the K steps from kb0 and returns
// how many groups it filled. swapped: the B side is the row-tile operand, C^T is computed and
// transposed on store.
// source(j0, kb0) names the memory outer() will read for that block (prefetched while the
// block before it computes, its rows shared out among the x blocks).
template <class Outer, class Source>
void run_blocks(int64_t width, int64_t rows, int64_t kbs, int64_t k_steps, const uint16_t* inner,
                Outer&& outer, Source&& source, bool swapped, float* c, int64_t ldc,
                bool accumulate) {
  const int64_t row_blocks = (rows + kBlock - 1) / kBlock,
                col_blocks = (width + kBlock - 1) / kBlock;
  // One block of sums per block of C while K is blocked, else one reused.
  const bool one_pass = k_steps >= kbs;
  float* partial = gemm_detail::scratch(
      2, static_cast<size_t>((one_pass ? 1 : row_blocks * col_blocks) * kBlock * kBlock));
  for (int64_t kb0 = 0; kb0 < kbs; kb0 += k_steps) {
    const int64_t steps = std::min(k_steps, kbs - kb0);
    const bool last = kb0 + steps == kbs;
    for (int64_t jb = 0; jb < col_blocks; ++jb) {
      TileSrc o[2];
      const int64_t no = outer(jb * kBlock, kb0, steps, o);
      Prefetch next;
      if (jb + 1 < col_blocks) {
        next = source((jb + 1) * kBlock, kb0);
      } else if (!last) {
        next = source(0, kb0 + k_steps);
      }
      const int64_t share = (next.rows + row_blocks - 1) / row_blocks;
      const int64_t ncols = std::min(kBlock, width - jb * kBlock);
      for (int64_t ib = 0; ib < row_blocks; ++ib) {
        const int64_t first = std::min(next.rows, ib * share);
        const Prefetch pf{next.base + first * next.stride, next.stride,
                          std::min(share, next.rows - first)};
        const int64_t nrows = std::min(kBlock, rows - ib * kBlock);
        const int64_t ni = nrows > kTileRows ? 2 : 1;
        const TileSrc in[2] = {advanced(packed_tiles(inner, 2 * ib, kbs), kb0),
                               advanced(packed_tiles(inner, 2 * ib + ni - 1, kbs), kb0)};
        float* acc = one_pass ? partial : partial + (jb * row_blocks + ib) * kBlock * kBlock;
        if (swapped) {
          run_micro(no, ni, steps, o, in, acc, kb0 > 0, pf);
        } else {
          run_micro(ni, no, steps, in, o, acc, kb0 > 0, pf);
        }
        if (!last) continue;
        float* cb = c + ib * kBlock * ldc + jb * kBlock;
        if (swapped) {
          store_block_transposed(acc, ncols, nrows, cb, ldc, accumulate);
        } else {
          store_block(acc, nrows, ncols, cb, ldc, accumulate);
        }
      }
    }
  }
}

// B read as VNNI tiles, packed per K block for all n columns at once (B's rows are read as
// contiguous runs: per 32 columns they would be 64-byte pieces a row apart; 128-column chunks
// measured 10-20% slower at 1-16 rows, no faster at 128-512), A packed whole as row tiles.
void gemm_packed_b(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                   const uint16_t* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc,
                   bool accumulate) {
  const int64_t kbs = (k + kTileK - 1) / kTileK;
  const int64_t a_groups = (m + kTileRows - 1) / kTileRows;
  const int64_t b_groups = (n + kTileRows - 1) / kTileRows;
  uint16_t* ap = scratch_bf16(0, a_groups * kbs * kTileElems);
  uint16_t* bp = scratch_bf16(1, b_groups * kKSteps * kTileElems);
  pack_row_tiles(m, k, a, a_rs, a_cs, ap);
  const auto outer = [&](int64_t j0, int64_t kb0, int64_t steps, TileSrc* tiles) {
    if (j0 == 0) {  // the first block of a K block packs the K block's B
      const int64_t p0 = kb0 * kTileK;
      pack_vnni_tiles(n, std::min(steps * kTileK, k - p0), b + p0 * b_rs, b_rs, b_cs, bp);
    }
    const int64_t groups = n - j0 > kTileRows ? 2 : 1;
    tiles[0] = packed_tiles(bp, j0 / kTileRows, steps);
    tiles[1] = packed_tiles(bp, j0 / kTileRows + groups - 1, steps);
    return groups;
  };
  const auto source = [](int64_t, int64_t) { return Prefetch{}; };
  run_blocks(n, m, kbs, kKSteps, ap, outer, source, false, c, ldc, accumulate);
}

// B^T's rows (nn.Linear's W [N, K], element (p, j) at b[p + j * b_cs]) as row tiles (copied
// per 32 rows and K block, or read in place), A packed whole as VNNI tiles: C^T is computed and
// transposed on store.
void gemm_rows_of_bt(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                     const uint16_t* b, int64_t b_cs, float* c, int64_t ldc, bool accumulate) {
  const int64_t kbs = (k + kTileK - 1) / kTileK;
  const int64_t x_groups = (m + kTileRows - 1) / kTileRows;
  uint16_t* xp = scratch_bf16(0, x_groups * kbs * kTileElems);
  uint16_t* wp = scratch_bf16(1, 2 * kbs * kTileElems);
  pack_vnni_tiles(m, k, a, a_cs, a_rs, xp);
  // In place when K is whole tiles (copying them first, or blocking K, measured slower through
  // the VM with cold weights); otherwise copied per 32 rows.
  const bool in_place = k % kTileK == 0;
  const auto outer = [&](int64_t n0, int64_t kb0, int64_t steps, TileSrc* tiles) {
    const int64_t nw = std::min(kBlock, n - n0), groups = nw > kTileRows ? 2 : 1;
    const int64_t p0 = kb0 * kTileK;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t rows = std::min(kTileRows, nw - g * kTileRows);
      const uint16_t* w = b + (n0 + g * kTileRows) * b_cs + p0;
      if (in_place && rows == kTileRows) {
        tiles[g] = {reinterpret_cast<const char*>(w), b_cs * 2, kTileK * 2};
      } else {
        pack_row_tiles(rows, std::min(steps * kTileK, k - p0), w, b_cs, 1,
                       wp + g * steps * kTileElems);
        tiles[g] = packed_tiles(wp, g, steps);
      }
    }
    if (groups == 1) tiles[1] = tiles[0];
    return groups;
  };
  // With more than one x block, the next 32 W rows are prefetched while these compute (through
  // the VM, x @ W^T 2048 -> 8192 with cold W, one thread: 1.11 -> 1.22 of eager at 128 rows);
  // with one, the hardware prefetcher does better alone.
  const auto source = [&](int64_t n0, int64_t kb0) {
    if (m <= kBlock) return Prefetch{};
    const uint16_t* w = b + n0 * b_cs + kb0 * kTileK;
    return Prefetch{reinterpret_cast<const char*>(w), b_cs * 2, std::min(kBlock, n - n0)};
  };
  run_blocks(n, m, kbs, kbs, xp, outer, source, true, c, ldc, accumulate);
}

}  // namespace

bool amx_bf16_enabled() {
  static const bool enabled = base::env().amx && detect_amx_bf16();
  return enabled;
}

void gemm_bf16_amx(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                   const uint16_t* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc,
                   bool accumulate) {
  if (gemm_trivial(m, n, k, c, ldc, accumulate)) return;
  const TileScope tiles;
  if (b_rs == 1 && b_cs != 1) {
    gemm_rows_of_bt(m, n, k, a, a_rs, a_cs, b, b_cs, c, ldc, accumulate);
  } else {
    gemm_packed_b(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
  }
}

#pragma GCC diagnostic pop

#else  // no AMX on this platform

bool amx_bf16_enabled() {
  return false;
}

void gemm_bf16_amx(int64_t, int64_t, int64_t, const uint16_t*, int64_t, int64_t, const uint16_t*,
                   int64_t, int64_t, float*, int64_t, bool) {
  std::abort();  // callers check amx_bf16_enabled()
}

#endif

}  // namespace dvm::vm::cpu
