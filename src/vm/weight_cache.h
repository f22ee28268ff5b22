// Packed matmul operands that stay constant across calls (weights), packed once and shared by
// every tile, thread and call that multiplies by them. The caller marks such tensors with a
// nonzero TensorArg::version (include/dvm/runtime.h); the key is the operand's memory, layout,
// dtype and that version, so a new version (the weights were written) packs again and the old
// entry ages out. Process-wide, thread-safe, LRU-bounded by bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "dvm/dtype.h"

namespace dvm::vm {

// B of a matmul, K x N, element (p, j) at data[p * rs + j * cs].
struct WeightKey {
  const void* data = nullptr;
  uint64_t version = 0;
  int64_t k = 0, n = 0, rs = 0, cs = 0;
  DType dtype = DType::kF32;
  bool operator==(const WeightKey&) const = default;
};

// The packed panels (vm/cpu/gemm.h pack_b layout); alive while a user holds it, even if evicted.
class PackedWeight {
 public:
  explicit PackedWeight(size_t floats);
  ~PackedWeight();
  PackedWeight(const PackedWeight&) = delete;
  PackedWeight& operator=(const PackedWeight&) = delete;
  const float* panels() const { return data_; }
  float* mutable_panels() { return data_; }
  size_t bytes() const { return floats_ * sizeof(float); }

 private:
  float* data_;
  size_t floats_;
};

// The packed form of `key`'s operand, packing it on first use (concurrent users of a new key
// wait for one packer); null when the cache is disabled or the operand exceeds its capacity.
std::shared_ptr<const PackedWeight> packed_weight(const WeightKey& key);

}  // namespace dvm::vm
