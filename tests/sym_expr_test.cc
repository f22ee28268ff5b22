// Symbolic expressions: the equalities the graph compiler relies on, one example per
// simplification rule (and a check that every rule in the table has one), printing and
// parsing, errors, ranges, and a property test that compares the canonical form against a
// brute-force evaluation of the expression as written, on random bindings.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <unordered_set>

#include "dvm/sym.h"
#include "shape/sym_node.h"
#include "shape/sym_rules.h"

namespace dvm {
namespace {

const std::map<std::string, SymRange, std::less<>> kRanges = {
    {"x", {0, 3}}, {"n", {-10, 10}}, {"p", {1, 100}}, {"q", {-100, -1}}, {"m", {1, kSymMax}}};

SymExpr P(std::string_view text) {
  auto e = parse_sym_expr(text, kRanges);
  EXPECT_TRUE(e.is_ok()) << text << ": " << e.status().to_string();
  return e.is_ok() ? *e : SymExpr(-999999);
}

SymExpr S(std::string_view name) {
  const auto it = kRanges.find(name);
  return SymExpr::symbol(name, it == kRanges.end() ? SymRange{} : it->second);
}

TEST(SymExpr, IssueEqualities) {
  const SymExpr s0 = S("s0"), s1 = S("s1");
  EXPECT_EQ(s0 * s1, s1 * s0);
  EXPECT_EQ(floordiv(s0 * 4, 2), s0 * 2);
  EXPECT_EQ((s0 + 1) * (s1 + 2), s0 * s1 + 2 * s0 + s1 + 2);
  EXPECT_EQ(s0 - s0, SymExpr(0));
  EXPECT_EQ(floordiv(s0 + 3, 2), floordiv(s0 + 1, 2) + 1);  // ceil-div spellings agree
  EXPECT_EQ(min(s0, s1), min(s1, s0));
  EXPECT_EQ(max(max(s0, 3), s1), max(s0, max(s1, 3)));
  EXPECT_NE(s0, s1);
  EXPECT_NE(floordiv(s0, 2) * 2, s0);
  EXPECT_EQ(floordiv(s0, 4) * 4 + mod(s0, 4), s0);
  EXPECT_TRUE((s0 * 0).is_constant());
}

TEST(SymExpr, ConstantsAndSymbols) {
  EXPECT_TRUE(SymExpr().is_constant());
  EXPECT_EQ(SymExpr().constant_value(), 0);
  EXPECT_EQ(SymExpr(768).constant_value(), 768);
  EXPECT_EQ(SymExpr(int64_t{1} << 50).constant_value(), int64_t{1} << 50);
  EXPECT_EQ((SymExpr(6) * 7).constant_value(), 42);
  const SymExpr s = S("s0");
  EXPECT_TRUE(s.is_symbol());
  EXPECT_EQ(s.symbol_name(), "s0");
  EXPECT_FALSE((s + 1).is_symbol());
  EXPECT_EQ(((s + 2) - 2), s);
  EXPECT_TRUE(((s + 2) - 2).is_symbol());
  EXPECT_EQ((s * S("s1") + floordiv(S("s2"), 4)).symbols(),
            (std::vector<std::string>{"s0", "s1", "s2"}));
}

// ---- one example per rule ---------------------------------------------------------------------

struct RuleExample {
  const char* rule;
  const char* input;
  const char* expected;
};

const RuleExample kRuleExamples[] = {
    {"div_fold", "7//2", "3"},
    {"div_fold", "(0 - 7)//2", "-4"},
    {"div_by_one", "s0//1", "s0"},
    {"div_negative_divisor", "s0//(-2)", "s0//2 - s0"},
    {"div_negative_divisor", "n//(-1)", "-n"},
    {"div_zero_numerator", "0//s0", "0"},
    {"div_self", "(s0 + 1)//(s0 + 1)", "1"},
    {"div_nested", "(s0//4)//2", "s0//8"},
    {"div_split_constant", "(s0*4)//2", "s0*2"},
    {"div_split_constant", "(4*s0 + 5)//4", "s0 + 1"},
    {"div_split_constant", "(s0 + 5)//2", "(s0 + 1)//2 + 2"},
    {"div_common_factor", "(2*s0 + 1)//4", "s0//2"},
    {"div_common_factor", "(6*s0 + 9*s1 + 4)//12", "(2*s0 + 3*s1 + 1)//4"},
    {"div_split_monomial", "(s0*s1 + s2)//s1", "s0 + s2//s1"},
    {"div_split_monomial", "(s0*s1)//s1", "s0"},
    {"div_split_monomial", "(6*s0*s1 + s1)//(2*s1)", "3*s0 + s1//(2*s1)"},
    {"div_range_point", "x//4", "0"},
    {"div_range_point", "(x + 4)//4", "1"},
    {"div_range_point", "x//(p + 3)", "0"},
    {"mod_fold", "(0 - 7) % 3", "2"},
    {"mod_fold", "7 % (-3)", "-2"},
    {"mod_by_unit", "s0 % 1", "0"},
    {"mod_negative_divisor", "s0 % (-3)", "0 - (2*s0) % 3"},
    {"mod_zero_numerator", "0 % s0", "0"},
    {"mod_self", "(s0 + 1) % (s0 + 1)", "0"},
    {"mod_split_constant", "(s0*4) % 2", "0"},
    {"mod_split_constant", "(s0*5 + 7) % 4", "(s0 + 3) % 4"},
    {"mod_common_factor", "(2*s0 + 1) % 4", "2*(s0 % 2) + 1"},
    {"mod_of_mod", "(s0 % 4) % 2", "s0 % 2"},
    {"mod_of_mod", "(s0 % 6) % 6", "s0 % 6"},
    {"mod_of_mod", "(3*(s0 % 4) + s1) % 12", "(3*s0 + s1) % 12"},
    {"mod_split_monomial", "(s0*s1 + s2) % s1", "s2 % s1"},
    {"mod_range_point", "x % 4", "x"},
    {"mod_range_point", "(x + 4) % 4", "x"},
    {"mod_range_point", "(x - 4) % 4", "x"},
    {"poly_div_mod_recombine", "4*(s0//4) + s0 % 4", "s0"},
    {"poly_div_mod_recombine", "s1 + 3*(s0 % 8) + 24*(s0//8)", "3*s0 + s1"},
    {"poly_div_mod_recombine", "(s0//s1)*s1 + s0 % s1", "s0"},
    {"poly_div_mod_recombine", "2*(s0 % (3*s1)) + 6*s1*(s0//(3*s1)) + 1", "2*s0 + 1"},
    {"min_fold", "min(3, 5)", "3"},
    {"min_same", "min(s0, s0)", "s0"},
    {"min_by_range", "min(x, 10)", "x"},
    {"min_by_range", "min(p, q)", "q"},
    {"min_by_difference", "min(s0, s0 + 1)", "s0"},
    {"min_by_difference", "min(s0 + s1, s0)", "s0"},
    {"min_shrinking_quotient", "min(m, (m + 1)//2)", "(m + 1)//2"},
    {"min_shrinking_quotient", "min(s0//3, s0)", "s0//3"},
    {"max_shrinking_quotient", "max(m, (m + 3)//4)", "m"},
    {"min_rounded_down", "min(s0, 8*(s0//8))", "8*(s0//8)"},
    {"min_rounded_down", "min(4*((s0 + s1)//4), s0 + s1)", "4*((s0 + s1)//4)"},
    {"max_rounded_down", "max(s0, 16*(s0//16))", "s0"},
    {"min_absorbs_max", "min(s0, max(s0, s1))", "s0"},
    {"min_absorbs_max", "min(max(s1 + 2, s0), s1 + 2)", "s1 + 2"},
    {"max_absorbs_min", "max(s0, min(s0, 3))", "s0"},
    {"max_fold", "max(3, 5)", "5"},
    {"max_same", "max(s0, s0)", "s0"},
    {"max_by_range", "max(x, 10)", "10"},
    {"max_by_difference", "max(s0, s0 + 1)", "s0 + 1"},
};

std::optional<size_t> rule_index(std::string_view name) {
  const auto rules = shape::sym_rules();
  for (size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].name == name) return i;
  }
  return std::nullopt;
}

