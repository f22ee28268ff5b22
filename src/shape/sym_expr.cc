// SymExpr: construction of the canonical form (polynomial arithmetic here, the rules for
// floordiv/mod/min/max in sym_rules.cc), the canonical order and hash, printing and
// evaluation.
#include <algorithm>
#include <cctype>

#include "dvm/sym.h"
#include "shape/sym_node.h"
#include "shape/sym_range.h"
#include "shape/sym_rules.h"

namespace dvm {
namespace shape {
namespace {

template <typename T>
int cmp3(T a, T b) {
  return a < b ? -1 : (b < a ? 1 : 0);
}

size_t mix(size_t h, uint64_t v) {
  // splitmix64 finaliser over a running combination: cheap and well spread.
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<size_t>(z ^ (z >> 31));
}

size_t hash_name(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a: the same on every platform
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return static_cast<size_t>(h);
}

size_t hash_node(const SymNode& n) {
  size_t h = mix(static_cast<size_t>(n.kind), static_cast<uint64_t>(n.value));
  if (n.kind == SymKind::kSymbol) {
    h = mix(h, hash_name(n.name));
    h = mix(mix(h, static_cast<uint64_t>(n.range.lo)), static_cast<uint64_t>(n.range.hi));
  }
  for (const SymExpr& a : n.args) h = mix(h, a.hash());
  for (const SymTerm& t : n.terms) {
    h = mix(h, static_cast<uint64_t>(t.coeff));
    for (const SymExpr& f : t.factors) h = mix(h, f.hash());
  }
  return h;
}

uint32_t count_tree_size(const SymNode& n) {
  uint64_t size = 1 + monomial_size(n.args);
  for (const SymTerm& t : n.terms) size += 1 + monomial_size(t.factors);  // 1: the coefficient
  return static_cast<uint32_t>(std::min<uint64_t>(size, UINT32_MAX));
}

SymRange monomial_range(std::span<const SymExpr> factors) {
  SymRange r{1, 1};
  for (size_t i = 0; i < factors.size();) {
    size_t j = i + 1;
    while (j < factors.size() && factors[j] == factors[i]) ++j;
    r = range_mul(r, range_pow(factors[i].range(), static_cast<int>(j - i)));
    i = j;
  }
  return r;
}

SymRange node_range(const SymNode& n) {
  switch (n.kind) {
    case SymKind::kConst:
      return {n.value, n.value};
    case SymKind::kSymbol:
      return n.range;
    case SymKind::kFloorDiv:
      return range_floordiv(n.args[0].range(), n.args[1].range());
    case SymKind::kMod:
      return range_mod(n.args[0].range(), n.args[1].range());
    case SymKind::kMin:
    case SymKind::kMax: {
      SymRange r = n.args[0].range();
      for (size_t i = 1; i < n.args.size(); ++i) {
        r = n.kind == SymKind::kMin ? range_min(r, n.args[i].range())
                                    : range_max(r, n.args[i].range());
      }
      return r;
    }
    case SymKind::kAddRaw:
      return range_add(n.args[0].range(), n.args[1].range());
    case SymKind::kMulRaw:
      return range_mul(n.args[0].range(), n.args[1].range());
    case SymKind::kPoly: {
      SymRange r{n.value, n.value};
      for (const SymTerm& t : n.terms) {
        r = range_add(r, range_mul({t.coeff, t.coeff}, monomial_range(t.factors)));
      }
      return r;
    }
  }
  return {kNegInf, kPosInf};
}

int compare_args(const std::vector<SymExpr>& a, const std::vector<SymExpr>& b) {
  if (a.size() != b.size()) return cmp3(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (int c = compare(a[i], b[i])) return c;
  }
  return 0;
}

int compare_polys(const SymNode& x, const SymNode& y) {
  if (x.terms.size() != y.terms.size()) return cmp3(x.terms.size(), y.terms.size());
  for (size_t i = 0; i < x.terms.size(); ++i) {
    if (int c = compare_monomials(x.terms[i].factors, y.terms[i].factors)) return c;
    if (int c = cmp3(x.terms[i].coeff, y.terms[i].coeff)) return c;
  }
  return cmp3(x.value, y.value);
}

// Small constants are shared: shapes and strides are full of them.
constexpr int64_t kCacheLo = -64;
constexpr int64_t kCacheHi = 1024;

const std::vector<SymExpr>& constant_cache() {
  static const std::vector<SymExpr>* cache = [] {
    auto* v = new std::vector<SymExpr>();
    v->reserve(kCacheHi - kCacheLo + 1);
    for (int64_t c = kCacheLo; c <= kCacheHi; ++c) {
      SymNode n;
      n.value = c;
      v->push_back(SymNode::make(std::move(n)));
    }
    return v;
  }();
  return *cache;
}

SymExpr raw(SymKind kind, const SymExpr& a, const SymExpr& b) {
  if (compare(a, b) <= 0) return make_atom(kind, {a, b});
  return make_atom(kind, {b, a});
}

std::vector<SymExpr> merge_factors(std::span<const SymExpr> a, std::span<const SymExpr> b) {
  std::vector<SymExpr> out;
  out.reserve(a.size() + b.size());
  std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out),
             [](const SymExpr& x, const SymExpr& y) { return compare(x, y) < 0; });
  return out;
}

bool is_identifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) {
    return false;
  }
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace

