// The text form of bytecode programs: a header, the axes, descriptors and constants, then one
// line per instruction with loop bodies indented. The verifier quotes single instructions in
// its errors, so every formatter here must survive arbitrary (corrupted) bit patterns.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <iterator>
#include <string>

#include "bytecode/format.h"
#include "bytecode/verifier.h"

namespace dvm::bc {

namespace {

// snprintf into a std::string; lines here are short, so a fixed buffer is enough.
template <typename... Args>
std::string fmt(const char* f, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

const char* class_name(TileClass c) {
  static const char* const kNames[] = {"full", "row", "col", "scalar"};
  return kNames[static_cast<int>(c) & 3];
}

// CType/DType/ReduceOp names that tolerate out-of-range values (corrupted programs).
std::string ctype_str(unsigned t) {
  return t <= 2 ? std::string(ctype_name(static_cast<CType>(t))) : fmt("ctype%u", t);
}
std::string dtype_str(DType t) {
  int v = static_cast<int>(t);
  return v < kNumDTypes ? std::string(dtype_name(t)) : fmt("dtype%d", v);
}
const char* const kReduceNames[] = {
#define DVM_REDUCE(Name, mnemonic) mnemonic,
#include "dvm/ops.def"
};
std::string reduce_str(ReduceOp op) {
  auto v = static_cast<size_t>(op);
  return v < std::size(kReduceNames) ? kReduceNames[v] : fmt("reduce%zu", v);
}

std::string operand_str(const Operand& o) {
  switch (o.kind) {
    case OperandKind::kReg:
      return fmt("r%u.%s", o.index, class_name(o.cls));
    case OperandKind::kDesc:
      return fmt("m%u", o.index);
    case OperandKind::kConst:
      return fmt("c%u", o.index);
    case OperandKind::kParam:
      return fmt("p%u", o.index);
  }
  return "?";
}

// The operands the opcode's format uses, in field order D, A, B, C.
std::string operands_str(OperandFormat f, const Instr& in) {
  int n = f == OperandFormat::kDst       ? 1
          : f == OperandFormat::kDstSrc  ? 2
          : f == OperandFormat::kDstSrc2 ? 3
          : f == OperandFormat::kDstSrc3 ? 4
                                         : 0;
  const Operand* ops[] = {&in.d, &in.a, &in.b, &in.c};
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += operand_str(*ops[i]);
  }
  return s;
}

// Decoded aux for the opcodes that use it (the reduce mask names the tile axes removed).
std::string aux_str(const Instr& in) {
  switch (in.op) {
    case Opcode::kCast:
      return std::string("  to ").append(ctype_str(in.aux));
    case Opcode::kReduce:
    case Opcode::kReduceDot:
    case Opcode::kArgReduce: {
      std::string s = "  over";
      if (aux_rows(in.aux)) s += " rows";
      if (aux_cols(in.aux)) s += " cols";
      if (!aux_rows(in.aux) && !aux_cols(in.aux)) s += " none";
      if (in.op == Opcode::kArgReduce) s += fmt(" index a%d", aux_axis(in.aux));
      return s;
    }
    case Opcode::kMatMul:
      return fmt("  k a%u", in.aux);
    case Opcode::kChain: {
      std::string s = fmt("body %d", chain_length(in.aux));
      if (in.aux >> 8) {
        s += " keep";
        for (int m = 0; m < kMaxChainBody; ++m)
          if (chain_keeps(in.aux, m)) s += fmt(" %d", m);
      }
      return s;
    }
    default:
      if (in.flags == kPreAdd || in.flags == kPreSub)  // D := op(A +/- B)
        return std::string(in.flags == kPreAdd ? "  pre add " : "  pre sub ") + operand_str(in.b);
      return "";
  }
}

}  // namespace

std::string disassemble_instr(const Program& p, const Instr& in) {
  (void)p;  // reserved for symbolic operand names
  int op = static_cast<int>(in.op);
  if (op >= kNumOpcodes) return fmt("op%d", op);
  const OpInfo& info = kOpInfo[op];
  if (in.op == Opcode::kLoop) return fmt("loop a%u", in.aux);
  if (in.op == Opcode::kEndLoop) return "endloop";
  std::string s = info.mnemonic;
  // Reductions carry their op in the mnemonic: fill.max, reduce.sum, argreduce.argmax.
  if (info.family == Family::kReduce) s.append(".").append(reduce_str(aux_reduce_op(in.aux)));
  s.append(".").append(ctype_str(static_cast<unsigned>(in.ctype)));
  s.append(".").append(class_name(in.cls)).append(" ");
  return s.append(operands_str(info.format, in)).append(aux_str(in));
}

namespace {

std::string axis_line(size_t i, const Axis& a) {
  const char* iter = a.iter == AxisIter::kGrid       ? "grid"
                     : a.iter == AxisIter::kLoop     ? "loop"
                     : a.iter == AxisIter::kContract ? "contract"
                                                     : "?";
  const char* tile = a.tile == AxisTile::kRow   ? " row-tile"
                     : a.tile == AxisTile::kCol ? " col-tile"
                                                : "";
  std::string split = a.split_by >= 0 ? fmt(" split by a%d", a.split_by) : std::string();
  return fmt("  a%zu: extent %" PRId64 " chunk %" PRId64 " %s%s%s\n", i, a.extent, a.chunk, iter,
             tile, split.c_str());
}

std::string desc_line(const Program& p, size_t i, const Descriptor& d) {
  std::string s = fmt("  m%zu: slot %u %s offset %" PRId64 " strides", i, d.slot,
                      dtype_str(d.dtype).c_str(), d.offset);
  size_t n = std::min<size_t>(p.axes.size(), kMaxAxes);
  bool any = false;
  for (size_t a = 0; a < n; ++a) {
    if (d.stride[a] == 0) continue;  // broadcast axes: the common case, left implicit
    s += fmt(" a%zu=%" PRId64, a, d.stride[a]);
    any = true;
  }
  return s + (any ? "\n" : " none\n");
}

std::string header(const Program& p) {
  std::string s = fmt("program '%s' v%u grid %" PRId64 " regs %d x %" PRId64
                      " elems row_stride %" PRId64 " slots %d params %d\n",
                      p.name.substr(0, 64).c_str(), p.version, p.grid, p.num_regs, p.reg_elems,
                      p.reg_row_stride, p.num_slots, p.num_params);
  for (size_t i = 0; i < p.axes.size(); ++i) s += axis_line(i, p.axes[i]);
  for (size_t i = 0; i < p.descs.size(); ++i) s += desc_line(p, i, p.descs[i]);
  for (size_t i = 0; i < p.consts.size(); ++i) {
    const Constant& c = p.consts[i];
    s +=
        fmt("  c%zu: f32 %g i32 %d i64 %" PRId64 "\n", i, static_cast<double>(c.f32), c.i32, c.i64);
  }
  return s;
}

}  // namespace

std::string disassemble(const Program& p) {
  std::string s = header(p);
  int depth = 0;
  size_t chain_left = 0;  // body instructions of the last chain still to print (indented)
  for (size_t i = 0; i < p.num_instrs(); ++i) {
    Instr in = p.instr(i);
    if (in.op == Opcode::kEndLoop && depth > 0) --depth;
    int indent = 2 * depth + (chain_left > 0 ? 2 : 0);
    s.append(fmt("%5zu  ", i)).append(indent, ' ').append(disassemble_instr(p, in));
    s += '\n';
    if (chain_left > 0) {
      --chain_left;
    } else if (in.op == Opcode::kChain) {
      chain_left = std::min<size_t>(chain_length(in.aux), kMaxChainBody);
    }
    if (in.op == Opcode::kLoop && depth < 64) ++depth;
  }
  if (p.code.size() % 2) s += "  (odd trailing code word)\n";
  return s;
}

}  // namespace dvm::bc
