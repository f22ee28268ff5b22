// Graph compiler tests: text form, shape deduction errors, passes, fusion patterns (golden
// kernel structure), numerics of fused graphs against the unfused run and hand-written
// references, many bindings of one executable, memory planning and bad input.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <thread>

#include "dvm/models.h"
#include "graph_test_util.h"

namespace dvm::testing {
namespace {

std::shared_ptr<Executable> compile_or_die(const Graph& g, bool fuse = true) {
  GraphCompileOptions o;
  o.fuse = fuse;
  auto exe = Executable::compile(g, o);
  EXPECT_TRUE(exe.is_ok()) << exe.status().to_string();
  return exe.is_ok() ? *exe : nullptr;
}

// Kernel kinds in order, e.g. "mix,cube".
std::string kinds(const Executable& exe) {
  std::istringstream in(exe.fusion_report());
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.rfind("kernel ", 0) != 0) continue;
    size_t open = line.find('['), close = line.find(']');
    if (!out.empty()) out += ',';
    out += line.substr(open + 1, close - open - 1);
  }
  return out;
}

// Runs fused and unfused executables of `g` on the same inputs and compares every output.
// `unoptimized`: the baseline also skips the rewriting passes (tests of a rewrite).
void expect_fused_matches_unfused(const Graph& g, std::vector<HostTensor> inputs, double tol = 2e-5,
                                  bool unoptimized = false) {
  auto fused = compile_or_die(g, true);
  GraphCompileOptions base;
  base.fuse = false;
  base.optimize = !unoptimized;
  auto compiled = Executable::compile(g, base);
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  std::shared_ptr<Executable> unfused = *compiled;
  ASSERT_TRUE(fused && unfused);
  auto a = run_graph(*fused, inputs);
  auto b = run_graph(*unfused, inputs);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string() << "\n" << fused->fusion_report();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  for (size_t k = 0; k < a->size(); ++k) {
    expect_close((*a)[k], (*b)[k], tol, g.name() + " output " + std::to_string(k));
  }
}

// ---------------------------------------------------------------------------------------------
// Graphs used below.

Graph layernorm_graph() {
  GraphBuilder gb("layernorm");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 64});
  Tensor w = gb.input("w", DType::kF32, {64});
  Tensor b = gb.input("b", DType::kF32, {64});
  gb.output("y", gb.layer_norm(x, w, b, 1e-5));
  return *gb.build();
}

Graph softmax_graph() {
  GraphBuilder gb("softmax");
  SymExpr b = gb.symbol("B"), n = gb.symbol("N");
  Tensor x = gb.input("x", DType::kF32, {b, n});
  gb.output("y", gb.softmax(x, -1));
  return *gb.build();
}

Graph gelu_mlp_graph() {
  GraphBuilder gb("gelu_mlp");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 32});
  Tensor w1 = gb.input("w1", DType::kF32, {64, 32});
  Tensor b1 = gb.input("b1", DType::kF32, {64});
  Tensor w2 = gb.input("w2", DType::kF32, {32, 64});
  Tensor b2 = gb.input("b2", DType::kF32, {32});
  gb.output("y", gb.linear(gb.gelu(gb.linear(x, w1, b1)), w2, b2));
  return *gb.build();
}

Graph attention_graph(bool causal) {
  GraphBuilder gb(causal ? "causal_attention" : "attention");
  SymExpr s = gb.symbol("S");
  Tensor q = gb.input("q", DType::kF32, {2, s, 16});
  Tensor k = gb.input("k", DType::kF32, {2, s, 16});
  Tensor v = gb.input("v", DType::kF32, {2, s, 16});
  Tensor mask = gb.input("mask", DType::kF32, {s, s});
  gb.output("o", gb.attention(q, k, v, causal ? Tensor{} : mask, causal));
  return *gb.build();
}

// ---------------------------------------------------------------------------------------------
// Text form and build errors.

TEST(GraphText, PrintParsePrintIsStable) {
  for (const Graph& g : {layernorm_graph(), softmax_graph(), gelu_mlp_graph(),
                         attention_graph(false), attention_graph(true)}) {
    std::string text = g.to_string();
    auto parsed = parse_graph(text);
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string() << "\n" << text;
    EXPECT_EQ(parsed->to_string(), text);
    auto exe = Executable::compile(*parsed);
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    std::string opt = (*exe)->optimized().to_string();
    auto reparsed = parse_graph(opt);
    ASSERT_TRUE(reparsed.is_ok()) << reparsed.status().to_string() << "\n" << opt;
    EXPECT_EQ(reparsed->to_string(), opt);
  }
}

TEST(GraphText, ParseRejectsWrongTypes) {
  const char* text = R"(graph g symbols(s0 in [1, 100]) {
  %0 = input {name="x"} : f32[s0, 4]
  %1 = unary.exp(%0) : f32[s0, 5]
  return y=%1
})";
  auto g = parse_graph(text);
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("line 3"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("f32[s0, 5]"), std::string::npos);
  EXPECT_FALSE(parse_graph("graph g {\n  %0 = nosuchop : f32[]\n  return y=%0\n}").is_ok());
  EXPECT_FALSE(parse_graph("graph g {\n  %1 = input {name=\"x\"} : f32[]\n}").is_ok());
}

TEST(GraphBuild, BroadcastOfUnrelatedSymbolsIsAnError) {
  GraphBuilder gb("bad");
  SymExpr a = gb.symbol("A"), b = gb.symbol("B");
  Tensor x = gb.input("x", DType::kF32, {a, 4});
  Tensor y = gb.input("y", DType::kF32, {b, 4});
  gb.output("z", gb.add(x, y));
  auto g = gb.build();
  ASSERT_FALSE(g.is_ok());
  std::string m = g.status().message();
  EXPECT_NE(m.find("bad: binary"), std::string::npos) << m;
  EXPECT_NE(m.find("[A, 4]"), std::string::npos) << m;
  EXPECT_NE(m.find("[B, 4]"), std::string::npos) << m;
}

TEST(GraphBuild, SymbolicDimsDeduce) {
  GraphBuilder gb("deduce");
  SymExpr b = gb.symbol("B"), s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {b, s, 64});
  Tensor flat = gb.reshape(x, {-1, 64});
  EXPECT_EQ(gb.shape(flat)[0], b * s);
  Tensor heads = gb.reshape(flat, {b, s, 4, 16});
  Tensor t = gb.permute(heads, {0, 2, 1, 3});
  EXPECT_EQ(to_string(gb.shape(t)), "[B, 4, S, 16]");
  Tensor sl = gb.slice(x, 1, 1, kSymMax);
  EXPECT_EQ(gb.shape(sl)[1], s - 1);
  Tensor cat = gb.concat({x, x}, 1);
  EXPECT_EQ(gb.shape(cat)[1], s * 2);
  auto parts = gb.split(cat, {s, s}, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(gb.shape(parts[1])[1], s);
  Tensor mm = gb.matmul(x, x, false, true);
  EXPECT_EQ(to_string(gb.shape(mm)), "[B, S, S]");
  gb.output("y", mm);
  ASSERT_TRUE(gb.build().is_ok());
}

