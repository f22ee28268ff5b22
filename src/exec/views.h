// Strided views resolved per call: broadcast, permute, slice and reshape of a tensor turned
// into new (shape, strides, offset) without touching memory.
#pragma once

#include <cstdint>
#include <vector>

#include "dvm/runtime.h"
#include "graph/graph_def.h"

namespace dvm::exec {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

// Applies view op `n` (reshape/permute/slice/broadcast) with concrete result shape `out_shape`
// to `t` in place. Returns false when a reshape cannot be expressed with strides (the caller
// copies the data first). `t.strides` must be explicit (not empty).
bool apply_view(const graph::Node& n, const std::vector<int64_t>& out_shape,
                const SymBindings& bindings, TensorArg* t);

// torch's stride computation for a view: false when `shape` cannot view the given layout.
bool reshape_strides(const std::vector<int64_t>& old_shape, const std::vector<int64_t>& old_strides,
                     const std::vector<int64_t>& new_shape, std::vector<int64_t>* new_strides);

}  // namespace dvm::exec
