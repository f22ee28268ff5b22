// End-to-end smoke tests of the VM against the reference on the kernels that matter most.
#include "vm_test_util.h"

namespace dvm::testing {
namespace {

TEST(VmSmoke, AddBroadcast) {
  KernelBuilder kb("add");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 64});
  Value b = kb.load("b", DType::kF32, {64});
  kb.store("y", kb.unary(UnaryOp::kTanh, kb.add(kb.mul(x, b), b)));
  auto k = kb.build();
  ASSERT_TRUE(k.is_ok()) << k.status().to_string();
  std::mt19937 rng(1);
  for (int64_t s : {0, 1, 3, 100, 1000}) {
    expect_matches_reference(
        *k, {make_buffer(DType::kF32, {s, 64}, rng), make_buffer(DType::kF32, {64}, rng)},
        Tolerance{1e-5, 1e-5});
  }
}

TEST(VmSmoke, Softmax) {
  KernelBuilder kb("softmax");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value x = kb.load("x", DType::kF32, {S, H});
  Value m = kb.max(x, {-1}, true);
  Value e = kb.unary(UnaryOp::kExp, kb.sub(x, m));
  kb.store("y", kb.div(e, kb.sum(e, {-1}, true)));
  auto k = kb.build();
  ASSERT_TRUE(k.is_ok()) << k.status().to_string();
  std::mt19937 rng(2);
  for (auto [s, h] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {4, 7}, {33, 128}, {3, 20000}}) {
    expect_matches_reference(*k, {make_buffer(DType::kF32, {s, h}, rng)}, Tolerance{1e-6, 1e-4});
  }
}

TEST(VmSmoke, LayerNorm) {
  KernelBuilder kb("layernorm");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 768});
  Value g = kb.load("g", DType::kF32, {768});
  Value mean = kb.mean(x, {-1}, true);
  Value xc = kb.sub(x, mean);
  Value var = kb.mean(kb.mul(xc, xc), {-1}, true);
  Value y = kb.mul(kb.mul(xc, kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, var, 1e-5))), g);
  kb.store("y", y);
  auto k = kb.build();
  ASSERT_TRUE(k.is_ok()) << k.status().to_string();
  std::mt19937 rng(3);
  for (int64_t s : {1, 5, 64}) {
    expect_matches_reference(
        *k, {make_buffer(DType::kF32, {s, 768}, rng), make_buffer(DType::kF32, {768}, rng)},
        Tolerance{1e-4, 1e-4});
  }
}

TEST(VmSmoke, ReduceEachAxis) {
  std::mt19937 rng(4);
  for (int axis = 0; axis < 3; ++axis) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMean, ReduceOp::kArgMax}) {
      KernelBuilder kb("reduce");
      Value x = kb.load("x", DType::kF32, {5, 37, 9});
      kb.store("y", kb.reduce(op, x, {axis}, axis == 1));
      auto k = kb.build();
      ASSERT_TRUE(k.is_ok());
      expect_matches_reference(*k, {make_buffer(DType::kF32, {5, 37, 9}, rng)},
                               Tolerance{1e-4, 1e-4}, {}, "axis " + std::to_string(axis));
    }
  }
}

}  // namespace
}  // namespace dvm::testing
