// Lowering a fused group to a kernel-builder Kernel (include/dvm/kernel.h): the kernel is
// built once with symbolic dims and encoded per binding by the runtime operator compiler.
#pragma once

#include "dvm/kernel.h"
#include "fuser/fusion.h"

namespace dvm::fuser {

// What a kernel input slot reads: the value of `node` as a strided view of its storage (the
// executable resolves views per call). `through_self`: the node is itself a view op that runs
// in a copy kernel; the slot reads the node's own view (not its operand).
struct LoadSpec {
  int node = -1;
  bool through_self = false;
};

struct LoweredKernel {
  Kernel kernel;
  std::vector<LoadSpec> loads;  // input slots
  std::vector<int> stores;      // output slots: graph values
  std::vector<SymExpr> params;  // param slots: symbolic scalars evaluated per call
};

// On failure to express an in-kernel view (a target dim that no kernel input provides),
// *bad_view is set to that view's node id, so the fuser can keep the view out of kernels.
StatusOr<LoweredKernel> lower_group(const GraphDef& g, const FusionPlan& plan, int group,
                                    int* bad_view);

}  // namespace dvm::fuser