int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;  // INT64_MIN % -1 overflows in C++
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

SymExpr SymNode::make(SymNode node) {
  auto p = std::make_shared<SymNode>(std::move(node));
  if (p->kind != SymKind::kSymbol) p->range = node_range(*p);
  p->hash = hash_node(*p);
  p->tree_size = count_tree_size(*p);
  return SymExpr(std::shared_ptr<const SymNode>(std::move(p)));
}

uint64_t monomial_size(std::span<const SymExpr> factors) {
  uint64_t size = 0;
  for (const SymExpr& f : factors) size += f.node().tree_size;
  return size;
}

uint64_t distributed_size(const PolyView& a, const PolyView& b) {
  // Each term of a meets each term of b and b's constant: (|b| + 1) copies of a's monomials,
  // and the same of b's; one coefficient per term.
  uint64_t a_nodes = a.size(), b_nodes = b.size();
  for (size_t i = 0; i < a.size(); ++i) a_nodes += monomial_size(a.factors(i));
  for (size_t j = 0; j < b.size(); ++j) b_nodes += monomial_size(b.factors(j));
  return (b.size() + 1) * a_nodes + (a.size() + 1) * b_nodes;
}

int compare_monomials(std::span<const SymExpr> a, std::span<const SymExpr> b) {
  if (a.size() != b.size()) return a.size() > b.size() ? -1 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (int c = compare(a[i], b[i])) return c;
  }
  return 0;
}

int compare(const SymExpr& a, const SymExpr& b) {
  const SymNode& x = a.node();
  const SymNode& y = b.node();
  if (&x == &y) return 0;
  if (x.kind != y.kind) return cmp3(x.kind, y.kind);
  switch (x.kind) {
    case SymKind::kConst:
      return cmp3(x.value, y.value);
    case SymKind::kSymbol:
      // Shorter names first, so s2 < s10.
      if (int c = cmp3(x.name.size(), y.name.size())) return c;
      if (int c = x.name.compare(y.name)) return c < 0 ? -1 : 1;
      if (int c = cmp3(x.range.lo, y.range.lo)) return c;
      return cmp3(x.range.hi, y.range.hi);
    case SymKind::kPoly:
      return compare_polys(x, y);
    default:
      return compare_args(x.args, y.args);
  }
}

SymExpr make_atom(SymKind kind, std::vector<SymExpr> args) {
  SymNode n;
  n.kind = kind;
  n.args = std::move(args);
  return SymNode::make(std::move(n));
}

SymExpr make_poly_sorted(int64_t constant, std::vector<SymTerm> terms) {
  std::erase_if(terms, [](const SymTerm& t) { return t.coeff == 0; });
  if (terms.empty()) return SymExpr(constant);
  if (constant == 0 && terms.size() == 1 && terms[0].coeff == 1 && terms[0].factors.size() == 1) {
    return terms[0].factors[0];
  }
  SymNode n;
  n.kind = SymKind::kPoly;
  n.value = constant;
  n.terms = std::move(terms);
  SymExpr p = SymNode::make(std::move(n));
  if (auto r = apply_sym_rules(SymKind::kPoly, p, p)) return *r;
  return p;
}

