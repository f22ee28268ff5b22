// Runtime-compiler latency: encode time per kernel instance and cached-call overhead.
//
// encode/<kernel>: every iteration creates a fresh CompiledKernel (not timed) and calls run()
// once, so the call misses the cache and encodes + verifies a program for the bound shapes.
// The iteration time is that whole first call (encode + execute, manual timing); the counters
// are the runtime's own RunStats.encode_us (median, p90, max over all iterations) and the
// median time of a second, cache-hitting call for the same shapes (`hit_us`).
//
// call/<case>: the cached-call path (shape bind + cache hit + relocate + launch) at 1K
// elements, against the VM alone (the same encoded program launched directly through the
// internal vm::launch, no runtime around it), a hand-written fused loop for the same 1K
// elements (the compute floor the VM would ideally reach) and a 1-element call (the fixed
// overhead).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "dvm/kernel.h"
#include "dvm/runtime.h"
#include "encoder/encoder.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "vm/interpreter.h"

namespace {

using dvm::BinaryOp;
using dvm::DType;
using dvm::KernelBuilder;
using dvm::UnaryOp;
using dvm::Value;

constexpr int64_t kHidden = 768;
constexpr int64_t kSeq = 128;  // BERT-base layer shapes: [128, 768]
constexpr int64_t kRows = 256;
constexpr int64_t kCols = 768;

// ---------------------------------------------------------------------------------------------
// The kernel suite. Each case builds its kernel and states the concrete input shapes.

struct Case {
  std::string name;
  std::function<dvm::StatusOr<dvm::Kernel>()> build;
  std::vector<std::vector<int64_t>> input_shapes;
};

Value layernorm(KernelBuilder& kb, Value x, Value gamma, Value beta) {
  Value xc = kb.sub(x, kb.mean(x, {-1}, true));
  Value var = kb.mean(kb.mul(xc, xc), {-1}, true);
  Value rstd = kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, var, 1e-5));
  return kb.add(kb.mul(kb.mul(xc, rstd), gamma), beta);
}

dvm::StatusOr<dvm::Kernel> build_chain10() {
  KernelBuilder kb("chain10");
  Value x = kb.load("x", DType::kF32, {kb.symbol("S"), kHidden});
  Value t = kb.binary(BinaryOp::kMul, x, 0.5);
  t = kb.binary(BinaryOp::kAdd, t, 0.25);
  t = kb.unary(UnaryOp::kTanh, t);
  t = kb.mul(t, x);
  t = kb.binary(BinaryOp::kSub, t, 0.1);
  t = kb.unary(UnaryOp::kSigmoid, t);
  t = kb.mul(t, t);
  t = kb.add(t, x);
  t = kb.binary(BinaryOp::kMaximum, t, 0.0);
  kb.store("y", kb.binary(BinaryOp::kMul, t, 1.5));
  return kb.build();
}

dvm::StatusOr<dvm::Kernel> build_bias_gelu() {
  KernelBuilder kb("bias_gelu");
  Value x = kb.load("x", DType::kF32, {kb.symbol("S"), kHidden});
  Value b = kb.load("b", DType::kF32, {kHidden});
  kb.store("y", kb.unary(UnaryOp::kGeluErf, kb.add(x, b)));
  return kb.build();
}

dvm::StatusOr<dvm::Kernel> build_softmax() {
  KernelBuilder kb("softmax");
  Value x = kb.load("x", DType::kF32, {kb.symbol("R"), kb.symbol("L")});
  Value e = kb.unary(UnaryOp::kExp, kb.sub(x, kb.max(x, {-1}, true)));
  kb.store("y", kb.div(e, kb.sum(e, {-1}, true)));
  return kb.build();
}

dvm::StatusOr<dvm::Kernel> build_layernorm() {
  KernelBuilder kb("layernorm");
  Value x = kb.load("x", DType::kF32, {kb.symbol("S"), kHidden});
  Value g = kb.load("gamma", DType::kF32, {kHidden});
  Value b = kb.load("beta", DType::kF32, {kHidden});
  kb.store("y", layernorm(kb, x, g, b));
  return kb.build();
}

