// The fuser: groups a decomposed graph's ops into kernels, once, for every binding of the
// symbols.
//
// Node roles:
//   compute — belongs to exactly one group (kernel);
//   view    — reshape / permute / slice / broadcast resolved by the executable into a strided
//             view of a stored value at each call (no kernel, no copy), unless it is "in-kernel"
//             (a broadcast or size-1 reshape of a value computed in the same group);
//   scalar  — constants, inlined into every kernel that uses them.
// Group kinds: vector (elementwise + broadcast + reductions), cube (matmul), mix (matmul with
// elementwise/row-wise consumers), native (gathers, iota) and copy (a view that must be
// materialised: a graph output or the source of a reshape that is not a view).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "graph/graph_def.h"

namespace dvm::fuser {

using graph::GraphDef;

enum class KernelKind : uint8_t { kVector, kCube, kMix, kNative, kCopy };
const char* kernel_kind_name(KernelKind k);

enum class Role : uint8_t { kInput, kScalar, kCompute, kView, kInKernelView };

struct Group {
  KernelKind kind = KernelKind::kVector;
  std::vector<int> nodes;          // compute and in-kernel view nodes, topological order
  std::vector<int> stores;         // nodes whose values leave the group (outputs or used elsewhere)
  std::vector<std::string> notes;  // why this kernel starts here / did not take a consumer
  SymShape domain;
  std::vector<int64_t> reduce_axes;  // of the group's reductions (all equal), empty if none
  bool has_reduce = false;
};

struct FusionPlan {
  std::vector<Group> groups;  // execution order
  std::vector<int> group_of;  // node -> group, -1 for inputs, scalars and views
  std::vector<Role> role;
};

struct FuseOptions {
  bool enable = true;  // false: one group per compute op (the unfused baseline)
  int max_ops_per_kernel = 96;
  std::set<int> no_in_kernel_views;  // views the lowering could not express in-kernel
};

FusionPlan fuse(const GraphDef& g, const FuseOptions& options);

// Walks view nodes up to the value that is stored in memory (an input or a compute node).
int storage_root(const GraphDef& g, const FusionPlan& plan, int id);

std::string fusion_report(const GraphDef& g, const FusionPlan& plan);

}  // namespace dvm::fuser
