// Row programs (see row_program.h), compiled once per Highway target.
#include "vm/cpu/kernel_targets.h"  // first: before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vm/cpu/row_program.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <algorithm>
#include <limits>
#include <type_traits>

#include "vm/cpu/row_program.h"
#include "vm/cpu/row_reduce-inl.h"
#include "vm/cpu/tile_kernels-inl.h"
#include "vm/cpu/unary_ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {

// A source of a run of values: p[0] repeated (inc 0) or p[0], p[1], ... (inc 1).
struct Src {
  const float* p;
  int64_t inc;
};

// The band being run: block rows [row0, row0 + rows); pf: the memory operands (bit i:
// RowProgramArgs::mem[i]) the step being run fetches ahead (Ahead).
struct Band {
  const RowProgramArgs& x;
  int64_t row0, rows;
  uint32_t pf = 0;
  // The launch's queue of the next block's lines (set_prefetch_queue), drained by drain_steps
  // Step()s per row of every full step; null when there is none.
  PrefetchDrain* drain = nullptr;
  int64_t drain_steps = 0;
  float* reg(int k) const { return x.regs + k * x.reg_floats; }
};

// A streamed launch reads its sources from DRAM, and a band's first pass over a source (the
// max of a softmax, the sum of x + res) waits on every line of it: as the instruction path's
// kernels do (kPrefetchAheadBytes), the first step to read a memory source fetches it ahead as
// it reaches band row r: the row kPrefetchAheadBytes ahead (at least the next one), within the
// block. Rows longer than kMaxAheadRowBytes are left to the hardware prefetchers (AMD Zen 4,
// 16M elements, row programs against the instruction path, interleaved: fetching rows of up to
// 16 KiB ahead, rmsnorm rows of 4096 0.86-0.92x and layernorm rows of 768 0.91-0.92x; up to
// 2 KiB, 0.97x and 0.96x; softmax rows of 128 1.05x, layernorm rows of 256 1.0-1.1x).
constexpr int64_t kMaxAheadRowBytes = 2048;
HWY_INLINE void Ahead(const Band& b, int64_t r) {
  for (int64_t k = 0; k < b.drain_steps; ++k) b.drain->Step();
  const int64_t cols = b.x.cols;
  if (b.pf == 0 || cols * int64_t{sizeof(float)} > kMaxAheadRowBytes) return;
  const int64_t ahead = b.row0 + r + (kPrefetchAhead<float> + cols - 1) / cols;
  if (ahead >= b.x.rows) return;
  for (uint32_t mask = b.pf; mask != 0; mask &= mask - 1) {
    const RowMem& m = b.x.mem[__builtin_ctz(mask)];
    const float* row = m.base + ahead * m.rs;
    const int64_t n = m.cs == 0 ? 1 : cols;  // a value per row ([R, 1]): one line
    for (int64_t k = 0; k < n; k += 16) hwy::Prefetch(row + k);
  }
}

// Operand o of a row, column or scalar step as a run: element k at p[k * stride]. A row
// step's element k is band row k; a column step's is column k of the block's first row.
struct Run {
  float* p;
  int64_t stride;
};
HWY_INLINE Run VectorOperand(const Band& b, int cls, const RowOperand& o) {
  switch (o.kind) {
    case RowOperand::kMem: {
      const RowMem& m = b.x.mem[o.index];
      if (cls == 1) return {m.base + b.row0 * m.rs, m.rs};
      return {m.base, cls == 2 ? m.cs : 0};
    }
    case RowOperand::kRow:
    case RowOperand::kCol:
      return {b.reg(o.index), 1};
    case RowOperand::kValue:
      return {const_cast<float*>(b.x.values[o.index]), 0};
    default:  // kScalar
      return {b.reg(o.index), 0};
  }
}