// BERT's post-attention block: layernorm(x + bias + residual).
dvm::StatusOr<dvm::Kernel> build_add_layernorm() {
  KernelBuilder kb("add_layernorm");
  dvm::Dim s = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {s, kHidden});
  Value res = kb.load("residual", DType::kF32, {s, kHidden});
  Value bias = kb.load("bias", DType::kF32, {kHidden});
  Value g = kb.load("gamma", DType::kF32, {kHidden});
  Value b = kb.load("beta", DType::kF32, {kHidden});
  kb.store("y", layernorm(kb, kb.add(kb.add(x, bias), res), g, b));
  return kb.build();
}

dvm::StatusOr<dvm::Kernel> build_rmsnorm() {
  KernelBuilder kb("rmsnorm");
  Value x = kb.load("x", DType::kF32, {kb.symbol("S"), kHidden});
  Value w = kb.load("w", DType::kF32, {kHidden});
  Value ms = kb.mean(kb.mul(x, x), {-1}, true);
  Value rstd = kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, ms, 1e-6));
  kb.store("y", kb.mul(kb.mul(x, rstd), w));
  return kb.build();
}

dvm::StatusOr<dvm::Kernel> build_reduce(dvm::ReduceOp op, int axis) {
  KernelBuilder kb(std::string(dvm::reduce_op_name(op)) + "_axis" + std::to_string(axis));
  Value x = kb.load("x", DType::kF32, {kb.symbol("M"), kb.symbol("N")});
  kb.store("y", kb.reduce(op, x, {axis}));
  return kb.build();
}

std::vector<Case> cases() {
  const std::vector<int64_t> sh = {kSeq, kHidden};
  const std::vector<int64_t> h = {kHidden};
  std::vector<Case> cs = {
      {"chain10", build_chain10, {sh}},
      {"bias_gelu", build_bias_gelu, {sh, h}},
      {"softmax", build_softmax, {{12 * kSeq, kSeq}}},  // attention probs [heads*S, S]
      {"layernorm", build_layernorm, {sh, h, h}},
      {"add_layernorm", build_add_layernorm, {sh, sh, h, h, h}},
      {"rmsnorm", build_rmsnorm, {sh, h}},
  };
  for (dvm::ReduceOp op : {dvm::ReduceOp::kSum, dvm::ReduceOp::kMax, dvm::ReduceOp::kMean}) {
    for (int axis : {0, 1}) {
      cs.push_back({std::string(dvm::reduce_op_name(op)) + "_axis" + std::to_string(axis),
                    [op, axis] { return build_reduce(op, axis); },
                    {{kRows, kCols}}});
    }
  }
  return cs;
}

// ---------------------------------------------------------------------------------------------
// Argument storage for one kernel instance.

struct Args {
  std::vector<std::vector<float>> in_data, out_data;
  std::vector<dvm::TensorArg> in, out;

  // Builds inputs for `shapes`, and outputs from the kernel's inferred shapes.
  dvm::Status init(const dvm::CompiledKernel& ck, const std::vector<std::vector<int64_t>>& shapes) {
    for (const auto& s : shapes) {
      int64_t n = 1;
      for (int64_t d : s) n *= d;
      in_data.emplace_back(static_cast<size_t>(n));
      auto& v = in_data.back();
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f;
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      in.push_back(dvm::TensorArg::contiguous(in_data[i].data(), DType::kF32, shapes[i]));
    }
    DVM_ASSIGN_OR_RETURN(auto out_shapes, ck.infer_output_shapes(in));
    for (const auto& s : out_shapes) {
      int64_t n = 1;
      for (int64_t d : s) n *= d;
      out_data.emplace_back(static_cast<size_t>(std::max<int64_t>(n, 1)));
    }
    for (size_t i = 0; i < out_shapes.size(); ++i) {
      out.push_back(dvm::TensorArg::contiguous(out_data[i].data(), DType::kF32, out_shapes[i]));
    }
    return dvm::Status::ok();
  }
};

double now_us() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// ---------------------------------------------------------------------------------------------
// encode/<kernel>

