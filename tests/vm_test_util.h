// Shared harness of the VM tests: random tensors, running a kernel on the VM and on the
// reference executor with the same arguments, and comparing every output element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "dvm/runtime.h"
#include "encoder/encoder.h"
#include "ir/kernel_def.h"
#include "ops/scalar_ops.h"
#include "vm/interpreter.h"

namespace dvm::testing {

// A tensor buffer with a strided view over it. Copies and moves re-point the view at their
// own bytes (initializer lists copy).
struct Buffer {
  DType dtype = DType::kF32;
  std::vector<char> bytes;
  TensorArg arg;

  Buffer() = default;
  Buffer(const Buffer& o) : dtype(o.dtype), bytes(o.bytes), arg(o.arg) { rebind(o); }
  Buffer(Buffer&& o) noexcept : dtype(o.dtype), bytes(std::move(o.bytes)), arg(std::move(o.arg)) {}
  Buffer& operator=(const Buffer& o) {
    dtype = o.dtype;
    bytes = o.bytes;
    arg = o.arg;
    rebind(o);
    return *this;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    dtype = o.dtype;
    bytes = std::move(o.bytes);
    arg = std::move(o.arg);
    return *this;
  }

 private:
  void rebind(const Buffer& o) {
    if (o.arg.data == o.bytes.data()) arg.data = bytes.data();
  }
};

inline Buffer make_buffer(DType t, std::vector<int64_t> shape, std::mt19937& rng,
                          bool transposed = false, int64_t offset = 0) {
  Buffer b;
  b.dtype = t;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  int64_t storage = n + offset;
  b.bytes.assign(static_cast<size_t>(std::max<int64_t>(storage, 1) * dtype_size(t)), 0);
  std::uniform_real_distribution<float> uf(-2.f, 2.f);
  std::uniform_int_distribution<int> ui(-50, 50);
  for (int64_t i = 0; i < storage; ++i) {
    char* p = b.bytes.data() + i * dtype_size(t);
    switch (t) {
      case DType::kF32: {
        float v = uf(rng);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kF16: {
        uint16_t v = ops::f32_to_f16_bits(uf(rng));
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kBF16: {
        uint16_t v = ops::f32_to_bf16_bits(uf(rng));
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kI32: {
        int32_t v = ui(rng);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kI64: {
        int64_t v = ui(rng);
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kBool: {
        *p = static_cast<char>(ui(rng) > 0);
        break;
      }
    }
  }
  b.arg.data = b.bytes.data();
  b.arg.dtype = t;
  b.arg.shape = shape;
  b.arg.offset = offset;
  b.arg.storage_elems = storage;
  if (transposed && shape.size() >= 2) {
    // Column-major over the last two dims: a non-contiguous (permuted) view.
    size_t r = shape.size();
    std::vector<int64_t> st(r);
    int64_t s = 1;
    st[r - 2] = s;
    s *= shape[r - 2];
    st[r - 1] = s;
    s *= shape[r - 1];
    for (int i = static_cast<int>(r) - 3; i >= 0; --i) {
      st[i] = s;
      s *= shape[i];
    }
    b.arg.strides = st;
  }
  return b;
}

inline DType dtype_of_output(const Kernel& k, int out) {
  return k.def().nodes[k.def().outputs[out].node].dtype;
}

inline double element(const Buffer& b, int64_t i) {
  return ops::load_element(b.bytes.data() + i * dtype_size(b.dtype), b.dtype);
}

struct Tolerance {
  double abs = 1e-5;
  double rel = 1e-5;
};

// Runs `kernel` on the VM and the reference with the given inputs; compares all outputs.
inline void expect_matches_reference(const Kernel& kernel, const std::vector<Buffer>& inputs,
                                     Tolerance tol = {}, std::vector<ScalarArg> params = {},
                                     const std::string& what = "") {
  std::vector<TensorArg> in;
  for (const auto& b : inputs) in.push_back(b.arg);
  auto ck = CompiledKernel::create(kernel);
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  auto shapes = (*ck)->infer_output_shapes(in);
  ASSERT_TRUE(shapes.is_ok()) << shapes.status().to_string();
  std::mt19937 rng(7);
  std::vector<Buffer> vm_out, ref_out;
  std::vector<TensorArg> vo, ro;
  for (int k = 0; k < kernel.num_outputs(); ++k) {
    DType t = dtype_of_output(kernel, k);
    vm_out.push_back(make_buffer(t, (*shapes)[k], rng));
    ref_out.push_back(make_buffer(t, (*shapes)[k], rng));
  }
  for (auto& b : vm_out) vo.push_back(b.arg);
  for (auto& b : ref_out) ro.push_back(b.arg);
  Status rs = run_reference(kernel, in, ro, params);
  ASSERT_TRUE(rs.is_ok()) << rs.to_string();
  Status vs = (*ck)->run(in, vo, params);
  ASSERT_TRUE(vs.is_ok()) << vs.to_string() << "\n" << kernel.to_string();
  for (int k = 0; k < kernel.num_outputs(); ++k) {
    int64_t n = vo[k].numel();
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 5; ++i) {
      double a = element(vm_out[k], i), r = element(ref_out[k], i);
      bool same = (std::isnan(a) && std::isnan(r)) || a == r ||
                  std::abs(a - r) <= tol.abs + tol.rel * std::abs(r);
      if (!same) {
        ++bad;
        ADD_FAILURE() << what << " output " << k << " element " << i << ": vm " << a
                      << " vs reference " << r << "\n"
                      << kernel.to_string() << (*ck)->disassemble(in, vo).value();
      }
    }
  }
}

// ---- output views and whole-storage comparison (shared by the op and random tests) ----

enum class Out { kContig, kTransposed, kStrided, kOffset };

inline constexpr unsigned char kSentinel = 0x7B;

// The verified programs the encoder gives `k` for these arguments (for tests that inspect
// programs or the interpreter's plans of them).
inline enc::EncodedKernel encode_for(const Kernel& k, std::span<const TensorArg> in,
                                     std::span<const TensorArg> out, int threads = 1) {
  ir::Binding binding;
  EXPECT_TRUE(ir::bind_shapes(k.def(), in, &binding).is_ok());
  enc::EncodedKernel ek;
  enc::EncodeOptions eo;
  eo.target = &vm::cpu_target();
  eo.num_threads = threads;
  EXPECT_TRUE(enc::encode(k.def(), binding, in, out, eo, &ek).is_ok());
  return ek;
}

// An output buffer with the given view layout, its whole storage filled with kSentinel bytes.
inline Buffer make_out(DType t, const std::vector<int64_t>& shape, Out layout) {
  Buffer b;
  b.dtype = t;
  int r = static_cast<int>(shape.size());
  std::vector<int64_t> st(r);
  int64_t off = 0, s = 1;
  for (int i = r - 1; i >= 0; --i) {
    st[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  bool custom = false;
  switch (layout) {
    case Out::kContig:
      break;
    case Out::kTransposed:
      if (r >= 2) {
        custom = true;
        s = 1;
        st[r - 2] = s;
        s *= std::max<int64_t>(shape[r - 2], 1);
        st[r - 1] = s;
        s *= std::max<int64_t>(shape[r - 1], 1);
        for (int i = r - 3; i >= 0; --i) {
          st[i] = s;
          s *= std::max<int64_t>(shape[i], 1);
        }
      }
      break;
    case Out::kStrided:
      custom = true;
      off = 5;
      if (r > 0) st[r - 1] = 2;
      for (int i = r - 2; i >= 0; --i) st[i] = st[i + 1] * std::max<int64_t>(shape[i + 1], 1) + 3;
      break;
    case Out::kOffset:
      off = 11;
      break;
  }
  int64_t hi = off, n = 1;
  for (int i = 0; i < r; ++i) {
    n *= shape[i];
    if (shape[i] > 0) hi += (shape[i] - 1) * st[i];
  }
  int64_t storage = (n == 0 ? off : hi + 1) + 7;
  b.bytes.assign(static_cast<size_t>(storage * dtype_size(t)), static_cast<char>(kSentinel));
  b.arg.data = b.bytes.data();
  b.arg.dtype = t;
  b.arg.shape = shape;
  if (custom) b.arg.strides = st;
  b.arg.offset = off;
  b.arg.storage_elems = storage;
  return b;
}

// Largest finite |element| of a buffer's view (the scale its tolerance is relative to; the
// storage around a strided view holds sentinels).
inline double max_abs(const Buffer& b) {
  const TensorArg& t = b.arg;
  int r = static_cast<int>(t.shape.size());
  std::vector<int64_t> st = t.strides;
  if (st.empty()) {
    st.assign(r, 1);
    for (int i = r - 2; i >= 0; --i) st[i] = st[i + 1] * t.shape[i + 1];
  }
  double m = 0;
  std::vector<int64_t> idx(r, 0);
  if (t.numel() == 0) return 0;
  for (int64_t e = 0; e < t.numel(); ++e) {
    int64_t off = t.offset;
    for (int i = 0; i < r; ++i) off += idx[i] * st[i];
    double v = std::abs(element(b, off));
    if (std::isfinite(v)) m = std::max(m, v);
    for (int i = r - 1; i >= 0 && ++idx[i] == t.shape[i]; --i) idx[i] = 0;
  }
  return m;
}

// Compares two identically laid out buffers over their whole storage.
inline int compare_storage(const Buffer& vm, const Buffer& ref, Tolerance tol,
                           const std::string& what, const std::string& context) {
  EXPECT_EQ(vm.bytes.size(), ref.bytes.size());
  if (vm.bytes.size() != ref.bytes.size()) return 1;
  int64_t n = static_cast<int64_t>(vm.bytes.size()) / dtype_size(vm.dtype);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    double a = element(vm, i), r = element(ref, i);
    bool same = (std::isnan(a) && std::isnan(r)) || a == r ||
                std::abs(a - r) <= tol.abs + tol.rel * std::abs(r);
    if (!same) {
      ++bad;
      ADD_FAILURE() << what << " storage element " << i << " (view offset " << vm.arg.offset
                    << "): vm " << a << " vs reference " << r << (bad == 1 ? context : "");
    }
  }
  return bad;
}

}  // namespace dvm::testing
