// Plain loops over the scalar spec (src/ops/scalar_ops.h) for rows of integers, conversions
// and the other row kernels that have no Highway form: the op switch is hoisted out of the
// loop so that the compiler can vectorise the simple cases. Always inlined, so that a caller
// compiled for a wider target (tile_kernels_int.cc, once per Highway target) vectorises them
// with its own registers: AVX-512 has the 64-bit compares, min/max, abs and conversions that
// baseline x86-64 lacks.
#pragma once

#include <cstdint>

#include "dvm/kernel.h"
#include "ops/scalar_ops.h"

namespace dvm::vm::cpu::loops {

template <typename TO, typename TA, typename F>
[[gnu::always_inline]] inline void loop1(TO* dst, const TA* a, int ainc, int64_t n, F f) {
  if (ainc) {
    for (int64_t i = 0; i < n; ++i) dst[i] = f(a[i]);
  } else if (n > 0) {
    const TO v = f(a[0]);
    for (int64_t i = 0; i < n; ++i) dst[i] = v;
  }
}

template <typename TO, typename TA, typename F>
[[gnu::always_inline]] inline void loop2(TO* dst, const TA* a, int ainc, const TA* b, int binc,
                                         int64_t n, F f) {
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

}  // namespace dvm::vm::cpu::loops
