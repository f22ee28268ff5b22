// Random kernels: DAGs of elementwise ops, broadcasts, permutes, slices, reshapes, concats,
// reductions and matmuls with symbolic dims, run on the VM and on the reference for several
// bindings each. Seeds are fixed; a failure prints the kernel and the bytecode.
#include "vm_test_util.h"

namespace dvm::testing {
namespace {

struct Gen {
  std::mt19937 rng;
  KernelBuilder kb;
  std::vector<Value> vals;  // all of shape [S, H]
  Value w;                  // [H, H], the matmul weight
  Dim S, H;
  explicit Gen(uint32_t seed) : rng(seed), kb("random" + std::to_string(seed)) {
    S = kb.symbol("S");
    H = kb.symbol("H");
  }
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); }
  Value any() { return vals[pick(static_cast<int>(vals.size()))]; }

  Value step() {
    static const UnaryOp kUnary[] = {UnaryOp::kExp,  UnaryOp::kTanh, UnaryOp::kSigmoid,
                                     UnaryOp::kAbs,  UnaryOp::kNeg,  UnaryOp::kGeluErf,
                                     UnaryOp::kRelu, UnaryOp::kSilu};
    static const BinaryOp kBinary[] = {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul,
                                       BinaryOp::kMaximum, BinaryOp::kMinimum};
    Value x = any();
    switch (pick(9)) {
      case 0:
        return kb.unary(kUnary[pick(8)], kb.binary(BinaryOp::kMul, x, 0.5));
      case 1:
        return kb.binary(kBinary[pick(5)], x, any());
      case 2:  // reduce then broadcast back (softmax-like)
        return kb.sub(x, kb.reduce(pick(2) ? ReduceOp::kMax : ReduceOp::kMean, x, {pick(2)}, true));
      case 3:  // transpose twice through a computed value
        return kb.transpose(kb.unary(UnaryOp::kTanh, kb.transpose(x, 0, 1)), 0, 1);
      case 4:  // reshape of a computed value and back
        return kb.reshape(kb.reshape(kb.binary(BinaryOp::kAdd, x, 1.0), {Dim(-1)}), {S, H});
      case 5:  // concat of halves of a slice
        return kb.concat({kb.slice(x, 0, 0, kSliceEnd, 1), kb.slice(any(), 0, 0, 0, 1)}, 0);
      case 6:  // select
        return kb.select(kb.binary(BinaryOp::kGt, x, 0.0), x, kb.binary(BinaryOp::kMul, x, 0.1));
      case 7: {  // row vector broadcast
        Value r = kb.sum(x, {0}, false);
        return kb.binary(BinaryOp::kMul, x, kb.unary(UnaryOp::kTanh, r));
      }
      default:  // x @ (something [H, H]) from a loaded weight
        return kb.matmul(x, w);
    }
  }
};

TEST(VmRandom, KernelsMatchReference) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    Gen g(seed);
    Value x = g.kb.load("x", DType::kF32, {g.S, g.H});
    g.w = g.kb.load("w", DType::kF32, {g.H, g.H});
    g.vals = {x};
    int steps = 2 + g.pick(5);
    for (int i = 0; i < steps; ++i) g.vals.push_back(g.step());
    g.kb.store("y", g.vals.back());
    if (g.pick(2)) g.kb.store("z", g.kb.sum(g.vals[g.vals.size() / 2], {1}));
    auto k = g.kb.build();
    ASSERT_TRUE(k.is_ok()) << k.status().to_string();
    std::mt19937 rng(seed);
    for (auto [s, h] : std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {7, 33}, {40, 20}}) {
      expect_matches_reference(*k,
                               {make_buffer(DType::kF32, {s, h}, rng, seed % 3 == 0),
                                make_buffer(DType::kF32, {h, h}, rng)},
                               Tolerance{1e-4, 1e-4}, {}, "seed " + std::to_string(seed));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace dvm::testing