TEST(SymRules, EachExampleFiresItsRule) {
  for (const RuleExample& ex : kRuleExamples) {
    SCOPED_TRACE(std::string(ex.rule) + ": " + ex.input);
    const auto index = rule_index(ex.rule);
    ASSERT_TRUE(index.has_value()) << "no rule named " << ex.rule;
    const SymExpr expected = P(ex.expected);
    const uint64_t before = shape::sym_rule_hits(*index);
    const SymExpr got = P(ex.input);
    EXPECT_GT(shape::sym_rule_hits(*index), before) << "rule did not fire";
    EXPECT_EQ(got, expected) << got.to_string() << " vs " << expected.to_string();
  }
}

TEST(SymRules, EveryRuleHasAnExampleAndAlgebra) {
  std::set<std::string> names;
  for (const shape::SymRule& r : shape::sym_rules()) {
    EXPECT_TRUE(names.insert(r.name).second) << "duplicate rule " << r.name;
    EXPECT_GT(std::string(r.algebra).size(), 5u) << r.name;
    bool has_example = false;
    for (const RuleExample& ex : kRuleExamples) has_example |= r.name == std::string(ex.rule);
    EXPECT_TRUE(has_example) << "rule " << r.name << " has no example";
  }
}

TEST(SymRules, NegativeValuesFloorTowardMinusInfinity) {
  // The rules must hold for negative numerators: n in [-10, 10].
  for (const char* text : {"n//3", "(n + 7)//3", "(4*n - 5)//4", "n % 3", "(n - 1) % 4",
                           "(2*n + 1)//4", "(2*n + 1) % 4", "(n//2)//3", "n//(-3)", "n % (-3)"}) {
    const SymExpr e = P(text);
    for (int64_t v = -10; v <= 10; ++v) {
      auto got = e.evaluate({{"n", v}});
      ASSERT_TRUE(got.is_ok()) << text;
      // Rebuild the written expression with n replaced by the constant (pure folding).
      std::string s;
      for (const char* c = text; *c; ++c) {
        if (*c == 'n') {
          s += '(';
          s += std::to_string(v);
          s += ')';
        } else {
          s += *c;
        }
      }
      const SymExpr folded = P(s);
      ASSERT_TRUE(folded.is_constant()) << s;
      EXPECT_EQ(*got, folded.constant_value())
          << text << " at n = " << v << " canonical " << e.to_string();
    }
  }
}

