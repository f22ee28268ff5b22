// The scalar reference executor: the executable spec every VM result is tested against.
//
// It evaluates a kernel node by node, element by element, into dense row-major buffers of
// each node's compute type (f32 for f32/f16/bf16, i32 for i32/bool, i64 for i64). Op
// semantics come only from src/ops/scalar_ops.h, the same functions the VM's tile kernels
// implement, so the two differ only where scalar_ops.h documents an error bound.
// Speed is not a goal: clarity and exactness are.
#pragma once

#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "dvm/runtime.h"
#include "dvm/status.h"
#include "ir/kernel_def.h"

namespace dvm::ir {

// One node's value: a dense row-major buffer in the node's compute type.
struct RefValue {
  ir::CShape shape;
  std::variant<std::vector<float>, std::vector<int32_t>, std::vector<int64_t>> data;

  CType ctype() const { return static_cast<CType>(data.index()); }
  int64_t numel() const { return shape.numel(); }
  // Element `i` (row-major) widened to double / int64 (floats truncate toward zero).
  double as_double(int64_t i) const;
  int64_t as_int(int64_t i) const;
  const std::vector<float>& f32() const { return std::get<std::vector<float>>(data); }
  const std::vector<int32_t>& i32() const { return std::get<std::vector<int32_t>>(data); }
  const std::vector<int64_t>& i64() const { return std::get<std::vector<int64_t>>(data); }
};

// Computes every node of `def` for shapes already bound by ir::bind_shapes (the caller
// checks the arguments first). On success values->at(n) holds node n's value; on error
// (e.g. max over an empty axis) the Status names the node. With `outputs_only`, only the nodes
// the outputs depend on are computed (the others stay empty), as the VM computes them: a dead
// integer division by zero is no error.
Status evaluate_reference(const ir::KernelDef& def, const ir::Binding& binding,
                          std::span<const TensorArg> inputs, std::span<const ScalarArg> params,
                          std::vector<RefValue>* values, bool outputs_only = false);

}  // namespace dvm::ir
