#include "encoder/layout.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace dvm::enc {

int64_t order_key(int64_t stride) {
  return stride == 0 ? INT64_MAX : (stride < 0 ? -stride : stride);
}

std::vector<int> order_axes(const Stage& st, const std::vector<StrideSet>& sets, int ref) {
  std::vector<int> live;
  for (size_t a = 0; a < st.axes.size(); ++a)
    if (st.axes[a].extent != 1 || st.axes[a].mm_role != 0) live.push_back(static_cast<int>(a));
  if (ref >= 0) {
    const int64_t* s = sets[ref].strides;
    std::stable_sort(live.begin(), live.end(),
                     [&](int x, int y) { return order_key(s[x]) > order_key(s[y]); });
  }
  // A matmul's contraction axis first (it is walked inside the instruction), M and N last:
  // they are the tile's rows and columns.
  auto rank_of = [&](int a) {
    int role = st.axes[a].mm_role;
    return role == 3 ? 0 : role == 1 ? 2 : role == 2 ? 3 : 1;
  };
  std::stable_sort(live.begin(), live.end(), [&](int x, int y) { return rank_of(x) < rank_of(y); });
  return live;
}

bool can_fold(const std::vector<StrideSet>& sets, int outer, int inner, int64_t inner_extent) {
  for (const StrideSet& s : sets)
    if (s.strides[outer] != s.strides[inner] * inner_extent) return false;
  return true;
}

// Orders the live axes (innermost = smallest stride of the widest access) and folds adjacent
// axes whose every access is contiguous across them.
void fold_axes(const Stage& st, const std::vector<StrideSet>& sets, int ref, Layout* L) {
  std::fill(std::begin(L->final_of), std::end(L->final_of), -1);
  std::vector<int> order = order_axes(st, sets, ref);
  std::vector<std::vector<int>> groups;
  for (int a : order) {
    if (!groups.empty()) {
      int prev = groups.back().front();  // fold rule checked against the group's outer axis
      int inner_of_prev = groups.back().back();
      const DomAxis& pa = st.axes[prev];
      const DomAxis& xa = st.axes[a];
      int64_t ext = xa.extent;
      if (pa.reduced == xa.reduced && !pa.no_fold && !xa.no_fold &&
          can_fold(sets, inner_of_prev, a, ext)) {
        groups.back().push_back(a);
        continue;
      }
    }
    groups.push_back({a});
  }
  for (auto& g : groups) {
    FinalAxis f;
    f.reduced = st.axes[g[0]].reduced;
    f.no_fold = st.axes[g[0]].no_fold;
    f.grid_only = st.axes[g[0]].grid_only;
    f.mm_role = st.axes[g[0]].mm_role;
    f.inner = g.back();
    for (int a : g) {
      f.extent *= st.axes[a].extent;
      f.orig |= 1u << a;
      L->final_of[a] = static_cast<int>(L->axes.size());
    }
    L->axes.push_back(f);
  }
}

// Columns of a tile that has a transposed access (see choose_tiling).
constexpr int64_t kTransposedTile = 64;

bool transposed_access(const std::vector<StrideSet>& sets, int row_axis, int col_axis) {
  for (const StrideSet& s : sets) {
    int64_t rs = s.strides[row_axis], cs = s.strides[col_axis];
    if ((rs == 1 || rs == -1) && (cs > 1 || cs < -1)) return true;
  }
  return false;
}

// Does every transposed access hold the tile's rows back to back along its columns (column
// stride = the row extent: a [C, R] source read as [R, C])? A tile of every row then reads
// one contiguous run of it, whatever its columns.
bool transposed_rows_dense(const std::vector<StrideSet>& sets, int row_axis, int col_axis,
                           int64_t rows) {
  for (const StrideSet& s : sets) {
    int64_t rs = s.strides[row_axis], cs = s.strides[col_axis];
    if ((rs == 1 || rs == -1) && (cs > 1 || cs < -1) && cs != rows && cs != -rows) return false;
  }
  return true;
}

int64_t round16(int64_t x) {
  return (x + 15) / 16 * 16;
}