TEST(GraphBuild, MatmulContractionMismatch) {
  GraphBuilder gb("mm");
  Tensor a = gb.input("a", DType::kF32, {4, 8});
  Tensor b = gb.input("b", DType::kF32, {9, 4});
  gb.output("c", gb.matmul(a, b));
  auto g = gb.build();
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("contraction"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Passes.

int count_ops(const Graph& g, const std::string& needle) {
  std::string t = g.to_string();
  int n = 0;
  for (size_t p = t.find(needle); p != std::string::npos; p = t.find(needle, p + 1)) ++n;
  return n;
}

TEST(Passes, CseDceFoldAndCanonicalize) {
  GraphBuilder gb("passes");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 8});
  Tensor e1 = gb.unary(UnaryOp::kExp, x);
  Tensor e2 = gb.unary(UnaryOp::kExp, x);                    // CSE with e1
  Tensor five = gb.add(gb.constant(2.0), gb.constant(3.0));  // folds to 5
  Tensor y = gb.mul(gb.add(e1, e2), five);
  y = gb.mul(y, gb.constant(1.0));              // x * 1 = x
  y = gb.reshape(gb.reshape(y, {-1}), {s, 8});  // reshape chain = identity
  gb.unary(UnaryOp::kLog, x);                   // dead
  gb.output("y", y);
  auto exe = Executable::compile(*gb.build());
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const Graph& opt = (*exe)->optimized();
  EXPECT_EQ(count_ops(opt, "unary.exp"), 1) << opt.to_string();
  EXPECT_EQ(count_ops(opt, "unary.log"), 0) << opt.to_string();
  EXPECT_EQ(count_ops(opt, "reshape"), 0) << opt.to_string();
  EXPECT_EQ(count_ops(opt, "value=5"), 1) << opt.to_string();
  EXPECT_EQ(count_ops(opt, "binary.mul"), 1) << opt.to_string();
  std::mt19937 rng(1);
  std::vector<HostTensor> in = {random_host(DType::kF32, {3, 8}, rng)};
  auto out = run_graph(**exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (int64_t i = 0; i < in[0].numel(); ++i) {
    EXPECT_NEAR((*out)[0].at(i), 10 * std::exp(in[0].at(i)), 1e-4 * std::exp(in[0].at(i)));
  }
}

// A scalar scale of a matmul operand moves to the output (the matmul's epilogue): one kernel
// instead of a pass over the operand plus the matmul.
TEST(Passes, ScaleOfMatmulOperandMovesToTheOutput) {
  GraphBuilder gb("scaled_mm");
  SymExpr s = gb.symbol("S");
  Tensor q = gb.input("q", DType::kF32, {s, 16});
  Tensor k = gb.input("k", DType::kF32, {s, 16});
  Tensor w = gb.input("w", DType::kF32, {16, 24});
  Tensor y = gb.matmul(gb.mul(q, gb.constant(0.25)), k, false, true);  // scaled q @ k^T
  Tensor z = gb.matmul(q, gb.mul(gb.constant(-2.0), w));               // q @ (-2 w)
  gb.output("y", y);
  gb.output("z", z);
  auto exe = Executable::compile(*gb.build());
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const Graph& opt = (*exe)->optimized();
  EXPECT_EQ(count_ops(opt, "matmul"), 2) << opt.to_string();
  EXPECT_EQ((*exe)->num_kernels(), 2) << opt.to_string();
  std::mt19937 rng(3);
  std::vector<HostTensor> in = {random_host(DType::kF32, {5, 16}, rng),
                                random_host(DType::kF32, {5, 16}, rng),
                                random_host(DType::kF32, {16, 24}, rng)};
  auto out = run_graph(**exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (int64_t i = 0; i < 5; ++i) {
    for (int64_t j = 0; j < 5; ++j) {
      double ref = 0;
      for (int64_t p = 0; p < 16; ++p) ref += 0.25 * in[0].at(i * 16 + p) * in[1].at(j * 16 + p);
      EXPECT_NEAR((*out)[0].at(i * 5 + j), ref, 1e-4);
    }
    for (int64_t j = 0; j < 24; ++j) {
      double ref = 0;
      for (int64_t p = 0; p < 16; ++p) ref += in[0].at(i * 16 + p) * -2.0 * in[2].at(p * 24 + j);
      EXPECT_NEAR((*out)[1].at(i * 24 + j), ref, 1e-4);
    }
  }
}

// pow(x, c) for c in {2, 3, 0.5, -0.5, -1, -2} becomes the products, square roots and
// reciprocals torch's own pow kernel computes for them (so the results are torch's bits):
// rmsnorm's mean of squares reads x once as a dot product, GPT-2's gelu_new cube is two
// multiplies (the general pow costs ~15 ns an element). Other exponents stay pow.
TEST(Passes, PowByConstantBecomesTorchsFormula) {
  GraphBuilder gb("rms");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 40});
  Tensor ms = gb.reduce(ReduceOp::kMean, gb.binary(BinaryOp::kPow, x, 2.0), {-1}, true);
  gb.output("y", gb.mul(x, gb.unary(UnaryOp::kRsqrt, gb.binary(BinaryOp::kAdd, ms, 1e-6))));
  const double exps[] = {3.0, 0.5, -0.5, -1.0, -2.0, 1.7};
  const char* const names[] = {"cube", "sqrt", "rsqrt", "recip", "recip_square", "other"};
  for (size_t k = 0; k < std::size(exps); ++k) {
    gb.output(names[k], gb.binary(BinaryOp::kPow, x, exps[k]));
  }
  auto exe = Executable::compile(*gb.build());
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const Graph& opt = (*exe)->optimized();
  EXPECT_EQ(count_ops(opt, "binary.pow"), 1) << opt.to_string();  // x^1.7 only
  std::mt19937 rng(4);
  std::vector<HostTensor> in = {random_host(DType::kF32, {7, 40}, rng)};
  for (int64_t i = 0; i < 7 * 40; i += 3) in[0].set(i, std::abs(in[0].at(i)) + 0.25);
  auto out = run_graph(**exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const auto torch_pow = [](float v, double e) -> float {  // ATen's pow_tensor_scalar kernel
    if (e == 3.0) return v * v * v;
    if (e == 0.5) return std::sqrt(v);
    if (e == -0.5) return 1.0f / std::sqrt(v);
    if (e == -1.0) return 1.0f / v;
    if (e == -2.0) return 1.0f / (v * v);
    return std::pow(v, static_cast<float>(e));
  };
  for (int64_t i = 0; i < 7; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < 40; ++j) ss += double(in[0].at(i * 40 + j)) * in[0].at(i * 40 + j);
    const double inv = 1.0 / std::sqrt(ss / 40 + 1e-6);
    for (int64_t j = 0; j < 40; ++j) {
      const float v = in[0].at(i * 40 + j);
      EXPECT_NEAR((*out)[0].at(i * 40 + j), v * inv, 1e-5 * (1 + std::abs(v * inv)));
      for (size_t k = 0; k + 1 < std::size(exps); ++k) {
        const float got = (*out)[k + 1].at(i * 40 + j), want = torch_pow(v, exps[k]);
        EXPECT_TRUE(got == want || (std::isnan(got) && std::isnan(want)))
            << "x=" << v << " ^ " << exps[k] << ": " << got << " vs " << want;
      }
      const float want = torch_pow(v, 1.7), got = (*out)[6].at(i * 40 + j);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "x=" << v << " ^ 1.7";
      } else {
        EXPECT_NEAR(got, want, 1e-5 * (1 + std::abs(want)));
      }
    }
  }
}

// GPT-2's gelu_new as HuggingFace writes it, 0.5 * x * (1 + tanh(c * (x + 0.044715 x^3))),
// with c a runtime scalar (as Dynamo passes sqrt(2/pi)): the half-one-plus-tanh product
// becomes x * sigmoid(2u); a product that only looks alike (0.25, or tanh's operand of
// another shape) keeps its tanh. Values against the formula in double.
TEST(Passes, HalfOnePlusTanhBecomesSigmoid) {
  GraphBuilder gb("gelu_new");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 24});
  Tensor c = gb.input("c", DType::kF32, {});
  Tensor row = gb.input("row", DType::kF32, {24});
  Tensor u = gb.mul(gb.add(x, gb.mul(gb.mul(gb.mul(x, x), x), gb.constant(0.044715))), c);
  Tensor one_plus = gb.add(gb.constant(1.0), gb.unary(UnaryOp::kTanh, u));
  gb.output("gelu", gb.mul(gb.mul(gb.constant(0.5), x), one_plus));
  gb.output("quarter", gb.mul(gb.mul(x, gb.constant(0.25)), one_plus));
  gb.output("bcast", gb.mul(gb.mul(x, gb.constant(0.5)),
                            gb.add(gb.unary(UnaryOp::kTanh, row), gb.constant(1.0))));
  // Each factor reaching the product through a reshape (as GPT-2's do: its MLP is [B, S, F]
  // around a [B*S, F] matmul): matched all the same.
  const SymShape split = {s, 2, 12};
  gb.output("reshaped",
            gb.mul(gb.reshape(gb.mul(x, gb.constant(0.5)), split), gb.reshape(one_plus, split)));
  auto exe = Executable::compile(*gb.build());
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const Graph& opt = (*exe)->optimized();
  EXPECT_EQ(count_ops(opt, "unary.sigmoid"), 2) << opt.to_string();  // gelu's and reshaped's
  EXPECT_EQ(count_ops(opt, "unary.tanh"), 2) << opt.to_string();     // quarter's and bcast's
  std::mt19937 rng(5);
  std::vector<HostTensor> in = {random_host(DType::kF32, {9, 24}, rng),
                                random_host(DType::kF32, {}, rng),
                                random_host(DType::kF32, {24}, rng)};
  for (int64_t i = 0; i < 9 * 24; ++i) in[0].set(i, in[0].at(i) * 6.0f);  // both tails
  in[1].set(0, 0.7978845608f);
  auto out = run_graph(**exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (int64_t i = 0; i < 9 * 24; ++i) {
    const double v = in[0].at(i), cv = in[1].at(0);
    const double uv = cv * (v + 0.044715 * v * v * v), t = std::tanh(uv);
    // 0.5 v (1 + tanh(u)) without double's own cancellation where tanh(u) rounds to -1
    const double want = v / (1 + std::exp(-2 * uv)), quarter = 0.25 * v * (1 + t);
    const double bcast = 0.5 * v * (1 + std::tanh(double(in[2].at(i % 24))));
    // f32 rounds u: a relative error growing like |2u| ulp in the tail, as gelu_tanh's
    EXPECT_NEAR((*out)[0].at(i), want, 2e-7 * (4 + 2 * std::abs(uv)) * std::abs(want) + 1e-38)
        << "x=" << v;
    EXPECT_NEAR((*out)[1].at(i), quarter, 1e-5 * (std::abs(v) + 1)) << "x=" << v;
    EXPECT_NEAR((*out)[2].at(i), bcast, 1e-5 * (std::abs(v) + 1)) << "x=" << v;
    EXPECT_NEAR((*out)[3].at(i), want, 2e-7 * (4 + 2 * std::abs(uv)) * std::abs(want) + 1e-38)
        << "x=" << v;
  }
}

