// The simplifier's rewrite rules, as data.
//
// Each rule rewrites one operator application op(a, b) over canonical arguments into a
// simpler canonical expression, or declines. floordiv/mod try their rules in table order and
// build the atom when none applies; min/max try theirs on every pair of (flattened, sorted)
// arguments; kPoly rules look at a freshly built polynomial (a is the poly, b unused).
//
// Soundness contract: a rule's result equals op(a, b) for every binding of the symbols within
// their ranges where op(a, b) is defined (no division by zero). A rule may remove an undefined
// point (x*y//y = x also at y = 0), never add one. Results are built with the public
// operators, so they are canonical; every rule makes the expression strictly simpler, so the
// rewriting terminates.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>

#include "shape/sym_node.h"

namespace dvm::shape {

struct SymRule {
  SymKind op;           // kFloorDiv, kMod, kMin, kMax or kPoly
  const char* name;     // snake_case, unique
  const char* algebra;  // the identity and its side conditions
  std::optional<SymExpr> (*apply)(const SymExpr& a, const SymExpr& b);
};

// The table, in the order rules are tried.
std::span<const SymRule> sym_rules();
// How often rule `index` has fired in this process (for tests of rule coverage).
uint64_t sym_rule_hits(size_t index);

// The first rule for `op` (kFloorDiv, kMod or kPoly) that applies to (a, b), if any.
std::optional<SymExpr> apply_sym_rules(SymKind op, const SymExpr& a, const SymExpr& b);
// min/max: flattens nested applications of `op`, sorts, applies the pairwise rules until none
// fires, and returns the one argument left or the atom.
SymExpr simplify_min_max(SymKind op, const SymExpr& a, const SymExpr& b);

}  // namespace dvm::shape