int64_t grid_size(const Layout& L, const std::vector<int64_t>& chunk) {
  int64_t g = 1;
  for (size_t a = 0; a < L.axes.size(); ++a) {
    if (L.axes[a].reduced || L.axes[a].mm_role == 3) continue;
    int64_t e = L.axes[a].extent;
    g *= e == 0 ? 0 : (e + chunk[a] - 1) / chunk[a];
  }
  return g;
}

// Elements of the iteration domain (every axis, reduced ones included), saturating.
int64_t domain_elems(const Layout& L) {
  int64_t n = 1;
  for (const FinalAxis& f : L.axes) {
    if (f.extent <= 0) return 0;
    n = f.extent > std::numeric_limits<int64_t>::max() / n ? std::numeric_limits<int64_t>::max()
                                                           : n * f.extent;
  }
  return n;
}

// Picks the tile (rows x cols), chunk sizes and which axes the grid or loops walk.
// The program's axes from the layout: tile roles, chunks and who walks each axis (a matmul's
// contraction inside its instruction, reduced axes by loops in loop mode, the rest the grid).
void build_axes(const std::vector<int64_t>& chunk, Layout* L) {
  for (int a = 0; a < static_cast<int>(L->axes.size()); ++a) {
    bc::Axis ax;
    ax.extent = L->axes[a].extent;
    ax.chunk = chunk[a];
    ax.tile = a == L->col   ? bc::AxisTile::kCol
              : a == L->row ? bc::AxisTile::kRow
                            : bc::AxisTile::kNone;
    ax.iter = L->axes[a].mm_role == 3              ? bc::AxisIter::kContract
              : L->axes[a].reduced && L->loop_mode ? bc::AxisIter::kLoop
                                                   : bc::AxisIter::kGrid;
    L->bc_axes.push_back(ax);
  }
}

// Few blocks that do not divide among the threads leave threads idle at the end: 5 column
// blocks of BERT's qkv projection (N = 2304) on 2 threads ran as 3 + 2 (2-thread speedup
// 1.76 instead of ~1.95). Split the columns into a few more blocks (whole GEMM panels) when
// that makes the count a multiple of the threads; with many blocks the tail is small anyway.
// Only columns: a column split at panel boundaries leaves every output's summation as it was,
// while row blocks change the GEMM's row panels, and with them (for few rows) the kernel and
// its order of sums, which must not depend on the thread count.
void balance_matmul_blocks(const Layout& L, const bc::Target& target, int threads,
                           std::vector<int64_t>* chunk) {
  const int64_t blocks = grid_size(L, *chunk);
  if (threads <= 1 || blocks == 0 || blocks % threads == 0 || blocks >= 4 * threads) return;
  if (L.col < 0 || L.axes[L.col].reduced) return;
  const int64_t extent = L.axes[L.col].extent, align = target.matmul_micro_n;
  const int64_t parts = (extent + (*chunk)[L.col] - 1) / (*chunk)[L.col];
  for (int64_t more = parts + 1; more <= parts + threads; ++more) {
    std::vector<int64_t> trial = *chunk;
    trial[L.col] = ((extent + more - 1) / more + align - 1) / align * align;
    if (grid_size(L, trial) % threads == 0) {
      *chunk = trial;
      return;
    }
  }
}

