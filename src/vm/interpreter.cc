// The CPU interpreter. One dispatch loop (run_block) with small cases; each case resolves its
// operands to (pointer, row stride, column increment) and calls a row kernel per tile row.
// Programs are verified before they get here, so nothing is bounds-checked.
#include "vm/interpreter.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <tuple>
#include <utility>

#include "base/thread_pool.h"
#include "ops/scalar_ops.h"
#include "vm/cpu/gemm.h"
#include "vm/cpu/tile_kernels.h"
#include "vm/weight_cache.h"

namespace dvm::vm {

namespace {

using bc::Instr;
using bc::Operand;
using bc::OperandKind;
using bc::TileClass;

constexpr int kRegElemBytes = 8;

// A resolved operand: element (r, c) is at p + (r * rs + c * cs) * elem_size.
struct Ref {
  char* p;
  int64_t rs;
  int64_t cs;
};

int ctype_size(CType t) {
  return t == CType::kI64 ? 8 : 4;
}

// A register's element strides (row, column) by its class: a full tile is laid out with the
// program's row stride, a row or column register is one contiguous run, a scalar one value.
std::pair<int64_t, int64_t> reg_strides(TileClass cls, int64_t row_stride) {
  switch (cls) {
    case TileClass::kFull:
      return {row_stride, 1};
    case TileClass::kRow:
      return {1, 0};
    case TileClass::kCol:
      return {0, 1};
    case TileClass::kScalar:
      return {0, 0};
  }
  return {0, 0};
}

struct Frame {
  int32_t loop_pc;
  int32_t axis;
  int64_t trip;
  int64_t end;
};

// A Chain (see isa.def): the body runs strip by strip, kChainStrip columns of one row at a
// time; chain-local registers live in per-strip scratch (L1), every other operand is read
// or written in place. The verifier guarantees the strips see what whole-tile passes would.
constexpr int64_t kChainStrip = 1024;

// Memory the chains of a loop touch per batch of trips (exec_loop_of_chains): L1's size.
constexpr int64_t kLoopBatchBytes = 32 * 1024;

struct ChainOperand {
  char* p;
  int64_t rs, cs;
  int64_t os;   // stride between trips of the loop the chain runs over (elements)
  int scratch;  // >= 0: a chain-local register, held in this scratch strip
  int es;       // element bytes: f32, or a load's or store's f16/bf16 memory
};

// Streaming stores on for one instruction's kernel calls (a memory destination of a launch
// beyond the last-level cache), off again after.
class StreamScope {
 public:
  explicit StreamScope(bool on) : on_(on) {
    if (on_) cpu::set_stream_stores(true);
  }
  ~StreamScope() {
    if (on_) cpu::set_stream_stores(false);
  }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  bool on_;
};

// Row programs of streamed launches drain the next block's prefetch queue (set_row_block_prefetch)
// where their rows are at most kMaxQueuedRowBytes long.
std::atomic<bool> g_row_block_prefetch{true};
constexpr int64_t kMaxQueuedRowBytes = 4096;

class BlockRunner {
 public:
  // band_rows > 0: blocks run as row programs, in bands of this many rows.
  BlockRunner(const LoadedProgram& lp, const LaunchArgs& args, char* regs, int64_t band_rows)
      : lp_(lp),
        p_(lp.program),
        args_(args),
        regs_(regs),
        reg_bytes_(lp.program.reg_elems * kRegElemBytes),
        num_descs_(lp.desc_offset.size()),
        band_rows_(band_rows) {
    if (num_descs_ > kInlineDescs) {  // rare: the common programs need no allocation per launch
      desc_off_heap_.resize(num_descs_);
      desc_off_ = desc_off_heap_.data();
    }
  }

  // Runs block `block`; `next` >= 0: queues that block's memory for prefetching once this
  // one's first pass over it has run (LoadedProgram::prefetch_at).
  void run(int64_t block, int64_t next = -1);

 private:
  void run_row_program(bool drain_queue) const;
  void set_axis(int axis, int64_t trip);
  void trip_range(int axis, int64_t* begin, int64_t* end) const {
    const bc::Axis& ax = p_.axes[axis];
    int64_t t = ax.trips();
    *begin = 0;
    *end = t;
    if (ax.split_by < 0) return;
    int64_t g = ivar_[ax.split_by], parts = p_.axes[ax.split_by].extent;
    *begin = t * g / parts;
    *end = t * (g + 1) / parts;
  }
  Ref resolve(const Operand& o, CType t) const;
  void exec(const Instr& in);
  bool exec_small(const Instr& in);
  void exec_unary(const Instr& in);
  void exec_unary_pre(const Instr& in);
  void exec_binary(const Instr& in);
  void exec_data(const Instr& in);
  void exec_reduce(const Instr& in);
  void exec_argreduce(const Instr& in);
  void exec_matmul(const Instr& in);
  // This runner's name for the GEMM's kept operands (cpu::gemm_f32_bt_in_place's a_token):
  // unique per runner, so no other launch's memory is mistaken for this one's.
  uint64_t gemm_token() {
    static std::atomic<uint64_t> next{1};
    if (gemm_token_ == 0) gemm_token_ = next.fetch_add(1, std::memory_order_relaxed);
    return gemm_token_;
  }
  // The GEMM's operands: A's row and K strides (a_rs, ak), B's K stride bk (and b.cs).
  bool bf16_dot(const bc::Descriptor& db, const Ref& b, int64_t k, int64_t bk, int64_t rows,
                int64_t a_rs, int64_t ak) const;
  bool skinny(const bc::Descriptor& db, const Ref& b, int64_t k, int64_t bk, int64_t rows,
              int64_t a_rs, int64_t ak) const;
  bool transposed_b_in_place(const bc::Descriptor& db, const Ref& b, int64_t k, int64_t bk,
                             int64_t rows, int64_t a_rs, int64_t ak) const;
  int64_t product_rows(int64_t rows) const;
  const float* packed_b(const bc::Descriptor& db, const Ref& b, int64_t k, int64_t bk, int64_t rows,
                        int64_t a_rs, int64_t ak);
  void exec_reduce_dot(const Instr& in);
  bool exec_map_reduce(int32_t pc);
  using ChainOps = ChainOperand[bc::kMaxChainBody][4];
  void prepare_chain(int32_t pc, int axis, ChainOps& ops) const;
  void run_chain(int32_t pc, const ChainOps& ops, int64_t first, int64_t trips);
  void run_sum_exp(int32_t pc, const ChainOps& ops, int64_t first, int64_t trips);
  template <bool kDirect>
  void run_chain_impl(int32_t pc, const ChainOps& ops, int64_t first, int64_t trips);
  void exec_chain(int32_t pc, int axis = -1, int64_t trips = 1);
  cpu::MulAddArgs mul_add_args(int32_t pc, const ChainOps& ops, int64_t first, int64_t trips) const;
  void run_chain_pair(int32_t pc, const ChainOps& a, const ChainOps& b, int64_t first,
                      int64_t trips);
  int32_t exec_chain_pair(int32_t pc);
  void exec_loop_of_chains(int32_t pc, int64_t begin, int64_t end);
  bool exec_loop_col_reduce(int32_t pc, int64_t begin, int64_t end);
  int64_t rows_of(TileClass c) const { return bc::class_has_rows(c) ? active_rows_ : 1; }
  int64_t cols_of(TileClass c) const { return bc::class_has_cols(c) ? active_cols_ : 1; }