// ---- printing and parsing ---------------------------------------------------------------------

TEST(SymPrint, Forms) {
  const SymExpr s0 = S("s0"), s1 = S("s1");
  EXPECT_EQ((s0 * s1 + 3).to_string(), "s0*s1 + 3");
  EXPECT_EQ(floordiv(s0 + 1, 2).to_string(), "(s0 + 1)//2");
  EXPECT_EQ(mod(s0, 4).to_string(), "s0 % 4");
  EXPECT_EQ(min(s0, 512).to_string(), "min(s0, 512)");
  EXPECT_EQ((SymExpr(3) - s0).to_string(), "-s0 + 3");
  EXPECT_EQ((s0 - floordiv(s1, 2)).to_string(), "s0 - s1//2");
  EXPECT_EQ((SymExpr(0) - floordiv(s1, 2)).to_string(), "-(s1//2)");
  EXPECT_EQ((3 * floordiv(s1, 2) * s0).to_string(), "3*s0*(s1//2)");
  EXPECT_EQ((s0 * s0 * 2 - 1).to_string(), "2*s0*s0 - 1");
  EXPECT_EQ(to_string(SymShape{s0, 768}), "[s0, 768]");
  EXPECT_EQ(to_string(SymShape{}), "[]");
  EXPECT_EQ(SymExpr(-5).to_string(), "-5");
}

TEST(SymPrint, RoundTrips) {
  const char* texts[] = {
      "s0*s1 + 3",
      "(s0 + 1)//2 - s1",
      "-(s0//2) + s0 % 3 - 7",
      "min(s0, 512) * max(s1, 2, s2)",
      "s0//s1 % (s2 + 1)",
      "x*x*x - 2*n*x + p//q",
      "(0 - s0)//(s1 - 3)",
      "-9223372036854775808*s0 + 9223372036854775807",
      "9223372036854775807 + s0 + 1",
      "9223372036854775807 * s0 * 2",
      "-9223372036854775808",
      "s0 // 0",
  };
  for (const char* t : texts) {
    const SymExpr e = P(t);
    const std::string printed = e.to_string();
    auto back = parse_sym_expr(printed, kRanges);
    ASSERT_TRUE(back.is_ok()) << t << " printed as " << printed << ": "
                              << back.status().to_string();
    EXPECT_EQ(*back, e) << t << " printed as " << printed << " parsed back as "
                        << back->to_string();
  }
}

TEST(SymParse, Errors) {
  for (const char* bad : {"", "s0 +", "s0 / 2", "min(s0)", "(s0", "s0)", "99999999999999999999",
                          "s0 $ 1", "max(s0, )", "3 s0", "-"}) {
    auto e = parse_sym_expr(bad);
    EXPECT_FALSE(e.is_ok()) << "'" << bad << "' parsed as " << e->to_string();
    if (!e.is_ok()) {
      EXPECT_NE(e.status().message().find("position"), std::string::npos) << e.status().to_string();
    }
  }
  auto deep = parse_sym_expr(std::string(5000, '(') + "s0" + std::string(5000, ')'));
  EXPECT_FALSE(deep.is_ok());
  auto empty_range = parse_sym_expr("a + 1", {{"a", {5, 4}}});
  EXPECT_FALSE(empty_range.is_ok());
}

TEST(SymParse, SymbolRanges) {
  auto e = parse_sym_expr("a//8", {{"a", {0, 7}}});
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ(*e, SymExpr(0));
  auto f = parse_sym_expr("a//8");  // default range
  ASSERT_TRUE(f.is_ok());
  EXPECT_FALSE(f->is_constant());
}