// A source as a vector stream: a contiguous source read in place (step N), a broadcast one
// from a vector of its value (step 0), so that the loops load every source the same way,
// without a branch per vector.
struct Stream {
  HWY_ALIGN float lanes[kMaxLanes];
  const float* p;
  int64_t step;  // floats per vector: N or 0
  Stream(DF d, const Src& s) {
    if (s.inc) {
      p = s.p;
      step = static_cast<int64_t>(hn::Lanes(d));
    } else {
      hn::Store(hn::Set(d, s.p[0]), d, lanes);
      p = lanes;
      step = 0;
    }
  }
};
// Vector k of a stream (its pointer and step held in locals by the loops).
HWY_INLINE VF StreamAt(DF d, const float* p, int64_t step, int64_t k) {
  return hn::LoadU(d, p + k * step);
}
HWY_INLINE VF StreamTail(DF d, const float* p, int64_t step, int64_t m) {
  return step ? LoadTail(d, p, m) : hn::LoadU(d, p);
}

// dst[i] = f(a, b, c) over n values; nt: streamed stores where dst is aligned.
template <class F>
HWY_INLINE void MapRun(DF d, float* dst, Src a, Src b, Src c, int64_t n, F f, bool nt = false) {
  if (n <= 0) return;
  nt = StreamRow(d, nt, dst);
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const Stream sa(d, a), sb(d, b), sc(d, c);
  const float *pa = sa.p, *pb = sb.p, *pc = sc.p;
  const int64_t ka = sa.step, kb = sb.step, kc = sc.step;
  const auto y = [&](int64_t k) DVM_INL {
    return f(StreamAt(d, pa, ka, k), StreamAt(d, pb, kb, k), StreamAt(d, pc, kc, k));
  };
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const VF y0 = y(0), y1 = y(1);
    StoreMaybeNt(y0, d, dst + i, nt);
    StoreMaybeNt(y1, d, dst + i + N, nt);
    pa += 2 * ka;
    pb += 2 * kb;
    pc += 2 * kc;
  }
  if (i + N <= n) {
    StoreMaybeNt(y(0), d, dst + i, nt);
    i += N;
    pa += ka;
    pb += kb;
    pc += kc;
  }
  if (i < n) {
    const int64_t m = n - i;
    StoreTail(f(StreamTail(d, pa, ka, m), StreamTail(d, pb, kb, m), StreamTail(d, pc, kc, m)), d,
              dst + i, m);
  }
}

// MapRun out of line: the call sites of one functor share a copy (each inlined MapRun is four
// copies of f, and a unary op's f is tens of instructions of vector math).
template <class F>
HWY_NOINLINE void MapRunOut(DF d, float* dst, Src a, Src b, Src c, int64_t n, F f, bool nt) {
  MapRun(d, dst, a, b, c, n, f, nt);
}

// A full step's operand over the band: row r at p + r * rs, its values stepping inc (0, 1).
struct Lin {
  const float* p;
  int64_t rs, inc;
  Src row(int64_t r) const { return {p + r * rs, inc}; }
};
HWY_INLINE Lin FullLin(const Band& b, const RowOperand& o) {
  switch (o.kind) {
    case RowOperand::kMem: {
      const RowMem& m = b.x.mem[o.index];
      return {m.base + b.row0 * m.rs, m.rs, m.cs};
    }
    case RowOperand::kFull:
      return {b.reg(o.index), b.x.cols, 1};
    case RowOperand::kRow:
      return {b.reg(o.index), 1, 0};
    case RowOperand::kCol:
      return {b.reg(o.index), 0, 1};
    case RowOperand::kValue:
      return {b.x.values[o.index], 0, 0};
    default:  // kScalar
      return {b.reg(o.index), 0, 0};
  }
}

// Calls run(kb, kc) with std::bool_constant of whether b and c are contiguous, for the forms
// FullRows takes (each contiguous or one value per row); false otherwise. A functor of kArgs
// operands reads no more: an unused b or c is a stand-in for a (Elementwise), so contiguous,
// and its forms are not instantiated.
template <int kArgs, class Run>
HWY_INLINE bool WithRowForms(const Lin& lb, const Lin& lc, const Run& run) {
  using T = std::true_type;
  using F = std::false_type;
  if constexpr (kArgs == 1) {
    return run(T{}, T{}), true;
  } else if constexpr (kArgs == 2) {
    if (lb.inc) return run(T{}, T{}), true;
    return run(F{}, T{}), true;
  } else {
    if (lb.inc && lc.inc) return run(T{}, T{}), true;
    if (lb.inc) return run(T{}, F{}), true;
    if (lc.inc) return run(F{}, T{}), true;
    return run(F{}, F{}), true;
  }
}

