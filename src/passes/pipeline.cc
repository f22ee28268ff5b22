// The pass pipeline: one ordered list. DVM_DUMP_IR=1 prints the IR after each pass.
#include <cstdio>

#include "base/env.h"
#include "passes/passes.h"

namespace dvm::passes {

namespace {

struct PassEntry {
  const char* name;
  StatusOr<GraphDef> (*run)(const GraphDef&);
  bool optimization;         // skipped when optimize == false
  bool best_effort = false;  // an error keeps the graph as it was (the pass only saves work)
};

constexpr PassEntry kPipeline[] = {
    {"decompose", decompose, false},
    {"canonicalize", canonicalize, true},
    {"constant_fold", constant_fold, true},
    {"cse", cse, true},
    {"narrow_rows", narrow_rows, true, true},
    {"canonicalize", canonicalize, true},
    {"dce", dce, false},
};

}  // namespace

StatusOr<GraphDef> run_pipeline(const GraphDef& g, bool optimize) {
  GraphDef cur = g;
  bool dump = base::env().dump_ir;
  for (const PassEntry& p : kPipeline) {
    if (p.optimization && !optimize) continue;
    StatusOr<GraphDef> next = p.run(cur);
    if (!next.is_ok()) {
      if (!p.best_effort) return next.status();
      if (dump)
        std::fprintf(stderr, "// %s skipped: %s\n", p.name, next.status().to_string().c_str());
      continue;
    }
    cur = std::move(next).value();
    if (dump) {
      auto shared = std::make_shared<GraphDef>(cur);
      std::fprintf(stderr, "// after %s\n%s", p.name, Graph(shared).to_string().c_str());
    }
  }
  return cur;
}

}  // namespace dvm::passes
