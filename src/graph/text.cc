// The graph IR's text form: printer and parser. Every node is one line
//   %3 = reduce.sum(%2) {ints=[1], flag=1} : f32[s0, 1]
// and the parser re-infers each node, so a text with a wrong type or shape is rejected.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "graph/graph_def.h"
#include "ops/op_traits.h"

namespace dvm {

namespace {

// Index of the op whose name(op) is `s`, or -1.
template <typename Op>
int find_name(int count, const char* (*name)(Op), std::string_view s) {
  for (int i = 0; i < count; ++i)
    if (s == name(static_cast<Op>(i))) return i;
  return -1;
}

std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string mnemonic(const graph::Node& n) {
  std::string m = graph_op_name(n.op);
  if (n.op == GraphOp::kUnary) m += std::string(".") + unary_op_name(UnaryOp(n.sub));
  if (n.op == GraphOp::kBinary) m += std::string(".") + binary_op_name(BinaryOp(n.sub));
  if (n.op == GraphOp::kReduce) m += std::string(".") + reduce_op_name(ReduceOp(n.sub));
  return m;
}

std::string attrs(const graph::Node& n) {
  std::vector<std::string> parts;
  if (!n.name.empty()) parts.push_back("name=\"" + n.name + "\"");
  if (n.axis != 0) parts.push_back("axis=" + std::to_string(n.axis));
  if (n.flag) parts.push_back("flag=1");
  if (n.value != 0 || std::signbit(n.value)) parts.push_back("value=" + number(n.value));
  if (n.value2 != 0 || std::signbit(n.value2)) parts.push_back("value2=" + number(n.value2));
  if (!n.ints.empty()) {
    std::string s = "ints=[";
    for (size_t i = 0; i < n.ints.size(); ++i) s += (i ? ", " : "") + std::to_string(n.ints[i]);
    parts.push_back(s + "]");
  }
  if (!n.sym.empty()) parts.push_back("sym=" + to_string(n.sym));
  if (parts.empty()) return "";
  std::string s = " {";
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : "") + parts[i];
  return s + "}";
}

}  // namespace

namespace graph {

std::string node_str(const GraphDef& g, int id) {
  const Node& n = g.nodes[id];
  std::string s = "%" + std::to_string(id) + " = " + mnemonic(n);
  if (!n.inputs.empty()) {
    s += "(";
    for (size_t i = 0; i < n.inputs.size(); ++i)
      s += (i ? ", %" : "%") + std::to_string(n.inputs[i]);
    s += ")";
  }
  return s + attrs(n) + " : " + std::string(dtype_name(n.dtype)) + to_string(n.shape);
}

}  // namespace graph

std::string Graph::to_string() const {
  const graph::GraphDef& g = *def_;
  std::string s = "graph " + g.name;
  if (!g.symbols.empty()) {
    s += " symbols(";
    bool first = true;
    for (const auto& [name, r] : g.symbols) {
      s += (first ? "" : ", ") + name + " in [" + std::to_string(r.lo) + ", " +
           std::to_string(r.hi) + "]";
      first = false;
    }
    s += ")";
  }
  s += " {\n";
  for (size_t i = 0; i < g.nodes.size(); ++i) s += "  " + graph::node_str(g, i) + "\n";
  s += "  return";
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    s += (i ? ", " : " ") + g.output_names[i] + "=%" + std::to_string(g.outputs[i]);
  }
  return s + "\n}\n";
}

// ---------------------------------------------------------------------------------------------
// Parser

namespace {

using Ranges = std::map<std::string, SymRange, std::less<>>;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits at `sep` outside (), [] and quotes.
std::vector<std::string_view> split_top(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  int depth = 0;
  bool quoted = false;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '"') quoted = !quoted;
    if (quoted) continue;
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    if (c == sep && depth == 0) {
      out.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  std::string_view last = trim(s.substr(start));
  if (!last.empty() || !out.empty()) out.push_back(last);
  return out;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}
  StatusOr<Graph> parse();

 private:
  Status error(const std::string& msg) const {
    return invalid_argument("parse_graph: line " + std::to_string(line_no_) + ": " + msg);
  }
  Status parse_header(std::string_view line);
  Status parse_node(std::string_view line);
  Status parse_return(std::string_view line);
  Status parse_attr(std::string_view key, std::string_view value, graph::Node* n);
  StatusOr<SymShape> parse_shape(std::string_view s);
  StatusOr<int> parse_value_ref(std::string_view s);
  StatusOr<int64_t> parse_int(std::string_view s);

  std::string_view text_;
  int line_no_ = 0;
  std::shared_ptr<graph::GraphDef> def_ = std::make_shared<graph::GraphDef>();
};