// torch's matmul of [B, H, S, D] operands reaches the graph as a bmm over [B*H, S, D]
// reshapes; the rank-4 product replaces it when both operands only merge the same batch dims,
// so attention's permuted heads are read in place (no copy kernels) and the softmax joins the
// matmul's kernel. Operands that merge different batch dims, or more than the batch dims, keep
// the bmm. Against a direct loop.
TEST(Passes, BatchedMatmulKeepsItsBatchDims) {
  GraphBuilder gb("heads");
  SymExpr s = gb.symbol("S");
  Tensor q = gb.input("q", DType::kF32, {2, s, 3, 8});  // [B, S, H, D]
  Tensor k = gb.input("k", DType::kF32, {2, s, 3, 8});
  Tensor qh = gb.reshape(gb.permute(q, {0, 2, 1, 3}), {6, s, 8});  // [B*H, S, D]
  Tensor kh = gb.reshape(gb.permute(k, {0, 2, 1, 3}), {6, s, 8});
  Tensor scores = gb.reshape(gb.matmul(qh, kh, false, true), {2, 3, s, s});
  gb.output("p", gb.softmax(scores, -1));
  auto exe = Executable::compile(*gb.build());
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const std::string opt = (*exe)->optimized().to_string();
  EXPECT_NE(opt.find("matmul(%"), std::string::npos) << opt;
  EXPECT_EQ(count_ops((*exe)->optimized(), "reshape"), 0) << opt;
  EXPECT_EQ((*exe)->num_kernels(), 1) << (*exe)->fusion_report();
  std::mt19937 rng(21);
  const int64_t S = 5;
  std::vector<HostTensor> in = {random_host(DType::kF32, {2, S, 3, 8}, rng),
                                random_host(DType::kF32, {2, S, 3, 8}, rng)};
  auto out = run_graph(**exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t i = 0; i < S; ++i) {
        double row[S], mx = -1e300, sum = 0;
        for (int64_t j = 0; j < S; ++j) {
          row[j] = 0;
          for (int64_t d = 0; d < 8; ++d) {
            row[j] += double(in[0].at(((b * S + i) * 3 + h) * 8 + d)) *
                      in[1].at(((b * S + j) * 3 + h) * 8 + d);
          }
          mx = std::max(mx, row[j]);
        }
        for (int64_t j = 0; j < S; ++j) sum += std::exp(row[j] - mx);
        for (int64_t j = 0; j < S; ++j) {
          EXPECT_NEAR((*out)[0].at(((b * 3 + h) * S + i) * S + j), std::exp(row[j] - mx) / sum,
                      1e-5)
              << b << " " << h << " " << i << " " << j;
        }
      }
    }
  }
}

// A gather of elementwise math over an input moves below the math: cross-entropy written as
// log_softmax + gather picks the targets' logits from the input, and the [S, C]
// log-probabilities are never stored. Values as computed the long way.
TEST(Passes, GatherMovesBelowElementwiseMath) {
  GraphBuilder gb("nll");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 12});
  Tensor t = gb.input("t", DType::kI64, {s, 1});
  Tensor m = gb.reduce(ReduceOp::kMax, x, {1}, true);
  Tensor c = gb.sub(x, m);
  Tensor lse =
      gb.unary(UnaryOp::kLog, gb.reduce(ReduceOp::kSum, gb.unary(UnaryOp::kExp, c), {1}, true));
  Tensor logp = gb.sub(c, lse);
  gb.output("picked", gb.unary(UnaryOp::kNeg, gb.gather(logp, 1, t)));
  gb.output("both", gb.gather(gb.add(x, x), 1, t));  // both operands gathered
  auto exe = Executable::compile(*gb.build());
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const Graph& opt = (*exe)->optimized();
  EXPECT_EQ(count_ops(opt, "gather(%0, %1)"), 1) << opt.to_string();  // the input, once (CSE)
  EXPECT_EQ(count_ops(opt, "gather("), 1) << opt.to_string();
  std::mt19937 rng(5);
  const int64_t rows = 9;
  HostTensor ti = host(DType::kI64, {rows, 1});
  for (int64_t i = 0; i < rows; ++i) ti.set(i, (i * 5) % 12);
  std::vector<HostTensor> in = {random_host(DType::kF32, {rows, 12}, rng), ti};
  auto out = run_graph(**exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (int64_t i = 0; i < rows; ++i) {
    double mx = -1e30, sum = 0;
    for (int64_t j = 0; j < 12; ++j) mx = std::max<double>(mx, in[0].at(i * 12 + j));
    for (int64_t j = 0; j < 12; ++j) sum += std::exp(in[0].at(i * 12 + j) - mx);
    const double xt = in[0].at(i * 12 + (i * 5) % 12);
    EXPECT_NEAR((*out)[0].at(i), -(xt - mx - std::log(sum)), 1e-5);
    EXPECT_EQ((*out)[1].at(i), static_cast<float>(xt + xt));
  }
}

// nn.Linear on a [B, S, K] input is a 2-D matmul reshaped back to 3-D; the activation and the
// elementwise math after it (a bias broadcast over the last dim, another reshaped [B*S, N]
// value) move above the reshape into the matmul's kernel. An output keeps its place.
TEST(Passes, ElementwiseMovesAboveReshapeIntoTheMatmulKernel) {
  GraphBuilder gb("mlp3d");
  SymExpr b = gb.symbol("B"), s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {b, s, 16});
  Tensor w1 = gb.input("w1", DType::kF32, {16, 24});
  Tensor w2 = gb.input("w2", DType::kF32, {24, 8});
  Tensor bias = gb.input("bias", DType::kF32, {24});
  Tensor flat = gb.reshape(x, {b * s, 16});
  Tensor h = gb.reshape(gb.add(gb.matmul(flat, w1), bias), {b, s, 24});
  Tensor gate = gb.reshape(gb.matmul(flat, w1), {b, s, 24});
  Tensor act = gb.mul(gb.add(gb.gelu(h), bias), gb.unary(UnaryOp::kSigmoid, gate));
  gb.output("y", gb.matmul(gb.reshape(act, {b * s, 24}), w2));
  gb.output("act", gb.unary(UnaryOp::kNeg, h));  // an output: stays below its reshape
  auto g = gb.build();
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto exe = Executable::compile(*g);
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  // Kernels: the two matmuls with everything elementwise after the first (CSE makes one of
  // them), the second matmul, and the negated output.
  EXPECT_EQ((*exe)->num_kernels(), 3) << (*exe)->fusion_report();
  std::mt19937 rng(9);
  for (auto [bb, ss] : {std::pair<int64_t, int64_t>{1, 1}, {2, 5}, {3, 17}}) {
    SCOPED_TRACE("B=" + std::to_string(bb) + " S=" + std::to_string(ss));
    expect_fused_matches_unfused(
        *g,
        {random_host(DType::kF32, {bb, ss, 16}, rng), random_host(DType::kF32, {16, 24}, rng),
         random_host(DType::kF32, {24, 8}, rng), random_host(DType::kF32, {24}, rng)},
        1e-5, /*unoptimized=*/true);
  }
}

// The last row of a model's head: its final norm, MLP and head run on the kept row only (a
// value also used whole, the keys, stays whole and is sliced where the row needs it); every
// output equals the graph's without the rewrite, at every length.
TEST(Passes, SliceOfTheLastRowNarrowsTheRowwiseOpsBeforeIt) {
  GraphBuilder gb("last_row");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {1, s, 16});
  Tensor w1 = gb.input("w1", DType::kF32, {24, 16});
  Tensor b1 = gb.input("b1", DType::kF32, {24});
  Tensor w2 = gb.input("w2", DType::kF32, {16, 24});
  Tensor wk = gb.input("wk", DType::kF32, {16, 16});
  Tensor head = gb.input("head", DType::kF32, {40, 16});
  Tensor h = gb.layer_norm(x, Tensor{}, Tensor{}, 1e-5);
  Tensor y = gb.add(x, gb.linear(gb.gelu(gb.linear(h, w1, b1)), w2, Tensor{}));
  Tensor flat = gb.reshape(gb.layer_norm(y, Tensor{}, Tensor{}, 1e-5), {s, 16});
  Tensor logits = gb.reshape(gb.matmul(flat, head, false, true), {1, s, 40});
  gb.output("last", gb.reshape(gb.slice(logits, 1, s - 1, s), {1, 40}));
  gb.output("keys", gb.matmul(h, wk));                           // h is also used whole
  gb.output("first_two", gb.slice(gb.softmax(y, -1), 1, 0, 2));  // another slice of y
  auto g = gb.build();
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto exe = Executable::compile(*g);
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const std::string opt = (*exe)->optimized().to_string();
  // y has two slices (two demands): computed whole, then each chain narrowed after it.
  EXPECT_NE(opt.find("matmul"), std::string::npos);
  EXPECT_EQ(opt.find(": f32[S, 40]"), std::string::npos) << opt;  // the head on S rows
  EXPECT_NE(opt.find(": f32[1, 40]"), std::string::npos) << opt;
  std::mt19937 rng(12);
  for (int64_t len : {1, 2, 7, 33}) {
    SCOPED_TRACE("S=" + std::to_string(len));
    expect_fused_matches_unfused(
        *g,
        {random_host(DType::kF32, {1, len, 16}, rng), random_host(DType::kF32, {24, 16}, rng),
         random_host(DType::kF32, {24}, rng), random_host(DType::kF32, {16, 24}, rng),
         random_host(DType::kF32, {16, 16}, rng), random_host(DType::kF32, {40, 16}, rng)},
        1e-5, /*unoptimized=*/true);
  }
}

TEST(Passes, DecomposeLeavesNoComposites) {
  auto exe = Executable::compile(attention_graph(true));
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  std::string t = (*exe)->optimized().to_string();
  for (const char* c : {"attention", "softmax", "layer_norm", "linear"}) {
    EXPECT_EQ(t.find(std::string(" = ") + c), std::string::npos) << c << "\n" << t;
  }
}

// ---------------------------------------------------------------------------------------------
// Fusion patterns: kernel kinds and counts (the golden structure), and numerics.

struct Pattern {
  const char* name;
  Graph (*build)();
  const char* kinds;
};

Graph rmsnorm_graph() {
  GraphBuilder gb("rmsnorm");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 48});
  Tensor w = gb.input("w", DType::kF32, {48});
  gb.output("y", gb.rms_norm(x, w, 1e-6));
  return *gb.build();
}

Graph residual_layernorm_graph() {
  GraphBuilder gb("residual_layernorm");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 64});
  Tensor r = gb.input("r", DType::kF32, {s, 64});
  Tensor w = gb.input("w", DType::kF32, {64});
  Tensor b = gb.input("b", DType::kF32, {64});
  gb.output("y", gb.layer_norm(gb.add(x, r), w, b));
  return *gb.build();
}

