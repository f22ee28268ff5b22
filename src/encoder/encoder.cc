// The runtime operator compiler's driver: stages (stage_builder), then per stage the layout
// (layout) and the program (emitter), verified; the backend loads the programs (vm::load).
#include "encoder/encoder.h"

#include <algorithm>

#include "bytecode/verifier.h"
#include "encoder/emitter.h"
#include "encoder/encoder_impl.h"

namespace dvm::enc {

Status Encoder::emit_stage(int stage, EncodedKernel* out) {
  Stage& st = stages_[stage];
  // The axis order follows the access that varies along the most axes; on a tie, an output
  // of an elementwise stage (a transposed store scatters a tile, a transposed load gathers it
  // into L1). Reduction stages keep the first load's order: their summation order then
  // matches the unfused kernels' (a reduced row read contiguously stays a row reduction).
  std::vector<StrideSet> sets;
  int ref = -1, best = -1;
  int sink_best = -1, sink_ref = -1;
  bool reduces = false;
  for (const Inst& in : st.insts) {
    reduces = reduces || in.kind == InstKind::kReduce || in.kind == InstKind::kMatMul;
    if (in.kind != InstKind::kLoad) continue;
    int nz = __builtin_popcount(in.vary);
    if (nz > best) {
      best = nz;
      ref = static_cast<int>(sets.size());
    }
    sets.push_back(StrideSet{in.dom_stride});
  }
  for (const Sink& s : st.sinks) {
    int nz = 0;
    for (int a = 0; a < kMaxDomAxes; ++a) nz += s.dom_stride[a] != 0;
    if (nz > sink_best) {
      sink_best = nz;
      sink_ref = static_cast<int>(sets.size());
    }
    sets.push_back(StrideSet{s.dom_stride});
  }
  if (sink_ref >= 0 && (sink_best > best || (sink_best == best && !reduces))) ref = sink_ref;
  Layout L;
  fold_axes(st, sets, ref, &L);
  choose_tiling(&L, *opt_.target, opt_.num_threads, st.partial, sets);
  int num_slots = static_cast<int>(inputs_.size() + outputs_.size() + workspaces_.size());
  Emitter em(def_, b_, st, L, num_slots, *opt_.target);
  DVM_RETURN_IF_ERROR(em.emit());
  bc::Program& prog = em.program();
  prog.name = def_.name + "#" + std::to_string(out->programs.size());
  std::vector<std::pair<int64_t, int64_t>> spans;
  DVM_RETURN_IF_ERROR(bc::verify(prog, &spans));
  for (size_t s = 0; s < spans.size() && s < out->slot_spans.size(); ++s) {
    auto& u = out->slot_spans[s];
    if (spans[s].first > spans[s].second) continue;
    u.first = std::min(u.first, spans[s].first);
    u.second = std::max(u.second, spans[s].second);
  }
  out->bytes_moved += em.bytes_moved();
  out->programs.push_back(std::move(prog));
  return Status::ok();
}

Status Encoder::run(EncodedKernel* out) {
  int ni = static_cast<int>(inputs_.size());
  plan_matmuls();
  plan_cuts();
  DVM_RETURN_IF_ERROR(materialize_cuts());
  for (size_t k = 0; k < def_.outputs.size(); ++k) {
    View v = arg_view(ni + static_cast<int>(k), outputs_[k]);
    DVM_RETURN_IF_ERROR(add_sink(def_.outputs[k].node, v, /*joinable=*/true));
  }
  for (size_t s = 0; s < stages_.size(); ++s)
    if (stages_[s].joinable) order_.push_back(static_cast<int>(s));
  out->num_inputs = ni;
  out->num_outputs = static_cast<int>(outputs_.size());
  size_t slots = inputs_.size() + outputs_.size() + workspaces_.size();
  out->slot_spans.assign(slots, {INT64_MAX, INT64_MIN});
  for (const Workspace& w : workspaces_) {
    out->workspace_bytes.push_back(w.view.shape.numel() * dtype_size(w.view.dtype));
    out->workspace_elems.push_back(w.view.shape.numel());
  }
  for (int s : order_) DVM_RETURN_IF_ERROR(emit_stage(s, out));
  return Status::ok();
}

Status encode(const ir::KernelDef& def, const ir::Binding& binding,
              std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
              const EncodeOptions& options, EncodedKernel* out) {
  if (options.target == nullptr) return internal_error(def.name + ": encode without a target");
  Encoder e(def, binding, inputs, outputs, options);
  return e.run(out);
}

}  // namespace dvm::enc