  const LoadedProgram& lp_;
  const bc::Program& p_;
  const LaunchArgs& args_;
  char* regs_;
  int64_t reg_bytes_;           // bytes between tile registers
  int64_t ivar_[bc::kMaxAxes];  // set per block by run()
  // Per descriptor: the byte offset of its element at the current position (ivar_), kept by
  // set_axis, so that resolving an operand is a lookup.
  static constexpr size_t kInlineDescs = 32;
  size_t num_descs_;
  int64_t desc_off_inline_[kInlineDescs];
  std::vector<int64_t> desc_off_heap_;
  int64_t* desc_off_ = desc_off_inline_;
  int64_t active_rows_ = 1;
  int64_t active_cols_ = 1;
  int64_t band_rows_ = 0;
  // The constant B this runner's tiles last multiplied by (one lookup per launch and thread).
  std::shared_ptr<const vm::PackedWeight> packed_;
  vm::WeightKey packed_key_;
  bool packed_looked_up_ = false;
  uint64_t gemm_token_ = 0;  // gemm_token(): 0 until the first matmul asks
};

void BlockRunner::set_axis(int axis, int64_t trip) {
  const bc::Axis& ax = p_.axes[axis];
  int64_t start = trip * ax.chunk;
  const int64_t delta = start - ivar_[axis];
  ivar_[axis] = start;
  if (delta != 0) {  // every descriptor's position follows (resolve reads it)
    const int64_t* step = lp_.desc_step.data() + axis;
    const size_t na = p_.axes.size();
    for (size_t i = 0; i < num_descs_; ++i) desc_off_[i] += delta * step[i * na];
  }
  int64_t active = std::min(ax.chunk, ax.extent - start);
  if (ax.tile == bc::AxisTile::kRow) active_rows_ = active;
  if (ax.tile == bc::AxisTile::kCol) active_cols_ = active;
}

// Inline: every instruction resolves two to four operands, most of them memory.
[[gnu::always_inline]] inline Ref BlockRunner::resolve(const Operand& o, CType t) const {
  if (o.kind == OperandKind::kDesc) {
    return Ref{static_cast<char*>(args_.slots[lp_.desc_slot[o.index]]) + desc_off_[o.index],
               lp_.desc_rs[o.index], lp_.desc_cs[o.index]};
  }
  if (o.kind == OperandKind::kReg) {
    const auto [rs, cs] = reg_strides(o.cls, p_.reg_row_stride);
    return Ref{regs_ + static_cast<int64_t>(o.index) * reg_bytes_, rs, cs};
  }
  const bc::Constant& c =
      o.kind == OperandKind::kConst ? p_.consts[o.index] : args_.params[o.index];
  const void* v = t == CType::kF32   ? static_cast<const void*>(&c.f32)
                  : t == CType::kI32 ? static_cast<const void*>(&c.i32)
                                     : static_cast<const void*>(&c.i64);
  return Ref{const_cast<char*>(static_cast<const char*>(v)), 0, 0};
}

// op(A + B) / op(A - B): the pre-op flag folds a preceding add/sub into the unary's pass.
void BlockRunner::exec_unary_pre(const Instr& in) {
  UnaryOp op = bc::unary_of(in.op);
  Ref d = resolve(in.d, CType::kF32);
  Ref a = resolve(in.a, CType::kF32);
  Ref b = resolve(in.b, CType::kF32);
  int64_t rows = rows_of(in.cls), cols = cols_of(in.cls);
  cpu::unary_pre_f32_rows(op, in.flags, cpu::Rows{rows, d.rs, a.rs, b.rs},
                          reinterpret_cast<float*>(d.p), reinterpret_cast<const float*>(a.p),
                          static_cast<int>(a.cs), reinterpret_cast<const float*>(b.p),
                          static_cast<int>(b.cs), cols);
}

void BlockRunner::exec_unary(const Instr& in) {
  if (in.flags != 0) {
    exec_unary_pre(in);
    return;
  }
  UnaryOp op = bc::unary_of(in.op);
  bool pred = ops::is_predicate(op);
  Ref d = resolve(in.d, pred ? CType::kI32 : in.ctype);
  Ref a = resolve(in.a, in.ctype);
  int es = ctype_size(in.ctype);
  int ds = pred ? 4 : es;
  int64_t rows = rows_of(in.cls), cols = cols_of(in.cls);
  if (!pred && in.ctype == CType::kF32) {  // one call for the whole tile
    cpu::unary_f32_rows(op, cpu::Rows{rows, d.rs, a.rs}, reinterpret_cast<float*>(d.p),
                        reinterpret_cast<const float*>(a.p), static_cast<int>(a.cs), cols);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    char* dp = d.p + r * d.rs * ds;
    const char* ap = a.p + r * a.rs * es;
    int ai = static_cast<int>(a.cs);
    if (pred) {
      auto* o = reinterpret_cast<int32_t*>(dp);
      if (in.ctype == CType::kF32)
        cpu::predicate_f32(op, o, reinterpret_cast<const float*>(ap), ai, cols);
      if (in.ctype == CType::kI32)
        cpu::predicate_i32(op, o, reinterpret_cast<const int32_t*>(ap), ai, cols);
      if (in.ctype == CType::kI64)
        cpu::predicate_i64(op, o, reinterpret_cast<const int64_t*>(ap), ai, cols);
    } else if (in.ctype == CType::kF32) {
      cpu::unary_f32(op, reinterpret_cast<float*>(dp), reinterpret_cast<const float*>(ap), ai,
                     cols);
    } else if (in.ctype == CType::kI32) {
      cpu::unary_i32(op, reinterpret_cast<int32_t*>(dp), reinterpret_cast<const int32_t*>(ap), ai,
                     cols);
    } else {
      cpu::unary_i64(op, reinterpret_cast<int64_t*>(dp), reinterpret_cast<const int64_t*>(ap), ai,
                     cols);
    }
  }
}

template <typename T>
const T* as(const Ref& r) {
  return reinterpret_cast<const T*>(r.p);
}

// Does the integer operand r (rows x cols, as resolved) hold a zero?
bool has_zero(CType t, const Ref& r, int64_t rows, int64_t cols) {
  const int64_t es = ctype_size(t);
  const int64_t n = r.cs == 0 ? 1 : cols;
  for (int64_t i = 0; i < rows; ++i) {
    const char* row = r.p + i * r.rs * es;
    for (int64_t j = 0; j < n; ++j) {
      const char* e = row + j * r.cs * es;
      const bool zero = t == CType::kI32 ? *reinterpret_cast<const int32_t*>(e) == 0
                                         : *reinterpret_cast<const int64_t*>(e) == 0;
      if (zero) return true;
    }
    if (r.rs == 0) break;
  }
  return false;
}

void BlockRunner::exec_binary(const Instr& in) {
  BinaryOp op = bc::binary_of(in.op);
  bool cmp = ops::returns_bool(op);
  Ref d = resolve(in.d, cmp ? CType::kI32 : in.ctype);
  Ref a = resolve(in.a, in.ctype);
  Ref b = resolve(in.b, in.ctype);
  int es = ctype_size(in.ctype);
  int ds = cmp ? 4 : es;
  int64_t rows = rows_of(in.cls), cols = cols_of(in.cls);
  if (!cmp && in.ctype == CType::kF32) {  // one call for the whole tile
    cpu::binary_f32_rows(op, cpu::Rows{rows, d.rs, a.rs, b.rs}, reinterpret_cast<float*>(d.p),
                         as<float>(a), static_cast<int>(a.cs), as<float>(b), static_cast<int>(b.cs),
                         cols);
    return;
  }
  if (args_.fault != nullptr && in.ctype != CType::kF32 && ops::is_division(op) &&
      has_zero(in.ctype, b, rows, cols)) {
    args_.fault->store(static_cast<int>(op) + 1, std::memory_order_relaxed);
  }
  for (int64_t r = 0; r < rows; ++r) {
    char* dp = d.p + r * d.rs * ds;
    Ref ar{a.p + r * a.rs * es, 0, a.cs}, br{b.p + r * b.rs * es, 0, b.cs};
    int ai = static_cast<int>(a.cs), bi = static_cast<int>(b.cs);
    if (cmp) {
      auto* o = reinterpret_cast<int32_t*>(dp);
      if (in.ctype == CType::kF32)
        cpu::compare_f32(op, o, as<float>(ar), ai, as<float>(br), bi, cols);
      if (in.ctype == CType::kI32)
        cpu::compare_i32(op, o, as<int32_t>(ar), ai, as<int32_t>(br), bi, cols);
      if (in.ctype == CType::kI64)
        cpu::compare_i64(op, o, as<int64_t>(ar), ai, as<int64_t>(br), bi, cols);
    } else if (in.ctype == CType::kF32) {
      cpu::binary_f32(op, reinterpret_cast<float*>(dp), as<float>(ar), ai, as<float>(br), bi, cols);
    } else if (in.ctype == CType::kI32) {
      cpu::binary_i32(op, reinterpret_cast<int32_t*>(dp), as<int32_t>(ar), ai, as<int32_t>(br), bi,
                      cols);
    } else {
      cpu::binary_i64(op, reinterpret_cast<int64_t*>(dp), as<int64_t>(ar), ai, as<int64_t>(br), bi,
                      cols);
    }
  }
}

void BlockRunner::exec_data(const Instr& in) {
  int64_t rows = rows_of(in.cls), cols = cols_of(in.cls);
  int es = ctype_size(in.ctype);
  switch (in.op) {
    case bc::Opcode::kLoad: {
      Ref d = resolve(in.d, in.ctype);
      const bc::Descriptor& desc = p_.descs[in.a.index];
      Ref s = resolve(in.a, in.ctype);
      int ss = dtype_size(desc.dtype);
      if (desc.dtype == DType::kF32 && s.rs == 1 && s.cs != 1 && s.cs != 0 && rows > 1) {
        // Transposed source (contiguous along the tile's rows): read it a column at a time,
        // contiguously, and write the register (L1) strided, instead of gathering rows.
        cpu::transpose_f32(reinterpret_cast<float*>(d.p), d.rs, reinterpret_cast<const float*>(s.p),
                           s.cs, rows, cols, args_.stream_stores);
        return;
      }
      if (desc.dtype == DType::kF32 && in.ctype == CType::kF32 && s.cs != 1 && rows > 1) {
        cpu::load_strided_f32_rows(reinterpret_cast<float*>(d.p), d.rs,
                                   reinterpret_cast<const float*>(s.p), s.rs, s.cs, rows, cols);
        return;
      }
      for (int64_t r = 0; r < rows; ++r)
        cpu::load_convert(d.p + r * d.rs * es, desc.dtype, s.p + r * s.rs * ss, s.cs, cols);
      return;
    }
    case bc::Opcode::kStore: {
      const bc::Descriptor& desc = p_.descs[in.d.index];
      Ref d = resolve(in.d, in.ctype);
      Ref s = resolve(in.a, in.ctype);
      int ds = dtype_size(desc.dtype);
      if (desc.dtype == DType::kF32 && in.ctype == CType::kF32 && d.rs == 1 && d.cs != 1 &&
          d.cs != 0 && s.cs == 1 && rows > 1) {
        // Transposed destination: written a column at a time, contiguously.
        // dst element (r, c) at c * d.cs + r: the transpose of a cols x rows copy.
        cpu::transpose_f32(reinterpret_cast<float*>(d.p), d.cs, reinterpret_cast<const float*>(s.p),
                           s.rs, cols, rows);
        return;
      }
      for (int64_t r = 0; r < rows; ++r) {
        cpu::store_convert(desc.dtype, d.p + r * d.rs * ds, d.cs, s.p + r * s.rs * es,
                           static_cast<int>(s.cs), cols);
      }
      return;
    }
    case bc::Opcode::kMov: {
      Ref d = resolve(in.d, in.ctype);
      Ref s = resolve(in.a, in.ctype);
      for (int64_t r = 0; r < rows; ++r) {
        cpu::convert(in.ctype, d.p + r * d.rs * es, in.ctype, s.p + r * s.rs * es,
                     static_cast<int>(s.cs), cols);
      }
      return;
    }
    case bc::Opcode::kCast: {
      CType to = static_cast<CType>(in.aux);
      Ref d = resolve(in.d, to);
      Ref s = resolve(in.a, in.ctype);
      for (int64_t r = 0; r < rows; ++r) {
        cpu::convert(to, d.p + r * d.rs * ctype_size(to), in.ctype, s.p + r * s.rs * es,
                     static_cast<int>(s.cs), cols);
      }
      return;
    }
    case bc::Opcode::kRoundF16:
    case bc::Opcode::kRoundBF16: {
      Ref d = resolve(in.d, in.ctype);
      Ref s = resolve(in.a, in.ctype);
      for (int64_t r = 0; r < rows; ++r) {
        auto* dp = reinterpret_cast<float*>(d.p + r * d.rs * 4);
        auto* sp = reinterpret_cast<const float*>(s.p + r * s.rs * 4);
        if (in.op == bc::Opcode::kRoundF16) {
          cpu::round_to_f16(dp, sp, static_cast<int>(s.cs), cols);
        } else {
          cpu::round_to_bf16(dp, sp, static_cast<int>(s.cs), cols);
        }
      }
      return;
    }
    case bc::Opcode::kSelect: {
      Ref d = resolve(in.d, in.ctype);
      Ref c = resolve(in.a, CType::kI32);
      Ref a = resolve(in.b, in.ctype);
      Ref b = resolve(in.c, in.ctype);
      for (int64_t r = 0; r < rows; ++r) {
        cpu::select(es, d.p + r * d.rs * es, reinterpret_cast<const int32_t*>(c.p + r * c.rs * 4),
                    static_cast<int>(c.cs), a.p + r * a.rs * es, static_cast<int>(a.cs),
                    b.p + r * b.rs * es, static_cast<int>(b.cs), cols);
      }
      return;
    }
    case bc::Opcode::kFma: {
      Ref d = resolve(in.d, in.ctype);
      Ref a = resolve(in.a, in.ctype);
      Ref b = resolve(in.b, in.ctype);
      Ref c = resolve(in.c, in.ctype);
      cpu::fma_f32_rows(cpu::Rows{rows, d.rs, a.rs, b.rs, c.rs}, reinterpret_cast<float*>(d.p),
                        reinterpret_cast<const float*>(a.p), static_cast<int>(a.cs),
                        reinterpret_cast<const float*>(b.p), static_cast<int>(b.cs),
                        reinterpret_cast<const float*>(c.p), static_cast<int>(c.cs), cols);
      return;
    }
    case bc::Opcode::kMatMul:
      exec_matmul(in);
      return;
    default:
      return;
  }
}

// acc op= sum of A * B over the masked tile axes: a dot product per row (columns reduced) or a
// fused multiply-add into the accumulator row (rows reduced / no tile axis reduced).
void BlockRunner::exec_reduce_dot(const Instr& in) {
  Ref acc = resolve(in.d, CType::kF32);
  Ref a = resolve(in.a, CType::kF32);
  Ref b = resolve(in.b, CType::kF32);
  bool red_rows = bc::aux_rows(in.aux), red_cols = bc::aux_cols(in.aux);
  int64_t rows = rows_of(in.cls), cols = cols_of(in.cls);
  auto* ap = reinterpret_cast<float*>(acc.p);
  auto* xa = reinterpret_cast<const float*>(a.p);
  auto* xb = reinterpret_cast<const float*>(b.p);
  int ai = static_cast<int>(a.cs), bi = static_cast<int>(b.cs);
  const int64_t ars = red_rows ? 0 : acc.rs;  // reduced rows all accumulate into row 0
  if (red_cols) {
    cpu::dot_row_f32_rows(cpu::Rows{rows, ars, a.rs, b.rs}, ap, xa, ai, xb, bi, cols);
  } else {
    cpu::fma_f32_rows(cpu::Rows{rows, ars, a.rs, b.rs, ars}, ap, xa, ai, xb, bi, ap, 1, cols);
  }
}

// A map and the reduction of its result (LoadedProgram::map_reduce) in one pass: the map
// stores its result and the per-row reductions are combined into the accumulator after the
// fill between them has run, as the instructions apart would. False (nothing done) when the
// kernel does not take these operands; the caller then runs the instructions one by one.
bool BlockRunner::exec_map_reduce(int32_t pc) {
  constexpr int64_t kMaxRows = 256;
  const Instr& map = lp_.instrs[pc];
  const int extra = lp_.map_reduce[pc];
  const Instr& red = lp_.instrs[pc + extra];
  const int64_t rows = rows_of(map.cls), cols = cols_of(map.cls);
  if (rows > kMaxRows) return false;
  const Ref d = resolve(map.d, CType::kF32);
  const Ref a = resolve(map.a, CType::kF32);
  const Ref b = resolve(map.b, CType::kF32);
  const bool fma = map.op == bc::Opcode::kFma;
  const Ref c = fma ? resolve(map.c, CType::kF32) : a;
  const bool binary = bc::is_binary(map.op);
  const int map_kind = fma ? 2 : binary ? 0 : 1;
  const int op = fma      ? 0
                 : binary ? static_cast<int>(bc::binary_of(map.op))
                          : static_cast<int>(bc::unary_of(map.op));
  const ReduceOp rop =
      red.op == bc::Opcode::kReduceDot ? ReduceOp::kSum : bc::aux_reduce_op(red.aux);
  const int kind = red.op == bc::Opcode::kReduceDot ? cpu::kRowSumSquares
                   : rop == ReduceOp::kMax          ? cpu::kRowMax
                                                    : cpu::kRowSum;
  float out[kMaxRows];
  if (!cpu::map_reduce_f32_rows(
          map_kind, op, map.flags, kind, cpu::Rows{rows, d.rs, a.rs, b.rs, c.rs},
          reinterpret_cast<float*>(d.p), reinterpret_cast<const float*>(a.p),
          static_cast<int>(a.cs), reinterpret_cast<const float*>(b.p), static_cast<int>(b.cs),
          reinterpret_cast<const float*>(c.p), static_cast<int>(c.cs), cols, out))
    return false;
  if (extra == 2) exec(lp_.instrs[pc + 1]);  // the accumulator's fill
  const Ref acc = resolve(red.d, CType::kF32);
  for (int64_t r = 0; r < rows; ++r) {
    auto* ar = reinterpret_cast<float*>(acc.p) + r * acc.rs;
    *ar = ops::reduce_combine_f32(rop, *ar, out[r]);
  }
  return true;
}

// Can the top-level instruction at `pc` and the reduction after it (a fill between) run as
// one map_reduce pass? 0: no; else how far the reduction is (1 or 2).
int map_reduce_pair(const std::vector<Instr>& code, size_t pc) {
  const Instr& map = code[pc];
  const auto full_reg = [](const Operand& o) {
    return o.kind == OperandKind::kReg && o.cls == TileClass::kFull;
  };
  if (map.ctype != CType::kF32 || map.cls != TileClass::kFull || !full_reg(map.d)) return 0;
  if (map.op == bc::Opcode::kFma) {
    if (map.flags != 0) return 0;
  } else if (bc::is_binary(map.op)) {
    const BinaryOp op = bc::binary_of(map.op);
    if (map.flags != 0 || (op != BinaryOp::kAdd && op != BinaryOp::kSub && op != BinaryOp::kMul))
      return 0;
  } else if (!bc::is_unary(map.op) || bc::unary_of(map.op) != UnaryOp::kExp ||
             (map.flags != 1 && map.flags != 2)) {
    return 0;
  }
  size_t k = pc + 1;
  const Instr* fill = nullptr;
  if (k < code.size() && code[k].op == bc::Opcode::kFill) fill = &code[k++];
  if (k >= code.size()) return 0;
  const Instr& red = code[k];
  const int y = map.d.index;
  const auto is_y = [&](const Operand& o) { return full_reg(o) && o.index == y; };
  if (red.ctype != CType::kF32 || red.cls != TileClass::kFull || !bc::aux_cols(red.aux) ||
      bc::aux_rows(red.aux) || red.d.kind != OperandKind::kReg || red.d.index == y)
    return 0;
  if (red.op == bc::Opcode::kReduceDot) {
    if (!is_y(red.a) || !is_y(red.b) || bc::aux_reduce_op(red.aux) != ReduceOp::kSum) return 0;
  } else if (red.op == bc::Opcode::kReduce) {
    const ReduceOp r = bc::aux_reduce_op(red.aux);
    if (!is_y(red.a) || (r != ReduceOp::kSum && r != ReduceOp::kMean && r != ReduceOp::kMax))
      return 0;
  } else {
    return 0;
  }
  // The fill must initialise the reduction's accumulator and leave the map's result alone.
  if (fill != nullptr &&
      (fill->d.kind != OperandKind::kReg || fill->d.index != red.d.index || fill->d.index == y))
    return 0;
  return static_cast<int>(k - pc);
}

// Fields a chain body instruction uses, d first: d, a (unary); d, a, b (binary, or a unary
// with a pre-op); d, a, b, c (fma).
int chain_fields(const Instr& in) {
  if (in.op == bc::Opcode::kFma) return 4;
  if (in.op == bc::Opcode::kReduceDot) return 3;
  return in.flags != 0 || bc::is_binary(in.op) ? 3 : 2;
}

// Is `o` register `reg`?
bool is_reg(const Operand& o, int reg) {
  return o.kind == OperandKind::kReg && o.index == reg;
}

// Does body instruction `in` read register `reg` (as a source)?
bool reads_reg(const Instr& in, int reg) {
  const Operand* src[3] = {&in.a, &in.b, &in.c};
  for (int f = 1; f < chain_fields(in); ++f)
    if (is_reg(*src[f - 1], reg)) return true;
  return false;
}

// Is `reg` read by body[from..k) before being redefined?
bool read_again(const Instr* body, int k, int from, int reg) {
  for (int j = from; j < k; ++j) {
    if (reads_reg(body[j], reg)) return true;
    if (body[j].d.kind == OperandKind::kReg && body[j].d.index == reg) return false;
  }
  return false;
}

// The operands of a fused (neg,) mul, fma group at body[i] (kFuseMulFma, kFuseNegMulFma):
// the product's factors *x (the neg's source when negated) and *y, and the fma's d, p, q.
void mul_add_sources(const Instr* body, int i, bool neg, const ChainOperand (*ops)[4],
                     const ChainOperand** x, const ChainOperand** y, const ChainOperand** fo) {
  const int mi = neg ? i + 1 : i;
  *fo = ops[mi + 1];  // the fma: d, p, q (its addend is the mul's)
  *x = &ops[mi][1];   // the mul's factors
  *y = &ops[mi][2];
  if (neg) {  // the neg's source replaces the factor that is the neg's result
    const bool neg_first = is_reg(body[mi].a, body[i].d.index);
    *y = neg_first ? &ops[mi][2] : &ops[mi][1];
    *x = &ops[i][1];
  }
}

// Resolves the operands of the chain at `pc` at the current position: per body instruction
// and field, the memory it reads or writes in place (with its stride between trips of loop
// axis `axis`, -1: none) or the scratch strip of a chain-local register.
void BlockRunner::prepare_chain(int32_t pc, int axis, ChainOps& ops) const {
  using Field = LoadedProgram::ChainField;
  const int k = bc::chain_length(lp_.instrs[pc].aux);
  const int64_t loop_step = axis >= 0 ? p_.axes[axis].chunk : 0;
  for (int i = 0; i < k; ++i) {
    const std::array<Field, 4>& fields = lp_.chain_field[pc + 1 + i];
    for (int f = 0; f < 4; ++f) {
      const Field& t = fields[f];
      ChainOperand& o = ops[i][f];
      switch (t.kind) {
        case Field::kUnused:
          o = ChainOperand{nullptr, 0, 0, 0, -1, 4};
          break;
        case Field::kScratch:
          o = ChainOperand{nullptr, 0, 1, 0, t.scratch, 4};
          break;
        case Field::kDesc:
          o = ChainOperand{
              static_cast<char*>(args_.slots[lp_.desc_slot[t.index]]) + desc_off_[t.index],
              t.rs,
              t.cs,
              axis >= 0 ? p_.descs[t.index].stride[axis] * loop_step : 0,
              -1,
              t.es};
          break;
        case Field::kReg:
          o = ChainOperand{regs_ + t.reg_bytes, t.rs, t.cs, 0, -1, 4};
          break;
        case Field::kConst:
          o = ChainOperand{
              reinterpret_cast<char*>(const_cast<float*>(&p_.consts[t.index].f32)), 0, 0, 0, -1, 4};
          break;
        case Field::kParam:
          o = ChainOperand{reinterpret_cast<char*>(const_cast<float*>(&args_.params[t.index].f32)),
                           0,
                           0,
                           0,
                           -1,
                           4};
          break;
      }
    }
  }
}

// The block-invariant part of prepare_chain for the chain at `pc` (LoadedProgram::
// chain_field), from its strip plan (chain_slot).
void plan_chain_fields(LoadedProgram* lp, size_t pc) {
  using Field = LoadedProgram::ChainField;
  const bc::Program& prog = lp->program;
  const int64_t reg_bytes = prog.reg_elems * kRegElemBytes;
  const int k = bc::chain_length(lp->instrs[pc].aux);
  for (int i = 0; i < k; ++i) {
    const Instr& in = lp->instrs[pc + 1 + i];
    const std::array<int8_t, 4>& slot = lp->chain_slot[pc + 1 + i];
    std::array<Field, 4>& fields = lp->chain_field[pc + 1 + i];
    const Operand* operand[4] = {&in.d, &in.a, &in.b, &in.c};
    for (int f = 0; f < chain_fields(in); ++f) {
      Field& t = fields[f];
      const Operand& o = *operand[f];
      t.index = o.index;
      if (slot[f] >= 0) {
        t.kind = Field::kScratch;
        t.scratch = slot[f];
      } else if (o.kind == OperandKind::kDesc) {
        t.kind = Field::kDesc;
        t.rs = lp->desc_rs[o.index];
        t.cs = lp->desc_cs[o.index];
        t.es = lp->desc_es[o.index];
      } else if (o.kind == OperandKind::kReg) {
        t.kind = Field::kReg;
        t.reg_bytes = static_cast<int64_t>(o.index) * reg_bytes;
        std::tie(t.rs, t.cs) = reg_strides(o.cls, prog.reg_row_stride);
      } else {
        t.kind = o.kind == OperandKind::kConst ? Field::kConst : Field::kParam;
      }
    }
  }
}

// Runs the chain at `pc` for `trips` consecutive trips of loop axis `axis` (trips 1, axis -1:
// once at the current position). Several trips form a 3-D block (cpu::Rows::outer) when a
// trip's rows fit a strip: one kernel call covers several trips of a small tile.
void BlockRunner::exec_chain(int32_t pc, int axis, int64_t trips) {
  ChainOps ops;
  prepare_chain(pc, axis, ops);
  run_chain(pc, ops, 0, trips);
}

// The kernel call of the chain at `pc`, a direct (neg,) mul, fma group (LoadedProgram::
// chain_pair), over trips [first, first + trips) from where `ops` were resolved.
cpu::MulAddArgs BlockRunner::mul_add_args(int32_t pc, const ChainOps& ops, int64_t first,
                                          int64_t trips) const {
  const Instr* body = &lp_.instrs[pc + 1];
  const bool neg = lp_.chain_fuse[pc + 1] == LoadedProgram::kFuseNegMulFma;
  const ChainOperand *x, *y, *fo;
  mul_add_sources(body, 0, neg, ops, &x, &y, &fo);
  const auto at = [first](const ChainOperand& o) {
    return reinterpret_cast<float*>(o.p + first * o.os * o.es);
  };
  cpu::MulAddArgs m;
  m.negate = neg;
  m.rows = cpu::Rows{rows_of(lp_.instrs[pc].cls), fo[0].rs, x->rs, y->rs, fo[1].rs};
  m.rows.e = fo[2].rs;
  m.rows.outer = trips;
  m.rows.od = fo[0].os;
  m.rows.oa = x->os;
  m.rows.ob = y->os;
  m.rows.oc = fo[1].os;
  m.rows.oe = fo[2].os;
  m.dst = at(fo[0]);
  m.a = at(*x);
  m.b = at(*y);
  m.p = at(fo[1]);
  m.q = at(fo[2]);
  m.ainc = static_cast<int>(x->cs);
  m.binc = static_cast<int>(y->cs);
  m.pinc = static_cast<int>(fo[1].cs);
  m.qinc = static_cast<int>(fo[2].cs);
  return m;
}

// Two chains that LoadedProgram::chain_pair joins, row by row in one pass.
void BlockRunner::run_chain_pair(int32_t pc, const ChainOps& a, const ChainOps& b, int64_t first,
                                 int64_t trips) {
  const int32_t next = pc + bc::chain_length(lp_.instrs[pc].aux) + 1;
  cpu::fused_mul_add_pair_f32_rows(mul_add_args(pc, a, first, trips),
                                   mul_add_args(next, b, first, trips),
                                   cols_of(lp_.instrs[pc].cls));
}

// Runs the chain pair at `pc` once at the current position; returns the last body
// instruction of the second chain.
int32_t BlockRunner::exec_chain_pair(int32_t pc) {
  const int32_t next = pc + bc::chain_length(lp_.instrs[pc].aux) + 1;
  const StreamScope stream(args_.stream_stores && lp_.chain_stream[pc] && lp_.chain_stream[next]);
  ChainOps a, b;
  prepare_chain(pc, -1, a);
  prepare_chain(next, -1, b);
  run_chain_pair(pc, a, b, 0, 1);
  return next + bc::chain_length(lp_.instrs[next].aux);
}

// A chain that stores y = a +- b (kept) and sums exp(y) along the columns
// (LoadedProgram::chain_sum_exp): one map_reduce pass per block of rows and trip, whole rows,
// the exponentials never stored.
void BlockRunner::run_sum_exp(int32_t pc, const ChainOps& ops, int64_t first, int64_t trips) {
  constexpr int64_t kMaxRows = 256;
  const Instr& head = lp_.instrs[pc];
  const int op = static_cast<int>(bc::binary_of(lp_.instrs[pc + 1].op));
  const int64_t rows = rows_of(head.cls), cols = cols_of(head.cls);
  const ChainOperand &y = ops[0][0], &a = ops[0][1], &b = ops[0][2], &acc = ops[2][0];
  float out[kMaxRows];
  for (int64_t t = 0; t < trips; ++t) {
    for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
      const int64_t nr = std::min(kMaxRows, rows - r0);
      const auto at = [&](const ChainOperand& o) {
        return reinterpret_cast<float*>(o.p + ((first + t) * o.os + r0 * o.rs) * o.es);
      };
      const bool ran = cpu::map_reduce_f32_rows(
          0, op, 0, cpu::kRowSumExp, cpu::Rows{nr, y.rs, a.rs, b.rs, a.rs}, at(y), at(a),
          static_cast<int>(a.cs), at(b), static_cast<int>(b.cs), at(a), static_cast<int>(a.cs),
          cols, out);
      assert(ran);  // sum_exp_chain admits only operands the kernel takes
      (void)ran;
      float* sums = at(acc);
      for (int64_t r = 0; r < nr; ++r)
        sums[r * acc.rs] = ops::reduce_combine_f32(ReduceOp::kSum, sums[r * acc.rs], out[r]);
    }
  }
}

// Runs the chain at `pc` with operands `ops` (prepare_chain) for trips [first, first + trips)
// counted from where they were resolved.
void BlockRunner::run_chain(int32_t pc, const ChainOps& ops, int64_t first, int64_t trips) {
  if (lp_.chain_sum_exp[pc]) {
    run_sum_exp(pc, ops, first, trips);
  } else if (lp_.chain_direct[pc]) {
    run_chain_impl<true>(pc, ops, first, trips);
  } else {
    run_chain_impl<false>(pc, ops, first, trips);
  }
}

// kDirect (LoadedProgram::chain_direct): no operand is a scratch strip, and one call per
// member covers the whole tile and all trips; compiled apart, the common case pays none of
// the strip bookkeeping.
template <bool kDirect>
void BlockRunner::run_chain_impl(int32_t pc, const ChainOps& ops, int64_t first, int64_t trips) {
  const Instr& head = lp_.instrs[pc];
  const int k = bc::chain_length(head.aux);
  const Instr* body = &lp_.instrs[pc + 1];
  // Thread-local strips: a 28 KiB stack frame would be probed page by page on every call.
  alignas(64) static thread_local float scratch[bc::kMaxChainBody - 1][kChainStrip];
  const int64_t rows = rows_of(head.cls), cols = cols_of(head.cls);
  // Short rows run in blocks of several rows per strip (one kernel call per block, scratch
  // rows back to back); rows longer than a strip run strip by strip. Whole trips join a
  // block while they fit.
  // A chain whose kernels all read and write memory or kept registers (its intermediates
  // fused away) needs no strips: one call per member covers the whole tile and all trips.
  constexpr bool direct = kDirect;
  const int64_t strip = direct ? std::max<int64_t>(cols, 1) : kChainStrip;
  const int64_t block_rows = direct                           ? std::max<int64_t>(rows, 1)
                             : cols > 0 && cols < kChainStrip ? kChainStrip / cols
                                                              : 1;
  const int64_t trips_per_call = direct                            ? trips
                                 : trips > 1 && rows <= block_rows ? block_rows / rows
                                                                   : 1;
  for (int64_t t = 0; t < trips; t += trips_per_call) {
    const int64_t nt = std::min(trips_per_call, trips - t);
    for (int64_t r = 0; r < rows; r += block_rows) {
      const int64_t nb = std::min(block_rows, rows - r);
      for (int64_t c0 = 0; c0 < cols; c0 += strip) {
        const int64_t n = std::min(strip, cols - c0);
        auto at = [&](const ChainOperand& o) {
          return !kDirect && o.scratch >= 0
                     ? scratch[o.scratch]
                     : reinterpret_cast<float*>(o.p +
                                                ((first + t) * o.os + r * o.rs + c0 * o.cs) * o.es);
        };
        auto inc = [](const ChainOperand& o) {
          return !kDirect && o.scratch >= 0 ? 1 : static_cast<int>(o.cs);
        };
        auto rs = [n](const ChainOperand& o) { return !kDirect && o.scratch >= 0 ? n : o.rs; };
        auto os = [n, nb](const ChainOperand& o) {
          return !kDirect && o.scratch >= 0 ? nb * n : o.os;
        };
        for (int i = 0; i < k; ++i) {
          const Instr& in = body[i];
          const ChainOperand* o = ops[i];
          const LoadedProgram::HalfPlan& hp = lp_.chain_half[pc + 1 + i];
          if (hp.absorbed) continue;  // a load or store that another member's kernel runs
          if (hp.load >= 0 || hp.store >= 0) {
            // The op reads its f16/bf16 source and/or writes its f16/bf16 result itself.
            const int kind = in.op == bc::Opcode::kFma ? 2 : bc::is_binary(in.op) ? 1 : 0;
            const ChainOperand& a = hp.load >= 0 ? ops[hp.load][1] : o[hp.swap ? 2 : 1];
            const ChainOperand& b = o[hp.swap ? 1 : 2];
            const ChainOperand& c = o[3];
            const ChainOperand& dst = hp.store >= 0 ? ops[hp.store][0] : o[0];
            // Every field given at once: assigned one by one after a default construction, the
            // struct was first zeroed with a rep stos (144 bytes) on every kernel call.
            cpu::Rows rows{nb, rs(dst), rs(a), kind >= 1 ? rs(b) : 0, kind == 2 ? rs(c) : 0};
            rows.outer = nt;
            rows.od = os(dst);
            rows.oa = os(a);
            rows.ob = kind >= 1 ? os(b) : 0;
            rows.oc = kind == 2 ? os(c) : 0;
            const cpu::HalfMapArgs m{
                .kind = kind,
                .op = kind == 0   ? static_cast<int>(bc::unary_of(in.op))
                      : kind == 1 ? static_cast<int>(bc::binary_of(in.op))
                                  : 0,
                .a_type = hp.load >= 0 ? p_.descs[body[hp.load].a.index].dtype : DType::kF32,
                .d_type = hp.store >= 0 ? p_.descs[body[hp.store].d.index].dtype : DType::kF32,
                .rows = rows,
                .dst = at(dst),
                .a = at(a),
                .b = kind >= 1 ? at(b) : nullptr,
                .c = kind == 2 ? at(c) : nullptr,
                .binc = kind >= 1 ? inc(b) : 0,
                .cinc = kind == 2 ? inc(c) : 0,
                .n = n};
            const bool ran = cpu::half_map_f32_rows(m);  // plan_half admits only its forms
            assert(ran);
            (void)ran;
            continue;
          }
          const int fuse = lp_.chain_fuse[pc + 1 + i];
          if (fuse == LoadedProgram::kFuseMulFma || fuse == LoadedProgram::kFuseNegMulFma) {
            // neg? (x = -a), mul (m = x * b), fma (d = p * q + m): one pass
            const bool neg = fuse == LoadedProgram::kFuseNegMulFma;
            const int mi = neg ? i + 1 : i;
            const ChainOperand *x, *y, *fo;
            mul_add_sources(body, i, neg, ops, &x, &y, &fo);
            cpu::Rows blk{nb, rs(fo[0]), rs(*x), rs(*y), rs(fo[1])};
            blk.e = rs(fo[2]);
            blk.outer = nt;
            blk.od = os(fo[0]);
            blk.oa = os(*x);
            blk.ob = os(*y);
            blk.oc = os(fo[1]);
            blk.oe = os(fo[2]);
            cpu::fused_mul_add_f32_rows(neg, blk, at(fo[0]), at(*x), inc(*x), at(*y), inc(*y),
                                        at(fo[1]), inc(fo[1]), at(fo[2]), inc(fo[2]), n);
            i = mi + 1;
            continue;
          }
          if (fuse == LoadedProgram::kFuseMulFmaFactor) {  // (x * y) * other + addend
            const ChainOperand* fo = ops[i + 1];           // the fma: d, a, b, c
            const bool first = is_reg(body[i + 1].a, in.d.index);
            const ChainOperand& other = first ? fo[2] : fo[1];
            cpu::Rows blk{nb, rs(fo[0]), rs(o[1]), rs(o[2]), rs(other)};
            blk.e = rs(fo[3]);
            blk.outer = nt;
            blk.od = os(fo[0]);
            blk.oa = os(o[1]);
            blk.ob = os(o[2]);
            blk.oc = os(other);
            blk.oe = os(fo[3]);
            cpu::fused_mul_fma_f32_rows(blk, at(fo[0]), at(o[1]), inc(o[1]), at(o[2]), inc(o[2]),
                                        at(other), inc(other), at(fo[3]), inc(fo[3]), n);
            ++i;
            continue;
          }
          if (fuse != 0) {  // body[i] * (the other operand of body[i + 1]) -> its destination
            const ChainOperand* q = ops[i + 1];
            const ChainOperand& c = q[fuse == 1 ? 2 : 1];
            const bool mul = bc::is_binary(in.op);
            const bool has_b = chain_fields(in) >= 3;  // a * b, op(a +- b); op(a) has no b
            cpu::Rows blk{nb, rs(q[0]), rs(o[1]), has_b ? rs(o[2]) : 0, rs(c)};
            blk.outer = nt;
            blk.od = os(q[0]);
            blk.oa = os(o[1]);
            blk.ob = has_b ? os(o[2]) : 0;
            blk.oc = os(c);
            const int kind = mul        ? cpu::kFusedMul
                             : in.flags ? cpu::kFusedUnaryPre
                                        : cpu::kFusedUnary;
            const UnaryOp op = mul ? UnaryOp::kNeg : bc::unary_of(in.op);  // op unused for mul
            cpu::fused_mul_f32_rows(kind, op, in.flags, blk, at(q[0]), at(o[1]), inc(o[1]),
                                    has_b ? at(o[2]) : at(o[1]), has_b ? inc(o[2]) : 0, at(c),
                                    inc(c), n);
            ++i;
            continue;
          }
          cpu::Rows blk{nb, rs(o[0]), rs(o[1]), rs(o[2]), rs(o[3])};
          blk.outer = nt;
          blk.od = os(o[0]);
          blk.oa = os(o[1]);
          blk.ob = os(o[2]);
          blk.oc = os(o[3]);
          if (in.op == bc::Opcode::kLoad || in.op == bc::Opcode::kStore) {
            // f16/bf16 <-> f32 a row at a time (the memory side may be strided).
            const bool load = in.op == bc::Opcode::kLoad;
            const ChainOperand& mem = o[load ? 1 : 0];
            const ChainOperand& val = o[load ? 0 : 1];
            const DType dt = p_.descs[(load ? in.a : in.d).index].dtype;
            auto* mp = reinterpret_cast<char*>(at(mem));
            float* vp = at(val);
            for (int64_t k = 0; k < nt; ++k) {
              for (int64_t rr = 0; rr < nb; ++rr) {
                char* m = mp + (k * os(mem) + rr * rs(mem)) * mem.es;
                float* v = vp + k * os(val) + rr * rs(val);
                if (load) {
                  cpu::load_convert(v, dt, m, mem.cs, n);
                } else {
                  cpu::store_convert(dt, m, mem.cs, v, inc(val), n);
                }
              }
            }
          } else if (in.op == bc::Opcode::kReduce) {  // one accumulator value per block row
            cpu::reduce_row_f32_rows(bc::aux_reduce_op(in.aux), cpu::Rows{nb, rs(o[0]), rs(o[1])},
                                     at(o[0]), at(o[1]), inc(o[1]), n);
          } else if (in.op == bc::Opcode::kReduceDot) {
            cpu::dot_row_f32_rows(cpu::Rows{nb, rs(o[0]), rs(o[1]), rs(o[2])}, at(o[0]), at(o[1]),
                                  inc(o[1]), at(o[2]), inc(o[2]), n);
          } else if (in.op == bc::Opcode::kFma) {
            cpu::fma_f32_rows(blk, at(o[0]), at(o[1]), inc(o[1]), at(o[2]), inc(o[2]), at(o[3]),
                              inc(o[3]), n);
          } else if (bc::is_binary(in.op)) {
            cpu::binary_f32_rows(bc::binary_of(in.op), blk, at(o[0]), at(o[1]), inc(o[1]), at(o[2]),
                                 inc(o[2]), n);
          } else if (in.flags != 0) {
            cpu::unary_pre_f32_rows(bc::unary_of(in.op), in.flags, blk, at(o[0]), at(o[1]),
                                    inc(o[1]), at(o[2]), inc(o[2]), n);
          } else {
            cpu::unary_f32_rows(bc::unary_of(in.op), blk, at(o[0]), at(o[1]), inc(o[1]), n);
          }
        }
      }
    }
  }
}

// A loop whose body is only chains over memory and chain-local values (LoadedProgram::
// loop_of_chains): each chain runs over all of this block's trips at once. Chains read what
// earlier chains of the same trip wrote only through memory, written already; trips write
// disjoint memory.
// The chains take turns by batches of trips (LoadedProgram::loop_batch) whose memory fits
// L1, so that what one chain reads the next finds there (rotary embedding's two halves both
// read all of x). Operands are resolved once per block and stepped per batch: a batch of a
// small tile costs about as much to set up as to run.
void BlockRunner::exec_loop_of_chains(int32_t pc, int64_t begin, int64_t end) {
  constexpr int kMaxPrepared = 4;
  const int axis = lp_.instrs[pc].aux;
  const int32_t stop = lp_.loop_end[pc];
  const StreamScope stream(args_.stream_stores && lp_.loop_stream[pc]);
  const int64_t batch = lp_.loop_batch[pc];
  ChainOps ops[kMaxPrepared];
  const int32_t second = pc + 2 + bc::chain_length(lp_.instrs[pc + 1].aux);
  if (lp_.chain_pair[pc + 1] && second + bc::chain_length(lp_.instrs[second].aux) + 1 == stop) {
    // The body is one chain pair: one pass does all trips.
    set_axis(axis, begin);
    prepare_chain(pc + 1, axis, ops[0]);
    prepare_chain(second, axis, ops[1]);
    run_chain_pair(pc + 1, ops[0], ops[1], 0, end - begin);
    set_axis(axis, end - 1);
    return;
  }
  int chains = 0;
  set_axis(axis, begin);
  for (int32_t c = pc + 1; c < stop; c += bc::chain_length(lp_.instrs[c].aux) + 1) {
    if (chains == kMaxPrepared) {
      chains = -1;
      break;
    }
    prepare_chain(c, axis, ops[chains++]);
  }
  for (int64_t t = begin; t < end; t += batch) {
    const int64_t nt = std::min(batch, end - t);
    int k = 0;
    for (int32_t c = pc + 1; c < stop; c += bc::chain_length(lp_.instrs[c].aux) + 1, ++k) {
      if (chains < 0) {  // many chains: resolved per batch
        set_axis(axis, t);
        exec_chain(c, axis, nt);
      } else {
        run_chain(c, ops[k], t - begin, nt);
      }
    }
  }
  set_axis(axis, begin + (end - 1 - begin) / batch * batch);  // where per-batch steps leave it
}

// The cached packed panels of a constant B (its slot has a version), from the tile's first
// column on; null when B is not constant, the tile does not start on a panel boundary, or the
// GEMM reads B in place anyway. The whole K x N matrix is packed (for this tile's batch
// index): every tile of every call shares it.
const float* BlockRunner::packed_b(const bc::Descriptor& db, const Ref& b, int64_t k, int64_t bk,
                                   int64_t rows, int64_t a_rs, int64_t ak) {
  if (args_.versions == nullptr || args_.versions[db.slot] == 0) return nullptr;
  if (cpu::gemm_half_on_amx(db.dtype)) return nullptr;
  if (skinny(db, b, k, bk, rows, a_rs, ak)) return nullptr;
  if (transposed_b_in_place(db, b, k, bk, rows, a_rs, ak)) return nullptr;
  // Packed into f32 panels, B would run at f32 speed: the pair dot products are faster.
  if (cpu::gemm_bf16_dot_rows_fits(db.dtype, product_rows(rows), k, a_rs, ak, b.cs)) {
    return nullptr;
  }
  static const int64_t panel_cols = cpu::gemm_micro_tile().n;
  const int col = lp_.col_axis;
  const int64_t j0 = col >= 0 ? ivar_[col] : 0;
  if (j0 % panel_cols != 0) return nullptr;
  vm::WeightKey key;
  key.data = b.p - j0 * b.cs * dtype_size(db.dtype);
  key.version = args_.versions[db.slot];
  key.k = k;
  key.n = col >= 0 ? p_.axes[col].extent : 1;
  key.rs = bk;
  key.cs = b.cs;
  key.dtype = db.dtype;
  if (!packed_looked_up_ || !(packed_key_ == key)) {
    // One lookup per operand and block runner, also when the cache declines it: the tiles of
    // a declined operand pack their own panels, as with the cache disabled.
    packed_ = vm::packed_weight(key);
    packed_key_ = key;
    packed_looked_up_ = true;
  }
  if (packed_ == nullptr) return nullptr;
  return packed_->panels() + j0 / panel_cols * (k * panel_cols);
}

// Reads B^T in place (gemm_f32_skinny, gemm_half_skinny)? Decided by the whole product's rows
// (the row axis's extent), not the tile's, so that every thread count sums in the same order.
bool BlockRunner::skinny(const bc::Descriptor& db, const Ref& b, int64_t k, int64_t bk,
                         int64_t rows, int64_t a_rs, int64_t ak) const {
  const int64_t m = product_rows(rows);
  if (db.dtype == DType::kF32) return cpu::gemm_skinny_in_place(m, ak, bk, b.cs);
  if (bf16_dot(db, b, k, bk, rows, a_rs, ak)) return false;
  return cpu::gemm_half_skinny_in_place(db.dtype, m, ak, bk, b.cs);
}

// A bf16 B^T multiplied by VDPBF16PS (cpu::gemm_bf16_dot_fits), by the whole product's rows.
bool BlockRunner::bf16_dot(const bc::Descriptor& db, const Ref& b, int64_t k, int64_t bk,
                           int64_t rows, int64_t a_rs, int64_t ak) const {
  return cpu::gemm_bf16_dot_fits(db.dtype, product_rows(rows), k, a_rs, ak, bk, b.cs);
}

// Reads B^T in place with the role-swapped kernel (gemm_f32_bt_in_place, gemm_half_bt_in_place)?
// Also by the whole product's rows.
bool BlockRunner::transposed_b_in_place(const bc::Descriptor& db, const Ref& b, int64_t k,
                                        int64_t bk, int64_t rows, int64_t a_rs, int64_t ak) const {
  if (db.dtype == DType::kF32) {
    return cpu::gemm_f32_reads_b_in_place(product_rows(rows), k, bk, b.cs);
  }
  return bf16_dot(db, b, k, bk, rows, a_rs, ak) ||
         cpu::gemm_half_reads_b_in_place(db.dtype, product_rows(rows), k, bk, b.cs);
}

// The rows of the whole product (the row axis's extent), at least a tile's.
int64_t BlockRunner::product_rows(int64_t rows) const {
  const int64_t m = lp_.row_axis >= 0 ? p_.axes[lp_.row_axis].extent : rows;
  return std::max(m, rows);
}

// The tile's rows x cols output block over the whole contraction axis, by the GEMM kernel.
void BlockRunner::exec_matmul(const Instr& in) {
  const bc::Descriptor& da = p_.descs[in.a.index];
  const bc::Descriptor& db = p_.descs[in.b.index];
  const int64_t k = p_.axes[in.aux].extent;
  Ref d = resolve(in.d, CType::kF32);
  Ref a = resolve(in.a, CType::kF32);
  Ref b = resolve(in.b, CType::kF32);
  int64_t rows = rows_of(in.cls), cols = cols_of(in.cls);
  int64_t ak = da.stride[in.aux], bk = db.stride[in.aux];
  auto* c = reinterpret_cast<float*>(d.p);
  if (const float* panels = packed_b(db, b, k, bk, rows, a.rs, ak)) {
    const cpu::PackedB pb{panels, k};
    if (da.dtype == DType::kF32) {
      cpu::gemm_f32_packed(rows, cols, k, reinterpret_cast<const float*>(a.p), a.rs, ak,
                           reinterpret_cast<const float*>(b.p), bk, b.cs, pb, c, d.rs, false);
    } else {
      cpu::gemm_half_packed(da.dtype, rows, cols, k, reinterpret_cast<const uint16_t*>(a.p), a.rs,
                            ak, pb, c, d.rs, false);
    }
    return;
  }
  if (da.dtype == DType::kF32 && skinny(db, b, k, bk, rows, a.rs, ak)) {
    cpu::gemm_f32_skinny(rows, cols, k, reinterpret_cast<const float*>(a.p), a.rs,
                         reinterpret_cast<const float*>(b.p), b.cs, c, d.rs, false);
  } else if (da.dtype == DType::kF32 && transposed_b_in_place(db, b, k, bk, rows, a.rs, ak)) {
    // An A no instruction writes is the same memory for the whole launch: the tiles along N of
    // one row block, run one after another here, pack it once.
    const uint64_t token = lp_.desc_read_only[in.a.index] ? gemm_token() : 0;
    cpu::gemm_f32_bt_in_place(rows, cols, k, reinterpret_cast<const float*>(a.p), a.rs, ak,
                              reinterpret_cast<const float*>(b.p), b.cs, c, d.rs, false, token);
  } else if (da.dtype == DType::kF32) {
    cpu::gemm_f32(rows, cols, k, reinterpret_cast<const float*>(a.p), a.rs, ak,
                  reinterpret_cast<const float*>(b.p), bk, b.cs, c, d.rs, false);
  } else if (skinny(db, b, k, bk, rows, a.rs, ak)) {
    cpu::gemm_half_skinny(da.dtype, rows, cols, k, reinterpret_cast<const uint16_t*>(a.p), a.rs,
                          reinterpret_cast<const uint16_t*>(b.p), b.cs, c, d.rs, false);
  } else if (transposed_b_in_place(db, b, k, bk, rows, a.rs, ak)) {
    const uint64_t token = lp_.desc_read_only[in.a.index] ? gemm_token() : 0;
    cpu::gemm_half_bt_in_place(da.dtype, rows, cols, k, reinterpret_cast<const uint16_t*>(a.p),
                               a.rs, ak, reinterpret_cast<const uint16_t*>(b.p), b.cs, c, d.rs,
                               false, token);
  } else if (cpu::gemm_bf16_dot_rows_fits(db.dtype, product_rows(rows), k, a.rs, ak, b.cs)) {
    cpu::gemm_bf16_b_rows(rows, cols, k, reinterpret_cast<const uint16_t*>(a.p), a.rs, ak,
                          reinterpret_cast<const uint16_t*>(b.p), bk, c, d.rs, false);
  } else {
    cpu::gemm_half(da.dtype, rows, cols, k, reinterpret_cast<const uint16_t*>(a.p), a.rs, ak,
                   reinterpret_cast<const uint16_t*>(b.p), bk, b.cs, c, d.rs, false);
  }
}

template <typename T>
void reduce_typed(ReduceOp op, bool red_rows, bool red_cols, const Ref& acc, const Ref& src,
                  int64_t rows, int64_t cols) {
  constexpr int es = sizeof(T);
  if constexpr (std::is_same_v<T, float>) {
    if (red_rows && !red_cols) {  // rows into one accumulator row, in order
      cpu::accumulate_f32_rows(op, cpu::Rows{rows, 0, src.rs}, reinterpret_cast<float*>(acc.p),
                               reinterpret_cast<const float*>(src.p), static_cast<int>(src.cs),
                               cols);
      return;
    }
    if (red_cols) {  // one call for the whole tile
      cpu::reduce_row_f32_rows(
          op, cpu::Rows{rows, red_rows ? 0 : acc.rs, src.rs}, reinterpret_cast<float*>(acc.p),
          reinterpret_cast<const float*>(src.p), static_cast<int>(src.cs), cols);
      return;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* ap = reinterpret_cast<T*>(acc.p + (red_rows ? 0 : r * acc.rs * es));
    const T* sp = reinterpret_cast<const T*>(src.p + r * src.rs * es);
    int si = static_cast<int>(src.cs);
    if (red_cols) {
      if constexpr (std::is_same_v<T, float>) cpu::reduce_row_f32(op, ap, sp, si, cols);
      if constexpr (std::is_same_v<T, int32_t>) cpu::reduce_row_i32(op, ap, sp, si, cols);
      if constexpr (std::is_same_v<T, int64_t>) cpu::reduce_row_i64(op, ap, sp, si, cols);
    } else {
      if constexpr (std::is_same_v<T, float>) cpu::accumulate_f32(op, ap, sp, si, cols);
      if constexpr (std::is_same_v<T, int32_t>) cpu::accumulate_i32(op, ap, sp, si, cols);
      if constexpr (std::is_same_v<T, int64_t>) cpu::accumulate_i64(op, ap, sp, si, cols);
    }
  }
}

void BlockRunner::exec_reduce(const Instr& in) {
  if (in.op == bc::Opcode::kFill) {
    Ref d = resolve(in.d, in.ctype);
    int64_t rows = rows_of(in.cls), cols = cols_of(in.cls);
    int es = ctype_size(in.ctype);
    if (d.rs == cols) {  // rows back to back (a column register included): one run
      cpu::fill_identity(bc::aux_reduce_op(in.aux), in.ctype, d.p, rows * cols);
      return;
    }
    for (int64_t r = 0; r < rows; ++r)
      cpu::fill_identity(bc::aux_reduce_op(in.aux), in.ctype, d.p + r * d.rs * es, cols);
    return;
  }
  if (in.op == bc::Opcode::kArgReduce) {
    exec_argreduce(in);
    return;
  }
  if (in.op == bc::Opcode::kReduceDot) {
    exec_reduce_dot(in);
    return;
  }
  Ref acc = resolve(in.d, in.ctype);
  Ref src = resolve(in.a, in.ctype);
  ReduceOp op = bc::aux_reduce_op(in.aux);
  bool rr = bc::aux_rows(in.aux), rc = bc::aux_cols(in.aux);
  int64_t rows = rows_of(in.cls), cols = cols_of(in.cls);
  if (in.ctype == CType::kF32) reduce_typed<float>(op, rr, rc, acc, src, rows, cols);
  if (in.ctype == CType::kI32) reduce_typed<int32_t>(op, rr, rc, acc, src, rows, cols);
  if (in.ctype == CType::kI64) reduce_typed<int64_t>(op, rr, rc, acc, src, rows, cols);
}

template <typename T>
void argreduce_typed(ReduceOp op, bool red_rows, bool red_cols, const Ref& v, const Ref& idx,
                     const Ref& src, int64_t rows, int64_t cols, int64_t base) {
  constexpr int es = sizeof(T);
  for (int64_t r = 0; r < rows; ++r) {
    T* vp = reinterpret_cast<T*>(v.p + (red_rows ? 0 : r * v.rs * es));
    int64_t* ip = reinterpret_cast<int64_t*>(idx.p + (red_rows ? 0 : r * idx.rs * 8));
    const T* sp = reinterpret_cast<const T*>(src.p + r * src.rs * es);
    int si = static_cast<int>(src.cs);
    if (red_cols) {
      if constexpr (std::is_same_v<T, float>)
        cpu::argreduce_row_f32(op, vp, ip, sp, si, cols, base);
      if constexpr (std::is_same_v<T, int32_t>)
        cpu::argreduce_row_i32(op, vp, ip, sp, si, cols, base);
      if constexpr (std::is_same_v<T, int64_t>)
        cpu::argreduce_row_i64(op, vp, ip, sp, si, cols, base);
    } else {
      int64_t index = base + (red_rows ? r : 0);
      if constexpr (std::is_same_v<T, float>)
        cpu::argaccumulate_f32(op, vp, ip, sp, si, cols, index);
      if constexpr (std::is_same_v<T, int32_t>)
        cpu::argaccumulate_i32(op, vp, ip, sp, si, cols, index);
      if constexpr (std::is_same_v<T, int64_t>)
        cpu::argaccumulate_i64(op, vp, ip, sp, si, cols, index);
    }
  }
}

void BlockRunner::exec_argreduce(const Instr& in) {
  Ref v = resolve(in.d, in.ctype);
  Ref idx = resolve(in.b, CType::kI64);
  Ref src = resolve(in.a, in.ctype);
  ReduceOp op = bc::aux_reduce_op(in.aux);
  bool rr = bc::aux_rows(in.aux), rc = bc::aux_cols(in.aux);
  int64_t base = ivar_[bc::aux_axis(in.aux)];
  int64_t rows = rows_of(in.cls), cols = cols_of(in.cls);
  if (in.ctype == CType::kF32) argreduce_typed<float>(op, rr, rc, v, idx, src, rows, cols, base);
  if (in.ctype == CType::kI32) argreduce_typed<int32_t>(op, rr, rc, v, idx, src, rows, cols, base);
  if (in.ctype == CType::kI64) argreduce_typed<int64_t>(op, rr, rc, v, idx, src, rows, cols, base);
}

// Trips [begin, end - 1) of a loop planned as LoadedProgram::loop_col_reduce, each its
// output row filled with the identity and the tile's rows accumulated into it in order, as
// the body does through its column register; the last trip is left to the interpreter so
// that the register ends holding it. False (nothing run) when an operand is not contiguous
// along the columns.
bool BlockRunner::exec_loop_col_reduce(int32_t pc, int64_t begin, int64_t end) {
  const Instr& red = lp_.instrs[pc + 2];
  const Instr& st = lp_.instrs[pc + 3];
  const int axis = lp_.instrs[pc].aux;
  set_axis(axis, begin);
  const Ref src = resolve(red.a, CType::kF32);
  const Ref dst = resolve(st.d, CType::kF32);
  if (src.cs != 1 || dst.cs != 1) return false;
  const int64_t step = p_.axes[axis].chunk;
  const int64_t src_step = p_.descs[red.a.index].stride[axis] * step * int64_t{sizeof(float)};
  const int64_t dst_step = p_.descs[st.d.index].stride[axis] * step * int64_t{sizeof(float)};
  const ReduceOp op = bc::aux_reduce_op(red.aux);
  const int64_t rows = rows_of(red.cls), cols = cols_of(st.cls);
  for (int64_t t = 0; t < end - 1 - begin; ++t) {
    auto* out = reinterpret_cast<float*>(dst.p + t * dst_step);
    cpu::fill_identity(op, CType::kF32, out, cols);
    cpu::accumulate_f32_rows(op, cpu::Rows{rows, 0, src.rs}, out,
                             reinterpret_cast<const float*>(src.p + t * src_step), 1, cols);
  }
  return true;
}

// Decodes a block id into its trip of each grid axis (first grid axis slowest); other axes 0.
// The block's trip of each grid axis (the last grid axis fastest). Divisions only where the
// block id is past an axis's trips: a launch of one block, and the first blocks of a grid
// whose last axis has many trips, divide nothing (a division per axis and block was a tenth
// of a 4K-element launch).
void grid_trips(const LoadedProgram& lp, int64_t block, int64_t (&trip)[bc::kMaxAxes]) {
  for (size_t a = lp.program.axes.size(); a-- > 0;) {
    const int64_t trips = lp.grid_axis_trips[a];
    if (trips == 1) {
      trip[a] = 0;
    } else if (block < trips) {
      trip[a] = block;
      block = 0;
    } else {
      trip[a] = block % trips;
      block /= trips;
    }
  }
}

void BlockRunner::run(int64_t block, int64_t next) {
  // The program's axes only (kMaxAxes of them was a 128-byte `rep stos` per block, a tenth
  // of a 1-element launch on Zen 4).
  const size_t na = p_.axes.size();
  for (size_t a = 0; a < na; ++a) ivar_[a] = 0;
  std::copy(lp_.desc_offset.begin(), lp_.desc_offset.end(), desc_off_);
  active_rows_ = active_cols_ = 1;
  int64_t trip[bc::kMaxAxes];
  grid_trips(lp_, block, trip);
  for (size_t a = p_.axes.size(); a-- > 0;)
    if (p_.axes[a].iter == bc::AxisIter::kGrid) set_axis(static_cast<int>(a), trip[a]);
  if (band_rows_ > 0) {
    // The next block's rows fetched to L2 over this block's passes (the instruction path's
    // queue), for rows up to kMaxQueuedRowBytes: streamed launches (1 / 2 threads, in-process
    // A/B, 4M / 16M elements): add+layernorm rows of 768 1.49 / 1.46x, 1.52 / 1.30x; rows of
    // 256 1.08 / 1.17x, 1.09 / 1.06x; softmax rows of 128 1.04-1.13x, rows of 512 0.97-1.04x.
    // Longer rows' streams the hardware prefetchers follow on their own: rmsnorm rows of 4096
    // and 16384 lost 2-14% with the queue.
    const bool queue = next >= 0 && lp_.prefetch_at >= 0 &&
                       p_.axes[lp_.col_axis].chunk * int64_t{sizeof(float)} <= kMaxQueuedRowBytes &&
                       g_row_block_prefetch.load(std::memory_order_relaxed);
    if (queue) cpu::set_prefetch_queue(block_prefetch(lp_, args_.slots, next));
    run_row_program(queue);
    return;
  }
  Frame stack[bc::kMaxAxes];
  int depth = 0;
  const int32_t n = static_cast<int32_t>(lp_.instrs.size());
  for (int32_t pc = 0; pc < n; ++pc) {
    const Instr& in = lp_.instrs[pc];
    if (next >= 0 && pc >= lp_.prefetch_at) {  // >=: a fused pair may step over it
      cpu::set_prefetch_queue(block_prefetch(lp_, args_.slots, next));
      next = -1;
    }
    switch (in.op) {
      case bc::Opcode::kLoop: {
        int64_t begin, end;
        trip_range(in.aux, &begin, &end);
        if (begin >= end) {
          pc = lp_.loop_end[pc];
          break;
        }
        if (lp_.loop_of_chains[pc]) {
          exec_loop_of_chains(pc, begin, end);
          pc = lp_.loop_end[pc];
          break;
        }
        if (lp_.loop_col_reduce[pc] && end - begin > 1 && exec_loop_col_reduce(pc, begin, end))
          begin = end - 1;  // the last trip through the body
        stack[depth++] = Frame{pc, in.aux, begin, end};
        set_axis(in.aux, begin);
        break;
      }
      case bc::Opcode::kEndLoop: {
        Frame& f = stack[depth - 1];
        if (++f.trip < f.end) {
          set_axis(f.axis, f.trip);
          pc = f.loop_pc;
        } else {
          --depth;
        }
        break;
      }
      case bc::Opcode::kChain: {
        if (lp_.chain_pair[pc]) {
          pc = exec_chain_pair(pc);
          break;
        }
        const StreamScope stream(args_.stream_stores && lp_.chain_stream[pc]);
        exec_chain(pc);
        pc += bc::chain_length(in.aux);  // the body ran inside the chain
        break;
      }
      default: {
        if (lp_.map_reduce[pc] != 0 && exec_map_reduce(pc)) {
          pc += lp_.map_reduce[pc];
          break;
        }
        if (exec_small(in)) break;
        const StreamScope stream(args_.stream_stores && in.d.kind == OperandKind::kDesc);
        exec(in);
        break;
      }
    }
  }
}

std::atomic<bool> g_small_tiles{true};

// The block as one row program: its memory operands and values resolved here, once.
void BlockRunner::run_row_program(bool drain_queue) const {
  constexpr size_t kMax = 32;  // plan_row_program admits no more
  cpu::RowMem mem[kMax];
  const float* values[kMax];
  for (size_t i = 0; i < lp_.row_mem_desc.size(); ++i) {
    const int d = lp_.row_mem_desc[i];
    mem[i] = cpu::RowMem{
        reinterpret_cast<float*>(static_cast<char*>(args_.slots[lp_.desc_slot[d]]) + desc_off_[d]),
        lp_.desc_rs[d], lp_.desc_cs[d]};
  }
  for (size_t i = 0; i < lp_.row_values.size(); ++i) {
    const int v = lp_.row_values[i];
    values[i] = v >= 0 ? &p_.consts[v].f32 : &args_.params[-1 - v].f32;
  }
  cpu::RowProgramArgs a;
  a.steps = lp_.row_steps.data();
  a.num_steps = static_cast<int32_t>(lp_.row_steps.size());
  a.mem = mem;
  a.values = values;
  a.rows = active_rows_;
  a.cols = active_cols_;
  a.band_rows = band_rows_;
  a.stream = args_.stream_stores;
  a.drain_queue = drain_queue;
  a.regs = reinterpret_cast<float*>(regs_);
  a.reg_floats = reg_bytes_ / static_cast<int64_t>(sizeof(float));
  cpu::row_program_f32(a);
}

// Does the dispatched fma kernel round once (a fused multiply-add)? Targets without FMA
// (SSE4, scalar) multiply and add with two roundings.
bool kernel_fma_is_fused() {
  static const bool fused = [] {
    // (1 + 2^-12)^2 - (1 + 2^-11) is 2^-24 exactly; the rounded product loses it.
    const float a = 1.0f + 0x1p-12f, c = -(1.0f + 0x1p-11f);
    float d = 0;
    cpu::fma_f32_rows(cpu::Rows{}, &d, &a, 1, &a, 1, &c, 1, 1);
    return d != 0.0f;
  }();
  return fused;
}

// f32 instructions over a few elements (a norm's per-row statistics: a fill, mean * 1/n +
// eps, rsqrt) run here element by element: a tile kernel's dispatch costs more than their
// arithmetic. Only ops whose kernels round each element exactly once, as here, take this
// path, so a block computes the same bits whichever path its tile size picks. False: not
// taken.
bool BlockRunner::exec_small(const Instr& in) {
  constexpr int64_t kMaxSmall = 16;
  if (in.ctype != CType::kF32 || in.cls == TileClass::kFull || in.flags != 0 ||
      !g_small_tiles.load(std::memory_order_relaxed))
    return false;
  // A row or column vector (or a scalar): one run of n elements, each operand stepping by its
  // row or column stride.
  const int64_t n = in.cls == TileClass::kRow   ? active_rows_
                    : in.cls == TileClass::kCol ? active_cols_
                                                : 1;
  if (n > kMaxSmall) return false;
  const bool by_row = in.cls == TileClass::kRow;
  struct Run {
    float* p;
    int64_t step;
  };
  const auto run = [&](const Operand& o) {
    const Ref r = resolve(o, CType::kF32);
    return Run{reinterpret_cast<float*>(r.p), by_row ? r.rs : r.cs};
  };
  const auto map1 = [&](auto f) {
    const Run d = run(in.d), a = run(in.a);
    for (int64_t k = 0; k < n; ++k) d.p[k * d.step] = f(a.p[k * a.step]);
    return true;
  };
  const auto map2 = [&](auto f) {
    const Run d = run(in.d), a = run(in.a), b = run(in.b);
    for (int64_t k = 0; k < n; ++k) d.p[k * d.step] = f(a.p[k * a.step], b.p[k * b.step]);
    return true;
  };
  if (in.op == bc::Opcode::kFill) {
    const Run d = run(in.d);
    const float v = ops::reduce_identity<float>(bc::aux_reduce_op(in.aux));
    for (int64_t k = 0; k < n; ++k) d.p[k * d.step] = v;
    return true;
  }
  if (in.op == bc::Opcode::kFma) {
    if (!kernel_fma_is_fused()) return false;
    const Run d = run(in.d), a = run(in.a), b = run(in.b), c = run(in.c);
    for (int64_t k = 0; k < n; ++k)
      d.p[k * d.step] = std::fma(a.p[k * a.step], b.p[k * b.step], c.p[k * c.step]);
    return true;
  }
  if (bc::is_unary(in.op)) {
    switch (bc::unary_of(in.op)) {
      case UnaryOp::kNeg:
        return map1([](float x) { return -x; });
      case UnaryOp::kAbs:
        return map1([](float x) { return std::fabs(x); });
      case UnaryOp::kSqrt:
        return map1([](float x) { return std::sqrt(x); });
      case UnaryOp::kRsqrt:
        return map1([](float x) { return 1.0f / std::sqrt(x); });
      case UnaryOp::kReciprocal:
        return map1([](float x) { return 1.0f / x; });
      default:
        return false;
    }
  }
  if (bc::is_binary(in.op)) {
    switch (bc::binary_of(in.op)) {
      case BinaryOp::kAdd:
        return map2([](float x, float y) { return x + y; });
      case BinaryOp::kSub:
        return map2([](float x, float y) { return x - y; });
      case BinaryOp::kMul:
        return map2([](float x, float y) { return x * y; });
      case BinaryOp::kDiv:
        return map2([](float x, float y) { return x / y; });
      default:
        return false;
    }
  }
  return false;
}

void BlockRunner::exec(const Instr& in) {
  switch (bc::kOpInfo[static_cast<int>(in.op)].family) {
    case bc::Family::kUnary:
      exec_unary(in);
      return;
    case bc::Family::kBinary:
      exec_binary(in);
      return;
    case bc::Family::kData:
      exec_data(in);
      return;
    case bc::Family::kReduce:
      exec_reduce(in);
      return;
    case bc::Family::kControl:
    case bc::Family::kChain:
      return;
  }
}

// The register file of the calling thread, grown on demand, 64-byte aligned.
char* thread_registers(size_t bytes) {
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<char, Free> buf;
  thread_local size_t size = 0;
  if (size < bytes) {
    // Grown by half at least: a shape growing by a row per call (a decode step's sequence)
    // otherwise paid a new allocation, its page faults and the memset on every call (~250 us
    // per step for a 450 KB register file).
    size_t n = (std::max(bytes, size + size / 2) + 63) / 64 * 64;
    buf.reset(static_cast<char*>(std::aligned_alloc(64, n)));
    std::memset(buf.get(), 0, n);  // registers are always defined before use; keep tools quiet
    size = n;
  }
  return buf.get();
}

}  // namespace

void set_small_tile_path(bool on) {
  g_small_tiles.store(on, std::memory_order_relaxed);
}

namespace {
std::atomic<bool> g_row_programs{true};
std::atomic<int64_t> g_row_band_bytes{-1};  // -1: the L1 data cache's size

// Rows per band of a launch's row programs; 0: the program runs instruction by instruction
// (not a row program, or turned off).
int64_t row_band_rows(const LoadedProgram& lp) {
  if (lp.row_steps.empty() || !g_row_programs.load(std::memory_order_relaxed)) return 0;
  int64_t budget = g_row_band_bytes.load(std::memory_order_relaxed);
  if (budget < 0) {
    // About L1: bands of fewer rows saved no cache misses but paid more steps (1 thread,
    // interleaved, 48 KiB L1: add+layernorm rows of 768 at 64K-1M elements 1.05-1.10x
    // faster at 40 KiB than at 24 KiB and again at 64 KiB than at 40 KiB, 0.80-1.0x at
    // 128 KiB; softmax and rmsnorm within 2% from 24 to 64 KiB).
    static const int64_t l1 = [] {
      const long bytes = sysconf(_SC_LEVEL1_DCACHE_SIZE);
      return static_cast<int64_t>(bytes > 0 ? bytes : 32 * 1024);
    }();
    budget = l1;
  }
  // A band's register rows must fit a register (tiles of chain-local values may outgrow it).
  const int64_t cols = std::max<int64_t>(1, lp.program.axes[lp.col_axis].chunk);
  const int64_t reg_floats = lp.program.reg_elems * kRegElemBytes / int64_t{sizeof(float)};
  const int64_t fit = reg_floats / cols;
  if (fit < 1) return 0;
  return std::clamp<int64_t>(budget / std::max<int64_t>(lp.row_bytes, 1), 1,
                             std::min(fit, cpu::kMaxRowBand));
}
}  // namespace

void set_row_programs(bool on) {
  g_row_programs.store(on, std::memory_order_relaxed);
}

void set_row_block_prefetch(bool on) {
  g_row_block_prefetch.store(on, std::memory_order_relaxed);
}

void set_row_band_bytes(int64_t bytes) {
  g_row_band_bytes.store(bytes, std::memory_order_relaxed);
}

// The block's chunk of each grid axis (first grid axis slowest, as BlockRunner::run), then
// each of lp.prefetch_descs' runs of whole rows from there.
cpu::PrefetchQueue block_prefetch(const LoadedProgram& lp, void* const* slots, int64_t block) {
  const bc::Program& p = lp.program;
  const size_t na = p.axes.size();
  int64_t start[bc::kMaxAxes];
  grid_trips(lp, block, start);
  for (size_t a = 0; a < na; ++a) start[a] *= p.axes[a].chunk;
  const auto active = [&](int axis) {
    if (axis < 0) return int64_t{1};
    const bc::Axis& ax = p.axes[axis];
    return std::min(ax.chunk, ax.extent - start[axis]);
  };
  const int64_t elems = active(lp.row_axis) * active(lp.col_axis);
  cpu::PrefetchQueue q;
  for (int d : lp.prefetch_descs) {
    int64_t off = lp.desc_offset[d];
    for (size_t a = 0; a < na; ++a) off += start[a] * lp.desc_step[d * na + a];
    const char* base = static_cast<const char*>(slots[lp.desc_slot[d]]) + off;
    q.next[q.spans] = base;
    q.end[q.spans] = base + elems * lp.desc_es[d];
    ++q.spans;
  }
  return q;
}

void run_blocks(const LoadedProgram& lp, const LaunchArgs& args, int64_t begin, int64_t end) {
  const bc::Program& p = lp.program;
  char* regs = thread_registers(static_cast<size_t>(std::max(1, p.num_regs)) *
                                static_cast<size_t>(p.reg_elems) * kRegElemBytes);
  BlockRunner runner(lp, args, regs, row_band_rows(lp));
  const bool queue = args.stream_stores && !lp.prefetch_descs.empty();
  for (int64_t b = begin; b < end; ++b) runner.run(b, queue && b + 1 < end ? b + 1 : -1);
  if (queue) cpu::clear_prefetch_queue();
  if (args.stream_stores) cpu::stream_fence();  // before the launch's barrier
}

namespace {
std::atomic<int64_t> g_stream_threshold{-1};  // -1: not yet set, the cache size

// The last-level cache one core shares, at most 32 MiB: virtual machines report the
// whole socket's L3 (320 MiB on a 2-vCPU slice of a Zen 4 EPYC whose cores share 32 MiB).
int64_t last_level_cache_bytes() {
  constexpr int64_t kCap = int64_t{32} << 20;
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? std::min<int64_t>(l3, kCap) : kCap;
}
}  // namespace

int64_t stream_threshold_bytes() {
  int64_t t = g_stream_threshold.load(std::memory_order_relaxed);
  if (t < 0) {
    t = last_level_cache_bytes();
    g_stream_threshold.store(t, std::memory_order_relaxed);
  }
  return t;
}

void set_stream_threshold_bytes(int64_t bytes) {
  g_stream_threshold.store(bytes < 0 ? last_level_cache_bytes() : bytes, std::memory_order_relaxed);
}

namespace {
std::atomic<bool> g_stream_counts_operands{true};
}  // namespace

void set_stream_counts_operands(bool on) {
  g_stream_counts_operands.store(on, std::memory_order_relaxed);
}

namespace {
// Below this much work a launch runs on the calling thread (see bc::Target).
constexpr int64_t kMinParallelWork = 32768;
}  // namespace

void launch(const LoadedProgram& lp, const LaunchArgs& args, int num_threads) {
  int64_t grid = lp.program.grid;
  if (grid <= 0) return;
  // Work per block is roughly a tile per loop trip (times the contraction length for
  // matmuls); tiny launches are cheaper on the calling thread than waking workers (a wake-up
  // costs microseconds). A double: the product of large factors must not overflow.
  const double work = static_cast<double>(grid) * static_cast<double>(lp.program.reg_elems) *
                      static_cast<double>(std::max<int64_t>(1, lp.work_per_elem)) *
                      static_cast<double>(lp.trips_per_block);
  int parts = static_cast<int>(std::min<int64_t>(num_threads, grid));
  if (work < static_cast<double>(kMinParallelWork)) parts = 1;
  LaunchArgs streamed = args;
  // The bytes the launch moves: its results go around the caches when the launch's traffic
  // would push them out anyway (a consumer then finds them in DRAM either way). Counting every
  // operand rather than one (AMD Zen 4, 32 MiB of L3, interleaved in one process): at 4M
  // elements (16 MiB a tensor), 1 thread, the suite's workloads 1.04-1.68x faster (19 of 22;
  // col_sum, mid_sum, f16_gelu within 2-4%); a chain silu(a) * b -> rmsnorm -> add, each
  // kernel reading its producer's output, 1.10x (2 threads 1.13x); 1M-2M elements unchanged.
  const bool operands =
      lp.bytes_per_work > 0 && g_stream_counts_operands.load(std::memory_order_relaxed);
  const double bytes = work * (operands ? static_cast<double>(lp.bytes_per_work) : 4.0);
  streamed.stream_stores = bytes >= static_cast<double>(stream_threshold_bytes());
  if (parts <= 1) {
    run_blocks(lp, streamed, 0, grid);
    return;
  }
  // Contiguous, equal ranges: the partition depends only on grid and part count, and every
  // block computes the same bits whichever thread runs it.
  base::parallel_for(parts, [&](int part) {
    int64_t begin = grid * part / parts, end = grid * (part + 1) / parts;
    run_blocks(lp, streamed, begin, end);
  });
}

// Can body[i] and the mul body[i + 1] run as one fused_mul_f32_rows call? 1 or 2: the
// operand of the mul that reads body[i]'s chain-local result (read nowhere else); 0: no.
int fusable_pair(const Instr* body, int k, int i) {
  const Instr& in = body[i];
  const Instr& next = body[i + 1];
  const auto is_mul = [](const Instr& x) {
    return bc::is_binary(x.op) && bc::binary_of(x.op) == BinaryOp::kMul && x.flags == 0;
  };
  const bool mul = is_mul(in);
  const bool unary = bc::is_unary(in.op) && cpu::fused_mul_supported(bc::unary_of(in.op));
  if ((!mul && !unary) || !is_mul(next)) return 0;
  if (in.d.kind != OperandKind::kReg) return 0;
  const int reg = in.d.index;
  if (is_reg(next.a, reg) == is_reg(next.b, reg)) return 0;  // read twice, or not at all
  if (is_reg(next.d, reg) || read_again(body, k, i + 2, reg)) return 0;
  return is_reg(next.a, reg) ? 1 : 2;
}

// Is body[i] a plain mul into register *m whose result body[i + 1], an fma, may read, and
// nothing after it (nor the fma's destination) does?
bool mul_then_fma(const Instr* body, int k, int i, int* m) {
  if (i + 1 >= k) return false;
  const Instr& mul = body[i];
  const Instr& fma = body[i + 1];
  if (!bc::is_binary(mul.op) || bc::binary_of(mul.op) != BinaryOp::kMul || mul.flags != 0)
    return false;
  if (fma.op != bc::Opcode::kFma || mul.d.kind != OperandKind::kReg) return false;
  *m = mul.d.index;
  return !is_reg(fma.d, *m) && !read_again(body, k, i + 2, *m);
}

// Is body[i] such a mul whose result the fma reads as its addend only?
bool mul_feeds_fma_addend(const Instr* body, int k, int i) {
  int m = -1;
  if (!mul_then_fma(body, k, i, &m)) return false;
  const Instr& fma = body[i + 1];
  return is_reg(fma.c, m) && !is_reg(fma.a, m) && !is_reg(fma.b, m);
}

// Is body[i] such a mul whose result the fma reads as one of its two factors only?
bool mul_feeds_fma_factor(const Instr* body, int k, int i) {
  int m = -1;
  if (!mul_then_fma(body, k, i, &m)) return false;
  const Instr& fma = body[i + 1];
  return is_reg(fma.a, m) != is_reg(fma.b, m) && !is_reg(fma.c, m);
}

// Is body[i] a neg whose chain-local result only body[i + 1] reads, once, where body[i + 1]
// is a mul feeding the fma after it (mul_feeds_fma_addend)?
bool neg_feeds_mul_fma(const Instr* body, int k, int i) {
  const Instr& neg = body[i];
  if (!bc::is_unary(neg.op) || bc::unary_of(neg.op) != UnaryOp::kNeg || neg.flags != 0 ||
      neg.d.kind != OperandKind::kReg || !mul_feeds_fma_addend(body, k, i + 1))
    return false;
  const Instr& mul = body[i + 1];
  const Instr& fma = body[i + 2];
  const int x = neg.d.index;
  return is_reg(mul.a, x) != is_reg(mul.b, x) && !is_reg(mul.d, x) && !is_reg(fma.a, x) &&
         !is_reg(fma.b, x) && !is_reg(fma.d, x) && !read_again(body, k, i + 3, x);
}

// A chain operand's increment along the tile's columns when the program runs: 1
// (contiguous), 0 (broadcast) or -1 (another stride: no half kernel takes it).
int column_inc(const LoadedProgram& lp, const Operand& o) {
  switch (o.kind) {
    case OperandKind::kDesc: {
      const int64_t cs = lp.desc_cs[o.index];
      return cs == 0 || cs == 1 ? static_cast<int>(cs) : -1;
    }
    case OperandKind::kReg:
      return o.cls == TileClass::kFull || o.cls == TileClass::kCol ? 1 : 0;
    default:
      return 0;
  }
}

// Is `o` f32 wherever it lives (memory of another dtype is read only through loads)?
bool f32_operand(const LoadedProgram& lp, const Operand& o) {
  return o.kind != OperandKind::kDesc || lp.program.descs[o.index].dtype == DType::kF32;
}

bool half_desc(const LoadedProgram& lp, const Operand& o) {
  if (o.kind != OperandKind::kDesc || lp.desc_cs[o.index] != 1) return false;
  const DType t = lp.program.descs[o.index].dtype;
  return t == DType::kF16 || t == DType::kBF16;
}

// How many times body[0..k) reads register `reg` (source fields).
int reads_of(const Instr* body, int k, int reg) {
  int n = 0;
  for (int j = 0; j < k; ++j) {
    const Operand* src[3] = {&body[j].a, &body[j].b, &body[j].c};
    for (int f = 1; f < chain_fields(body[j]); ++f) n += is_reg(*src[f - 1], reg) ? 1 : 0;
  }
  return n;
}

// Does a member strictly between i and j have opcode `op` or write register `reg`?
bool between(const Instr* body, int i, int j, bc::Opcode op, int reg) {
  for (int m = i + 1; m < j; ++m)
    if (body[m].op == op || is_reg(body[m].d, reg)) return true;
  return false;
}

// The half-kernel form of chain member j: kind (0 unary, 1 binary, 2 fma) and op, or -1.
int half_kind(const Instr& in, int* op) {
  if (in.op == bc::Opcode::kFma) return *op = 0, 2;
  if (bc::is_binary(in.op)) return *op = static_cast<int>(bc::binary_of(in.op)), 1;
  if (bc::is_unary(in.op) && in.flags == 0) return *op = static_cast<int>(bc::unary_of(in.op)), 0;
  return -1;
}

// The converting load that member j can read itself: the member defining its a (or, for a
// commutative op, b) when it is a load of contiguous f16/bf16 memory read by nothing else
// (not kept, no redefinition in between). Moving the read from the load to j must not move
// it past a write of memory (an input may be updated in place): no store between them, and no
// member between them that writes a store's memory itself (members before j are planned).
// -1: none.
int absorbable_load(const LoadedProgram& lp, size_t pc, int j, int kind, int op, bool* swap) {
  const Instr* body = &lp.instrs[pc + 1];
  const int k = bc::chain_length(lp.instrs[pc].aux);
  const bool commutes = kind == 2 || (kind == 1 && static_cast<BinaryOp>(op) != BinaryOp::kSub);
  for (int f = 0; f < (commutes ? 2 : 1); ++f) {
    const Operand& src = f == 0 ? body[j].a : body[j].b;
    if (src.kind != OperandKind::kReg || reads_of(body, k, src.index) != 1) continue;
    for (int i = j - 1; i >= 0; --i) {
      if (!is_reg(body[i].d, src.index)) continue;
      bool writes = false;
      for (int m = i + 1; m < j; ++m) writes = writes || lp.chain_half[pc + 1 + m].store >= 0;
      if (body[i].op == bc::Opcode::kLoad && half_desc(lp, body[i].a) &&
          !bc::chain_keeps(lp.instrs[pc].aux, i) && !lp.chain_half[pc + 1 + i].absorbed &&
          !between(body, i, j, bc::Opcode::kStore, src.index) && !writes) {
        *swap = f == 1;
        return i;
      }
      break;  // the nearest definition is not such a load
    }
  }
  return -1;
}

// The converting store that member j can write itself: a later store of contiguous f16/bf16
// memory that alone reads j's result (not kept; no redefinition between). The write moves
// earlier, to j: no load and no other store between them (a later member reading a load's
// memory itself is checked when that member is planned, by absorbable_load).
int absorbable_store(const LoadedProgram& lp, size_t pc, int j) {
  const Instr* body = &lp.instrs[pc + 1];
  const int k = bc::chain_length(lp.instrs[pc].aux);
  const Operand& d = body[j].d;
  if (d.kind != OperandKind::kReg || bc::chain_keeps(lp.instrs[pc].aux, j) ||
      reads_of(body, k, d.index) != 1)
    return -1;
  for (int s = j + 1; s < k; ++s) {
    if (!reads_reg(body[s], d.index)) continue;
    if (body[s].op == bc::Opcode::kStore && half_desc(lp, body[s].d) &&
        !between(body, j, s, bc::Opcode::kLoad, d.index) &&
        !between(body, j, s, bc::Opcode::kStore, -1))
      return s;
    return -1;
  }
  return -1;
}

// Decides LoadedProgram::chain_half for the chain at `pc` (before its fusions are planned:
// members with a half plan fuse with nothing else).
void plan_half(LoadedProgram* lp, size_t pc) {
  const Instr& head = lp->instrs[pc];
  if (head.cls != TileClass::kFull && head.cls != TileClass::kCol) return;
  const Instr* body = &lp->instrs[pc + 1];
  const int k = bc::chain_length(head.aux);
  for (int j = 0; j < k; ++j) {
    int op = 0;
    const int kind = half_kind(body[j], &op);
    if (kind < 0) continue;
    bool swap = false;
    const int load = absorbable_load(*lp, pc, j, kind, op, &swap);
    const int store = absorbable_store(*lp, pc, j);
    if (load < 0 && store < 0) continue;
    const DType a_type = load >= 0 ? lp->program.descs[body[load].a.index].dtype : DType::kF32;
    const DType d_type = store >= 0 ? lp->program.descs[body[store].d.index].dtype : DType::kF32;
    if (!cpu::half_map_supported(kind, op, a_type, d_type)) continue;
    // The f32 operands: a contiguous a (when not the load's memory), b and c contiguous or
    // broadcast, an f32 destination (the kernel writes f32 memory or registers as stored).
    const Operand& a = swap ? body[j].b : body[j].a;
    const Operand& b = swap ? body[j].a : body[j].b;
    const auto f32 = [&](const Operand& o) { return f32_operand(*lp, o); };
    if (!f32(b) || (kind == 2 && !f32(body[j].c)) || (load < 0 && !f32(a))) continue;
    if (load < 0 && column_inc(*lp, a) != 1) continue;
    if (kind >= 1 && column_inc(*lp, b) < 0) continue;
    if (kind == 2 && column_inc(*lp, body[j].c) < 0) continue;
    if (store < 0 && column_inc(*lp, body[j].d) != 1) continue;
    if (store < 0 && !f32(body[j].d)) continue;
    LoadedProgram::HalfPlan& hp = lp->chain_half[pc + 1 + j];
    hp.load = static_cast<int8_t>(load);
    hp.store = static_cast<int8_t>(store);
    hp.swap = swap;
    if (load >= 0) lp->chain_half[pc + 1 + load].absorbed = true;
    if (store >= 0) lp->chain_half[pc + 1 + store].absorbed = true;
  }
}

// Is the chain at `pc` log-softmax's middle pass: y = a +- b (kept), e = exp(y) read only by
// the reduction after it, acc += sum of e along the columns? (LoadedProgram::chain_sum_exp)
bool sum_exp_chain(const LoadedProgram& lp, size_t pc) {
  const Instr& head = lp.instrs[pc];
  if (bc::chain_length(head.aux) != 3 || head.cls != TileClass::kFull) return false;
  const Instr& map = lp.instrs[pc + 1];
  const Instr& ex = lp.instrs[pc + 2];
  const Instr& red = lp.instrs[pc + 3];
  const auto f32 = [&](const Operand& o) { return f32_operand(lp, o); };
  if (!bc::is_binary(map.op) ||
      (bc::binary_of(map.op) != BinaryOp::kAdd && bc::binary_of(map.op) != BinaryOp::kSub))
    return false;
  if (!bc::chain_keeps(head.aux, 0) || bc::chain_keeps(head.aux, 1) ||
      map.d.kind != OperandKind::kReg || map.d.cls != TileClass::kFull || !f32(map.a) ||
      !f32(map.b) || column_inc(lp, map.a) != 1 || column_inc(lp, map.b) < 0)
    return false;
  if (!bc::is_unary(ex.op) || bc::unary_of(ex.op) != UnaryOp::kExp || ex.flags != 0 ||
      !is_reg(ex.a, map.d.index) || ex.d.kind != OperandKind::kReg || ex.d.index == map.d.index)
    return false;
  return red.op == bc::Opcode::kReduce && bc::aux_reduce_op(red.aux) == ReduceOp::kSum &&
         bc::aux_cols(red.aux) && !bc::aux_rows(red.aux) && is_reg(red.a, ex.d.index) &&
         red.d.kind == OperandKind::kReg && red.d.index != map.d.index && red.d.index != ex.d.index;
}

// The scratch strips of a chain's registers (see LoadedProgram::chain_slot): chain-local
// values get strips in program order; a strip is reused once its value is dead (in place
// included: the row kernels are elementwise). The last instruction writes its destination
// in place.
void plan_chain(LoadedProgram* lp, size_t pc) {
  const uint16_t aux = lp->instrs[pc].aux;
  const int k = bc::chain_length(aux);
  const Instr* body = &lp->instrs[pc + 1];
  plan_half(lp, pc);
  int slot_reg[bc::kMaxChainBody - 1];  // register held by each strip, -1 free
  int slots = 0;
  auto slot_of = [&](int reg) {
    for (int s = 0; s < slots; ++s)
      if (slot_reg[s] == reg) return s;
    return -1;
  };
  for (int i = 0; i < k; ++i) {
    const Instr& in = body[i];
    std::array<int8_t, 4>& plan = lp->chain_slot[pc + 1 + i];
    plan.fill(-1);
    const Operand* src[3] = {&in.a, &in.b, &in.c};
    for (int f = 0; f < 3; ++f)
      if (src[f]->kind == OperandKind::kReg)
        plan[f + 1] = static_cast<int8_t>(slot_of(src[f]->index));
    // Free the strips whose values are not read again (before being redefined).
    for (int s = 0; s < slots; ++s)
      if (slot_reg[s] >= 0 && !read_again(body, k, i + 1, slot_reg[s])) slot_reg[s] = -1;
    // The last member, a reduction's accumulator and a kept value are written in place.
    if (i + 1 == k || bc::chain_reduce_op(in)) {
      if (i + 1 == k && in.d.kind == OperandKind::kReg)
        plan[0] = static_cast<int8_t>(slot_of(in.d.index));
      continue;
    }
    for (int t = 0; t < slots; ++t)  // a redefinition: later reads see the new value only
      if (slot_reg[t] == in.d.index) slot_reg[t] = -1;
    if (bc::chain_keeps(aux, i)) continue;
    int s = slot_of(-1);
    if (s < 0) s = slots++;
    slot_reg[s] = in.d.index;
    plan[0] = static_cast<int8_t>(s);
  }
  // Which fields each executed kernel call accesses: a fused group reads its inputs and
  // writes its last member's destination; members it swallowed are never run.
  bool direct = true;
  const auto touches_scratch = [&](int m, std::initializer_list<int> fields) {
    for (int f : fields)
      if (lp->chain_slot[pc + 1 + m][f] >= 0) direct = false;
  };
  const auto half = [&](int m) {  // m may be past the body (the last members' neighbours)
    if (m >= k) return false;
    const LoadedProgram::HalfPlan& h = lp->chain_half[pc + 1 + m];
    return h.absorbed || h.load >= 0 || h.store >= 0;
  };
  for (int i = 0; i < k;) {
    int8_t& fuse = lp->chain_fuse[pc + 1 + i];
    if (half(i)) {  // alone: absorbed (runs in another member) or a half kernel
      const LoadedProgram::HalfPlan& h = lp->chain_half[pc + 1 + i];
      if (!h.absorbed) {
        touches_scratch(i, {h.load >= 0 ? (h.swap ? 1 : 2) : 1, 3});
        if (h.load < 0) touches_scratch(i, {2});
        if (h.store < 0) touches_scratch(i, {0});
      }
      i += 1;
      continue;
    }
    if (i + 1 == k) {  // the last member, on its own
      touches_scratch(i, {0, 1, 2, 3});
      break;
    }
    if (half(i + 1) || half(i + 2)) {  // fuses with no member that has a half plan
      touches_scratch(i, {0, 1, 2, 3});
      i += 1;
      continue;
    }
    const bool keep0 = bc::chain_keeps(aux, i), keep1 = bc::chain_keeps(aux, i + 1);
    if (!keep0 && !keep1 && neg_feeds_mul_fma(body, k, i)) {
      fuse = LoadedProgram::kFuseNegMulFma;
      const bool neg_first = is_reg(body[i + 1].a, body[i].d.index);
      touches_scratch(i, {1});
      touches_scratch(i + 1, {neg_first ? 2 : 1});
      touches_scratch(i + 2, {0, 1, 2});
      i += 3;
    } else if (!keep0 && mul_feeds_fma_factor(body, k, i)) {
      fuse = LoadedProgram::kFuseMulFmaFactor;
      const bool first = is_reg(body[i + 1].a, body[i].d.index);
      touches_scratch(i, {1, 2});
      touches_scratch(i + 1, {0, first ? 2 : 1, 3});
      i += 2;
    } else if (!keep0 && mul_feeds_fma_addend(body, k, i)) {
      fuse = LoadedProgram::kFuseMulFma;
      touches_scratch(i, {1, 2});
      touches_scratch(i + 1, {0, 1, 2});
      i += 2;
    } else if (!keep0 && (fuse = static_cast<int8_t>(fusable_pair(body, k, i))) != 0) {
      touches_scratch(i, {1, 2});
      touches_scratch(i + 1, {0, fuse == 1 ? 2 : 1});
      i += 2;  // body[i + 1] is the pair's mul
    } else {
      touches_scratch(i, {0, 1, 2, 3});
      i += 1;
    }
  }
  lp->chain_direct[pc] = direct;
}

// Is the body of the loop at `pc` only chains whose register operands are all chain-local
// (so that no tile register carries a value between trips or chains)?
bool only_chains(const LoadedProgram& lp, size_t pc) {
  const size_t stop = static_cast<size_t>(lp.loop_end[pc]);
  if (stop <= pc + 1) return false;
  for (size_t c = pc + 1; c < stop; c += bc::chain_length(lp.instrs[c].aux) + 1) {
    if (lp.instrs[c].op != bc::Opcode::kChain) return false;
    for (size_t i = c + 1; i <= c + bc::chain_length(lp.instrs[c].aux) && i < stop; ++i) {
      const Instr& in = lp.instrs[i];
      const Operand* field[4] = {&in.d, &in.a, &in.b, &in.c};
      for (int f = 0; f < chain_fields(in); ++f)
        if (field[f]->kind == OperandKind::kReg && lp.chain_slot[i][f] < 0) return false;
    }
  }
  return true;
}

// Is the chain at `pc` one fused (neg,) mul, fma group over memory (no strips)?
bool single_mul_add(const LoadedProgram& lp, size_t pc) {
  const int k = bc::chain_length(lp.instrs[pc].aux);
  const int8_t f = lp.chain_fuse[pc + 1];
  return lp.chain_direct[pc] && ((f == LoadedProgram::kFuseMulFma && k == 2) ||
                                 (f == LoadedProgram::kFuseNegMulFma && k == 3));
}

// Does a source of the chain at `pc` name the tensor slot or register that `w` writes?
bool chain_reads(const LoadedProgram& lp, size_t pc, const Operand& w) {
  for (size_t i = pc + 1; i <= pc + bc::chain_length(lp.instrs[pc].aux); ++i) {
    const Instr& in = lp.instrs[i];
    const Operand* src[3] = {&in.a, &in.b, &in.c};
    for (int f = 1; f < chain_fields(in); ++f) {
      const Operand& o = *src[f - 1];
      if (o.kind != w.kind) continue;
      if (o.kind == OperandKind::kReg && o.index == w.index) return true;
      if (o.kind == OperandKind::kDesc &&
          lp.program.descs[o.index].slot == lp.program.descs[w.index].slot)
        return true;
    }
  }
  return false;
}

// Can the chain at `pc` and the next instruction, a chain, run row by row in one pass
// (cpu::fused_mul_add_pair_f32_rows)? Both are one direct (neg,) mul, fma group over the
// same tile class, and neither reads what the other writes (the tensor slot or register of
// the other's destination). Their destinations may share a slot (rotary's two halves of y):
// an encoded program writes each output element once, so the row order of two disjoint
// writes does not matter.
bool chain_pair(const LoadedProgram& lp, size_t pc) {
  const size_t next = pc + bc::chain_length(lp.instrs[pc].aux) + 1;
  if (next >= lp.instrs.size() || lp.instrs[next].op != bc::Opcode::kChain) return false;
  if (!single_mul_add(lp, pc) || !single_mul_add(lp, next)) return false;
  if (lp.instrs[pc].cls != lp.instrs[next].cls) return false;
  const Operand& wa = lp.instrs[pc + bc::chain_length(lp.instrs[pc].aux)].d;
  const Operand& wb = lp.instrs[next + bc::chain_length(lp.instrs[next].aux)].d;
  return !chain_reads(lp, next, wa) && !chain_reads(lp, pc, wb);
}

// The loop at `pc` is fill r.col; reduce r.col, m over rows; store m', r.col; endloop, all
// f32 (LoadedProgram::loop_col_reduce), its source and destination distinct memory.
bool col_reduce_loop(const LoadedProgram& lp, size_t pc) {
  if (static_cast<size_t>(lp.loop_end[pc]) != pc + 4) return false;
  const Instr& fill = lp.instrs[pc + 1];
  const Instr& red = lp.instrs[pc + 2];
  const Instr& st = lp.instrs[pc + 3];
  const bc::Program& prog = lp.program;
  const bool f32 = fill.ctype == CType::kF32 && red.ctype == CType::kF32 && st.ctype == CType::kF32;
  if (!f32 || fill.op != bc::Opcode::kFill || red.op != bc::Opcode::kReduce ||
      st.op != bc::Opcode::kStore || fill.cls != TileClass::kCol || st.cls != TileClass::kCol ||
      red.cls != TileClass::kFull || bc::aux_reduce_op(fill.aux) != bc::aux_reduce_op(red.aux) ||
      !bc::aux_rows(red.aux) || bc::aux_cols(red.aux))
    return false;
  const auto acc = [&](const Operand& o) {
    return is_reg(o, fill.d.index) && o.cls == TileClass::kCol;
  };
  if (!acc(red.d) || !acc(st.a) || red.a.kind != OperandKind::kDesc ||
      st.d.kind != OperandKind::kDesc)
    return false;
  const bc::Descriptor& src = prog.descs[red.a.index];
  const bc::Descriptor& dst = prog.descs[st.d.index];
  return src.dtype == DType::kF32 && dst.dtype == DType::kF32 &&
         lp.desc_slot[red.a.index] != lp.desc_slot[st.d.index];
}

// Trips of the loop of chains at `pc` that its chains take in turns (exec_loop_of_chains):
// as many as keep the memory one trip's chains touch (each descriptor once) within
// kLoopBatchBytes, at least one.
int64_t loop_batch(const LoadedProgram& lp, size_t pc) {
  const bc::Program& prog = lp.program;
  const int64_t rows = lp.row_axis >= 0 ? prog.axes[lp.row_axis].chunk : 1;
  const int64_t cols = lp.col_axis >= 0 ? prog.axes[lp.col_axis].chunk : 1;
  std::vector<char> seen(prog.descs.size(), 0);
  int64_t bytes = 0;
  const size_t stop = static_cast<size_t>(lp.loop_end[pc]);
  for (size_t i = pc + 1; i < stop; ++i) {
    const Instr& in = lp.instrs[i];
    if (in.op == bc::Opcode::kChain) continue;
    const Operand* field[4] = {&in.d, &in.a, &in.b, &in.c};
    for (int f = 0; f < chain_fields(in); ++f) {
      if (field[f]->kind != OperandKind::kDesc || seen[field[f]->index]) continue;
      seen[field[f]->index] = 1;
      const bc::Descriptor& d = prog.descs[field[f]->index];
      const int64_t r = lp.row_axis >= 0 && d.stride[lp.row_axis] != 0 ? rows : 1;
      const int64_t c = lp.col_axis >= 0 && d.stride[lp.col_axis] != 0 ? cols : 1;
      bytes += r * c * dtype_size(d.dtype);
    }
  }
  return std::max<int64_t>(1, kLoopBatchBytes / std::max<int64_t>(1, bytes));
}

// LoadedProgram::prefetch_descs: a program without loops, one column tile (its rows whole),
// and descriptors only read, each walking its tile's rows back to back.
void plan_prefetch(LoadedProgram* lp) {
  const bc::Program& prog = lp->program;
  if (lp->col_axis < 0) return;
  for (const bc::Axis& ax : prog.axes)
    if (ax.iter == bc::AxisIter::kLoop) return;
  const bc::Axis& col = prog.axes[lp->col_axis];
  if (col.chunk < col.extent) return;
  // Every field naming a descriptor counts, used by the op or not (the verifier checks only
  // the fields an op uses, so an unused one may hold anything: indices are bounds-checked).
  // A stray mark only drops a descriptor from the plan or prefetches one the program does not
  // read; a prefetch reads nothing.
  const size_t nd = prog.descs.size();
  std::vector<char> read(nd, 0), written(nd, 0);
  const auto desc = [nd](const Operand& o) { return o.kind == OperandKind::kDesc && o.index < nd; };
  for (const bc::Instr& in : lp->instrs) {
    if (in.op == bc::Opcode::kLoop || in.op == bc::Opcode::kEndLoop || in.op == bc::Opcode::kChain)
      continue;
    if (desc(in.d)) written[in.d.index] = 1;
    for (const Operand* o : {&in.a, &in.b, &in.c})
      if (desc(*o)) read[o->index] = 1;
  }
  std::vector<char> queued(nd, 0);
  for (size_t d = 0; d < nd; ++d) {
    const bool rows_back_to_back = lp->row_axis < 0 || lp->desc_rs[d] == col.extent;
    if (read[d] && !written[d] && lp->desc_cs[d] == 1 && rows_back_to_back &&
        lp->prefetch_descs.size() < cpu::PrefetchQueue::kMaxSpans) {
      lp->prefetch_descs.push_back(static_cast<int>(d));
      queued[d] = 1;
    }
  }
  // The first top-level instruction (a chain with its body) reading a queued descriptor.
  const auto reads_queued = [&](const bc::Instr& in) {
    for (const Operand* o : {&in.a, &in.b, &in.c})
      if (desc(*o) && queued[o->index]) return true;
    return false;
  };
  const int32_t n = static_cast<int32_t>(lp->instrs.size());
  for (int32_t pc = 0; pc < n; ++pc) {
    const int32_t last = lp->instrs[pc].op == bc::Opcode::kChain
                             ? std::min(n - 1, pc + bc::chain_length(lp->instrs[pc].aux))
                             : pc;
    bool reads = false;
    for (int32_t i = pc; i <= last; ++i) reads = reads || reads_queued(lp->instrs[i]);
    if (reads) {
      if (last + 1 < n) lp->prefetch_at = last + 1;  // else no later pass would drain it
      break;
    }
    pc = last;
  }
  if (lp->prefetch_at < 0) lp->prefetch_descs.clear();
}

// The opcodes, types and flags a row program runs (RowStep's kinds: f32 loads and stores
// without conversion, value-producing unaries, optionally after an add or sub, add / sub /
// mul / div / max / min, fma, sum / max / min fills and row reductions, dots); whether its
// operands fit is RowPlanner's to decide. Also the CPU target's row_program_instr.
bool row_program_instr(const bc::Instr& in) {
  if (in.ctype != CType::kF32) return false;
  switch (in.op) {
    case bc::Opcode::kLoad:
    case bc::Opcode::kStore:
    case bc::Opcode::kFma:
      return in.flags == 0;
    case bc::Opcode::kReduceDot:
      return true;
    case bc::Opcode::kFill:
    case bc::Opcode::kReduce: {
      const ReduceOp r = bc::aux_reduce_op(in.aux);
      return r == ReduceOp::kSum || r == ReduceOp::kMax || r == ReduceOp::kMin;
    }
    default:
      break;
  }
  if (bc::is_unary(in.op)) {
    return !ops::is_predicate(bc::unary_of(in.op)) &&
           (in.flags == 0 || in.flags == bc::kPreAdd || in.flags == bc::kPreSub);
  }
  if (bc::is_binary(in.op)) {
    const BinaryOp b = bc::binary_of(in.op);
    return in.flags == 0 &&
           (b == BinaryOp::kAdd || b == BinaryOp::kSub || b == BinaryOp::kMul ||
            b == BinaryOp::kDiv || b == BinaryOp::kMaximum || b == BinaryOp::kMinimum);
  }
  return false;
}

// LoadedProgram::row_steps and what goes with them, or nothing: see there for the conditions.
// A reduction in a chain that runs strip by strip keeps its strips (RowStep::strip), so that
// every row reduces in the order the instruction-by-instruction path uses.
constexpr int64_t kMinRowProgramCols = 128;

class RowPlanner {
 public:
  explicit RowPlanner(LoadedProgram* lp) : lp_(*lp), prog_(lp->program) {}

