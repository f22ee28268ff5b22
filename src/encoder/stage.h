// The encoder's intermediate form: stages of instances of kernel nodes, each with an affine
// map from its stage's iteration domain (see docs/architecture.md). Internal to src/encoder.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "bytecode/format.h"
#include "encoder/encoder.h"
#include "ir/kernel_def.h"

namespace dvm::enc {

using bc::Operand;
using bc::TileClass;
using ir::CShape;
using ir::Node;
using ir::OpKind;

inline constexpr int kMaxDomAxes = bc::kMaxAxes;
inline constexpr int64_t kTileElems = 4096;        // elements per register for streaming stages
inline constexpr int64_t kMaxReduceChunk = 16384;  // a reduced row up to this fits one pass
// Rows reduced along the tile's columns (norms, softmax) are tiled up to this many elements:
// such a program runs ten or so instructions per block, and the interpreter's fixed work per
// block (about 1K instructions) weighs more than reading its registers from L2 instead of L1
// (interleaved A/B, 1 thread, Zen 4: rmsnorm rows of 64 and add+layernorm rows of 768 run
// 1.1-1.2x faster, softmax rows of 512 1.05-1.09x, rows of 4096+ unchanged, against 4K
// tiles). fit_tile_to_cache still bounds the registers' bytes by kRegBudgetBytes.
inline constexpr int64_t kRowReduceTileElems = 16384;
// Live tile registers should stay in L2 (1 MiB per core on the machines we measured). Keeping
// them in L1 instead meant 1-row tiles whose dispatch overhead cost more than the L2 traffic
// (layernorm over 1024 columns: 888 us at 20 KiB vs 494 us at 256 KiB per 1M elements).
inline constexpr int64_t kRegBudgetBytes = 128 * 1024;
// Except for rows reduced along kLongRowCols columns or more (norms, softmax over a model's
// hidden size): a block's 3-5 passes over its registers then cost more from L2 than the
// dispatch of smaller blocks, so their registers keep to about L1 (48 KiB on Zen 4), with at
// least kMinLongRowTile rows per tile. 1 thread, interleaved, against the 128 KiB budget:
// add+layernorm rows of 256 at 64K/1M/16M elements 1.14x/1.13x/1.06x faster, rows of 768
// 0.99x/1.06x/1.04x, softmax rows of 512 0.99x/1.10x/1.29x; rows of 64 (rmsnorm) wanted the
// large tiles (16K-element tiles 117 us at 1M, 4K-element ones 128-130).
inline constexpr int64_t kLongRowCols = 256;
inline constexpr int64_t kRowRegBudgetBytes = 48 * 1024;
inline constexpr int64_t kMinLongRowTile = 4;

// Blocks a grid should have per thread (Layout::wanted_blocks): slack for blocks of uneven
// cost (a tail, a partial tile). But no fewer than kMinBlockElems elements a block where the
// launch is small: a block costs a dispatch and its operands' setup, ~0.1-0.2 us, a tenth of a
// 64K-element launch's share of a thread (2 threads, interleaved, 4 blocks a thread against 1 at
// 64K elements: rotary 1.11-1.18x, mid_sum 1.06-1.17x, broadcasts 1.03-1.07x faster with 1,
// the rest within 3%; at 256K and 1M elements within 3% either way).
inline constexpr int64_t kBlocksPerThread = 4;
inline constexpr int64_t kMinBlockElems = 32768;

// The tile-size constants above as the encoder reads them. Only benchmarks change them, to
// compare two tilings of one workload in one process (vm_suite_bench --ab); not thread-safe.
struct TileTuning {
  int64_t row_reduce_tile_elems = kRowReduceTileElems;
  int64_t reg_budget_bytes = kRegBudgetBytes;
  int64_t row_reg_budget_bytes = kRowRegBudgetBytes;
  int64_t long_row_cols = kLongRowCols;
  int64_t blocks_per_thread = kBlocksPerThread;
  int64_t min_block_elems = kMinBlockElems;
};
TileTuning& tile_tuning();

// Reductions with fewer outputs than kSplitParts over at least kSplitMinElems inputs are
// split across kSplitParts blocks and combined by a second program.
inline constexpr int64_t kSplitParts = 16;
// A row-wise reduction of a matmul's output shares its tile up to this row length.
inline constexpr int64_t kMaxMatmulRow = 2048;
inline constexpr int64_t kSplitMinElems = int64_t{1} << 17;

// ---- affine maps and views -------------------------------------------------------------

// Index of a node's dim as a function of the stage domain: start + step * dom[axis].
// axis < 0: the dim is fixed at `start` (it has no domain axis of its own).
struct MapEntry {
  int axis = -1;
  int64_t start = 0;
  int64_t step = 0;
  bool operator==(const MapEntry&) const = default;
};

struct NodeMap {
  int rank = 0;
  MapEntry e[kMaxRank];
  bool operator==(const NodeMap& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (!(e[i] == o.e[i])) return false;
    return true;
  }
};

// A strided view of an argument slot.
struct View {
  int slot = -1;
  DType dtype = DType::kF32;
  CShape shape;
  int64_t stride[kMaxRank] = {};
  int64_t offset = 0;
};

View arg_view(int slot, const TensorArg& t);
View contiguous_view(int slot, DType dtype, const CShape& s);
// Strides of `v` reshaped to `to` without copying, if the layout allows it (the same rule as
// torch's view()).
bool reshape_view(const View& v, const CShape& to, View* out);

// ---- stages ----------------------------------------------------------------------------

enum class InstKind : uint8_t { kLoad, kScalar, kCompute, kReduce, kMatMul };

// One node evaluated in a stage under one map.
struct Inst {
  int node = -1;
  NodeMap map;
  InstKind kind = InstKind::kCompute;
  std::vector<int> inputs;               // instance ids
  uint32_t vary = 0;                     // domain axes the value depends on
  uint32_t reduced = 0;                  // kReduce: domain axes reduced
  int contract = -1;                     // kMatMul: the contraction axis
  View view;                             // kLoad
  int64_t dom_stride[kMaxDomAxes] = {};  // kLoad: element stride per domain axis
  int64_t dom_offset = 0;
  int level = 0;
  int uses = 0;
};

struct Sink {
  int inst = -1;
  int slot = -1;
  DType dtype = DType::kF32;
  int64_t dom_stride[kMaxDomAxes] = {};
  int64_t dom_offset = 0;
};

struct DomAxis {
  int64_t extent = 1;
  bool reduced = false;
  bool no_fold = false;    // reduced by an arg-reduction: its index must stay logical
  bool grid_only = false;  // splits a reduction across blocks: never a tile axis
  int8_t mm_role = 0;      // a matmul's 1: M (tile rows), 2: N (tile cols), 3: K (contracted)
};

struct Stage {
  CShape root;
  bool joinable = false;
  std::vector<DomAxis> axes;
  std::vector<Inst> insts;
  std::vector<Sink> sinks;
  uint32_t reduce_set = 0;
  bool has_reduce = false;
  // Computes per-block partial reductions (split across blocks along `split_axis`); a later
  // stage combines them.
  bool partial = false;
  int split_axis = -1;
  // A matmul's output tile is the stage's tile: every matmul of a stage shares M and N.
  bool has_matmul = false;
  int mm_m = -1, mm_n = -1;
};

struct Workspace {
  int slot;
  View view;
};

}  // namespace dvm::enc