Graph swiglu_mlp_graph() {
  GraphBuilder gb("swiglu_mlp");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 32});
  Tensor wg = gb.input("wg", DType::kF32, {48, 32});
  Tensor wu = gb.input("wu", DType::kF32, {48, 32});
  Tensor wd = gb.input("wd", DType::kF32, {32, 48});
  gb.output("y", gb.linear(gb.swiglu(gb.linear(x, wg), gb.linear(x, wu)), wd));
  return *gb.build();
}

Graph cross_entropy_graph() {
  GraphBuilder gb("cross_entropy");
  SymExpr n = gb.symbol("N");
  Tensor logits = gb.input("logits", DType::kF32, {n, 10});
  Tensor t = gb.input("t", DType::kI64, {n});
  gb.output("loss", gb.cross_entropy(logits, t));
  return *gb.build();
}

Graph attention_masked() {
  return attention_graph(false);
}
Graph attention_causal() {
  return attention_graph(true);
}

const Pattern kPatterns[] = {
    {"layernorm", layernorm_graph, "vector"},
    {"softmax", softmax_graph, "vector"},
    {"rmsnorm", rmsnorm_graph, "vector"},
    {"residual_layernorm", residual_layernorm_graph, "vector"},
    {"gelu_mlp", gelu_mlp_graph, "mix,mix"},
    {"swiglu_mlp", swiglu_mlp_graph, "cube,mix,cube"},
    {"attention", attention_masked, "mix,cube"},
    {"causal_attention", attention_causal, "native,native,vector,mix,cube"},
    {"cross_entropy", cross_entropy_graph, "native,vector,vector"},
};

TEST(Fusion, PatternsFuseAsDesigned) {
  for (const Pattern& p : kPatterns) {
    auto exe = compile_or_die(p.build());
    ASSERT_TRUE(exe);
    EXPECT_EQ(kinds(*exe), p.kinds) << p.name << "\n" << exe->fusion_report();
  }
}

TEST(Fusion, KernelsOfSiblingBranchesMerge) {
  // x*2+b and x-1 each start a kernel (they read only inputs); their product merges them.
  GraphBuilder gb("siblings");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 8});
  Tensor b = gb.input("b", DType::kF32, {8});
  Tensor left = gb.add(gb.binary(BinaryOp::kMul, x, 2.0), b);
  Tensor right = gb.binary(BinaryOp::kSub, x, 1.0);
  Tensor y = gb.mul(left, right);
  // A branch reducing other axes cannot merge: it stays its own kernel.
  Tensor col = gb.reduce(ReduceOp::kSum, gb.unary(UnaryOp::kExp, x), {0}, true);
  gb.output("y", gb.add(y, gb.reduce(ReduceOp::kMax, y, {1}, true)));
  gb.output("z", gb.mul(right, col));
  Graph g = *gb.build();
  auto exe = compile_or_die(g);
  ASSERT_TRUE(exe);
  EXPECT_EQ(kinds(*exe), "vector,vector") << exe->fusion_report();
  EXPECT_NE(exe->fusion_report().find("merged with kernel"), std::string::npos);
  std::mt19937 rng(14);
  for (int64_t n : {1, 9}) {
    expect_fused_matches_unfused(
        g, {random_host(DType::kF32, {n, 8}, rng), random_host(DType::kF32, {8}, rng)});
  }
}

TEST(Fusion, UnitDimsDoNotSplitKernels) {
  // torch's linear over [1, S, K] runs as mm on [S, K] and views the result as [1, S, N].
  GraphBuilder gb("unit_dims");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {1, s, 16});
  Tensor w = gb.input("w", DType::kF32, {24, 16});
  Tensor b = gb.input("b", DType::kF32, {24});
  Tensor mm = gb.matmul(gb.reshape(x, {s, 16}), w, false, true);
  Tensor y = gb.gelu(gb.add(gb.reshape(mm, {1, s, 24}), b));
  gb.output("y", y);
  Graph g = *gb.build();
  auto exe = compile_or_die(g);
  ASSERT_TRUE(exe);
  EXPECT_EQ(kinds(*exe), "mix") << exe->fusion_report();
  std::mt19937 rng(15);
  for (int64_t n : {1, 7}) {
    expect_fused_matches_unfused(
        g, {random_host(DType::kF32, {1, n, 16}, rng), random_host(DType::kF32, {24, 16}, rng),
            random_host(DType::kF32, {24}, rng)});
  }
}

TEST(Fusion, ReportSaysWhyKernelsStart) {
  auto exe = compile_or_die(gelu_mlp_graph());
  ASSERT_TRUE(exe);
  std::string r = exe->fusion_report();
  EXPECT_NE(r.find("a matmul reads its operands from memory"), std::string::npos) << r;
}

std::vector<HostTensor> inputs_for(const char* name, int64_t s, std::mt19937& rng) {
  std::string n = name;
  auto f = [&](std::vector<int64_t> shape) { return random_host(DType::kF32, shape, rng); };
  if (n == "layernorm") return {f({s, 64}), f({64}), f({64})};
  if (n == "softmax") return {f({3, s})};
  if (n == "rmsnorm") return {f({s, 48}), f({48})};
  if (n == "residual_layernorm") return {f({s, 64}), f({s, 64}), f({64}), f({64})};
  if (n == "gelu_mlp") return {f({s, 32}), f({64, 32}), f({64}), f({32, 64}), f({32})};
  if (n == "swiglu_mlp") return {f({s, 32}), f({48, 32}), f({48, 32}), f({32, 48})};
  if (n == "attention" || n == "causal_attention") {
    return {f({2, s, 16}), f({2, s, 16}), f({2, s, 16}), f({s, s})};
  }
  if (n == "cross_entropy") {
    HostTensor t = host(DType::kI64, {s});
    for (int64_t i = 0; i < s; ++i) t.set(i, (i * 7) % 10);
    return {f({s, 10}), t};
  }
  return {};
}

TEST(Fusion, FusedMatchesUnfusedOnManyBindings) {
  std::mt19937 rng(7);
  for (const Pattern& p : kPatterns) {
    for (int64_t s : {1, 2, 5, 17, 64, 130}) {
      SCOPED_TRACE(std::string(p.name) + " S=" + std::to_string(s));
      std::vector<HostTensor> in = inputs_for(p.name, s, rng);
      expect_fused_matches_unfused(p.build(), in, 5e-5);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Numerics against hand-written references (catch decomposition errors that fused and
// unfused runs would share).

TEST(Numerics, SoftmaxAndLayerNormAgainstScalarCode) {
  std::mt19937 rng(3);
  int64_t s = 37;
  {
    std::vector<HostTensor> in = {random_host(DType::kF32, {3, s}, rng, -20, 20)};
    auto exe = compile_or_die(softmax_graph());
    auto out = run_graph(*exe, in);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    for (int64_t r = 0; r < 3; ++r) {
      double m = -1e30, sum = 0;
      for (int64_t j = 0; j < s; ++j) m = std::max(m, in[0].at(r * s + j));
      for (int64_t j = 0; j < s; ++j) sum += std::exp(in[0].at(r * s + j) - m);
      for (int64_t j = 0; j < s; ++j) {
        EXPECT_NEAR((*out)[0].at(r * s + j), std::exp(in[0].at(r * s + j) - m) / sum, 1e-6);
      }
    }
  }
  {
    std::vector<HostTensor> in = inputs_for("layernorm", s, rng);
    auto exe = compile_or_die(layernorm_graph());
    auto out = run_graph(*exe, in);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    for (int64_t r = 0; r < s; ++r) {
      double mean = 0, var = 0;
      for (int j = 0; j < 64; ++j) mean += in[0].at(r * 64 + j) / 64;
      for (int j = 0; j < 64; ++j) var += std::pow(in[0].at(r * 64 + j) - mean, 2) / 64;
      for (int j = 0; j < 64; ++j) {
        double want =
            (in[0].at(r * 64 + j) - mean) / std::sqrt(var + 1e-5) * in[1].at(j) + in[2].at(j);
        EXPECT_NEAR((*out)[0].at(r * 64 + j), want, 1e-4);
      }
    }
  }
}

TEST(Numerics, CausalAttentionAndCrossEntropyAgainstScalarCode) {
  std::mt19937 rng(4);
  int64_t s = 9;
  std::vector<HostTensor> in = inputs_for("causal_attention", s, rng);  // mask unused
  auto exe = compile_or_die(attention_graph(true));
  auto out = run_graph(*exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < s; ++i) {
      std::vector<double> p(s, 0);
      double m = -1e30, sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        for (int e = 0; e < 16; ++e)
          p[j] += in[0].at((b * s + i) * 16 + e) * in[1].at((b * s + j) * 16 + e) / 4.0;
        m = std::max(m, p[j]);
      }
      for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - m));
      for (int e = 0; e < 16; ++e) {
        double want = 0;
        for (int64_t j = 0; j <= i; ++j) want += p[j] / sum * in[2].at((b * s + j) * 16 + e);
        EXPECT_NEAR((*out)[0].at((b * s + i) * 16 + e), want, 1e-4);
      }
    }
  }
  std::vector<HostTensor> ce = inputs_for("cross_entropy", 13, rng);
  auto ce_exe = compile_or_die(cross_entropy_graph());
  auto loss = run_graph(*ce_exe, ce);
  ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
  double want = 0;
  for (int64_t i = 0; i < 13; ++i) {
    double m = -1e30, sum = 0;
    for (int c = 0; c < 10; ++c) m = std::max(m, ce[0].at(i * 10 + c));
    for (int c = 0; c < 10; ++c) sum += std::exp(ce[0].at(i * 10 + c) - m);
    want += (std::log(sum) + m - ce[0].at(i * 10 + ce[1].at(i))) / 13;
  }
  EXPECT_NEAR((*loss)[0].at(0), want, 1e-5);
}