// ---- evaluation and errors --------------------------------------------------------------------

TEST(SymEvaluate, ValuesAndErrors) {
  const SymExpr e = P("s0*s1 + (s0 + 1)//2 - min(s1, 3)");
  auto v = e.evaluate({{"s0", 5}, {"s1", 7}});
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(*v, 35 + 3 - 3);

  auto unbound = e.evaluate({{"s0", 5}});
  ASSERT_FALSE(unbound.is_ok());
  EXPECT_EQ(unbound.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unbound.status().message().find("'s1' is not bound"), std::string::npos)
      << unbound.status().to_string();
  EXPECT_NE(unbound.status().message().find(e.to_string()), std::string::npos);

  auto outside = P("x + 1").evaluate({{"x", 4}});
  ASSERT_FALSE(outside.is_ok());
  EXPECT_NE(outside.status().message().find("x = 4 is outside its range [0, 3]"), std::string::npos)
      << outside.status().to_string();
  EXPECT_FALSE(P("s0").evaluate({{"s0", -1}}).is_ok());

  auto div0 = P("s0//s1 + 1").evaluate({{"s0", 4}, {"s1", 0}});
  ASSERT_FALSE(div0.is_ok());
  EXPECT_NE(div0.status().message().find("division by zero in 's0//s1'"), std::string::npos)
      << div0.status().to_string();
  EXPECT_FALSE(P("s0 % s1").evaluate({{"s0", 4}, {"s1", 0}}).is_ok());
  EXPECT_FALSE(P("s0 // 0").evaluate({{"s0", 4}}).is_ok());

  const int64_t big = int64_t{1} << 40;
  auto overflow = P("s0*s1*s2").evaluate({{"s0", big}, {"s1", big}, {"s2", 1}});
  ASSERT_FALSE(overflow.is_ok());
  EXPECT_EQ(overflow.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(overflow.status().message().find("overflow"), std::string::npos);

  // Canonical coefficients that overflow keep the operation as written; evaluate reports it.
  const SymExpr sum = SymExpr(INT64_MAX) + 1;
  EXPECT_FALSE(sum.is_constant());
  EXPECT_EQ(sum.evaluate({}).status().code(), StatusCode::kOutOfRange);
  const SymExpr prod = SymExpr(INT64_MAX) * S("s0");
  EXPECT_EQ(*prod.evaluate({{"s0", 1}}), INT64_MAX);
  EXPECT_FALSE((prod * 2).evaluate({{"s0", 1}}).is_ok());
  EXPECT_EQ(*(prod * 2).evaluate({{"s0", 0}}), 0);
  EXPECT_FALSE(floordiv(SymExpr(INT64_MIN), -1).is_constant());
  EXPECT_FALSE(floordiv(SymExpr(INT64_MIN), -1).evaluate({}).is_ok());
  EXPECT_EQ(mod(SymExpr(INT64_MIN), -1), SymExpr(0));
}

// ---- ranges -----------------------------------------------------------------------------------

void expect_range(const char* text, int64_t lo, int64_t hi) {
  const SymRange r = P(text).range();
  EXPECT_EQ(r.lo, lo) << text;
  EXPECT_EQ(r.hi, hi) << text;
}

TEST(SymRange, OfResults) {
  expect_range("s0", 0, kSymMax);
  expect_range("(s0 + 1)//2", 0, (kSymMax + 1) / 2);
  expect_range("s0 % 4", 0, 3);
  expect_range("x % 8", 0, 3);
  expect_range("n % 4", 0, 3);
  expect_range("n % (-4)", -3, 0);
  expect_range("min(s0, 512)", 0, 512);
  expect_range("max(n, 2)", 2, 10);
  expect_range("n*n", 0, 100);
  expect_range("n*x - 1", -31, 29);
  expect_range("n//p", -10, 10);
  expect_range("n//q", -10, 10);
  expect_range("x//n", -3, 3);
  expect_range("s0*s1*s2", 0, INT64_MAX);         // unbounded above
  expect_range("0 - s0*s1*s2", INT64_MIN, 0);     // unbounded below
  expect_range("s0*s1*s2 - s0*s1*s2 + 1", 1, 1);  // exact after cancelling
}

// ---- order and hashing ------------------------------------------------------------------------

TEST(SymExpr, OrderAndHash) {
  const std::vector<SymExpr> es = {P("s0"),    P("s1"),         P("s0*s1"), P("s0 + 1"), P("3"),
                                   P("s0//2"), P("min(s0, 4)"), P("s10"),   P("s2")};
  std::unordered_set<SymExpr> set(es.begin(), es.end());
  EXPECT_EQ(set.size(), es.size());
  EXPECT_TRUE(set.count(P("s1*s0")));
  for (const SymExpr& a : es) {
    EXPECT_FALSE(a < a);
    for (const SymExpr& b : es) {
      if (a != b) {
        EXPECT_NE(a < b, b < a) << a.to_string() << " " << b.to_string();
      }
    }
  }
  EXPECT_LT(P("s2"), P("s10"));
  EXPECT_EQ(P("s0 + s1").to_string(), "s0 + s1");
  EXPECT_EQ(P("s10 + s2").to_string(), "s2 + s10");
}

// ---- property test against brute force --------------------------------------------------------

// The expression as written, evaluated without any simplification.
struct Tree {
  enum Op { kConst, kSym, kAdd, kSub, kMul, kDiv, kMod, kMin, kMax } op = kConst;
  int64_t value = 0;
  int sym = 0;
  std::unique_ptr<Tree> l, r;
};

constexpr int kNumSyms = 3;
const char* const kSymNames[kNumSyms] = {"a", "b", "c"};

// What random expressions are made of: the symbols' ranges and the constants.
struct Universe {
  SymRange ranges[kNumSyms];
  std::vector<int64_t> constants;
};

const Universe kSmall = {{{0, 6}, {-3, 4}, {1, 5}}, {-4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8}};
// Near the int64 limits: unbounded symbols, constants that overflow when combined.
const Universe kLimits = {
    {{-(int64_t{1} << 62), int64_t{1} << 62}, {0, kSymMax}, {INT64_MIN, INT64_MAX}},
    {0, 1, -1, 2, 3, -5, int64_t{1} << 20, int64_t{1} << 62, -(int64_t{1} << 62), INT64_MAX,
     INT64_MAX - 1, INT64_MIN}};
const Universe* g_universe = &kSmall;

std::unique_ptr<Tree> clone(const Tree& t) {
  auto c = std::make_unique<Tree>();
  c->op = t.op;
  c->value = t.value;
  c->sym = t.sym;
  if (t.l) c->l = clone(*t.l);
  if (t.r) c->r = clone(*t.r);
  return c;
}

std::unique_ptr<Tree> node(Tree::Op op, std::unique_ptr<Tree> l, std::unique_ptr<Tree> r) {
  auto t = std::make_unique<Tree>();
  t->op = op;
  t->l = std::move(l);
  t->r = std::move(r);
  return t;
}

std::unique_ptr<Tree> constant(int64_t v) {
  auto t = std::make_unique<Tree>();
  t->value = v;
  return t;
}

std::unique_ptr<Tree> random_tree(std::mt19937_64& rng, int depth);

// k*d*(x//d) + k*(x % d') (+ y): d' == d mostly, so that the pair recombines into k*x.
std::unique_ptr<Tree> div_mod_pair(std::mt19937_64& rng, int depth) {
  const int64_t d = static_cast<int64_t>(rng() % 5) + 2;
  const int64_t k = static_cast<int64_t>(rng() % 5) - 2;
  const int64_t d2 = rng() % 4 == 0 ? d + 1 : d;
  auto x = random_tree(rng, depth - 1);
  std::unique_ptr<Tree> div, md;
  if (rng() % 3 == 0) {  // a symbolic divisor y: k*y*(x//y) + k*(x % y)
    auto y = random_tree(rng, 1);
    div = node(Tree::kMul, node(Tree::kMul, node(Tree::kDiv, clone(*x), clone(*y)), clone(*y)),
               constant(k));
    md = node(Tree::kMul, node(Tree::kMod, std::move(x), std::move(y)), constant(k));
  } else {
    div = node(Tree::kMul, node(Tree::kDiv, clone(*x), constant(d)), constant(k * d));
    md = node(Tree::kMul, node(Tree::kMod, std::move(x), constant(d2)), constant(k));
  }
  auto sum = node(Tree::kAdd, std::move(div), std::move(md));
  if (rng() % 2 == 0) return sum;
  return node(Tree::kSub, random_tree(rng, depth - 1), std::move(sum));
}

// min/max(x, (x + r)//c): a quotient that shrinks x when x >= 1 (torch.chunk's halves).
std::unique_ptr<Tree> quotient_pair(std::mt19937_64& rng, int depth) {
  const int64_t c = static_cast<int64_t>(rng() % 4) + 2;
  const int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>(c + 1)) - 1;  // -1..c-1
  auto x = random_tree(rng, depth - 1);
  auto q = node(Tree::kDiv, node(Tree::kAdd, clone(*x), constant(r)), constant(c));
  return node(rng() % 2 ? Tree::kMin : Tree::kMax, std::move(x), std::move(q));
}

