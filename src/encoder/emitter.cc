#include "encoder/emitter.h"

#include <algorithm>

#include "ops/op_traits.h"

namespace dvm::enc {

int Emitter::add_desc(int slot, DType dtype, int64_t offset, const int64_t* dom_stride) {
  bc::Descriptor d;
  d.slot = static_cast<uint16_t>(slot);
  d.dtype = dtype;
  d.offset = offset;
  int64_t touched = 1;
  for (int a = 0; a < kMaxDomAxes; ++a) {
    int f = L_.final_of[a];
    if (f < 0 || dom_stride[a] == 0) continue;
    d.stride[f] = dom_stride[L_.axes[f].inner];  // a folded axis walks like its innermost
  }
  for (size_t f = 0; f < L_.axes.size(); ++f)
    if (d.stride[f] != 0) touched *= L_.axes[f].extent;
  bytes_ += touched * dtype_size(dtype);
  prog_.descs.push_back(d);
  return static_cast<int>(prog_.descs.size()) - 1;
}

int Emitter::add_const(double f, int64_t i) {
  bc::Constant c;
  c.f32 = static_cast<float>(f);
  c.i32 = static_cast<int32_t>(static_cast<uint64_t>(i));
  c.i64 = i;
  prog_.consts.push_back(c);
  return static_cast<int>(prog_.consts.size()) - 1;
}

Operand Emitter::ensure(int i) {
  const Inst& in = st_.insts[i];
  if (vreg_[i] >= 0) return operand_[i];
  const Node& n = def_.nodes[in.node];
  if (in.kind == InstKind::kScalar) {
    if (n.kind == OpKind::kParam) return Operand::param(n.slot);
    return Operand::constant(add_const(n.fconst, n.iconst));
  }
  if (in.kind == InstKind::kLoad) {
    if (direct_[i] < 0)
      direct_[i] = add_desc(in.view.slot, in.view.dtype, in.dom_offset, in.dom_stride);
    const bc::Descriptor& d = prog_.descs[direct_[i]];
    int64_t cs = d.stride[L_.col];
    bool direct = in.view.dtype == ctype_dtype(ctype_of(i)) && (cs == 0 || cs == 1);
    if (direct) return Operand::desc(direct_[i]);
    Operand dst = Operand::reg(new_vreg(), class_of(i));
    push(bc::Opcode::kLoad, ctype_of(i), class_of(i), 0, dst, Operand::desc(direct_[i]));
    vreg_[i] = dst.index;
    operand_[i] = dst;
    return dst;
  }
  if (in.kind == InstKind::kMatMul) {
    const Inst& a = st_.insts[in.inputs[0]];
    const Inst& b = st_.insts[in.inputs[1]];
    int da = add_desc(a.view.slot, a.view.dtype, a.dom_offset, a.dom_stride);
    int db = add_desc(b.view.slot, b.view.dtype, b.dom_offset, b.dom_stride);
    Operand dst = Operand::reg(new_vreg(), class_of(i));
    push(bc::Opcode::kMatMul, CType::kF32, class_of(i),
         static_cast<uint16_t>(L_.final_of[in.contract]), dst, Operand::desc(da),
         Operand::desc(db));
    vreg_[i] = dst.index;
    operand_[i] = dst;
    return dst;
  }
  if (in.kind == InstKind::kReduce) {
    if (L_.loop_mode) return operand_[i];  // computed by its pass
    emit_reduce_begin(i);
    emit_reduce_step(i);
    return emit_reduce_end(i);
  }
  Operand r = emit_compute(i);
  vreg_[i] = r.index;
  operand_[i] = r;
  return r;
}

Operand Emitter::emit_cast(int i, Operand src) {
  const Inst& in = st_.insts[i];
  const Node& n = def_.nodes[in.node];
  CType from = ctype_of(in.inputs[0]);
  CType to = compute_type(n.dtype);
  TileClass cls = class_of(i);
  if (n.dtype == DType::kBool) {
    Operand d = Operand::reg(new_vreg(), cls);
    push(bc::Opcode::kBNe, from, cls, 0, d, src, Operand::constant(add_const(0, 0)));
    return d;
  }
  if (from != to) {
    Operand d = Operand::reg(new_vreg(), cls);
    push(bc::Opcode::kCast, from, cls, static_cast<uint16_t>(to), d, src);
    src = d;
  }
  if (n.dtype == DType::kF16 || n.dtype == DType::kBF16) {
    Operand d = Operand::reg(new_vreg(), cls);
    push(n.dtype == DType::kF16 ? bc::Opcode::kRoundF16 : bc::Opcode::kRoundBF16, CType::kF32, cls,
         0, d, src);
    return d;
  }
  if (src.kind != bc::OperandKind::kReg) {
    Operand d = Operand::reg(new_vreg(), cls);  // keep every computed value in a register
    push(bc::Opcode::kMov, to, cls, 0, d, src);
    return d;
  }
  return src;
}

Operand Emitter::emit_compute(int i) {
  const Inst& in = st_.insts[i];
  const Node& n = def_.nodes[in.node];
  Operand srcs[3];
  for (size_t k = 0; k < in.inputs.size(); ++k) srcs[k] = ensure(in.inputs[k]);
  TileClass cls = class_of(i);
  if (n.kind == OpKind::kCast) return emit_cast(i, srcs[0]);
  Operand d = Operand::reg(new_vreg(), cls);
  CType t = ctype_of(in.inputs[0]);
  switch (n.kind) {
    case OpKind::kUnary:
      push(bc::opcode_of(static_cast<UnaryOp>(n.op)), t, cls, 0, d, srcs[0]);
      break;
    case OpKind::kBinary: {
      TileClass dc = class_of(in.inputs[1]);
      bool narrow_divisor = n.binary_op() == BinaryOp::kDiv && t == CType::kF32 &&
                            srcs[1].kind == bc::OperandKind::kReg && dc != cls;
      if (narrow_divisor) {
        // x / s with s broadcast along the tile (softmax's row sums): one reciprocal per s,
        // then a multiply per element (division costs several multiplies). Differs from
        // true division by at most one rounding (<= 1 ulp).
        Operand r = Operand::reg(new_vreg(), dc);
        push(bc::Opcode::kUReciprocal, t, dc, 0, r, srcs[1]);
        push(bc::Opcode::kBMul, t, cls, 0, d, srcs[0], r);
        break;
      }
      push(bc::opcode_of(static_cast<BinaryOp>(n.op)), t, cls, 0, d, srcs[0], srcs[1]);
      break;
    }
    case OpKind::kSelect:
      push(bc::Opcode::kSelect, ctype_of(i), cls, 0, d, srcs[0], srcs[1], srcs[2]);
      break;
    default:
      break;
  }
  return d;
}

void Emitter::emit_reduce_begin(int i) {
  const Inst& in = st_.insts[i];
  ReduceOp op = def_.nodes[in.node].reduce_op();
  CType t = ctype_of(in.inputs[0]);
  TileClass cls = class_of(i);
  if (op == ReduceOp::kMean) op = ReduceOp::kSum;
  Operand acc = Operand::reg(new_vreg(), cls);
  push(bc::Opcode::kFill, t, cls, bc::reduce_aux(op, false, false), acc);
  vreg_[i] = acc.index;
  operand_[i] = acc;
  if (ops::is_arg_reduce(op)) {
    Operand idx = Operand::reg(new_vreg(), cls);
    push(bc::Opcode::kFill, CType::kI64, cls, bc::reduce_aux(ReduceOp::kSum, false, false), idx);
    acc_idx_[i] = idx.index;
  }
}

void Emitter::emit_reduce_step(int i) {
  const Inst& in = st_.insts[i];
  ReduceOp op = def_.nodes[in.node].reduce_op();
  if (op == ReduceOp::kMean) op = ReduceOp::kSum;
  CType t = ctype_of(in.inputs[0]);
  uint32_t red = final_mask(in.reduced);
  bool rows = L_.row >= 0 && (red >> L_.row & 1);
  bool cols = red >> L_.col & 1;
  Operand src = ensure(in.inputs[0]);
  TileClass sc = class_of(in.inputs[0]);
  TileClass wide = bc::make_class(bc::class_has_rows(sc) || rows, bc::class_has_cols(sc) || cols);
  if (wide != sc) {
    // The input does not vary along a reduced tile axis: broadcast it to the tile first.
    Operand w = Operand::reg(new_vreg(), wide);
    push(bc::Opcode::kMov, t, wide, 0, w, src);
    src = w;
  }
  Operand acc = Operand::reg(vreg_[i], class_of(i));
  if (ops::is_arg_reduce(op)) {
    int axis = 0;
    for (int a = 0; a < static_cast<int>(L_.axes.size()); ++a)
      if (red >> a & 1) axis = a;
    if (red == 0) return;  // reduced axis of extent 1: index 0, as filled
    push(bc::Opcode::kArgReduce, t, wide, bc::reduce_aux(op, rows, cols, axis), acc, src,
         Operand::reg(acc_idx_[i], class_of(i)));
    return;
  }
  push(bc::Opcode::kReduce, t, wide, bc::reduce_aux(op, rows, cols), acc, src);
}

Operand Emitter::emit_reduce_end(int i) {
  const Inst& in = st_.insts[i];
  ReduceOp op = def_.nodes[in.node].reduce_op();
  TileClass cls = class_of(i);
  Operand r = operand_[i];
  if (ops::is_arg_reduce(op)) {
    r = Operand::reg(acc_idx_[i], cls);
  } else if (op == ReduceOp::kMean && !st_.partial) {
    int64_t count = 1;
    const CShape& s = b_.shapes[def_.nodes[in.node].inputs[0]];
    for (int64_t a : def_.nodes[in.node].attr) count *= s.d[a];
    Operand d = Operand::reg(new_vreg(), cls);
    double inv = 1.0 / static_cast<double>(count);  // count 0: inf, and 0 * inf = NaN
    push(bc::Opcode::kBMul, CType::kF32, cls, 0, d, r, Operand::constant(add_const(inv, 0)));
    r = d;
  }
  vreg_[i] = r.index;
  operand_[i] = r;
  return r;
}

void Emitter::emit_store(const Sink& s) {
  Operand src = ensure(s.inst);
  int d = add_desc(s.slot, s.dtype, s.dom_offset, s.dom_stride);
  // The destination may vary along a tile axis the value does not (a broadcast stored): the
  // store walks the destination's tile, reading the value with stride 0 along that axis.
  uint32_t dst = 0;
  for (int a = 0; a < kMaxDomAxes; ++a)
    if (s.dom_stride[a] != 0) dst |= 1u << a;
  dst = final_mask(dst);
  TileClass cls = class_of(s.inst);
  cls = bc::make_class(bc::class_has_rows(cls) || (L_.row >= 0 && (dst >> L_.row & 1)),
                       bc::class_has_cols(cls) || (dst >> L_.col & 1));
  push(bc::Opcode::kStore, ctype_of(s.inst), cls, 0, Operand::desc(d), src);
}

void Emitter::compute_levels() {
  for (size_t i = 0; i < st_.insts.size(); ++i) {
    Inst& in = st_.insts[i];
    int lvl = 0;
    for (int c : in.inputs) lvl = std::max(lvl, st_.insts[c].level);
    in.level = in.kind == InstKind::kReduce ? lvl + 1 : lvl;
    max_level_ = std::max(max_level_, in.level);
  }
}

void Emitter::emit_single_pass() {
  for (const Sink& s : st_.sinks) emit_store(s);
}

void Emitter::emit_pass_body(int pass) {
  std::vector<int> reduces;
  for (size_t i = 0; i < st_.insts.size(); ++i) {
    const Inst& in = st_.insts[i];
    if (in.kind == InstKind::kReduce && in.level == pass + 1)
      reduces.push_back(static_cast<int>(i));
  }
  std::vector<const Sink*> stores;
  for (const Sink& s : st_.sinks)
    if (r_varying(s.inst) && st_.insts[s.inst].level == pass) stores.push_back(&s);
  if (reduces.empty() && stores.empty()) return;
  for (int r : reduces) emit_reduce_begin(r);
  for (size_t i = 0; i < st_.insts.size(); ++i)
    if (r_varying(static_cast<int>(i))) vreg_[i] = -1;
  int loops = 0;
  for (size_t a = 0; a < L_.bc_axes.size(); ++a) {
    if (L_.bc_axes[a].iter != bc::AxisIter::kLoop) continue;
    push(bc::Opcode::kLoop, CType::kF32, TileClass::kScalar, static_cast<uint16_t>(a), Operand{});
    ++loops;
  }
  for (int r : reduces) emit_reduce_step(r);
  for (const Sink* s : stores) emit_store(*s);
  for (int k = 0; k < loops; ++k)
    push(bc::Opcode::kEndLoop, CType::kF32, TileClass::kScalar, 0, Operand{});
  for (size_t i = 0; i < st_.insts.size(); ++i)
    if (r_varying(static_cast<int>(i))) vreg_[i] = -1;
  for (int r : reduces) emit_reduce_end(r);
}

void Emitter::emit_loop_passes() {
  compute_levels();
  for (int pass = 0; pass <= max_level_; ++pass) {
    // Values that do not vary along the reduced axes are computed once, outside the loops.
    for (size_t i = 0; i < st_.insts.size(); ++i) {
      const Inst& in = st_.insts[i];
      if (in.level <= pass && !r_varying(static_cast<int>(i)) && in.kind != InstKind::kReduce)
        ensure(static_cast<int>(i));
    }
    emit_pass_body(pass);
  }
  for (const Sink& s : st_.sinks)
    if (!r_varying(s.inst)) emit_store(s);
}

// Field usage per operand format: bit 0 d, 1 a, 2 b, 3 c.
int used_fields(const bc::Instr& in) {
  if (in.flags != 0) return 7;  // a unary op with a pre-op reads B too
  switch (bc::kOpInfo[static_cast<int>(in.op)].format) {
    case bc::OperandFormat::kNone:
    case bc::OperandFormat::kAxis:
      return 0;
    case bc::OperandFormat::kDst:
      return 1;
    case bc::OperandFormat::kDstSrc:
      return 3;
    case bc::OperandFormat::kDstSrc2:
      return 7;
    case bc::OperandFormat::kDstSrc3:
      return 15;
  }
  return 0;
}

template <class I>  // bc::Instr or const bc::Instr
auto* field_of(I& in, int k) {
  switch (k) {
    case 0:
      return &in.d;
    case 1:
      return &in.a;
    case 2:
      return &in.b;
    default:
      return &in.c;
  }
}
Operand* field(bc::Instr& in, int k) {
  return field_of(in, k);
}
const Operand* field(const bc::Instr& in, int k) {
  return field_of(in, k);
}

// Per virtual register: how many instructions read it (accumulators count as read by their
// reductions) and where it is defined (last definition).
void count_uses(const std::vector<bc::Instr>& code, int num_vregs, std::vector<int>* reads,
                std::vector<int>* def_at) {
  reads->assign(num_vregs, 0);
  def_at->assign(num_vregs, -1);
  for (size_t pc = 0; pc < code.size(); ++pc) {
    bc::Instr in = code[pc];
    int used = used_fields(in);
    for (int k = 1; k < 4; ++k) {
      Operand* o = field(in, k);
      if ((used >> k & 1) && o->kind == bc::OperandKind::kReg) (*reads)[o->index]++;
    }
    bool acc = in.op == bc::Opcode::kReduce || in.op == bc::Opcode::kArgReduce ||
               in.op == bc::Opcode::kReduceDot;
    if (acc) (*reads)[in.d.index]++;
    if ((used & 1) && in.d.kind == bc::OperandKind::kReg)
      (*def_at)[in.d.index] = static_cast<int>(pc);
  }
}

void drop_dead(const std::vector<bool>& dead, std::vector<bc::Instr>* code) {
  std::vector<bc::Instr> out;
  for (size_t pc = 0; pc < code->size(); ++pc)
    if (!dead[pc]) out.push_back((*code)[pc]);
  *code = std::move(out);
}

bool writes_result(const bc::Instr& in) {
  bc::Family f = bc::kOpInfo[static_cast<int>(in.op)].family;
  if (f == bc::Family::kUnary || f == bc::Family::kBinary) return true;
  return f == bc::Family::kData && in.op != bc::Opcode::kLoad && in.op != bc::Opcode::kStore;
}

CType result_ctype(const bc::Instr& in) {
  if (in.op == bc::Opcode::kCast) return static_cast<CType>(in.aux);
  if (bc::is_binary(in.op) && ops::returns_bool(bc::binary_of(in.op))) return CType::kI32;
  if (bc::is_unary(in.op) && ops::is_predicate(bc::unary_of(in.op))) return CType::kI32;
  return in.ctype;
}

// A value computed only to be stored is written straight to the output by its last op.
void Emitter::direct_store_peephole() {
  std::vector<int> reads, def_at;
  count_uses(code_, num_vregs_, &reads, &def_at);
  std::vector<bc::Instr> out;
  for (bc::Instr& in : code_) {
    // A rounding to f16/bf16 that only a store to that type reads: the store rounds the same
    // way (rounding twice to the same format is rounding once), so the store reads its source.
    if (in.op == bc::Opcode::kStore && !out.empty() && in.a.kind == bc::OperandKind::kReg) {
      const bc::Instr& prev = out.back();
      const DType t = prog_.descs[in.d.index].dtype;
      const bool same = (prev.op == bc::Opcode::kRoundF16 && t == DType::kF16) ||
                        (prev.op == bc::Opcode::kRoundBF16 && t == DType::kBF16);
      if (same && prev.d.kind == bc::OperandKind::kReg && prev.d.index == in.a.index &&
          reads[in.a.index] == 1 && prev.cls == in.cls && prev.ctype == in.ctype) {
        in.a = prev.a;
        out.pop_back();
      }
    }
    if (in.op == bc::Opcode::kStore && !out.empty() && in.a.kind == bc::OperandKind::kReg) {
      bc::Instr& prev = out.back();
      const bc::Descriptor& d = prog_.descs[in.d.index];
      bool cols_ok = !bc::class_has_cols(in.cls) || d.stride[L_.col] == 1;
      if (writes_result(prev) && prev.d.kind == bc::OperandKind::kReg &&
          prev.d.index == in.a.index && reads[in.a.index] == 1 && prev.cls == in.cls &&
          d.dtype == ctype_dtype(result_ctype(prev)) && cols_ok) {
        prev.d = in.d;
        continue;
      }
    }
    out.push_back(in);
  }
  code_ = std::move(out);
}

// x * y + z with the product used once becomes one fused multiply-add: one pass over the
// tile instead of two (f32 only; the rounding is that of a true FMA).
void Emitter::fma_peephole() {
  std::vector<int> reads, def_at;
  count_uses(code_, num_vregs_, &reads, &def_at);
  std::vector<bool> dead(code_.size(), false);
  for (bc::Instr& in : code_) {
    if (in.op != bc::Opcode::kBAdd || in.ctype != CType::kF32) continue;
    for (int k = 0; k < 2; ++k) {
      Operand prod = k == 0 ? in.a : in.b;
      Operand other = k == 0 ? in.b : in.a;
      if (prod.kind != bc::OperandKind::kReg || reads[prod.index] != 1) continue;
      int at = def_at[prod.index];
      if (at < 0 || dead[at]) continue;
      const bc::Instr& mul = code_[at];
      if (mul.op != bc::Opcode::kBMul || mul.ctype != CType::kF32 || mul.cls != in.cls) continue;
      in = bc::Instr{bc::Opcode::kFma, CType::kF32, in.cls, 0, 0, in.d, mul.a, mul.b, other};
      dead[at] = true;
      break;
    }
  }
  drop_dead(dead, &code_);
}

// sum(x * y) with the product read only by the reduction becomes one reduce.dot pass (the
// variance of layernorm, the sum of squares of rmsnorm): no product tile is written.
void Emitter::dot_peephole() {
  std::vector<int> reads, def_at;
  count_uses(code_, num_vregs_, &reads, &def_at);
  std::vector<bool> dead(code_.size(), false);
  for (bc::Instr& in : code_) {
    if (in.op != bc::Opcode::kReduce || in.ctype != CType::kF32 ||
        bc::aux_reduce_op(in.aux) != ReduceOp::kSum || in.a.kind != bc::OperandKind::kReg ||
        reads[in.a.index] != 1)
      continue;
    int at = def_at[in.a.index];
    if (at < 0 || dead[at]) continue;
    const bc::Instr& mul = code_[at];
    if (mul.op != bc::Opcode::kBMul || mul.ctype != CType::kF32 || mul.cls != in.cls) continue;
    in = bc::Instr{bc::Opcode::kReduceDot, CType::kF32, in.cls, 0, in.aux, in.d, mul.a, mul.b, {}};
    dead[at] = true;
  }
  drop_dead(dead, &code_);
}

// op(x + y) / op(x - y) with the sum read only by the op: the add/sub runs inside the op's
// pass (bias + gelu, x - max before exp in softmax).
void Emitter::pre_op_peephole() {
  std::vector<int> reads, def_at;
  count_uses(code_, num_vregs_, &reads, &def_at);
  std::vector<bool> dead(code_.size(), false);
  for (bc::Instr& in : code_) {
    if (!bc::is_unary(in.op) || in.ctype != CType::kF32 || in.flags != 0 ||
        in.a.kind != bc::OperandKind::kReg || reads[in.a.index] != 1 ||
        ops::is_predicate(bc::unary_of(in.op)))
      continue;
    int at = def_at[in.a.index];
    if (at < 0 || dead[at]) continue;
    const bc::Instr& sum = code_[at];
    bool add = sum.op == bc::Opcode::kBAdd, sub = sum.op == bc::Opcode::kBSub;
    if ((!add && !sub) || sum.ctype != CType::kF32 || sum.cls != in.cls) continue;
    in.flags = add ? bc::kPreAdd : bc::kPreSub;
    in.a = sum.a;
    in.b = sum.b;
    dead[at] = true;
  }
  drop_dead(dead, &code_);
}

// Chain members: f32 elementwise math and row reductions over full tiles or column vectors
// (row-class values are one per row: a strip would be a single element).
bool chainable_op(const bc::Instr& in) {
  return bc::chain_body_op(in) && (in.cls == TileClass::kFull || in.cls == TileClass::kCol);
}

// Does `in` read or write any register?
bool touches_register(const bc::Instr& in) {
  const int used = used_fields(in);
  for (int k = 0; k < 4; ++k)
    if ((used >> k & 1) && field(in, k)->kind == bc::OperandKind::kReg) return true;
  return false;
}

bool uses_reg(bc::Instr in, int reg) {
  int used = used_fields(in);
  for (int k = 0; k < 4; ++k) {
    const Operand* o = field(in, k);
    if ((used >> k & 1) && o->kind == bc::OperandKind::kReg && o->index == reg) return true;
  }
  return false;
}

// Can code[i, j) be a chain body? Every elementwise member but the last writes a register
// defined only there: chain-local when every read of it is inside the run, else marked keep
// in *keep (the chain writes it in place); at least one is chain-local. A reduction's
// accumulator is touched by no other member (strips would see partial results).
bool chain_ok(const std::vector<bc::Instr>& code, const std::vector<int>& reads,
              const std::vector<int>& def_at, size_t i, size_t j, unsigned* keep) {
  *keep = 0;
  int local = 0;
  for (size_t m = i; m < j; ++m) {
    if (bc::chain_reduce_op(code[m])) {
      for (size_t q = i; q < j; ++q)
        if (q != m && uses_reg(code[q], code[m].d.index)) return false;
      continue;
    }
    if (m + 1 == j) break;
    const Operand& d = code[m].d;
    if (d.kind != bc::OperandKind::kReg || def_at[d.index] != static_cast<int>(m)) return false;
    int inside = 0;
    for (size_t q = m + 1; q < j; ++q) {
      bc::Instr in = code[q];
      int used = used_fields(in);
      for (int k = 1; k < 4; ++k) {
        const Operand* o = field(in, k);
        if ((used >> k & 1) && o->kind == bc::OperandKind::kReg && o->index == d.index) ++inside;
      }
    }
    if (inside != reads[d.index]) {
      *keep |= 1u << (m - i);
    } else {
      ++local;
    }
  }
  // Without a chain-local value the strips save no pass, and short rows would pay a kernel
  // call per strip and member instead of one per tile and instruction.
  return local > 0;
}

// Loads and stores join chains only to convert f16/bf16 memory: an f32 load here is a gather
// (a transposed operand has its own column-wise copy), and f32 stores are direct writes.
bool Emitter::chainable(const bc::Instr& in) const {
  if (!chainable_op(in)) return false;
  if (in.op != bc::Opcode::kLoad && in.op != bc::Opcode::kStore) return true;
  const DType t = prog_.descs[(in.op == bc::Opcode::kLoad ? in.a : in.d).index].dtype;
  return t == DType::kF16 || t == DType::kBF16;
}

// A reduction's Fill moves up over the chainable instructions just before it (none of them
// touches its accumulator), so that the reduction can join their chain: log-softmax's
// `c = x - m; e = exp(c); fill s; s = sum(e)` becomes `fill s; chain(c = x - m; e = exp(c);
// s = sum(e))`. Only that far: an accumulator live longer than needed would cost a register.
void Emitter::hoist_fills() {
  for (size_t p = 1; p < code_.size(); ++p) {
    if (code_[p].op != bc::Opcode::kFill) continue;
    const int acc = code_[p].d.index;
    for (size_t q = p; q > 0 && chainable(code_[q - 1]) && !uses_reg(code_[q - 1], acc); --q)
      std::swap(code_[q - 1], code_[q]);
  }
}

// Undoes hoist_fills where no chain formed: a Fill moves back down to just before the first
// use of its accumulator (or a chain head, a loop boundary), so that it starts no register's
// life earlier than needed.
void Emitter::sink_fills() {
  for (size_t p = code_.size(); p-- > 0;) {
    if (code_[p].op != bc::Opcode::kFill) continue;
    const int acc = code_[p].d.index;
    for (size_t q = p; q + 1 < code_.size(); ++q) {
      const bc::Instr& next = code_[q + 1];
      if (next.op == bc::Opcode::kChain || next.op == bc::Opcode::kLoop ||
          next.op == bc::Opcode::kEndLoop || uses_reg(next, acc))
        break;
      std::swap(code_[q], code_[q + 1]);
    }
  }
}

// Runs of elementwise instructions and row reductions become one Chain: the run makes one
// strip-mined pass over the tile with its chain-local intermediates in L1, instead of one
// pass per instruction through tile registers (chain10: 6 passes -> 1), and a reduction of a
// value computed in the run never stores it (log-sum-exp: exp(x - m) is summed strip by
// strip).
void Emitter::chain_peephole() {
  hoist_fills();
  std::vector<int> reads, def_at;
  count_uses(code_, num_vregs_, &reads, &def_at);
  std::vector<bc::Instr> out;
  size_t i = 0;
  while (i < code_.size()) {
    size_t e = i;
    while (e < code_.size() && e - i < static_cast<size_t>(bc::kMaxChainBody) &&
           chainable(code_[e]) && code_[e].cls == code_[i].cls)
      ++e;
    size_t end = i;
    unsigned keep = 0;
    // At least two members: a chain of one saves no pass (but see chain_loop_bodies).
    for (size_t j = e; j >= i + 2 && end == i; --j)
      if (chain_ok(code_, reads, def_at, i, j, &keep)) end = j;
    if (end == i) {
      out.push_back(code_[i++]);
      continue;
    }
    out.push_back(bc::Instr{bc::Opcode::kChain,
                            CType::kF32,
                            code_[i].cls,
                            0,
                            bc::chain_aux(static_cast<int>(end - i), keep),
                            {},
                            {},
                            {},
                            {}});
    for (; i < end; ++i) out.push_back(code_[i]);
  }
  code_ = std::move(out);
  sink_fills();
}

bool Emitter::bandable() const {
  if (target_.row_program_instr == nullptr) return false;
  for (const bc::Descriptor& d : prog_.descs)
    if (d.dtype != DType::kF32) return false;
  for (const bc::Instr& in : code_)
    if (in.op != bc::Opcode::kChain && !target_.row_program_instr(in)) return false;
  return true;
}

// Shrinks parallel tile chunks until the live registers fit the L1 budget.
void Emitter::fit_tile_to_cache() {
  bc::Axis& col = L_.bc_axes[L_.col];
  bc::Axis* row = L_.row >= 0 ? &L_.bc_axes[L_.row] : nullptr;
  auto bytes = [&] {
    return static_cast<int64_t>(std::max(1, prog_.num_regs)) * (row ? row->chunk : 1) *
           round16(col.chunk) * 4;
  };
  // Rows reduced along long columns keep their registers in L1 (kRowRegBudgetBytes), down to
  // kMinLongRowTile rows; shorter rows keep the larger budget (see both constants).
  const TileTuning& tune = tile_tuning();
  // A target that bands row programs keeps their rows in L1 at any tile size: there larger
  // tiles only mean fewer blocks (1 thread, interleaved, Zen 4, all budgets at 384 KiB
  // against 48 KiB: add+layernorm rows of 768 at 64K/1M/4M elements 1.13x/1.20x/1.04x
  // faster, rows of 256 1.05x/1.11x/1.02x; softmax rows of 512, log-softmax and rmsnorm rows
  // of 16384 within 3%; 2 threads: add+layernorm 0.94-1.13x).
  const bool long_rows = L_.axes[L_.col].reduced && col.chunk >= tune.long_row_cols && !bandable();
  const int64_t budget = long_rows ? tune.row_reg_budget_bytes : tune.reg_budget_bytes;
  while (bytes() > budget) {
    if (long_rows && row && row->chunk <= kMinLongRowTile) break;
    if (row && !L_.axes[L_.row].reduced && row->chunk > 1) {
      row->chunk = (row->chunk + 1) / 2;
    } else if (!L_.axes[L_.col].reduced && col.chunk >= 1024) {
      col.chunk = round16(col.chunk / 2);
    } else {
      break;
    }
  }
}

namespace {
// The grid's blocks along every axis but `axis`.
int64_t grid_blocks_except(const std::vector<bc::Axis>& axes, int axis) {
  int64_t blocks = 1;
  for (size_t a = 0; a < axes.size(); ++a)
    if (static_cast<int>(a) != axis && axes[a].iter == bc::AxisIter::kGrid)
      blocks *= axes[a].trips();
  return blocks;
}
}  // namespace

// A program whose only register values are chain-local (chains over memory, and
// instructions reading and writing memory directly) touches no tile register: its tile size
// costs no cache, only per-tile dispatch, which for cheap bodies (a bf16 load and an fma:
// 0.1 ns per element) is as large as the work. Such tiles grow up to 4x, as long as the
// grid keeps the blocks the threads want (Layout::wanted_blocks).
void Emitter::grow_streaming_tile() {
  for (size_t pc = 0; pc < code_.size(); ++pc) {
    bc::Instr in = code_[pc];
    if (in.op == bc::Opcode::kLoop || in.op == bc::Opcode::kEndLoop) return;
    if (in.op != bc::Opcode::kChain) {
      if (touches_register(in)) return;
      continue;
    }
    if (in.aux >> 8) return;  // kept values
    const size_t end = pc + bc::chain_length(in.aux);
    if (code_[end].d.kind == bc::OperandKind::kReg) return;  // a register result
    for (size_t m = pc + 1; m <= end; ++m)
      if (bc::chain_reduce_op(code_[m])) return;
    pc = end;
  }
  const int axis = L_.row >= 0 ? L_.row : L_.col;
  bc::Axis& ax = L_.bc_axes[axis];
  if (L_.axes[axis].reduced || ax.iter != bc::AxisIter::kGrid) return;
  const int64_t other = grid_blocks_except(L_.bc_axes, axis);
  for (int grow = 0; grow < 2; ++grow) {
    bc::Axis bigger = ax;
    bigger.chunk = std::min(ax.extent, 2 * ax.chunk);
    if (axis == L_.col) bigger.chunk = std::min(ax.extent, round16(bigger.chunk));
    if (bigger.chunk == ax.chunk || bigger.trips() * other < L_.wanted_blocks()) return;
    if (axis == L_.row && bigger.trips() < min_row_tiles(L_)) return;
    ax = bigger;
  }
}

// Row blocks of equal size: a last block of a few rows left the threads uneven work
// (permute_heads over 1365 rows in blocks of 256: one thread's 3 blocks held 768 rows, the
// other's 597). And, where the grid has few blocks, a few more of them when that makes their
// number a multiple of the threads: blocks are dealt to threads in contiguous ranges, so 9
// blocks on 2 threads ran as 5 + 4 (a row broadcast over 682 x 96 elements: 9 blocks of 76
// rows, now 10 of 69). Smaller chunks only: the registers still fit the cache. Grid row tiles
// only, not reduced, no matmul: a row tile's size then changes no sum, so the bits do not
// depend on the thread count.
void Emitter::balance_row_blocks() {
  if (st_.has_matmul || L_.row < 0 || L_.axes[L_.row].reduced) return;
  bc::Axis& row = L_.bc_axes[L_.row];
  if (row.iter != bc::AxisIter::kGrid || row.chunk <= 0) return;
  int64_t blocks = row.trips();
  const int64_t other = grid_blocks_except(L_.bc_axes, L_.row);
  const int64_t threads = L_.threads;
  if (threads > 1 && other > 0 && blocks * other % threads != 0 && blocks * other < 8 * threads) {
    for (int64_t more = blocks + 1; more <= blocks + threads && more <= row.extent; ++more) {
      const int64_t chunk = (row.extent + more - 1) / more;
      const int64_t trips = (row.extent + chunk - 1) / chunk;
      if (trips * other % threads == 0) {
        blocks = trips;
        break;
      }
    }
  }
  if (blocks > 1) row.chunk = (row.extent + blocks - 1) / blocks;
}

// Does any instruction use a register of a whole tile or a tile column (kFull, kRow)? Without
// one, the tile's size costs no cache: its memory operands stream through once. A chain's
// local values (defined by a member that is not kept, read only by later members) do not
// count: the VM holds them in per-strip scratch whatever the tile's size (rotary's halves, a
// product of permuted operands).
bool Emitter::tile_registers() const {
  const auto tile_reg = [](const Operand& o) {
    return o.kind == bc::OperandKind::kReg &&
           (o.cls == bc::TileClass::kFull || o.cls == bc::TileClass::kRow);
  };
  for (size_t pc = 0; pc < code_.size(); ++pc) {
    const bc::Instr& head = code_[pc];
    if (head.op != bc::Opcode::kChain) {
      const int used = used_fields(head);
      for (int k = 0; k < 4; ++k)
        if ((used >> k & 1) && tile_reg(*field(head, k))) return true;
      continue;
    }
    const int len = bc::chain_length(head.aux);
    std::vector<int> local;  // registers this chain defined for its own later members
    const auto is_local = [&](int reg) {
      return std::find(local.begin(), local.end(), reg) != local.end();
    };
    for (int m = 0; m < len; ++m) {
      const bc::Instr& in = code_[pc + 1 + m];
      const int used = used_fields(in);
      for (int k = 1; k < 4; ++k) {
        const Operand* o = field(in, k);
        if ((used >> k & 1) && tile_reg(*o) && !is_local(o->index)) return true;
      }
      if (in.d.kind != bc::OperandKind::kReg) continue;
      std::erase(local, static_cast<int>(in.d.index));  // redefined: the new value decides
      if (!tile_reg(in.d)) continue;
      if (m + 1 == len || bc::chain_reduce_op(in) || bc::chain_keeps(head.aux, m)) return true;
      local.push_back(in.d.index);
    }
    pc += static_cast<size_t>(len);
  }
  return false;
}

// A loop that reduces the tile's rows chunk by chunk (a column sum: acc.col += x) keeps no
// tile in a register when every register operand is a column or a scalar: its row chunk
// costs no cache, only a dispatch per trip (acc loaded and stored per chunk). Such chunks
// grow up to 16x.
void Emitter::grow_reduced_rows() {
  if (!L_.loop_mode || L_.row < 0 || !L_.axes[L_.row].reduced) return;
  bc::Axis& row = L_.bc_axes[L_.row];
  if (row.iter != bc::AxisIter::kLoop || row.split_by >= 0 || tile_registers()) return;
  const int64_t cols = round16(L_.bc_axes[L_.col].chunk);
  while (2 * row.chunk <= row.extent && 2 * row.chunk * cols <= 16 * kTileElems) row.chunk *= 2;
}

// A tile much smaller than kTileElems (the rows of a [B, H, S, D] operand whose outer axes do
// not fold, say 8 x 32 elements) pays a block's dispatch for little work. Then the innermost
// outer grid axis is walked by a loop inside the block instead, its trips shared out between
// blocks by a new parts axis (split_by), enough parts left for every thread. A block takes
// trips worth a tile of kTileElems, or 16 tiles when no register holds a tile (a sum over
// a middle axis: its source streams through, only a row stays).
void Emitter::loop_outer_axis() {
  if (L_.loop_mode || st_.has_matmul || L_.bc_axes.size() >= static_cast<size_t>(bc::kMaxAxes))
    return;
  const bc::Axis& col = L_.bc_axes[L_.col];
  const int64_t tile = (L_.row >= 0 ? L_.bc_axes[L_.row].chunk : 1) * col.chunk;
  if (tile <= 0 || tile * 4 > kTileElems) return;
  int outer = -1;
  int64_t other_blocks = 1;
  for (size_t a = 0; a < L_.bc_axes.size(); ++a) {
    const bc::Axis& ax = L_.bc_axes[a];
    if (ax.iter != bc::AxisIter::kGrid) continue;
    if (ax.tile == bc::AxisTile::kNone && !L_.axes[a].grid_only && ax.trips() > 1) {
      if (outer >= 0) other_blocks *= L_.bc_axes[outer].trips();
      outer = static_cast<int>(a);
    } else {
      other_blocks *= ax.trips();
    }
  }
  if (outer < 0 || other_blocks <= 0) return;  // other_blocks 0: an empty launch
  const int64_t trips = L_.bc_axes[outer].trips();
  const int64_t budget = tile_registers() ? kTileElems : 16 * kTileElems;
  const int64_t per_block = std::max<int64_t>(1, budget / tile);
  int64_t parts = (trips + per_block - 1) / per_block;
  const int64_t want_blocks = L_.wanted_blocks();
  if (parts * other_blocks < want_blocks)
    parts = std::min(trips, (want_blocks + other_blocks - 1) / other_blocks);
  if (parts >= trips) return;
  bc::Axis split;
  split.extent = parts;
  split.chunk = 1;
  split.tile = bc::AxisTile::kNone;
  split.iter = bc::AxisIter::kGrid;
  L_.bc_axes[outer].iter = bc::AxisIter::kLoop;
  L_.bc_axes[outer].split_by = static_cast<int8_t>(L_.bc_axes.size());
  L_.bc_axes.push_back(split);
  code_.insert(code_.begin(),
               bc::Instr{bc::Opcode::kLoop, CType::kF32, TileClass::kScalar, 0,
                         static_cast<uint16_t>(outer), Operand{}, Operand{}, Operand{}, Operand{}});
  push(bc::Opcode::kEndLoop, CType::kF32, TileClass::kScalar, 0, Operand{});
}

// A loop over an outer axis whose body only moves memory to memory (chains over memory, or
// elementwise instructions that touch no register: a permute times a scale) runs as a loop of
// chains in the VM: each chain covers a batch of trips in one kernel call (a 3-D block)
// instead of one dispatch per trip. Such instructions become chains of one member here.
void Emitter::chain_loop_bodies() {
  std::vector<bc::Instr> out;
  out.reserve(code_.size());
  for (size_t pc = 0; pc < code_.size(); ++pc) {
    out.push_back(code_[pc]);
    if (code_[pc].op != bc::Opcode::kLoop || L_.bc_axes[code_[pc].aux].tile != bc::AxisTile::kNone)
      continue;
    size_t stop = pc + 1;
    bool ok = true;
    bool any_single = false;
    while (ok && stop < code_.size() && code_[stop].op != bc::Opcode::kEndLoop) {
      const bc::Instr& in = code_[stop];
      if (in.op == bc::Opcode::kChain) {
        stop += bc::chain_length(in.aux) + 1;
        continue;
      }
      ok = !touches_register(in) && chainable(in);
      any_single = true;
      ++stop;
    }
    if (!ok || !any_single || stop >= code_.size()) continue;
    for (size_t m = pc + 1; m < stop; ++m) {
      const bc::Instr& in = code_[m];
      if (in.op == bc::Opcode::kChain) {
        for (size_t e = m + bc::chain_length(in.aux); m <= e; ++m) out.push_back(code_[m]);
        --m;
        continue;
      }
      out.push_back(bc::Instr{
          bc::Opcode::kChain, CType::kF32, in.cls, 0, bc::chain_aux(1, 0), {}, {}, {}, {}});
      out.push_back(in);
    }
    pc = stop - 1;
  }
  code_ = std::move(out);
}

// Can `in`, which defines virtual register v, write v over virtual register src (read by it,
// dying there)? Only f32 elementwise math of one class: every element is read before its own
// position is written and no other position is read from src. A value that dies inside a
// chain body is live to the chain's end (allocate_registers), so chains never get here.
namespace {
bool in_place_source(bc::Instr in, int v, int src) {
  const bc::Family fam = bc::kOpInfo[static_cast<int>(in.op)].family;
  if (in.op != bc::Opcode::kFma && fam != bc::Family::kUnary && fam != bc::Family::kBinary)
    return false;
  // Predicates write an i32 mask: another element type (the verifier's aliasing rule).
  if ((bc::is_unary(in.op) && ops::is_predicate(bc::unary_of(in.op))) ||
      (bc::is_binary(in.op) && ops::returns_bool(bc::binary_of(in.op))))
    return false;
  if (in.ctype != CType::kF32 || in.d.kind != bc::OperandKind::kReg || in.d.index != v || src < 0)
    return false;
  const int used = used_fields(in);
  bool reads = false;
  for (int k = 1; k < 4; ++k) {
    const Operand* o = field(in, k);
    if (!(used >> k & 1) || o->kind != bc::OperandKind::kReg || o->index != src) continue;
    if (o->cls != in.d.cls) return false;  // read broadcast: other positions
    reads = true;
  }
  return reads;
}
}  // namespace

Status Emitter::allocate_registers() {
  int n = num_vregs_;
  std::vector<int> first(n, INT32_MAX), last(n, -1);
  auto touch = [&](int v, int pc) {
    first[v] = std::min(first[v], pc);
    last[v] = std::max(last[v], pc);
  };
  std::vector<std::pair<int, int>> loops;
  std::vector<int> open;
  for (int pc = 0; pc < static_cast<int>(code_.size()); ++pc) {
    bc::Instr& in = code_[pc];
    if (in.op == bc::Opcode::kLoop) open.push_back(pc);
    if (in.op == bc::Opcode::kEndLoop) {
      loops.push_back({open.back(), pc});
      open.pop_back();
    }
    int used = used_fields(in);
    for (int k = 0; k < 4; ++k) {
      Operand* o = field(in, k);
      if ((used >> k & 1) && o->kind == bc::OperandKind::kReg) touch(o->index, pc);
    }
  }
  // Registers of a chain body are live over the whole body: its strips interleave them, so
  // none may share a register with another (see the body rules in isa.def).
  for (int pc = 0; pc < static_cast<int>(code_.size()); ++pc) {
    if (code_[pc].op != bc::Opcode::kChain) continue;
    int end = pc + bc::chain_length(code_[pc].aux);
    for (int v = 0; v < n; ++v) {
      if (last[v] < pc || first[v] > end) continue;
      first[v] = std::min(first[v], pc);
      last[v] = std::max(last[v], end);
    }
  }
  // A value live into a loop stays live for the whole loop (later iterations read it).
  for (auto [ls, le] : loops)
    for (int v = 0; v < n; ++v)
      if (first[v] < ls && last[v] > ls && last[v] < le) last[v] = le;
  std::vector<int> order(n);
  for (int v = 0; v < n; ++v) order[v] = v;
  std::sort(order.begin(), order.end(), [&](int x, int y) { return first[x] < first[y]; });
  std::vector<int> phys(n, -1), busy_until, holder;
  for (int v : order) {
    if (last[v] < 0) continue;
    // A value computed elementwise from one that dies there takes its register: the
    // instruction writes its result over its source in place, so the block touches one
    // tile-sized register less (a norm's last passes read L1, not L2).
    int r = -1;
    for (size_t p = 0; r < 0 && p < busy_until.size(); ++p)
      if (busy_until[p] == first[v] && in_place_source(code_[first[v]], v, holder[p]))
        r = static_cast<int>(p);
    for (size_t p = 0; r < 0 && p < busy_until.size(); ++p)
      if (busy_until[p] < first[v]) r = static_cast<int>(p);
    if (r < 0) {
      r = static_cast<int>(busy_until.size());
      busy_until.push_back(0);
      holder.push_back(-1);
    }
    busy_until[r] = last[v];
    holder[r] = v;
    phys[v] = r;
  }
  if (busy_until.size() > static_cast<size_t>(bc::kMaxOperandIndex))
    return unimplemented(def_.name + ": kernel needs too many tile registers");
  for (bc::Instr& in : code_) {
    int used = used_fields(in);
    for (int k = 0; k < 4; ++k) {
      Operand* o = field(in, k);
      if ((used >> k & 1) && o->kind == bc::OperandKind::kReg)
        o->index = static_cast<uint16_t>(phys[o->index]);
    }
    prog_.emit(in);
  }
  prog_.num_regs = static_cast<int>(busy_until.size());
  return Status::ok();
}

Status Emitter::emit() {
  for (int a = 0; a < kMaxDomAxes; ++a)
    if (L_.final_of[a] >= 0 && L_.axes[L_.final_of[a]].reduced)
      reduced_mask_ |= 1u << L_.final_of[a];
  acc_idx_.assign(st_.insts.size(), -1);
  if (L_.loop_mode) {
    emit_loop_passes();
  } else {
    emit_single_pass();
  }
  if (num_vregs_ > bc::kMaxOperandIndex * 4)
    return unimplemented(def_.name + ": kernel too large for one program");
  dot_peephole();
  fma_peephole();
  pre_op_peephole();
  direct_store_peephole();
  chain_peephole();
  loop_outer_axis();
  chain_loop_bodies();
  DVM_RETURN_IF_ERROR(allocate_registers());
  if (!st_.has_matmul) fit_tile_to_cache();
  grow_streaming_tile();
  grow_reduced_rows();
  balance_row_blocks();
  prog_.axes = L_.bc_axes;
  const bc::Axis& col = prog_.axes[L_.col];
  int64_t row_chunk = L_.row >= 0 ? prog_.axes[L_.row].chunk : 1;
  prog_.reg_row_stride = round16(col.chunk);
  if ((prog_.reg_row_stride * 4) % 4096 == 0) prog_.reg_row_stride += 16;  // 4K aliasing
  prog_.reg_elems = std::max<int64_t>(16, row_chunk * prog_.reg_row_stride);
  prog_.grid = 1;
  for (const bc::Axis& ax : prog_.axes)
    if (ax.iter == bc::AxisIter::kGrid) prog_.grid *= ax.trips();
  return Status::ok();
}

}  // namespace dvm::enc
