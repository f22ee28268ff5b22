// Bindings for dvm/dtype.h: DType and CType (member names derived from dtype_name /
// ctype_name), sizes, classification and promotion, and the DLPack element-type mapping used
// when tensors cross into DVM.
#include <nanobind/stl/string.h>

#include <cctype>
#include <string>

#include "bindings.h"

namespace dvm::python {

StatusOr<DType> dtype_from_dlpack(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  auto code = static_cast<Code>(t.code);
  if (t.lanes == 1) {
    if (code == Code::Float && t.bits == 32) return DType::kF32;
    if (code == Code::Float && t.bits == 16) return DType::kF16;
    if (code == Code::Bfloat && t.bits == 16) return DType::kBF16;
    if (code == Code::Int && t.bits == 32) return DType::kI32;
    if (code == Code::Int && t.bits == 64) return DType::kI64;
    if (code == Code::Bool && t.bits == 8) return DType::kBool;
  }
  return invalid_argument("unsupported element type (DLPack code " + std::to_string(t.code) + ", " +
                          std::to_string(t.bits) +
                          " bits); DVM stores f32, f16, bf16, "
                          "i32, i64 and bool");
}

namespace {

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

void bind_dtype(nb::module_& m) {
  nb::enum_<DType> dtype(m, "DType", "Storage element types (f16/bf16 compute in f32).");
  for (int i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    dtype.value(upper(dtype_name(t)).c_str(), t);
  }
  nb::enum_<CType> ctype(m, "CType", "The types VM registers compute in.");
  for (CType t : {CType::kF32, CType::kI32, CType::kI64}) {
    ctype.value(upper(ctype_name(t)).c_str(), t);
  }

  m.def("dtype_size", &dtype_size, nb::arg("dtype"), "Bytes per element.");
  m.def(
      "dtype_name", [](DType t) { return std::string(dtype_name(t)); }, nb::arg("dtype"));
  m.def("compute_type", &compute_type, nb::arg("dtype"));
  m.def("is_float", &is_float, nb::arg("dtype"));
  m.def("is_integer", &is_integer, nb::arg("dtype"));
  m.def("promote_types", &promote_types, nb::arg("a"), nb::arg("b"),
        "Result dtype of a binary op on two tensors of these dtypes.");
}

}  // namespace dvm::python