// A matmul stage's tile is the GEMM kernel's preferred output block, shrunk for parallelism.
void choose_matmul_tiling(Layout* L, const bc::Target& target, int threads) {
  int n = static_cast<int>(L->axes.size());
  std::vector<int64_t> chunk(n, 1);
  for (int a = 0; a < n; ++a) {
    if (L->axes[a].mm_role == 1) L->row = a;
    if (L->axes[a].mm_role == 2) L->col = a;
  }
  // Equal chunks (rounded up to the micro-tile) rather than full tiles plus a small tail:
  // blocks are dealt to threads in contiguous ranges, so a 112 + 16 row split of M = 128
  // would leave one thread idle most of the time.
  auto balanced = [](int64_t extent, int64_t pref, int64_t align) {
    if (extent <= pref) return std::max<int64_t>(1, extent);
    int64_t parts = (extent + pref - 1) / pref;
    int64_t c = (extent + parts - 1) / parts;
    return std::min(pref, (c + align - 1) / align * align);
  };
  chunk[L->row] = balanced(L->axes[L->row].extent, target.matmul_tile_m, target.matmul_micro_m);
  // Column chunks are whole GEMM panels (matmul_micro_n columns): a cached packed B (constant
  // weights, vm/weight_cache.h) serves only tiles that start on a panel boundary.
  chunk[L->col] = balanced(L->axes[L->col].extent, target.matmul_tile_n, target.matmul_micro_n);
  // A row-wise reduction in the tile needs whole rows (a single pass).
  if (L->axes[L->col].reduced) chunk[L->col] = std::max<int64_t>(1, L->axes[L->col].extent);
  // More blocks for the threads (one thread runs the preferred tiles as they are: a split only
  // repacks): each block packs its own K x cols slice of B, so splitting rows packs B again,
  // while a row-major f32 A is read in place (unless its rows alias in L1) and splitting
  // columns costs little. Split the columns first (nn.Linear, 2 threads, against MKL:
  // 1040 x 1024 -> 256 0.83 -> 0.91, geomean of 9 shapes 0.82 -> 0.85), the rows once the
  // columns are one GEMM panel wide.
  while (threads > 1 && grid_size(*L, chunk) < 2 * threads) {
    bool can_rows = chunk[L->row] >= 32;
    bool can_cols =
        chunk[L->col] >= 2 * target.matmul_micro_n && !L->axes[L->col].reduced;  // rows stay whole
    if (can_cols) {
      chunk[L->col] = (chunk[L->col] / 2 + target.matmul_micro_n - 1) / target.matmul_micro_n *
                      target.matmul_micro_n;
    } else if (can_rows) {
      chunk[L->row] = (chunk[L->row] + 1) / 2;
    } else {
      break;
    }
  }
  balance_matmul_blocks(*L, target, threads, &chunk);
  L->loop_mode = false;
  build_axes(chunk, L);
}

// The grid walks its first axis slowest. A tile that reads an operand's rows sparsely (rows
// further apart than the tile is wide: the heads of a [S, H, D] tensor read as [H, S, D])
// leaves holes that another grid axis fills (the next head); walked next, that axis reads
// the rest of the same lines and pages while they are cached and mapped, instead of a whole
// pass over the tensor later (permute_heads at 16M elements, 1 thread, its rows prefetched:
// 1.44-1.55x -> 1.57-1.74x its plain loop). Those axes move innermost among the grid's axes;
// the tile's columns stay last.
void walk_holes_next(const std::vector<StrideSet>& sets, std::vector<int64_t>* chunk, Layout* L) {
  if (L->row < 0 || L->axes[L->col].reduced) return;
  const FinalAxis& col = L->axes[L->col];
  if ((*chunk)[L->col] != col.extent) return;  // the next column tile fills the holes
  const int row_in = L->axes[L->row].inner, col_in = col.inner;
  const auto fills_hole = [&](int a) {
    for (const StrideSet& s : sets) {
      const int64_t rs = std::abs(s.strides[row_in]), st = std::abs(s.strides[L->axes[a].inner]);
      if (std::abs(s.strides[col_in]) == 1 && rs > col.extent && st != 0 && st < rs) return true;
    }
    return false;
  };
  std::vector<int> grid;
  for (int a = 0; a < static_cast<int>(L->axes.size()); ++a) {
    const FinalAxis& f = L->axes[a];
    if (a != L->col && !f.reduced && f.mm_role == 0 && !f.grid_only) grid.push_back(a);
  }
  // The grid's axes, hole fillers last, each group in its old order, placed in the positions
  // the grid's axes held; every other axis stays where it was.
  std::vector<int> order = grid;
  const auto fillers =
      std::stable_partition(order.begin(), order.end(), [&](int a) { return !fills_hole(a); });
  if (fillers == order.begin() || fillers == order.end()) return;
  std::vector<int> perm(L->axes.size());  // new position -> old axis
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = 0; i < grid.size(); ++i) perm[grid[i]] = order[i];
  const Layout old = *L;
  const std::vector<int64_t> old_chunk = *chunk;
  std::vector<int> pos_of(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    pos_of[perm[i]] = static_cast<int>(i);
    L->axes[i] = old.axes[perm[i]];
    (*chunk)[i] = old_chunk[perm[i]];
  }
  for (int& f : L->final_of)
    if (f >= 0) f = pos_of[f];
  L->row = pos_of[old.row];
  L->col = pos_of[old.col];
}

