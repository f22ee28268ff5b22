// Scheduling and emission: one stage + its layout -> a bytecode program (passes, peepholes,
// register allocation). Internal to src/encoder.
#pragma once

#include <vector>

#include "encoder/layout.h"

namespace dvm::enc {

class Emitter {
 public:
  Emitter(const ir::KernelDef& def, const ir::Binding& b, Stage& st, Layout& L, int num_slots,
          const bc::Target& target)
      : def_(def), b_(b), st_(st), L_(L), target_(target) {
    prog_.num_slots = num_slots;
    prog_.num_params = static_cast<int>(def.param_names.size());
    vreg_.assign(st.insts.size(), -1);
    direct_.assign(st.insts.size(), -1);
    operand_.resize(st.insts.size());
  }

  Status emit();
  // Does the target run row programs (Target::row_program_instr) and take every instruction
  // of this one's, over f32 memory? Its planner (vm::load) has the last word on the operands;
  // a program it declines runs with larger tiles than the L1 budget, as rows shorter than
  // long_row_cols always do.
  bool bandable() const;
  bc::Program& program() { return prog_; }
  int64_t bytes_moved() const { return bytes_; }

 private:
  uint32_t final_mask(uint32_t orig) const {
    uint32_t m = 0;
    for (int a = 0; a < kMaxDomAxes; ++a)
      if ((orig >> a & 1) && L_.final_of[a] >= 0) m |= 1u << L_.final_of[a];
    return m;
  }
  TileClass class_of(int i) const {
    uint32_t m = final_mask(st_.insts[i].vary);
    return bc::make_class(L_.row >= 0 && (m >> L_.row & 1), m >> L_.col & 1);
  }
  bool r_varying(int i) const { return final_mask(st_.insts[i].vary) & reduced_mask_; }
  CType ctype_of(int i) const { return compute_type(def_.nodes[st_.insts[i].node].dtype); }
  int add_desc(int slot, DType dtype, int64_t offset, const int64_t* dom_stride);
  int new_vreg() { return num_vregs_++; }
  void push(bc::Opcode op, CType t, TileClass cls, uint16_t aux, Operand d, Operand a = {},
            Operand b = {}, Operand c = {}) {
    code_.push_back(bc::Instr{op, t, cls, 0, aux, d, a, b, c});
  }
  int add_const(double f, int64_t i);
  Operand ensure(int i);
  Operand emit_compute(int i);
  Operand emit_cast(int i, Operand src);
  void emit_reduce_begin(int i);
  void emit_reduce_step(int i);
  Operand emit_reduce_end(int i);
  void emit_store(const Sink& s);
  void compute_levels();
  void emit_single_pass();
  void emit_loop_passes();
  void emit_pass_body(int pass);
  bool needed_in_pass(int i, int pass) const;
  void direct_store_peephole();
  void fma_peephole();
  void pre_op_peephole();
  void dot_peephole();
  bool chainable(const bc::Instr& in) const;
  void hoist_fills();
  void sink_fills();
  void chain_peephole();
  void chain_loop_bodies();
  void fit_tile_to_cache();
  void grow_streaming_tile();
  void grow_reduced_rows();
  void balance_row_blocks();
  bool tile_registers() const;
  void loop_outer_axis();
  Status allocate_registers();

  const ir::KernelDef& def_;
  const ir::Binding& b_;
  Stage& st_;
  Layout& L_;
  const bc::Target& target_;
  bc::Program prog_;
  std::vector<bc::Instr> code_;
  std::vector<int> vreg_;    // inst -> vreg holding its value in the current scope
  std::vector<int> direct_;  // inst -> descriptor read directly (loads)
  std::vector<Operand> operand_;
  std::vector<int> acc_idx_;  // reduce inst -> index accumulator vreg (arg reductions)
  std::vector<int> sink_desc_;
  int num_vregs_ = 0;
  uint32_t reduced_mask_ = 0;
  int max_level_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace dvm::enc