  bool plan() {
    // Rows shorter than kMinRowProgramCols run faster through the tile kernels, which take
    // many short rows per call (rmsnorm rows of 64: 0.73-0.97x as row programs).
    if (lp_.row_axis < 0 || lp_.col_axis < 0 || prog_.axes[lp_.col_axis].chunk < kMinRowProgramCols)
      return false;
    int64_t chain_end = -1, chain_strip = 0;
    for (size_t pc = 0; pc < lp_.instrs.size(); ++pc) {
      const Instr& in = lp_.instrs[pc];
      if (in.op == bc::Opcode::kChain) {
        chain_end = static_cast<int64_t>(pc) + bc::chain_length(in.aux);
        const bool strips = !lp_.chain_direct[pc] && !lp_.chain_sum_exp[pc];
        chain_strip = strips ? kChainStrip : 0;
        continue;
      }
      cpu::RowStep st;
      if (!step(in, &st)) return false;
      if (st.kind == cpu::RowStep::kReduce || st.kind == cpu::RowStep::kDot)
        st.strip = static_cast<int32_t>(static_cast<int64_t>(pc) <= chain_end ? chain_strip : 0);
      lp_.row_steps.push_back(st);
    }
    const int64_t cols = prog_.axes[lp_.col_axis].chunk;
    lp_.row_bytes = (full_regs_ + row_mems_) * cols * static_cast<int64_t>(sizeof(float));
    // Only programs that reduce rows: their later passes reread the rows, which bands keep
    // in L1; maps alone stream through as well instruction by instruction, in fewer calls.
    std::vector<cpu::RowStep>& steps = lp_.row_steps;
    if (std::none_of(steps.begin(), steps.end(), [](const cpu::RowStep& st) {
          return st.kind == cpu::RowStep::kReduce || st.kind == cpu::RowStep::kDot;
        }))
      return false;
    fuse_map_reduce();
    fuse_pairs();
    mark_first_reads();
    return true;
  }