// ---------------------------------------------------------------------------------------------
// One executable, many bindings; statistics; memory.

// Runs `in` through both executables and expects the same first output (stats: the fused
// run's; want: the unfused output).
void expect_same_as_unfused(const Executable& fused, const Executable& unfused,
                            std::vector<HostTensor>& in, GraphRunStats* st, HostTensor* want) {
  auto a = run_graph(fused, in, st);
  auto b = run_graph(unfused, in);
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().to_string() << b.status().to_string();
  expect_close((*a)[0], (*b)[0], 5e-5, "S=" + std::to_string(in[0].shape[0]));
  if (want) *want = (*b)[0];
}

TEST(Executable, HundredBindingsInRandomOrder) {
  Graph g = gelu_mlp_graph();
  auto fused = compile_or_die(g, true);
  auto unfused = compile_or_die(g, false);
  std::vector<int64_t> sizes(100);
  std::iota(sizes.begin(), sizes.end(), 1);
  std::mt19937 rng(11);
  std::shuffle(sizes.begin(), sizes.end(), rng);
  sizes.insert(sizes.end(), sizes.begin(), sizes.begin() + 20);  // repeats hit the caches
  int hits = 0;
  for (int64_t s : sizes) {
    std::vector<HostTensor> in = inputs_for("gelu_mlp", s, rng);
    GraphRunStats st;
    expect_same_as_unfused(*fused, *unfused, in, &st, nullptr);
    EXPECT_EQ(st.kernels_launched, 2);
    hits += st.cache_hits;
  }
  EXPECT_EQ(hits, 40);  // the 20 repeated bindings, 2 kernels each
}

// One executable called from four threads at interleaved bindings (shared plan and binding
// caches, prepared calls, the VM's pool): every call equals, bit for bit, the same call made
// from one thread first. Also run under ThreadSanitizer in CI.
TEST(Executable, ConcurrentCallsMatchSerialCallsBitwise) {
  for (const Pattern& p : {kPatterns[0], kPatterns[4]}) {
    auto exe = compile_or_die(p.build(), true);
    ASSERT_TRUE(exe);
    std::mt19937 rng(23);
    constexpr int kThreads = 4, kSizes = 12, kRounds = 6;
    std::vector<std::vector<HostTensor>> inputs, want;
    for (int64_t s = 1; s <= kSizes; ++s) {
      inputs.push_back(inputs_for(p.name, s, rng));
      auto r = run_graph(*exe, inputs.back());
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      want.push_back(std::move(*r));
    }
    std::atomic<int> calls{0}, failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < kRounds; ++round) {
          for (int i = 0; i < kSizes; ++i) {
            const int k = (i * (t + 1) + round) % kSizes;  // each thread its own order
            std::vector<HostTensor> in = inputs[k];
            auto got = run_graph(*exe, in);
            calls.fetch_add(1);
            bool same = got.is_ok() && got->size() == want[k].size();
            for (size_t o = 0; same && o < got->size(); ++o) {
              const HostTensor& a = (*got)[o];
              const HostTensor& b = want[k][o];
              same = a.numel() == b.numel();
              for (int64_t e = 0; same && e < a.numel(); ++e) {
                const double x = a.at(e), y = b.at(e);
                same = x == y || (std::isnan(x) && std::isnan(y));
              }
            }
            if (!same) failures.fetch_add(1);
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(calls.load(), kThreads * kRounds * kSizes) << p.name;
    EXPECT_EQ(failures.load(), 0) << p.name;
  }
}

// run(inputs, allocate): the allocator sees this binding's output shapes once, its outputs
// receive what the two-step output_shapes() + run() writes, and its error ends the call.
// index_select runs natively (an embedding lookup, T5's position-bias table): along the first
// axis of 1-D and 3-D tables (contiguous rows: one copy per index), along a middle axis (the
// strided path), with i32 and i64 indices, repeats and a size-1 trailing dim; against a direct
// loop, bitwise.
TEST(Executable, IndexSelectMatchesADirectLoop) {
  std::mt19937 rng(9);
  struct Case {
    std::vector<int64_t> table;
    int axis;
    DType index_type;
  };
  const Case cases[] = {{{7}, 0, DType::kI64},       {{5, 3, 4}, 0, DType::kI32},
                        {{5, 3, 4}, 1, DType::kI64}, {{6, 1}, 0, DType::kI64},
                        {{4, 9}, 1, DType::kI32},    {{32, 4}, 0, DType::kI64},
                        {{8, 2}, 0, DType::kI32},    {{3, 8}, 0, DType::kI64}};
  for (const Case& c : cases) {
    GraphBuilder gb("gather_rows");
    Tensor x = gb.input("x", DType::kF32, {c.table.begin(), c.table.end()});
    Tensor idx = gb.input("idx", c.index_type, {11});
    gb.output("y", gb.index_select(x, c.axis, idx));
    auto exe = Executable::compile(*gb.build());
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    std::vector<HostTensor> in = {random_host(DType::kF32, c.table, rng), host(c.index_type, {11})};
    const int64_t dim = c.table[c.axis];
    for (int64_t k = 0; k < 11; ++k) in[1].set(k, (k * 5 + 3) % dim);
    auto out = run_graph(**exe, in);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < c.axis; ++d) outer *= c.table[d];
    for (size_t d = c.axis + 1; d < c.table.size(); ++d) inner *= c.table[d];
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t k = 0; k < 11; ++k) {
        const int64_t v = static_cast<int64_t>(in[1].at(k));
        for (int64_t i = 0; i < inner; ++i) {
          EXPECT_EQ((*out)[0].at((o * 11 + k) * inner + i), in[0].at((o * dim + v) * inner + i))
              << "axis " << c.axis << " k=" << k;
        }
      }
    }
  }
}

// iota (a native op: arange, and the row/column indices of masks) along each axis of a
// symbolic 3-D shape, in each dtype it is made in (f16/bf16 once left unwritten), as an output
// and feeding a fused kernel.
TEST(Executable, IotaCountsAlongItsAxis) {
  for (DType dt : {DType::kI64, DType::kI32, DType::kF32, DType::kF16, DType::kBF16}) {
    for (int axis = 0; axis < 3; ++axis) {
      GraphBuilder gb("iota");
      SymExpr s = gb.symbol("S");
      Tensor x = gb.input("x", DType::kF32, {s, 3, 5});
      Tensor i = gb.iota({s, 3, 5}, axis, dt);
      gb.output("i", i);
      gb.output("sum", gb.binary(BinaryOp::kAdd, gb.cast(i, DType::kF32), x));
      auto exe = Executable::compile(*gb.build());
      ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
      std::vector<HostTensor> in = {host(DType::kF32, {4, 3, 5})};
      for (int64_t k = 0; k < 60; ++k) in[0].set(k, 0.5 * k);
      auto out = run_graph(**exe, in);
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      for (int64_t k = 0; k < 60; ++k) {
        const int64_t idx[3] = {k / 15, k / 5 % 3, k % 5};
        EXPECT_EQ((*out)[0].at(k), idx[axis]) << "axis " << axis << " k=" << k;
        EXPECT_EQ((*out)[1].at(k), idx[axis] + 0.5 * k) << "axis " << axis << " k=" << k;
      }
    }
  }
  // A fill built from broadcast constants (torch.full_like written as zeros + 15) folds to a
  // broadcast constant: once stored from a kernel of constants alone, which names no dim to
  // spell [S, S] in, as a rank-0 value (an error at run time).
  GraphBuilder gb("full_like");
  SymExpr s = gb.symbol("S");
  gb.input("x", DType::kF32, {s});
  Tensor zeros = gb.expand(gb.constant(0.0, DType::kI64), {s, s});
  gb.output("y", gb.binary(BinaryOp::kAdd, zeros, gb.constant(15.0, DType::kI64)));
  auto exe = Executable::compile(*gb.build());
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  std::vector<HostTensor> in = {host(DType::kF32, {6})};
  auto out = run_graph(**exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ((*out)[0].numel(), 36);
  for (int64_t k = 0; k < 36; ++k) EXPECT_EQ((*out)[0].at(k), 15) << k;
}

// A broadcast constant where no input of the kernel names its dims: summed along an axis,
// read by a native op (cumsum), stored after math on scalars alone; the fuser fills it in
// memory for those (once: "axis out of range for shape []", "a scalar has no storage").
// torch.full as the backend writes it (iota * 0 + value) folds to a broadcast constant.
TEST(Executable, BroadcastConstantsWhereNoInputNamesTheDims) {
  GraphBuilder gb("bcast_const");
  SymExpr s = gb.symbol("S");
  gb.input("x", DType::kF32, {s});
  Tensor c = gb.expand(gb.constant(2.0), {s, 4});
  gb.output("sum", gb.reduce(ReduceOp::kSum, c, {1}));
  gb.output("cumsum", gb.cumsum(c, 0));
  Tensor i = gb.iota({s, s}, 1, DType::kI64);
  gb.output("full",
            gb.binary(BinaryOp::kAdd, gb.binary(BinaryOp::kMul, i, gb.constant(0.0, DType::kI64)),
                      gb.constant(15.0, DType::kI64)));
  auto exe = Executable::compile(*gb.build());
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  EXPECT_EQ(count_ops((*exe)->optimized(), "iota"), 0) << (*exe)->optimized().to_string();
  std::vector<HostTensor> in = {host(DType::kF32, {5})};
  auto out = run_graph(**exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ((*out)[0].numel(), 5);
  for (int64_t k = 0; k < 5; ++k) EXPECT_EQ((*out)[0].at(k), 8.0) << k;
  ASSERT_EQ((*out)[1].numel(), 20);
  for (int64_t k = 0; k < 20; ++k) EXPECT_EQ((*out)[1].at(k), 2.0 * (k / 4 + 1)) << k;
  ASSERT_EQ((*out)[2].numel(), 25);
  for (int64_t k = 0; k < 25; ++k) EXPECT_EQ((*out)[2].at(k), 15) << k;
}

// cumsum (a native op) along each axis, f32 (summed in double, each result rounded once, as
// torch's CPU kernel), i64 and i32 (wrapping), a symbolic dim, an empty tensor, and a cumsum
// feeding a fused kernel; the graph text round-trips.
TEST(Executable, CumsumMatchesARunningSum) {
  std::mt19937 rng(12);
  struct Case {
    std::vector<int64_t> shape;
    int axis;
    DType dtype;
  };
  const Case cases[] = {{{4, 5, 3}, 0, DType::kF32},  {{4, 5, 3}, 1, DType::kF32},
                        {{4, 5, 3}, -1, DType::kF32}, {{6, 7}, 1, DType::kI64},
                        {{9}, 0, DType::kI32},        {{0, 3}, 1, DType::kF32}};
  for (const Case& c : cases) {
    GraphBuilder gb("cumsum");
    std::vector<SymExpr> dims(c.shape.begin(), c.shape.end());
    if (c.shape[0] > 1) dims[0] = gb.symbol("S");
    Tensor x = gb.input("x", c.dtype, dims);
    Tensor y = gb.cumsum(x, c.axis);
    gb.output("y", y);
    gb.output("z", gb.binary(BinaryOp::kAdd, gb.binary(BinaryOp::kMul, y, 2.0), 1.0));
    const std::string text = gb.build()->to_string();
    EXPECT_NE(text.find("cumsum"), std::string::npos) << text;
    auto parsed = parse_graph(text);
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string() << "\n" << text;
    auto exe = Executable::compile(*parsed);
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    std::vector<HostTensor> in = {random_host(c.dtype, c.shape, rng, -50, 50)};
    auto out = run_graph(**exe, in);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const int rank = static_cast<int>(c.shape.size());
    const int axis = c.axis < 0 ? c.axis + rank : c.axis;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= c.shape[d];
    for (int d = axis + 1; d < rank; ++d) inner *= c.shape[d];
    const int64_t n = c.shape[axis];
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        double acc = 0;
        for (int64_t k = 0; k < n; ++k) {
          const int64_t e = (o * n + k) * inner + i;
          acc += in[0].at(e);
          const double want = c.dtype == DType::kF32 ? static_cast<double>(static_cast<float>(acc))
                              : c.dtype == DType::kI32
                                  ? static_cast<double>(static_cast<int32_t>(acc))
                                  : acc;
          EXPECT_EQ((*out)[0].at(e), want) << "axis " << c.axis << " at " << e;
          if (c.dtype == DType::kF32) {
            EXPECT_EQ((*out)[1].at(e), static_cast<float>(static_cast<float>(want) * 2.0f + 1.0f));
          } else {
            EXPECT_EQ((*out)[1].at(e), want * 2 + 1);
          }
        }
      }
    }
  }
  GraphBuilder bad("cumsum_bad");
  bad.output("y", bad.cumsum(bad.input("x", DType::kF32, {3, 4}), 2));
  auto g = bad.build();
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("cumsum"), std::string::npos) << g.status().message();
}

