// Result dtypes of ops (torch-style promotion): the rules the kernel builder, the graph IR's
// shape inference and the lazy runtime all apply.
#pragma once

#include "dvm/dtype.h"
#include "ops/op_traits.h"

namespace dvm::ops {

// The dtype floating-point ops compute and return for inputs of dtype t.
constexpr DType float_dtype(DType t) {
  return is_float(t) ? t : DType::kF32;
}

// The dtype a unary op computes in for an input of dtype t: f32 for float-only ops on
// integers, i32 for arithmetic on bools; predicates read any dtype as it is.
constexpr DType unary_operand_dtype(UnaryOp op, DType t) {
  if (is_float_only(op) && !is_float(t)) return DType::kF32;
  if (t == DType::kBool && !is_predicate(op)) return DType::kI32;
  return t;
}

// A unary op's result: bool for predicates, else the dtype it computes in.
constexpr DType unary_result_dtype(UnaryOp op, DType t) {
  return is_predicate(op) ? DType::kBool : unary_operand_dtype(op, t);
}

// The dtype a binary op's operands are converted to: bool for logical ops, f32 for true
// division of integers, i32 for arithmetic on bools, else the promoted dtype.
inline DType binary_operand_dtype(BinaryOp op, DType a, DType b) {
  DType t = promote_types(a, b);
  if (is_logical(op)) return DType::kBool;
  if (op == BinaryOp::kDiv && !is_float(t)) return DType::kF32;
  if (!returns_bool(op) && t == DType::kBool) return DType::kI32;
  return t;
}

// A binary op's result: bool for comparisons and logical ops, else its operand dtype.
inline DType binary_result_dtype(BinaryOp op, DType a, DType b) {
  return returns_bool(op) ? DType::kBool : binary_operand_dtype(op, a, b);
}

// The dtype a reduction computes in for an input of dtype t: f32 for the mean of integers;
// for bools (as torch) i64 counts for sum and prod, i32 for max and min.
constexpr DType reduce_compute_dtype(ReduceOp op, DType t) {
  if (op == ReduceOp::kMean && !is_float(t)) return DType::kF32;
  if (t == DType::kBool && !is_arg_reduce(op)) {
    return op == ReduceOp::kSum || op == ReduceOp::kProd ? DType::kI64 : DType::kI32;
  }
  return t;
}

// A reduction's result: i64 indices for the arg reductions, bool for max/min of bools, else
// the dtype it computes in.
constexpr DType reduce_result_dtype(ReduceOp op, DType t) {
  if (is_arg_reduce(op)) return DType::kI64;
  if (t == DType::kBool && (op == ReduceOp::kMax || op == ReduceOp::kMin)) return DType::kBool;
  return reduce_compute_dtype(op, t);
}

}  // namespace dvm::ops