 private:
  bool step(const Instr& in, cpu::RowStep* st) {
    using K = cpu::RowStep;
    if (!row_program_instr(in)) return false;
    st->cls = static_cast<uint8_t>(in.cls);
    const bool row_reduction = !bc::aux_rows(in.aux) && bc::aux_cols(in.aux) &&
                               in.cls == TileClass::kFull && in.d.kind == OperandKind::kReg &&
                               in.d.cls == TileClass::kRow;
    int fields = 3;
    if (in.op == bc::Opcode::kLoad || in.op == bc::Opcode::kStore) {
      st->kind = K::kCopy;
      fields = 2;
    } else if (bc::is_unary(in.op)) {
      st->kind = K::kUnary;
      st->op = static_cast<uint8_t>(bc::unary_of(in.op));
      st->pre = in.flags == bc::kPreAdd ? 1 : in.flags == bc::kPreSub ? 2 : 0;
      fields = st->pre != 0 ? 3 : 2;
    } else if (bc::is_binary(in.op)) {
      st->kind = K::kBinary;
      st->op = static_cast<uint8_t>(bc::binary_of(in.op));
    } else if (in.op == bc::Opcode::kFma) {
      st->kind = K::kFma;
      fields = 4;
    } else if (in.op == bc::Opcode::kFill || in.op == bc::Opcode::kReduce) {
      st->kind = in.op == bc::Opcode::kFill ? K::kFill : K::kReduce;
      st->op = static_cast<uint8_t>(bc::aux_reduce_op(in.aux));
      if (st->kind == K::kReduce && !row_reduction) return false;
      fields = st->kind == K::kFill ? 1 : 2;
    } else {  // kReduceDot
      if (!row_reduction) return false;
      st->kind = K::kDot;
    }
    const Operand* src[3] = {&in.a, &in.b, &in.c};
    const bool reduction = st->kind == K::kReduce || st->kind == K::kDot;
    if (!operand(in.d, reduction ? TileClass::kRow : in.cls, true, &st->d)) return false;
    cpu::RowOperand* out[3] = {&st->a, &st->b, &st->c};
    for (int f = 1; f < fields; ++f) {
      const Operand& o = *src[f - 1];
      if (!operand(o, in.cls, false, out[f - 1])) return false;
      // A column or scalar value is recomputed by every band: it must not read itself.
      if (!bc::class_has_rows(in.cls) && o.kind == OperandKind::kReg &&
          in.d.kind == OperandKind::kReg && o.index == in.d.index)
        return false;
    }
    return true;
  }

