// dvm_demo: one dynamic-shape kernel, built once, run over a stream of sequence lengths.
//
//   y = gelu_erf(layernorm(x) * gamma + beta),  x: [S, 768] (S symbolic), gamma/beta: [768]
//
// For each call the runtime binds S, encodes bytecode for that exact shape (or hits the
// cache), and runs it on the VM. The demo prints encode time, median run time, achieved
// bandwidth and the max abs error against the scalar reference executor, and exits non-zero
// if any call fails or any error exceeds kTolerance.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "dvm/kernel.h"
#include "dvm/runtime.h"

namespace {

constexpr int64_t kHidden = 768;
constexpr double kEps = 1e-5;
constexpr double kTolerance = 1e-3;

dvm::StatusOr<dvm::Kernel> build_layernorm_gelu() {
  dvm::KernelBuilder kb("layernorm_gelu");
  dvm::Dim s = kb.symbol("S");
  dvm::Value x = kb.load("x", dvm::DType::kF32, {s, kHidden});
  dvm::Value gamma = kb.load("gamma", dvm::DType::kF32, {kHidden});
  dvm::Value beta = kb.load("beta", dvm::DType::kF32, {kHidden});
  dvm::Value mean = kb.mean(x, {-1}, /*keepdims=*/true);
  dvm::Value xc = kb.sub(x, mean);
  dvm::Value var = kb.mean(kb.mul(xc, xc), {-1}, /*keepdims=*/true);
  dvm::Value rstd = kb.unary(dvm::UnaryOp::kRsqrt, kb.binary(dvm::BinaryOp::kAdd, var, kEps));
  dvm::Value norm = kb.mul(xc, rstd);
  dvm::Value affine = kb.add(kb.mul(norm, gamma), beta);
  kb.store("y", kb.unary(dvm::UnaryOp::kGeluErf, affine));
  return kb.build();
}

double now_us() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Totals {
  double first_call_us = 0;  // sum over all first calls (encode + run)
  double encode_us = 0;
  int misses = 0;
  int hits = 0;
  double max_err = 0;
  bool failed = false;
};

// Runs one sequence length; returns false on an error status.
bool run_shape(const dvm::CompiledKernel& ck, const dvm::Kernel& kernel, int64_t s,
               const std::vector<float>& gamma, const std::vector<float>& beta, std::mt19937& rng,
               Totals& totals) {
  std::vector<float> x(static_cast<size_t>(s * kHidden));
  std::normal_distribution<float> dist(0.5f, 2.0f);
  for (float& v : x) v = dist(rng);
  std::vector<float> y(x.size(), 0.0f);
  std::vector<float> y_ref(x.size(), 0.0f);

  const dvm::TensorArg inputs[] = {
      dvm::TensorArg::contiguous(x.data(), dvm::DType::kF32, {s, kHidden}),
      dvm::TensorArg::contiguous(const_cast<float*>(gamma.data()), dvm::DType::kF32, {kHidden}),
      dvm::TensorArg::contiguous(const_cast<float*>(beta.data()), dvm::DType::kF32, {kHidden})};
  const dvm::TensorArg outputs[] = {
      dvm::TensorArg::contiguous(y.data(), dvm::DType::kF32, {s, kHidden})};
  const dvm::TensorArg ref_outputs[] = {
      dvm::TensorArg::contiguous(y_ref.data(), dvm::DType::kF32, {s, kHidden})};

  dvm::RunStats stats;
  double t0 = now_us();
  dvm::Status st = ck.run(inputs, outputs, {}, &stats);
  double first_us = now_us() - t0;
  if (!st.is_ok()) {
    std::fprintf(stderr, "S=%lld: run failed: %s\n", static_cast<long long>(s),
                 st.to_string().c_str());
    return false;
  }
  totals.first_call_us += first_us;
  if (stats.cache_hit) {
    ++totals.hits;
  } else {
    ++totals.misses;
    totals.encode_us += stats.encode_us;
  }

  // Enough repetitions for a stable median without making large shapes slow.
  const int64_t bytes = (2 * s * kHidden + 2 * kHidden) * static_cast<int64_t>(sizeof(float));
  const int reps =
      static_cast<int>(std::clamp<int64_t>(400'000'000 / std::max<int64_t>(bytes, 1), 5, 200));
  std::vector<double> times;
  times.reserve(reps);
  for (int r = 0; r < reps; ++r) {
    double t = now_us();
    dvm::Status rs = ck.run(inputs, outputs);
    times.push_back(now_us() - t);
    if (!rs.is_ok()) {
      std::fprintf(stderr, "S=%lld: repeat run failed: %s\n", static_cast<long long>(s),
                   rs.to_string().c_str());
      return false;
    }
  }
  double med_us = median(times);

  dvm::Status rst = dvm::run_reference(kernel, inputs, ref_outputs);
  if (!rst.is_ok()) {
    std::fprintf(stderr, "S=%lld: reference failed: %s\n", static_cast<long long>(s),
                 rst.to_string().c_str());
    return false;
  }
  double err = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    double d = std::fabs(static_cast<double>(y[i]) - y_ref[i]);
    if (!(d <= err)) err = std::isnan(d) ? INFINITY : d;
  }
  totals.max_err = std::max(totals.max_err, err);

