// GEMM core of the CPU VM's MatMul instruction: one call per output tile, single-threaded (the
// VM parallelises over output tiles). Classic packed GEMM (Goto/BLIS): K is blocked, the A
// block is packed into MR-row panels and the B block into NR-column panels (packing handles any
// strides, converts f16/bf16 to f32 and zero-pads edges), and a register-tile micro-kernel
// (Highway FMA, dynamically dispatched: MR x NR = 14 x 32 on AVX-512, 6 x 16 on AVX2, 6 x 8 on
// SSE4) computes each MR x NR tile of C. A row-major f32 A is read in place (packed when its
// rows are a multiple of 4 KiB apart); skinny products (m <= MR, B with contiguous columns) read
// B in place too.
#pragma once

#include <cstdint>

#include "dvm/dtype.h"

namespace dvm::vm::cpu {

// C[i, j] (+)= sum_p A[i, p] * B[p, j] for i < m, j < n, p < k. Element (i, p) of A is at
// a[i * a_rs + p * a_cs] (any strides, so transposed/broadcast operands need no copy), B
// likewise, C row-major with row stride ldc (contiguous columns). accumulate=false overwrites C
// (also when k == 0: C is zeroed). m, n up to a few hundred (one VM tile), k any size. Products
// are summed in f32 in a fixed order for given (m, n, k) and strides.
void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
              const float* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, bool accumulate);

// The products with no work for the kernels: m or n <= 0 (nothing to do), or k <= 0 (C zeroed
// unless accumulating). True when it handled the product.
bool gemm_trivial(int64_t m, int64_t n, int64_t k, float* c, int64_t ldc, bool accumulate);

// Same with f16 or bf16 inputs (DType kF16/kBF16 bits as uint16_t), f32 accumulation and f32 C.
void gemm_half(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs,
               int64_t a_cs, const uint16_t* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc,
               bool accumulate);

// bf16 products run on AMX tiles where the CPU has them (gemm_amx.h): gemm_half takes that path
// by itself. Such a B is read in place (weights in their own layout, packed in small blocks per
// call), never from f32 panels packed ahead of time: the VM's weight cache leaves it alone.
bool gemm_half_on_amx(DType in_type);

// Skinny products with a transposed f32 B (decode through a linear layer, up to
// kSkinnyMaxRows rows of x) read B in place, as dot products of contiguous rows, W streamed
// once (gemm_f32_skinny); a packed B is not used for them. The VM decides by the whole
// product's rows, never by a tile's, so that the summation order (and so every bit) does not
// depend on how a thread count splits the rows; gemm_f32 takes this path by itself only up
// to 4 rows, which no tiling splits.
inline constexpr int64_t kSkinnyMaxRows = 16;
inline bool gemm_skinny_in_place(int64_t m, int64_t a_cs, int64_t b_rs, int64_t b_cs) {
  return m <= kSkinnyMaxRows && a_cs == 1 && b_rs == 1 && b_cs != 1;
}
// C (+)= A (m x k, rows contiguous, row stride a_rs) times B^T, B's rows (N of them, k
// contiguous floats each) at stride b_cs: the skinny path above.
void gemm_f32_skinny(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, const float* b,
                     int64_t b_cs, float* c, int64_t ldc, bool accumulate);

// The skinny path for f16 / bf16 products (A and B both in_type, f32 C): as gemm_f32_skinny,
// the values widened to f32 as they are read, so W streams once in its own type (packing it
// into f32 panels per call cost a bf16 decode step 3.6x eager's time). Not where AMX runs bf16
// products (gemm_half_on_amx: its own path reads W in place).
inline bool gemm_half_skinny_in_place(DType in_type, int64_t m, int64_t a_cs, int64_t b_rs,
                                      int64_t b_cs) {
  return (in_type == DType::kF16 || in_type == DType::kBF16) && !gemm_half_on_amx(in_type) &&
         gemm_skinny_in_place(m, a_cs, b_rs, b_cs);
}
void gemm_half_skinny(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                      int64_t a_rs, const uint16_t* b, int64_t b_cs, float* c, int64_t ldc,
                      bool accumulate);

// f32 products with a transposed B (B^T row-major: nn.Linear's W [N, K]) can read B in place
// on AVX-512: x is packed into 32-row panels and W's elements are broadcast from its rows, so
// W is never transposed (that packing cost 5-8% of a linear layer). Worth it for a long
// enough K and up to a few hundred rows: gemm_f32_reads_b_in_place says whether to, from the
// whole product's rows m_total (never a tile's: the path, and with it the order of the sums,
// must not depend on how a thread count tiles the product); gemm_f32_bt_in_place computes
// C (+)= A B with B element (p, j) at b[p + j * b_cs] (GemmImpl where there is no such kernel).
// Such a B is never worth packing ahead of time (the VM's weight cache leaves it alone).
// a_token != 0 promises that A is unchanged since this thread's last call with the same token,
// A address, strides and shape: x's packed panels are then read again instead of repacked
// (tiles along N of one row block; the same bits either way). 0: no promise.
bool gemm_f32_reads_b_in_place(int64_t m_total, int64_t k, int64_t b_rs, int64_t b_cs);
void gemm_f32_bt_in_place(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs,
                          int64_t a_cs, const float* b, int64_t b_cs, float* c, int64_t ldc,
                          bool accumulate, uint64_t a_token = 0);
