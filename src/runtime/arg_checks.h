// Checks on the tensors of a call that every entry point (CompiledKernel::run,
// Executable::run) makes before any program runs.
#pragma once

#include <span>
#include <string>

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

}  // namespace dvm::runtime