  // Maps one operand of an instruction of class `cls`; false where a row program cannot
  // take it (see RowOperand and row_program.cc's operand rules).
  bool operand(const Operand& o, TileClass cls, bool dst, cpu::RowOperand* out) {
    using R = cpu::RowOperand;
    switch (o.kind) {
      case OperandKind::kDesc: {
        if (o.index >= prog_.descs.size() || prog_.descs[o.index].dtype != DType::kF32)
          return false;
        const int64_t cs = lp_.desc_cs[o.index], rs = lp_.desc_rs[o.index];
        if (cs != 0 && cs != 1) return false;
        if (dst && cls == TileClass::kFull && cs != 1) return false;
        if (!dst && !lp_.desc_read_only[o.index]) return false;
        out->kind = R::kMem;
        out->index = index_of(&lp_.row_mem_desc, o.index);
        if (cls == TileClass::kFull && rs != 0 && counted_mems_.insert(o.index).second) ++row_mems_;
        return lp_.row_mem_desc.size() <= kMaxOperands;
      }
      case OperandKind::kReg: {
        static constexpr R::Kind kinds[] = {R::kFull, R::kRow, R::kCol, R::kScalar};
        out->kind = kinds[static_cast<int>(o.cls)];
        out->index = static_cast<int16_t>(o.index);
        // A row step reads rows and scalars, a column step columns and scalars.
        const bool fits = cls == TileClass::kFull || o.cls == TileClass::kScalar || o.cls == cls;
        if (!fits || (dst && o.cls != cls)) return false;
        if (o.cls == TileClass::kFull && counted_regs_.insert(o.index).second) ++full_regs_;
        return true;
      }
      case OperandKind::kConst:
      case OperandKind::kParam:
        if (dst) return false;
        out->kind = R::kValue;
        out->index =
            index_of(&lp_.row_values, o.kind == OperandKind::kConst ? o.index : -1 - o.index);
        return lp_.row_values.size() <= kMaxOperands;
    }
    return false;
  }