// min/max(x, d*(x//d)): x rounded down to a multiple of d (a strided window's extent); d in
// 1..4 (and sometimes -2: not a rounding down, which the rule must leave alone).
std::unique_ptr<Tree> rounded_pair(std::mt19937_64& rng, int depth) {
  const int64_t d = rng() % 5 == 0 ? -2 : static_cast<int64_t>(rng() % 4) + 1;
  auto x = random_tree(rng, depth - 1);
  auto r = node(Tree::kMul, constant(d), node(Tree::kDiv, clone(*x), constant(d)));
  return node(rng() % 2 ? Tree::kMin : Tree::kMax, std::move(x), std::move(r));
}

std::unique_ptr<Tree> random_tree(std::mt19937_64& rng, int depth) {
  auto t = std::make_unique<Tree>();
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  if (depth == 0 || pick(5) == 0) {
    if (pick(5) < 3) {
      t->op = Tree::kSym;
      t->sym = pick(kNumSyms);
    } else {
      t->op = Tree::kConst;
      const auto& cs = g_universe->constants;
      t->value = cs[static_cast<size_t>(pick(static_cast<int>(cs.size())))];
    }
    return t;
  }
  if (pick(12) == 0) return div_mod_pair(rng, depth);
  if (pick(20) == 0) return quotient_pair(rng, depth);
  if (pick(20) == 0) return rounded_pair(rng, depth);
  static const Tree::Op kOps[] = {Tree::kAdd, Tree::kAdd, Tree::kAdd, Tree::kSub, Tree::kSub,
                                  Tree::kMul, Tree::kMul, Tree::kDiv, Tree::kDiv, Tree::kDiv,
                                  Tree::kMod, Tree::kMod, Tree::kMod, Tree::kMin, Tree::kMax};
  t->op = kOps[pick(std::size(kOps))];
  t->l = random_tree(rng, depth - 1);
  if ((t->op == Tree::kDiv || t->op == Tree::kMod) && pick(10) < 7) {
    static const int64_t kDivisors[] = {-3, -2, -1, 1, 2, 3, 4, 6, 8};
    t->r = std::make_unique<Tree>();
    t->r->value = kDivisors[pick(std::size(kDivisors))];
  } else if (t->op == Tree::kMul && pick(2) == 0) {
    t->r = std::make_unique<Tree>();
    t->r->value = pick(9) - 3;
  } else {
    t->r = random_tree(rng, depth - 1);
  }
  return t;
}

