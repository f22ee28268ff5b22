// Matmul through the whole DVM stack (encode once, cached calls, all threads) against
// OpenBLAS sgemm with the same thread count, and the fused mix kernel gelu(x @ W + b) against
// the same three ops run as three separate DVM kernels (matmul, bias add, gelu).
//
// Counters: GFLOP/s (2*M*N*K per call). Run: build/bench/matmul_bench [--benchmark_filter=..]
#include <benchmark/benchmark.h>

#include <random>
#include <thread>
#include <vector>

#include "dvm/kernel.h"
#include "dvm/runtime.h"

#ifdef DVM_HAVE_OPENBLAS
#include <cblas.h>
// OpenBLAS's own thread control; declared here because not every cblas.h declares it.
extern "C" void openblas_set_num_threads(int num_threads);
#endif

namespace {

using dvm::DType;
using dvm::TensorArg;

std::vector<float> random_vec(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

std::shared_ptr<dvm::CompiledKernel> compile(dvm::KernelBuilder& kb) {
  auto k = kb.build();
  if (!k.is_ok()) return nullptr;
  auto ck = dvm::CompiledKernel::create(*k);
  return ck.is_ok() ? *ck : nullptr;
}

std::shared_ptr<dvm::CompiledKernel> matmul_kernel() {
  dvm::KernelBuilder kb("mm");
  dvm::Dim M = kb.symbol("M"), K = kb.symbol("K"), N = kb.symbol("N");
  // Separate statements: argument evaluation order would decide the input slots otherwise.
  dvm::Value x = kb.load("x", DType::kF32, {M, K});
  dvm::Value w = kb.load("w", DType::kF32, {K, N});
  kb.store("y", kb.matmul(x, w));
  return compile(kb);
}

void set_gflops(benchmark::State& state, int64_t m, int64_t n, int64_t k) {
  state.counters["GFLOPs"] = benchmark::Counter(static_cast<double>(2 * m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
}

// const_w: W passed as a constant (TensorArg::version), packed once and cached, as a model's
// weights are; otherwise packed on every call. Version 1 everywhere is sound here: a W of a
// given size always holds the same values (fixed seed), whatever address it gets.
void BM_dvm_matmul(benchmark::State& state, bool const_w) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  auto ck = matmul_kernel();
  auto x = random_vec(m * k, 1), w = random_vec(k * n, 2);
  std::vector<float> y(static_cast<size_t>(m * n));
  TensorArg in[] = {TensorArg::contiguous(x.data(), DType::kF32, {m, k}),
                    TensorArg::contiguous(w.data(), DType::kF32, {k, n})};
  in[1].version = const_w ? 1 : 0;
  const TensorArg out[] = {TensorArg::contiguous(y.data(), DType::kF32, {m, n})};
  if (!ck || !ck->run(in, out).is_ok()) {
    state.SkipWithError("dvm run failed");
    return;
  }
  for (auto _ : state) {
    (void)ck->run(in, out);
    benchmark::DoNotOptimize(y.data());
  }
  set_gflops(state, m, n, k);
}

#ifdef DVM_HAVE_OPENBLAS
void BM_openblas_sgemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  auto x = random_vec(m * k, 1), w = random_vec(k * n, 2);
  std::vector<float> y(static_cast<size_t>(m * n));
  openblas_set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.f, x.data(), static_cast<int>(k), w.data(),
                static_cast<int>(n), 0.f, y.data(), static_cast<int>(n));
    benchmark::DoNotOptimize(y.data());
  }
  set_gflops(state, m, n, k);
}
#endif

