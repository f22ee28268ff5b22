// Builds, compiles and runs a small kernel through the installed public API; exits non-zero
// on any error or wrong result.
#include <cmath>
#include <cstdio>
#include <vector>

#include "dvm/kernel.h"
#include "dvm/runtime.h"

int main() {
  dvm::KernelBuilder kb("consumer");
  dvm::Dim n = kb.symbol("N");
  dvm::Value x = kb.load("x", dvm::DType::kF32, {n});
  kb.store("y", kb.unary(dvm::UnaryOp::kTanh, kb.mul(x, kb.constant(0.5))));
  auto kernel = kb.build();
  if (!kernel.is_ok()) return std::fprintf(stderr, "%s\n", kernel.status().to_string().c_str()), 1;
  auto ck = dvm::CompiledKernel::create(*kernel);
  if (!ck.is_ok()) return std::fprintf(stderr, "%s\n", ck.status().to_string().c_str()), 1;
  std::vector<float> xs(1000), ys(1000);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = 0.01f * static_cast<float>(i) - 5.0f;
  const dvm::TensorArg in[] = {dvm::TensorArg::contiguous(xs.data(), dvm::DType::kF32, {1000})};
  const dvm::TensorArg out[] = {dvm::TensorArg::contiguous(ys.data(), dvm::DType::kF32, {1000})};
  dvm::Status st = (*ck)->run(in, out);
  if (!st.is_ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (std::abs(ys[i] - std::tanh(0.5f * xs[i])) > 1e-5f) {
      std::fprintf(stderr, "y[%zu] = %g, want %g\n", i, ys[i], std::tanh(0.5f * xs[i]));
      return 1;
    }
  }
  std::printf("consumer: find_package(dvm) build runs correctly\n");
  return 0;
}
