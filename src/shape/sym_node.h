// The node behind a SymExpr, and the internal construction API that the simplifier, the
// printer and the parser share.
//
// Canonical form. An expression is a constant, an atom, or a polynomial:
//   constant  kConst
//   atom      kSymbol | kFloorDiv(a, b) | kMod(a, b) | kMin(a, b, ...) | kMax(a, b, ...)
//             | kAddRaw(a, b) | kMulRaw(a, b)
//   poly      c + k1*m1 + k2*m2 + ...   (kPoly)
// where each monomial m is a product of atoms (sorted, a power repeats its atom), the
// monomials are distinct and sorted (higher degree first, then lexicographically), every k is
// a nonzero int64 and the arguments of every atom are canonical themselves. A poly that is a
// bare constant or a single atom with coefficient 1 is stored as that constant or atom.
// kAddRaw/kMulRaw keep a sum or product as written when its canonical coefficients would
// overflow int64; evaluate() then reports the overflow.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dvm/sym.h"

namespace dvm::shape {

// Node kinds, in the order the canonical total order ranks them (constants last, so that
// min(s0, 512) reads as written).
enum class SymKind : uint8_t {
  kSymbol,    // name, range
  kFloorDiv,  // args {a, b}: floor(a / b)
  kMod,       // args {a, b}: a - b*floor(a / b), the sign of b
  kMin,       // args: two or more, sorted, distinct, none itself a kMin
  kMax,       // args: two or more, sorted, distinct, none itself a kMax
  kAddRaw,    // args {a, b}, sorted: a + b whose canonical sum overflows int64
  kMulRaw,    // args {a, b}, sorted: a * b whose canonical product overflows int64
  kPoly,      // value + sum of terms
  kConst,     // value
};

// coeff * factors[0] * factors[1] * ...
struct SymTerm {
  int64_t coeff = 0;
  std::vector<SymExpr> factors;
};

struct SymNode {
  SymKind kind = SymKind::kConst;
  int64_t value = 0;  // kConst: the value; kPoly: the constant term
  SymRange range;     // contains every value the expression takes
  size_t hash = 0;
  // Nodes of the expression as a tree (shared subexpressions counted at every use; saturates):
  // what printing, parsing back and tree walks cost. Rules that would copy a subexpression
  // bound it by this (see kMaxDuplicatedSize), so no chain of rewrites grows exponentially.
  uint32_t tree_size = 1;
  std::string name;            // kSymbol
  std::vector<SymExpr> args;   // atoms other than symbols
  std::vector<SymTerm> terms;  // kPoly: one or more

  // Computes the range (except for symbols, which carry theirs) and the hash, and wraps the
  // node. The caller guarantees that the node is in canonical form.
  static SymExpr make(SymNode node);
};

// Largest tree (SymNode::tree_size) a rewrite may write twice: splitting c*X into
// d*(c//d)*X + (c%d)*X copies X, and a chain of such splits over their own results doubles the
// text each time (a fuzzer found 400 operations printing to 21 MB).
inline constexpr uint32_t kMaxDuplicatedSize = 32;

// The canonical strict total order: <0, 0 or >0.
int compare(const SymExpr& a, const SymExpr& b);
// Order of monomials in a poly: higher degree first, then lexicographic by factor.
int compare_monomials(std::span<const SymExpr> a, std::span<const SymExpr> b);

// An atom node (kFloorDiv, kMod, kMin, kMax, kAddRaw, kMulRaw) over canonical arguments, with
// no simplification.
SymExpr make_atom(SymKind kind, std::vector<SymExpr> args);
// A poly from terms already sorted with distinct monomials; drops zero coefficients, returns
// a constant or a lone atom when that is what remains, and applies the poly rules.
SymExpr make_poly_sorted(int64_t constant, std::vector<SymTerm> terms);
// Like make_poly_sorted for terms in any order, merging like terms; nullopt when a merged
// coefficient overflows int64.
std::optional<SymExpr> make_poly(int64_t constant, std::vector<SymTerm> terms);
// coeff * x, kept exact (kMulRaw when a coefficient overflows).
SymExpr scale(const SymExpr& x, int64_t coeff);

// Any expression seen as a polynomial: a constant has no terms, an atom is one term 1*atom.
// Borrows `e`, which must outlive the view.
class PolyView {
 public:
  explicit PolyView(const SymExpr& e);
  int64_t constant() const { return constant_; }
  size_t size() const { return terms_ ? terms_->size() : (atom_ ? 1 : 0); }
  int64_t coeff(size_t i) const { return terms_ ? (*terms_)[i].coeff : 1; }
  std::span<const SymExpr> factors(size_t i) const {
    return terms_ ? std::span<const SymExpr>((*terms_)[i].factors)
                  : std::span<const SymExpr>(atom_, 1);
  }

 private:
  int64_t constant_ = 0;
  const std::vector<SymTerm>* terms_ = nullptr;
  const SymExpr* atom_ = nullptr;
};

// Nodes of the monomial `factors` as a tree (see SymNode::tree_size).
uint64_t monomial_size(std::span<const SymExpr> factors);
// Nodes of the tree a*b would have, distributed into a poly (a, b not constants).
uint64_t distributed_size(const PolyView& a, const PolyView& b);

// Python semantics: floor_div rounds toward -inf (b != 0, not INT64_MIN / -1); floor_mod has
// the sign of b (b != 0).
int64_t floor_div(int64_t a, int64_t b);
int64_t floor_mod(int64_t a, int64_t b);

}  // namespace dvm::shape
