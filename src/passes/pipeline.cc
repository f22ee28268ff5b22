// The pass pipeline: one ordered list. DVM_DUMP_IR=1 prints the IR after each pass.
#include <cstdio>

#include "base/env.h"
#include "passes/passes.h"

namespace dvm::passes {

namespace {

struct PassEntry {
  const char* name;
  StatusOr<GraphDef> (*run)(const GraphDef&);
  bool optimization;  // skipped when optimize == false
};

constexpr PassEntry kPipeline[] = {
    {"decompose", decompose, false},        {"canonicalize", canonicalize, true},
    {"constant_fold", constant_fold, true}, {"cse", cse, true},
    {"canonicalize", canonicalize, true},   {"dce", dce, false},
};

}  // namespace

StatusOr<GraphDef> run_pipeline(const GraphDef& g, bool optimize) {
  GraphDef cur = g;
  bool dump = base::env().dump_ir;
  for (const PassEntry& p : kPipeline) {
    if (p.optimization && !optimize) continue;
    DVM_ASSIGN_OR_RETURN(cur, p.run(cur));
    if (dump) {
      auto shared = std::make_shared<GraphDef>(cur);
      std::fprintf(stderr, "// after %s\n%s", p.name, Graph(shared).to_string().c_str());
    }
  }
  return cur;
}

}  // namespace dvm::passes