  using R = cpu::RowOperand;
  using K = cpu::RowStep;
  static bool is_reg(const R& o) {
    return o.kind == R::kFull || o.kind == R::kRow || o.kind == R::kCol || o.kind == R::kScalar;
  }
  static bool reads(const K& st, int reg) {
    for (const R* o : {&st.a, &st.b, &st.c})
      if (is_reg(*o) && o->index == reg) return true;
    return false;
  }
  static bool add_sub_mul(uint8_t op) {
    const auto b = static_cast<BinaryOp>(op);
    return b == BinaryOp::kAdd || b == BinaryOp::kSub || b == BinaryOp::kMul;
  }
  // Is full register `reg` read by no step from `from` on before one writes it?
  bool dead_from(size_t from, int reg) const {
    const std::vector<K>& steps = lp_.row_steps;
    for (size_t k = from; k < steps.size(); ++k) {
      if (reads(steps[k], reg)) return false;
      if (is_reg(steps[k].d) && steps[k].d.index == reg) return true;
    }
    return true;
  }

  // A full map followed (a fill of the accumulator between or not) by the row reduction of
  // its result: one pass (RowStep::red), as BlockRunner::exec_map_reduce runs such pairs;
  // also an add/sub whose result's exponentials only a sum reads (log-softmax, kRedSumExp:
  // the exponentials are never stored, as in LoadedProgram::chain_sum_exp).
  void fuse_map_reduce() {
    std::vector<K>& steps = lp_.row_steps;
    for (size_t i = 0; i < steps.size(); ++i) {
      K& m = steps[i];
      const bool add_sub = m.kind == K::kBinary && add_sub_mul(m.op) &&
                           static_cast<BinaryOp>(m.op) != BinaryOp::kMul;
      const bool mappable = m.kind == K::kCopy || m.kind == K::kFma ||
                            (m.kind == K::kBinary && add_sub_mul(m.op)) ||
                            (m.kind == K::kUnary && static_cast<UnaryOp>(m.op) == UnaryOp::kExp);
      if (!mappable || m.cls != 0 || m.red != K::kNoRed || m.d.kind != R::kFull) continue;
      const int y = m.d.index;
      const auto full = [](const R& o, int reg) { return o.kind == R::kFull && o.index == reg; };
      size_t j = i + 1;
      int z = -1;  // exp(y)'s register, when only a sum reads it
      if (add_sub && j < steps.size()) {
        const K& e = steps[j];
        if (e.kind == K::kUnary && static_cast<UnaryOp>(e.op) == UnaryOp::kExp && e.pre == 0 &&
            e.cls == 0 && e.red == K::kNoRed && full(e.a, y) && e.d.kind == R::kFull &&
            e.d.index != y) {
          z = e.d.index;
          ++j;
        }
      }
      const bool fill = j < steps.size() && steps[j].kind == K::kFill;
      if (fill) ++j;
      if (j >= steps.size() || steps[j].strip != 0) continue;
      const K& red = steps[j];
      const int src = z >= 0 ? z : y;
      K::Red kind = K::kNoRed;
      if (red.kind == K::kReduce && full(red.a, src)) {
        const auto op = static_cast<ReduceOp>(red.op);
        kind = z >= 0                 ? (op == ReduceOp::kSum ? K::kRedSumExp : K::kNoRed)
               : op == ReduceOp::kSum ? K::kRedSum
               : op == ReduceOp::kMax ? K::kRedMax
                                      : K::kRedMin;
      } else if (red.kind == K::kDot && z < 0 && full(red.a, y) && full(red.b, y)) {
        kind = K::kRedSumSquares;
      }
      if (kind == K::kNoRed || red.d.index == y || red.d.index == src) continue;
      const uint32_t carried = m.kind == K::kUnary ? cpu::kExpReductions
                               : add_sub           ? cpu::kAddSubReductions
                                                   : cpu::kMapReductions;
      if (!(carried & cpu::red_bit(kind))) continue;
      if (fill && steps[j - 1].d.index != red.d.index) continue;
      if (z >= 0 && !dead_from(j + 1, z)) continue;
      m.red = kind;
      m.red_init = fill;
      m.red_d = red.d;
      steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(i + 1),
                  steps.begin() + static_cast<std::ptrdiff_t>(j + 1));
    }
  }