std::optional<SymExpr> make_poly(int64_t constant, std::vector<SymTerm> terms) {
  std::sort(terms.begin(), terms.end(), [](const SymTerm& x, const SymTerm& y) {
    return compare_monomials(x.factors, y.factors) < 0;
  });
  size_t out = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    if (out > 0 && compare_monomials(terms[out - 1].factors, terms[i].factors) == 0) {
      if (__builtin_add_overflow(terms[out - 1].coeff, terms[i].coeff, &terms[out - 1].coeff)) {
        return std::nullopt;
      }
    } else {
      if (out != i) terms[out] = std::move(terms[i]);
      ++out;
    }
  }
  terms.resize(out);
  return make_poly_sorted(constant, std::move(terms));
}

SymExpr scale(const SymExpr& x, int64_t coeff) {
  if (coeff == 1) return x;
  if (coeff == 0) return SymExpr(0);
  const PolyView v(x);
  int64_t c = 0;
  if (__builtin_mul_overflow(v.constant(), coeff, &c)) return raw(SymKind::kMulRaw, x, coeff);
  std::vector<SymTerm> terms;
  terms.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t k = 0;
    if (__builtin_mul_overflow(v.coeff(i), coeff, &k)) return raw(SymKind::kMulRaw, x, coeff);
    terms.push_back({k, {v.factors(i).begin(), v.factors(i).end()}});
  }
  return make_poly_sorted(c, std::move(terms));
}

PolyView::PolyView(const SymExpr& e) {
  const SymNode& n = e.node();
  if (n.kind == SymKind::kConst) {
    constant_ = n.value;
  } else if (n.kind == SymKind::kPoly) {
    constant_ = n.value;
    terms_ = &n.terms;
  } else {
    atom_ = &e;
  }
}

}  // namespace shape

using shape::SymKind;
using shape::SymNode;

SymExpr::SymExpr() : SymExpr(0) {}

SymExpr::SymExpr(int64_t constant) {
  if (constant >= shape::kCacheLo && constant <= shape::kCacheHi) {
    node_ = shape::constant_cache()[static_cast<size_t>(constant - shape::kCacheLo)].node_;
    return;
  }
  SymNode n;
  n.value = constant;
  node_ = SymNode::make(std::move(n)).node_;
}

SymExpr::SymExpr(std::shared_ptr<const shape::SymNode> node) : node_(std::move(node)) {}

Status SymExpr::validate_symbol(std::string_view name, SymRange range) {
  if (!shape::is_identifier(name)) {
    return invalid_argument("symbol name '" + std::string(name) + "' is not an identifier");
  }
  if (range.lo > range.hi) {
    return invalid_argument("symbol '" + std::string(name) + "' has an empty range [" +
                            std::to_string(range.lo) + ", " + std::to_string(range.hi) + "]");
  }
  return Status::ok();
}

SymExpr SymExpr::symbol(std::string_view name, SymRange range) {
  Status valid = validate_symbol(name, range);
  DVM_CHECK_MSG(valid.is_ok(), valid.message());
  SymNode n;
  n.kind = SymKind::kSymbol;
  n.name = std::string(name);
  n.range = range;
  return SymNode::make(std::move(n));
}

bool SymExpr::is_constant() const {
  return node_->kind == SymKind::kConst;
}

int64_t SymExpr::constant_value() const {
  DVM_CHECK(is_constant());
  return node_->value;
}

bool SymExpr::is_symbol() const {
  return node_->kind == SymKind::kSymbol;
}

const std::string& SymExpr::symbol_name() const {
  DVM_CHECK(is_symbol());
  return node_->name;
}

SymRange SymExpr::range() const {
  return node_->range;
}

