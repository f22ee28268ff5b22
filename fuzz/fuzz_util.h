// Helpers shared by the fuzz targets: host buffers for tensors and the failure report.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "dvm/dtype.h"
#include "dvm/runtime.h"
#include "ops/scalar_ops.h"

namespace dvm::fuzz {

// An invariant of the target does not hold: abort, so the fuzzer records the input.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
  std::abort();
}

// Reads the fuzz input a byte at a time, zero once it runs out.
struct Reader {
  const uint8_t* data;
  size_t size, pos = 0;
  uint8_t next() { return pos < size ? data[pos++] : 0; }
  bool done() const { return pos >= size; }
};

// `compile(threads)` for one and for two threads (DVM's results must not depend on the thread
// count): both compile or neither does.
template <class Compile>
auto compile_on_one_and_two_threads(Compile compile) {
  auto one = compile(1);
  auto two = compile(2);
  if (one.is_ok() != two.is_ok()) fail("compiles on one thread count only");
  return std::pair{std::move(one), std::move(two)};
}

// At most 64K elements per tensor: runs stay fast enough for many executions a second.
inline bool small_enough(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || d > (1 << 16)) return false;
    n *= d;
    if (n > (1 << 16)) return false;
  }
  return true;
}

// A contiguous host tensor.
struct Buffer {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  TensorArg arg() { return TensorArg::contiguous(bytes.data(), dtype, shape); }

  // Element i as a double (f16 and bf16 decoded, bool 0 or 1).
  double value(int64_t i) const {
    return ops::load_element(bytes.data() + i * dtype_size(dtype), dtype);
  }

  // Deterministic contents that every op accepts often: small floats, and integers in
  // [0, 4) (valid indices for most gathers; some out of range ones are errors to report).
  static Buffer filled(DType dtype, std::vector<int64_t> shape, uint32_t seed) {
    Buffer b{dtype, std::move(shape), {}};
    const int64_t n = b.numel();
    b.bytes.resize(static_cast<size_t>(n * dtype_size(dtype)));
    uint32_t s = seed * 2654435761u + 12345u;
    static constexpr uint16_t kF16[] = {0x3C00, 0xBC00, 0x3800, 0x4000, 0x0000, 0xB800};
    static constexpr uint16_t kBF16[] = {0x3F80, 0xBF80, 0x3F00, 0x4000, 0x0000, 0xBF00};
    for (int64_t i = 0; i < n; ++i) {
      s = s * 1103515245u + 12345u;
      const uint32_t r = s >> 16;
      unsigned char* p = b.bytes.data() + i * dtype_size(dtype);
      switch (dtype) {
        case DType::kF32: {
          const float v = static_cast<float>(static_cast<int>(r % 17) - 8) * 0.25f;
          std::memcpy(p, &v, 4);
          break;
        }
        case DType::kF16:
          std::memcpy(p, &kF16[r % 6], 2);
          break;
        case DType::kBF16:
          std::memcpy(p, &kBF16[r % 6], 2);
          break;
        case DType::kI32: {
          const int32_t v = static_cast<int32_t>(r % 4);
          std::memcpy(p, &v, 4);
          break;
        }
        case DType::kI64: {
          const int64_t v = r % 4;
          std::memcpy(p, &v, 8);
          break;
        }
        case DType::kBool:
          *p = static_cast<unsigned char>(r & 1);
          break;
      }
    }
    return b;
  }

  // Filled with a pattern the VM never computes by accident, so unwritten elements show.
  static constexpr unsigned char kPoison = 0xA5;
  static Buffer poisoned(DType dtype, std::vector<int64_t> shape) {
    Buffer b{dtype, std::move(shape), {}};
    b.bytes.assign(static_cast<size_t>(b.numel() * dtype_size(dtype)), kPoison);
    return b;
  }
  // Does element i still hold the poison pattern (never written)?
  bool unwritten(int64_t i) const {
    const size_t es = static_cast<size_t>(dtype_size(dtype));
    const unsigned char* p = bytes.data() + static_cast<size_t>(i) * es;
    for (size_t k = 0; k < es; ++k)
      if (p[k] != kPoison) return false;
    return true;
  }
};

}  // namespace dvm::fuzz