TEST(Executable, AllocatingRunMatchesTwoStepRun) {
  Graph g = gelu_mlp_graph();
  auto exe = compile_or_die(g, true);
  std::mt19937 rng(5);
  for (int64_t s : {1, 7, 33, 7}) {
    std::vector<HostTensor> in = inputs_for("gelu_mlp", s, rng);
    auto want = run_graph(*exe, in);
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();
    std::vector<TensorArg> args;
    for (HostTensor& h : in) args.push_back(h.arg());
    std::vector<HostTensor> outs;
    int calls = 0;
    Status st = exe->run(
        args, [&](const std::vector<std::vector<int64_t>>& shapes, std::vector<TensorArg>* o) {
          ++calls;
          EXPECT_EQ(shapes, *exe->output_shapes(args));
          for (size_t k = 0; k < shapes.size(); ++k)
            outs.push_back(host(exe->output_dtypes()[k], shapes[k]));
          for (HostTensor& h : outs) o->push_back(h.arg());
          return Status::ok();
        });
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(calls, 1);
    ASSERT_EQ(outs.size(), want->size());
    for (size_t k = 0; k < outs.size(); ++k)
      expect_close(outs[k], (*want)[k], 0, "S=" + std::to_string(s));
  }
  std::vector<HostTensor> in = inputs_for("gelu_mlp", 3, rng);
  std::vector<TensorArg> args;
  for (HostTensor& h : in) args.push_back(h.arg());
  Status st = exe->run(args, [](const std::vector<std::vector<int64_t>>&, std::vector<TensorArg>*) {
    return invalid_argument("no memory today");
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("no memory today"), std::string::npos);
  // Too few outputs from the allocator: a clear error, not a read past the vector.
  st = exe->run(args, [](const std::vector<std::vector<int64_t>>&, std::vector<TensorArg>*) {
    return Status::ok();
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
}

// A repeated call at a known binding and layout binds only addresses (PreparedCall): each call
// below passes new buffers, in a different order of bindings and layouts, and must compute
// from its own memory: a stale address, a swapped argument or an arena offset from another
// binding shows as a difference from the unfused executable, which always takes the full path.
TEST(Executable, RepeatedCallsUseTheirOwnAddresses) {
  Graph g = gelu_mlp_graph();
  auto fused = compile_or_die(g, true);
  auto unfused = compile_or_die(g, false);
  std::mt19937 rng(17);
  for (int round = 0; round < 4; ++round) {
    for (int64_t s : {3, 9, 3}) {
      std::vector<HostTensor> in = inputs_for("gelu_mlp", s, rng);
      GraphRunStats st;
      HostTensor want;
      expect_same_as_unfused(*fused, *unfused, in, &st, &want);
      EXPECT_EQ(st.kernels_launched, 2);
      // x as a transposed view: another layout at the same binding.
      HostTensor xt = host(DType::kF32, {32, s});
      for (int64_t i = 0; i < s; ++i)
        for (int64_t j = 0; j < 32; ++j) xt.set(j * s + i, in[0].at(i * 32 + j));
      std::vector<TensorArg> args;
      for (HostTensor& h : in) args.push_back(h.arg());
      args[0] = xt.arg();
      args[0].shape = {s, 32};
      args[0].strides = {1, s};
      HostTensor out = host(DType::kF32, {s, 32});
      TensorArg o = out.arg();
      Status r = fused->run(args, {&o, 1});
      ASSERT_TRUE(r.is_ok()) << r.to_string();
      expect_close(out, want, 5e-5, "transposed x, S=" + std::to_string(s));
    }
  }
  // b1 [64] and b2 [32] as views of one buffer, then of two buffers with the same layout:
  // arguments are told apart by position, never by address.
  std::vector<HostTensor> in = inputs_for("gelu_mlp", 5, rng);
  HostTensor bias = random_host(DType::kF32, {64}, rng);
  HostTensor other = random_host(DType::kF32, {64}, rng);
  for (int rep = 0; rep < 3; ++rep) {
    HostTensor& b2 = rep == 1 ? other : bias;
    std::vector<TensorArg> args;
    for (HostTensor& h : in) args.push_back(h.arg());
    args[2] = bias.arg();
    args[4] = b2.arg();
    args[4].shape = {32};
    args[4].storage_elems = 64;
    std::vector<HostTensor> ref_in = in;
    ref_in[2] = bias;
    ref_in[4] = host(DType::kF32, {32});
    for (int64_t i = 0; i < 32; ++i) ref_in[4].set(i, b2.at(i));
    auto want = run_graph(*unfused, ref_in);
    ASSERT_TRUE(want.is_ok());
    HostTensor out = host(DType::kF32, {5, 32});
    TensorArg o = out.arg();
    ASSERT_TRUE(fused->run(args, {&o, 1}).is_ok());
    expect_close(out, (*want)[0], 5e-5, "shared bias buffer, rep " + std::to_string(rep));
  }
}

// Native steps in repeated calls (PreparedCall keeps their resolved arguments and rebinds
// addresses, as for VM kernels): a language model's embedding (token and position lookups,
// positions from iota) and a cumsum, called again and again at a few lengths with fresh
// tables and ids every call, against a direct loop, bitwise; an index out of range still
// fails a repeated call cleanly.
// A binding's first run encodes its kernels (all at once, on the VM's threads), its second
// prepares the call, later ones take the prepared call. output_shapes() before the first run
// (run_graph does) made the binding's plan, which used to count as its first run: the first
// run then prepared a call (a full call's cost again, wasted on a length never repeated, as a
// decode step's) and encoded its kernels one by one.
TEST(Executable, RunsCountFromTheFirstRunNotThePlan) {
  GraphBuilder gb("mlp");
  SymExpr s = gb.symbol("S", SymRange{1, 64});
  Tensor x = gb.input("x", DType::kF32, {s, 16});
  Tensor w = gb.input("w", DType::kF32, {16, 16});
  Tensor h = gb.unary(UnaryOp::kTanh, gb.matmul(x, w));
  gb.output("y", gb.binary(BinaryOp::kAdd, gb.matmul(h, w), x));
  auto exe = Executable::compile(*gb.build());
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  std::mt19937 rng(5);
  for (int64_t n : {3, 7}) {
    std::vector<HostTensor> in = {random_host(DType::kF32, {n, 16}, rng),
                                  random_host(DType::kF32, {16, 16}, rng)};
    std::vector<HostTensor> first;
    for (int call = 0; call < 4; ++call) {
      GraphRunStats st;
      auto out = run_graph(**exe, in, &st);  // output_shapes(), then run()
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      EXPECT_EQ(st.prepared, call >= 2) << "S=" << n << " call " << call;
      EXPECT_EQ(st.programs_encoded, call == 0 ? st.kernels_launched : 0)
          << "S=" << n << " call " << call;
      if (call == 0) {
        first = *out;
        continue;
      }
      for (size_t k = 0; k < out->size(); ++k) {
        for (int64_t i = 0; i < first[k].numel(); ++i) {
          ASSERT_EQ((*out)[k].at(i), first[k].at(i)) << "S=" << n << " call " << call;
        }
      }
    }
  }
}

TEST(Executable, RepeatedCallsRebindNativeSteps) {
  constexpr int64_t kVocab = 13, kDim = 8, kMaxPos = 20;
  GraphBuilder gb("embed");
  SymExpr s = gb.symbol("S", SymRange{1, kMaxPos});
  Tensor table = gb.input("table", DType::kF32, {kVocab, kDim});
  Tensor pos = gb.input("pos", DType::kF32, {kMaxPos, kDim});
  Tensor ids = gb.input("ids", DType::kI64, {s});
  Tensor h = gb.binary(BinaryOp::kAdd, gb.index_select(table, 0, ids),
                       gb.index_select(pos, 0, gb.iota({s}, 0, DType::kI64)));
  gb.output("h", gb.unary(UnaryOp::kTanh, h));
  gb.output("cum", gb.cumsum(gb.cast(ids, DType::kF32), 0));
  auto exe = Executable::compile(*gb.build());
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  std::mt19937 rng(23);
  for (int round = 0; round < 3; ++round) {
    for (int64_t n : {3, 9, 3, 9}) {
      std::vector<HostTensor> in = {random_host(DType::kF32, {kVocab, kDim}, rng),
                                    random_host(DType::kF32, {kMaxPos, kDim}, rng),
                                    host(DType::kI64, {n})};
      for (int64_t k = 0; k < n; ++k) in[2].set(k, static_cast<double>(rng() % kVocab));
      GraphRunStats st;
      auto out = run_graph(**exe, in, &st);
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      EXPECT_EQ(st.native_launched, 4) << "round " << round << " S=" << n;
      double cum = 0;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t id = static_cast<int64_t>(in[2].at(k));
        cum += static_cast<double>(id);
        EXPECT_EQ((*out)[1].at(k), cum) << "round " << round << " S=" << n << " k=" << k;
        for (int64_t j = 0; j < kDim; ++j) {
          const float want = std::tanh(static_cast<float>(in[0].at(id * kDim + j)) +
                                       static_cast<float>(in[1].at(k * kDim + j)));
          EXPECT_NEAR((*out)[0].at(k * kDim + j), want, 1e-6)
              << "round " << round << " S=" << n << " k=" << k << " j=" << j;
        }
      }
    }
  }
  std::vector<HostTensor> in = {random_host(DType::kF32, {kVocab, kDim}, rng),
                                random_host(DType::kF32, {kMaxPos, kDim}, rng),
                                host(DType::kI64, {3})};
  in[2].set(1, kVocab);  // out of range
  auto bad = run_graph(**exe, in);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("index"), std::string::npos) << bad.status().to_string();
}

// Layers that repeat a kernel share its compiled form (same_definition): at a new binding the
// first layer's kernel encodes and the others find its programs; a kernel that differs in a
// constant alone does not share. Every layer still reads its own weights: against the unfused
// executable, at two lengths, several calls each.
TEST(Executable, RepeatedLayersShareTheirKernels) {
  for (double scale : {0.5, 0.25}) {
    GraphBuilder gb("layers");
    SymExpr s = gb.symbol("S");
    Tensor h = gb.input("x", DType::kF32, {s, 16});
    const char* weights[] = {"w0", "w1", "w2"};
    const char* biases[] = {"b0", "b1", "b2"};
    for (int layer = 0; layer < 3; ++layer) {
      Tensor w = gb.input(weights[layer], DType::kF32, {16, 16});
      Tensor b = gb.input(biases[layer], DType::kF32, {16});
      // The last layer's constant is `scale`: the same definition as the others at 0.5 only.
      const double c = layer == 2 ? scale : 0.5;
      h = gb.binary(BinaryOp::kAdd, gb.unary(UnaryOp::kTanh, gb.linear(h, w, b)), c);
    }
    gb.output("y", h);
    Graph g = *gb.build();
    auto fused = compile_or_die(g, true);
    auto unfused = compile_or_die(g, false);
    std::mt19937 rng(31);
    for (int64_t n : {5, 12, 5}) {
      std::vector<HostTensor> in = {random_host(DType::kF32, {n, 16}, rng)};
      for (int layer = 0; layer < 3; ++layer) {
        in.push_back(random_host(DType::kF32, {16, 16}, rng, -0.5, 0.5));
        in.push_back(random_host(DType::kF32, {16}, rng));
      }
      GraphRunStats st;
      HostTensor want;
      expect_same_as_unfused(*fused, *unfused, in, &st, &want);
      ASSERT_EQ(st.kernels_launched, 3) << (*fused).optimized().to_string();
      // And against a direct loop: the unfused executable shares its kernels the same way.
      std::vector<double> x(static_cast<size_t>(n * 16));
      for (int64_t i = 0; i < n * 16; ++i) x[i] = in[0].at(i);
      for (int layer = 0; layer < 3; ++layer) {
        const HostTensor &w = in[1 + 2 * layer], &b = in[2 + 2 * layer];
        std::vector<double> y(x.size());
        for (int64_t i = 0; i < n; ++i)
          for (int64_t o = 0; o < 16; ++o) {
            double acc = b.at(o);
            for (int64_t k = 0; k < 16; ++k) acc += x[i * 16 + k] * w.at(o * 16 + k);
            y[i * 16 + o] = std::tanh(acc) + (layer == 2 ? scale : 0.5);
          }
        x = y;
      }
      for (int64_t i = 0; i < n * 16; ++i)
        EXPECT_NEAR(want.at(i), x[i], 1e-4) << "scale " << scale << " S=" << n << " i=" << i;
      if (n == 12) {  // the first call at this binding
        EXPECT_EQ(st.programs_encoded, scale == 0.5 ? 1 : 2) << "scale " << scale;
        EXPECT_EQ(st.cache_hits, scale == 0.5 ? 2 : 1) << "scale " << scale;
      }
    }
  }
}

TEST(Executable, FusedPeakMemoryIsNoHigherThanUnfused) {
  for (const Pattern& p : kPatterns) {
    auto fused = compile_or_die(p.build(), true);
    auto unfused = compile_or_die(p.build(), false);
    for (int64_t s : {1, 100}) {
      SymBindings b;
      for (const char* sym : {"S", "B", "N"}) b[sym] = s;
      auto pf = fused->peak_bytes(b);
      auto pu = unfused->peak_bytes(b);
      ASSERT_TRUE(pf.is_ok() && pu.is_ok()) << p.name;
      EXPECT_LE(*pf, *pu) << p.name << " S=" << s;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input.

TEST(Executable, IndependentSmallKernelsAreStacked) {
  GraphBuilder gb("branches");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 16});
  // Reductions over different axes cannot share a kernel: four independent kernels.
  gb.output("a", gb.reduce(ReduceOp::kSum, gb.unary(UnaryOp::kExp, x), {0}));
  gb.output("b", gb.reduce(ReduceOp::kSum, gb.unary(UnaryOp::kTanh, x), {1}));
  gb.output("c", gb.reduce(ReduceOp::kMax, gb.unary(UnaryOp::kSigmoid, x), {0}));
  gb.output("d", gb.reduce(ReduceOp::kMin, gb.unary(UnaryOp::kRelu, x), {1}));
  Graph g = *gb.build();
  auto fused = compile_or_die(g, true);
  ASSERT_TRUE(fused);
  EXPECT_NE(fused->fusion_report().find("waves"), std::string::npos);
  std::mt19937 rng(12);
  for (int64_t n : {3, 40, 5000}) {
    std::vector<HostTensor> in = {random_host(DType::kF32, {n, 16}, rng)};
    GraphRunStats st;
    auto out = run_graph(*fused, in, &st);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(st.kernels_launched, 4);
    if (n < 100) {
      EXPECT_EQ(st.kernels_stacked, 4) << fused->fusion_report();
    }
    expect_fused_matches_unfused(g, in);
  }
}

TEST(Executable, ExpandedConstantsAreInlinedOrFilled) {
  GraphBuilder gb("fills");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 4});
  Tensor full = gb.expand(gb.constant(2.5), {s, 4});  // torch.full((S, 4), 2.5)
  gb.output("y", gb.mul(x, full));                    // inlined into the kernel
  gb.output("full", full);                            // an output: a native fill
  gb.output("ones", gb.expand(gb.constant(1, DType::kI64), {3, s}));
  gb.output("c", gb.constant(7));
  auto exe = compile_or_die(*gb.build());
  ASSERT_TRUE(exe);
  std::mt19937 rng(13);
  for (int64_t n : {1, 6}) {
    std::vector<HostTensor> in = {random_host(DType::kF32, {n, 4}, rng)};
    auto out = run_graph(*exe, in);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string() << exe->fusion_report();
    for (int64_t i = 0; i < n * 4; ++i) {
      EXPECT_FLOAT_EQ((*out)[0].at(i), 2.5 * in[0].at(i));
      EXPECT_EQ((*out)[1].at(i), 2.5);
    }
    EXPECT_EQ((*out)[2].shape, (std::vector<int64_t>{3, n}));
    for (int64_t i = 0; i < 3 * n; ++i) EXPECT_EQ((*out)[2].at(i), 1);
    EXPECT_EQ((*out)[3].at(0), 7);
  }
}