// The rows of a full step whose a is contiguous; b and c contiguous (kB, kC) or one value
// per row, held in a register for the row (the common forms: x * rstd, (x - mean) * g).
// nt_ok: streamed stores for the rows of d that start on a vector boundary.
template <bool kB, bool kC, class F>
HWY_INLINE void FullRows(DF d, const Band& b, const Lin& ld, const Lin& la, const Lin& lb,
                         const Lin& lc, int64_t n, F f, bool nt_ok) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < b.rows; ++r) {
    Ahead(b, r);
    float* dr = const_cast<float*>(ld.p) + r * ld.rs;
    const bool nt = StreamRow(d, nt_ok, dr);
    const float *ar = la.p + r * la.rs, *br = lb.p + r * lb.rs, *cr = lc.p + r * lc.rs;
    const VF vb = kB ? hn::Zero(d) : hn::Set(d, br[0]), vc = kC ? hn::Zero(d) : hn::Set(d, cr[0]);
    const auto y = [&](int64_t i) DVM_INL {
      return f(hn::LoadU(d, ar + i), kB ? hn::LoadU(d, br + i) : vb,
               kC ? hn::LoadU(d, cr + i) : vc);
    };
    int64_t i = 0;
    for (; i + 2 * N <= n; i += 2 * N) {
      const VF y0 = y(i), y1 = y(i + N);
      StoreMaybeNt(y0, d, dr + i, nt);
      StoreMaybeNt(y1, d, dr + i + N, nt);
    }
    if (i + N <= n) {
      StoreMaybeNt(y(i), d, dr + i, nt);
      i += N;
    }
    if (i < n) {
      const int64_t m = n - i;
      StoreTail(f(LoadTail(d, ar + i, m), kB ? LoadTail(d, br + i, m) : vb,
                  kC ? LoadTail(d, cr + i, m) : vc),
                d, dr + i, m);
    }
  }
}

// Does a full step's store to d go around the caches (a streamed launch's memory output)?
// The planner admits no memory read of a slot the program writes, so no step reads it back.
HWY_INLINE bool StreamsTo(const Band& b, const RowOperand& d) {
  return b.x.stream && d.kind == RowOperand::kMem;
}

// Calls body(dst, a, b, c, n, nt) over runs of step s's elements that MapRun takes, with
// operands oa, ob, oc: each band row of a full step, or the one run of a row, column or scalar
// step (through buffers where a row step reads or writes strided memory).
template <class Body>
HWY_INLINE void ForEachRun(const Band& b, const RowStep& s, const RowOperand& oa,
                           const RowOperand& ob, const RowOperand& oc, Body body) {
  if (s.cls == 0) {
    const Lin ld = FullLin(b, s.d), la = FullLin(b, oa), lb = FullLin(b, ob), lc = FullLin(b, oc);
    const bool nt = StreamsTo(b, s.d);
    for (int64_t r = 0; r < b.rows; ++r) {
      Ahead(b, r);
      body(const_cast<float*>(ld.row(r).p), la.row(r), lb.row(r), lc.row(r), b.x.cols, nt);
    }
    return;
  }
  const int64_t n = s.cls == 1 ? b.rows : s.cls == 2 ? b.x.cols : 1;
  const Run rd = VectorOperand(b, s.cls, s.d);
  const Run run[3] = {VectorOperand(b, s.cls, oa), VectorOperand(b, s.cls, ob),
                      VectorOperand(b, s.cls, oc)};
  const auto unit = [n](const Run& q) { return n == 1 || q.stride == 0 || q.stride == 1; };
  if (unit(rd) && (n == 1 || rd.stride == 1) && unit(run[0]) && unit(run[1]) && unit(run[2])) {
    const auto src = [n](const Run& q) { return Src{q.p, n == 1 ? 1 : q.stride}; };
    body(rd.p, src(run[0]), src(run[1]), src(run[2]), n, false);
    return;
  }
  // A row step over strided memory (a [R, 1] operand of a larger tensor): through buffers.
  HWY_ALIGN float tmp[4][kMaxRowBand];
  for (int k = 0; k < 3; ++k)
    for (int64_t i = 0; i < n; ++i) tmp[k][i] = run[k].p[i * run[k].stride];
  body(tmp[3], Src{tmp[0], 1}, Src{tmp[1], 1}, Src{tmp[2], 1}, n, false);
  for (int64_t i = 0; i < n; ++i) rd.p[i * rd.stride] = tmp[3][i];
}

