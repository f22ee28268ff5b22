// The CPU VM: executes verified bytecode programs, block by block.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "bytecode/format.h"
#include "bytecode/target.h"
#include "vm/cpu/row_program.h"
#include "vm/cpu/tile_kernels.h"

namespace dvm::vm {

// A program after verification, decoded once for the interpreter.
struct LoadedProgram {
  bc::Program program;
  std::vector<bc::Instr> instrs;
  std::vector<int32_t> loop_end;  // for each Loop: index of its EndLoop (and vice versa)
  int row_axis = -1;
  int col_axis = -1;
  // Per descriptor: its offset in bytes, its byte step per unit of each axis index
  // (desc_step[d * axes + a]), and its element strides along the tile's rows and columns.
  std::vector<int64_t> desc_offset, desc_step, desc_rs, desc_cs;
  std::vector<int> desc_slot, desc_es;  // its argument slot and element bytes
  // Per descriptor: no instruction of the program writes its slot, so what it reads stays the
  // same for the whole launch (a matmul's A then keeps its packed panels from tile to tile).
  std::vector<char> desc_read_only;
  // Work per register element, relative to an elementwise op: the contraction length of the
  // program's matmuls (a small matmul output can still be a lot of work for the threads).
  int64_t work_per_elem = 1;
  // Trips a block makes of its loops (a reduction walking rows, a loop of chains), its share
  // of a split loop: a block's work is this many tiles.
  int64_t trips_per_block = 1;
  // Per axis: how many blocks the grid spreads it over (1 for loop and tile axes), so that a
  // block finds its position without a division per axis where an axis has one trip.
  std::array<int64_t, bc::kMaxAxes> grid_axis_trips{};
  // Per instruction of a chain body: for its d, a, b, c fields the scratch strip holding a
  // chain-local register (-1: the operand is read or written in place). Decided once here,
  // not per block (small tiles run many chains).
  std::vector<std::array<int8_t, 4>> chain_slot;
  // Per chain body instruction and field (d, a, b, c): the operand as prepare_chain resolves
  // it, less what the block's position and the launch decide (a descriptor's offset, the
  // slots, the params): decoded once here, so that a block's chain setup is a copy and an
  // add per field.
  struct ChainField {
    enum Kind : int8_t { kUnused, kScratch, kDesc, kReg, kConst, kParam };
    Kind kind = kUnused;
    int8_t scratch = -1;
    int32_t index = 0;      // descriptor, constant or param
    int64_t reg_bytes = 0;  // a register's byte offset in the register file
    int64_t rs = 0, cs = 0;
    int es = 4;
  };
  std::vector<std::array<ChainField, 4>> chain_field;
  // Per chain body instruction: 1 or 2 when its result is read only by the next instruction,
  // a mul, as that mul's operand a or b: the pair runs as one cpu::fused_mul_f32_rows call.
  // kFuseMulFma: a mul whose result is only the next instruction's fma addend; kFuseNegMulFma:
  // a neg read only by such a mul: the two (three) run as one cpu::fused_mul_add_f32_rows.
  // kFuseMulFmaFactor: a mul whose result only the next instruction, an fma, reads as one of
  // its factors: one cpu::fused_mul_fma_f32_rows.
  std::vector<int8_t> chain_fuse;
  static constexpr int8_t kFuseMulFma = 3, kFuseNegMulFma = 4, kFuseMulFmaFactor = 5;
  // Per chain body instruction: a converting load (f16/bf16 memory, contiguous) read only by
  // one later member, an add/sub/mul, fma or activation, runs inside that member's kernel
  // (cpu::half_map_f32_rows reads the memory itself), and likewise a converting store of a
  // value only it writes: `load` / `store` name the absorbed members (body indices, -1
  // none); `swap`: the half source is the op's b (a commutative op's operands exchanged);
  // `absorbed`: this member runs inside another one and is skipped.
  struct HalfPlan {
    int8_t load = -1, store = -1;
    bool swap = false, absorbed = false;
  };
  std::vector<HalfPlan> chain_half;
  // Per Chain: 1 when it is y = a +- b (kept), exp(y), a sum of that along the columns
  // (log-softmax's middle pass): it runs as one cpu::map_reduce_f32_rows pass (kRowSumExp)
  // over whole rows, the exponentials never stored.
  std::vector<char> chain_sum_exp;
  // Per Chain: 1 when no kernel call of the body reads or writes strip scratch (every
  // intermediate fused away): the body then runs over whole tiles, not strips.
  std::vector<char> chain_direct;
  // Per Chain: 1 when it and the next chain, each one (neg,) mul, fma group over memory,
  // run row by row in one pass (cpu::fused_mul_add_pair_f32_rows; rotary embedding's
  // halves), neither reading what the other writes.
  std::vector<char> chain_pair;
  // Per Chain: 1 when its results all go to memory through kernels that may stream them
  // (a direct chain, no kept values, a memory destination).
  std::vector<char> chain_stream;
  // Per top-level instruction: 1 or 2 when it is an f32 map (add, sub, mul, fma, exp with a
  // pre-op) whose result the instruction 1 or 2 later (a fill of the accumulator between)
  // reduces along the tile's columns: the pair runs as one cpu::map_reduce_f32_rows pass
  // (the result is stored and not loaded again).
  std::vector<int8_t> map_reduce;
  // Per Loop: 1 if its body is only chains over memory and chain-local values; such a loop
  // runs each chain over all of a block's trips at once (3-D blocks, one call per strip).
  std::vector<char> loop_of_chains;
  // Per loop of chains: the trips its chains take in turns, sized for L1.
  std::vector<int64_t> loop_batch;
  // Per loop of chains: 1 when every chain of its body may stream (chain_stream).
  std::vector<char> loop_stream;
  // Per Loop over an outer axis: 1 when its body is a column reduction of memory into one
  // f32 row stored to f32 memory (fill r.col; reduce r.col, m over rows; store m', r.col: a
  // sum over a middle axis). Its trips run back to back without the interpreter, each
  // accumulating straight into its output row (the same kernel and order: the same bits).
  std::vector<char> loop_col_reduce;
  // Descriptors whose tile is one contiguous run that the program only reads, in a program
  // with no loops (a block is one tile): a streamed launch queues the next block's runs of
  // them for prefetching (cpu::PrefetchQueue) once the block's first pass over them (a chain
  // with its body) has run, before the instruction at `prefetch_at`, so that the later passes,
  // which read the block from the caches, drain it. Empty when that pass is the last.
  std::vector<int> prefetch_descs;
  int32_t prefetch_at = -1;
  // Non-empty when every instruction computes row r of its results from row r of its operands
  // only (no loop, matmul or reduction over rows; no memory read that the program writes; no
  // column or scalar value updated in place, since each band recomputes those) and is one
  // that a row program runs (f32 maps, fills, row reductions, f32 loads and stores): a block
  // that does not stream then runs as one cpu::row_program_f32 call, band of rows by band of
  // rows (see row_program.h). The memory operands (descriptors) and values (constants c >= 0,
  // params -1 - p) its steps name, and the bytes a band touches per row, for sizing bands.
  std::vector<cpu::RowStep> row_steps;
  std::vector<int> row_mem_desc;
  std::vector<int> row_values;
  int64_t row_bytes = 0;
  // Bytes of memory a unit of work moves: the element sizes summed over the tensors whose
  // every element the program walks (not those broadcast along the tile's rows); 0 for
  // programs with matmuls (their work counts multiply-adds, not elements).
  int64_t bytes_per_work = 0;
};

// The memory block `block` of a launch over `slots` reads through lp.prefetch_descs: what a
// streamed launch queues for prefetching while the block before it runs.
cpu::PrefetchQueue block_prefetch(const LoadedProgram& lp, void* const* slots, int64_t block);

// Decodes a verified program for the interpreter (loop pairs, tile axes, work estimate).
std::shared_ptr<const LoadedProgram> load(bc::Program program);

// This backend's description for the encoder (tile sizes from the dispatched GEMM kernel).
const bc::Target& cpu_target();

// Run-time bindings of one launch: tensor base pointers per slot and scalar params;
// versions: per slot, the TensorArg::version of constant tensors (matmul operands packed once,
// vm/weight_cache.h), 0 for the others; may be null.
struct LaunchArgs {
  void* const* slots = nullptr;
  const bc::Constant* params = nullptr;
  const uint64_t* versions = nullptr;
  // Streaming stores for memory results (cpu::set_stream_stores): set by launch() for
  // launches whose work exceeds the streaming threshold.
  bool stream_stores = false;
  // Where a block reports an integer division (div, floor_divide, remainder) by zero: the
  // BinaryOp's value + 1 (torch raises there; the spec's result, 0, is still written). May be
  // null: not reported.
  std::atomic<int>* fault = nullptr;
};

// Launches that move more bytes than this stream their memory results around the caches:
// their work times LoadedProgram::bytes_per_work (or times 4 where that is 0, or with
// set_stream_counts_operands(false)). Default: the last-level cache's size. Tests lower it.
int64_t stream_threshold_bytes();
void set_stream_threshold_bytes(int64_t bytes);
void set_stream_counts_operands(bool on);
// Row programs of streamed launches fetch the next block's rows into L2 over a block's passes,
// as the instruction path's kernels do (on by default; benchmarks compare).
void set_row_block_prefetch(bool on);

// Row, column and scalar f32 instructions of at most 16 elements run in the interpreter
// (exactly rounded ops only: the same bits as the tile kernels). Tests turn it off to compare.
void set_small_tile_path(bool on);

// Row programs (LoadedProgram::row_steps) on or off, and the bytes a band may touch (-1: the
// L1 data cache's size). Tests and benchmarks compare the two ways.
void set_row_programs(bool on);
void set_row_band_bytes(int64_t bytes);

// Runs blocks [begin, end) of a verified program on the calling thread.
void run_blocks(const LoadedProgram& lp, const LaunchArgs& args, int64_t begin, int64_t end);

// Runs every block, spread over the thread pool with a deterministic partition (each block is
// computed identically whichever thread runs it). Small launches run on the calling thread.
void launch(const LoadedProgram& lp, const LaunchArgs& args, int num_threads);

}  // namespace dvm::vm
