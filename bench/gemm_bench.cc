// Single-threaded GEMM core (src/vm/cpu/gemm.h) vs OpenBLAS cblas_sgemm (one thread), GFLOP/s:
// square 64..1024, BERT-like tiles (m = 64/128/256, n = 256, k = 768/3072), skinny decode
// shapes (m = 1/4/16, n = 768/3072, k = 768). Row-major A (m x k), B (k x n), C (m x n).
#include <benchmark/benchmark.h>
#include <hwy/targets.h>

#include <bit>
#include <cstdint>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "vm/cpu/gemm.h"

#ifdef DVM_HAVE_OPENBLAS
#include <cblas.h>
// OpenBLAS's own thread control; declared here because not every cblas.h declares it.
extern "C" void openblas_set_num_threads(int num_threads);
#endif

namespace {

struct Operands {
  std::vector<float> a, b, c;
  Operands(int64_t m, int64_t n, int64_t k)
      : a(static_cast<size_t>(m * k)),
        b(static_cast<size_t>(k * n)),
        c(static_cast<size_t>(m * n)) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (float& x : a) x = dist(rng);
    for (float& x : b) x = dist(rng);
  }
};

void set_flops(benchmark::State& state, int64_t m, int64_t n, int64_t k) {
  state.counters["GFLOP/s"] = benchmark::Counter(
      2e-9 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k),
      benchmark::Counter::kIsIterationInvariantRate);
}

// Times run() (one GEMM into o.c) after a warm-up call.
template <class Run>
void time_gemm(benchmark::State& state, Operands& o, Run run) {
  run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(o.c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, state.range(0), state.range(1), state.range(2));
}

// B packed per call from b_rs, b_cs strides (the VM's path for weights not marked constant).
void run_gemm(benchmark::State& state, bool transposed_b) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Operands o(m, n, k);
  const int64_t b_rs = transposed_b ? 1 : n, b_cs = transposed_b ? k : 1;
  time_gemm(state, o, [&] {
    dvm::vm::cpu::gemm_f32(m, n, k, o.a.data(), k, 1, o.b.data(), b_rs, b_cs, o.c.data(), n, false);
  });
}

void BM_dvm(benchmark::State& state) {
  run_gemm(state, false);
}

// B transposed (torch's nn.Linear weight [N, K]: x @ W^T).
void BM_dvm_bt(benchmark::State& state) {
  run_gemm(state, true);
}

// B transposed, read in place by the role-swapped kernel (AVX-512; the VM's path for x @ W^T
// up to 288 rows of x and K >= 256; elsewhere gemm_f32_bt_in_place is the packing GEMM).
void BM_dvm_bt_in_place(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Operands o(m, n, k);
  time_gemm(state, o, [&] {
    dvm::vm::cpu::gemm_f32_bt_in_place(m, n, k, o.a.data(), k, 1, o.b.data(), k, o.c.data(), n,
                                       false);
  });
}

// B packed ahead of time (constant weights: the VM packs them once and caches the panels), so
// this is the micro-kernel and A packing alone.
void BM_dvm_packed(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Operands o(m, n, k);
  const size_t floats = dvm::vm::cpu::packed_b_floats(k, n);
  std::unique_ptr<float, void (*)(float*)> packed(
      static_cast<float*>(::operator new (floats * sizeof(float), std::align_val_t{64})),
      [](float* p) { ::operator delete (p, std::align_val_t{64}); });
  dvm::vm::cpu::pack_b(dvm::DType::kF32, k, n, o.b.data(), n, 1, packed.get());
  const dvm::vm::cpu::PackedB pb{packed.get(), k};
  time_gemm(state, o, [&] {
    dvm::vm::cpu::gemm_f32_packed(m, n, k, o.a.data(), k, 1, o.b.data(), n, 1, pb, o.c.data(), n,
                                  false);
  });
}

// The AVX2 code path (what an AVX2-only machine runs), where this machine supports AVX2.
void BM_dvm_avx2(benchmark::State& state) {
  if (!(hwy::SupportedTargets() & HWY_AVX2)) {
    state.SkipWithError("AVX2 not supported");
    return;
  }
  hwy::SetSupportedTargetsForTest(HWY_AVX2);
  BM_dvm(state);
  hwy::SetSupportedTargetsForTest(0);
}

// bf16 A and B (bits truncated from the f32 operands), f32 C: gemm_half, on AMX tiles where
// the CPU has them (gemm_half_on_amx), else converted to f32 panels. B row-major or, with
// transposed_b, nn.Linear's W [N, K].
void run_gemm_bf16(benchmark::State& state, bool transposed_b) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Operands o(m, n, k);
  const auto bits = [](const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(v[i]) >> 16);
    return out;
  };
  const std::vector<uint16_t> a = bits(o.a), b = bits(o.b);
  const int64_t b_rs = transposed_b ? 1 : n, b_cs = transposed_b ? k : 1;
  time_gemm(state, o, [&] {
    dvm::vm::cpu::gemm_half(dvm::DType::kBF16, m, n, k, a.data(), k, 1, b.data(), b_rs, b_cs,
                            o.c.data(), n, false);
  });
  state.SetLabel(dvm::vm::cpu::gemm_half_on_amx(dvm::DType::kBF16) ? "amx" : "f32 panels");
}

void BM_dvm_bf16(benchmark::State& state) {
  run_gemm_bf16(state, false);
}

void BM_dvm_bf16_bt(benchmark::State& state) {
  run_gemm_bf16(state, true);
}

#ifdef DVM_HAVE_OPENBLAS
void BM_openblas(benchmark::State& state) {
  openblas_set_num_threads(1);
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Operands o(m, n, k);
  time_gemm(state, o, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, o.a.data(), static_cast<int>(k), o.b.data(),
                static_cast<int>(n), 0.0f, o.c.data(), static_cast<int>(n));
  });
}
#endif

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "n", "k"});
  for (int64_t s : {64, 128, 256, 384, 512, 768, 1024}) b->Args({s, s, s});
  for (int64_t m : {64, 128, 256})
    for (int64_t k : {768, 3072}) b->Args({m, 256, k});
  b->Args({256, 512, 768});  // one VM tile of a BERT linear layer (batch 2 x 128 tokens)
  b->Args({256, 512, 3072});
  b->Args({256, 512, 2048});  // x @ W^T of a 2048 -> 8192 MLP (one VM tile)
  b->Args({256, 384, 256});   // half of a hidden-256 model's 256 -> 768 projection (VM tile)
  b->Args({256, 768, 256});   // the whole of it
  for (int64_t m : {1, 4, 16})
    for (int64_t n : {768, 3072}) b->Args({m, n, 768});
  b->MinTime(0.2);
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_dvm)->Apply(shapes);
BENCHMARK(BM_dvm_packed)->Apply(shapes);
BENCHMARK(BM_dvm_bt)->Apply(shapes);
BENCHMARK(BM_dvm_bt_in_place)->Apply(shapes);
BENCHMARK(BM_dvm_avx2)->Apply(shapes);
BENCHMARK(BM_dvm_bf16)->Apply(shapes);
BENCHMARK(BM_dvm_bf16_bt)->Apply(shapes);
#ifdef DVM_HAVE_OPENBLAS
BENCHMARK(BM_openblas)->Apply(shapes);
#endif

}  // namespace

BENCHMARK_MAIN();
