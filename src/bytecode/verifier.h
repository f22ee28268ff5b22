// The bytecode verifier: proves, once per program, everything the interpreter
// (src/vm/interpreter.cc) takes on trust, so that a corrupted or hostile program is rejected
// with a Status instead of being executed. The interpreter does no checks of its own.
//
// verify() proves:
//  - the header is consistent: version, axes (extents, chunks, tile roles), grid == product
//    of the grid axes' trip counts, register file large enough for the largest tile, sizes
//    within sane limits (so no size computation downstream can overflow);
//  - every instruction decodes to a known opcode, compute type, class and aux, and every
//    operand it uses indexes an existing register, descriptor, constant or parameter and has
//    a kind the opcode accepts (destinations are registers, or descriptors for Store and the
//    elementwise ops; Load reads a descriptor);
//  - loops nest properly, each over a distinct loop axis, all closed at the end;
//  - dataflow: every register is written before it is read (in program order, and around
//    every loop back edge) and read with the class and compute type it was last written
//    with; writes use the instruction's class (Reduce/ArgReduce: the instruction's class
//    less the reduced tile axes); in-place updates only where the tile kernels allow them;
//  - memory: every descriptor names an existing slot and a valid dtype; descriptors used
//    directly as operands of math ops have the compute type's dtype and unit (or, for
//    sources, zero) column stride; the element span every descriptor can reach is finite.
// What it cannot prove alone is that the spans fit the tensors bound at launch: it returns
// them per slot and the caller checks them against the real sizes on every call.
//
// Thread-safe (pure function of its arguments).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bytecode/format.h"
#include "dvm/status.h"

namespace dvm::bc {

// Sanity limits; anything beyond them is a corrupted program, not a big one.
inline constexpr int64_t kMaxRegisterFileBytes = int64_t{64} << 20;  // num_regs * reg_elems * 8
inline constexpr int64_t kMaxExtent = int64_t{1} << 48;              // per axis extent and chunk
inline constexpr int64_t kMaxGrid = int64_t{1} << 40;                // blocks per launch
inline constexpr int64_t kMaxSpan = int64_t{1} << 56;  // |element offset| of any access
inline constexpr size_t kMaxInstrs = size_t{1} << 24;

// Verifies `p`. On success, if `slot_spans` is not null, sets it to one [lo, hi] element
// range per slot (num_slots entries): the union of the offsets any reachable instruction can
// touch through that slot's descriptors, or lo > hi if the slot is never touched. On error
// returns InvalidArgument naming the program, the instruction (index and disassembly) or
// header field, and the problem; `slot_spans` is then left unspecified.
Status verify(const Program& p, std::vector<std::pair<int64_t, int64_t>>* slot_spans);

// One instruction in text form, without index or indentation, e.g.
// "add.f32.full r2.full, m0, c1". Safe on any bit pattern (unknown fields print as '?').
// Defined in disassembler.cc.
std::string disassemble_instr(const Program& p, const Instr& in);

}  // namespace dvm::bc
