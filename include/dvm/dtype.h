// Element types of tensors and how the VM computes with them.
#pragma once

#include <cstdint>
#include <string_view>

namespace dvm {

// Storage dtypes. f16/bf16 are computed in f32 and rounded when stored; bool is stored as one
// byte (0 or 1) and computed as an i32 mask.
enum class DType : uint8_t { kF32 = 0, kF16, kBF16, kI32, kI64, kBool };
inline constexpr int kNumDTypes = 6;

// The types registers hold: every storage dtype computes in one of these.
enum class CType : uint8_t { kF32 = 0, kI32, kI64 };

constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kBool:
      return 1;
  }
  return 0;
}

constexpr CType compute_type(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return CType::kF32;
    case DType::kI32:
    case DType::kBool:
      return CType::kI32;
    case DType::kI64:
      return CType::kI64;
  }
  return CType::kF32;
}

constexpr bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}
constexpr bool is_integer(DType t) {
  return t == DType::kI32 || t == DType::kI64;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

constexpr std::string_view ctype_name(CType t) {
  switch (t) {
    case CType::kF32:
      return "f32";
    case CType::kI32:
      return "i32";
    case CType::kI64:
      return "i64";
  }
  return "?";
}

// The storage dtype a CType stores losslessly into.
constexpr DType ctype_dtype(CType t) {
  switch (t) {
    case CType::kF32:
      return DType::kF32;
    case CType::kI32:
      return DType::kI32;
    case CType::kI64:
      return DType::kI64;
  }
  return DType::kF32;
}

// Result dtype of a binary op on two tensors (a simplified torch promotion lattice:
// bool < i32 < i64 < f16, bf16 < f32; f16 with bf16 gives f32).
DType promote_types(DType a, DType b);

}  // namespace dvm
