// The runtime operator compiler: kernel definition + concrete binding -> verified bytecode.
//
// For one binding (shapes, strides and offsets of every argument) the encoder splits the
// kernel into stages (one iteration domain each; a stage boundary goes through a workspace
// buffer), maps every op into its stage's domain with affine index maps (so broadcast,
// permute and slice of loads become descriptor strides), folds mergeable axes, picks the
// tile (rows x cols) and the grid, schedules reductions (single pass when the reduced axes
// fit in a tile, otherwise one loop pass per reduction level), allocates tile registers by
// liveness and emits one program per stage.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "bytecode/format.h"
#include "bytecode/target.h"
#include "ir/kernel_def.h"

namespace dvm::enc {

struct EncodeOptions {
  int num_threads = 1;
  const bc::Target* target = nullptr;  // the backend the programs are for (required)
};

// Slots: [0, inputs) inputs, then outputs, then workspaces. Verified programs are all the
// encoder hands to a backend (the CPU VM loads them with vm::load).
struct EncodedKernel {
  std::vector<bc::Program> programs;
  std::vector<int64_t> workspace_bytes;  // one per workspace slot
  std::vector<int64_t> workspace_elems;  // the same in elements of the workspace's dtype
  int num_inputs = 0;
  int num_outputs = 0;
  // Per slot: element span [lo, hi] touched (lo > hi: untouched); checked at every call
  // against the caller's storage sizes.
  std::vector<std::pair<int64_t, int64_t>> slot_spans;
  int64_t bytes_moved = 0;
};

Status encode(const ir::KernelDef& def, const ir::Binding& binding,
              std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
              const EncodeOptions& options, EncodedKernel* out);

}  // namespace dvm::enc