// An elementwise step: f(a, b, c) for each element of its class, f reading its first kArgs
// operands. Unused operands stand in as a (never null).
template <int kArgs, class F>
HWY_NOINLINE void Elementwise(const Band& b, const RowStep& s, F f) {
  const DF d;
  const RowOperand& oa = s.a.kind == RowOperand::kNone ? s.d : s.a;  // a fill reads nothing
  const RowOperand& ob = s.b.kind == RowOperand::kNone ? oa : s.b;
  const RowOperand& oc = s.c.kind == RowOperand::kNone ? oa : s.c;
  if (s.cls == 0) {
    const Lin ld = FullLin(b, s.d), la = FullLin(b, oa), lb = FullLin(b, ob), lc = FullLin(b, oc);
    const bool nt = StreamsTo(b, s.d);
    if (la.inc && WithRowForms<kArgs>(lb, lc, [&](auto kb, auto kc) {
          FullRows<decltype(kb)::value, decltype(kc)::value>(d, b, ld, la, lb, lc, b.x.cols, f, nt);
        }))
      return;
  }
  ForEachRun(b, s, oa, ob, oc, [&](float* dst, Src x, Src y, Src z, int64_t n, bool nt) {
    MapRunOut(d, dst, x, y, z, n, f, nt);
  });
}

// op(a + b) or op(a - b) (RowStep::pre) for unary f (a functor of one operand, the type of
// Unary's): the sum into an L1 buffer, a chunk at a time, then f over it. The bits of the one
// pass (the sum is rounded to f32 either way) for a fraction of its code: a copy of every unary
// op per operand form and pre-op made this file the build's slowest by far, and the steps are
// rare in row programs (the common one, a softmax's exp(x - max) with its sum, is fused in
// Step).
struct AddOp {
  VF operator()(VF x, VF y, VF) const { return hn::Add(x, y); }
};
struct SubOp {
  VF operator()(VF x, VF y, VF) const { return hn::Sub(x, y); }
};
template <class F>
HWY_NOINLINE void PreUnary(const Band& b, const RowStep& s, F f) {
  const DF d;
  constexpr int64_t kChunk = 512;  // a multiple of every vector: streamed stores stay aligned
  ForEachRun(b, s, s.a, s.b, s.a, [&](float* dst, Src x, Src y, Src, int64_t n, bool nt) {
    HWY_ALIGN float t[kChunk];
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
      const int64_t m = std::min(kChunk, n - c0);
      const Src xc{x.p + x.inc * c0, x.inc}, yc{y.p + y.inc * c0, y.inc};
      if (s.pre == 1) {
        MapRunOut(d, t, xc, yc, xc, m, AddOp{}, false);
      } else {
        MapRunOut(d, t, xc, yc, xc, m, SubOp{}, false);
      }
      const Src ts{t, 1};
      MapRunOut(d, dst + c0, ts, ts, ts, m, f, nt);
    }
  });
}

// The reduction a map's pass carries (RowStep::red), as cpu::map_reduce_f32_rows does it:
// accumulators start at id, fold vectors with step, a row's partial tail vector is padded by
// tail(live lanes, y), the four accumulators merge pairwise and fold to a float, combined into
// the accumulator register with `combine`.
template <class Step, class Merge, class Tail, class Fold>
struct Reducer {
  VF id;
  Step step;
  Merge merge;
  Tail tail;
  Fold fold;
  ReduceOp combine;
};
template <class Step, class Merge, class Tail, class Fold>
Reducer<Step, Merge, Tail, Fold> MakeReducer(VF id, Step s, Merge m, Tail t, Fold f, ReduceOp op) {
  return {id, s, m, t, f, op};
}

