// Symbolic integer expressions for tensor dimensions: s0, s0*s1, (s0+1)//2, min(s0, 512), ...
//
// A SymExpr is an immutable value (cheap to copy, shared). Every constructor and operator
// returns the canonical simplified form, so expressions that the simplifier proves equal
// compare equal with ==: `s0*s1 == s1*s0`, `(s0*4)//2 == s0*2`. Equality is structural on the
// canonical form: `a == b` true means equal for every binding; false means "not proven".
// "Every binding" means every binding within the symbols' ranges where the expression as
// written is defined: simplification may drop a division by zero (`s0*s1//s1 == s0`), never
// add one. A sum or product whose canonical coefficients would overflow int64 is kept as
// written (evaluate() then reports the overflow). The rules: src/shape/sym_rules.cc.
//
// Symbols are identified by name and carry a range [lo, hi] of the values they may take
// (default [0, kSymMax]); the simplifier uses ranges (e.g. `s0 // 1024 == 0` when s0 < 1024)
// and evaluate() rejects bindings outside them. Two symbols with the same name must carry the
// same range.
//
// Thread-safety: SymExpr values are immutable and may be shared across threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dvm/status.h"

namespace dvm {

inline constexpr int64_t kSymMax = int64_t{1} << 40;

struct SymRange {
  int64_t lo = 0;
  int64_t hi = kSymMax;
};

// Values for symbols, by name.
using SymBindings = std::map<std::string, int64_t, std::less<>>;

namespace shape {
struct SymNode;
}

class SymExpr {
 public:
  SymExpr();                  // the constant 0
  SymExpr(int64_t constant);  // NOLINT: implicit, so shapes read {s0, 768}
  // `name` must be an identifier and range.lo <= range.hi (DVM_CHECKed: callers taking names
  // or ranges from users check them first with validate_symbol).
  static SymExpr symbol(std::string_view name, SymRange range = {});
  // OK when symbol(name, range) may be called; else an error naming the symbol.
  static Status validate_symbol(std::string_view name, SymRange range);

  bool is_constant() const;
  int64_t constant_value() const;  // DVM_CHECKs is_constant()
  bool is_symbol() const;
  const std::string& symbol_name() const;  // DVM_CHECKs is_symbol()

  // Interval that contains every value the expression can take (from the symbols' ranges).
  SymRange range() const;

  friend SymExpr operator+(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator-(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator*(const SymExpr& a, const SymExpr& b);
  friend SymExpr floordiv(const SymExpr& a, const SymExpr& b);  // rounds toward -inf
  friend SymExpr mod(const SymExpr& a, const SymExpr& b);       // sign of the divisor
  friend SymExpr min(const SymExpr& a, const SymExpr& b);
  friend SymExpr max(const SymExpr& a, const SymExpr& b);

  bool operator==(const SymExpr& o) const;
  bool operator!=(const SymExpr& o) const { return !(*this == o); }
  // A strict total order on canonical forms (for maps and sorted containers).
  bool operator<(const SymExpr& o) const;
  size_t hash() const;

  // Text form that parse_sym_expr() reads back to an equal expression:
  // "s0*s1 + 3", "(s0 + 1)//2", "s0 % 4", "min(s0, 512)". Symbol ranges are not printed.
  std::string to_string() const;

  // Names of the symbols it mentions, sorted, without duplicates.
  std::vector<std::string> symbols() const;

  // Value for a binding. Errors (Status, naming the expression): unbound symbol, a value
  // outside its symbol's range, division or modulo by zero, int64 overflow.
  StatusOr<int64_t> evaluate(const SymBindings& bindings) const;

  const shape::SymNode& node() const { return *node_; }

 private:
  explicit SymExpr(std::shared_ptr<const shape::SymNode> node);
  std::shared_ptr<const shape::SymNode> node_;
  friend struct shape::SymNode;
};

// Parses the text form. Symbols get their range from `ranges` when listed there, the default
// range otherwise. Errors name the offending position.
StatusOr<SymExpr> parse_sym_expr(std::string_view text,
                                 const std::map<std::string, SymRange, std::less<>>& ranges = {});

using SymShape = std::vector<SymExpr>;

std::string to_string(const SymShape& shape);  // "[s0, 768]"

}  // namespace dvm

template <>
struct std::hash<dvm::SymExpr> {
  size_t operator()(const dvm::SymExpr& e) const { return e.hash(); }
};
