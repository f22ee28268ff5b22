// The bytecode program format.
//
// A program is run once per block id in [0, grid). Its iteration space is a list of axes;
// each axis is walked in chunks (tile axes: up to `chunk` elements at a time; other axes: one
// index at a time) either by the grid (block id -> one chunk per grid axis, mixed radix,
// first grid axis slowest) or by LOOP instructions. At most one axis is the tile's row axis
// and one its column axis; the active tile is rows x cols with tails clamped to the extent.
//
// Every instruction is two 64-bit words:
//
//   word 0:  63            32 31        16 15    12 11  10 9  8 7         0
//           +----------------+------------+--------+------+-----+-----------+
//           |    reserved    |    aux     | flags  | cls  |ctype|  opcode   |
//           +----------------+------------+--------+------+-----+-----------+
//   word 1:  63        48 47        32 31        16 15         0
//           +------------+------------+------------+------------+
//           |     C      |     B      |     A      |     D      |
//           +------------+------------+------------+------------+
//
//   operand (16 bits):  15  14 13  12 11                    0
//                      +------+------+-----------------------+
//                      | kind | cls  |         index         |
//                      +------+------+-----------------------+
//   kind: 0 tile register, 1 memory descriptor, 2 constant, 3 run-time param.
//   cls (registers): 0 full tile, 1 row vector (one value per row), 2 column vector,
//   3 scalar. An instruction's own `cls` is the shape it iterates.
//
// Memory operands address tensors through descriptors: element (r, c) of the tile is at
// slot base + offset + sum_a index_a * stride_a + r * stride_row + c * stride_col, in
// elements of the descriptor's dtype. The verifier proves every descriptor stays inside its
// tensor for every index the program can reach, so the interpreter does no bounds checks.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dvm/dtype.h"
#include "dvm/kernel.h"
#include "ops/op_traits.h"

