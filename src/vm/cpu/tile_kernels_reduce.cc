// Tile kernels (see tile_kernels.h), compiled once per Highway target: row reductions and dot
// products, a map with the reduction of its result, column accumulation, transposed copies and
// f16/bf16 conversions.
#include "vm/cpu/kernel_targets.h"  // first: before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vm/cpu/tile_kernels_reduce.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <type_traits>

#include "vm/cpu/row_reduce-inl.h"
#include "vm/cpu/tile_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {

// Rows in order: an accumulator shared by several rows (row stride 0) combines them in turn.
void ReduceRowF32(ReduceOp op, const Rows& rs, float* acc, const float* a, int ainc, int64_t n) {
  if (n <= 0) return;
  const DF d;
  const float id = reduce_identity<float>(op);
  // Queued prefetches (a streamed launch's next block) are drained by a variant of its own:
  // a check per iteration in the plain loop cost rows of 64 a fifth more instructions.
  const bool ahead = g_prefetch.spans != 0;
  PrefetchDrain queue(ahead);
  const auto run = [&](auto f, auto fold) {
    for (int64_t r = 0; r < rs.rows; ++r) {
      float* ar = acc + r * rs.d;
      const float* row = a + r * rs.a;
      *ar = reduce_combine_f32(op, *ar,
                               ahead ? ReduceRowVec<true>(d, row, ainc, n, id, f, fold, queue)
                                     : ReduceRowVec<false>(d, row, ainc, n, id, f, fold, queue));
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

void DotRowF32(const Rows& rs, float* acc, const float* a, int ainc, const float* b, int binc,
               int64_t n) {
  if (n <= 0) return;
  const DF d;
  const bool ahead = g_prefetch.spans != 0;  // a variant drains the queue (see ReduceRowF32)
  PrefetchDrain queue(ahead);
  const auto rows = [&](auto square, auto with_queue) {
    constexpr bool kSq = decltype(square)::value, kQ = decltype(with_queue)::value;
    for (int64_t r = 0; r < rs.rows; ++r) {
      DotRowOne<kSq, kQ>(d, acc + r * rs.d, a + r * rs.a, ainc, (kSq ? a + r * rs.a : b + r * rs.b),
                         kSq ? ainc : binc, n, queue);
    }
  };
  using T = std::true_type;
  using F = std::false_type;
  if (a == b && ainc == binc && rs.a == rs.b) {  // a sum of squares: each vector loaded once
    return ahead ? rows(T{}, T{}) : rows(T{}, F{});
  }
  ahead ? rows(F{}, T{}) : rows(F{}, F{});
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
  PrefetchDrain queue(g_prefetch.spans != 0);
  for (int64_t r = 0; r < rs.rows; ++r) {
    float* dr = dst + r * rs.d;
    const auto y = row(r);
    VF acc0 = id, acc1 = id, acc2 = id, acc3 = id;
    int64_t i = 0;
    for (; i + 4 * N <= n; i += 4 * N) {
      queue.Step();
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
    case kRowSumExp: {
      // Lanes past the row add exp(-inf) = 0: the tail padded with the sum's identity.
      const VF ninf = hn::Set(d, -std::numeric_limits<float>::infinity());
      MapReduceGrid(
          d, rs, dst, n, out, hn::Zero(d), row,
          [d](VF s, VF y) DVM_INL { return hn::Add(s, ExpF(d, y)); }, add,
          [ninf](auto live, VF y) { return hn::IfThenElse(live, y, ninf); },
          [d](VF v) { return FoldSum(d, v); });
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
bool MapReduceF32(int kind, int op, int pre, int red, const Rows& rs, float* dst, const float* a,
                  int ainc, const float* b, int binc, const float* c, int cinc, int64_t n,
                  float* out) {
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

void AccumulateF32(ReduceOp op, const Rows& rs, float* acc, const float* a, int ainc, int64_t n) {
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

#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR
// The lower (upper) 64-bit halves of each 128-bit block of a and b, interleaved: pairs of
// floats moved as one, the middle step of a register transpose.
template <class D>
HWY_INLINE hn::Vec<D> InterleaveLower64(D d, hn::Vec<D> a, hn::Vec<D> b) {
  const hn::Repartition<double, D> d64;
  return hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
}
template <class D>
HWY_INLINE hn::Vec<D> InterleaveUpper64(D d, hn::Vec<D> a, hn::Vec<D> b) {
  const hn::Repartition<double, D> d64;
  return hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
}
#endif

// dst[r * drs + c] = src[c * scs + r] for r < rows, c < cols: a transposed copy (a tile read
// from, or written to, memory that is contiguous along the tile's rows). 8 x 8 blocks go
// through registers (eight 8-lane loads, 24 shuffles, eight stores) on targets with 256-bit
// vectors, then 4 x 4 blocks (128-bit) on x86; the edges copy element by element.
void TransposeF32(float* dst, int64_t drs, const float* src, int64_t scs, int64_t rows,
                  int64_t cols, [[maybe_unused]] bool from_dram) {
  // Element by element over columns [c_begin, c_end) x rows [r_begin, r_end): the edges.
  const auto copy = [&](int64_t c_begin, int64_t c_end, int64_t r_begin, int64_t r_end) {
    for (int64_t c = c_begin; c < c_end; ++c)
      for (int64_t r = r_begin; r < r_end; ++r) dst[r * drs + c] = src[c * scs + r];
  };
  int64_t r0 = 0, c0 = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::Full256<float> d8;
  const auto il64 = [&](hn::Vec256<float> a, hn::Vec256<float> b) {
    return InterleaveLower64(d8, a, b);
  };
  const auto iu64 = [&](hn::Vec256<float> a, hn::Vec256<float> b) {
    return InterleaveUpper64(d8, a, b);
  };
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (int64_t c = 0; c < cols8; c += 8) {
    if (from_dram)
      for (int k = 0; k < 8; ++k) PrefetchRowAhead(src, scs, c + k, cols, rows);
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
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR
  // Four rows at a time (few rows, or the 4-7 left under the 8-row blocks; a [C, R] source
  // with R < 8 has nothing else): 4x4 blocks through 128-bit interleaves, over all columns
  // the 8x8 blocks did not cover for these rows.
  if (rows - r0 >= 4 && cols >= 4) {
    const hn::Full128<float> d4;
    const auto il64 = [&](hn::Vec128<float> a, hn::Vec128<float> b) {
      return InterleaveLower64(d4, a, b);
    };
    const auto iu64 = [&](hn::Vec128<float> a, hn::Vec128<float> b) {
      return InterleaveUpper64(d4, a, b);
    };
    const int64_t rows4 = r0 + (rows - r0) / 4 * 4, cols4 = cols / 4 * 4;
    for (int64_t c = 0; c < cols4; c += 4) {
      for (int64_t r = r0; r < rows4; r += 4) {
        // v[k]: rows r..r+3 of source column c + k.
        hn::Vec128<float> v[4];
        for (int k = 0; k < 4; ++k) v[k] = hn::LoadU(d4, src + (c + k) * scs + r);
        const auto t0 = hn::InterleaveLower(d4, v[0], v[1]);  // v0[0] v1[0] v0[1] v1[1]
        const auto t1 = hn::InterleaveUpper(d4, v[0], v[1]);  // v0[2] v1[2] v0[3] v1[3]
        const auto t2 = hn::InterleaveLower(d4, v[2], v[3]);
        const auto t3 = hn::InterleaveUpper(d4, v[2], v[3]);
        hn::StoreU(il64(t0, t2), d4, dst + r * drs + c);
        hn::StoreU(iu64(t0, t2), d4, dst + (r + 1) * drs + c);
        hn::StoreU(il64(t1, t3), d4, dst + (r + 2) * drs + c);
        hn::StoreU(iu64(t1, t3), d4, dst + (r + 3) * drs + c);
      }
    }
    // The columns past cols4 of these rows, the 8-row blocks' last columns, then every
    // column of the rows past rows4.
    copy(cols4, cols, r0, rows4);
    copy(c0, cols, 0, r0);
    copy(0, cols, rows4, rows);
    return;
  }
#endif
  // The edges: the last rows of the blocked columns, then the last columns.
  copy(0, c0, r0, rows);
  copy(c0, cols, 0, rows);
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

// f32 -> bf16 storage, n contiguous elements, exactly as ops::f32_to_bf16_bits (BF16Bits).
void F32ToBF16(uint16_t* dst, const float* src, int64_t n) {
  const DF d;
  const hn::Rebind<uint16_t, DF> du16;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(BF16Bits(d, hn::LoadU(d, src + i)), du16, dst + i);
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