StatusOr<int64_t> Parser::parse_int(std::string_view s) {
  std::string str(trim(s));
  char* end = nullptr;
  long long v = std::strtoll(str.c_str(), &end, 10);
  if (str.empty() || *end != '\0') return error("expected an integer, got '" + str + "'");
  return static_cast<int64_t>(v);
}

StatusOr<int> Parser::parse_value_ref(std::string_view s) {
  s = trim(s);
  if (s.empty() || s[0] != '%') return error("expected %id, got '" + std::string(s) + "'");
  DVM_ASSIGN_OR_RETURN(int64_t id, parse_int(s.substr(1)));
  if (id < 0 || id >= static_cast<int64_t>(def_->nodes.size())) {
    return error("%" + std::to_string(id) + " is not an earlier value");
  }
  return static_cast<int>(id);
}

StatusOr<SymShape> Parser::parse_shape(std::string_view s) {
  s = trim(s);
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') {
    return error("expected [dims], got '" + std::string(s) + "'");
  }
  SymShape shape;
  std::string_view body = trim(s.substr(1, s.size() - 2));
  if (body.empty()) return shape;
  for (std::string_view d : split_top(body, ',')) {
    StatusOr<SymExpr> e = parse_sym_expr(d, def_->symbols);
    if (!e.is_ok()) return error(e.status().message());
    shape.push_back(*e);
  }
  return shape;
}

Status Parser::parse_header(std::string_view line) {
  if (line.substr(0, 6) != "graph " || line.back() != '{') {
    return error("expected 'graph NAME [symbols(...)] {'");
  }
  line = trim(line.substr(6, line.size() - 7));
  size_t sym = line.find(" symbols(");
  def_->name = std::string(trim(line.substr(0, sym)));
  if (sym == std::string_view::npos) return Status::ok();
  std::string_view list = trim(line.substr(sym + 9));
  if (list.empty() || list.back() != ')') return error("unterminated symbols(...)");
  for (std::string_view entry : split_top(list.substr(0, list.size() - 1), ',')) {
    size_t in = entry.find(" in ");
    if (in == std::string_view::npos) return error("expected 'name in [lo, hi]'");
    std::string_view range = trim(entry.substr(in + 4));
    std::vector<std::string_view> bounds =
        split_top(range.size() >= 2 ? range.substr(1, range.size() - 2) : range, ',');
    if (bounds.size() != 2) return error("expected a range [lo, hi]");
    DVM_ASSIGN_OR_RETURN(int64_t lo, parse_int(bounds[0]));
    DVM_ASSIGN_OR_RETURN(int64_t hi, parse_int(bounds[1]));
    def_->symbols[std::string(trim(entry.substr(0, in)))] = SymRange{lo, hi};
  }
  return Status::ok();
}

Status Parser::parse_attr(std::string_view key, std::string_view value, graph::Node* n) {
  if (key == "name") {
    if (value.size() < 2 || value.front() != '"' || value.back() != '"')
      return error("name must be quoted");
    n->name = std::string(value.substr(1, value.size() - 2));
  } else if (key == "axis") {
    DVM_ASSIGN_OR_RETURN(int64_t v, parse_int(value));
    n->axis = static_cast<int>(v);
  } else if (key == "flag") {
    DVM_ASSIGN_OR_RETURN(int64_t v, parse_int(value));
    n->flag = v != 0;
  } else if (key == "value" || key == "value2") {
    std::string str(value);
    char* end = nullptr;
    double v = std::strtod(str.c_str(), &end);
    if (*end != '\0') return error("bad number '" + str + "'");
    (key == "value" ? n->value : n->value2) = v;
  } else if (key == "ints") {
    if (value.size() < 2 || value.front() != '[') return error("ints must be [..]");
    std::string_view body = trim(value.substr(1, value.size() - 2));
    if (!body.empty()) {
      for (std::string_view v : split_top(body, ',')) {
        DVM_ASSIGN_OR_RETURN(int64_t i, parse_int(v));
        n->ints.push_back(i);
      }
    }
  } else if (key == "sym") {
    DVM_ASSIGN_OR_RETURN(n->sym, parse_shape(value));
  } else {
    return error("unknown attribute '" + std::string(key) + "'");
  }
  return Status::ok();
}

