// Checks on the tensors of a call that every entry point (CompiledKernel::run,
// Executable::run) makes before any program runs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dvm/runtime.h"

namespace dvm::runtime {

// Outputs are written while inputs are still being read, and neither kernels nor graphs
// declare aliases: an output may not overlap an input, another output, or itself (a zero
// stride, or strides that make two indices share an element). With `allow_in_place`, an
// output may be exactly an input's view (same memory, offset, shape, strides and dtype): the
// caller allows it only for kernels where that is safe (one output, elementwise ops only: a
// kernel with two outputs may read the input after storing the first). `name` names the
// kernel or graph.
Status check_no_overlap(const std::string& name, std::span<const TensorArg> inputs,
                        std::span<const TensorArg> outputs, bool allow_in_place = false);

// The two halves of check_no_overlap, for callers that check many calls of one argument
// layout (shapes, strides, offsets, dtypes): what depends on the layout alone once, the
// pointers on every call.

// The bytes a view touches, relative to its data pointer: [lo, hi); lo == hi: none.
struct ByteExtent {
  int64_t lo = 0;
  int64_t hi = 0;
};
ByteExtent byte_extent(const TensorArg& t);

// Some element of `t` has two indices (a zero stride, or strides that interleave).
bool self_overlaps(const TensorArg& t);

// Whether input i and output k have the same layout (offset, shape, strides, dtype); flags
// in input-major order (i * outputs + k). Such a pair is the same view when it shares data.
void same_layouts(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
                  std::vector<uint8_t>* flags);

// The per-call half: no output's bytes meet an input's or another output's. `data` and
// `extents` hold the inputs, then the outputs; `in_place` (empty: none allowed) the flags of
// same_layouts, for a kernel that may write an output over its exact input view.
Status check_disjoint(const std::string& name, size_t num_inputs, std::span<void* const> data,
                      std::span<const ByteExtent> extents, std::span<const uint8_t> in_place);

}  // namespace dvm::runtime