void bm_encode(benchmark::State& st, const Case& c) {
  auto kernel = c.build();
  if (!kernel.is_ok()) return st.SkipWithError(kernel.status().to_string().c_str());
  auto probe = dvm::CompiledKernel::create(*kernel);
  if (!probe.is_ok()) return st.SkipWithError(probe.status().to_string().c_str());
  Args args;
  if (dvm::Status s = args.init(**probe, c.input_shapes); !s.is_ok()) {
    return st.SkipWithError(s.to_string().c_str());
  }
  std::vector<double> encode_us, hit_us;
  for (auto _ : st) {
    auto ck = dvm::CompiledKernel::create(*kernel);
    if (!ck.is_ok()) {
      st.SkipWithError(ck.status().to_string().c_str());
      break;
    }
    dvm::RunStats stats;
    double t0 = now_us();
    dvm::Status s = (*ck)->run(args.in, args.out, {}, &stats);
    double t1 = now_us();
    dvm::Status s2 = (*ck)->run(args.in, args.out);
    double t2 = now_us();
    if (!s.is_ok() || !s2.is_ok()) {
      st.SkipWithError((s.is_ok() ? s2 : s).to_string().c_str());
      break;
    }
    if (stats.cache_hit) {
      st.SkipWithError("first call on a fresh CompiledKernel hit the cache");
      break;
    }
    st.SetIterationTime((t1 - t0) * 1e-6);
    encode_us.push_back(stats.encode_us);
    hit_us.push_back(t2 - t1);
  }
  st.counters["encode_us"] = quantile(encode_us, 0.5);
  st.counters["encode_us_p90"] = quantile(encode_us, 0.9);
  st.counters["encode_us_max"] = quantile(encode_us, 1.0);
  st.counters["hit_us"] = quantile(hit_us, 0.5);
}

// ---------------------------------------------------------------------------------------------
// call/<case>: cached calls of y = tanh(x * 0.5 + 0.25) over n elements.

dvm::StatusOr<dvm::Kernel> build_tanh_affine() {
  KernelBuilder kb("tanh_affine");
  Value x = kb.load("x", DType::kF32, {kb.symbol("N")});
  Value t = kb.binary(BinaryOp::kAdd, kb.binary(BinaryOp::kMul, x, 0.5), 0.25);
  kb.store("y", kb.unary(UnaryOp::kTanh, t));
  return kb.build();
}

// threads: CompileOptions::num_threads (0 = default). relocate: alternate between two buffer
// pairs so every call binds new addresses.
void bm_cached_call(benchmark::State& st, int threads, bool relocate) {
  const int64_t n = st.range(0);
  auto kernel = build_tanh_affine();
  if (!kernel.is_ok()) return st.SkipWithError(kernel.status().to_string().c_str());
  dvm::CompileOptions opts;
  opts.num_threads = threads;
  auto ck = dvm::CompiledKernel::create(*kernel, opts);
  if (!ck.is_ok()) return st.SkipWithError(ck.status().to_string().c_str());
  std::vector<float> x0(n, 0.5f), y0(n), x1(n, 0.25f), y1(n);
  const dvm::TensorArg in[2][1] = {{dvm::TensorArg::contiguous(x0.data(), DType::kF32, {n})},
                                   {dvm::TensorArg::contiguous(x1.data(), DType::kF32, {n})}};
  const dvm::TensorArg out[2][1] = {{dvm::TensorArg::contiguous(y0.data(), DType::kF32, {n})},
                                    {dvm::TensorArg::contiguous(y1.data(), DType::kF32, {n})}};
  if (dvm::Status s = (*ck)->run(in[0], out[0]); !s.is_ok()) {
    return st.SkipWithError(s.to_string().c_str());
  }
  int64_t hits = 0, calls = 0;
  int which = 0;
  for (auto _ : st) {
    dvm::RunStats stats;
    dvm::Status s = (*ck)->run(in[which], out[which], {}, &stats);
    if (!s.is_ok()) {
      st.SkipWithError(s.to_string().c_str());
      break;
    }
    hits += stats.cache_hit;
    ++calls;
    if (relocate) which ^= 1;
  }
  st.counters["hit_rate"] = calls ? static_cast<double>(hits) / static_cast<double>(calls) : 0;
  st.SetItemsProcessed(st.iterations() * n);
}

