// Native (non-bytecode) ops of the executable: data-dependent gathers, iota and strided
// copies. They run on the calling thread; indices are checked against the dims they address.
#pragma once

#include "dvm/runtime.h"
#include "graph/graph_def.h"

namespace dvm::exec {

// out[...] = in[...] for two views of the same shape and dtype (any strides).
void strided_copy(const TensorArg& in, const TensorArg& out);

// torch.index_select(x, axis, index) into out.
Status index_select(const std::string& where, const TensorArg& x, const TensorArg& index, int axis,
                    const TensorArg& out);
// torch.gather(x, axis, index) into out.
Status gather(const std::string& where, const TensorArg& x, const TensorArg& index, int axis,
              const TensorArg& out);
// torch.cumsum(x, axis) into out (x's shape and dtype): f32 sums in double and f16/bf16 in f32,
// each running sum rounded once, as torch's CPU kernel; integers wrap.
void cumsum(const TensorArg& x, int axis, const TensorArg& out);
// out = index along `axis`, in out's dtype.
void iota(const TensorArg& out, int axis);
// out = value everywhere, converted to out's dtype as a store would.
void fill(const TensorArg& out, double value);

}  // namespace dvm::exec