// Calls run with the reducer of `red`, one of the reductions in kReds (see kMapReductions).
template <uint32_t kReds, class Run>
HWY_INLINE void WithReducer(DF d, RowStep::Red red, const Run& run) {
  const auto add = [](VF x, VF y) { return hn::Add(x, y); };
  const auto mx = [](VF x, VF y) { return NanMax(x, y); };
  const auto mn = [](VF x, VF y) { return NanMin(x, y); };
  const auto fold_sum = [d](VF v) { return FoldSum(d, v); };
  const auto pad = [](VF id) {
    return [id](auto live, VF y) { return hn::IfThenElse(live, y, id); };
  };
  switch (red) {
    case RowStep::kRedSum: {
      if constexpr (!(kReds & red_bit(RowStep::kRedSum))) return;
      const VF id = hn::Set(d, reduce_identity<float>(ReduceOp::kSum));
      return run(MakeReducer(id, add, add, pad(id), fold_sum, ReduceOp::kSum));
    }
    case RowStep::kRedMax: {
      if constexpr (!(kReds & red_bit(RowStep::kRedMax))) return;
      const VF id = hn::Set(d, reduce_identity<float>(ReduceOp::kMax));
      return run(MakeReducer(
          id, mx, mx, pad(id), [d](VF v) { return FoldMax(d, v); }, ReduceOp::kMax));
    }
    case RowStep::kRedMin: {
      if constexpr (!(kReds & red_bit(RowStep::kRedMin))) return;
      const VF id = hn::Set(d, reduce_identity<float>(ReduceOp::kMin));
      return run(MakeReducer(
          id, mn, mn, pad(id), [d](VF v) { return FoldMin(d, v); }, ReduceOp::kMin));
    }
    case RowStep::kRedSumSquares:
      if constexpr (!(kReds & red_bit(RowStep::kRedSumSquares))) return;
      return run(MakeReducer(
          hn::Zero(d), [](VF acc, VF y) { return hn::MulAdd(y, y, acc); }, add,
          [](auto live, VF y) { return hn::IfThenElseZero(live, y); }, fold_sum, ReduceOp::kSum));
    case RowStep::kRedSumExp:  // lanes past the row add exp(-inf) = 0
      if constexpr (!(kReds & red_bit(RowStep::kRedSumExp))) return;
      return run(MakeReducer(
          hn::Zero(d), [d](VF acc, VF y) DVM_INL { return hn::Add(acc, ExpF(d, y)); }, add,
          pad(hn::Set(d, -std::numeric_limits<float>::infinity())), fold_sum, ReduceOp::kSum));
    case RowStep::kNoRed:
      return;
  }
}

// dst[i] = y(i) over n values (a full vector at i; yt(i, m) the first m lanes of the last),
// returning the reduction of y in MapReduceGrid's order; nt: streamed stores where dst is
// aligned.
template <class Y, class YT, class Rd>
HWY_INLINE float MapReduceRow(DF d, float* dst, int64_t n, Y y, YT yt, const Rd& rd, bool nt) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  nt = StreamRow(d, nt, dst);
  VF acc0 = rd.id, acc1 = rd.id, acc2 = rd.id, acc3 = rd.id;
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const VF y0 = y(i), y1 = y(i + N), y2 = y(i + 2 * N), y3 = y(i + 3 * N);
    StoreMaybeNt(y0, d, dst + i, nt);
    StoreMaybeNt(y1, d, dst + i + N, nt);
    StoreMaybeNt(y2, d, dst + i + 2 * N, nt);
    StoreMaybeNt(y3, d, dst + i + 3 * N, nt);
    acc0 = rd.step(acc0, y0);
    acc1 = rd.step(acc1, y1);
    acc2 = rd.step(acc2, y2);
    acc3 = rd.step(acc3, y3);
  }
  for (; i + N <= n; i += N) {
    const VF y0 = y(i);
    StoreMaybeNt(y0, d, dst + i, nt);
    acc0 = rd.step(acc0, y0);
  }
  if (i < n) {
    const int64_t m = n - i;
    const VF last = yt(i, m);
    StoreTail(last, d, dst + i, m);
    acc1 = rd.step(acc1, rd.tail(hn::FirstN(d, static_cast<size_t>(m)), last));
  }
  return rd.fold(rd.merge(rd.merge(acc0, acc1), rd.merge(acc2, acc3)));
}

