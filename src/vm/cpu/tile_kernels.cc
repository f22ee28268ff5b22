// Row kernels of the CPU VM (see tile_kernels.h). The f32 hot paths (unary, binary,
// comparisons, select, fma, row reductions, accumulate) are Highway SIMD compiled for several
// targets and dispatched at run time; integer and conversion rows are plain loops vectorised per
// target (tile_kernels_int.cc); arg-reduction and the other rows are plain
// loops over the scalar spec (src/ops/scalar_ops.h) compiled once.
//
// Tails: the last partial vector is loaded with a lane mask (or through a padded stack buffer
// where the target has no masked access) and run through the same SIMD code, so an element's
// result never depends on its position in the row.

// This file holds the dispatch tables and the entry points of tile_kernels.h; the SIMD kernels
// are split over tile_kernels_{unary,fused,binary,reduce,half}.cc so that they compile in parallel.
#include "vm/cpu/tile_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ops/scalar_ops.h"
#include "vm/cpu/int_loops.h"
#include "vm/cpu/kernel_targets.h"  // first: before any Highway header

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>  // _mm_sfence (stream_fence)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vm/cpu/tile_kernels.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include "vm/cpu/tile_kernels-inl.h"  // every target's kernel prototypes

#if HWY_ONCE
namespace dvm::vm::cpu {

constinit thread_local bool g_stream_stores = false;

void set_stream_stores(bool on) {
  g_stream_stores = on;
}

constinit thread_local PrefetchQueue g_prefetch;

void set_prefetch_queue(const PrefetchQueue& q) {
  g_prefetch = q;
}
void clear_prefetch_queue() {
  g_prefetch.spans = g_prefetch.first = 0;
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
HWY_EXPORT(HalfMapF32);

namespace {

using loops::loop1;
using loops::loop2;

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
void predicate_f32(UnaryOp op, int32_t* dst, const float* a, int ainc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(PredicateF32)(op, dst, a, ainc, n);
}

void binary_f32(BinaryOp op, float* dst, const float* a, int ainc, const float* b, int binc,
                int64_t n) {
  HWY_DYNAMIC_DISPATCH(BinaryF32)(op, Rows{}, dst, a, ainc, b, binc, n);
}
void binary_f32_rows(BinaryOp op, const Rows& rows, float* dst, const float* a, int ainc,
                     const float* b, int binc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(BinaryF32)(op, rows, dst, a, ainc, b, binc, n);
}
void compare_f32(BinaryOp op, int32_t* dst, const float* a, int ainc, const float* b, int binc,
                 int64_t n) {
  HWY_DYNAMIC_DISPATCH(CompareF32)(op, dst, a, ainc, b, binc, n);
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

void round_to_f16(float* dst, const float* a, int ainc, int64_t n) {
  if (ainc == 1) return HWY_DYNAMIC_DISPATCH(RoundHalfF32)(DType::kF16, dst, a, n);
  loop1(dst, a, ainc, n, round_f16);
}
void round_to_bf16(float* dst, const float* a, int ainc, int64_t n) {
  if (ainc == 1) return HWY_DYNAMIC_DISPATCH(RoundHalfF32)(DType::kBF16, dst, a, n);
  loop1(dst, a, ainc, n, round_bf16);
}

namespace {
template <int64_t kStride>
void strided_rows(float* dst, int64_t drs, const float* src, int64_t srs, int64_t scs, int64_t rows,
                  int64_t cols) {
  const int64_t step = kStride > 0 ? kStride : scs;  // a constant stride lets GCC vectorise
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * srs;
    float* d = dst + r * drs;
    for (int64_t i = 0; i < cols; ++i) d[i] = s[i * step];
  }
}
}  // namespace

void load_strided_f32_rows(float* dst, int64_t drs, const float* src, int64_t srs, int64_t scs,
                           int64_t rows, int64_t cols) {
  if (scs == 2) return strided_rows<2>(dst, drs, src, srs, scs, rows, cols);
  strided_rows<0>(dst, drs, src, srs, scs, rows, cols);
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
  // A contiguous row of the register's own type is a copy (a KV cache's concatenation stores
  // whole rows here: the element loop cost 1.5% of a GPT-2 decode step).
  if (dstride == 1 && sinc == 1 && n > 0 &&
      (to == DType::kF32 || to == DType::kI32 || to == DType::kI64)) {
    std::memcpy(dst, src, static_cast<size_t>(n) * static_cast<size_t>(dtype_size(to)));
    return;
  }
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
                   int64_t cols, bool from_dram) {
  HWY_DYNAMIC_DISPATCH(TransposeF32)(dst, drs, src, scs, rows, cols, from_dram);
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

bool half_map_supported(int kind, int op, DType a_type, DType d_type) {
  const auto half = [](DType t) { return t == DType::kF16 || t == DType::kBF16; };
  const auto storage = [&](DType t) { return t == DType::kF32 || half(t); };
  if (!storage(a_type) || !storage(d_type) || (!half(a_type) && !half(d_type))) return false;
  if (half(a_type) && half(d_type) && a_type != d_type) return false;
  if (kind == 0) return fused_mul_supported(static_cast<UnaryOp>(op));
  if (kind == 1) {
    const auto b = static_cast<BinaryOp>(op);
    return b == BinaryOp::kAdd || b == BinaryOp::kSub || b == BinaryOp::kMul;
  }
  return kind == 2;
}

bool half_map_f32_rows(const HalfMapArgs& m) {
  return HWY_DYNAMIC_DISPATCH(HalfMapF32)(m);
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
