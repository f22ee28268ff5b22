// The bytecode verifier (contract in verifier.h). One pass over the header, one over the
// code; the code pass simulates, per register, the class and compute type of its last write
// (program order = the first iteration of every loop) and re-checks loop-carried values at
// each EndLoop, which is what makes the linear simulation sound for every iteration.
#include "bytecode/verifier.h"

#include <algorithm>
#include <iterator>

namespace dvm::bc {

namespace {

constexpr int kNumReduceOps = 0
#define DVM_REDUCE(Name, mnemonic) +1
#include "dvm/ops.def"
    ;

// What a register holds after its last write.
struct RegType {
  bool defined = false;
  TileClass cls = TileClass::kFull;
  CType type = CType::kF32;
  bool operator==(const RegType&) const = default;
};

std::string reg_type_str(const RegType& t) {
  if (!t.defined) return "undefined";
  static const char* const kCls[] = {"full", "row", "col", "scalar"};
  return std::string(ctype_name(t.type)) + "." + kCls[static_cast<int>(t.cls)];
}

// How an instruction uses one operand field.
enum class Access : uint8_t { kRead, kWrite, kReadWrite };
enum class Where : uint8_t { kAny, kReg, kDesc, kRegOrDesc };  // operand kinds accepted

struct Use {
  char field;  // 'D', 'A', 'B', 'C'
  Operand o;
  Access access;
  Where where;
  CType type;     // element type read or written
  TileClass cls;  // class a written register gets
};

// The accumulator class of a reduction: the instruction's class less the reduced tile axes.
TileClass acc_class(const Instr& in) {
  return make_class(class_has_rows(in.cls) && !aux_rows(in.aux),
                    class_has_cols(in.cls) && !aux_cols(in.aux));
}

// The operands `in` uses, sources before destinations (the order the interpreter reads and
// writes them). Must mirror the cases of interpreter.cc exactly.
int operand_uses(const Instr& in, Use* u) {
  const CType t = in.ctype;
  const Use src_a{'A', in.a, Access::kRead, Where::kAny, t, in.cls};
  const Use dst{'D', in.d, Access::kWrite, Where::kRegOrDesc, t, in.cls};
  switch (in.op) {
    case Opcode::kLoop:
    case Opcode::kEndLoop:
      return 0;
    case Opcode::kLoad:
      u[0] = {'A', in.a, Access::kRead, Where::kDesc, t, in.cls};
      u[1] = {'D', in.d, Access::kWrite, Where::kReg, t, in.cls};
      return 2;
    case Opcode::kStore:
      u[0] = src_a;
      u[1] = {'D', in.d, Access::kWrite, Where::kDesc, t, in.cls};
      return 2;
    case Opcode::kCast:
      u[0] = src_a;
      u[1] = {'D', in.d, Access::kWrite, Where::kRegOrDesc, static_cast<CType>(in.aux), in.cls};
      return 2;
    case Opcode::kSelect:
    case Opcode::kFma:
      u[0] = {'A',   in.a, Access::kRead, Where::kAny, in.op == Opcode::kSelect ? CType::kI32 : t,
              in.cls};
      u[1] = {'B', in.b, Access::kRead, Where::kAny, t, in.cls};
      u[2] = {'C', in.c, Access::kRead, Where::kAny, t, in.cls};
      u[3] = dst;
      return 4;
    case Opcode::kFill:
      u[0] = {'D', in.d, Access::kWrite, Where::kReg, t, in.cls};
      return 1;
    case Opcode::kReduce:
      u[0] = src_a;
      u[1] = {'D', in.d, Access::kReadWrite, Where::kReg, t, acc_class(in)};
      return 2;
    case Opcode::kArgReduce:
      u[0] = src_a;
      u[1] = {'D', in.d, Access::kReadWrite, Where::kReg, t, acc_class(in)};
      u[2] = {'B', in.b, Access::kReadWrite, Where::kReg, CType::kI64, acc_class(in)};
      return 3;
    case Opcode::kReduceDot:
      u[0] = src_a;
      u[1] = {'B', in.b, Access::kRead, Where::kAny, t, in.cls};
      u[2] = {'D', in.d, Access::kReadWrite, Where::kReg, t, acc_class(in)};
      return 3;
    case Opcode::kMatMul:  // operands convert from f16/bf16 like Load's source
      u[0] = {'A', in.a, Access::kRead, Where::kDesc, t, in.cls};
      u[1] = {'B', in.b, Access::kRead, Where::kDesc, t, in.cls};
      u[2] = dst;
      return 3;
    default:
      break;
  }
  u[0] = src_a;
  if (!is_unary(in.op) && !is_binary(in.op)) {  // Mov, RoundF16, RoundBF16
    u[1] = dst;
    return 2;
  }
  if (is_unary(in.op)) {
    u[1] = dst;
    if (ops::is_predicate(unary_of(in.op))) u[1].type = CType::kI32;
    if (in.flags == 0) return 2;
    u[1] = {'B', in.b, Access::kRead, Where::kAny, t, in.cls};  // op(A +/- B)
    u[2] = dst;
    return 3;
  }
  u[1] = {'B', in.b, Access::kRead, Where::kAny, t, in.cls};
  u[2] = dst;
  if (ops::returns_bool(binary_of(in.op))) u[2].type = CType::kI32;
  return 3;
}

// a + b and a * b on int64, false on overflow.
bool add_ok(int64_t a, int64_t b, int64_t* r) {
  return !__builtin_add_overflow(a, b, r);
}
bool mul_ok(int64_t a, int64_t b, int64_t* r) {
  return !__builtin_mul_overflow(a, b, r);
}

class Verifier {
 public:
  explicit Verifier(const Program& p) : p_(p) {}
  Status run(std::vector<std::pair<int64_t, int64_t>>* slot_spans);