// A full map step with its result's row reduction (RowStep::red) in the same pass.
template <int kArgs, uint32_t kReds, class F>
HWY_NOINLINE void ElementwiseReduce(const Band& b, const RowStep& s, F f) {
  const DF d;
  const RowOperand& ob = s.b.kind == RowOperand::kNone ? s.a : s.b;
  const RowOperand& oc = s.c.kind == RowOperand::kNone ? s.a : s.c;
  const Lin ld = FullLin(b, s.d), la = FullLin(b, s.a), lb = FullLin(b, ob), lc = FullLin(b, oc);
  const int64_t n = b.x.cols;
  const bool nt = StreamsTo(b, s.d);
  WithReducer<kReds>(d, s.red, [&](const auto& rd) {
    const float id = reduce_identity<float>(rd.combine);
    // After the row's map: the map may read the accumulator's old value (s.red_init).
    const auto combine = [&](int64_t r, float v) {
      float* acc = b.reg(s.red_d.index) + r;
      *acc = reduce_combine_f32(rd.combine, s.red_init ? id : *acc, v);
    };
    if (la.inc) {  // a contiguous: b and c contiguous or one value per row (FullRows' forms)
      WithRowForms<kArgs>(lb, lc, [&](auto kb, auto kc) {
        constexpr bool kB = decltype(kb)::value, kC = decltype(kc)::value;
        for (int64_t r = 0; r < b.rows; ++r) {
          Ahead(b, r);
          const float *ar = la.p + r * la.rs, *br = lb.p + r * lb.rs, *cr = lc.p + r * lc.rs;
          const VF vb = kB ? hn::Zero(d) : hn::Set(d, br[0]);
          const VF vc = kC ? hn::Zero(d) : hn::Set(d, cr[0]);
          const auto y = [&](int64_t i) DVM_INL {
            return f(hn::LoadU(d, ar + i), kB ? hn::LoadU(d, br + i) : vb,
                     kC ? hn::LoadU(d, cr + i) : vc);
          };
          const auto yt = [&](int64_t i, int64_t m) DVM_INL {
            return f(LoadTail(d, ar + i, m), kB ? LoadTail(d, br + i, m) : vb,
                     kC ? LoadTail(d, cr + i, m) : vc);
          };
          combine(r, MapReduceRow(d, const_cast<float*>(ld.p) + r * ld.rs, n, y, yt, rd, nt));
        }
      });
      return;
    }
    for (int64_t r = 0; r < b.rows; ++r) {
      Ahead(b, r);
      const Stream sa(d, la.row(r)), sb(d, lb.row(r)), sc(d, lc.row(r));
      const auto y = [&](int64_t i) DVM_INL {
        const int64_t k = i / static_cast<int64_t>(hn::Lanes(d));
        return f(StreamAt(d, sa.p, sa.step, k), StreamAt(d, sb.p, sb.step, k),
                 StreamAt(d, sc.p, sc.step, k));
      };
      const auto yt = [&](int64_t i, int64_t m) DVM_INL {
        const int64_t k = i / static_cast<int64_t>(hn::Lanes(d));
        return f(StreamTail(d, sa.p + k * sa.step, sa.step, m),
                 StreamTail(d, sb.p + k * sb.step, sb.step, m),
                 StreamTail(d, sc.p + k * sc.step, sc.step, m));
      };
      combine(r, MapReduceRow(d, const_cast<float*>(ld.p) + r * ld.rs, n, y, yt, rd, nt));
    }
  });
}

// A map step of kArgs operands, its reduction (one of kReds) fused or not.
template <int kArgs, uint32_t kReds, class F>
HWY_INLINE void Map(const Band& b, const RowStep& s, F f) {
  if (s.red != RowStep::kNoRed) return ElementwiseReduce<kArgs, kReds>(b, s, f);
  Elementwise<kArgs>(b, s, f);
}

template <class F>
HWY_INLINE void Unary(const Band& b, const RowStep& s, F f) {
  const auto g = [f](VF x, VF, VF) DVM_INL { return f(x); };
  if (s.pre != 0) return PreUnary(b, s, g);
  Elementwise<1>(b, s, g);
}