// Python floor semantics, written independently of the library.
// (128-bit, so that large operands do not overflow on the way.)
int64_t py_mod(int64_t a, int64_t b) {
  const __int128 w = b;
  return static_cast<int64_t>(((a % w) + w) % w);
}
int64_t py_div(int64_t a, int64_t b) {
  return static_cast<int64_t>((static_cast<__int128>(a) - py_mod(a, b)) / b);
}

// nullopt where the written expression is undefined (division by zero) or leaves int64.
std::optional<int64_t> brute(const Tree& t, const int64_t* v) {
  if (t.op == Tree::kConst) return t.value;
  if (t.op == Tree::kSym) return v[t.sym];
  const auto x = brute(*t.l, v), y = brute(*t.r, v);
  if (!x || !y) return std::nullopt;
  int64_t out = 0;
  switch (t.op) {
    case Tree::kAdd:
      if (__builtin_add_overflow(*x, *y, &out)) return std::nullopt;
      return out;
    case Tree::kSub:
      if (__builtin_sub_overflow(*x, *y, &out)) return std::nullopt;
      return out;
    case Tree::kMul:
      if (__builtin_mul_overflow(*x, *y, &out)) return std::nullopt;
      return out;
    case Tree::kDiv:
      if (*y == 0 || (*x == INT64_MIN && *y == -1)) return std::nullopt;
      return py_div(*x, *y);
    case Tree::kMod:
      if (*y == 0) return std::nullopt;
      return py_mod(*x, *y);
    case Tree::kMin:
      return std::min(*x, *y);
    case Tree::kMax:
      return std::max(*x, *y);
    default:
      return std::nullopt;
  }
}

void print_tree(const Tree& t, std::string& out) {
  static const char* kOpText[] = {"", "", " + ", " - ", "*", "//", " % ", "min(", "max("};
  switch (t.op) {
    case Tree::kConst:
      out += '(';
      out += std::to_string(t.value);
      out += ')';
      return;
    case Tree::kSym:
      out += kSymNames[t.sym];
      return;
    case Tree::kMin:
    case Tree::kMax:
      out += kOpText[t.op];
      print_tree(*t.l, out);
      out += ", ";
      print_tree(*t.r, out);
      out += ')';
      return;
    default:
      out += '(';
      print_tree(*t.l, out);
      out += kOpText[t.op];
      print_tree(*t.r, out);
      out += ')';
      return;
  }
}