// The VM alone: encode once through the internal encoder, then launch the program directly
// (no shape bind, cache lookup or relocation checks). Uses internal headers (src/).
void bm_vm_only(benchmark::State& st, int threads) {
  const int64_t n = st.range(0);
  auto kernel = build_tanh_affine();
  if (!kernel.is_ok()) return st.SkipWithError(kernel.status().to_string().c_str());
  if (threads == 0) threads = dvm::base::hardware_threads();
  std::vector<float> x(n, 0.5f), y(n);
  const dvm::TensorArg in[] = {dvm::TensorArg::contiguous(x.data(), DType::kF32, {n})};
  const dvm::TensorArg out[] = {dvm::TensorArg::contiguous(y.data(), DType::kF32, {n})};
  dvm::ir::Binding binding;
  dvm::enc::EncodedKernel ek;
  dvm::enc::EncodeOptions eo;
  eo.num_threads = threads;
  eo.target = &dvm::vm::cpu_target();
  dvm::Status s = dvm::ir::bind_shapes(kernel->def(), in, &binding);
  if (s.is_ok()) s = dvm::enc::encode(kernel->def(), binding, in, out, eo, &ek);
  if (!s.is_ok()) return st.SkipWithError(s.to_string().c_str());
  if (!ek.workspace_bytes.empty()) return st.SkipWithError("program needs workspaces");
  std::vector<std::shared_ptr<const dvm::vm::LoadedProgram>> loaded;
  for (const dvm::bc::Program& p : ek.programs) loaded.push_back(dvm::vm::load(p));
  void* slots[] = {x.data(), y.data()};
  const dvm::vm::LaunchArgs args{slots, nullptr};
  for (auto _ : st) {
    for (const auto& p : loaded) dvm::vm::launch(*p, args, threads);
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations() * n);
}

// The same computation as a hand-written loop: what the call costs without any runtime.
void bm_fused_loop(benchmark::State& st) {
  namespace hn = hwy::HWY_NAMESPACE;
  const int64_t n = st.range(0);
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  std::vector<float> x((n + lanes - 1) / lanes * lanes, 0.5f), y(x.size());
  for (auto _ : st) {
    for (int64_t i = 0; i < n; i += lanes) {
      auto v = hn::MulAdd(hn::LoadU(d, x.data() + i), hn::Set(d, 0.5f), hn::Set(d, 0.25f));
      hn::StoreU(hn::Tanh(d, v), d, y.data() + i);
    }
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(y.data());
  st.SetItemsProcessed(st.iterations() * n);
}

void register_all() {
  for (const Case& c : cases()) {
    benchmark::RegisterBenchmark(("encode/" + c.name).c_str(),
                                 [c](benchmark::State& st) { bm_encode(st, c); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  struct Call {
    const char* name;
    int threads;
    bool relocate;
  };
  for (const Call& c :
       {Call{"call/tanh_affine/dvm", 0, false}, Call{"call/tanh_affine/dvm_st", 1, false},
        Call{"call/tanh_affine/dvm_relocate", 0, true}}) {
    benchmark::RegisterBenchmark(
        c.name, [c](benchmark::State& st) { bm_cached_call(st, c.threads, c.relocate); })
        ->Arg(1)
        ->Arg(1024)
        ->Unit(benchmark::kNanosecond);
  }
  for (const Call& c : {Call{"call/tanh_affine/vm_only", 0, false},
                        Call{"call/tanh_affine/vm_only_st", 1, false}}) {
    benchmark::RegisterBenchmark(c.name, [c](benchmark::State& st) { bm_vm_only(st, c.threads); })
        ->Arg(1)
        ->Arg(1024)
        ->Unit(benchmark::kNanosecond);
  }
  benchmark::RegisterBenchmark("call/tanh_affine/fused_loop", bm_fused_loop)
      ->Arg(1)
      ->Arg(1024)
      ->Unit(benchmark::kNanosecond);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
