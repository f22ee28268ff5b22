// Helpers of the graph tests: host tensors, running an executable with fresh outputs, and
// comparing fused against unfused runs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dvm/graph.h"
#include "ops/scalar_ops.h"

namespace dvm::testing {

// A host tensor of any dtype, values stored as bytes; contiguous.
struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<char> bytes;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  TensorArg arg() {
    TensorArg t;
    t.data = bytes.data();
    t.dtype = dtype;
    t.shape = shape;
    return t;
  }
  double at(int64_t i) const {
    return ops::load_element(bytes.data() + i * dtype_size(dtype), dtype);
  }

  void set(int64_t i, double v) {
    char* p = bytes.data() + i * dtype_size(dtype);
    switch (dtype) {
      case DType::kF32: {
        float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::kI32: {
        int32_t x = static_cast<int32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::kI64: {
        int64_t x = static_cast<int64_t>(v);
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::kBool:
        p[0] = v != 0;
        break;
      default:
        break;
    }
  }
};

inline HostTensor host(DType t, std::vector<int64_t> shape) {
  HostTensor h;
  h.dtype = t;
  h.shape = std::move(shape);
  h.bytes.assign(static_cast<size_t>(std::max<int64_t>(h.numel(), 1) * dtype_size(t)), 0);
  return h;
}

inline HostTensor random_host(DType t, std::vector<int64_t> shape, std::mt19937& rng,
                              double lo = -2, double hi = 2) {
  HostTensor h = host(t, std::move(shape));
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < h.numel(); ++i) {
    double v = u(rng);
    h.set(i, is_float(t) ? v : std::floor(v));
  }
  return h;
}

// Runs `exe` on `inputs`, allocating outputs of the right shapes.
inline StatusOr<std::vector<HostTensor>> run_graph(const Executable& exe,
                                                   std::vector<HostTensor>& inputs,
                                                   GraphRunStats* stats = nullptr) {
  std::vector<TensorArg> in;
  for (HostTensor& h : inputs) in.push_back(h.arg());
  DVM_ASSIGN_OR_RETURN(auto shapes, exe.output_shapes(in));
  std::vector<DType> dtypes = exe.output_dtypes();
  std::vector<HostTensor> outs;
  for (size_t k = 0; k < shapes.size(); ++k) {
    outs.push_back(host(dtypes[k], shapes[k]));
    // Poison, so unwritten elements show up.
    for (int64_t i = 0; i < outs.back().numel(); ++i) outs.back().set(i, -777);
  }
  std::vector<TensorArg> out;
  for (HostTensor& h : outs) out.push_back(h.arg());
  DVM_RETURN_IF_ERROR(exe.run(in, out, stats));
  return outs;
}

inline void expect_close(const HostTensor& got, const HostTensor& want, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.shape, want.shape) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.numel() && bad < 5; ++i) {
    double a = got.at(i), b = want.at(i);
    bool ok =
        (std::isnan(a) && std::isnan(b)) || a == b || std::abs(a - b) <= tol * (1 + std::abs(b));
    if (!ok) {
      ++bad;
      ADD_FAILURE() << what << ": element " << i << " got " << a << " want " << b;
    }
  }
}

}  // namespace dvm::testing
