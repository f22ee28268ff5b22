// Graph compiler benchmarks (issue 4):
//  - the subgraph suite, fused vs the same graph compiled unfused (one kernel per meta-op), in
//    the same process: BM_Subgraph/<pattern>/<fused 0|1>/<rows>;
//  - whole-graph compile time of a BERT-base encoder layer: BM_CompileBertLayer;
//  - first call at a new shape minus a cached call (encode cost per new shape), BERT-base layer:
//    BM_BertNewShape (every iteration a new sequence length) and BM_BertCachedShape.
// bench/run_benchmarks.sh prints the fused/unfused ratios and their geomean.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "dvm/graph.h"
#include "dvm/models.h"

namespace {

using namespace dvm;

struct HostBuf {
  std::vector<float> data;
  TensorArg arg;
};

HostBuf make(DType t, std::vector<int64_t> shape, std::mt19937& rng) {
  HostBuf b;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  int64_t words = (n * dtype_size(t) + 3) / 4;
  b.data.resize(std::max<int64_t>(words, 1));
  std::uniform_real_distribution<float> u(-1, 1);
  if (t == DType::kF32) {
    for (auto& v : b.data) v = u(rng);
  } else {
    std::memset(b.data.data(), 0, b.data.size() * 4);  // integer inputs: index 0
  }
  b.arg = TensorArg::contiguous(b.data.data(), t, std::move(shape));
  return b;
}

enum Pattern {
  kLayerNorm,
  kRmsNorm,
  kSoftmax,
  kGeluMlp,
  kSwigluMlp,
  kAttention,
  kResidualLn,
  kCrossEntropy,
  kNumPatterns
};
const char* kNames[] = {"layernorm",          "rmsnorm",      "softmax",
                        "gelu_mlp",           "swiglu_mlp",   "attention",
                        "residual_layernorm", "cross_entropy"};

// Builds pattern p over `rows` rows (hidden 768; attention: 12 heads x 64, seq = rows).
Graph build(Pattern p, std::vector<std::vector<int64_t>>* shapes, int64_t rows) {
  GraphBuilder gb(kNames[p]);
  SymExpr S = gb.symbol("S");
  const int64_t h = 768;
  auto in = [&](const char* name, std::vector<SymExpr> s, std::vector<int64_t> c,
                DType t = DType::kF32) {
    shapes->push_back(c);
    return gb.input(name, t, std::move(s));
  };
  switch (p) {
    case kLayerNorm: {
      Tensor x = in("x", {S, h}, {rows, h});
      gb.output("y", gb.layer_norm(x, in("w", {h}, {h}), in("b", {h}, {h})));
      break;
    }
    case kRmsNorm: {
      Tensor x = in("x", {S, h}, {rows, h});
      gb.output("y", gb.rms_norm(x, in("w", {h}, {h})));
      break;
    }
    case kSoftmax:
      gb.output("y", gb.softmax(in("x", {S, 1024}, {rows, 1024}), -1));
      break;
    case kGeluMlp: {
      Tensor x = in("x", {S, h}, {rows, h});
      Tensor w1 = in("w1", {3072, h}, {3072, h});
      Tensor b1 = in("b1", {3072}, {3072});
      Tensor w2 = in("w2", {h, 3072}, {h, 3072});
      Tensor b2 = in("b2", {h}, {h});
      gb.output("y", gb.linear(gb.gelu(gb.linear(x, w1, b1)), w2, b2));
      break;
    }
    case kSwigluMlp: {
      Tensor x = in("x", {S, h}, {rows, h});
      Tensor wg = in("wg", {2048, h}, {2048, h});
      Tensor wu = in("wu", {2048, h}, {2048, h});
      Tensor wd = in("wd", {h, 2048}, {h, 2048});
      gb.output("y", gb.linear(gb.swiglu(gb.linear(x, wg), gb.linear(x, wu)), wd));
      break;
    }
    case kAttention: {
      Tensor q = in("q", {12, S, 64}, {12, rows, 64});
      Tensor k = in("k", {12, S, 64}, {12, rows, 64});
      Tensor v = in("v", {12, S, 64}, {12, rows, 64});
      Tensor m = in("mask", {S, S}, {rows, rows});
      gb.output("o", gb.attention(q, k, v, m));
      break;
    }
    case kResidualLn: {
      Tensor x = in("x", {S, h}, {rows, h});
      Tensor r = in("r", {S, h}, {rows, h});
      gb.output("y", gb.layer_norm(gb.add(x, r), in("w", {h}, {h}), in("b", {h}, {h})));
      break;
    }
    case kCrossEntropy: {
      Tensor x = in("logits", {S, 32000}, {rows, 32000});
      gb.output("loss", gb.cross_entropy(x, in("t", {S}, {rows}, DType::kI64)));
      break;
    }
    default:
      break;
  }
  return gb.build().value();
}

void BM_Subgraph(benchmark::State& state) {
  auto p = static_cast<Pattern>(state.range(0));
  bool fused = state.range(1) != 0;
  int64_t rows = state.range(2);
  std::vector<std::vector<int64_t>> shapes;
  Graph g = build(p, &shapes, rows);
  GraphCompileOptions o;
  o.fuse = fused;
  auto exe = Executable::compile(g, o).value();
  std::mt19937 rng(1);
  std::vector<HostBuf> ins;
  for (auto& s : shapes) {
    DType t = (p == kCrossEntropy && ins.size() == 1) ? DType::kI64 : DType::kF32;
    ins.push_back(make(t, s, rng));
  }
  std::vector<TensorArg> in_args;
  for (auto& b : ins) in_args.push_back(b.arg);
  auto out_shapes = exe->output_shapes(in_args).value();
  std::vector<HostBuf> outs;
  std::vector<TensorArg> out_args;
  for (auto& s : out_shapes) outs.push_back(make(DType::kF32, s, rng));
  for (auto& b : outs) out_args.push_back(b.arg);
  GraphRunStats st;
  for (auto _ : state) {
    Status s = exe->run(in_args, out_args, &st);
    if (!s.is_ok()) {
      state.SkipWithError(s.to_string().c_str());
      break;
    }
  }
  state.counters["kernels"] = st.kernels_launched + st.native_launched;
  state.SetLabel(kNames[p]);
}

void subgraph_args(benchmark::internal::Benchmark* b) {
  for (int p = 0; p < kNumPatterns; ++p) {
    for (int64_t rows : {32, 512}) {
      for (int fused : {0, 1}) b->Args({p, fused, rows});
    }
  }
}
BENCHMARK(BM_Subgraph)->Apply(subgraph_args)->UseRealTime()->Unit(benchmark::kMicrosecond);

models::TransformerConfig bert() {
  return models::TransformerConfig{};
}

void BM_CompileBertLayer(benchmark::State& state) {
  Graph g = models::transformer_layer(bert(), "bert_layer").value();
  int kernels = 0;
  for (auto _ : state) {
    auto exe = Executable::compile(g).value();
    kernels = exe->num_kernels();
    benchmark::DoNotOptimize(exe);
  }
  state.counters["kernels"] = kernels;
}
BENCHMARK(BM_CompileBertLayer)->Unit(benchmark::kMicrosecond);

struct BertRig {
  std::shared_ptr<Executable> exe;
  std::vector<HostBuf> ins, outs;
  std::mt19937 rng{3};
  explicit BertRig(int64_t max_seq) {
    exe = Executable::compile(models::transformer_layer(bert(), "bert_layer").value()).value();
    for (auto& s : models::transformer_layer_input_shapes(bert(), 1, max_seq)) {
      ins.push_back(make(DType::kF32, s, rng));
    }
    outs.push_back(make(DType::kF32, {1, max_seq, 768}, rng));
  }
  // Runs at sequence length `seq` (views of the max-size buffers).
  Status run(int64_t seq, GraphRunStats* st) {
    std::vector<TensorArg> in;
    for (auto& b : ins) in.push_back(b.arg);
    in[0].shape = {1, seq, 768};
    in[1].shape = {1, 1, 1, seq};
    TensorArg out = outs[0].arg;
    out.shape = {1, seq, 768};
    return exe->run(in, {&out, 1}, st);
  }
};

// Each iteration a sequence length never seen before: bind + encode every kernel + run. The
// counter encode_us is the encoding alone (the "first call at a new shape" overhead).
void BM_BertNewShape(benchmark::State& state) {
  BertRig rig(4096);
  int64_t seq = 1;
  double encode = 0;
  int64_t n = 0;
  for (auto _ : state) {
    GraphRunStats st;
    Status s = rig.run(seq++, &st);
    if (!s.is_ok() || seq > 4000) {
      state.SkipWithError(s.is_ok() ? "out of shapes" : s.to_string().c_str());
      break;
    }
    encode += st.encode_us;
    ++n;
  }
  state.counters["encode_us"] = n ? encode / n : 0;
}
BENCHMARK(BM_BertNewShape)->Iterations(64)->Unit(benchmark::kMicrosecond);

// The same lengths, all cached: the difference to BM_BertNewShape is the new-shape cost.
void BM_BertCachedShape(benchmark::State& state) {
  BertRig rig(4096);
  for (int64_t seq = 1; seq <= 64; ++seq) (void)rig.run(seq, nullptr);
  int64_t seq = 1;
  for (auto _ : state) {
    Status s = rig.run(seq, nullptr);
    seq = seq % 64 + 1;
    if (!s.is_ok()) {
      state.SkipWithError(s.to_string().c_str());
      break;
    }
  }
}
BENCHMARK(BM_BertCachedShape)->Iterations(64)->Unit(benchmark::kMicrosecond);

// The host cost of a call at a cached binding: a transformer layer so narrow (hidden 16, two
// heads, batch 1, 2 tokens) that its kernels do next to nothing, so the time is binding,
// plan lookup, argument resolution and launches. Counter us_per_kernel divides by the kernels
// launched. Arg: 0 = one thread, 1 = the default pool.
void BM_CallOverhead(benchmark::State& state) {
  models::TransformerConfig c;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 32;
  GraphCompileOptions o;
  if (state.range(0) == 0) o.num_threads = 1;
  auto exe = Executable::compile(models::transformer_layer(c, "tiny_layer").value(), o).value();
  std::mt19937 rng(5);
  std::vector<HostBuf> ins;
  for (auto& s : models::transformer_layer_input_shapes(c, 1, 2)) {
    ins.push_back(make(DType::kF32, s, rng));
  }
  HostBuf out = make(DType::kF32, {1, 2, 16}, rng);
  std::vector<TensorArg> in;
  for (auto& b : ins) in.push_back(b.arg);
  GraphRunStats st;
  for (auto _ : state) {
    Status s = exe->run(in, {&out.arg, 1}, &st);
    if (!s.is_ok()) {
      state.SkipWithError(s.to_string().c_str());
      break;
    }
  }
  int kernels = st.kernels_launched + st.native_launched;
  state.counters["kernels"] = kernels;
  state.counters["us_per_kernel"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kernels,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_CallOverhead)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