  // Two full add/sub/mul steps where the second alone reads the first's result: one pass
  // (RowStep::kBinary2), as the chains' fused kernels run such pairs.
  void fuse_pairs() {
    std::vector<K>& steps = lp_.row_steps;
    for (size_t i = 0; i + 1 < steps.size(); ++i) {
      const K& f = steps[i];
      const K& g = steps[i + 1];
      const auto plain = [](const K& st) {
        return st.kind == K::kBinary && add_sub_mul(st.op) && st.cls == 0 && st.red == K::kNoRed;
      };
      if (!plain(f) || !plain(g) || f.d.kind != R::kFull) continue;
      const int y = f.d.index;
      const auto is_y = [y](const R& o) { return is_reg(o) && o.index == y; };
      const bool first = is_y(g.a), second = is_y(g.b);
      if (first == second || (first ? g.a : g.b).kind != R::kFull || !dead_from(i + 2, y)) continue;
      K fused = g;
      fused.kind = K::kBinary2;
      fused.op = f.op;
      fused.op2 = g.op;
      fused.pos = first ? 0 : 1;
      fused.a = f.a;
      fused.b = f.b;
      fused.c = first ? g.b : g.a;
      steps[i] = fused;
      steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(i + 1));
    }
  }

  // RowStep::first_reads: the memory sources each step is the first to read.
  void mark_first_reads() {
    static_assert(kMaxOperands <= 32, "a bit of first_reads per memory operand");
    uint32_t seen = 0;
    for (K& st : lp_.row_steps) {
      uint32_t reads = 0;
      for (const R* o : {&st.a, &st.b, &st.c})
        if (o->kind == R::kMem) reads |= uint32_t{1} << o->index;  // index < kMaxOperands
      st.first_reads = reads & ~seen;
      seen |= reads;
    }
  }

  static int16_t index_of(std::vector<int>* list, int v) {
    const auto it = std::find(list->begin(), list->end(), v);
    if (it != list->end()) return static_cast<int16_t>(it - list->begin());
    list->push_back(v);
    return static_cast<int16_t>(list->size() - 1);
  }

  static constexpr size_t kMaxOperands = 32;  // BlockRunner::run_row_program's arrays
  LoadedProgram& lp_;
  const bc::Program& prog_;
  std::set<int> counted_regs_, counted_mems_;
  int64_t full_regs_ = 0, row_mems_ = 0;
};

