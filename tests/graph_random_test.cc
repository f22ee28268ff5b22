// Random graphs: chains of elementwise ops, reductions with broadcast back, softmax and
// layernorm, matmuls, permutes, reshapes, slices and concats, and multi-operand ops whose
// operands are views of values computed in the same kernel, over [S, 16] values, compiled
// fused and unfused; every fused result must match the unfused run for several bindings.
#include <random>

#include "graph_test_util.h"

namespace dvm::testing {
namespace {

constexpr int64_t kW = 16;

struct RandomGraph {
  Graph graph;
  std::string recipe;  // ops applied, printed when a case fails
};

RandomGraph random_graph(std::mt19937& rng, int index) {
  GraphBuilder gb("random" + std::to_string(index));
  SymExpr S = gb.symbol("S");
  std::vector<Tensor> vals = {gb.input("x", DType::kF32, {S, kW}),
                              gb.input("y", DType::kF32, {S, kW})};
  Tensor w = gb.input("w", DType::kF32, {kW, kW});
  Tensor r = gb.input("r", DType::kF32, {kW});
  std::string recipe;
  auto pick = [&]() {
    return vals[std::uniform_int_distribution<size_t>(0, vals.size() - 1)(rng)];
  };
  int steps = std::uniform_int_distribution<int>(2, 9)(rng);
  for (int i = 0; i < steps; ++i) {
    int op = std::uniform_int_distribution<int>(0, 13)(rng);
    Tensor a = pick(), b = pick(), out;
    switch (op) {
      case 0: {
        UnaryOp u[] = {UnaryOp::kTanh, UnaryOp::kSigmoid, UnaryOp::kRelu, UnaryOp::kNeg,
                       UnaryOp::kSilu, UnaryOp::kGeluErf, UnaryOp::kAbs};
        out = gb.unary(u[std::uniform_int_distribution<int>(0, 6)(rng)], a);
        recipe += "unary ";
        break;
      }
      case 1: {
        BinaryOp o[] = {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kMaximum};
        out = gb.binary(o[std::uniform_int_distribution<int>(0, 3)(rng)], a, b);
        recipe += "binary ";
        break;
      }
      case 2:
        out = gb.add(a, r);
        recipe += "bias ";
        break;
      case 3: {
        ReduceOp o[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMean};
        out = gb.sub(a, gb.reduce(o[std::uniform_int_distribution<int>(0, 2)(rng)], a, {1}, true));
        recipe += "reduce-broadcast ";
        break;
      }
      case 4:
        out = gb.softmax(a, 1);
        recipe += "softmax ";
        break;
      case 5:
        out = gb.layer_norm(a, r, Tensor{});
        recipe += "layernorm ";
        break;
      case 6:
        out = gb.unary(UnaryOp::kTanh, gb.matmul(a, w));
        recipe += "matmul ";
        break;
      case 7:
        out = gb.reshape(gb.mul(gb.reshape(a, {S, 4, 4}), gb.constant(0.5)), {S, kW});
        recipe += "reshape ";
        break;
      case 8: {
        Tensor t = gb.transpose(a, 0, 1);  // [16, S]
        out = gb.transpose(gb.unary(UnaryOp::kTanh, t), 0, 1);
        recipe += "transpose ";
        break;
      }
      case 9: {
        Tensor c = gb.concat({gb.slice(a, 1, 0, 8), gb.slice(b, 1, 8, kW)}, 1);
        out = gb.add(c, a);
        recipe += "slice-concat ";
        break;
      }
      case 10:
        out = gb.linear(a, w, r);
        recipe += "linear ";
        break;
      case 11: {
        // A value computed with unit dims, viewed without them by every operand of a select
        // (average pooling's windows feeding an ELU once read one of them from unstored
        // memory).
        Tensor u = gb.add(gb.reshape(a, {S, 1, kW, 1}), gb.constant(1.0));
        Tensor v = gb.reshape(u, {S, kW});
        out = gb.select(gb.binary(BinaryOp::kLe, v, gb.constant(0.0)), v,
                        gb.mul(v, gb.constant(2.0)));
        recipe += "select-of-views ";
        break;
      }
      case 12: {
        // Unit dims added and dropped around computed values, both operands viewed.
        Tensor x = gb.reshape(gb.unary(UnaryOp::kTanh, a), {S, 1, kW, 1});
        Tensor y = gb.reshape(gb.mul(b, gb.constant(3.0)), {S, 1, kW, 1});
        out = gb.reshape(gb.binary(BinaryOp::kSub, x, y), {S, kW});
        recipe += "unit-dim-views ";
        break;
      }
      default: {
        // A column reduction (over S) broadcast back: another reduction axis.
        out = gb.mul(a, gb.unary(UnaryOp::kTanh, gb.reduce(ReduceOp::kMean, a, {0}, true)));
        recipe += "column-reduce ";
        break;
      }
    }
    vals.push_back(out);
  }
  gb.output("out", vals.back());
  if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) gb.output("extra", vals[vals.size() / 2]);
  auto g = gb.build();
  EXPECT_TRUE(g.is_ok()) << g.status().to_string() << " " << recipe;
  return {g.is_ok() ? *g : Graph(), recipe};
}

TEST(RandomGraphs, FusedMatchesUnfused) {
  std::mt19937 rng(2024);
  for (int i = 0; i < 300; ++i) {
    RandomGraph rg = random_graph(rng, i);
    ASSERT_GT(rg.graph.num_nodes(), 0);
    GraphCompileOptions o;
    auto fused = Executable::compile(rg.graph, o);
    o.fuse = false;
    auto unfused = Executable::compile(rg.graph, o);
    ASSERT_TRUE(fused.is_ok()) << fused.status().to_string() << "\n" << rg.graph.to_string();
    ASSERT_TRUE(unfused.is_ok()) << unfused.status().to_string();
    for (int64_t s : {1, 3, 19, 70}) {
      std::vector<HostTensor> in = {
          random_host(DType::kF32, {s, kW}, rng), random_host(DType::kF32, {s, kW}, rng),
          random_host(DType::kF32, {kW, kW}, rng, -0.3, 0.3), random_host(DType::kF32, {kW}, rng)};
      auto a = run_graph(**fused, in);
      auto b = run_graph(**unfused, in);
      ASSERT_TRUE(a.is_ok()) << a.status().to_string() << "\n" << (*fused)->fusion_report();
      ASSERT_TRUE(b.is_ok()) << b.status().to_string();
      for (size_t k = 0; k < a->size(); ++k) {
        expect_close((*a)[k], (*b)[k], 1e-4,
                     "graph " + std::to_string(i) + " (" + rg.recipe + ") S=" + std::to_string(s));
      }
      if (::testing::Test::HasFailure()) {
        FAIL() << rg.graph.to_string() << "\n" << (*fused)->fusion_report();
      }
    }
  }
}

}  // namespace
}  // namespace dvm::testing