// The same for f16 / bf16 A and B (f32 C) where AMX does not run them (gemm_half_on_amx): x's
// panels and W's blocks of rows are widened to f32 as they are packed, so W is neither
// converted as a whole per call nor kept as an f32 copy. bf16 products on CPUs with
// AVX512-BF16 (gemm_bf16_dot_enabled), an even K and even row strides are not widened: pairs
// of values along K are multiplied by VDPBF16PS (see docs/numerics.md: denormals flush to
// zero). Taken under the same condition (gemm_half_reads_b_in_place).
inline bool gemm_half_reads_b_in_place(DType in_type, int64_t m_total, int64_t k, int64_t b_rs,
                                       int64_t b_cs) {
  return (in_type == DType::kF16 || in_type == DType::kBF16) && !gemm_half_on_amx(in_type) &&
         gemm_f32_reads_b_in_place(m_total, k, b_rs, b_cs);
}
void gemm_half_bt_in_place(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                           int64_t a_rs, int64_t a_cs, const uint16_t* b, int64_t b_cs, float* c,
                           int64_t ldc, bool accumulate, uint64_t a_token = 0);
// The CPU has AVX512-BF16 and DVM_BF16_DOT is not 0. Tests force the choice with
// set_bf16_dot_for_testing: 0 off, 1 on where the CPU has it, -1 back to the default.
bool gemm_bf16_dot_enabled();
void set_bf16_dot_for_testing(int enabled);
// Does gemm_half_bt_in_place multiply this bf16 product with VDPBF16PS? Then it takes that path
// for any rows and K, also where gemm_half_reads_b_in_place would not: measured one thread on
// a Zen 5, 385-415 GF/s against 175-230 for the widened paths (M = 48-1024, K = 64-4096). The
// skinny path (also on VDPBF16PS there) keeps fewer than kBf16DotMinRows rows: K = 2048,
// N = 8192, skinny / this path: M = 8 2.4 / 2.7 ms, M = 12 2.7 / 2.7, M = 16 3.5 / 2.5. By the
// whole product's rows m_total, as every path choice.
constexpr int64_t kBf16DotMinRows = 12;
bool gemm_bf16_dot_fits(DType in_type, int64_t m_total, int64_t k, int64_t a_rs, int64_t a_cs,
                        int64_t b_rs, int64_t b_cs);
// bf16 products with a row-major B (b_cs 1: GPT-2's Conv1D weight [K, N], attention's
// probabilities @ V) on VDPBF16PS, from kBf16DotMinRows rows (by the whole product's): B's
// pairs of rows interleaved into the role-swapped kernel's packed blocks as the first x panel
// reaches them. One thread, Zen 5, against the widened GemmImpl: M = 256 and 504, K and N
// 64-3072: 228-245 -> 377-443 GF/s; 128 x 2048 x 8192 (B from memory) 188 -> 247; M = 16
// 158 -> 173; M = 1 21 -> 11 (the packing, per call, is most of it). gemm_bf16_b_rows runs
// it (GemmImpl where the dot product does not fit).
bool gemm_bf16_dot_rows_fits(DType in_type, int64_t m_total, int64_t k, int64_t a_rs, int64_t a_cs,
                             int64_t b_cs);
void gemm_bf16_b_rows(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs,
                      int64_t a_cs, const uint16_t* b, int64_t b_rs, float* c, int64_t ldc,
                      bool accumulate);

// Pre-packed B (weights that stay constant across calls, packed once and cached by the VM):
// the whole K x N matrix as ceil(N / NR) panels of K x NR floats, panel j (columns
// [j * NR, j * NR + NR)) at packed + j * K * NR, element (p, c) at [p * NR + c], columns past N
// zero. packed_b_floats() is its size; pack_b() fills it (64-byte aligned: it stores whole
// aligned vectors) from any strides, converting f16/bf16.
size_t packed_b_floats(int64_t k, int64_t n);
void pack_b(DType dtype, int64_t k, int64_t n, const void* b, int64_t b_rs, int64_t b_cs,
            float* packed);

// gemm_f32 / gemm_half with B taken from packed panels: `packed` points at the panel of the
// tile's first column (that column a multiple of NR), `k_total` is the K the panels were packed
// with (their row count). `b` (in place, strides b_rs, b_cs) is still given: skinny products
// may read it directly instead.
struct PackedB {
  const float* panels;
  int64_t k_total;
};
void gemm_f32_packed(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                     const float* b, int64_t b_rs, int64_t b_cs, PackedB packed, float* c,
                     int64_t ldc, bool accumulate);
void gemm_half_packed(DType in_type, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                      int64_t a_rs, int64_t a_cs, PackedB packed, float* c, int64_t ldc,
                      bool accumulate);

// The output tile sizes the kernel is fastest at (multiples of the micro-tile MR x NR of the
// dispatched target); the encoder picks the VM's output tile from them.
struct GemmTile {
  int64_t m, n;
};
GemmTile gemm_preferred_tile();

// The micro-tile of the dispatched target (MR rows x NR columns), for tests and benchmarks.
GemmTile gemm_micro_tile();

}  // namespace dvm::vm::cpu
