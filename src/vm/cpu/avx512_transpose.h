// A 16 x 16 transpose of 32-bit elements in AVX-512 registers, shared by the GEMM packers
// (f32 panels in gemm.cc, bf16 pairs in gemm_amx.cc). Callers compile for AVX-512 (a Highway
// AVX3 target or a target attribute); the function is only ever inlined into them.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

// GCC 12 warns about the intrinsics' deliberately undefined lanes where they are inlined.
#pragma GCC diagnostic push
#ifndef __clang__  // a GCC warning group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace dvm::vm::cpu {

// On entry v[r] holds row r (16 values along p), on exit v[p] holds column p (the 16 rows'
// values at p). 64 shuffles for 256 elements, a quarter of what 4 x 4 blocks of 128-bit vectors
// take.
__attribute__((target("avx512f"), always_inline)) inline void Transpose16x16(__m512 v[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  // u[4g + q]: rows 4g..4g+3 at p = q, q + 4, q + 8, q + 12 (one per 128-bit lane).
  for (int g = 0; g < 4; ++g) {
    const __m512 *lo = &t[4 * g], *hi = &t[4 * g + 2];
    u[4 * g + 0] = _mm512_shuffle_ps(lo[0], hi[0], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * g + 1] = _mm512_shuffle_ps(lo[0], hi[0], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * g + 2] = _mm512_shuffle_ps(lo[1], hi[1], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * g + 3] = _mm512_shuffle_ps(lo[1], hi[1], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int q = 0; q < 4; ++q) {
    const __m512 a0 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0x88);  // lanes 0, 2 of rows 0-7
    const __m512 a1 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0xDD);  // lanes 1, 3
    const __m512 b0 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0x88);
    const __m512 b1 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0xDD);
    v[q] = _mm512_shuffle_f32x4(a0, b0, 0x88);
    v[q + 8] = _mm512_shuffle_f32x4(a0, b0, 0xDD);
    v[q + 4] = _mm512_shuffle_f32x4(a1, b1, 0x88);
    v[q + 12] = _mm512_shuffle_f32x4(a1, b1, 0xDD);
  }
}

}  // namespace dvm::vm::cpu

#pragma GCC diagnostic pop

#endif