SymExpr operator+(const SymExpr& a, const SymExpr& b) {
  if (a.is_constant() && b.is_constant()) {
    int64_t s = 0;
    if (__builtin_add_overflow(a.node_->value, b.node_->value, &s)) {
      return shape::raw(SymKind::kAddRaw, a, b);
    }
    return SymExpr(s);
  }
  if (a.is_constant() && a.node_->value == 0) return b;
  if (b.is_constant() && b.node_->value == 0) return a;
  const shape::PolyView va(a), vb(b);
  int64_t c = 0;
  if (__builtin_add_overflow(va.constant(), vb.constant(), &c)) {
    return shape::raw(SymKind::kAddRaw, a, b);
  }
  std::vector<shape::SymTerm> terms;
  terms.reserve(va.size() + vb.size());
  size_t i = 0, j = 0;
  while (i < va.size() || j < vb.size()) {
    const int order = i == va.size()   ? 1
                      : j == vb.size() ? -1
                                       : shape::compare_monomials(va.factors(i), vb.factors(j));
    if (order < 0) {
      terms.push_back({va.coeff(i), {va.factors(i).begin(), va.factors(i).end()}});
      ++i;
    } else if (order > 0) {
      terms.push_back({vb.coeff(j), {vb.factors(j).begin(), vb.factors(j).end()}});
      ++j;
    } else {
      int64_t k = 0;
      if (__builtin_add_overflow(va.coeff(i), vb.coeff(j), &k)) {
        return shape::raw(SymKind::kAddRaw, a, b);
      }
      if (k != 0) terms.push_back({k, {va.factors(i).begin(), va.factors(i).end()}});
      ++i;
      ++j;
    }
  }
  return shape::make_poly_sorted(c, std::move(terms));
}

SymExpr operator-(const SymExpr& a, const SymExpr& b) {
  return a + shape::scale(b, -1);
}

SymExpr operator*(const SymExpr& a, const SymExpr& b) {
  if (a.is_constant()) return shape::scale(b, a.node_->value);
  if (b.is_constant()) return shape::scale(a, b.node_->value);
  const shape::PolyView va(a), vb(b);
  // Distributing multiplies the terms and copies every monomial of one side into each term of
  // the other: a product of sums squared again and again grew exponentially (a fuzzed program
  // of 200 stack ops: 70 s and 1 GiB for one expression), and so did products of such
  // products nested in quotients (8 MB of text). Past kMaxProductTerms terms or
  // kMaxProductSize nodes the product stays as written (kMulRaw), as on overflow; shape
  // arithmetic stays far below both.
  constexpr size_t kMaxProductTerms = 64;
  constexpr uint64_t kMaxProductSize = 1024;
  if ((va.size() + 1) * (vb.size() + 1) > kMaxProductTerms ||
      shape::distributed_size(va, vb) > kMaxProductSize) {
    return shape::raw(SymKind::kMulRaw, a, b);
  }
  const int64_t ca = va.constant(), cb = vb.constant();
  std::vector<shape::SymTerm> terms;
  terms.reserve((va.size() + 1) * (vb.size() + 1));
  bool overflow = false;
  auto push = [&](int64_t x, int64_t y, std::vector<SymExpr> factors) {
    int64_t k = 0;
    overflow |= __builtin_mul_overflow(x, y, &k);
    if (k != 0) terms.push_back({k, std::move(factors)});
  };
  for (size_t i = 0; i < va.size(); ++i) {
    push(va.coeff(i), cb, {va.factors(i).begin(), va.factors(i).end()});
    for (size_t j = 0; j < vb.size(); ++j) {
      push(va.coeff(i), vb.coeff(j), shape::merge_factors(va.factors(i), vb.factors(j)));
    }
  }
  for (size_t j = 0; j < vb.size(); ++j) {
    push(ca, vb.coeff(j), {vb.factors(j).begin(), vb.factors(j).end()});
  }
  int64_t c = 0;
  overflow |= __builtin_mul_overflow(ca, cb, &c);
  if (!overflow) {
    if (auto p = shape::make_poly(c, std::move(terms))) return *p;
  }
  return shape::raw(SymKind::kMulRaw, a, b);
}

SymExpr floordiv(const SymExpr& a, const SymExpr& b) {
  if (auto r = shape::apply_sym_rules(SymKind::kFloorDiv, a, b)) return *r;
  return shape::make_atom(SymKind::kFloorDiv, {a, b});
}

SymExpr mod(const SymExpr& a, const SymExpr& b) {
  if (auto r = shape::apply_sym_rules(SymKind::kMod, a, b)) return *r;
  return shape::make_atom(SymKind::kMod, {a, b});
}

SymExpr min(const SymExpr& a, const SymExpr& b) {
  return shape::simplify_min_max(SymKind::kMin, a, b);
}

SymExpr max(const SymExpr& a, const SymExpr& b) {
  return shape::simplify_min_max(SymKind::kMax, a, b);
}

bool SymExpr::operator==(const SymExpr& o) const {
  if (node_ == o.node_) return true;
  return node_->hash == o.node_->hash && shape::compare(*this, o) == 0;
}

bool SymExpr::operator<(const SymExpr& o) const {
  return shape::compare(*this, o) < 0;
}

