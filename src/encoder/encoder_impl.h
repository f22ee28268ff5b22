// The Encoder behind encode() (encoder.h): stage construction (stage_builder.cc) visits a
// kernel's outputs and builds the stages, the first half of the runtime operator compiler;
// emit_stage (encoder.cc) hands each stage to the layout and the emitter.
#pragma once

#include <utility>
#include <vector>

#include "encoder/stage.h"

namespace dvm::enc {

class Encoder {
 public:
  Encoder(const ir::KernelDef& def, const ir::Binding& b, std::span<const TensorArg> inputs,
          std::span<const TensorArg> outputs, const EncodeOptions& opt)
      : def_(def), b_(b), inputs_(inputs), outputs_(outputs), opt_(opt) {}

  Status run(EncodedKernel* out);

 private:
  // stage construction
  Status add_sink(int node, const View& dst, bool joinable);
  Status add_sink_at(int node, const View& dst, bool joinable, int axis, int64_t at);
  bool find_concat_split(int node, int off, int depth, std::vector<char>* searched, int* axis,
                         std::vector<int64_t>* parts) const;
  bool reads_reduction(int node) const;
  Status visit(int stage, int node, const NodeMap& map, int* inst);
  bool reduces_over_unit_axes(int node) const;
  Status visit_reduce(int stage, int node, const NodeMap& map, int* inst);
  bool should_split(int stage, int node) const;
  Status visit_matmul(int stage, int node, const NodeMap& map, int* inst);
  Status operand_view(int node, View* v);
  void plan_matmuls();
  bool reduce_fits_matmul_tile(int node) const;
  int64_t reduced_extent(int node) const;
  bool matmul_rows_few(int node) const;
  Status visit_split_reduce(int stage, int node, const NodeMap& map, int* inst);
  Status visit_reshape(int stage, int node, const NodeMap& map, int* inst);
  Status load_inst(int stage, int node, const View& v, const NodeMap& map, int* inst);
  Status materialize(int node, View* ws);
  bool resolve_view(int node, View* v);
  int add_inst(int stage, Inst inst);
  int push_inst(int stage, Inst inst);
  int find_inst(int stage, int node, const NodeMap& map, InstKind kind) const;
  void plan_cuts();
  Status materialize_cuts();
  NodeMap broadcast_map(int out_node, int in_node, const NodeMap& m) const;
  int new_axis(int stage, int64_t extent);
  Status emit_stage(int stage, EncodedKernel* out);

  const ir::KernelDef& def_;
  const ir::Binding& b_;
  std::span<const TensorArg> inputs_;
  std::span<const TensorArg> outputs_;
  const EncodeOptions& opt_;
  std::vector<Stage> stages_;
  std::vector<int> order_;                               // stage execution order
  std::vector<std::pair<int, Workspace>> materialized_;  // node -> workspace
  std::vector<Workspace> workspaces_;
  // Per node: a matmul whose result feeds a reduction that cannot share its tile is computed
  // once into a workspace, instead of once in every stage that needs it.
  std::vector<char> mm_alone_;
  int computing_root_ = -1;  // the node a materialisation stage is being built for
  // Per node: computed by a stage of its own to bound the visit's recursion depth.
  std::vector<char> cut_;
  static constexpr int kMaxVisitDepth = 256;
};

}  // namespace dvm::enc