// LoadedProgram::bytes_per_work: each argument slot counted once, at its widest element, if
// one of its descriptors walks the tile's columns and (where the tile has rows) its rows.
void plan_bytes_per_work(LoadedProgram* lp) {
  lp->bytes_per_work = 0;
  for (const bc::Instr& in : lp->instrs)
    if (in.op == bc::Opcode::kMatMul) return;
  std::vector<int64_t> slot_bytes;
  for (size_t d = 0; d < lp->desc_slot.size(); ++d) {
    const bool full =
        (lp->col_axis < 0 || lp->desc_cs[d] != 0) && (lp->row_axis < 0 || lp->desc_rs[d] != 0);
    if (!full) continue;
    const size_t slot = static_cast<size_t>(lp->desc_slot[d]);
    if (slot_bytes.size() <= slot) slot_bytes.resize(slot + 1, 0);
    slot_bytes[slot] = std::max<int64_t>(slot_bytes[slot], lp->desc_es[d]);
  }
  for (int64_t b : slot_bytes) lp->bytes_per_work += b;
}

void plan_row_program(LoadedProgram* lp) {
  if (!RowPlanner(lp).plan()) {
    lp->row_steps.clear();
    lp->row_mem_desc.clear();
    lp->row_values.clear();
    lp->row_bytes = 0;
  }
}

std::shared_ptr<const LoadedProgram> load(bc::Program p) {
  auto lp = std::make_shared<LoadedProgram>();
  lp->program = std::move(p);
  const bc::Program& prog = lp->program;
  lp->instrs.reserve(prog.num_instrs());
  lp->loop_end.assign(prog.num_instrs(), -1);
  std::vector<int32_t> open;
  for (size_t i = 0; i < prog.num_instrs(); ++i) {
    lp->instrs.push_back(prog.instr(i));
    if (lp->instrs.back().op == bc::Opcode::kLoop) open.push_back(static_cast<int32_t>(i));
    if (lp->instrs.back().op == bc::Opcode::kMatMul) {
      lp->work_per_elem = std::max(lp->work_per_elem, prog.axes[lp->instrs.back().aux].extent);
    }
    if (lp->instrs.back().op == bc::Opcode::kEndLoop && !open.empty()) {
      lp->loop_end[open.back()] = static_cast<int32_t>(i);
      lp->loop_end[i] = open.back();
      open.pop_back();
    }
  }
  for (size_t a = 0; a < prog.axes.size(); ++a) {
    const bool grid = prog.axes[a].iter == bc::AxisIter::kGrid;
    lp->grid_axis_trips[a] = grid ? std::max<int64_t>(1, prog.axes[a].trips()) : 1;
  }
  for (size_t a = 0; a < prog.axes.size(); ++a) {
    if (prog.axes[a].tile == bc::AxisTile::kRow) lp->row_axis = static_cast<int>(a);
    if (prog.axes[a].tile == bc::AxisTile::kCol) lp->col_axis = static_cast<int>(a);
  }
  const size_t na = prog.axes.size();
  std::vector<char> written;
  for (const bc::Instr& in : lp->instrs) {
    if (in.d.kind != OperandKind::kDesc || in.d.index >= prog.descs.size()) continue;
    const size_t slot = static_cast<size_t>(prog.descs[in.d.index].slot);
    if (written.size() <= slot) written.resize(slot + 1, 0);
    written[slot] = 1;
  }
  for (const bc::Descriptor& d : prog.descs) {
    const size_t slot = static_cast<size_t>(d.slot);
    lp->desc_read_only.push_back(slot >= written.size() || !written[slot]);
    const int64_t es = dtype_size(d.dtype);
    lp->desc_offset.push_back(d.offset * es);
    lp->desc_slot.push_back(d.slot);
    lp->desc_es.push_back(static_cast<int>(es));
    for (size_t a = 0; a < na; ++a) lp->desc_step.push_back(d.stride[a] * es);
    lp->desc_rs.push_back(lp->row_axis >= 0 ? d.stride[lp->row_axis] : 0);
    lp->desc_cs.push_back(lp->col_axis >= 0 ? d.stride[lp->col_axis] : 0);
  }
  plan_bytes_per_work(lp.get());
  lp->chain_slot.assign(prog.num_instrs(), std::array<int8_t, 4>{-1, -1, -1, -1});
  lp->chain_field.assign(prog.num_instrs(), std::array<LoadedProgram::ChainField, 4>{});
  lp->chain_half.assign(prog.num_instrs(), LoadedProgram::HalfPlan{});
  lp->chain_sum_exp.assign(prog.num_instrs(), 0);
  lp->chain_fuse.assign(prog.num_instrs(), 0);
  lp->chain_direct.assign(prog.num_instrs(), 0);
  for (size_t i = 0; i < prog.num_instrs(); ++i) {
    if (lp->instrs[i].op != bc::Opcode::kChain) continue;
    plan_chain(lp.get(), i);
    plan_chain_fields(lp.get(), i);
    lp->chain_sum_exp[i] = sum_exp_chain(*lp, i);
  }
  lp->chain_pair.assign(prog.num_instrs(), 0);
  for (size_t i = 0; i < prog.num_instrs(); ++i) {
    if (lp->instrs[i].op != bc::Opcode::kChain) continue;
    if (chain_pair(*lp, i)) {
      lp->chain_pair[i] = 1;
      i += bc::chain_length(lp->instrs[i].aux) + 1;  // the second chain pairs with nothing else
    }
    i += bc::chain_length(lp->instrs[i].aux);
  }
  lp->chain_stream.assign(prog.num_instrs(), 0);
  for (size_t i = 0; i < prog.num_instrs(); ++i) {
    if (lp->instrs[i].op != bc::Opcode::kChain) continue;
    const size_t last = i + bc::chain_length(lp->instrs[i].aux);
    lp->chain_stream[i] = lp->chain_direct[i] && (lp->instrs[i].aux >> 8) == 0 &&
                          lp->instrs[last].d.kind == OperandKind::kDesc;
    i = last;
  }
  plan_prefetch(lp.get());
  lp->map_reduce.assign(prog.num_instrs(), 0);
  for (size_t i = 0; i < prog.num_instrs(); ++i) {
    if (lp->instrs[i].op == bc::Opcode::kChain) {
      i += bc::chain_length(lp->instrs[i].aux);  // bodies run inside their chain
      continue;
    }
    lp->map_reduce[i] = static_cast<int8_t>(map_reduce_pair(lp->instrs, i));
  }
  lp->loop_of_chains.assign(prog.num_instrs(), 0);
  lp->loop_stream.assign(prog.num_instrs(), 0);
  lp->loop_batch.assign(prog.num_instrs(), 1);
  lp->loop_col_reduce.assign(prog.num_instrs(), 0);
  for (size_t i = 0; i < prog.num_instrs(); ++i) {
    if (lp->instrs[i].op != bc::Opcode::kLoop) continue;
    // Trips of a tile axis change the active rows or columns: not batched.
    const bool tile_axis = prog.axes[lp->instrs[i].aux].tile != bc::AxisTile::kNone;
    lp->loop_of_chains[i] = !tile_axis && only_chains(*lp, i);
    if (lp->loop_of_chains[i]) {
      lp->loop_batch[i] = loop_batch(*lp, i);
      bool stream = true;
      for (size_t c = i + 1; c < static_cast<size_t>(lp->loop_end[i]);
           c += bc::chain_length(lp->instrs[c].aux) + 1)
        stream = stream && lp->chain_stream[c];
      lp->loop_stream[i] = stream;
    }
    lp->loop_col_reduce[i] = !tile_axis && col_reduce_loop(*lp, i);
  }
  for (const bc::Axis& ax : prog.axes) {
    if (ax.iter != bc::AxisIter::kLoop) continue;
    int64_t trips = ax.trips();
    if (ax.split_by >= 0) trips /= std::max<int64_t>(1, prog.axes[ax.split_by].extent);
    lp->trips_per_block = std::min<int64_t>(lp->trips_per_block, int64_t{1} << 31) *
                          std::min<int64_t>(std::max<int64_t>(1, trips), int64_t{1} << 31);
  }
  plan_row_program(lp.get());
  return lp;
}

const bc::Target& cpu_target() {
  static const bc::Target target = [] {
    bc::Target t;
    t.name = "cpu";
    cpu::GemmTile pref = cpu::gemm_preferred_tile(), micro = cpu::gemm_micro_tile();
    t.matmul_tile_m = pref.m;
    t.matmul_tile_n = pref.n;
    t.matmul_micro_m = micro.m;
    t.matmul_micro_n = micro.n;
    t.min_parallel_work = kMinParallelWork;
    t.row_program_instr = &row_program_instr;  // RowPlanner, row_program.h
    return t;
  }();
  return target;
}

}  // namespace dvm::vm
