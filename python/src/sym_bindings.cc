// Bindings for dvm/sym.h: SymExpr with Python arithmetic (ints convert implicitly), ranges,
// evaluation and parsing.
#include <nanobind/operators.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "dvm/sym.h"

namespace dvm::python {

void bind_sym(nb::module_& m) {
  nb::class_<SymExpr>(m, "SymExpr",
                      "A symbolic integer expression (dims such as s0, s0*s1, (s0+1)//2), kept "
                      "in a canonical form: equal expressions compare equal.")
      .def(nb::init<>())
      .def(nb::init_implicit<int64_t>())
      .def_static(
          "symbol",
          [](const std::string& name, int64_t lo, int64_t hi) {
            raise_if_error(SymExpr::validate_symbol(name, SymRange{lo, hi}));
            return SymExpr::symbol(name, SymRange{lo, hi});
          },
          nb::arg("name"), nb::arg("lo") = 0, nb::arg("hi") = kSymMax)
      .def("is_constant", &SymExpr::is_constant)
      .def("constant_value",
           [](const SymExpr& e) {
             if (!e.is_constant()) {
               throw StatusError(invalid_argument(e.to_string() + " is not a constant"));
             }
             return e.constant_value();
           })
      .def("is_symbol", &SymExpr::is_symbol)
      .def("symbol_name",
           [](const SymExpr& e) {
             if (!e.is_symbol()) {
               throw StatusError(invalid_argument(e.to_string() + " is not a symbol"));
             }
             return e.symbol_name();
           })
      .def("range", [](const SymExpr& e) { return std::make_pair(e.range().lo, e.range().hi); })
      .def("symbols", &SymExpr::symbols)
      .def(
          "evaluate",
          [](const SymExpr& e, const std::map<std::string, int64_t>& b) {
            SymBindings bindings(b.begin(), b.end());
            return value_or_raise(e.evaluate(bindings));
          },
          nb::arg("bindings"))
      .def(nb::self + nb::self)
      .def(nb::self - nb::self)
      .def(nb::self * nb::self)
      .def("__radd__", [](const SymExpr& a, const SymExpr& b) { return b + a; })
      .def("__rsub__", [](const SymExpr& a, const SymExpr& b) { return b - a; })
      .def("__rmul__", [](const SymExpr& a, const SymExpr& b) { return b * a; })
      .def("__floordiv__", [](const SymExpr& a, const SymExpr& b) { return floordiv(a, b); })
      .def("__rfloordiv__", [](const SymExpr& a, const SymExpr& b) { return floordiv(b, a); })
      .def("__mod__", [](const SymExpr& a, const SymExpr& b) { return mod(a, b); })
      .def("__rmod__", [](const SymExpr& a, const SymExpr& b) { return mod(b, a); })
      .def("__neg__", [](const SymExpr& a) { return SymExpr(0) - a; })
      .def("__eq__", [](const SymExpr& a, const SymExpr& b) { return a == b; })
      .def("__ne__", [](const SymExpr& a, const SymExpr& b) { return a != b; })
      .def("__lt__", [](const SymExpr& a, const SymExpr& b) { return a < b; })
      .def("__hash__", [](const SymExpr& a) { return a.hash(); })
      .def("__str__", &SymExpr::to_string)
      .def("__repr__", [](const SymExpr& a) { return "SymExpr(" + a.to_string() + ")"; })
      .def("__int__", [](const SymExpr& e) {
        if (!e.is_constant()) throw StatusError(invalid_argument(e.to_string() + " is symbolic"));
        return e.constant_value();
      });
  m.def("sym_min", [](const SymExpr& a, const SymExpr& b) { return min(a, b); });
  m.def("sym_max", [](const SymExpr& a, const SymExpr& b) { return max(a, b); });
  m.def(
      "parse_sym_expr",
      [](const std::string& text) { return value_or_raise(parse_sym_expr(text)); },
      nb::arg("text"));
  m.attr("SYM_MAX") = kSymMax;
}

}  // namespace dvm::python