std::string tree_string(const Tree& t) {
  std::string s;
  print_tree(t, s);
  return s;
}

SymExpr build(const Tree& t) {
  switch (t.op) {
    case Tree::kConst:
      return t.value;
    case Tree::kSym:
      return SymExpr::symbol(kSymNames[t.sym], g_universe->ranges[t.sym]);
    case Tree::kAdd:
      return build(*t.l) + build(*t.r);
    case Tree::kSub:
      return build(*t.l) - build(*t.r);
    case Tree::kMul:
      return build(*t.l) * build(*t.r);
    case Tree::kDiv:
      return floordiv(build(*t.l), build(*t.r));
    case Tree::kMod:
      return mod(build(*t.l), build(*t.r));
    case Tree::kMin:
      return min(build(*t.l), build(*t.r));
    case Tree::kMax:
      return max(build(*t.l), build(*t.r));
  }
  return 0;
}

// A value in `r`: its ends, small values, or uniform.
int64_t sample(const SymRange& r, std::mt19937_64& rng) {
  const uint64_t span = static_cast<uint64_t>(r.hi) - static_cast<uint64_t>(r.lo);
  switch (rng() % 4) {
    case 0:
      return r.lo;
    case 1:
      return r.hi;
    case 2:
      return std::clamp<int64_t>(static_cast<int64_t>(rng() % 21) - 10, r.lo, r.hi);
    default:
      return static_cast<int64_t>(static_cast<uint64_t>(r.lo) +
                                  (span == UINT64_MAX ? rng() : rng() % (span + 1)));
  }
}

struct PropertyStats {
  int compared = 0;
  int shrunk = 0;
  int overflowed = 0;
};

// Random expressions over `u`: the canonical form prints and parses back to itself, and on
// random bindings evaluates to what the written expression evaluates to (where that is
// defined), inside its range. With `allow_overflow`, the canonical form may report an int64
// overflow where the written order of operations did not overflow (and vice versa).
void check_random_expressions(const Universe& u, uint64_t seed, int count, bool allow_overflow,
                              PropertyStats* stats) {
  g_universe = &u;
  std::mt19937_64 rng(seed);
  std::map<std::string, SymRange, std::less<>> ranges;
  for (int s = 0; s < kNumSyms; ++s) ranges[kSymNames[s]] = u.ranges[s];
  constexpr int kBindings = 48;
  for (int i = 0; i < count; ++i) {
    const auto tree = random_tree(rng, 1 + i % 5);
    const SymExpr e = build(*tree);
    const std::string written = tree_string(*tree);
    const std::string printed = e.to_string();
    stats->shrunk += printed.size() < written.size();
    // The printed form parses back to the same canonical expression.
    auto back = parse_sym_expr(printed, ranges);
    ASSERT_TRUE(back.is_ok()) << written << " -> " << printed << ": " << back.status().to_string();
    ASSERT_EQ(*back, e) << written << " -> " << printed << " -> " << back->to_string();
    // So does the written form: the parser and the operators agree.
    auto again = parse_sym_expr(written, ranges);
    ASSERT_TRUE(again.is_ok()) << written;
    ASSERT_EQ(*again, e) << written;
    const SymRange r = e.range();
    for (int k = 0; k < kBindings; ++k) {
      int64_t v[kNumSyms];
      SymBindings b;
      for (int s = 0; s < kNumSyms; ++s) {
        v[s] = sample(u.ranges[s], rng);
        b[kSymNames[s]] = v[s];
      }
      const auto want = brute(*tree, v);
      if (!want) continue;  // undefined as written: the canonical form may say anything
      const auto got = e.evaluate(b);
      if (allow_overflow && !got.is_ok() && got.status().code() == StatusCode::kOutOfRange) {
        ++stats->overflowed;
        continue;
      }
      ASSERT_TRUE(got.is_ok()) << written << " -> " << printed << " at a=" << v[0] << " b=" << v[1]
                               << " c=" << v[2] << ": " << got.status().to_string();
      ASSERT_EQ(*got, *want) << written << " -> " << printed << " at a=" << v[0] << " b=" << v[1]
                             << " c=" << v[2];
      ASSERT_TRUE(r.lo <= *got && *got <= r.hi)
          << printed << " = " << *got << " outside its range [" << r.lo << ", " << r.hi << "]";
      ++stats->compared;
    }
  }
}

