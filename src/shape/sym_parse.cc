// parse_sym_expr: recursive descent over the text form that SymExpr::to_string() prints.
//
//   expr    := term (('+' | '-') term)*
//   term    := unary (('*' | '//' | '%') unary)*
//   unary   := '-' unary | primary            (binds tighter than *, // and %, as in Python)
//   primary := integer | name | ('min' | 'max') '(' expr (',' expr)+ ')' | '(' expr ')'
//
// "-9223372036854775808" is read as one literal, so INT64_MIN round-trips.
#include <cctype>

#include "dvm/sym.h"

namespace dvm {
namespace {

using RangeMap = std::map<std::string, SymRange, std::less<>>;

constexpr int kMaxDepth = 512;

class Parser {
 public:
  Parser(std::string_view text, const RangeMap& ranges) : text_(text), ranges_(ranges) {}

  StatusOr<SymExpr> parse() {
    DVM_ASSIGN_OR_RETURN(SymExpr e, expr());
    skip_space();
    if (pos_ != text_.size()) return error("unexpected '" + std::string(1, text_[pos_]) + "'");
    return e;
  }

 private:
  Status error(const std::string& what) const {
    return invalid_argument("parse_sym_expr: " + what + " at position " + std::to_string(pos_) +
                            " in '" + std::string(text_) + "'");
  }

  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }

  bool eat(std::string_view token) {
    skip_space();
    if (text_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }

  bool at_digit() {
    skip_space();
    return pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]));
  }

  StatusOr<SymExpr> expr() {
    if (++depth_ > kMaxDepth) return error("expression nested too deeply");
    DVM_ASSIGN_OR_RETURN(SymExpr e, term());
    while (true) {
      if (eat("+")) {
        DVM_ASSIGN_OR_RETURN(SymExpr r, term());
        e = e + r;
      } else if (eat("-")) {
        DVM_ASSIGN_OR_RETURN(SymExpr r, term());
        e = e - r;
      } else {
        break;
      }
    }
    --depth_;
    return e;
  }

  StatusOr<SymExpr> term() {
    DVM_ASSIGN_OR_RETURN(SymExpr e, unary());
    while (true) {
      if (eat("*")) {
        DVM_ASSIGN_OR_RETURN(SymExpr r, unary());
        e = e * r;
      } else if (eat("//")) {
        DVM_ASSIGN_OR_RETURN(SymExpr r, unary());
        e = floordiv(e, r);
      } else if (eat("%")) {
        DVM_ASSIGN_OR_RETURN(SymExpr r, unary());
        e = mod(e, r);
      } else if (eat("/")) {
        return error("'/' is not an operator (floor division is '//')");
      } else {
        return e;
      }
    }
  }

  StatusOr<SymExpr> unary() {
    if (!eat("-")) return primary();
    if (at_digit()) return integer(/*negative=*/true);
    if (++depth_ > kMaxDepth) return error("expression nested too deeply");
    DVM_ASSIGN_OR_RETURN(SymExpr e, unary());
    --depth_;
    return SymExpr(0) - e;
  }

  StatusOr<SymExpr> integer(bool negative) {
    const size_t start = pos_;
    uint64_t v = 0;
    const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
      if (v > (limit - digit) / 10) {
        pos_ = start;
        return error("integer does not fit in int64");
      }
      v = v * 10 + digit;
      ++pos_;
    }
    return SymExpr(negative ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v));
  }

  StatusOr<SymExpr> primary() {
    skip_space();
    if (pos_ >= text_.size()) return error("expected an operand");
    if (at_digit()) return integer(/*negative=*/false);
    if (eat("(")) {
      DVM_ASSIGN_OR_RETURN(SymExpr e, expr());
      if (!eat(")")) return error("expected ')'");
      return e;
    }
    const char c = text_[pos_];
    if (!std::isalpha(static_cast<unsigned char>(c)) && c != '_') {
      return error("unexpected '" + std::string(1, c) + "'");
    }
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) {
      ++pos_;
    }
    const std::string_view name = text_.substr(start, pos_ - start);
    if ((name == "min" || name == "max") && eat("(")) return min_max(name == "min");
    const auto it = ranges_.find(name);
    const SymRange range = it == ranges_.end() ? SymRange{} : it->second;
    if (range.lo > range.hi) return error("symbol '" + std::string(name) + "' has an empty range");
    return SymExpr::symbol(name, range);
  }

  StatusOr<SymExpr> min_max(bool is_min) {
    DVM_ASSIGN_OR_RETURN(SymExpr e, expr());
    int count = 1;
    while (eat(",")) {
      DVM_ASSIGN_OR_RETURN(SymExpr r, expr());
      e = is_min ? min(e, r) : max(e, r);
      ++count;
    }
    if (!eat(")")) return error("expected ',' or ')'");
    if (count < 2) return error(std::string(is_min ? "min" : "max") + " needs two arguments");
    return e;
  }

  std::string_view text_;
  const RangeMap& ranges_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<SymExpr> parse_sym_expr(std::string_view text, const RangeMap& ranges) {
  return Parser(text, ranges).parse();
}

}  // namespace dvm