void BinaryStep(const Band& b, const RowStep& s) {
  const auto map = [&](auto f, auto reds) {
    Map<2, decltype(reds)::value>(b, s, [f](VF x, VF y, VF) DVM_INL { return f(x, y); });
  };
  using AddSub = std::integral_constant<uint32_t, kAddSubReductions>;
  using Other = std::integral_constant<uint32_t, kMapReductions>;
  switch (static_cast<BinaryOp>(s.op)) {
    case BinaryOp::kAdd:
      return map([](VF x, VF y) { return hn::Add(x, y); }, AddSub{});
    case BinaryOp::kSub:
      return map([](VF x, VF y) { return hn::Sub(x, y); }, AddSub{});
    case BinaryOp::kMul:
      return map([](VF x, VF y) { return hn::Mul(x, y); }, Other{});
    default:  // div, maximum, minimum: the planner admits no other op
      WithDivMaxMin(static_cast<BinaryOp>(s.op), [&](auto f) {
        Elementwise<2>(b, s, [f](VF x, VF y, VF) DVM_INL { return f(x, y); });
      });
  }
}

// Each band row of the full operand a reduced (as ReduceRowF32 and DotRowF32 reduce it, part
// by part when s.strip is set) into the row register d.
void ReduceStep(const Band& b, const RowStep& s) {
  const DF d;
  PrefetchDrain queue(false);
  const int64_t cols = b.x.cols, part = s.strip > 0 ? s.strip : std::max<int64_t>(cols, 1);
  const ReduceOp op = static_cast<ReduceOp>(s.op);
  const float id = reduce_identity<float>(op);
  const Lin la = FullLin(b, s.a);
  const auto reduce = [&](auto f, auto fold) {
    for (int64_t r = 0; r < b.rows; ++r) {
      Ahead(b, r);
      const Src a = la.row(r);
      float* acc = b.reg(s.d.index) + r;
      for (int64_t c0 = 0; c0 < cols; c0 += part) {
        const float v = ReduceRowVec<false>(d, a.p + (a.inc ? c0 : 0), static_cast<int>(a.inc),
                                            std::min(part, cols - c0), id, f, fold, queue);
        *acc = reduce_combine_f32(op, *acc, v);
      }
    }
  };
  switch (op) {
    case ReduceOp::kSum:
      return reduce([](VF x, VF y) { return hn::Add(x, y); }, [d](VF v) { return FoldSum(d, v); });
    case ReduceOp::kMax:
      return reduce([](VF x, VF y) { return NanMax(x, y); }, [d](VF v) { return FoldMax(d, v); });
    case ReduceOp::kMin:
      return reduce([](VF x, VF y) { return NanMin(x, y); }, [d](VF v) { return FoldMin(d, v); });
    default:
      return;  // the planner admits no other op
  }
}

void DotStep(const Band& b, const RowStep& s) {
  const DF d;
  PrefetchDrain queue(false);
  const int64_t cols = b.x.cols, part = s.strip > 0 ? s.strip : std::max<int64_t>(cols, 1);
  const Lin la = FullLin(b, s.a), lb = FullLin(b, s.b);
  for (int64_t r = 0; r < b.rows; ++r) {
    Ahead(b, r);
    const Src x = la.row(r), y = lb.row(r);
    float* acc = b.reg(s.d.index) + r;
    const bool square = x.p == y.p && x.inc == y.inc;  // each vector loaded once, as DotRowF32
    for (int64_t c0 = 0; c0 < cols; c0 += part) {
      const float* xp = x.p + (x.inc ? c0 : 0);
      const float* yp = y.p + (y.inc ? c0 : 0);
      const int xi = static_cast<int>(x.inc), yi = static_cast<int>(y.inc);
      const int64_t m = std::min(part, cols - c0);
      if (square) {
        DotRowOne<true, false>(d, acc, xp, xi, yp, yi, m, queue);
      } else {
        DotRowOne<false, false>(d, acc, xp, xi, yp, yi, m, queue);
      }
    }
  }
}

