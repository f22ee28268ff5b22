// Bindings for dvm/status.h: StatusCode, and the one place where a Status becomes a Python
// exception (`dvm.DvmError`, with `.code` and `.message`).
#include <nanobind/stl/string.h>

#include <cctype>

#include "bindings.h"

namespace dvm::python {

std::string upper_snake(std::string_view camel) {
  auto at = [&](size_t i) { return static_cast<unsigned char>(camel[i]); };
  std::string out;
  for (size_t i = 0; i < camel.size(); ++i) {
    // A word starts at a capital after a lower-case letter or digit ("GeluErf"), or at the
    // last capital of an acronym followed by lower case ("HTTPServer"); "OK" stays one word.
    bool starts_word =
        i > 0 && std::isupper(at(i)) &&
        (std::islower(at(i - 1)) || std::isdigit(at(i - 1)) ||
         (std::isupper(at(i - 1)) && i + 1 < camel.size() && std::islower(at(i + 1))));
    if (starts_word) out.push_back('_');
    out.push_back(static_cast<char>(std::toupper(at(i))));
  }
  return out;
}

namespace {

PyObject* g_dvm_error = nullptr;  // the exception type; owned by the module once added

void translate_status_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const StatusError& e) {
    set_python_error(e.status());
  }
}

}  // namespace

nb::str utf8_text(const std::string& s) {
  PyObject* u = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (u == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(u);
}

nb::list utf8_texts(const std::vector<std::string>& v) {
  nb::list out;
  for (const std::string& s : v) out.append(utf8_text(s));
  return out;
}

void set_python_error(const Status& status) {
  nb::object type = nb::borrow(g_dvm_error);
  nb::object error = type(utf8_text(status.to_string()));
  error.attr("code") = status.code();
  error.attr("message") = utf8_text(status.message());
  PyErr_SetObject(g_dvm_error, error.ptr());
}

void bind_status(nb::module_& m) {
  nb::enum_<StatusCode> code(m, "StatusCode");
  // status.h has no X-macro table; kInternal is its last code.
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    auto sc = static_cast<StatusCode>(c);
    code.value(upper_snake(status_code_name(sc)).c_str(), sc);
  }

  g_dvm_error = PyErr_NewExceptionWithDoc(
      "dvm.DvmError",
      "An error a caller can cause (bad shapes, dtypes, arguments), raised from a DVM Status.\n"
      "str(e) is 'Code: message'; e.code is a dvm.StatusCode, e.message the Status message.",
      PyExc_Exception, nullptr);
  if (g_dvm_error == nullptr) throw nb::python_error();
  m.attr("DvmError") = nb::steal(g_dvm_error);
  nb::register_exception_translator(translate_status_error);

  m.def("status_code_name", &status_code_name, nb::arg("code"));
}

}  // namespace dvm::python