  char encode[32];
  if (stats.cache_hit) {
    std::snprintf(encode, sizeof(encode), "%10s", "cache hit");
  } else {
    std::snprintf(encode, sizeof(encode), "%7.1f us", stats.encode_us);
  }
  double gbps = med_us > 0 ? static_cast<double>(bytes) / (med_us * 1e3) : 0.0;
  std::printf("%6lld  %10lld  %s  %10.1f  %8.2f  %10.2e  %s\n", static_cast<long long>(s),
              static_cast<long long>(s * kHidden), encode, med_us, gbps, err,
              err <= kTolerance ? "ok" : "FAIL");
  return true;
}

}  // namespace

int main() {
  dvm::StatusOr<dvm::Kernel> kernel = build_layernorm_gelu();
  if (!kernel.is_ok()) {
    std::fprintf(stderr, "build failed: %s\n", kernel.status().to_string().c_str());
    return 1;
  }
  auto compiled = dvm::CompiledKernel::create(*kernel);
  if (!compiled.is_ok()) {
    std::fprintf(stderr, "create failed: %s\n", compiled.status().to_string().c_str());
    return 1;
  }
  const dvm::CompiledKernel& ck = **compiled;

  std::mt19937 rng(42);
  std::vector<float> gamma(kHidden), beta(kHidden);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& g : gamma) g = 1.0f + 0.5f * u(rng);
  for (auto& b : beta) b = 0.5f * u(rng);

  std::printf("DVM demo: y = gelu_erf(layernorm(x) * gamma + beta), x: [S, %lld], built once\n",
              static_cast<long long>(kHidden));
  std::printf("%6s  %10s  %10s  %10s  %8s  %10s\n", "S", "elements", "encode", "median us", "GB/s",
              "max |err|");

  const int64_t stream[] = {1, 7, 64, 128, 200, 384, 512, 1000, 2048, 4096, 128, 7, 1000, 384};
  Totals totals;
  for (int64_t s : stream) {
    if (!run_shape(ck, *kernel, s, gamma, beta, rng, totals)) totals.failed = true;
  }

  const int calls = totals.hits + totals.misses;
  std::printf(
      "summary: %d calls, %d encodes (mean %.1f us), %d cache hits, %zu cached programs, "
      "first calls %.0f us total, max |err| %.2e (tol %.0e): %s\n",
      calls, totals.misses, totals.misses ? totals.encode_us / totals.misses : 0.0, totals.hits,
      ck.cached_programs(), totals.first_call_us, totals.max_err, kTolerance,
      (!totals.failed && totals.max_err <= kTolerance) ? "PASS" : "FAIL");
  return (totals.failed || !(totals.max_err <= kTolerance)) ? 1 : 0;
}
