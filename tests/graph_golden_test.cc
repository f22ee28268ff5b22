// Golden fusion tests in the text form: each tests/golden/*.graph file holds a source graph,
// the IR after the pass pipeline, and the fusion report. A mismatch prints the whole actual
// file, ready to paste; DVM_UPDATE_GOLDEN=1 rewrites the files instead.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dvm/graph.h"

namespace dvm::testing {
namespace {

constexpr const char* kOptimized = "// ---- after the pass pipeline\n";
constexpr const char* kFusion = "// ---- fusion\n";

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string expected_text(const Graph& source, const Executable& exe) {
  return source.to_string() + kOptimized + exe.optimized().to_string() + kFusion +
         exe.fusion_report();
}

TEST(GraphGolden, FusionOfThePatterns) {
  std::filesystem::path dir = std::filesystem::path(DVM_SOURCE_DIR) / "tests" / "golden";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".graph") continue;
    ++files;
    std::string text = read_file(entry.path());
    size_t cut = text.find(kOptimized);
    auto source = parse_graph(text.substr(0, cut));
    ASSERT_TRUE(source.is_ok()) << entry.path() << ": " << source.status().to_string();
    auto exe = Executable::compile(*source);
    ASSERT_TRUE(exe.is_ok()) << entry.path() << ": " << exe.status().to_string();
    std::string actual = expected_text(*source, **exe);
    if (std::getenv("DVM_UPDATE_GOLDEN")) {
      std::ofstream(entry.path()) << actual;
      continue;
    }
    EXPECT_EQ(actual, text) << entry.path() << " differs; actual:\n" << actual;
  }
  EXPECT_GE(files, 6);
}

}  // namespace
}  // namespace dvm::testing