// d = op2(a op b, c) or op2(c, a op b): add, sub, mul.
void Binary2Step(const Band& b, const RowStep& s) {
  WithAddSubMul(static_cast<BinaryOp>(s.op), [&](auto f) {
    WithAddSubMul(static_cast<BinaryOp>(s.op2), [&](auto g) {
      if (s.pos == 0) {
        Elementwise<3>(b, s, [f, g](VF x, VF y, VF z) DVM_INL { return g(f(x, y), z); });
      } else {
        Elementwise<3>(b, s, [f, g](VF x, VF y, VF z) DVM_INL { return g(z, f(x, y)); });
      }
    });
  });
}

void Step(const Band& b, const RowStep& s) {
  const DF d;
  switch (s.kind) {
    case RowStep::kCopy:
      return Map<1, kMapReductions>(b, s, [](VF x, VF, VF) { return x; });
    case RowStep::kUnary:
      if (s.red != RowStep::kNoRed) {  // the planner fuses only exp (softmax's numerator)
        if (s.pre == 1)
          return ElementwiseReduce<2, kExpReductions>(
              b, s, [d](VF x, VF y, VF) DVM_INL { return ExpF(d, hn::Add(x, y)); });
        if (s.pre == 2)
          return ElementwiseReduce<2, kExpReductions>(
              b, s, [d](VF x, VF y, VF) DVM_INL { return ExpF(d, hn::Sub(x, y)); });
        return ElementwiseReduce<1, kExpReductions>(
            b, s, [d](VF x, VF, VF) DVM_INL { return ExpF(d, x); });
      }
      WithUnaryValueOp(d, static_cast<UnaryOp>(s.op), [&](auto f) { Unary(b, s, f); });
      return;
    case RowStep::kBinary2:
      return Binary2Step(b, s);
    case RowStep::kBinary:
      return BinaryStep(b, s);
    case RowStep::kFma:
      return Map<3, kMapReductions>(b, s, [](VF x, VF y, VF z) { return hn::MulAdd(x, y, z); });
    case RowStep::kFill: {
      const VF id = hn::Set(d, reduce_identity<float>(static_cast<ReduceOp>(s.op)));
      return Elementwise<1>(b, s, [id](VF, VF, VF) { return id; });
    }
    case RowStep::kReduce:
      return ReduceStep(b, s);
    case RowStep::kDot:
      return DotStep(b, s);
  }
}

// Step()s per row of each full step that spread the queued lines (two a Step) over the block.
int64_t DrainSteps(const RowProgramArgs& x, const PrefetchQueue& q) {
  int64_t lines = 0;
  for (int i = q.first; i < q.spans; ++i) lines += (q.end[i] - q.next[i] + 63) / 64;
  int64_t full = 0;
  for (int32_t i = 0; i < x.num_steps; ++i) full += x.steps[i].cls == 0;
  const int64_t row_steps = std::max<int64_t>(1, x.rows * full);
  return lines == 0 ? 0 : (lines + 2 * row_steps - 1) / (2 * row_steps);
}

void RowProgramF32(const RowProgramArgs& x) {
  if (x.rows <= 0 || x.cols <= 0) return;
  PrefetchDrain drain(x.drain_queue);
  const int64_t drain_steps = x.drain_queue ? DrainSteps(x, g_prefetch) : 0;
  // Bands of near-equal rows, each at most x.band_rows.
  const int64_t band = std::clamp<int64_t>(x.band_rows, 1, kMaxRowBand);
  const int64_t bands = (x.rows + band - 1) / band;
  for (int64_t k = 0; k < bands; ++k) {
    const int64_t r0 = x.rows * k / bands;
    Band b{x, r0, x.rows * (k + 1) / bands - r0, 0, &drain, drain_steps};
    for (int32_t i = 0; i < x.num_steps; ++i) {
      b.pf = x.stream ? x.steps[i].first_reads : 0;  // streamed: fetch rows ahead
      Step(b, x.steps[i]);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dvm::vm::cpu {

HWY_EXPORT(RowProgramF32);

void row_program_f32(const RowProgramArgs& args) {
  HWY_DYNAMIC_DISPATCH(RowProgramF32)(args);
}

}  // namespace dvm::vm::cpu
#endif  // HWY_ONCE