 private:
  // One open loop.
  struct Frame {
    int axis;
    size_t pc;
    bool dead;                     // zero trips: the body never runs
    bool maybe_empty;              // split: some blocks get zero trips
    std::vector<RegType> entry;    // register state when the loop is entered
    std::vector<char> written;     // registers written so far in the body
    std::vector<RegType> exposed;  // registers read in the body before any write there
  };

  Status header_error(const std::string& what) const;
  Status error(const std::string& what) const;
  Status check_axes();
  Status check_grid() const;
  Status check_registers() const;
  Status check_descriptor(size_t i);
  Status check_header();
  Status check_fields(const Instr& in) const;
  Status check_reduce_aux(const Instr& in) const;
  Status check_matmul(const Instr& in) const;
  Status check_control(const Instr& in);
  Status check_loop(const Instr& in);
  Status check_end_loop();
  Status check_kind(const Use& u) const;
  Status check_desc_use(const Instr& in, const Use& u);
  Status check_reg_read(const Instr& in, const Use& u);
  Status check_write_class(const Use& u) const;
  void record_write(const Use& u);
  Status check_aliasing(const Use* uses, int n) const;
  Status check_instr(const Instr& in);
  Status check_chain(const Instr& in);
  Status check_chain_body(const Instr& in, const Use* uses, int n);
  void note_chain_member(const Instr& in);
  void end_chain();
  void note_read(int reg);
  void collect_spans(std::vector<std::pair<int64_t, int64_t>>* spans) const;

