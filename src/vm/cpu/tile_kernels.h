// Row kernels of the CPU VM: every tile instruction runs as one call of these per tile row.
//
// Conventions (all functions):
// - `n` elements are processed; n may be 0.
// - Source increments (`ainc`, `binc`, `cinc`) are 0 (every element reads src[0]: a broadcast
//   scalar) or 1 (contiguous). Destinations are contiguous.
// - A destination may alias a source only if that source has increment 1 and the same
//   element type (in-place elementwise update).
// - Floats compute in f32; integer arithmetic wraps (two's complement, no UB); integer
//   floor_divide/remainder by zero give 0. Booleans are i32 0/1 in registers.
// - Semantics are exactly those of src/ops/scalar_ops.h (the reference executor uses the same
//   functions); SIMD transcendentals agree within the bounds documented there.
// Implemented with Highway, dynamically dispatched to the best SIMD target of the machine.
#pragma once

#include <cstdint>

#include "dvm/dtype.h"
#include "dvm/kernel.h"

namespace dvm::vm::cpu {

// A block of rows for the *_rows variants: the same row kernel over `rows` rows, the row r
// of each operand at element offset r * (its row stride) from its pointer; one dispatch per
// block instead of one per row (rows of 32-96 columns are common). Where every operand's rows
// are back to back (row stride n with increment 1, or 0 with increment 0) the block runs as
// one row of rows * n elements. The SIMD kernels take it by value: through a reference the
// compiler must reload every stride after each vector store (Highway's stores may alias
// anything), which cost rotary embedding's 32-column rows 15% of their time.
struct Rows {
  int64_t rows = 1;
  int64_t d = 0, a = 0, b = 0, c = 0;  // row strides (elements) of dst and the sources
  // Elementwise kernels (unary, binary, fma): `outer` such blocks, block k of each operand at
  // k * (its outer stride) from its pointer (a 3-D tile: several trips of an outer loop).
  int64_t outer = 1;
  int64_t od = 0, oa = 0, ob = 0, oc = 0;
  int64_t e = 0, oe = 0;  // a fourth source (fused_mul_add_f32_rows): row and outer stride
  // Can a source of increment `inc` and row stride `rs` be read as one run of rows * n
  // elements (rows back to back, a broadcast scalar, or a column vector when n == 1)? Its
  // increment in that run goes to *flat.
  static bool flat_src(int64_t n, int inc, int64_t rs, int* flat) {
    *flat = inc;
    if (inc == 0 && rs == 0) return true;
    if (inc == 1 && rs == n) return true;
    *flat = 1;
    return n == 1 && rs == 1;
  }
  bool flat_dst(int64_t n) const { return rows > 1 && d == n; }
};

// dst[i] = op(a[i]); value-producing ops (not IsFinite/IsNan/LogicalNot).
void unary_f32(UnaryOp op, float* dst, const float* a, int ainc, int64_t n);
// dst[i] = op(a[i] + b[i]) (pre = 1) or op(a[i] - b[i]) (pre = 2), f32 value ops; bit-identical
// to the add/sub and the op run apart.
void unary_pre_f32(UnaryOp op, int pre, float* dst, const float* a, int ainc, const float* b,
                   int binc, int64_t n);
void unary_f32_rows(UnaryOp op, const Rows& rows, float* dst, const float* a, int ainc, int64_t n);
void unary_pre_f32_rows(UnaryOp op, int pre, const Rows& rows, float* dst, const float* a, int ainc,
                        const float* b, int binc, int64_t n);
// Integer-capable ops only (Neg, Abs, Relu, Sign, Floor/Ceil/Round/Trunc as identity).
void unary_i32(UnaryOp op, int32_t* dst, const int32_t* a, int ainc, int64_t n);
void unary_i64(UnaryOp op, int64_t* dst, const int64_t* a, int ainc, int64_t n);
// Predicates IsFinite, IsNan, LogicalNot: dst is a 0/1 mask.
void predicate_f32(UnaryOp op, int32_t* dst, const float* a, int ainc, int64_t n);
void predicate_i32(UnaryOp op, int32_t* dst, const int32_t* a, int ainc, int64_t n);
void predicate_i64(UnaryOp op, int32_t* dst, const int64_t* a, int ainc, int64_t n);

// Arithmetic binary ops (kind 0 in ops.def).
void binary_f32(BinaryOp op, float* dst, const float* a, int ainc, const float* b, int binc,
                int64_t n);
void binary_f32_rows(BinaryOp op, const Rows& rows, float* dst, const float* a, int ainc,
                     const float* b, int binc, int64_t n);
void binary_i32(BinaryOp op, int32_t* dst, const int32_t* a, int ainc, const int32_t* b, int binc,
                int64_t n);
void binary_i64(BinaryOp op, int64_t* dst, const int64_t* a, int ainc, const int64_t* b, int binc,
                int64_t n);
// Comparisons and logical ops (kinds 1 and 2): dst is a 0/1 mask. Logical ops treat any
// non-zero operand as true.
void compare_f32(BinaryOp op, int32_t* dst, const float* a, int ainc, const float* b, int binc,
                 int64_t n);
void compare_i32(BinaryOp op, int32_t* dst, const int32_t* a, int ainc, const int32_t* b, int binc,
                 int64_t n);
void compare_i64(BinaryOp op, int32_t* dst, const int64_t* a, int ainc, const int64_t* b, int binc,
                 int64_t n);

// dst[i] = cond[i] != 0 ? a[i] : b[i]. `elem_bytes` is 4 (f32/i32) or 8 (i64).
void select(int elem_bytes, void* dst, const int32_t* cond, int cinc, const void* a, int ainc,
            const void* b, int binc, int64_t n);

// Register-to-register conversion. f32 -> int truncates toward zero, saturating, NaN -> 0.
void convert(CType to, void* dst, CType from, const void* src, int sinc, int64_t n);
// Round f32 values to the nearest f16 / bf16 value (ties to even), keeping them in f32.
void round_to_f16(float* dst, const float* a, int ainc, int64_t n);
void round_to_bf16(float* dst, const float* a, int ainc, int64_t n);

// Memory <-> register with dtype conversion and any element stride (gather / scatter).
// load: dst (compute type compute_type(from)) [i] = src[i * sstride]
void load_convert(void* dst, DType from, const void* src, int64_t sstride, int64_t n);
// A tile of f32 rows read with a column stride other than 1 (a strided slice: pooling windows,
// x[..., ::2]): dst[r * drs + i] = src[r * srs + i * scs], all rows in one call (a call per
// row of 16 elements cost more than its copies).
void load_strided_f32_rows(float* dst, int64_t drs, const float* src, int64_t srs, int64_t scs,
                           int64_t rows, int64_t cols);
// store: dst[i * dstride] = convert(src[i * sinc]) from compute type compute_type(to)
void store_convert(DType to, void* dst, int64_t dstride, const void* src, int sinc, int64_t n);

// Reductions. `op` is Sum, Max, Min or Prod (the encoder lowers Mean to Sum and a multiply).
// Max/Min propagate NaN. Summation order is fixed for a given n (deterministic).
// *acc = combine(*acc, reduce(a[0..n)))
void reduce_row_f32(ReduceOp op, float* acc, const float* a, int ainc, int64_t n);
// The same over a block of rows (accumulator row stride 0: every row combines into one).
void reduce_row_f32_rows(ReduceOp op, const Rows& rows, float* acc, const float* a, int ainc,
                         int64_t n);
void reduce_row_i32(ReduceOp op, int32_t* acc, const int32_t* a, int ainc, int64_t n);
void reduce_row_i64(ReduceOp op, int64_t* acc, const int64_t* a, int ainc, int64_t n);
// *acc += sum a[i] * b[i] (f32, fused multiply-adds, fixed order: deterministic).
void dot_row_f32(float* acc, const float* a, int ainc, const float* b, int binc, int64_t n);
void dot_row_f32_rows(const Rows& rows, float* acc, const float* a, int ainc, const float* b,
                      int binc, int64_t n);
// acc[i] = combine(acc[i], a[i])
void accumulate_f32(ReduceOp op, float* acc, const float* a, int ainc, int64_t n);
// The same for rows.rows rows of `a` (row stride rows.a) in order into one accumulator row.
void accumulate_f32_rows(ReduceOp op, const Rows& rows, float* acc, const float* a, int ainc,
                         int64_t n);
void accumulate_i32(ReduceOp op, int32_t* acc, const int32_t* a, int ainc, int64_t n);
void accumulate_i64(ReduceOp op, int64_t* acc, const int64_t* a, int ainc, int64_t n);
// Fill dst[0..n) with the identity of `op` (Sum 0, Prod 1, Max -inf / INT_MIN, Min +inf /
// INT_MAX, ArgMax/ArgMin: as Max/Min).
void fill_identity(ReduceOp op, CType t, void* dst, int64_t n);

// Arg reductions (ArgMax / ArgMin): the first extreme element wins; NaN counts as the
// extreme (the first NaN wins). Element i of `a` has index base + i.
// Along a row: (*vacc, *iacc) = better of (*vacc, *iacc) and the row's best.
void argreduce_row_f32(ReduceOp op, float* vacc, int64_t* iacc, const float* a, int ainc, int64_t n,
                       int64_t base);
void argreduce_row_i32(ReduceOp op, int32_t* vacc, int64_t* iacc, const int32_t* a, int ainc,
                       int64_t n, int64_t base);
void argreduce_row_i64(ReduceOp op, int64_t* vacc, int64_t* iacc, const int64_t* a, int ainc,
                       int64_t n, int64_t base);
// Elementwise: where a[i] is strictly better than vacc[i] (or a NaN first seen), take a[i]
// with index `index`. Rows are visited in increasing index order, so ties keep the first.
void argaccumulate_f32(ReduceOp op, float* vacc, int64_t* iacc, const float* a, int ainc, int64_t n,
                       int64_t index);
void argaccumulate_i32(ReduceOp op, int32_t* vacc, int64_t* iacc, const int32_t* a, int ainc,
                       int64_t n, int64_t index);
void argaccumulate_i64(ReduceOp op, int64_t* vacc, int64_t* iacc, const int64_t* a, int ainc,
                       int64_t n, int64_t index);

// Fused multiply-add: dst[i] = a[i] * b[i] + c[i] (f32).
void fma_f32(float* dst, const float* a, int ainc, const float* b, int binc, const float* c,
             int cinc, int64_t n);
void fma_f32_rows(const Rows& rows, float* dst, const float* a, int ainc, const float* b, int binc,
                  const float* c, int cinc, int64_t n);

// A pair of chain instructions in one pass: dst[i] = g[i] * c[i], where the producer g is
// a[i] * b[i] (kind kFusedMul), op(a[i]) (kFusedUnary; b unused) or op(a[i] + b[i]) /
// op(a[i] - b[i]) (kFusedUnaryPre, pre 1 / 2), op one that fused_mul_supported. The
// intermediate is never stored; the same bits as the two instructions apart. Row strides:
// rows.a, rows.b, rows.c of a, b, c.
inline constexpr int kFusedMul = 0, kFusedUnary = 1, kFusedUnaryPre = 2;
bool fused_mul_supported(UnaryOp op);
void fused_mul_f32_rows(int kind, UnaryOp op, int pre, const Rows& rows, float* dst, const float* a,
                        int ainc, const float* b, int binc, const float* c, int cinc, int64_t n);

// A product feeding an fma's addend in one pass: dst[i] = p[i] * q[i] + (+-a[i] * b[i])
// (negate: the product of -a), the same bits as the mul (and neg) and the fma apart, the
// product never stored (rotary embedding, complex products). Row and outer strides: a, b:
// rows.a/oa, rows.b/ob; p: rows.c/oc; q: rows.e/oe.
void fused_mul_add_f32_rows(bool negate, const Rows& rows, float* dst, const float* a, int ainc,
                            const float* b, int binc, const float* p, int pinc, const float* q,
                            int qinc, int64_t n);

// Streaming stores: while on (this thread), the f32 maps (unary with a factor, binary, fma,
// the fused products) write the full vectors of rows that start on a vector boundary with
// non-temporal stores, around the caches. For outputs far larger than the last-level cache,
// which nothing reads before they would be evicted anyway, this saves each line's read for
// ownership (a 16M-element stream: 7.4 -> 5.2 ms on Zen 4). Only for memory destinations:
// the interpreter turns it on around such calls. stream_fence() orders the streamed stores
// before the caller's later stores (another thread may read them after a barrier).
void set_stream_stores(bool on);
void stream_fence();

// Memory a streamed launch's next block will read, prefetched by this block's kernels two
// lines per loop iteration (every Map*, row reduction and dot kernel drains it), so that the next
// block's first pass finds its rows in L2 instead of waiting on DRAM while this block's later
// passes, which read their rows from L2, leave the memory bus idle. Per thread; spans in
// bytes, drained first to last.
struct PrefetchQueue {
  static constexpr int kMaxSpans = 4;
  const char* next[kMaxSpans] = {};
  const char* end[kMaxSpans] = {};
  int spans = 0;  // spans [first, spans) are left
  int first = 0;
};
void set_prefetch_queue(const PrefetchQueue& q);
void clear_prefetch_queue();

// The operands of one fused_mul_add_f32_rows call.
struct MulAddArgs {
  bool negate = false;
  Rows rows;
  float* dst = nullptr;
  const float *a = nullptr, *b = nullptr, *p = nullptr, *q = nullptr;
  int ainc = 1, binc = 1, pinc = 1, qinc = 1;
};

// Two fused_mul_add_f32_rows calls of equal rows, blocks (rows.outer) and n, row by row in
// one pass: x's row, then y's (rotary embedding's two halves, a complex product's real and
// imaginary parts, both reading the same rows). The same bits as the two calls apart when
// neither reads what the other writes.
void fused_mul_add_pair_f32_rows(const MulAddArgs& x, const MulAddArgs& y, int64_t n);

// One chain member with f16/bf16 memory on one side, converted in its own row loop: a
// converting load fused into the op that consumes it (a_type f16/bf16) and/or a converting
// store fused into the op that produces its value (d_type f16/bf16), so that no strip of f32
// goes through scratch between them. kind 0: op(a), op an activation that fused_mul_supported
// admits; kind 1: a op b, op add, sub or mul; kind 2: a * b + c. The same bits as the load,
// the op and the store apart. A half a or d is contiguous (inc 1); b and c have inc 0 or 1.
struct HalfMapArgs {
  int kind = 0;
  int op = 0;  // UnaryOp (kind 0) or BinaryOp (kind 1)
  DType a_type = DType::kF32, d_type = DType::kF32;
  Rows rows;
  void* dst = nullptr;
  const void* a = nullptr;
  const float *b = nullptr, *c = nullptr;
  int binc = 0, cinc = 0;
  int64_t n = 0;
};
// Can half_map_f32_rows run this member (plan time: its result must never be false)?
bool half_map_supported(int kind, int op, DType a_type, DType d_type);
// False when the arguments are outside the forms above (nothing written).
bool half_map_f32_rows(const HalfMapArgs& m);

// dst[r * drs + c] = src[c * scs + r], r < rows, c < cols (f32): a transposed copy, in
// register blocks where the target allows. `from_dram`: the launch's data exceed the caches,
// so the source's columns are prefetched a few ahead.
void transpose_f32(float* dst, int64_t drs, const float* src, int64_t scs, int64_t rows,
                   int64_t cols, bool from_dram = false);

// A map and the row reduction of its result in one pass: dst = y = a + b, a - b, a * b
// (kind 0, op a BinaryOp), exp(a + b) / exp(a - b) (kind 1, op UnaryOp::kExp, pre 1 / 2) or
// a * b + c (kind 2, c contiguous), stored as the map kernels store it, and out[r] = row r's
// sum (kRowSum), max (kRowMax) or sum of squares (kRowSumSquares) of y, the same bits as
// reduce_row_f32_rows (dot_row_f32_rows for squares) over the stored y, which is not read
// again; or the sum of exp(y) (kRowSumExp: log-softmax's centered rows are stored and their
// exponentials only summed), the same bits as unary exp then reduce_row_f32_rows. a contiguous
// along its rows, b contiguous or one value per row; c (kind 2) with row stride rows.c.
// Returns false, having done nothing, for other ops and operand forms.
inline constexpr int kRowSum = 0, kRowMax = 1, kRowSumSquares = 2, kRowSumExp = 3;
bool map_reduce_f32_rows(int kind, int op, int pre, int red, const Rows& rows, float* dst,
                         const float* a, int ainc, const float* b, int binc, const float* c,
                         int cinc, int64_t n, float* out);

// A product feeding an fma's factor in one pass: dst[i] = (a[i] * b[i]) * c[i] + e[i], the
// same bits as the mul and the fma apart, the product never stored (layernorm's
// (x - mean) * rstd * weight + bias). Row and outer strides: a, b: rows.a/oa, rows.b/ob; c:
// rows.c/oc; e: rows.e/oe.
void fused_mul_fma_f32_rows(const Rows& rows, float* dst, const float* a, int ainc, const float* b,
                            int binc, const float* c, int cinc, const float* e, int einc,
                            int64_t n);

// Name of the SIMD target the dispatcher picked (e.g. "AVX3", "AVX2").
const char* simd_target_name();

}  // namespace dvm::vm::cpu