// Threads take contiguous ranges of blocks, the grid's first axis slowest. When the tile's
// rows are the outermost axis and come in fewer tiles than there are threads, the threads
// split an inner axis instead: each thread writes a slice of every output row, and every
// boundary between the slices is a cache line two cores write (a head merge, 64K elements, 2
// threads: 3.6 or 9.2 us by the run, as the cores' line transfers were fast or slow). One row
// tile per thread at least keeps each thread's output one region. Rows that are reduced keep
// their tiles: the order of a reduction's sums must not depend on the thread count.
int64_t min_row_tiles(const Layout& L) {
  if (L.threads <= 1 || L.row < 0) return 1;
  const FinalAxis& r = L.axes[L.row];
  if (r.reduced || r.mm_role != 0 || r.extent < L.threads) return 1;
  for (int a = 0; a < L.row; ++a) {
    const FinalAxis& f = L.axes[a];
    if (f.extent > 1 && !f.reduced && f.mm_role == 0) return 1;  // an outer axis splits
  }
  return L.threads;
}

namespace {
void split_rows_for_threads(std::vector<int64_t>* chunk, Layout* L) {
  const int64_t tiles = min_row_tiles(*L);
  if (tiles <= 1) return;
  const int64_t extent = L->axes[L->row].extent;
  int64_t& c = (*chunk)[L->row];
  if ((extent + c - 1) / c < tiles) c = (extent + tiles - 1) / tiles;
}
}  // namespace

// The tile's row axis: `row` (the reference access's second-fastest axis), or `alt`, the next
// one out, when the tile would otherwise gather a few short rows from far-apart streams. A head
// merge ([B, H, S, D] read as [B, S, H, D]) tiled 12 head rows x 64 looped over S: each trip
// read 12 rows of 256 bytes from 12 places 5 MiB apart; tiled S rows x 64 of one head, the
// source is read as one run and the output in 256-byte rows (head merge plus a residual, 16M
// elements: 1 thread 14.2-16.0 -> 11.1-12.8 ms, 2 threads 8.7-17.3 -> 4.3-6.2 ms; 64K
// elements, 2 threads, 8.4-21.8 -> 7.1-7.2 us). Only when no access is broadcast along `row`:
// rotary embedding's cos/sin, shared by the heads, ran 1.7-2.9x slower tiled by S.
int gathered_row_swap(const std::vector<StrideSet>& sets, const Layout& L, int row, int alt) {
  constexpr int64_t kShortRowAxis = 32;
  const FinalAxis &r = L.axes[row], &a = L.axes[alt], &c = L.axes[L.col];
  if (r.reduced || a.reduced || c.reduced || r.extent >= kShortRowAxis || a.extent <= r.extent)
    return row;
  bool gathered = false;
  for (const StrideSet& s : sets) {
    const int64_t rs = s.strides[r.inner], as = s.strides[a.inner];
    if (rs == 0) return row;  // rows share this operand: the tile reuses it
    const bool dense_alt = s.strides[c.inner] == 1 && as == c.extent;
    if (dense_alt && order_key(rs) > order_key(as)) gathered = true;
  }
  return gathered ? alt : row;
}