namespace dvm::bc {

inline constexpr uint32_t kFormatVersion = 3;  // 2: Chain; 3: chain reductions, keep mask
inline constexpr int kMaxAxes = 16;
inline constexpr int kMaxOperandIndex = 4095;

enum class Opcode : uint8_t {
#define DVM_OP(Name, mnemonic, format, family) k##Name,
#include "bytecode/isa.def"
  kCount
};
inline constexpr int kNumOpcodes = static_cast<int>(Opcode::kCount);

enum class OperandFormat : uint8_t { kNone, kAxis, kDst, kDstSrc, kDstSrc2, kDstSrc3 };
enum class Family : uint8_t { kControl, kData, kReduce, kUnary, kBinary, kChain };

// Chain: body length limits (see isa.def).
inline constexpr int kMinChainBody = 1;
inline constexpr int kMaxChainBody = 8;

// A chain head's AUX: the body length in the low byte, the keep mask in the high byte (bit
// i: body member i's destination register stays defined after the chain).
constexpr int chain_length(uint16_t aux) {
  return aux & 0xFF;
}
constexpr bool chain_keeps(uint16_t aux, int member) {
  return (aux >> (8 + member)) & 1;
}
constexpr uint16_t chain_aux(int length, unsigned keep_mask) {
  return static_cast<uint16_t>((length & 0xFF) | ((keep_mask & 0xFF) << 8));
}

struct OpInfo {
  const char* mnemonic;
  OperandFormat format;
  Family family;
};
extern const OpInfo kOpInfo[kNumOpcodes];

// The elementwise opcodes: one per op of dvm/ops.def, in its order (isa.def). Ask these, never
// compare an opcode with the start of the next section.
inline constexpr int kFirstUnary = static_cast<int>(Opcode::kUNeg);
inline constexpr int kFirstBinary = static_cast<int>(Opcode::kBAdd);
static_assert(kFirstBinary == kFirstUnary + ops::kNumUnaryOps);
constexpr bool is_unary(Opcode op) {
  return static_cast<int>(op) >= kFirstUnary && static_cast<int>(op) < kFirstBinary;
}
constexpr bool is_binary(Opcode op) {
  return static_cast<int>(op) >= kFirstBinary &&
         static_cast<int>(op) < kFirstBinary + ops::kNumBinaryOps;
}
constexpr UnaryOp unary_of(Opcode op) {  // is_unary(op)
  return static_cast<UnaryOp>(static_cast<int>(op) - kFirstUnary);
}
constexpr BinaryOp binary_of(Opcode op) {  // is_binary(op)
  return static_cast<BinaryOp>(static_cast<int>(op) - kFirstBinary);
}
constexpr Opcode opcode_of(UnaryOp op) {
  return static_cast<Opcode>(kFirstUnary + static_cast<int>(op));
}
constexpr Opcode opcode_of(BinaryOp op) {
  return static_cast<Opcode>(kFirstBinary + static_cast<int>(op));
}

enum class OperandKind : uint8_t { kReg = 0, kDesc = 1, kConst = 2, kParam = 3 };
enum class TileClass : uint8_t { kFull = 0, kRow = 1, kCol = 2, kScalar = 3 };

// Does the class vary along the tile's rows / columns?
constexpr bool class_has_rows(TileClass c) {
  return c == TileClass::kFull || c == TileClass::kRow;
}
constexpr bool class_has_cols(TileClass c) {
  return c == TileClass::kFull || c == TileClass::kCol;
}
constexpr TileClass make_class(bool rows, bool cols) {
  return rows ? (cols ? TileClass::kFull : TileClass::kRow)
              : (cols ? TileClass::kCol : TileClass::kScalar);
}

struct Operand {
  OperandKind kind = OperandKind::kReg;
  TileClass cls = TileClass::kFull;
  uint16_t index = 0;
  constexpr uint16_t encode() const {
    return static_cast<uint16_t>((static_cast<unsigned>(kind) << 14) |
                                 (static_cast<unsigned>(cls) << 12) | (index & 0xFFF));
  }
  static constexpr Operand decode(uint16_t bits) {
    return Operand{static_cast<OperandKind>(bits >> 14), static_cast<TileClass>((bits >> 12) & 3),
                   static_cast<uint16_t>(bits & 0xFFF)};
  }
  static constexpr Operand reg(int i, TileClass c) {
    return Operand{OperandKind::kReg, c, static_cast<uint16_t>(i)};
  }
  static constexpr Operand desc(int i) {
    return Operand{OperandKind::kDesc, TileClass::kFull, static_cast<uint16_t>(i)};
  }
  static constexpr Operand constant(int i) {
    return Operand{OperandKind::kConst, TileClass::kScalar, static_cast<uint16_t>(i)};
  }
  static constexpr Operand param(int i) {
    return Operand{OperandKind::kParam, TileClass::kScalar, static_cast<uint16_t>(i)};
  }
};
static_assert(Operand::decode(Operand::reg(17, TileClass::kCol).encode()).index == 17);

// Reduce / ArgReduce aux field: bits 0-7 ReduceOp, bit 8 reduce over rows, bit 9 over
// columns, bits 10-14 the axis whose index var gives ArgReduce's base index.
constexpr uint16_t reduce_aux(ReduceOp op, bool rows, bool cols, int axis = 0) {
  return static_cast<uint16_t>(static_cast<unsigned>(op) | (rows ? 0x100u : 0u) |
                               (cols ? 0x200u : 0u) | (static_cast<unsigned>(axis) << 10));
}
constexpr ReduceOp aux_reduce_op(uint16_t aux) {
  return static_cast<ReduceOp>(aux & 0xFF);
}
constexpr bool aux_rows(uint16_t aux) {
  return aux & 0x100;
}
constexpr bool aux_cols(uint16_t aux) {
  return aux & 0x200;
}
constexpr int aux_axis(uint16_t aux) {
  return (aux >> 10) & 0x1F;
}

// Unary-op flags: fold an add or subtract of A and B into the op (D := op(A + B), op(A - B)).
inline constexpr uint8_t kPreAdd = 1;
inline constexpr uint8_t kPreSub = 2;

struct Instr {
  Opcode op;
  CType ctype;
  TileClass cls;
  uint8_t flags;
  uint16_t aux;
  Operand d, a, b, c;
};

// Is `in` a reduction that a Chain body may hold: f32 sum, max or min (reduce) or sum of
// products (reduce.dot) over the columns only, into a register of one value per row?
constexpr bool chain_reduce_op(const Instr& in) {
  if (in.ctype != CType::kF32 || in.flags != 0) return false;
  if (in.op != Opcode::kReduce && in.op != Opcode::kReduceDot) return false;
  const ReduceOp r = aux_reduce_op(in.aux);
  return !aux_rows(in.aux) && aux_cols(in.aux) &&
         (r == ReduceOp::kSum || r == ReduceOp::kMax || r == ReduceOp::kMin);
}

// Can `in` be an instruction of a Chain body (see isa.def)? Opcode, compute type and flags.
constexpr bool chain_body_op(const Instr& in) {
  if (in.ctype != CType::kF32) return false;
  if (chain_reduce_op(in)) return true;
  // Loads and stores convert from and to f16/bf16 storage strip by strip.
  if (in.op == Opcode::kLoad || in.op == Opcode::kStore) return in.flags == 0;
  if (in.op == Opcode::kFma) return in.flags == 0;
  if (is_unary(in.op)) {
    return !ops::is_predicate(unary_of(in.op)) &&
           (in.flags == 0 || in.flags == kPreAdd || in.flags == kPreSub);
  }
  if (!is_binary(in.op) || in.flags != 0) return false;
  BinaryOp b = binary_of(in.op);
  return b == BinaryOp::kAdd || b == BinaryOp::kSub || b == BinaryOp::kMul || b == BinaryOp::kDiv ||
         b == BinaryOp::kMaximum || b == BinaryOp::kMinimum;
}

constexpr uint64_t encode_word0(const Instr& in) {
  return static_cast<uint64_t>(in.op) | (static_cast<uint64_t>(in.ctype) << 8) |
         (static_cast<uint64_t>(in.cls) << 10) | (static_cast<uint64_t>(in.flags & 0xF) << 12) |
         (static_cast<uint64_t>(in.aux) << 16);
}
constexpr uint64_t encode_word1(const Instr& in) {
  return static_cast<uint64_t>(in.d.encode()) | (static_cast<uint64_t>(in.a.encode()) << 16) |
         (static_cast<uint64_t>(in.b.encode()) << 32) |
         (static_cast<uint64_t>(in.c.encode()) << 48);
}
constexpr Instr decode_instr(uint64_t w0, uint64_t w1) {
  return Instr{static_cast<Opcode>(w0 & 0xFF),
               static_cast<CType>((w0 >> 8) & 3),
               static_cast<TileClass>((w0 >> 10) & 3),
               static_cast<uint8_t>((w0 >> 12) & 0xF),
               static_cast<uint16_t>((w0 >> 16) & 0xFFFF),
               Operand::decode(static_cast<uint16_t>(w1)),
               Operand::decode(static_cast<uint16_t>(w1 >> 16)),
               Operand::decode(static_cast<uint16_t>(w1 >> 32)),
               Operand::decode(static_cast<uint16_t>(w1 >> 48))};
}

// kContract: a matmul's contraction axis, walked inside the MatMul instruction only.
enum class AxisIter : uint8_t { kGrid = 0, kLoop = 1, kContract = 2 };
enum class AxisTile : uint8_t { kNone = 0, kRow = 1, kCol = 2 };

struct Axis {
  int64_t extent = 1;
  int64_t chunk = 1;  // elements per step (1 unless a tile axis)
  AxisIter iter = AxisIter::kGrid;
  AxisTile tile = AxisTile::kNone;
  // Loop axes only: the index g of grid axis `split_by` (extent G) selects the contiguous
  // share of trips [g*T/G, (g+1)*T/G) this block walks (reductions split across blocks).
  int8_t split_by = -1;
  int64_t trips() const { return extent == 0 ? 0 : (extent + chunk - 1) / chunk; }
};

struct Descriptor {
  uint16_t slot = 0;  // argument slot (index into the pointer table given at launch)
  DType dtype = DType::kF32;
  int64_t offset = 0;
  std::array<int64_t, kMaxAxes> stride{};
};

// A constant of the instruction's compute type (the encoder stores all three forms).
struct Constant {
  float f32 = 0;
  int32_t i32 = 0;
  int64_t i64 = 0;
};

struct Program {
  uint32_t version = kFormatVersion;
  std::string name;
  int64_t grid = 0;            // blocks; product of the grid axes' trip counts
  std::vector<Axis> axes;      // <= kMaxAxes
  int num_regs = 0;            // tile registers
  int64_t reg_elems = 0;       // capacity of one register in elements (8 bytes each)
  int64_t reg_row_stride = 0;  // elements between rows of a full-tile register
  std::vector<Descriptor> descs;
  std::vector<Constant> consts;
  int num_params = 0;
  int num_slots = 0;
  std::vector<uint64_t> code;  // two words per instruction

  size_t num_instrs() const { return code.size() / 2; }
  Instr instr(size_t i) const { return decode_instr(code[2 * i], code[2 * i + 1]); }
  void emit(const Instr& in) {
    code.push_back(encode_word0(in));
    code.push_back(encode_word1(in));
  }
};

// Text form of a program (one instruction per line, plus header, axes and descriptors).
std::string disassemble(const Program& p);

}  // namespace dvm::bc