Status Parser::parse_node(std::string_view line) {
  size_t eq = line.find(" = ");
  if (eq == std::string_view::npos) return error("expected '%id = op(...) : type'");
  DVM_ASSIGN_OR_RETURN(int64_t id, parse_int(trim(line.substr(1, eq - 1))));
  if (id != static_cast<int64_t>(def_->nodes.size())) return error("ids must be sequential");
  std::string_view rest = trim(line.substr(eq + 3));
  size_t colon = rest.rfind(" : ");
  if (colon == std::string_view::npos) return error("missing ' : type'");
  std::string_view type = trim(rest.substr(colon + 3));
  rest = trim(rest.substr(0, colon));
  graph::Node n;
  // Attributes.
  if (!rest.empty() && rest.back() == '}') {
    size_t open = rest.rfind(" {");
    if (open == std::string_view::npos) return error("unbalanced {attributes}");
    for (std::string_view kv : split_top(rest.substr(open + 2, rest.size() - open - 3), ',')) {
      size_t e = kv.find('=');
      if (e == std::string_view::npos) return error("attribute without '='");
      DVM_RETURN_IF_ERROR(parse_attr(trim(kv.substr(0, e)), trim(kv.substr(e + 1)), &n));
    }
    rest = trim(rest.substr(0, open));
  }
  // Operands.
  size_t paren = rest.find('(');
  std::string_view op = rest.substr(0, paren);
  if (paren != std::string_view::npos) {
    if (rest.back() != ')') return error("unbalanced (operands)");
    for (std::string_view a : split_top(rest.substr(paren + 1, rest.size() - paren - 2), ',')) {
      DVM_ASSIGN_OR_RETURN(int v, parse_value_ref(a));
      n.inputs.push_back(v);
    }
  }
  size_t dot = op.find('.');
  bool found = false;
  n.op = graph::graph_op_from_name(op.substr(0, dot), &found);
  if (!found) return error("unknown op '" + std::string(op) + "'");
  if (dot != std::string_view::npos) {
    std::string_view sub = op.substr(dot + 1);
    n.sub = n.op == GraphOp::kUnary    ? find_name(ops::kNumUnaryOps, unary_op_name, sub)
            : n.op == GraphOp::kBinary ? find_name(ops::kNumBinaryOps, binary_op_name, sub)
            : n.op == GraphOp::kReduce ? find_name(ops::kNumReduceOps, reduce_op_name, sub)
                                       : -1;
    if (n.sub < 0) return error("unknown op '" + std::string(op) + "'");
  }
  // Type.
  size_t bracket = type.find('[');
  if (bracket == std::string_view::npos) return error("type must be dtype[dims]");
  std::string_view dt = type.substr(0, bracket);
  bool dt_found = false;
  for (int t = 0; t < kNumDTypes; ++t) {
    if (dtype_name(static_cast<DType>(t)) == dt) {
      n.dtype = static_cast<DType>(t);
      dt_found = true;
    }
  }
  if (!dt_found) return error("unknown dtype '" + std::string(dt) + "'");
  DVM_ASSIGN_OR_RETURN(SymShape shape, parse_shape(type.substr(bracket)));
  DType want_dtype = n.dtype;
  if (n.op == GraphOp::kInput) n.shape = shape;
  graph::GraphEmitter em(def_.get());
  int got = em.emit(std::move(n));
  if (got < 0) return error(em.status().message());
  const graph::Node& made = def_->nodes[got];
  if (made.dtype != want_dtype || !(made.shape == shape)) {
    return error("declared type " + std::string(type) + " but the op gives " +
                 std::string(dtype_name(made.dtype)) + to_string(made.shape));
  }
  if (made.op == GraphOp::kInput) def_->inputs.push_back(got);
  return Status::ok();
}

Status Parser::parse_return(std::string_view line) {
  for (std::string_view item : split_top(trim(line.substr(6)), ',')) {
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) return error("return items are name=%id");
    DVM_ASSIGN_OR_RETURN(int v, parse_value_ref(item.substr(eq + 1)));
    def_->output_names.emplace_back(trim(item.substr(0, eq)));
    def_->outputs.push_back(v);
  }
  return Status::ok();
}

StatusOr<Graph> Parser::parse() {
  std::istringstream in{std::string(text_)};
  std::string raw;
  bool header = false, done = false;
  while (std::getline(in, raw)) {
    ++line_no_;
    std::string_view line = trim(raw);
    if (line.empty() || line.substr(0, 2) == "//") continue;
    if (done) return error("text after the closing '}'");
    if (!header) {
      DVM_RETURN_IF_ERROR(parse_header(line));
      header = true;
    } else if (line == "}") {
      done = true;
    } else if (line.substr(0, 6) == "return") {
      DVM_RETURN_IF_ERROR(parse_return(line));
    } else {
      DVM_RETURN_IF_ERROR(parse_node(line));
    }
  }
  if (!done) return error("missing closing '}'");
  if (def_->outputs.empty()) return error("graph has no outputs");
  return Graph(std::move(def_));
}

}  // namespace

StatusOr<Graph> parse_graph(std::string_view text) {
  return Parser(text).parse();
}

}  // namespace dvm
