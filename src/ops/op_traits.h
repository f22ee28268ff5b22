// Properties of the ops of dvm/ops.def, generated from its columns: the one place every layer
// (kernel builder, graph IR, lazy runtime, encoder, verifier, VM, reference) asks whether an
// op is float-only, a predicate or a comparison. Never test an op's position in its enum.
#pragma once

#include "dvm/kernel.h"

namespace dvm::ops {

// The kind column of DVM_UNARY.
enum class UnaryKind : int {
  kSameType = 0,   // computes natively on every numeric dtype, result of the input's dtype
  kFloatOnly = 1,  // defined on floats only: integer inputs are cast to f32 first
  kPredicate = 2,  // result is bool (computed as i32 0/1), any input dtype
};

// The kind column of DVM_BINARY.
enum class BinaryKind : int {
  kArith = 0,       // result has the promoted operand dtype
  kComparison = 1,  // result is bool
  kLogical = 2,     // operands taken as bool, result is bool
};

inline constexpr int kNumUnaryOps = 0
#define DVM_UNARY(Name, mnemonic, kind) +1
#include "dvm/ops.def"
    ;
inline constexpr int kNumBinaryOps = 0
#define DVM_BINARY(Name, mnemonic, kind) +1
#include "dvm/ops.def"
    ;
inline constexpr int kNumReduceOps = 0
#define DVM_REDUCE(Name, mnemonic) +1
#include "dvm/ops.def"
    ;

constexpr UnaryKind unary_kind(UnaryOp op) {
  switch (op) {
#define DVM_UNARY(Name, mnemonic, kind) \
  case UnaryOp::k##Name:                \
    return static_cast<UnaryKind>(kind);
#include "dvm/ops.def"
  }
  return UnaryKind::kSameType;
}

constexpr BinaryKind binary_kind(BinaryOp op) {
  switch (op) {
#define DVM_BINARY(Name, mnemonic, kind) \
  case BinaryOp::k##Name:                \
    return static_cast<BinaryKind>(kind);
#include "dvm/ops.def"
  }
  return BinaryKind::kArith;
}

constexpr bool is_float_only(UnaryOp op) {
  return unary_kind(op) == UnaryKind::kFloatOnly;
}
constexpr bool is_predicate(UnaryOp op) {
  return unary_kind(op) == UnaryKind::kPredicate;
}
// Comparisons and logical ops: a bool result (i32 0/1 in registers).
constexpr bool returns_bool(BinaryOp op) {
  return binary_kind(op) != BinaryKind::kArith;
}
constexpr bool is_logical(BinaryOp op) {
  return binary_kind(op) == BinaryKind::kLogical;
}
// Divides by its second operand: on integers a zero divisor is an error of the run (torch
// raises ZeroDivisionError), reported by the VM and the reference, never folded away.
constexpr bool is_division(BinaryOp op) {
  return op == BinaryOp::kDiv || op == BinaryOp::kFloorDiv || op == BinaryOp::kRemainder;
}

// argmax/argmin: an i64 index along exactly one axis.
constexpr bool is_arg_reduce(ReduceOp op) {
  return op == ReduceOp::kArgMax || op == ReduceOp::kArgMin;
}
// Has a value over no elements (sum 0, mean NaN, prod 1); max, min and the arg reductions of
// an empty axis are errors, as in torch.
constexpr bool reduces_empty(ReduceOp op) {
  return op == ReduceOp::kSum || op == ReduceOp::kMean || op == ReduceOp::kProd;
}

}  // namespace dvm::ops