// Each bad call follows a good one at the same shapes where it can (the executable remembers
// the last call's plan by input dtypes and shapes): the memo must not hide the errors.
TEST(Executable, BadInputsAreStatusErrors) {
  auto exe = compile_or_die(residual_layernorm_graph());
  std::mt19937 rng(5);
  std::vector<HostTensor> good = inputs_for("residual_layernorm", 4, rng);
  ASSERT_TRUE(run_graph(*exe, good).is_ok());
  std::vector<HostTensor> in = inputs_for("residual_layernorm", 4, rng);
  in[1] = random_host(DType::kF32, {5, 64}, rng);  // S contradicts input 0
  auto r = run_graph(*exe, in);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'r'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("dim 0"), std::string::npos) << r.status().message();
  in = inputs_for("residual_layernorm", 4, rng);
  in[0] = random_host(DType::kF32, {4, 64, 1}, rng);
  r = run_graph(*exe, in);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("rank"), std::string::npos) << r.status().message();
  ASSERT_TRUE(run_graph(*exe, good).is_ok());
  in = inputs_for("residual_layernorm", 4, rng);
  in[2] = random_host(DType::kI32, {64}, rng);
  r = run_graph(*exe, in);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("dtype"), std::string::npos) << r.status().message();
  in.pop_back();
  EXPECT_FALSE(run_graph(*exe, in).is_ok());
  // An output overlapping an input.
  in = inputs_for("residual_layernorm", 4, rng);
  std::vector<TensorArg> args;
  for (HostTensor& h : in) args.push_back(h.arg());
  Status st = exe->run(args, {&args[0], 1});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("overlaps the memory of input 0"), std::string::npos) << st.message();
}