size_t SymExpr::hash() const {
  return node_->hash;
}

// ---- printing ---------------------------------------------------------------------------------

namespace shape {
namespace {

void print(const SymNode& n, std::string& out);

// An operand of //, % or a kept-as-written + or *: bare when it cannot be misread.
void print_operand(const SymExpr& e, std::string& out) {
  const SymNode& n = e.node();
  const bool bare = n.kind == SymKind::kSymbol || n.kind == SymKind::kMin ||
                    n.kind == SymKind::kMax || n.kind == SymKind::kAddRaw ||
                    n.kind == SymKind::kMulRaw || (n.kind == SymKind::kConst && n.value >= 0);
  if (!bare) out += '(';
  print(n, out);
  if (!bare) out += ')';
}

void print_term(const SymTerm& t, bool first, std::string& out) {
  const bool negative = t.coeff < 0;
  if (t.coeff == INT64_MIN) {
    // |INT64_MIN| is no int64 literal; "-9223372036854775808" parses as one negative literal.
    out += first ? "-9223372036854775808" : " + -9223372036854775808";
  } else {
    if (first) {
      if (negative) out += '-';
    } else {
      out += negative ? " - " : " + ";
    }
    if (t.coeff != 1 && t.coeff != -1) out += std::to_string(negative ? -t.coeff : t.coeff);
  }
  const bool with_coeff = t.coeff != 1 && t.coeff != -1;
  const bool lone = !with_coeff && t.factors.size() == 1 && !(first && negative);
  for (size_t k = 0; k < t.factors.size(); ++k) {
    if (with_coeff || k > 0) out += '*';
    const SymNode& f = t.factors[k].node();
    const bool paren = !lone && (f.kind == SymKind::kFloorDiv || f.kind == SymKind::kMod);
    if (paren) out += '(';
    print(f, out);
    if (paren) out += ')';
  }
}

void print_poly(const SymNode& n, std::string& out) {
  for (size_t i = 0; i < n.terms.size(); ++i) print_term(n.terms[i], i == 0, out);
  if (n.value == INT64_MIN) {
    out += " + -9223372036854775808";
  } else if (n.value < 0) {
    out += " - " + std::to_string(-n.value);
  } else if (n.value > 0) {
    out += " + " + std::to_string(n.value);
  }
}

void print(const SymNode& n, std::string& out) {
  switch (n.kind) {
    case SymKind::kConst:
      out += std::to_string(n.value);
      return;
    case SymKind::kSymbol:
      out += n.name;
      return;
    case SymKind::kFloorDiv:
    case SymKind::kMod:
      print_operand(n.args[0], out);
      out += n.kind == SymKind::kFloorDiv ? "//" : " % ";
      print_operand(n.args[1], out);
      return;
    case SymKind::kMin:
    case SymKind::kMax:
      out += n.kind == SymKind::kMin ? "min(" : "max(";
      for (size_t i = 0; i < n.args.size(); ++i) {
        if (i > 0) out += ", ";
        print(n.args[i].node(), out);
      }
      out += ')';
      return;
    case SymKind::kAddRaw:
    case SymKind::kMulRaw:
      out += '(';
      print_operand(n.args[0], out);
      out += n.kind == SymKind::kAddRaw ? " + " : "*";
      print_operand(n.args[1], out);
      out += ')';
      return;
    case SymKind::kPoly:
      print_poly(n, out);
      return;
  }
}

std::string node_string(const SymNode& n) {
  std::string s;
  print(n, s);
  return s;
}

void collect_symbols(const SymNode& n, std::vector<std::string>& out) {
  if (n.kind == SymKind::kSymbol) out.push_back(n.name);
  for (const SymExpr& a : n.args) collect_symbols(a.node(), out);
  for (const SymTerm& t : n.terms) {
    for (const SymExpr& f : t.factors) collect_symbols(f.node(), out);
  }
}

// ---- evaluation -------------------------------------------------------------------------------

enum class EvalError { kUnbound, kOutOfRange, kDivisionByZero, kOverflow };

struct EvalFailure {
  EvalError error = EvalError::kOverflow;
  const SymNode* at = nullptr;
  int64_t value = 0;  // kOutOfRange: the bound value
};

bool fail(EvalFailure* f, EvalError e, const SymNode& at, int64_t value = 0) {
  *f = {e, &at, value};
  return false;
}

bool eval(const SymNode& n, const SymBindings& b, int64_t* out, EvalFailure* f);

bool eval_binary(const SymNode& n, const SymBindings& b, int64_t* out, EvalFailure* f) {
  int64_t x = 0, y = 0;
  if (!eval(n.args[0].node(), b, &x, f) || !eval(n.args[1].node(), b, &y, f)) return false;
  switch (n.kind) {
    case SymKind::kFloorDiv:
      if (y == 0) return fail(f, EvalError::kDivisionByZero, n);
      if (x == INT64_MIN && y == -1) return fail(f, EvalError::kOverflow, n);
      *out = floor_div(x, y);
      return true;
    case SymKind::kMod:
      if (y == 0) return fail(f, EvalError::kDivisionByZero, n);
      *out = floor_mod(x, y);
      return true;
    case SymKind::kAddRaw:
      return !__builtin_add_overflow(x, y, out) || fail(f, EvalError::kOverflow, n);
    default:  // kMulRaw
      return !__builtin_mul_overflow(x, y, out) || fail(f, EvalError::kOverflow, n);
  }
}

bool eval_poly(const SymNode& n, const SymBindings& b, int64_t* out, EvalFailure* f) {
  int64_t acc = n.value;
  for (const SymTerm& t : n.terms) {
    int64_t p = t.coeff;
    for (const SymExpr& factor : t.factors) {
      int64_t v = 0;
      if (!eval(factor.node(), b, &v, f)) return false;
      if (__builtin_mul_overflow(p, v, &p)) return fail(f, EvalError::kOverflow, n);
    }
    if (__builtin_add_overflow(acc, p, &acc)) return fail(f, EvalError::kOverflow, n);
  }
  *out = acc;
  return true;
}

bool eval(const SymNode& n, const SymBindings& b, int64_t* out, EvalFailure* f) {
  switch (n.kind) {
    case SymKind::kConst:
      *out = n.value;
      return true;
    case SymKind::kSymbol: {
      const auto it = b.find(n.name);
      if (it == b.end()) return fail(f, EvalError::kUnbound, n);
      if (it->second < n.range.lo || it->second > n.range.hi) {
        return fail(f, EvalError::kOutOfRange, n, it->second);
      }
      *out = it->second;
      return true;
    }
    case SymKind::kMin:
    case SymKind::kMax: {
      int64_t acc = 0;
      for (size_t i = 0; i < n.args.size(); ++i) {
        int64_t v = 0;
        if (!eval(n.args[i].node(), b, &v, f)) return false;
        acc = i == 0 ? v : (n.kind == SymKind::kMin ? std::min(acc, v) : std::max(acc, v));
      }
      *out = acc;
      return true;
    }
    case SymKind::kPoly:
      return eval_poly(n, b, out, f);
    default:
      return eval_binary(n, b, out, f);
  }
}

Status eval_status(const SymExpr& e, const EvalFailure& f) {
  const std::string where = "evaluating '" + e.to_string() + "'";
  const SymNode& at = *f.at;
  switch (f.error) {
    case EvalError::kUnbound:
      return invalid_argument(where + ": symbol '" + at.name + "' is not bound");
    case EvalError::kOutOfRange:
      return invalid_argument(where + ": " + at.name + " = " + std::to_string(f.value) +
                              " is outside its range [" + std::to_string(at.range.lo) + ", " +
                              std::to_string(at.range.hi) + "]");
    case EvalError::kDivisionByZero:
      return invalid_argument(where + ": division by zero in '" + node_string(at) + "'");
    case EvalError::kOverflow:
      break;
  }
  return out_of_range(where + ": int64 overflow in '" + node_string(at) + "'");
}

}  // namespace
}  // namespace shape

std::string SymExpr::to_string() const {
  return shape::node_string(*node_);
}

std::vector<std::string> SymExpr::symbols() const {
  std::vector<std::string> names;
  shape::collect_symbols(*node_, names);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

StatusOr<int64_t> SymExpr::evaluate(const SymBindings& bindings) const {
  int64_t v = 0;
  shape::EvalFailure f;
  if (shape::eval(*node_, bindings, &v, &f)) return v;
  return shape::eval_status(*this, f);
}

std::string to_string(const SymShape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += shape[i].to_string();
  }
  return s + "]";
}

}  // namespace dvm
