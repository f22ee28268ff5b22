// dvm_bert_demo: a BERT-base encoder layer compiled once, run over a stream of sequence lengths.
//
// The graph (dvm/models.h) is built with symbolic batch and sequence dims, compiled once
// (decompose, simplify, fuse, plan memory), then run for 32 different sequence lengths. Each
// new length encodes bytecode for its exact shapes (microseconds per kernel); a repeated length
// only relocates. Every result is checked against the same graph compiled unfused (one kernel
// per meta-op). Exits non-zero on any failure or mismatch.
//
//   dvm_bert_demo [num_lengths] [max_seq]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "dvm/models.h"

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct Buffers {
  std::vector<std::vector<float>> data;
  std::vector<dvm::TensorArg> args;
};

Buffers make_inputs(const dvm::models::TransformerConfig& c, int64_t max_seq) {
  Buffers b;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 0.05f);
  for (const auto& shape : dvm::models::transformer_layer_input_shapes(c, 1, max_seq)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    b.data.emplace_back(n);
    for (float& v : b.data.back()) v = normal(rng);
    b.args.push_back(dvm::TensorArg::contiguous(b.data.back().data(), dvm::DType::kF32, shape));
  }
  for (float& v : b.data[1]) v = 0.f;  // additive mask: attend everywhere
  return b;
}

int fail(const char* what, const dvm::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int lengths = argc > 1 ? std::atoi(argv[1]) : 32;
  int64_t max_seq = argc > 2 ? std::atoll(argv[2]) : 256;
  dvm::models::TransformerConfig cfg;  // BERT-base: hidden 768, 12 heads, ffn 3072
  auto graph = dvm::models::transformer_layer(cfg, "bert_layer");
  if (!graph.is_ok()) return fail("build", graph.status());
  auto t0 = Clock::now();
  auto fused = dvm::Executable::compile(*graph);
  double compile_us = us_since(t0);
  if (!fused.is_ok()) return fail("compile", fused.status());
  dvm::GraphCompileOptions unfused_opts;
  unfused_opts.fuse = false;
  auto unfused = dvm::Executable::compile(*graph, unfused_opts);
  if (!unfused.is_ok()) return fail("compile unfused", unfused.status());
  std::printf(
      "BERT-base encoder layer: %d graph nodes, compiled once in %.0f us into %d kernels "
      "(unfused: %d)\n",
      graph->num_nodes(), compile_us, (*fused)->num_kernels(), (*unfused)->num_kernels());
  std::printf("%s\n", (*fused)->fusion_report().c_str());

  Buffers in = make_inputs(cfg, max_seq);
  std::vector<float> out(max_seq * cfg.hidden), ref(max_seq * cfg.hidden);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> seq_dist(1, max_seq);
  std::printf("%6s %12s %12s %11s %9s %12s %8s %10s\n", "seq", "first_us", "cached_us", "encode_us",
              "kernels", "unfused_us", "speedup", "max_err");
  double worst = 0, total_first = 0, total_cached = 0, total_unfused = 0;
  for (int i = 0; i < lengths; ++i) {
    int64_t seq = i == 0 ? 1 : seq_dist(rng);
    std::vector<dvm::TensorArg> args = in.args;
    args[0].shape = {1, seq, cfg.hidden};
    args[1].shape = {1, 1, 1, seq};
    auto o = dvm::TensorArg::contiguous(out.data(), dvm::DType::kF32, {1, seq, cfg.hidden});
    auto r = dvm::TensorArg::contiguous(ref.data(), dvm::DType::kF32, {1, seq, cfg.hidden});
    dvm::GraphRunStats first, cached;
    auto t1 = Clock::now();
    dvm::Status s = (*fused)->run(args, {&o, 1}, &first);
    double first_us = us_since(t1);
    if (!s.is_ok()) return fail("run", s);
    auto t2 = Clock::now();
    s = (*fused)->run(args, {&o, 1}, &cached);
    double cached_us = us_since(t2);
    if (!s.is_ok()) return fail("run (cached)", s);
    (void)(*unfused)->run(args, {&r, 1});  // warm its caches for this shape
    auto t3 = Clock::now();
    s = (*unfused)->run(args, {&r, 1});
    double unfused_us = us_since(t3);
    if (!s.is_ok()) return fail("run unfused", s);
    double err = 0;
    for (int64_t k = 0; k < seq * cfg.hidden; ++k) {
      err = std::max(err, static_cast<double>(std::abs(out[k] - ref[k])));
    }
    worst = std::max(worst, err);
    total_first += first_us;
    total_cached += cached_us;
    total_unfused += unfused_us;
    std::printf("%6lld %12.0f %12.0f %11.1f %9d %12.0f %7.2fx %10.2e\n",
                static_cast<long long>(seq), first_us, cached_us, first.encode_us,
                first.kernels_launched, unfused_us, unfused_us / cached_us, err);
  }
  std::printf("total: first calls %.1f ms, cached %.1f ms, unfused %.1f ms; max error %.2e\n",
              total_first / 1e3, total_cached / 1e3, total_unfused / 1e3, worst);
  if (worst > 1e-3) {
    std::fprintf(stderr, "FAILED: fused and unfused results differ by %.2e\n", worst);
    return 1;
  }
  std::printf("OK: one compile, %d sequence lengths, no recompilation\n", lengths);
  return 0;
}
