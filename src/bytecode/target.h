// What a backend tells the runtime operator compiler about itself. The encoder includes no
// backend header: tile sizes and similar facts come from here, so a second backend (a CUDA
// VM) plugs in by describing itself, not by being included.
#pragma once

#include <cstdint>

namespace dvm::bc {

struct Instr;

struct Target {
  const char* name = "";
  // MatMul: the preferred output block per program tile (rows x columns), and the GEMM
  // micro-tile the tile is aligned to (columns: whole packed panels, so that cached packed
  // weights serve every tile).
  int64_t matmul_tile_m = 64, matmul_tile_n = 64;
  int64_t matmul_micro_m = 1, matmul_micro_n = 1;
  // A launch with less work than this (elements of its iteration domain, times the
  // contraction length for matmuls) runs on one thread: splitting such a stage into blocks
  // for threads only multiplies the per-block overhead. 0: every launch may be split.
  int64_t min_parallel_work = 0;
  // Non-null where the target runs a block of f32 row-wise work band of rows by band of rows,
  // each band through the whole program while it stays in the target's L1 (the CPU VM's row
  // programs): whether it can take this instruction's opcode, type and flags into such a
  // program (operand shapes decide the rest, when the program is loaded). Such a program's
  // tile size then sets only how many blocks there are, not where its registers live, so
  // tiles of rows reduced along long columns need not shrink to the L1 budget
  // (TileTuning::row_reg_budget_bytes).
  bool (*row_program_instr)(const Instr& in) = nullptr;
};

}  // namespace dvm::bc
