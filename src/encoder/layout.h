// Domain layout: ordering and folding a stage's axes, choosing the tile, the grid and the
// loops (internal to src/encoder).
#pragma once

#include <vector>

#include "bytecode/target.h"
#include "encoder/stage.h"

namespace dvm::enc {

// ---- domain layout ---------------------------------------------------------------------

struct FinalAxis {
  int64_t extent = 1;
  bool reduced = false;
  bool no_fold = false;
  bool grid_only = false;
  int8_t mm_role = 0;
  uint32_t orig = 0;  // original domain axes merged into this one
  int inner = -1;     // the innermost of them: the folded axis walks with its stride
};

struct Layout {
  std::vector<FinalAxis> axes;  // outer to inner
  int final_of[kMaxDomAxes];    // original axis -> final axis (-1: dropped, extent 1)
  int row = -1, col = -1;
  bool loop_mode = false;
  int threads = 1;  // the thread count the grid is sized for
  // Blocks the grid should have: up to kBlocksPerThread per thread, blocks of at least
  // kMinBlockElems elements; one thread needs no more than one block (each costs a dispatch).
  int64_t wanted_blocks() const;
  std::vector<bc::Axis> bc_axes;
};

struct StrideSet {
  const int64_t* strides;  // per original domain axis
};

// Orders the live axes (innermost = smallest stride of the widest access) and folds adjacent
// axes whose every access is contiguous across them.
void fold_axes(const Stage& st, const std::vector<StrideSet>& sets, int ref, Layout* L);
// Picks the tile (rows x cols), chunk sizes and which axes the grid or loops walk.
void choose_tiling(Layout* L, const bc::Target& target, int threads, bool partial,
                   const std::vector<StrideSet>& sets);
int64_t round16(int64_t x);
// Row tiles a grid needs at least so that each thread's blocks write one region of the output
// (the threads when the tile's rows are the outermost axis, else 1).
int64_t min_row_tiles(const Layout& L);

}  // namespace dvm::enc
