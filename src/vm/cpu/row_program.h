// Row programs: a whole block of a row-independent f32 program in one kernel call. The block's
// rows are walked in bands that fit L1, and every instruction runs over a band before the next
// band starts, so a norm's or softmax's passes over a row (reduce, then map with the result,
// reduce again, map again) read it from L1, as a hand-written fused loop does, and the block
// pays one dispatch instead of one per instruction. Each instruction computes exactly what its
// tile kernel computes (the same vector math, a row reduced in the same order), so a row's
// results do not depend on whether it ran here or instruction by instruction.
#pragma once

#include <cstdint>

namespace dvm::vm::cpu {

// Where an operand of a step lives. Registers (kFull, kRow, kCol, kScalar) are buffers laid
// out for one band: a full tile register holds the band's rows back to back (cols apart), a
// row register one value per band row, a column register one row of cols values, a scalar
// register one value.
struct RowOperand {
  enum Kind : uint8_t { kNone, kMem, kFull, kRow, kCol, kScalar, kValue };
  Kind kind = kNone;
  int16_t index = 0;  // kMem: RowProgramArgs::mem; a register's number; kValue: values
};

// One instruction. Its class (a bc::TileClass: 0 full, 1 row, 2 column, 3 scalar) sets what it
// walks: a full step the band's rows x cols, a row step one value per band row, a column step
// one row of cols values, a scalar step one value.
struct RowStep {
  enum Kind : uint8_t {
    kCopy,     // d = a (an f32 load or store)
    kUnary,    // d = op(a), or op(a + b) / op(a - b) (pre 1 / 2); op a value-producing UnaryOp
    kBinary,   // d = a op b; op add, sub, mul, div, maximum or minimum
    kFma,      // d = a * b + c, one rounding
    kFill,     // d = the identity of reduction op (sum, max, min)
    kReduce,   // d (a row register) op= the reduction of each row of a (full step)
    kDot,      // d (a row register) += sum over each row of a * b (full step)
    kBinary2,  // d = op2(a op b, c) (pos 0) or op2(c, a op b) (pos 1): two binary steps in one
               // pass (the first's result read by the second only); add, sub and mul
  };
  Kind kind = kCopy;
  uint8_t op = 0;   // UnaryOp, BinaryOp or ReduceOp
  uint8_t pre = 0;  // kUnary
  uint8_t cls = 0;
  // kReduce, kDot: rows reduced in parts of this many columns, each part combined into the
  // accumulator in turn (a reduction in a chain that runs strip by strip); 0: whole rows.
  int32_t strip = 0;
  RowOperand d, a, b, c;
  uint8_t op2 = 0, pos = 0;  // kBinary2
  // A full map (kCopy, kBinary add/sub/mul, kFma, kUnary exp) whose result y the program then
  // reduces along the rows: the reduction runs in the map's pass, as cpu::map_reduce_f32_rows
  // runs it (the same order as a separate kReduce / kDot), into row register red_d: of y,
  // of y * y (kRedSumSquares) or of exp(y) (kRedSumExp: log-softmax's exp(x - max), whose
  // exponentials are read by nothing else). red_init: the accumulator is first set to the
  // reduction's identity (a fill the map's pass replaces: the map may read the register's old
  // value, as a norm's centring reads the mean whose register then sums the squares).
  enum Red : uint8_t { kNoRed, kRedSum, kRedMax, kRedMin, kRedSumSquares, kRedSumExp };
  Red red = kNoRed;
  bool red_init = false;
  RowOperand red_d;
  // The memory operands (bit i: RowProgramArgs::mem[i]) this step is the first to read: in a
  // streamed launch it fetches their rows ahead (row_program.cc's Ahead).
  uint32_t first_reads = 0;
};

// The reductions (bits 1 << RowStep::Red) the pass of a full map step can carry: any map a
// sum, max, min or sum of squares of its result; an add or sub also the sum of its
// exponentials (log-softmax's x - max); exp only a sum (softmax's numerator). The planner fuses
// no other pair and row_program.cc compiles no other: each is a copy of the map's loops.
constexpr uint32_t red_bit(RowStep::Red r) {
  return uint32_t{1} << r;
}
inline constexpr uint32_t kMapReductions = red_bit(RowStep::kRedSum) | red_bit(RowStep::kRedMax) |
                                           red_bit(RowStep::kRedMin) |
                                           red_bit(RowStep::kRedSumSquares);
inline constexpr uint32_t kAddSubReductions = kMapReductions | red_bit(RowStep::kRedSumExp);
inline constexpr uint32_t kExpReductions = red_bit(RowStep::kRedSum);

// A memory operand at the block's first row: element (r, c) at base[r * rs + c * cs], cs 0 or 1.
struct RowMem {
  float* base;
  int64_t rs, cs;
};

struct RowProgramArgs {
  const RowStep* steps = nullptr;
  int32_t num_steps = 0;
  const RowMem* mem = nullptr;
  const float* const* values = nullptr;  // constants and params
  int64_t rows = 0, cols = 0;            // the block
  int64_t band_rows = 1;                 // rows per band, at most kMaxRowBand
  // The launch streams its stores (set_stream_stores): full rows stored to memory go around
  // the caches where they start on a vector boundary.
  bool stream = false;
  // Drain the launch's prefetch queue (set_prefetch_queue: the next block's lines, to L2)
  // over this block's full steps, as the tile kernels' passes do.
  bool drain_queue = false;
  // Register k's buffer: regs + k * reg_floats floats; band_rows * cols floats at least.
  float* regs = nullptr;
  int64_t reg_floats = 0;
};

inline constexpr int64_t kMaxRowBand = 256;

void row_program_f32(const RowProgramArgs& args);

}  // namespace dvm::vm::cpu