TEST(SymProperty, CanonicalFormMatchesBruteForce) {
  const auto rules = shape::sym_rules();
  std::vector<uint64_t> hits_before(rules.size());
  for (size_t k = 0; k < rules.size(); ++k) hits_before[k] = shape::sym_rule_hits(k);
  constexpr int kExprs = 4000;
  PropertyStats stats;
  check_random_expressions(kSmall, 20240611, kExprs, /*allow_overflow=*/false, &stats);
  // Every rule's soundness was checked against brute force, not only its example.
  for (size_t k = 0; k < rules.size(); ++k) {
    const uint64_t hits = shape::sym_rule_hits(k) - hits_before[k];
    std::printf("  %-24s %6llu\n", rules[k].name, static_cast<unsigned long long>(hits));
    EXPECT_GT(hits, 0u) << rules[k].name << " never fired on random expressions";
  }
  EXPECT_GT(stats.compared, kExprs * 48 / 2);
  EXPECT_GT(stats.shrunk, kExprs / 4);  // the simplifier does simplify
}

TEST(SymProperty, NearInt64Limits) {
  PropertyStats stats;
  check_random_expressions(kLimits, 7, 2000, /*allow_overflow=*/true, &stats);
  std::printf("  compared %d, canonical form overflowed %d\n", stats.compared, stats.overflowed);
  EXPECT_GT(stats.compared, 2000 * 48 / 4);
}

// ---- cost --------------------------------------------------------------------------------------

// A chain of divisions whose numerators hold the previous quotient with a negative
// coefficient: splitting -1*e as -e + 63*e (div_split_constant) would write e twice at every
// step, so the text would double each time (2^20 here). The rule leaves large terms whole; the
// expression stays linear in the chain's length and evaluates exactly.
TEST(SymExpr, DivisionChainsStayLinear) {
  const SymExpr p = S("p"), n = S("n");
  SymExpr e = p;
  int64_t pv = 37, nv = -7, value = pv;
  for (int i = 0; i < 20; ++i) {
    e = floordiv(n - e, 64) + p;
    value = (nv - value >= 0 ? (nv - value) / 64 : -((value - nv + 63) / 64)) + pv;
  }
  const std::string text = e.to_string();
  EXPECT_LT(text.size(), 4000u) << text.substr(0, 200);
  EXPECT_LT(e.node().tree_size, 1000u);
  auto got = e.evaluate({{"p", pv}, {"n", nv}});
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(*got, value);
  auto back = parse_sym_expr(text, kRanges);
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(*back, e);
  // Small terms still take the canonical split: (65*p)//64 = p + p//64.
  EXPECT_EQ(floordiv(p * 65, 64), p + floordiv(p, 64));
  EXPECT_EQ(floordiv(n - p, 64), floordiv(n + p * 63, 64) - p);
}

// Distributing (A + p)*(A + n) writes A four times; nested in quotients and multiplied again
// that grew a fuzzed 200-op program to 8 MB of text. Products whose distributed form would
// pass 1024 nodes stay as written; small ones still distribute.
TEST(SymExpr, LargeProductsStayAsWritten) {
  const SymExpr p = S("p"), n = S("n");
  SymExpr big = p;
  for (int i = 0; i < 60; ++i) big = floordiv(big + n, 3) + p;
  ASSERT_GT(big.node().tree_size, 300u);
  const SymExpr prod = (big + p) * (big + n);
  EXPECT_LE(prod.node().tree_size, 2 * big.node().tree_size + 16);
  auto got = prod.evaluate({{"p", 5}, {"n", -3}});
  auto want_big = big.evaluate({{"p", 5}, {"n", -3}});
  ASSERT_TRUE(got.is_ok() && want_big.is_ok());
  EXPECT_EQ(*got, (*want_big + 5) * (*want_big - 3));
  EXPECT_EQ((p + 1) * (n + 2), P("p*n + 2*p + n + 2"));
}

TEST(SymExpr, BuildsTenThousandExpressionsQuickly) {
  const SymExpr s0 = S("s0"), s1 = S("s1"), s2 = S("s2");
  const auto start = std::chrono::steady_clock::now();
  size_t total = 0;
  for (int i = 0; i < 10000; ++i) {
    // Typical shape arithmetic: sizes, strides, ceil-divisions, clamps.
    const int64_t k = i % 64 + 1;
    SymExpr e;
    switch (i % 5) {
      case 0:
        e = s0 * s1 * k;
        break;
      case 1:
        e = floordiv(s0 + (k - 1), k);
        break;
      case 2:
        e = min(s1, k * 16) + mod(s2, 8);
        break;
      case 3:
        e = (s0 + k) * (s1 - 1) - s0 * s1;
        break;
      default:
        e = floordiv(s0 * 8 * k, 4 * k) + s2;
        break;
    }
    total += e.hash() & 1;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("10000 expressions built in %.2f ms (%zu)\n", ms, total);
  EXPECT_LT(ms, 2000.0);
}

}  // namespace
}  // namespace dvm