// gelu(x @ W + b): one fused DVM kernel vs three DVM kernels with intermediates in memory
// (W constant in both: packed once).
void BM_mlp(benchmark::State& state, bool fused) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  auto x = random_vec(m * k, 1), w = random_vec(k * n, 2), b = random_vec(n, 3);
  std::vector<float> y(static_cast<size_t>(m * n)), t1(y.size()), t2(y.size());
  const TensorArg xa = TensorArg::contiguous(x.data(), DType::kF32, {m, k});
  TensorArg wa = TensorArg::contiguous(w.data(), DType::kF32, {k, n});
  wa.version = 1;
  const TensorArg ba = TensorArg::contiguous(b.data(), DType::kF32, {n});
  const TensorArg ya = TensorArg::contiguous(y.data(), DType::kF32, {m, n});
  const TensorArg t1a = TensorArg::contiguous(t1.data(), DType::kF32, {m, n});
  const TensorArg t2a = TensorArg::contiguous(t2.data(), DType::kF32, {m, n});
  dvm::KernelBuilder fk("mlp");
  dvm::Dim M = fk.symbol("M");
  // Separate statements: argument evaluation order would decide the input slots otherwise.
  dvm::Value fx = fk.load("x", DType::kF32, {M, k});
  dvm::Value fw = fk.load("w", DType::kF32, {k, n});
  dvm::Value fb = fk.load("b", DType::kF32, {n});
  fk.store("y", fk.unary(dvm::UnaryOp::kGeluErf, fk.add(fk.matmul(fx, fw), fb)));
  auto fused_k = compile(fk);
  auto mm = matmul_kernel();
  dvm::KernelBuilder ak("bias");
  dvm::Dim R = ak.symbol("R");
  dvm::Value at = ak.load("t", DType::kF32, {R, n});
  dvm::Value ab = ak.load("b", DType::kF32, {n});
  ak.store("y", ak.add(at, ab));
  auto add_k = compile(ak);
  dvm::KernelBuilder gk("gelu");
  gk.store("y", gk.unary(dvm::UnaryOp::kGeluErf, gk.load("t", DType::kF32, {gk.symbol("R"), n})));
  auto gelu_k = compile(gk);
  if (!fused_k || !mm || !add_k || !gelu_k) {
    state.SkipWithError("build failed");
    return;
  }
  const TensorArg fin[] = {xa, wa, ba};
  const TensorArg min[] = {xa, wa};
  const TensorArg ain[] = {t1a, ba};
  auto step = [&] {
    if (fused) return fused_k->run(fin, {&ya, 1});
    dvm::Status s = mm->run(min, {&t1a, 1});
    if (s.is_ok()) s = add_k->run(ain, {&t2a, 1});
    if (s.is_ok()) s = gelu_k->run({&t2a, 1}, {&ya, 1});
    return s;
  };
  if (dvm::Status s = step(); !s.is_ok()) {
    state.SkipWithError(s.to_string().c_str());
    return;
  }
  for (auto _ : state) {
    (void)step();
    benchmark::DoNotOptimize(y.data());
  }
  set_gflops(state, m, n, k);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t s : {64, 128, 256, 512, 1024, 2048}) b->Args({s, s, s});
  for (int64_t seq : {1, 32, 128, 512})  // BERT-base: M = batch*seq, K,N in {768, 3072}
    for (auto [k, n] : {std::pair<int64_t, int64_t>{768, 768}, {768, 3072}, {3072, 768}})
      b->Args({seq, n, k});
  for (int64_t m : {1, 4, 16}) b->Args({m, 3072, 768});  // decode-phase skinny products
  b->UseRealTime();
}

void mlp_shapes(benchmark::internal::Benchmark* b) {
  for (int64_t seq : {32, 128, 512}) b->Args({seq, 3072, 768});
  b->UseRealTime();
}

BENCHMARK_CAPTURE(BM_dvm_matmul, packed_per_call, false)->Apply(shapes);
BENCHMARK_CAPTURE(BM_dvm_matmul, const_w, true)->Apply(shapes);
#ifdef DVM_HAVE_OPENBLAS
BENCHMARK(BM_openblas_sgemm)->Apply(shapes);
#endif
BENCHMARK_CAPTURE(BM_mlp, fused, true)->Apply(mlp_shapes);
BENCHMARK_CAPTURE(BM_mlp, unfused, false)->Apply(mlp_shapes);

}  // namespace

BENCHMARK_MAIN();