  const Program& p_;
  int row_axis_ = -1, col_axis_ = -1;
  size_t pc_ = 0;
  std::vector<RegType> regs_;
  std::vector<Frame> frames_;
  int dead_depth_ = 0;                              // open zero-trip loops
  std::vector<std::pair<int64_t, int64_t>> spans_;  // per descriptor
  std::vector<char> reached_;                       // per descriptor: used where it runs
  // The open Chain: its last body pc (0: none), class, and per register the body pc of its
  // first read before any body write (-1: none) and whether a body instruction wrote it.
  // The head's pc and AUX (its keep mask), and per register whether a body reduction
  // accumulates into it or a body member marked keep defines it.
  size_t chain_end_ = 0;
  size_t chain_head_ = 0;
  uint16_t chain_aux_ = 0;
  TileClass chain_cls_ = TileClass::kFull;
  std::vector<int64_t> chain_read_;
  std::vector<char> chain_written_;
  std::vector<char> chain_acc_;
  std::vector<char> chain_kept_;
};

Status Verifier::header_error(const std::string& what) const {
  return invalid_argument("bytecode verifier: program '" + p_.name + "': header: " + what);
}

Status Verifier::error(const std::string& what) const {
  return invalid_argument("bytecode verifier: program '" + p_.name + "': instruction " +
                          std::to_string(pc_) + " `" + disassemble_instr(p_, p_.instr(pc_)) +
                          "`: " + what);
}

Status Verifier::check_axes() {
  if (p_.axes.size() > static_cast<size_t>(kMaxAxes))
    return header_error(std::to_string(p_.axes.size()) + " axes, more than " +
                        std::to_string(kMaxAxes));
  for (size_t i = 0; i < p_.axes.size(); ++i) {
    const Axis& a = p_.axes[i];
    std::string name = "axis a" + std::to_string(i) + ": ";
    if (static_cast<int>(a.iter) > 2 || static_cast<int>(a.tile) > 2)
      return header_error(name + "bad iteration or tile kind");
    if (a.extent < 0 || a.extent > kMaxExtent)
      return header_error(name + "extent " + std::to_string(a.extent) + " out of range");
    if (a.chunk < 1 || a.chunk > kMaxExtent)
      return header_error(name + "chunk " + std::to_string(a.chunk) + " out of range");
    // Non-tile axes are walked one index at a time; the interpreter assumes it.
    if (a.tile == AxisTile::kNone && a.chunk != 1)
      return header_error(name + "chunk " + std::to_string(a.chunk) + " on a non-tile axis");
    int& role = a.tile == AxisTile::kRow ? row_axis_ : col_axis_;
    if (a.tile != AxisTile::kNone && role >= 0)
      return header_error(name + "second " + (a.tile == AxisTile::kRow ? "row" : "col") +
                          "-tile axis");
    if (a.tile != AxisTile::kNone) role = static_cast<int>(i);
    if (a.iter == AxisIter::kContract && a.tile != AxisTile::kNone)
      return header_error(name + "a contraction axis cannot be a tile axis");
    if (a.split_by >= 0) {
      bool ok = a.iter == AxisIter::kLoop && static_cast<size_t>(a.split_by) < p_.axes.size() &&
                p_.axes[a.split_by].iter == AxisIter::kGrid &&
                p_.axes[a.split_by].tile == AxisTile::kNone && p_.axes[a.split_by].extent >= 1;
      if (!ok) return header_error(name + "split by a non-grid or tile axis");
      // The interpreter computes trips * (g + 1) / parts unchecked.
      int64_t prod = 0;
      if (!mul_ok(a.trips(), p_.axes[a.split_by].extent, &prod))
        return header_error(name + "trips * split parts overflows");
    } else if (a.split_by != -1) {
      return header_error(name + "bad split axis");
    }
  }
  return Status::ok();
}

// The interpreter decodes block ids mixed-radix over the grid axes' trip counts.
Status Verifier::check_grid() const {
  int64_t grid = 1;
  for (const Axis& a : p_.axes) {
    if (a.iter != AxisIter::kGrid) continue;
    if (!mul_ok(grid, a.trips(), &grid) || grid > kMaxGrid)
      return header_error("grid axes exceed " + std::to_string(kMaxGrid) + " blocks");
  }
  if (grid != p_.grid)
    return header_error("grid " + std::to_string(p_.grid) +
                        " != product of the grid axes' trip counts " + std::to_string(grid));
  return Status::ok();
}

// Every register must hold the largest tile of any class: full tiles are row_chunk rows of
// reg_row_stride elements, each row holding col_chunk elements.
Status Verifier::check_registers() const {
  if (p_.num_regs < 0 || p_.num_regs > kMaxOperandIndex + 1)
    return header_error("num_regs " + std::to_string(p_.num_regs) + " out of range");
  constexpr int64_t kMaxElems = kMaxRegisterFileBytes / 8;
  if (p_.reg_elems < 0 || p_.reg_elems > kMaxElems || p_.reg_row_stride < 0)
    return header_error("reg_elems " + std::to_string(p_.reg_elems) + " / reg_row_stride " +
                        std::to_string(p_.reg_row_stride) + " out of range");
  if (p_.num_regs == 0) return Status::ok();
  int64_t rows = row_axis_ >= 0 ? p_.axes[row_axis_].chunk : 1;
  int64_t cols = col_axis_ >= 0 ? p_.axes[col_axis_].chunk : 1;
  if (p_.reg_row_stride < cols)
    return header_error("reg_row_stride " + std::to_string(p_.reg_row_stride) + " < col chunk " +
                        std::to_string(cols));
  int64_t need = 0;
  if (!mul_ok(rows, p_.reg_row_stride, &need) || need > p_.reg_elems)
    return header_error("row chunk " + std::to_string(rows) + " * reg_row_stride " +
                        std::to_string(p_.reg_row_stride) + " > reg_elems " +
                        std::to_string(p_.reg_elems));
  if (int64_t{p_.num_regs} * p_.reg_elems * 8 > kMaxRegisterFileBytes)
    return header_error("register file of " + std::to_string(p_.num_regs) + " x " +
                        std::to_string(p_.reg_elems) + " elements exceeds " +
                        std::to_string(kMaxRegisterFileBytes) + " bytes");
  return Status::ok();
}

// Slot and dtype, and the element span [lo, hi] reachable over all axes. Axes of extent 0
// contribute nothing: if they are grid axes no block runs; if loop axes, code outside the
// loop sees index 0 and code inside never runs. Checked arithmetic, so the interpreter's
// unchecked offset * stride * element-size sums cannot overflow either.
Status Verifier::check_descriptor(size_t i) {
  const Descriptor& d = p_.descs[i];
  std::string name = "descriptor m" + std::to_string(i) + ": ";
  if (d.slot >= p_.num_slots)
    return header_error(name + "slot " + std::to_string(d.slot) + " out of range (" +
                        std::to_string(p_.num_slots) + " slots)");
  if (static_cast<int>(d.dtype) >= kNumDTypes) return header_error(name + "bad dtype");
  int64_t lo = d.offset, hi = d.offset;
  bool ok = d.offset >= -kMaxSpan && d.offset <= kMaxSpan;
  for (size_t a = 0; ok && a < p_.axes.size(); ++a) {
    int64_t term = 0;
    if (p_.axes[a].extent == 0) continue;
    ok = mul_ok(p_.axes[a].extent - 1, d.stride[a], &term) &&
         add_ok(term < 0 ? lo : hi, term, term < 0 ? &lo : &hi);
  }
  if (!ok || lo < -kMaxSpan || hi > kMaxSpan)
    return header_error(name + "element span overflows (offset or strides out of range)");
  spans_[i] = {lo, hi};
  return Status::ok();
}

Status Verifier::check_header() {
  if (p_.version != kFormatVersion)
    return header_error("format version " + std::to_string(p_.version) + ", expected " +
                        std::to_string(kFormatVersion));
  DVM_RETURN_IF_ERROR(check_axes());
  DVM_RETURN_IF_ERROR(check_grid());
  DVM_RETURN_IF_ERROR(check_registers());
  if (p_.num_params < 0 || p_.num_slots < 0 || p_.num_slots > 65536)
    return header_error("num_params / num_slots out of range");
  if (p_.code.size() % 2 != 0) return header_error("odd number of code words");
  if (p_.num_instrs() > kMaxInstrs) return header_error("too many instructions");
  spans_.assign(p_.descs.size(), {0, -1});
  reached_.assign(p_.descs.size(), 0);
  for (size_t i = 0; i < p_.descs.size(); ++i) DVM_RETURN_IF_ERROR(check_descriptor(i));
  return Status::ok();
}

Status Verifier::check_reduce_aux(const Instr& in) const {
  int op = static_cast<int>(aux_reduce_op(in.aux));
  if (op >= kNumReduceOps) return error("bad reduce op " + std::to_string(op));
  if (in.op == Opcode::kFill) return Status::ok();
  bool arg = ops::is_arg_reduce(static_cast<ReduceOp>(op));
  // The tile kernels implement Sum/Mean/Max/Min/Prod for Reduce, ArgMax/ArgMin for ArgReduce.
  if (arg != (in.op == Opcode::kArgReduce))
    return error(std::string("reduce op not valid for ") +
                 kOpInfo[static_cast<int>(in.op)].mnemonic);
  if (static_cast<size_t>(aux_axis(in.aux)) >= std::max<size_t>(p_.axes.size(), 1))
    return error("reduce index axis a" + std::to_string(aux_axis(in.aux)) + " out of range");
  return Status::ok();
}

// The contraction axis is walked only by the MatMul kernel (never a loop, the grid or a tile),
// so its extent bounds the k range the descriptors' spans already cover; both operands share
// a floating dtype the GEMM kernels take.
Status Verifier::check_matmul(const Instr& in) const {
  if (in.ctype != CType::kF32) return error("matmul requires compute type f32");
  if (in.aux >= p_.axes.size() || p_.axes[in.aux].iter != AxisIter::kContract)
    return error("matmul aux is not a contraction axis");
  if (in.a.kind != OperandKind::kDesc || in.b.kind != OperandKind::kDesc ||
      in.a.index >= p_.descs.size() || in.b.index >= p_.descs.size())
    return error("matmul operands must be descriptors");
  DType ta = p_.descs[in.a.index].dtype, tb = p_.descs[in.b.index].dtype;
  bool ok = ta == tb && (ta == DType::kF32 || ta == DType::kF16 || ta == DType::kBF16);
  return ok ? Status::ok() : error("matmul operands must share dtype f32, f16 or bf16");
}

// Opcode, compute type, reserved bits and aux of one instruction.
Status Verifier::check_fields(const Instr& in) const {
  if (static_cast<int>(in.op) >= kNumOpcodes)
    return error("bad opcode " + std::to_string(static_cast<int>(in.op)));
  if (static_cast<int>(in.ctype) > 2) return error("bad compute type");
  // The class field is two bits: every value names a class.
  if (p_.code[2 * pc_] >> 32) return error("reserved bits of word 0 are set");
  bool is_float = in.ctype == CType::kF32;
  // Flags exist only as the pre-op of f32 value-producing unary ops (their row kernel).
  if (in.flags != 0) {
    bool ok = is_unary(in.op) && is_float && !ops::is_predicate(unary_of(in.op)) &&
              (in.flags == kPreAdd || in.flags == kPreSub);
    if (!ok) return error("flags " + std::to_string(in.flags) + " not valid for this op");
  }
  switch (in.op) {
    case Opcode::kCast:
      if (in.aux > 2) return error("bad cast target type " + std::to_string(in.aux));
      return Status::ok();
    case Opcode::kRoundF16:
    case Opcode::kRoundBF16:
    case Opcode::kFma:
      // Their tile kernels exist for f32 only.
      return is_float ? Status::ok() : error("requires compute type f32");
    case Opcode::kFill:
    case Opcode::kReduce:
    case Opcode::kArgReduce:
      return check_reduce_aux(in);
    case Opcode::kMatMul:
      return check_matmul(in);
    case Opcode::kReduceDot:  // f32 sums only: its kernels are dot products and FMAs
      if (!is_float || aux_reduce_op(in.aux) != ReduceOp::kSum)
        return error("reduce.dot requires compute type f32 and op sum");
      return check_reduce_aux(in);
    default:
      break;
  }
  if (is_unary(in.op) && !is_float && ops::is_float_only(unary_of(in.op)))
    return error("float-only op on an integer compute type");
  return Status::ok();
}

Status Verifier::check_loop(const Instr& in) {
  if (in.aux >= p_.axes.size()) return error("loop axis out of range");
  const Axis& a = p_.axes[in.aux];
  if (a.iter != AxisIter::kLoop) return error("loop over a grid axis");
  for (const Frame& f : frames_)
    if (f.axis == in.aux) return error("loop over an axis that is already open");
  size_t n = regs_.size();
  bool dead = a.trips() == 0;
  // A split loop walks trips [g*T/G, (g+1)*T/G): empty for some blocks when T < G.
  bool maybe_empty = a.split_by >= 0 && a.trips() < p_.axes[a.split_by].extent;
  frames_.push_back(Frame{in.aux, pc_, dead, maybe_empty, regs_, std::vector<char>(n, 0),
                          std::vector<RegType>(n)});
  dead_depth_ += dead;
  return Status::ok();
}

// The back edge: a value read at the top of the body (before the body writes it) must have
// the same type when the next iteration starts, i.e. at the end of the body.
Status Verifier::check_end_loop() {
  if (frames_.empty()) return error("endloop without an open loop");
  Frame& f = frames_.back();
  for (size_t r = 0; r < regs_.size(); ++r) {
    if (!f.exposed[r].defined || f.exposed[r] == regs_[r]) continue;
    return error("register r" + std::to_string(r) + " is read in the loop body as " +
                 reg_type_str(f.exposed[r]) + " but the body leaves it " + reg_type_str(regs_[r]));
  }
  // A zero-trip body never runs: nothing it writes is defined afterwards.
  if (f.dead) regs_ = f.entry;
  // Maybe-empty body: only values the body leaves as they were on entry are defined after.
  for (size_t r = 0; f.maybe_empty && r < regs_.size(); ++r)
    if (!(regs_[r] == f.entry[r])) regs_[r] = RegType{};
  dead_depth_ -= f.dead;
  frames_.pop_back();
  return Status::ok();
}

Status Verifier::check_control(const Instr& in) {
  return in.op == Opcode::kLoop ? check_loop(in) : check_end_loop();
}

Status Verifier::check_kind(const Use& u) const {
  std::string f(1, u.field);
  bool reg = u.o.kind == OperandKind::kReg, desc = u.o.kind == OperandKind::kDesc;
  switch (u.where) {
    case Where::kReg:
      if (!reg) return error("operand " + f + " must be a register");
      break;
    case Where::kDesc:
      if (!desc) return error("operand " + f + " must be a memory descriptor");
      break;
    case Where::kRegOrDesc:
      if (!reg && !desc) return error("destination " + f + " must be a register or descriptor");
      break;
    case Where::kAny:
      break;
  }
  size_t limit = u.o.kind == OperandKind::kReg     ? static_cast<size_t>(p_.num_regs)
                 : u.o.kind == OperandKind::kDesc  ? p_.descs.size()
                 : u.o.kind == OperandKind::kConst ? p_.consts.size()
                                                   : static_cast<size_t>(p_.num_params);
  if (u.o.index >= limit) {
    static const char* const kWhat[] = {"register", "descriptor", "constant", "param"};
    return error(std::string(kWhat[static_cast<int>(u.o.kind)]) + " index " +
                 std::to_string(u.o.index) + " of operand " + f + " out of range (" +
                 std::to_string(limit) + ")");
  }
  return Status::ok();
}

// Load's source and Store's destination convert between the descriptor's dtype and the
// compute type with any strides. Every other descriptor operand (Store's source included) is
// read or written directly by the register kernels, which step columns by 0 or 1 element
// (destinations: 1) of the compute type.
Status Verifier::check_desc_use(const Instr& in, const Use& u) {
  const Descriptor& d = p_.descs[u.o.index];
  if (dead_depth_ == 0) reached_[u.o.index] = 1;
  std::string m = "descriptor m" + std::to_string(u.o.index) + " ";
  if (u.where == Where::kDesc) {  // Load's source, Store's destination
    if (compute_type(d.dtype) == in.ctype) return Status::ok();
    return error(m + "dtype " + std::string(dtype_name(d.dtype)) + " does not compute in " +
                 std::string(ctype_name(in.ctype)));
  }
  if (d.dtype != ctype_dtype(u.type))
    return error(m + "used directly has dtype " + std::string(dtype_name(d.dtype)) + ", needs " +
                 std::string(dtype_name(ctype_dtype(u.type))));
  if (col_axis_ < 0 || !class_has_cols(in.cls)) return Status::ok();
  int64_t cs = d.stride[col_axis_];
  bool write = u.access != Access::kRead;
  if (write ? cs != 1 : (cs != 0 && cs != 1))
    return error(m + "used directly has column stride " + std::to_string(cs) + ", needs " +
                 (write ? "1" : "0 or 1"));
  return Status::ok();
}

// Records `reg` as read at the top of every enclosing loop body that has not written it yet.
void Verifier::note_read(int reg) {
  for (auto f = frames_.rbegin(); f != frames_.rend() && !f->written[reg]; ++f)
    if (!f->exposed[reg].defined) f->exposed[reg] = regs_[reg];
}

Status Verifier::check_reg_read(const Instr& in, const Use& u) {
  const RegType& t = regs_[u.o.index];
  std::string r = "register r" + std::to_string(u.o.index);
  if (!t.defined) return error(r + " is read before it is written");
  RegType want{true, u.o.cls, u.type};
  if (!(t == want))
    return error(r + " read as " + reg_type_str(want) + " but last written as " + reg_type_str(t) +
                 " (class or type mismatch)");
  // Operands broadcast up to the instruction's class, never down: a full tile read by a
  // row-class instruction would silently read only its first column.
  bool down = (class_has_rows(u.o.cls) && !class_has_rows(in.cls)) ||
              (class_has_cols(u.o.cls) && !class_has_cols(in.cls));
  if (down)
    return error(r + " class mismatch: a " + reg_type_str(t) + " operand in a " +
                 reg_type_str(RegType{true, in.cls, in.ctype}) + " instruction");
  note_read(u.o.index);
  return Status::ok();
}

Status Verifier::check_write_class(const Use& u) const {
  if (u.o.kind != OperandKind::kReg || u.access == Access::kRead || u.o.cls == u.cls)
    return Status::ok();
  return error("class mismatch: destination " + std::string(1, u.field) + " r" +
               std::to_string(u.o.index) + " must be written as " +
               reg_type_str(RegType{true, u.cls, u.type}));
}

void Verifier::record_write(const Use& u) {
  regs_[u.o.index] = RegType{true, u.cls, u.type};
  for (Frame& f : frames_) f.written[u.o.index] = 1;
}

// The tile kernels allow a destination to alias a source only elementwise in place: same
// register, same class, same element type. Reduction accumulators alias nothing.
Status Verifier::check_aliasing(const Use* uses, int n) const {
  for (int i = 0; i < n; ++i) {
    const Use& w = uses[i];
    if (w.access == Access::kRead || w.o.kind != OperandKind::kReg) continue;
    for (int j = 0; j < n; ++j) {
      const Use& s = uses[j];
      if (j == i || s.o.kind != OperandKind::kReg || s.o.index != w.o.index) continue;
      bool in_place = w.access == Access::kWrite && s.access == Access::kRead && s.o.cls == w.cls &&
                      s.type == w.type;
      if (!in_place)
        return error(std::string("operands ") + s.field + " and " + w.field + " alias register r" +
                     std::to_string(w.o.index) +
                     " (only same-class, same-type in-place updates are allowed)");
    }
  }
  return Status::ok();
}

// Chain: the body is the next chain_length(aux) instructions, each verified as usual plus
// the body rules (check_chain_body); registers written by body members are undefined after
// it, except the last member's destination, members marked keep and reduction accumulators.
Status Verifier::check_chain(const Instr& in) {
  if (in.ctype != CType::kF32 || in.flags != 0) return error("chain requires f32 and no flags");
  const int length = chain_length(in.aux);
  if (length < kMinChainBody || length > kMaxChainBody)
    return error("chain body of " + std::to_string(length) + " instructions (allowed " +
                 std::to_string(kMinChainBody) + ".." + std::to_string(kMaxChainBody) + ")");
  if ((in.aux >> 8) >> length) return error("chain keep mask names members past its body");
  if (pc_ + length >= p_.num_instrs()) return error("chain body runs past the end of the code");
  chain_end_ = pc_ + length;
  chain_head_ = pc_;
  chain_aux_ = in.aux;
  chain_cls_ = in.cls;
  chain_read_.assign(regs_.size(), -1);
  chain_written_.assign(regs_.size(), 0);
  chain_acc_.assign(regs_.size(), 0);
  chain_kept_.assign(regs_.size(), 0);
  return Status::ok();
}

Status Verifier::check_chain_body(const Instr& in, const Use* uses, int n) {
  if (in.cls != chain_cls_) return error("chain body instruction of another class");
  const bool last = pc_ == chain_end_;
  const bool reduction = chain_reduce_op(in);
  const bool keep = chain_keeps(chain_aux_, static_cast<int>(pc_ - chain_head_ - 1));
  if (keep && (reduction || in.d.kind != OperandKind::kReg))
    return error("chain keep mask marks a member that does not write a register");
  for (int i = 0; i < n; ++i) {
    const Use& u = uses[i];
    bool reg = u.o.kind == OperandKind::kReg;
    std::string r = reg ? std::to_string(u.o.index).insert(0, 1, 'r') : std::string();
    // Strips would see a partial sum: an accumulator is the reduction's alone.
    if (reg && chain_acc_[u.o.index])
      return error("chain body uses " + r + ", a reduction's accumulator in the same chain");
    if (u.access == Access::kReadWrite) {  // a reduction's accumulator
      if (chain_written_[u.o.index] || chain_read_[u.o.index] >= 0)
        return error("chain reduction accumulates into " + r + ", used before in the chain");
      continue;
    }
    if (u.access == Access::kRead) {
      if (reg && !chain_written_[u.o.index] && chain_read_[u.o.index] < 0)
        chain_read_[u.o.index] = static_cast<int64_t>(pc_);
      continue;
    }
    if (!last && !reg) return error("chain body writes memory before its last instruction");
    if (!reg) continue;
    int64_t first_read = chain_read_[u.o.index];
    // Strips would see the new value where the body expects the old one (broadcast reads).
    if (first_read >= 0 && !(last && first_read == static_cast<int64_t>(pc_)))
      return error("chain body writes " + r + " after reading it");
    if (last && chain_written_[u.o.index] && !chain_kept_[u.o.index])
      return error("chain result " + r + " is also a chain-local value");
  }
  return Status::ok();
}

// Marks what a body member defines for after the chain: its accumulator (a reduction) or its
// destination (marked keep).
void Verifier::note_chain_member(const Instr& in) {
  if (chain_reduce_op(in)) {
    chain_acc_[in.d.index] = 1;
  } else if (chain_keeps(chain_aux_, static_cast<int>(pc_ - chain_head_ - 1))) {
    chain_kept_[in.d.index] = 1;
  } else if (in.d.kind == OperandKind::kReg) {
    chain_kept_[in.d.index] = 0;  // redefined chain-local
  }
}

// Chain-local values live in strip scratch only: undefined once the chain has run.
void Verifier::end_chain() {
  const Instr last = p_.instr(chain_end_);
  for (size_t r = 0; r < regs_.size(); ++r) {
    bool result = last.d.kind == OperandKind::kReg && last.d.index == r;
    if (chain_written_[r] && !result && !chain_acc_[r] && !chain_kept_[r]) regs_[r] = RegType{};
  }
  chain_end_ = 0;
}

Status Verifier::check_instr(const Instr& in) {
  DVM_RETURN_IF_ERROR(check_fields(in));
  bool in_chain = chain_end_ != 0;
  Family family = kOpInfo[static_cast<int>(in.op)].family;
  if (family == Family::kChain && !in_chain) return check_chain(in);
  if (family == Family::kControl && !in_chain) return check_control(in);
  if (in_chain && !chain_body_op(in))
    return error("not an f32 elementwise op or row reduction: not allowed in a chain body");
  Use uses[4];
  int n = operand_uses(in, uses);
  for (int i = 0; i < n; ++i) {
    DVM_RETURN_IF_ERROR(check_kind(uses[i]));
    DVM_RETURN_IF_ERROR(check_write_class(uses[i]));
  }
  if (in_chain) DVM_RETURN_IF_ERROR(check_chain_body(in, uses, n));
  DVM_RETURN_IF_ERROR(check_aliasing(uses, n));
  // Reads first (read-modify-write accumulators included), then writes, as executed.
  for (int i = 0; i < n; ++i) {
    const Use& u = uses[i];
    if (u.o.kind == OperandKind::kDesc) DVM_RETURN_IF_ERROR(check_desc_use(in, u));
    if (u.o.kind == OperandKind::kReg && u.access != Access::kWrite)
      DVM_RETURN_IF_ERROR(check_reg_read(in, u));
  }
  for (int i = 0; i < n; ++i) {
    if (uses[i].o.kind != OperandKind::kReg || uses[i].access == Access::kRead) continue;
    record_write(uses[i]);
    if (in_chain) chain_written_[uses[i].o.index] = 1;
  }
  if (in_chain) note_chain_member(in);
  if (in_chain && pc_ == chain_end_) end_chain();
  return Status::ok();
}

void Verifier::collect_spans(std::vector<std::pair<int64_t, int64_t>>* spans) const {
  spans->assign(static_cast<size_t>(p_.num_slots), {0, -1});
  if (p_.grid == 0) return;  // no block runs
  for (size_t i = 0; i < p_.descs.size(); ++i) {
    if (!reached_[i]) continue;
    auto& s = (*spans)[p_.descs[i].slot];
    bool empty = s.first > s.second;
    s.first = empty ? spans_[i].first : std::min(s.first, spans_[i].first);
    s.second = empty ? spans_[i].second : std::max(s.second, spans_[i].second);
  }
}

Status Verifier::run(std::vector<std::pair<int64_t, int64_t>>* slot_spans) {
  DVM_RETURN_IF_ERROR(check_header());
  regs_.assign(static_cast<size_t>(p_.num_regs), RegType{});
  for (pc_ = 0; pc_ < p_.num_instrs(); ++pc_) DVM_RETURN_IF_ERROR(check_instr(p_.instr(pc_)));
  if (!frames_.empty()) {
    pc_ = frames_.back().pc;
    return error("loop is never closed (unbalanced loops)");
  }
  if (slot_spans) collect_spans(slot_spans);
  return Status::ok();
}

}  // namespace

Status verify(const Program& p, std::vector<std::pair<int64_t, int64_t>>* slot_spans) {
  return Verifier(p).run(slot_spans);
}

}  // namespace dvm::bc