TEST(Executable, OutOfRangeIndexIsAnError) {
  GraphBuilder gb("emb");
  SymExpr s = gb.symbol("S");
  Tensor w = gb.input("w", DType::kF32, {10, 4});
  Tensor ids = gb.input("ids", DType::kI64, {s});
  gb.output("e", gb.embedding(w, ids));
  auto exe = compile_or_die(*gb.build());
  std::mt19937 rng(2);
  std::vector<HostTensor> in = {random_host(DType::kF32, {10, 4}, rng), host(DType::kI64, {3})};
  in[1].set(0, 9);
  in[1].set(1, 0);
  in[1].set(2, 4);
  auto ok = run_graph(*exe, in);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  for (int j = 0; j < 4; ++j) EXPECT_EQ((*ok)[0].at(2 * 4 + j), in[0].at(4 * 4 + j));
  in[1].set(1, 10);
  auto bad = run_graph(*exe, in);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("index 10 out of range"), std::string::npos)
      << bad.status().message();
}

TEST(Executable, NanAndInfPropagate) {
  auto exe = compile_or_die(softmax_graph());
  std::vector<HostTensor> in = {host(DType::kF32, {2, 3})};
  double vals[] = {1, std::numeric_limits<double>::quiet_NaN(), 2,
                   0, std::numeric_limits<double>::infinity(),  1};
  for (int i = 0; i < 6; ++i) in[0].set(i, vals[i]);
  auto out = run_graph(*exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan((*out)[0].at(i))) << i;
  EXPECT_TRUE(std::isnan((*out)[0].at(4)));  // inf - inf
}

TEST(Executable, OutputsThatAreInputsOrViewsAreCopied) {
  GraphBuilder gb("views");
  SymExpr s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {s, 6});
  gb.output("same", x);
  gb.output("t", gb.transpose(x, 0, 1));
  gb.output("sl", gb.slice(x, 1, 2, 5));
  Tensor e = gb.unary(UnaryOp::kExp, x);
  gb.output("e", e);
  gb.output("e2", e);
  auto exe = compile_or_die(*gb.build());
  std::mt19937 rng(9);
  std::vector<HostTensor> in = {random_host(DType::kF32, {4, 6}, rng)};
  auto out = run_graph(*exe, in);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 6; ++j) {
      double v = in[0].at(i * 6 + j);
      EXPECT_EQ((*out)[0].at(i * 6 + j), v);
      EXPECT_EQ((*out)[1].at(j * 4 + i), v);
      if (j >= 2 && j < 5) {
        EXPECT_EQ((*out)[2].at(i * 3 + j - 2), v);
      }
      EXPECT_EQ((*out)[3].at(i * 6 + j), (*out)[4].at(i * 6 + j));
    }
  }
}

// An output that reshapes a computed value (nn.Linear on a 3-D input: a 2-D matmul reshaped
// back) is written in place by the kernel that computes it: no copy kernel, no copy at the
// end. A caller's strided output still gets every value (the value then lives in the arena
// and is copied), and so does the same reshape listed twice.
TEST(Executable, OutputReshapingAComputedValueIsWrittenInPlace) {
  GraphBuilder gb("lin3d");
  SymExpr b = gb.symbol("B"), s = gb.symbol("S");
  Tensor x = gb.input("x", DType::kF32, {b, s, 8});
  Tensor w = gb.input("w", DType::kF32, {8, 5});
  Tensor y = gb.reshape(gb.binary(BinaryOp::kAdd, gb.matmul(gb.reshape(x, {b * s, 8}), w), 1.0),
                        {b, s, 5});
  gb.output("y", y);
  auto g = *gb.build();
  auto exe = compile_or_die(g);
  EXPECT_EQ(exe->num_kernels(), 1) << exe->fusion_report();
  std::mt19937 rng(10);
  std::vector<HostTensor> in = {random_host(DType::kF32, {2, 3, 8}, rng),
                                random_host(DType::kF32, {8, 5}, rng)};
  const auto want = [&](int64_t r, int64_t j) {
    double acc = 1.0;
    for (int64_t p = 0; p < 8; ++p) acc += double(in[0].at(r * 8 + p)) * in[1].at(p * 5 + j);
    return acc;
  };
  GraphRunStats st;
  auto out = run_graph(*exe, in, &st);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(st.native_launched, 0);  // no copy at the end
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t j = 0; j < 5; ++j) EXPECT_NEAR((*out)[0].at(r * 5 + j), want(r, j), 1e-5);
  // A strided output: rows of 7 floats for 5 values.
  std::vector<float> padded(2 * 3 * 7, -777.0f);
  TensorArg o;
  o.data = padded.data();
  o.shape = {2, 3, 5};
  o.strides = {21, 7, 1};
  std::vector<TensorArg> ins = {in[0].arg(), in[1].arg()};
  ASSERT_TRUE(exe->run(ins, {&o, 1}).is_ok());
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t j = 0; j < 7; ++j) {
      const float got = padded[static_cast<size_t>(r * 7 + j)];
      if (j < 5) {
        EXPECT_NEAR(got, want(r, j), 1e-5) << r << "," << j;
      } else {
        EXPECT_EQ(got, -777.0f) << r << "," << j;  // padding untouched
      }
    }
  }
  // The same output twice, and next to the value's own consumer.
  GraphBuilder gb2("twice");
  Tensor x2 = gb2.input("x", DType::kF32, {gb2.symbol("N"), 4});
  Tensor e = gb2.unary(UnaryOp::kExp, x2);
  Tensor r2 = gb2.reshape(e, {-1});
  gb2.output("a", r2);
  gb2.output("b", r2);
  gb2.output("sum", gb2.reduce(ReduceOp::kSum, e, {1}));
  auto exe2 = compile_or_die(*gb2.build());
  std::vector<HostTensor> in2 = {random_host(DType::kF32, {3, 4}, rng)};
  auto out2 = run_graph(*exe2, in2);
  ASSERT_TRUE(out2.is_ok()) << out2.status().to_string();
  for (int64_t i = 0; i < 3; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < 4; ++j) {
      const float v = std::exp(in2[0].at(i * 4 + j));
      EXPECT_NEAR((*out2)[0].at(i * 4 + j), v, 1e-6 * v);
      EXPECT_EQ((*out2)[1].at(i * 4 + j), (*out2)[0].at(i * 4 + j));
      sum += (*out2)[0].at(i * 4 + j);
    }
    EXPECT_NEAR((*out2)[2].at(i), sum, 1e-5 * sum);
  }
}

}  // namespace
}  // namespace dvm::testing

namespace dvm::testing {
namespace {

std::vector<HostTensor> transformer_inputs(const models::TransformerConfig& c, int64_t b, int64_t s,
                                           std::mt19937& rng) {
  std::vector<HostTensor> in;
  for (const auto& shape : models::transformer_layer_input_shapes(c, b, s)) {
    in.push_back(random_host(DType::kF32, shape, rng, -0.5, 0.5));
  }
  return in;
}

TEST(Models, TransformerLayersFusedMatchUnfused) {
  std::mt19937 rng(21);
  for (bool gpt : {false, true}) {
    models::TransformerConfig c;
    c.hidden = 64;
    c.heads = 4;
    c.ffn = 128;
    c.causal = gpt;
    c.pre_norm = gpt;
    auto g = models::transformer_layer(c, gpt ? "gpt_layer" : "bert_layer");
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    auto fused = compile_or_die(*g, true);
    ASSERT_TRUE(fused);
    EXPECT_LE(fused->num_kernels(), gpt ? 12 : 8) << fused->fusion_report();
    for (auto [b, s] : {std::pair<int64_t, int64_t>{1, 1}, {2, 7}, {1, 33}, {3, 16}}) {
      SCOPED_TRACE((gpt ? "gpt B=" : "bert B=") + std::to_string(b) + " S=" + std::to_string(s));
      expect_fused_matches_unfused(*g, transformer_inputs(c, b, s, rng), 1e-4);
    }
  }
}

}  // namespace
}  // namespace dvm::testing
