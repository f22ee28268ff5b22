// Bytecode verifier and disassembler: hand-built programs that must verify (and run
// correctly), the same programs corrupted one field at a time that must be rejected with a
// message naming the problem, and random bit flips that must never crash the verifier nor,
// when accepted, make the interpreter touch memory outside the spans it returned.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bytecode/format.h"
#include "bytecode/verifier.h"
#include "vm/interpreter.h"

namespace dvm::bc {
namespace {

using Spans = std::vector<std::pair<int64_t, int64_t>>;
constexpr TileClass kFull = TileClass::kFull;
constexpr TileClass kRowC = TileClass::kRow;

Instr ins(Opcode op, CType t, TileClass cls, Operand d, Operand a = {}, Operand b = {},
          uint16_t aux = 0, Operand c = {}) {
  return Instr{op, t, cls, 0, aux, d, a, b, c};
}
Instr loop(int axis) {
  return ins(Opcode::kLoop, CType::kF32, kFull, {}, {}, {}, axis);
}
Instr end_loop() {
  return ins(Opcode::kEndLoop, CType::kF32, kFull, {});
}
Operand r(int i, TileClass c = kFull) {
  return Operand::reg(i, c);
}

Descriptor desc(int slot, std::initializer_list<int64_t> strides, int64_t offset = 0) {
  Descriptor d;
  d.slot = static_cast<uint16_t>(slot);
  d.offset = offset;
  int a = 0;
  for (int64_t s : strides) d.stride[a++] = s;
  return d;
}

// out[i] = (x[i] + y[i]) * 1.5 over 100 elements: one grid column axis, y read directly.
Program add_program() {
  Program p;
  p.name = "add";
  p.axes = {Axis{100, 32, AxisIter::kGrid, AxisTile::kCol}};
  p.grid = 4;
  p.num_regs = 2;
  p.reg_elems = 32;
  p.reg_row_stride = 32;
  p.descs = {desc(0, {1}), desc(1, {1}), desc(2, {1})};
  p.consts = {Constant{1.5f, 1, 1}};
  p.num_slots = 3;
  p.emit(ins(Opcode::kLoad, CType::kF32, kFull, r(0), Operand::desc(0)));
  p.emit(ins(Opcode::kBAdd, CType::kF32, kFull, r(1), r(0), Operand::desc(1)));
  p.emit(ins(Opcode::kBMul, CType::kF32, kFull, r(1), r(1), Operand::constant(0)));
  p.emit(ins(Opcode::kStore, CType::kF32, kFull, Operand::desc(2), r(1)));
  return p;
}

// out[i] = sum_j x[i, j] for x of 8 x 64: grid over row tiles of 4, loop over column tiles.
Program sum_program() {
  Program p;
  p.name = "rowsum";
  p.axes = {Axis{8, 4, AxisIter::kGrid, AxisTile::kRow},
            Axis{64, 16, AxisIter::kLoop, AxisTile::kCol}};
  p.grid = 2;
  p.num_regs = 2;
  p.reg_elems = 64;
  p.reg_row_stride = 16;
  p.descs = {desc(0, {64, 1}), desc(1, {1, 0})};
  p.num_slots = 2;
  uint16_t sum_cols = reduce_aux(ReduceOp::kSum, false, true);
  p.emit(ins(Opcode::kFill, CType::kF32, kRowC, r(1, kRowC), {}, {}, sum_cols));
  p.emit(loop(1));
  p.emit(ins(Opcode::kLoad, CType::kF32, kFull, r(0), Operand::desc(0)));
  p.emit(ins(Opcode::kReduce, CType::kF32, kFull, r(1, kRowC), r(0), {}, sum_cols));
  p.emit(end_loop());
  p.emit(ins(Opcode::kStore, CType::kF32, kRowC, Operand::desc(1), r(1, kRowC)));
  return p;
}

// out[r, c] = tanh(x[r, c] * 0.5 + v[r]) * w[c] over a 6 x 1100 tile space (row tiles of 4,
// one column tile: strips of the chain have a tail, rows a partial tile), as one Chain of
// three (chained = true) or as the same three instructions one pass each.
Program chain_program(bool chained) {
  Program p;
  p.name = "chain";
  p.axes = {Axis{6, 4, AxisIter::kGrid, AxisTile::kRow},
            Axis{1100, 1100, AxisIter::kGrid, AxisTile::kCol}};
  p.grid = 2;
  p.num_regs = 3;
  p.reg_elems = 4 * 1104;
  p.reg_row_stride = 1104;
  p.descs = {desc(0, {1100, 1}), desc(1, {1, 0}), desc(2, {0, 1}), desc(3, {1100, 1})};
  p.consts = {Constant{0.5f, 0, 0}};
  p.num_slots = 4;
  p.emit(ins(Opcode::kLoad, CType::kF32, kRowC, r(2, kRowC), Operand::desc(1)));
  if (chained) p.emit(ins(Opcode::kChain, CType::kF32, kFull, {}, {}, {}, 3));
  p.emit(ins(Opcode::kFma, CType::kF32, kFull, r(0), Operand::desc(0), Operand::constant(0), 0,
             r(2, kRowC)));
  p.emit(ins(Opcode::kUTanh, CType::kF32, kFull, r(1), r(0)));
  p.emit(ins(Opcode::kBMul, CType::kF32, kFull, Operand::desc(3), r(1), Operand::desc(2)));
  return p;
}

std::vector<std::vector<float>> chain_buffers() {
  std::vector<std::vector<float>> bufs = {std::vector<float>(6600), std::vector<float>(6),
                                          std::vector<float>(1100), std::vector<float>(6600)};
  for (int i = 0; i < 6600; ++i) bufs[0][i] = static_cast<float>(i % 97) * 0.03f - 1.4f;
  for (int i = 0; i < 6; ++i) bufs[1][i] = 0.1f * static_cast<float>(i) - 0.2f;
  for (int i = 0; i < 1100; ++i) bufs[2][i] = 1.0f + static_cast<float>(i % 7);
  return bufs;
}

void set_instr(Program* p, size_t i, const Instr& in) {
  p->code[2 * i] = encode_word0(in);
  p->code[2 * i + 1] = encode_word1(in);
}

// Expects verify() to reject `p` with a message containing `needle`.
void expect_rejected(const Program& p, const std::string& needle) {
  Status s = verify(p, nullptr);
  ASSERT_FALSE(s.is_ok()) << "accepted:\n" << disassemble(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'" + p.name + "'"), std::string::npos) << s.message();
}

vm::LoadedProgram load(const Program& p) {
  return *vm::load(p);  // the interpreter's own decoding (loop pairs, chain plans)
}

// Runs `p` over f32 buffers (one per slot); the caller verified it.
void run(const Program& p, std::vector<std::vector<float>>* bufs) {
  std::vector<void*> slots;
  for (auto& b : *bufs) slots.push_back(b.data());
  vm::LoadedProgram lp = load(p);
  vm::run_blocks(lp, vm::LaunchArgs{slots.data(), nullptr}, 0, p.grid);
}

TEST(Verifier, AcceptsAddProgramAndRunsIt) {
  Program p = add_program();
  Spans spans;
  ASSERT_TRUE(verify(p, &spans).is_ok()) << verify(p, &spans).message();
  ASSERT_EQ(spans.size(), 3u);
  for (auto s : spans) EXPECT_EQ(s, std::make_pair(int64_t{0}, int64_t{99}));
  std::vector<std::vector<float>> bufs(3, std::vector<float>(100));
  for (int i = 0; i < 100; ++i) bufs[0][i] = i, bufs[1][i] = 2.0f * i;
  run(p, &bufs);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(bufs[2][i], 4.5f * i) << i;
}

TEST(Verifier, AcceptsReductionLoopAndRunsIt) {
  Program p = sum_program();
  Spans spans;
  ASSERT_TRUE(verify(p, &spans).is_ok()) << verify(p, &spans).message();
  EXPECT_EQ(spans[0], std::make_pair(int64_t{0}, int64_t{511}));
  EXPECT_EQ(spans[1], std::make_pair(int64_t{0}, int64_t{7}));
  std::vector<std::vector<float>> bufs = {std::vector<float>(512), std::vector<float>(8)};
  for (int i = 0; i < 512; ++i) bufs[0][i] = static_cast<float>(i % 64 + i / 64);
  run(p, &bufs);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(bufs[1][i], 2016.0f + 64.0f * i) << i;
}

TEST(Disassembler, PrintsHeaderAxesDescriptorsAndInstructions) {
  std::string text = disassemble(sum_program());
  for (const char* want :
       {"program 'rowsum'", "grid 2", "regs 2 x 64", "row_stride 16",
        "a0: extent 8 chunk 4 grid row-tile", "a1: extent 64 chunk 16 loop col-tile",
        "m0: slot 0 f32 offset 0 strides a0=64 a1=1", "    0  fill.sum.f32.row r1.row",
        "    1  loop a1", "    2    load.f32.full r0.full, m0",
        "    3    reduce.sum.f32.full r1.row, r0.full  over cols", "    4  endloop",
        "    5  store.f32.row m1, r1.row"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  text = disassemble(add_program());
  EXPECT_NE(text.find("add.f32.full r1.full, r0.full, m1"), std::string::npos) << text;
  EXPECT_NE(text.find("mul.f32.full r1.full, r1.full, c0"), std::string::npos) << text;
  EXPECT_NE(text.find("c0: f32 1.5"), std::string::npos) << text;
}

TEST(Disassembler, DecodesCastArgReduceAndGarbage) {
  Program p = add_program();
  EXPECT_EQ(disassemble_instr(p, ins(Opcode::kCast, CType::kF32, kFull, r(1), r(0), {}, 2)),
            "cast.f32.full r1.full, r0.full  to i64");
  Instr arg = ins(Opcode::kArgReduce, CType::kF32, kFull, r(1, kRowC), r(0), r(2, kRowC),
                  reduce_aux(ReduceOp::kArgMax, false, true, 1));
  EXPECT_EQ(disassemble_instr(p, arg),
            "argreduce.argmax.f32.full r1.row, r0.full, r2.row  over cols index a1");
  EXPECT_EQ(
      disassemble_instr(p, ins(Opcode::kUExp, CType::kF32, kRowC, r(1, kRowC), Operand::param(3))),
      "exp.f32.row r1.row, p3");
  EXPECT_EQ(disassemble_instr(p, decode_instr(0xFF, 0)), "op255");
}

TEST(Verifier, AcceptsChainAndMatchesSeparatePasses) {
  Program p = chain_program(true);
  Spans spans;
  ASSERT_TRUE(verify(p, &spans).is_ok()) << verify(p, &spans).message();
  EXPECT_EQ(spans[3], std::make_pair(int64_t{0}, int64_t{6599}));
  std::string text = disassemble(p);
  EXPECT_NE(text.find("chain.f32.full body 3"), std::string::npos) << text;
  EXPECT_NE(text.find("3    tanh.f32.full r1.full, r0.full"), std::string::npos) << text;
  auto chained = chain_buffers(), separate = chain_buffers();
  run(p, &chained);
  Program q = chain_program(false);
  ASSERT_TRUE(verify(q, nullptr).is_ok());
  run(q, &separate);
  for (int i = 0; i < 6600; ++i) {
    ASSERT_EQ(chained[3][i], separate[3][i]) << i;  // the same kernels, strip by strip
    float want = std::tanh(chained[0][i] * 0.5f + chained[1][i / 1100]) * chained[2][i % 1100];
    ASSERT_NEAR(chained[3][i], want, 1e-5f * (1.0f + std::fabs(want))) << i;
  }
}

// A chain-local register redefined inside the body: reads after the redefinition see the
// new value (scratch strips must not keep the old one).
TEST(Verifier, ChainRedefiningALocalMatchesSeparatePasses) {
  auto make = [](bool chained) {
    Program p = chain_program(false);
    p.code.resize(2);  // keep the row load
    if (chained) p.emit(ins(Opcode::kChain, CType::kF32, kFull, {}, {}, {}, 4));
    p.emit(ins(Opcode::kBAdd, CType::kF32, kFull, r(0), Operand::desc(0), Operand::constant(0)));
    p.emit(ins(Opcode::kBMul, CType::kF32, kFull, r(1), r(0), r(0)));
    p.emit(ins(Opcode::kBAdd, CType::kF32, kFull, r(0), r(0), r(1)));  // in place
    p.emit(ins(Opcode::kBSub, CType::kF32, kFull, Operand::desc(3), r(0), r(1)));
    return p;
  };
  Program p = make(true), q = make(false);
  ASSERT_TRUE(verify(p, nullptr).is_ok()) << verify(p, nullptr).message();
  ASSERT_TRUE(verify(q, nullptr).is_ok()) << verify(q, nullptr).message();
  auto chained = chain_buffers(), separate = chain_buffers();
  run(p, &chained);
  run(q, &separate);
  for (int i = 0; i < 6600; ++i) {
    float x = chained[0][i] + 0.5f, sq = x * x;
    ASSERT_EQ(chained[3][i], separate[3][i]) << i;
    ASSERT_EQ(separate[3][i], (x + sq) - sq) << i;
  }
}

TEST(Verifier, RejectsBadChains) {
  auto with = [](size_t i, const Instr& in) {
    Program p = chain_program(true);
    set_instr(&p, i, in);
    return p;
  };
  const Instr fma = chain_program(true).instr(2), tanh = chain_program(true).instr(3);
  expect_rejected(with(1, ins(Opcode::kChain, CType::kF32, kFull, {}, {}, {}, 0)),
                  "chain body of 0 instructions");
  expect_rejected(with(1, ins(Opcode::kChain, CType::kF32, kFull, {}, {}, {}, 9)),
                  "chain body of 9 instructions");
  expect_rejected(with(1, ins(Opcode::kChain, CType::kF32, kFull, {}, {}, {}, 4)),
                  "runs past the end");
  expect_rejected(with(1, ins(Opcode::kChain, CType::kI32, kFull, {}, {}, {}, 3)),
                  "chain requires f32");
  // A body of something other than f32 elementwise math.
  expect_rejected(with(3, ins(Opcode::kCast, CType::kF32, kFull, r(1), r(0), {}, 1)),
                  "not allowed in a chain body");
  expect_rejected(with(3, loop(0)), "not allowed in a chain body");
  expect_rejected(with(3, ins(Opcode::kBEq, CType::kF32, kFull, r(1), r(0), r(0))),
                  "not allowed in a chain body");
  Instr other_class = tanh;
  other_class.cls = TileClass::kCol;
  other_class.d = r(1, TileClass::kCol);
  expect_rejected(with(3, other_class), "another class");
  // Only the last instruction may write memory.
  Instr to_memory = fma;
  to_memory.d = Operand::desc(3);
  expect_rejected(with(2, to_memory), "writes memory before its last instruction");
  // A register read in the body and then written by it (r2.row is the fma's addend).
  Instr clobber = tanh;
  clobber.d = r(2);
  expect_rejected(with(3, clobber), "writes r2 after reading it");
  // The result may not be a chain-local value.
  Program p = chain_program(true);
  set_instr(&p, 4, ins(Opcode::kBMul, CType::kF32, kFull, r(0), r(1), Operand::desc(2)));
  expect_rejected(p, "also a chain-local value");
  // Chain-local values are undefined after the chain.
  p = chain_program(true);
  p.emit(ins(Opcode::kStore, CType::kF32, kFull, Operand::desc(3), r(1)));
  expect_rejected(p, "r1 is read before it is written");
  // The last instruction may update its own source in place, nothing else may.
  p = chain_program(true);
  p.emit(ins(Opcode::kChain, CType::kF32, kRowC, {}, {}, {}, 2));
  p.emit(ins(Opcode::kUExp, CType::kF32, kRowC, r(0, kRowC), r(2, kRowC)));
  p.emit(ins(Opcode::kBAdd, CType::kF32, kRowC, r(2, kRowC), r(2, kRowC), r(0, kRowC)));
  expect_rejected(p, "writes r2 after reading it");
  p = chain_program(true);
  p.emit(ins(Opcode::kChain, CType::kF32, kRowC, {}, {}, {}, 2));
  p.emit(ins(Opcode::kUExp, CType::kF32, kRowC, r(0, kRowC), Operand::desc(1)));
  p.emit(ins(Opcode::kBAdd, CType::kF32, kRowC, r(2, kRowC), r(2, kRowC), r(0, kRowC)));
  EXPECT_TRUE(verify(p, nullptr).is_ok()) << verify(p, nullptr).message();
}

// Row max and log-sum-exp of s = x * 0.5 over the 6 x 1100 tile space (rows longer than a
// strip, a partial row tile): as one chain of four (s kept: read after the chain; exp(s)
// chain-local, summed strip by strip) or as four passes. out[r, c] = s - max_r, row
// results m[r] = max_r and l[r] = sum_c exp(s).
Program chain_reduce_program(bool chained) {
  Program p = chain_program(false);
  p.code.clear();
  p.num_regs = 4;
  p.descs = {desc(0, {1100, 1}), desc(1, {1, 0}), desc(2, {1, 0}), desc(3, {1100, 1})};
  const uint16_t max_cols = reduce_aux(ReduceOp::kMax, false, true);
  const uint16_t sum_cols = reduce_aux(ReduceOp::kSum, false, true);
  p.emit(ins(Opcode::kFill, CType::kF32, kRowC, r(2, kRowC), {}, {}, max_cols));
  p.emit(ins(Opcode::kFill, CType::kF32, kRowC, r(3, kRowC), {}, {}, sum_cols));
  if (chained) p.emit(ins(Opcode::kChain, CType::kF32, kFull, {}, {}, {}, chain_aux(4, 1)));
  p.emit(ins(Opcode::kBMul, CType::kF32, kFull, r(0), Operand::desc(0), Operand::constant(0)));
  p.emit(ins(Opcode::kReduce, CType::kF32, kFull, r(2, kRowC), r(0), {}, max_cols));
  p.emit(ins(Opcode::kUExp, CType::kF32, kFull, r(1), r(0)));
  p.emit(ins(Opcode::kReduce, CType::kF32, kFull, r(3, kRowC), r(1), {}, sum_cols));
  p.emit(ins(Opcode::kBSub, CType::kF32, kFull, Operand::desc(3), r(0), r(2, kRowC)));
  p.emit(ins(Opcode::kStore, CType::kF32, kRowC, Operand::desc(1), r(2, kRowC)));
  p.emit(ins(Opcode::kStore, CType::kF32, kRowC, Operand::desc(2), r(3, kRowC)));
  return p;
}

TEST(Verifier, ChainWithReductionsMatchesSeparatePasses) {
  Program p = chain_reduce_program(true), q = chain_reduce_program(false);
  ASSERT_TRUE(verify(p, nullptr).is_ok()) << verify(p, nullptr).message();
  ASSERT_TRUE(verify(q, nullptr).is_ok()) << verify(q, nullptr).message();
  EXPECT_NE(disassemble(p).find("chain.f32.full body 4 keep 0"), std::string::npos)
      << disassemble(p);
  auto make_bufs = [] {
    auto b = chain_buffers();
    b[2].assign(6, 0.0f);  // the row sums (slot 2 held w)
    return b;
  };
  auto chained = make_bufs(), separate = make_bufs();
  run(p, &chained);
  run(q, &separate);
  for (int row = 0; row < 6; ++row) {
    double mx = -INFINITY, sum = 0;
    for (int c = 0; c < 1100; ++c) {
      const double s = static_cast<double>(chained[0][row * 1100 + c] * 0.5f);
      mx = std::max(mx, s);
      sum += std::exp(s);
    }
    // Max is exact in any order; the strip-by-strip sum may round differently.
    ASSERT_EQ(chained[1][row], separate[1][row]) << row;
    ASSERT_EQ(chained[1][row], static_cast<float>(mx)) << row;
    ASSERT_NEAR(chained[2][row], sum, 1e-5 * sum) << row;
    ASSERT_NEAR(separate[2][row], sum, 1e-5 * sum) << row;
    for (int c = 0; c < 1100; ++c) {
      const int i = row * 1100 + c;
      ASSERT_EQ(chained[3][i], separate[3][i]) << i;
      ASSERT_EQ(chained[3][i], chained[0][i] * 0.5f - chained[1][row]) << i;
    }
  }
}

TEST(Verifier, RejectsBadChainReductions) {
  auto with = [](size_t i, const Instr& in) {
    Program p = chain_reduce_program(true);
    set_instr(&p, i, in);
    return p;
  };
  const uint16_t sum_cols = reduce_aux(ReduceOp::kSum, false, true);
  // The keep mask names members of the body only, and only members writing a register.
  expect_rejected(with(2, ins(Opcode::kChain, CType::kF32, kFull, {}, {}, {}, chain_aux(4, 0x11))),
                  "keep mask names members past its body");
  expect_rejected(with(2, ins(Opcode::kChain, CType::kF32, kFull, {}, {}, {}, chain_aux(4, 3))),
                  "does not write a register");
  // Another member reading the accumulator would see a partial result.
  Instr exp_minus_max = ins(Opcode::kUExp, CType::kF32, kFull, r(1), r(0), r(2, kRowC));
  exp_minus_max.flags = kPreSub;
  expect_rejected(with(5, exp_minus_max), "r2, a reduction's accumulator");
  // An accumulator used earlier in the same chain.
  expect_rejected(
      with(6, ins(Opcode::kReduce, CType::kF32, kFull, r(0, kRowC), r(1), {}, sum_cols)),
      "accumulates into r0, used before in the chain");
  // Only f32 sum, max and min over the columns.
  expect_rejected(with(6, ins(Opcode::kReduce, CType::kF32, kFull, r(3, kRowC), r(1), {},
                              reduce_aux(ReduceOp::kProd, false, true))),
                  "not allowed in a chain body");
  // The chain-local exp(s) is undefined after the chain.
  Program p = chain_reduce_program(true);
  p.emit(ins(Opcode::kStore, CType::kF32, kFull, Operand::desc(3), r(1)));
  expect_rejected(p, "r1 is read before it is written");
}

// ---- corruption, one field at a time --------------------------------------------------

TEST(Verifier, RejectsRegisterIndexOutOfRange) {
  Program p = add_program();
  set_instr(&p, 1, ins(Opcode::kBAdd, CType::kF32, kFull, r(5), r(0), Operand::desc(1)));
  expect_rejected(p, "register index 5 of operand D out of range");
}

TEST(Verifier, RejectsReadBeforeWrite) {
  Program p = add_program();
  set_instr(&p, 1, ins(Opcode::kBAdd, CType::kF32, kFull, r(1), r(1), Operand::desc(1)));
  expect_rejected(p, "r1 is read before it is written");
}

TEST(Verifier, RejectsClassMismatch) {
  Program p = add_program();
  set_instr(&p, 1, ins(Opcode::kBAdd, CType::kF32, kFull, r(1, kRowC), r(0), Operand::desc(1)));
  expect_rejected(p, "class mismatch");
  p = add_program();  // reading a full register as a row vector
  set_instr(&p, 1, ins(Opcode::kBAdd, CType::kF32, kFull, r(1), r(0, kRowC), Operand::desc(1)));
  expect_rejected(p, "class or type mismatch");
  p = sum_program();  // reduce accumulator must lose the reduced column axis
  set_instr(&p, 3,
            ins(Opcode::kReduce, CType::kF32, kFull, r(1, kFull), r(0), {},
                reduce_aux(ReduceOp::kSum, false, true)));
  expect_rejected(p, "class mismatch");
}

TEST(Verifier, RejectsTypeMismatch) {
  Program p = add_program();
  set_instr(&p, 2, ins(Opcode::kBMul, CType::kI32, kFull, r(1), r(1), Operand::constant(0)));
  expect_rejected(p, "class or type mismatch");
  p = add_program();  // a comparison writes i32, which f32 arithmetic may not read
  set_instr(&p, 1, ins(Opcode::kBLt, CType::kF32, kFull, r(1), r(0), Operand::desc(1)));
  expect_rejected(p, "last written as i32.full");
}

TEST(Verifier, RejectsUnbalancedLoops) {
  Program p = sum_program();
  p.code.erase(p.code.begin() + 8, p.code.begin() + 10);  // drop the endloop
  expect_rejected(p, "never closed");
  p = sum_program();
  p.emit(end_loop());
  expect_rejected(p, "endloop without an open loop");
  p = sum_program();  // the same axis twice
  p.code.insert(p.code.begin() + 4, p.code.begin() + 2, p.code.begin() + 4);
  p.emit(end_loop());
  expect_rejected(p, "already open");
}

TEST(Verifier, RejectsLoopOverGridAxis) {
  Program p = sum_program();
  set_instr(&p, 1, loop(0));
  expect_rejected(p, "loop over a grid axis");
  set_instr(&p, 1, loop(7));
  expect_rejected(p, "loop axis out of range");
}

TEST(Verifier, RejectsBadOpcodeTypeAndAux) {
  Program p = add_program();
  p.code[2] = (p.code[2] & ~uint64_t{0xFF}) | 250;
  expect_rejected(p, "bad opcode 250");
  p = add_program();
  p.code[2] |= uint64_t{3} << 8;
  expect_rejected(p, "bad compute type");
  p = add_program();
  p.code[2] |= uint64_t{1} << 40;
  expect_rejected(p, "reserved bits");
  p = sum_program();
  set_instr(&p, 3,
            ins(Opcode::kReduce, CType::kF32, kFull, r(1, kRowC), r(0), {},
                reduce_aux(ReduceOp::kArgMax, false, true)));
  expect_rejected(p, "reduce op not valid");
  p = add_program();
  set_instr(&p, 2, ins(Opcode::kUExp, CType::kI32, kFull, r(1), r(1)));
  expect_rejected(p, "float-only");
}

TEST(Verifier, RejectsDescriptorSlotOutOfRange) {
  Program p = add_program();
  p.descs[2].slot = 3;
  expect_rejected(p, "slot 3 out of range");
}

TEST(Verifier, RejectsDirectDescriptorWithColumnStride2) {
  Program p = add_program();
  p.descs[1].stride[0] = 2;
  expect_rejected(p, "column stride 2");
  p = add_program();  // loads gather with any stride
  p.descs[0].stride[0] = 2;
  EXPECT_TRUE(verify(p, nullptr).is_ok());
  p = add_program();  // a direct destination must be contiguous: broadcast (0) is not
  set_instr(&p, 2, ins(Opcode::kBMul, CType::kF32, kFull, Operand::desc(1), r(1), r(1)));
  p.descs[1].stride[0] = 0;
  expect_rejected(p, "column stride 0, needs 1");
  p = add_program();  // a store copying straight from memory reads it like any math op
  set_instr(&p, 3, ins(Opcode::kStore, CType::kF32, kFull, Operand::desc(2), Operand::desc(1)));
  EXPECT_TRUE(verify(p, nullptr).is_ok());
  p.descs[1].stride[0] = 2;
  expect_rejected(p, "column stride 2");
  p = add_program();
  p.descs[1].dtype = DType::kF16;
  expect_rejected(p, "dtype f16");
}

TEST(Verifier, RejectsGridMismatch) {
  Program p = add_program();
  p.grid = 5;
  expect_rejected(p, "grid 5 != product");
}

TEST(Verifier, RejectsTooSmallRegisters) {
  Program p = sum_program();
  p.reg_elems = 63;
  expect_rejected(p, "row chunk 4 * reg_row_stride 16 > reg_elems 63");
  p = sum_program();
  p.reg_row_stride = 15;
  expect_rejected(p, "reg_row_stride 15 < col chunk 16");
  p = sum_program();
  p.axes[0].tile = AxisTile::kNone;
  expect_rejected(p, "chunk 4 on a non-tile axis");
}

TEST(Verifier, RejectsBadDestinationsAndAliasing) {
  Program p = add_program();
  set_instr(&p, 2, ins(Opcode::kBMul, CType::kF32, kFull, Operand::constant(0), r(1), r(1)));
  expect_rejected(p, "must be a register or descriptor");
  p = add_program();
  set_instr(&p, 0, ins(Opcode::kLoad, CType::kF32, kFull, r(0), r(1)));
  expect_rejected(p, "must be a memory descriptor");
  p = add_program();  // widening in place would overwrite unread sources
  set_instr(&p, 2, ins(Opcode::kCast, CType::kF32, kFull, r(1), r(1), {}, 2));
  expect_rejected(p, "alias register r1");
}

TEST(Verifier, ChecksLoopCarriedTypes) {
  Program p = sum_program();
  // Inside the loop, r1 is read as f32.row and then overwritten as i32.row: the second
  // iteration would read i32 bits as f32.
  p.consts = {Constant{}};
  p.code.insert(p.code.begin() + 8, 2, 0);
  set_instr(&p, 4,
            ins(Opcode::kCast, CType::kF32, kRowC, r(1, kRowC), Operand::constant(0), {}, 1));
  expect_rejected(p, "body leaves it i32.row");
}

TEST(Verifier, SplitLoops) {
  Program p = sum_program();
  p.axes.push_back(Axis{8, 1, AxisIter::kGrid, AxisTile::kNone});  // 8 parts of 4 trips
  p.axes[1].split_by = 2;
  p.grid = 16;
  ASSERT_TRUE(verify(p, nullptr).is_ok()) << verify(p, nullptr).message();
  // Some blocks skip the body: a value only written inside it is undefined after it.
  set_instr(&p, 5, ins(Opcode::kStore, CType::kF32, kFull, Operand::desc(0), r(0)));
  expect_rejected(p, "r0 is read before it is written");
  p = sum_program();
  p.axes.push_back(Axis{int64_t{1} << 41, 1, AxisIter::kGrid, AxisTile::kNone});
  p.axes[1].split_by = 2;
  p.grid = int64_t{1} << 42;
  expect_rejected(p, "grid axes exceed");
  p.axes[1].extent = int64_t{1} << 48;
  p.axes[2].extent = int64_t{1} << 30;
  p.grid = int64_t{1} << 31;
  expect_rejected(p, "trips * split parts overflows");
}

TEST(Verifier, ReportsSpans) {
  Program p = add_program();
  p.descs[0].offset = -5;
  Spans spans;
  ASSERT_TRUE(verify(p, &spans).is_ok());
  EXPECT_EQ(spans[0], std::make_pair(int64_t{-5}, int64_t{94}));
  p = add_program();
  p.descs[2].stride[0] = int64_t{1} << 62;
  expect_rejected(p, "element span overflows");
  // Zero-trip reduction loop: x is never read, out still is written.
  p = sum_program();
  p.axes[1].extent = 0;
  ASSERT_TRUE(verify(p, &spans).is_ok()) << verify(p, &spans).message();
  EXPECT_GT(spans[0].first, spans[0].second);
  EXPECT_EQ(spans[1], std::make_pair(int64_t{0}, int64_t{7}));
  // No blocks: nothing is touched.
  p = add_program();
  p.axes[0].extent = 0;
  p.grid = 0;
  ASSERT_TRUE(verify(p, &spans).is_ok());
  for (auto s : spans) EXPECT_GT(s.first, s.second);
}

TEST(Verifier, RejectsBadHeader) {
  Program p = add_program();
  p.version = kFormatVersion + 1;
  expect_rejected(p, "format version " + std::to_string(kFormatVersion + 1));
  p = add_program();
  p.code.push_back(0);
  expect_rejected(p, "odd number of code words");
  p = add_program();
  p.axes[0].extent = -1;
  expect_rejected(p, "extent -1 out of range");
  p = sum_program();
  p.axes[1].tile = AxisTile::kRow;
  expect_rejected(p, "second row-tile axis");
  p = add_program();
  p.num_regs = 1 << 20;
  expect_rejected(p, "num_regs");
}

// ---- random bit flips ------------------------------------------------------------------

// Flips random bits of the code; the verifier must never crash, and any program it accepts
// (whose spans fit the buffers, as the runtime checks) must run without touching memory
// outside them (the sanitizer build turns any stray access into a failure).
void fuzz(const Program& base, uint32_t seed, int iters) {
  std::mt19937_64 rng(seed);
  Spans base_spans;
  ASSERT_TRUE(verify(base, &base_spans).is_ok());
  int accepted = 0;
  for (int it = 0; it < iters; ++it) {
    Program p = base;
    int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) p.code[rng() % p.code.size()] ^= uint64_t{1} << (rng() % 64);
    Spans spans;
    Status s = verify(p, &spans);
    (void)disassemble(p);
    if (!s.is_ok()) {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      continue;
    }
    bool fits = true;
    std::vector<std::vector<float>> bufs;
    for (size_t i = 0; i < spans.size(); ++i) {
      auto [lo, hi] = spans[i];
      fits = fits && (lo > hi || (lo >= 0 && hi <= base_spans[i].second));
      bufs.emplace_back(static_cast<size_t>(base_spans[i].second + 1), 1.0f);
    }
    if (!fits) continue;
    ++accepted;
    run(p, &bufs);
  }
  ::testing::Test::RecordProperty("accepted", accepted);
  EXPECT_GT(accepted, 0);  // some flips (e.g. of unused fields) must survive
}

TEST(Verifier, SurvivesRandomBitFlips) {
  fuzz(add_program(), 1, 2000);
  fuzz(sum_program(), 2, 2000);
  fuzz(chain_program(true), 3, 2000);
}

// Opcode numbers are internal to a format version: the elementwise opcodes are generated from
// ops.def, so a new op renumbers everything after it. Programs are never stored across
// versions, but a change must bump kFormatVersion (the verifier rejects programs of another
// version). The fingerprint covers every opcode's number, mnemonic, operand format, family
// and (elementwise opcodes) its op's kind in ops.def; when the table changes this test fails until
// the version is bumped and the new fingerprint recorded here.
TEST(Isa, TableChangesBumpTheFormatVersion) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&h](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  for (int op = 0; op < kNumOpcodes; ++op) {
    mix(static_cast<uint64_t>(op));
    for (const char* c = kOpInfo[op].mnemonic; *c; ++c) mix(static_cast<unsigned char>(*c));
    mix(static_cast<uint64_t>(kOpInfo[op].format) << 8 | static_cast<uint64_t>(kOpInfo[op].family));
    // What the verifier accepts for an elementwise opcode follows its op's kind in ops.def.
    if (is_unary(static_cast<Opcode>(op)))
      mix(static_cast<uint64_t>(ops::unary_kind(unary_of(static_cast<Opcode>(op)))));
    if (is_binary(static_cast<Opcode>(op)))
      mix(static_cast<uint64_t>(ops::binary_kind(binary_of(static_cast<Opcode>(op)))));
  }
  struct Golden {
    uint32_t version;
    uint64_t fingerprint;
  };
  constexpr Golden kGolden = {3, 12276180549071300530ull};
  EXPECT_EQ(kFormatVersion, kGolden.version)
      << "kFormatVersion changed: record the fingerprint " << h << " for it here";
  EXPECT_EQ(h, kGolden.fingerprint)
      << "the ISA table changed (opcode numbers, mnemonics, formats or families): bump "
         "kFormatVersion in src/bytecode/format.h and record fingerprint "
      << h << " with it here";
}

}  // namespace
}  // namespace dvm::bc