void choose_tiling(Layout* L, const bc::Target& target, int threads, bool partial,
                   const std::vector<StrideSet>& sets) {
  // A stage with less work than the target splits between threads runs on one: tiling it
  // for more only multiplies the blocks, each with its own dispatch.
  L->threads = domain_elems(*L) < target.min_parallel_work ? 1 : std::max(1, threads);
  for (const FinalAxis& f : L->axes) {
    if (f.mm_role != 0) {
      choose_matmul_tiling(L, target, L->threads);
      return;
    }
  }
  std::vector<int> cand;
  for (size_t a = 0; a < L->axes.size(); ++a)
    if (!L->axes[a].grid_only) cand.push_back(static_cast<int>(a));
  if (cand.empty()) {  // a scalar stage: one 1x1 tile
    L->axes.push_back(FinalAxis{});
    cand.push_back(static_cast<int>(L->axes.size()) - 1);
  }
  int n = static_cast<int>(L->axes.size());
  L->col = cand.back();
  L->row = cand.size() >= 2 ? cand[cand.size() - 2] : -1;
  if (cand.size() >= 3) L->row = gathered_row_swap(sets, *L, L->row, cand[cand.size() - 3]);
  std::vector<int64_t> chunk(n, 1);
  const FinalAxis& c = L->axes[L->col];
  // A partial (split) reduction must loop so that its trips can be shared between blocks.
  int64_t single_pass_limit = partial ? 0 : kMaxReduceChunk;
  chunk[L->col] = c.reduced ? (c.extent <= single_pass_limit ? c.extent : kTileElems)
                            : std::min(c.extent, kTileElems);
  chunk[L->col] = std::max<int64_t>(1, chunk[L->col]);
  // An access contiguous along the tile's rows but strided along its columns (a transposed
  // operand or output) touches one cache line per element of a tile row: square tiles make
  // each line it touches serve many rows (64 floats: 16 rows of a 64-byte line, 4 lines).
  // Not where a tile of every row fits and the source holds those rows back to back: there
  // every line serves the whole tile at any width, and narrow tiles only multiply blocks
  // (transpose_add at 4K elements, [1024, 4] read as [4, 1024]: 16 blocks of 4 x 64).
  if (L->row >= 0 && !c.reduced && !L->axes[L->row].reduced &&
      transposed_access(sets, L->axes[L->row].inner, L->axes[L->col].inner)) {
    const int64_t rows = L->axes[L->row].extent;
    const bool whole_rows = kTileElems / round16(chunk[L->col]) >= rows;
    if (!whole_rows ||
        !transposed_rows_dense(sets, L->axes[L->row].inner, L->axes[L->col].inner, rows))
      chunk[L->col] = std::min<int64_t>(chunk[L->col], kTransposedTile);
  }
  if (L->row >= 0) {
    const int64_t tile = c.reduced ? tile_tuning().row_reduce_tile_elems : kTileElems;
    int64_t cap = std::max<int64_t>(1, tile / round16(chunk[L->col]));
    chunk[L->row] = std::max<int64_t>(1, std::min(L->axes[L->row].extent, cap));
  }
  // Enough blocks for every thread (and some slack for balance), not tiles too small to
  // amortise dispatch.
  while (grid_size(*L, chunk) < L->wanted_blocks()) {
    if (!L->axes[L->col].reduced && chunk[L->col] >= 1024) {
      chunk[L->col] = round16(chunk[L->col] / 2);
    } else if (L->row >= 0 && !L->axes[L->row].reduced && chunk[L->row] >= 2 &&
               chunk[L->row] * chunk[L->col] >= 1024) {
      chunk[L->row] /= 2;
    } else {
      break;
    }
  }
  L->loop_mode = false;
  for (int a = 0; a < n; ++a) {
    const FinalAxis& f = L->axes[a];
    if (!f.reduced) continue;
    bool tile = a == L->row || a == L->col;
    if (!tile || f.extent == 0 || (f.extent + chunk[a] - 1) / chunk[a] > 1) L->loop_mode = true;
  }
  if (!partial) walk_holes_next(sets, &chunk, L);
  split_rows_for_threads(&chunk, L);
  build_axes(chunk, L);
  if (!partial) return;
  int split = -1;
  for (int a = 0; a < n; ++a)
    if (L->axes[a].grid_only) split = a;
  for (int a = 0; a < n && split >= 0; ++a) {
    if (L->bc_axes[a].iter == bc::AxisIter::kLoop) {  // the outermost loop is shared out
      L->bc_axes[a].split_by = static_cast<int8_t>(split);
      break;
    }
  }
}

int64_t Layout::wanted_blocks() const {
  if (threads <= 1) return 1;
  const TileTuning& t = tile_tuning();
  // The stage's elements, saturating: only their ratio to min_block_elems matters.
  constexpr int64_t kCap = int64_t{1} << 40;
  int64_t elems = 1;
  for (const FinalAxis& a : axes) {
    const int64_t e = std::max<int64_t>(a.extent, 1);
    elems = e >= kCap / elems ? kCap : elems * e;
  }
  const int64_t per_thread =
      t.min_block_elems > 0 ? elems / (t.min_block_elems * threads) : t.blocks_per_thread;
  return std::clamp<int64_t>(per_thread, 1, t.blocks_per_thread) * threads;
}

TileTuning& tile_tuning() {
  static TileTuning tuning;
  return tuning;
}

}  // namespace dvm::enc
