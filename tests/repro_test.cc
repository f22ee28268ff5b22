// Inputs that once broke DVM (tests/repro/*.graph, printed by Graph::to_string() from real
// models): each must compile, fused and unfused, and both must agree at several bindings of
// its symbols. Index inputs hold valid indices (0), float inputs random values.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "graph_test_util.h"

namespace dvm::testing {
namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Random inputs for the graph's signature with every symbol bound to `value` (clamped into
// its range).
StatusOr<std::vector<HostTensor>> inputs_at(const Graph& g, int64_t value, std::mt19937& rng) {
  std::vector<HostTensor> in;
  std::vector<SymShape> shapes = g.input_shapes();
  std::vector<DType> dtypes = g.input_dtypes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    SymBindings b;
    for (const SymExpr& d : shapes[i])
      for (const std::string& s : d.symbols()) b[s] = value;
    std::vector<int64_t> shape;
    for (const SymExpr& d : shapes[i]) {
      DVM_ASSIGN_OR_RETURN(int64_t v, d.evaluate(b));
      shape.push_back(v);
    }
    if (is_float(dtypes[i])) {
      in.push_back(random_host(dtypes[i], shape, rng, -1, 1));
    } else {
      in.push_back(host(dtypes[i], shape));  // zeros: a valid index into any dim
    }
  }
  return in;
}

TEST(Repro, EveryGraphCompilesAndMatchesUnfused) {
  std::filesystem::path dir = std::filesystem::path(DVM_SOURCE_DIR) / "tests" / "repro";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".graph") continue;
    ++files;
    SCOPED_TRACE(entry.path().string());
    auto graph = parse_graph(read_file(entry.path()));
    ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
    auto fused = Executable::compile(*graph);
    ASSERT_TRUE(fused.is_ok()) << fused.status().to_string();
    GraphCompileOptions unfused_options;
    unfused_options.fuse = false;
    auto unfused = Executable::compile(*graph, unfused_options);
    ASSERT_TRUE(unfused.is_ok()) << unfused.status().to_string();
    std::mt19937 rng(7);
    for (int64_t s : {2, 5, 17}) {
      auto in = inputs_at(*graph, s, rng);
      ASSERT_TRUE(in.is_ok()) << in.status().to_string();
      auto got = run_graph(**fused, *in);
      ASSERT_TRUE(got.is_ok()) << got.status().to_string();
      auto want = run_graph(**unfused, *in);
      ASSERT_TRUE(want.is_ok()) << want.status().to_string();
      ASSERT_EQ(got->size(), want->size());
      for (size_t k = 0; k < got->size(); ++k)
        expect_close((*got)[k], (*want)[k], 1e-4, "output " + std::to_string(k));
    }
  }
  EXPECT_GE(files, 2);
}

}  // namespace
}  // namespace dvm::testing
