// Fuzz target: the symbolic simplifier. The input is a program for a small stack machine that
// builds a SymExpr over three symbols (with ranges from the input) from constants, +, -, *,
// floordiv, mod, min and max, and evaluates the same expression directly in 128-bit integers
// at a binding inside the ranges.
//
// Invariants: the simplified expression evaluates to the direct value (or reports an error
// exactly where the direct evaluation divides by zero or leaves int64); its range() holds the
// value; its text form parses back to an equal expression with the same value.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dvm/sym.h"
#include "fuzz_util.h"

namespace {

using I128 = __int128;
using dvm::fuzz::Reader;

struct Item {
  dvm::SymExpr expr;
  std::optional<I128> value;  // none: undefined (division by zero or int64 overflow)
};

std::optional<I128> checked(I128 v) {
  if (v > INT64_MAX || v < INT64_MIN) return std::nullopt;
  return v;
}

I128 floor_div(I128 a, I128 b) {
  I128 q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 512) return 0;
  Reader in{data, size};
  const char* names[3] = {"a", "b", "c"};
  std::map<std::string, dvm::SymRange, std::less<>> ranges;
  dvm::SymBindings bindings;
  std::vector<Item> symbols;
  for (const char* n : names) {
    const int64_t lo = in.next() % 5;
    const uint8_t h = in.next();
    const int64_t hi = h >= 250 ? dvm::kSymMax : lo + h % 40;
    const int64_t v = lo + in.next() % (std::min<int64_t>(hi, lo + 60) - lo + 1);
    ranges[n] = {lo, hi};
    bindings[n] = v;
    symbols.push_back({dvm::SymExpr::symbol(n, {lo, hi}), I128{v}});
  }
  std::vector<Item> stack;
  int ops = 0;
  while (!in.done() && ops++ < 200) {
    const uint8_t op = in.next() % 11;
    if (op == 0) {  // a constant in [-64, 191]
      const int64_t c = static_cast<int64_t>(in.next()) - 64;
      stack.push_back({dvm::SymExpr(c), I128{c}});
      continue;
    }
    if (op == 1) {  // a large constant (overflow paths)
      const int64_t c = (int64_t{1} << (in.next() % 63)) - (in.next() % 3);
      stack.push_back({dvm::SymExpr(c), I128{c}});
      continue;
    }
    if (op <= 4) {
      if (stack.size() < 64) stack.push_back(symbols[op - 2]);
      continue;
    }
    if (stack.size() < 2) continue;
    Item b = stack.back();
    stack.pop_back();
    Item a = stack.back();
    stack.pop_back();
    const bool defined = a.value && b.value;
    const I128 x = defined ? *a.value : 0, y = defined ? *b.value : 1;
    Item r;
    switch (op) {
      case 5:
        r = {a.expr + b.expr, defined ? checked(x + y) : std::nullopt};
        break;
      case 6:
        r = {a.expr - b.expr, defined ? checked(x - y) : std::nullopt};
        break;
      case 7:
        r = {a.expr * b.expr, defined ? checked(x * y) : std::nullopt};
        break;
      case 8:
        r = {floordiv(a.expr, b.expr), defined && y != 0 ? checked(floor_div(x, y)) : std::nullopt};
        break;
      case 9:
        r = {mod(a.expr, b.expr),
             defined && y != 0 ? checked(x - floor_div(x, y) * y) : std::nullopt};
        break;
      default:
        r = in.next() & 1 ? Item{min(a.expr, b.expr),
                                 defined ? std::optional<I128>(std::min(x, y)) : std::nullopt}
                          : Item{max(a.expr, b.expr),
                                 defined ? std::optional<I128>(std::max(x, y)) : std::nullopt};
        break;
    }
    stack.push_back(std::move(r));
  }
  for (const Item& it : stack) {
    auto got = it.expr.evaluate(bindings);
    if (it.value) {
      // A defined value must evaluate, unless an intermediate of the simplified form leaves
      // int64 where the direct order of operations did not (reported, never wrong).
      if (got.is_ok() && I128{*got} != *it.value) dvm::fuzz::fail("evaluates to a wrong value");
      if (got.is_ok()) {
        const dvm::SymRange r = it.expr.range();
        if (*got < r.lo || *got > r.hi) dvm::fuzz::fail("value outside range()");
      }
    }
    const std::string text = it.expr.to_string();
    auto back = dvm::parse_sym_expr(text, ranges);
    if (!back.is_ok()) dvm::fuzz::fail("to_string() does not parse back");
    if (*back != it.expr) dvm::fuzz::fail("parse(to_string(e)) != e");
    auto again = back->evaluate(bindings);
    if (again.is_ok() != got.is_ok() || (got.is_ok() && *again != *got)) {
      dvm::fuzz::fail("the parsed text evaluates differently");
    }
  }
  return 0;
}
