// One row's f32 reductions, shared by the tile kernels (tile_kernels_reduce.cc) and the row
// programs (row_program.cc), so that both reduce a row in the same order: the same bits.
// Per-target inline code: included after tile_kernels-inl.h in a foreach_target file.
#if defined(DVM_VM_CPU_ROW_REDUCE_INL_H_) == defined(HWY_TARGET_TOGGLE)  // NOLINT
#ifdef DVM_VM_CPU_ROW_REDUCE_INL_H_
#undef DVM_VM_CPU_ROW_REDUCE_INL_H_
#else
#define DVM_VM_CPU_ROW_REDUCE_INL_H_
#endif

#include <cmath>
#include <cstdint>

#include "vm/cpu/tile_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {

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
template <bool kAhead, class F, class Fold>
HWY_INLINE float ReduceRowVec(DF d, const float* a, int ainc, int64_t n, float identity, F f,
                              Fold fold, PrefetchDrain& queue) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF id = hn::Set(d, identity);
  const VF bcast = hn::Set(d, a[0]);
  const auto load = [&](int64_t i) { return ainc ? hn::LoadU(d, a + i) : bcast; };
  VF acc0 = id, acc1 = id, acc2 = id, acc3 = id;
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    if constexpr (kAhead) queue.Step();
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

// *acc += sum a[i] * b[i], four vector accumulators combined in a fixed order. kSquare: b is
// a (same pointer and increment), so each vector is loaded once (the L1 load ports, not the
// FMAs, bound this loop).
template <bool kSquare, bool kAhead>
HWY_INLINE void DotRowOne(DF d, float* acc, const float* a, int ainc, const float* b, int binc,
                          int64_t n, PrefetchDrain& queue) {
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
    if constexpr (kAhead) queue.Step();
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

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();

#endif  // DVM_VM_CPU_ROW_REDUCE_INL_H_
