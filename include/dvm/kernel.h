// The kernel builder: describe a fused operator once as a DAG of meta-ops over tensors whose
// dimensions may be symbols; compile it (include/dvm/runtime.h) and run it for any binding.
//
//   dvm::KernelBuilder kb("bias_gelu");
//   dvm::Dim S = kb.symbol("S");
//   dvm::Value x = kb.load("x", dvm::DType::kF32, {S, 768});
//   dvm::Value b = kb.load("b", dvm::DType::kF32, {768});
//   kb.store("y", kb.unary(dvm::UnaryOp::kGeluErf, kb.add(x, b)));
//   dvm::StatusOr<dvm::Kernel> kernel = kb.build();
//
// Semantics follow PyTorch where it has one: numpy broadcasting, type promotion (bool < i32 <
// i64 < f16/bf16 < f32), integer floor_divide/remainder round toward negative infinity.
// Errors found while building (rank mismatch, constant dims that cannot broadcast, bad axes)
// are recorded and returned by build(); the first error wins and names the op and dims.
// A KernelBuilder is not thread-safe; a built Kernel is immutable and may be shared.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dvm/dtype.h"
#include "dvm/status.h"

namespace dvm {

enum class UnaryOp : uint8_t {
#define DVM_UNARY(Name, mnemonic, kind) k##Name,
#include "dvm/ops.def"
};
enum class BinaryOp : uint8_t {
#define DVM_BINARY(Name, mnemonic, kind) k##Name,
#include "dvm/ops.def"
};
enum class ReduceOp : uint8_t {
#define DVM_REDUCE(Name, mnemonic) k##Name,
#include "dvm/ops.def"
};

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);
const char* reduce_op_name(ReduceOp op);

inline constexpr int kMaxRank = 8;

// A dimension: a non-negative constant or a symbol of the kernel (bound at run time).
class Dim {
 public:
  constexpr Dim(int64_t value = 0) : value_(value), symbol_(-1) {}  // NOLINT: implicit
  static constexpr Dim symbol(int id) {
    Dim d;
    d.symbol_ = id;
    return d;
  }
  constexpr bool is_symbol() const { return symbol_ >= 0; }
  constexpr int64_t value() const { return value_; }
  constexpr int symbol_id() const { return symbol_; }
  constexpr bool operator==(const Dim& o) const {
    return value_ == o.value_ && symbol_ == o.symbol_;
  }

 private:
  int64_t value_;
  int symbol_;
};

// A tensor value inside a KernelBuilder: a handle, cheap to copy.
struct Value {
  int id = -1;
  bool valid() const { return id >= 0; }
};

namespace ir {
struct KernelDef;
}

// An immutable, built kernel definition. Cheap to copy (shared).
class Kernel {
 public:
  Kernel() = default;
  explicit Kernel(std::shared_ptr<const ir::KernelDef> def) : def_(std::move(def)) {}
  const ir::KernelDef& def() const { return *def_; }
  const std::string& name() const;
  int num_inputs() const;
  int num_outputs() const;
  int num_params() const;
  // Text form of the kernel DAG, one op per line (for dumps and failing tests).
  std::string to_string() const;

 private:
  std::shared_ptr<const ir::KernelDef> def_;
};

// Sentinel for slice bounds: "to the end of the axis".
inline constexpr int64_t kSliceEnd = INT64_MAX;

class KernelBuilder {
 public:
  explicit KernelBuilder(std::string name);
  ~KernelBuilder();
  KernelBuilder(const KernelBuilder&) = delete;
  KernelBuilder& operator=(const KernelBuilder&) = delete;

  // A symbolic dimension; bound from the shapes of the inputs at each call.
  Dim symbol(const std::string& name);

  // An input tensor (argument slot in declaration order). Any strides and storage offset
  // are accepted at run time. Declare loads as separate statements: two loads nested in one
  // call expression (kb.matmul(kb.load(..), kb.load(..))) take their slots in C++'s
  // unspecified argument evaluation order.
  Value load(const std::string& name, DType dtype, std::vector<Dim> dims);
  // A scalar (rank-0) value supplied at each call (argument of run()); changing it never
  // re-encodes the kernel.
  Value param(const std::string& name, DType dtype);
  // A scalar constant (rank 0).
  Value constant(double v, DType dtype = DType::kF32);
  // An output tensor (slot in declaration order), written with `value` cast to `dtype`
  // (default: the value's own dtype). Outputs may be strided views.
  void store(const std::string& name, Value value);
  void store(const std::string& name, Value value, DType dtype);

  Value unary(UnaryOp op, Value x);
  Value binary(BinaryOp op, Value a, Value b);
  // Binary op with a scalar constant operand, in the dtype of `a` (promoted to f32 when a is
  // integer and the scalar is not integral).
  Value binary(BinaryOp op, Value a, double b);
  Value binary(BinaryOp op, double a, Value b);
  Value select(Value cond, Value if_true, Value if_false);
  Value cast(Value x, DType dtype);
  Value broadcast(Value x, std::vector<Dim> dims);
  // Reshape preserving the element count; at most one dim may be -1 (inferred).
  Value reshape(Value x, std::vector<Dim> dims);
  Value permute(Value x, std::vector<int> perm);
  Value transpose(Value x, int axis0, int axis1);
  // Python-style slice x[start:stop:step] along `axis` (negative bounds count from the end,
  // bounds are clamped, step > 0).
  Value slice(Value x, int axis, int64_t start, int64_t stop, int64_t step = 1);
  Value concat(std::vector<Value> xs, int axis);
  // Reduction over `axes` (negative counts from the end; empty = all axes).
  // argmax/argmin take exactly one axis and return i64 indices.
  Value reduce(ReduceOp op, Value x, std::vector<int> axes, bool keepdims = false);
  // Matrix product [..., M, K] x [..., K, N] -> [..., M, N] (after the optional transposes of
  // the last two dims), up to two batch dims broadcast numpy-style; f32, f16 or bf16 inputs
  // accumulate in f32. Elementwise ops on the result fuse into the same kernel ("mix").
  Value matmul(Value a, Value b, bool transpose_a = false, bool transpose_b = false);

  // Convenience wrappers.
  Value add(Value a, Value b) { return binary(BinaryOp::kAdd, a, b); }
  Value sub(Value a, Value b) { return binary(BinaryOp::kSub, a, b); }
  Value mul(Value a, Value b) { return binary(BinaryOp::kMul, a, b); }
  Value div(Value a, Value b) { return binary(BinaryOp::kDiv, a, b); }
  Value sum(Value x, std::vector<int> axes, bool keepdims = false) {
    return reduce(ReduceOp::kSum, x, std::move(axes), keepdims);
  }
  Value max(Value x, std::vector<int> axes, bool keepdims = false) {
    return reduce(ReduceOp::kMax, x, std::move(axes), keepdims);
  }
  Value mean(Value x, std::vector<int> axes, bool keepdims = false) {
    return reduce(ReduceOp::kMean, x, std::move(axes), keepdims);
  }

  // Shape and dtype of a value built so far (symbolic dims).
  std::vector<Dim> shape(Value v) const;
  DType dtype(Value v) const;
  int rank(Value v) const;

  // Validates and freezes the definition. The builder must not be used afterwards.
  StatusOr<Kernel> build();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dvm
