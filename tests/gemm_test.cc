// The GEMM core (src/vm/cpu/gemm.h) against a naive double-accumulated triple loop: shapes around
// the micro-tile edges, primes, transposed and broadcast operands, accumulate on/off, f16 and
// bf16 inputs, and one large case.
#include "vm/cpu/gemm.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "ops/scalar_ops.h"

namespace dvm::vm::cpu {
namespace {

// An operand: `rows` x `cols` logical elements at data[i * rs + j * cs].
struct Operand {
  std::vector<float> data;
  int64_t rs = 0, cs = 0;
  float at(int64_t i, int64_t j) const { return data[static_cast<size_t>(i * rs + j * cs)]; }
};

enum class Layout { kRowMajor, kTransposed, kBroadcastRows, kBroadcastCols, kPadded };

Operand make_operand(int64_t rows, int64_t cols, Layout layout, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Operand o;
  size_t size = 0;
  switch (layout) {
    case Layout::kRowMajor:
      o.rs = cols, o.cs = 1, size = static_cast<size_t>(rows * cols);
      break;
    case Layout::kTransposed:
      o.rs = 1, o.cs = rows, size = static_cast<size_t>(rows * cols);
      break;
    case Layout::kBroadcastRows:  // every row the same
      o.rs = 0, o.cs = 1, size = static_cast<size_t>(cols);
      break;
    case Layout::kBroadcastCols:  // every column the same
      o.rs = 1, o.cs = 0, size = static_cast<size_t>(rows);
      break;
    case Layout::kPadded:  // row-major with a row stride larger than the row, odd column stride
      o.rs = cols * 2 + 3, o.cs = 2, size = static_cast<size_t>(rows * (cols * 2 + 3));
      break;
  }
  o.data.resize(std::max<size_t>(size, 1));
  for (float& x : o.data) x = dist(rng);
  return o;
}

const char* name(Layout l) {
  switch (l) {
    case Layout::kRowMajor:
      return "row";
    case Layout::kTransposed:
      return "trans";
    case Layout::kBroadcastRows:
      return "bcast_rows";
    case Layout::kBroadcastCols:
      return "bcast_cols";
    case Layout::kPadded:
      return "padded";
  }
  return "?";
}

// C (m x n, row stride ldc) vs reference; c0 holds C before the call (for accumulate).
void check(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b,
           const std::vector<float>& c0, const std::vector<float>& c, int64_t ldc, bool accumulate,
           double rel_tol, const std::string& what) {
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = accumulate ? c0[static_cast<size_t>(i * ldc + j)] : 0.0;
      double mag = std::abs(ref);
      for (int64_t p = 0; p < k; ++p) {
        const double prod = static_cast<double>(a.at(i, p)) * b.at(p, j);
        ref += prod;
        mag += std::abs(prod);
      }
      const double got = c[static_cast<size_t>(i * ldc + j)];
      const double tol =
          rel_tol * std::sqrt(static_cast<double>(std::max<int64_t>(k, 1))) * mag + 1e-30;
      if (!(std::abs(got - ref) <= tol)) {
        if (++bad <= 5) {
          ADD_FAILURE() << what << ": C[" << i << "," << j << "] = " << got << ", want " << ref
                        << " (tol " << tol << ")";
        }
      }
    }
  }
  // Padding columns of C past n are untouched.
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = n; j < ldc; ++j) {
      const size_t idx = static_cast<size_t>(i * ldc + j);
      if (c[idx] != c0[idx]) {
        if (++bad <= 5) ADD_FAILURE() << what << ": padding C[" << i << "," << j << "] written";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// Runs f once per SIMD target this machine supports (the dispatched GEMM is compiled for SSE4,
// AVX2, AVX3 and the portable EMU128 fallback; SSSE3 and AVX3_DL are not compiled).
template <class F>
void for_each_target(F f) {
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (t == HWY_SSSE3 || t == HWY_AVX3_DL) continue;
    hwy::SetSupportedTargetsForTest(t);
    SCOPED_TRACE(hwy::TargetName(t));
    f();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// bt_in_place: through gemm_f32_bt_in_place (lb must be kTransposed).
void run_f32(int64_t m, int64_t n, int64_t k, Layout la, Layout lb, bool accumulate,
             std::mt19937& rng, bool bt_in_place = false) {
  const Operand a = make_operand(m, k, la, rng);
  const Operand b = make_operand(k, n, lb, rng);
  const int64_t ldc = n + 3;
  std::vector<float> c0(static_cast<size_t>(std::max<int64_t>(m * ldc, 1)));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : c0) x = dist(rng);
  std::vector<float> c = c0;
  if (bt_in_place) {
    EXPECT_EQ(b.rs, 1);
    gemm_f32_bt_in_place(m, n, k, a.data.data(), a.rs, a.cs, b.data.data(), b.cs, c.data(), ldc,
                         accumulate);
  } else {
    gemm_f32(m, n, k, a.data.data(), a.rs, a.cs, b.data.data(), b.rs, b.cs, c.data(), ldc,
             accumulate);
  }
  char what[160];
  std::snprintf(what, sizeof(what), "f32%s m=%lld n=%lld k=%lld A=%s B=%s acc=%d",
                bt_in_place ? " bt_in_place" : "", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k), name(la), name(lb),
                accumulate ? 1 : 0);
  check(m, n, k, a, b, c0, c, ldc, accumulate, 1e-6, what);
}

TEST(Gemm, MicroTile) {
  for_each_target([&] {
    const GemmTile mt = gemm_micro_tile();
    const GemmTile pt = gemm_preferred_tile();
    EXPECT_GT(mt.m, 0);
    EXPECT_GT(mt.n, 0);
    EXPECT_EQ(pt.m % mt.m, 0);
    EXPECT_EQ(pt.n % mt.n, 0);
    std::printf("%s: micro-tile %lld x %lld, preferred tile %lld x %lld\n",
                hwy::TargetName(hwy::SupportedTargets() & ~(hwy::SupportedTargets() - 1)),
                static_cast<long long>(mt.m), static_cast<long long>(mt.n),
                static_cast<long long>(pt.m), static_cast<long long>(pt.n));
  });
}

TEST(Gemm, ZeroSizes) {
  for_each_target([&] {
    std::mt19937 rng(1);
    for (int64_t m : {0, 1, 5})
      for (int64_t n : {0, 1, 7})
        for (int64_t k : {0, 1, 3})
          for (bool acc : {false, true})
            run_f32(m, n, k, Layout::kRowMajor, Layout::kRowMajor, acc, rng);
    // k = 0 without accumulate writes zeros, with accumulate leaves C.
    std::vector<float> c(12, 5.0f);
    gemm_f32(3, 4, 0, nullptr, 0, 0, nullptr, 0, 0, c.data(), 4, true);
    for (float x : c) EXPECT_EQ(x, 5.0f);
    gemm_f32(3, 4, 0, nullptr, 0, 0, nullptr, 0, 0, c.data(), 4, false);
    for (float x : c) EXPECT_EQ(x, 0.0f);
    // m or n = 0 touches nothing.
    gemm_f32(0, 4, 3, nullptr, 0, 0, nullptr, 0, 0, nullptr, 4, false);
    gemm_f32(3, 0, 3, nullptr, 0, 0, nullptr, 0, 0, nullptr, 4, false);
  });
}

TEST(Gemm, SkinnyRows) {
  for_each_target([&] {
    std::mt19937 rng(2);
    for (int64_t m = 1; m <= 17; ++m)
      for (int64_t n : {1, 8, 16, 17, 31, 32, 33, 64, 100})
        for (int64_t k : {1, 7, 64, 257}) {
          run_f32(m, n, k, Layout::kRowMajor, Layout::kRowMajor, m % 2 == 0, rng);
          // Linear-layer weights [N, K] read transposed: the GEMV and transpose-pack paths.
          run_f32(m, n, k, Layout::kRowMajor, Layout::kTransposed, m % 3 == 0, rng);
        }
  });
}

// gemm_f32_skinny (x [m <= 16, K] times W [N, K]^T, W read in place; the VM's path for
// decode-sized products): every m, W-row tails (n % 4), K tails, accumulate, k = 0; and each
// output's bits do not depend on m (the VM relies on it: a product's rows may be split).
TEST(Gemm, SkinnyTransposedInPlace) {
  for_each_target([&] {
    std::mt19937 rng(5);
    for (int64_t m = 1; m <= 16; ++m)
      for (int64_t n : {1, 4, 7, 13, 33})  // one row of x: blocks of 8, 4 and 1 W rows
        for (int64_t k : {0, 1, 15, 64, 257, 600}) {
          const Operand a = make_operand(m, k, Layout::kRowMajor, rng);
          const Operand b = make_operand(k, n, Layout::kTransposed, rng);
          ASSERT_EQ(a.cs, 1);
          ASSERT_EQ(b.rs, 1);
          const bool acc = (m + n) % 2 == 0;
          const int64_t ldc = n + 2;
          std::vector<float> c0(static_cast<size_t>(m * ldc));
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          for (float& x : c0) x = dist(rng);
          std::vector<float> c = c0;
          gemm_f32_skinny(m, n, k, a.data.data(), a.rs, b.data.data(), b.cs, c.data(), ldc, acc);
          char what[120];
          std::snprintf(what, sizeof(what), "skinny m=%lld n=%lld k=%lld acc=%d",
                        static_cast<long long>(m), static_cast<long long>(n),
                        static_cast<long long>(k), acc ? 1 : 0);
          check(m, n, k, a, b, c0, c, ldc, acc, 1e-6, what);
          // Row by row: the same bits as the whole product.
          for (int64_t i = 0; i < m; ++i) {
            std::vector<float> row(c0.begin() + i * ldc, c0.begin() + i * ldc + n);
            gemm_f32_skinny(1, n, k, a.data.data() + i * a.rs, a.rs, b.data.data(), b.cs,
                            row.data(), n, acc);
            for (int64_t j = 0; j < n; ++j)
              ASSERT_EQ(row[j], c[i * ldc + j]) << what << " row " << i << " col " << j;
          }
        }
  });
}

TEST(Gemm, Primes) {
  for_each_target([&] {
    std::mt19937 rng(3);
    const int64_t primes[] = {2, 3, 5, 13, 29, 31, 37, 61, 97, 131};
    for (int64_t m : primes)
      for (int64_t n : primes)
        for (int64_t k : {1, 13, 97, 263, 521})
          run_f32(m, n, k, Layout::kRowMajor, Layout::kRowMajor, (m + n + k) % 2 == 0, rng);
  });
}

TEST(Gemm, Layouts) {
  for_each_target([&] {
    std::mt19937 rng(4);
    const Layout layouts[] = {Layout::kRowMajor, Layout::kTransposed, Layout::kBroadcastRows,
                              Layout::kBroadcastCols, Layout::kPadded};
    for (Layout la : layouts)
      for (Layout lb : layouts)
        for (int64_t m : {1, 3, 14, 15, 29})
          for (int64_t n : {1, 16, 33, 70})
            for (bool acc : {false, true}) run_f32(m, n, 300, la, lb, acc, rng);
  });
}

// gemm_f32_bt_in_place: f32 products with a transposed B (nn.Linear's W [N, K]) read W in
// place on AVX-512: x in 32-row panels, W rows 14 at a time. Rows around the panel edge, columns
// around the 14-row groups, K across blocks, A row-major or transposed, accumulate on and off.
TEST(Gemm, TransposedBReadInPlace) {
  for_each_target([&] {
    std::mt19937 rng(9);
    // 160, 175: five or more x panels, W's rows packed (175: a last panel of 15 rows)
    for (int64_t m : {5, 32, 33, 100, 160, 175})
      for (int64_t n : {1, 13, 14, 15, 29, 100})
        for (int64_t k : {1, 17, 256, 1024, 1100})  // 1024: W rows 4 KiB apart, copied
          for (Layout la : {Layout::kRowMajor, Layout::kTransposed})
            run_f32(m, n, k, la, Layout::kTransposed, (m + n + k) % 2 == 1, rng, true);
  });
}

// W's rows read in place, copied (4 KiB apart) or packed (five or more x panels): each
// output sums the same products in the same order, so a product of 200 rows gives the bits
// of the same rows computed 32 at a time (one panel: never packed).
TEST(Gemm, TransposedBPathsAgreeBitwise) {
  for_each_target([&] {
    std::mt19937 rng(12);
    for (int64_t k : {300, 1024, 1100}) {
      const int64_t m = 200, n = 45;
      const Operand a = make_operand(m, k, Layout::kRowMajor, rng);
      const Operand b = make_operand(k, n, Layout::kTransposed, rng);
      std::vector<float> whole(static_cast<size_t>(m * n)), parts(whole.size());
      gemm_f32_bt_in_place(m, n, k, a.data.data(), a.rs, a.cs, b.data.data(), b.cs, whole.data(), n,
                           false);
      for (int64_t i0 = 0; i0 < m; i0 += 32) {
        gemm_f32_bt_in_place(std::min<int64_t>(32, m - i0), n, k, a.data.data() + i0 * a.rs, a.rs,
                             a.cs, b.data.data(), b.cs, parts.data() + i0 * n, n, false);
      }
      EXPECT_EQ(whole, parts) << "k=" << k;
    }
  });
}

// A promised-unchanged A (a_token) keeps its packed x panels from one call to the next (the
// VM's tiles along N): the same bits as packing each time, over several row chunks and K
// blocks; a new token, or another A, repacks (an A rewritten under a new token is seen).
TEST(Gemm, TransposedBKeepsPackedRowsForTheSameToken) {
  for_each_target([&] {
    std::mt19937 rng(11);
    for (int64_t m : {20, 232, 288}) {
      const int64_t k = 1100, n = 40;
      Operand a = make_operand(m, k, Layout::kRowMajor, rng);
      const Operand b = make_operand(k, 2 * n, Layout::kTransposed, rng);
      std::vector<float> want(static_cast<size_t>(m * 2 * n)), got(want.size());
      const auto tile = [&](std::vector<float>& c, int64_t j0, uint64_t token) {
        gemm_f32_bt_in_place(m, n, k, a.data.data(), a.rs, a.cs, b.data.data() + j0 * b.cs, b.cs,
                             c.data() + j0, 2 * n, false, token);
      };
      for (uint64_t token : {uint64_t{7}, uint64_t{8}}) {
        tile(want, 0, 0);
        tile(want, n, 0);
        tile(got, 0, token);
        tile(got, n, token);  // reads the panels the first tile packed
        EXPECT_EQ(want, got) << "m=" << m << " token " << token;
        for (float& x : a.data) x = -x;  // rewritten: the next token must not reuse the panels
      }
    }
  });
}

TEST(Gemm, Medium) {
  for_each_target([&] {
    std::mt19937 rng(5);
    run_f32(100, 300, 257, Layout::kRowMajor, Layout::kRowMajor, false, rng);
    run_f32(100, 300, 257, Layout::kTransposed, Layout::kTransposed, true, rng);
    // More than one column block (NC) and several K blocks.
    run_f32(37, 1100, 700, Layout::kRowMajor, Layout::kRowMajor, true, rng);
    run_f32(3, 1100, 700, Layout::kRowMajor, Layout::kRowMajor, false, rng);
    run_f32(3, 1100, 700, Layout::kRowMajor, Layout::kTransposed, false, rng);
    // A row stride of 4 KiB: A is packed, not read in place (its rows would share an L1 set).
    run_f32(30, 70, 1024, Layout::kRowMajor, Layout::kRowMajor, true, rng);
  });
}

TEST(Gemm, Large) {
  std::mt19937 rng(6);
  run_f32(384, 768, 768, Layout::kRowMajor, Layout::kRowMajor, false, rng);
  run_f32(384, 768, 768, Layout::kRowMajor, Layout::kTransposed, true, rng, true);
}

// Half inputs: the operands are rounded to f16 / bf16; the reference uses the rounded values.
// skinny: through gemm_half_skinny (la must be kRowMajor, lb kTransposed); bt_in_place:
// through gemm_half_bt_in_place (lb kTransposed); b_rows: through gemm_bf16_b_rows (bf16, B's
// column stride 1).
void run_half(DType t, int64_t m, int64_t n, int64_t k, Layout la, Layout lb, bool accumulate,
              std::mt19937& rng, bool skinny = false, bool bt_in_place = false,
              bool b_rows = false) {
  Operand a = make_operand(m, k, la, rng);
  Operand b = make_operand(k, n, lb, rng);
  const auto to_bits = [t](float x) {
    return t == DType::kF16 ? ops::f32_to_f16_bits(x) : ops::f32_to_bf16_bits(x);
  };
  const auto from_bits = [t](uint16_t x) {
    return t == DType::kF16 ? ops::f16_bits_to_f32(x) : ops::bf16_bits_to_f32(x);
  };
  std::vector<uint16_t> ah(a.data.size()), bh(b.data.size());
  for (size_t i = 0; i < ah.size(); ++i) a.data[i] = from_bits(ah[i] = to_bits(a.data[i]));
  for (size_t i = 0; i < bh.size(); ++i) b.data[i] = from_bits(bh[i] = to_bits(b.data[i]));
  const int64_t ldc = n + 1;
  std::vector<float> c0(static_cast<size_t>(std::max<int64_t>(m * ldc, 1)), 0.5f);
  std::vector<float> c = c0;
  if (skinny) {
    gemm_half_skinny(t, m, n, k, ah.data(), a.rs, bh.data(), b.cs, c.data(), ldc, accumulate);
  } else if (b_rows) {
    EXPECT_EQ(b.cs, 1);
    gemm_bf16_b_rows(m, n, k, ah.data(), a.rs, a.cs, bh.data(), b.rs, c.data(), ldc, accumulate);
  } else if (bt_in_place) {
    EXPECT_EQ(b.rs, 1);
    gemm_half_bt_in_place(t, m, n, k, ah.data(), a.rs, a.cs, bh.data(), b.cs, c.data(), ldc,
                          accumulate);
  } else {
    gemm_half(t, m, n, k, ah.data(), a.rs, a.cs, bh.data(), b.rs, b.cs, c.data(), ldc, accumulate);
  }
  char what[160];
  std::snprintf(what, sizeof(what), "%s%s m=%lld n=%lld k=%lld A=%s B=%s acc=%d",
                t == DType::kF16 ? "f16" : "bf16",
                skinny ? " skinny" : (bt_in_place ? " bt_in_place" : (b_rows ? " b_rows" : "")),
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                name(la), name(lb), accumulate ? 1 : 0);
  check(m, n, k, a, b, c0, c, ldc, accumulate, 1e-6, what);
}

TEST(Gemm, Half) {
  for_each_target([&] {
    std::mt19937 rng(7);
    for (DType t : {DType::kF16, DType::kBF16})
      for (Layout la : {Layout::kRowMajor, Layout::kTransposed, Layout::kBroadcastRows})
        for (Layout lb : {Layout::kRowMajor, Layout::kTransposed, Layout::kBroadcastCols})
          for (int64_t m : {0, 1, 4, 17})
            for (int64_t n : {1, 33})
              for (bool acc : {false, true}) run_half(t, m, n, 291, la, lb, acc, rng);
    run_half(DType::kBF16, 100, 300, 257, Layout::kRowMajor, Layout::kRowMajor, false, rng);
  });
}

// gemm_half_skinny: decode-sized f16 / bf16 products with W^T read in place, widened to f32
// as they are read (bf16 on AVX512-BF16: multiplied as pairs, K around its 32-value steps):
// rows of x around the 4-row groups, W's rows around the 4-row groups, K
// around a vector (16 lanes) with its scalar tail; and rows computed together give the bits of
// each row computed alone (the order of an output's sum does not depend on m).
TEST(Gemm, HalfSkinny) {
  for (int dot : {0, 1}) {  // bf16: widened, or VDPBF16PS pairs (32 values a step)
    set_bf16_dot_for_testing(dot);
    if (dot == 1 && !gemm_bf16_dot_enabled()) break;
    SCOPED_TRACE(dot ? "bf16 pairs" : "widened");
    for_each_target([&] {
      std::mt19937 rng(19);
      for (DType t : {DType::kF16, DType::kBF16}) {
        for (int64_t m : {1, 3, 4, 5, 16})
          for (int64_t n : {1, 3, 4, 7, 33})
            for (int64_t k : {1, 15, 16, 17, 64, 291})
              run_half(t, m, n, k, Layout::kRowMajor, Layout::kTransposed, (m + n + k) % 2 == 0,
                       rng, true);
        const int64_t m = 16, n = 37, k = 300;
        std::vector<uint16_t> x(m * k), w(n * k);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        for (uint16_t& v : x) v = ops::f32_to_bf16_bits(dist(rng));  // valid f16 bits too
        for (uint16_t& v : w) v = ops::f32_to_bf16_bits(dist(rng)) & 0x7bffu;
        std::vector<float> whole(m * n), rows(m * n);
        gemm_half_skinny(t, m, n, k, x.data(), k, w.data(), k, whole.data(), n, false);
        for (int64_t i = 0; i < m; ++i)
          gemm_half_skinny(t, 1, n, k, x.data() + i * k, k, w.data(), k, rows.data() + i * n, n,
                           false);
        EXPECT_EQ(whole, rows) << (t == DType::kF16 ? "f16" : "bf16");
      }
    });
  }
  set_bf16_dot_for_testing(-1);
}

// gemm_half_bt_in_place: f16 / bf16 products with W^T, x's panels and W's blocks of rows
// widened as they are packed, or (bf16 on a CPU with AVX512-BF16, an even K) multiplied as
// pairs by VDPBF16PS: rows around the 32-row panels, W's rows around the 14-row blocks, K
// around a 16-value step (odd: widened) and across 512-value blocks, A row-major or
// transposed. Widened, the bits are those of gemm_f32_bt_in_place on the widened values, for
// one x panel (the f32 path reads W in place there) and for many (it packs W too); either way
// a product computed whole gives the bits of its rows computed 32 at a time.
TEST(Gemm, HalfTransposedBReadInPlace) {
  for (int dot : {0, 1}) {
    set_bf16_dot_for_testing(dot);
    if (dot == 1 && !gemm_bf16_dot_enabled()) break;  // the CPU has no AVX512-BF16
    SCOPED_TRACE(dot ? "bf16 pairs" : "widened");
    for_each_target([&] {
      std::mt19937 rng(23);
      for (DType t : {DType::kF16, DType::kBF16})
        for (int64_t m : {5, 33, 100, 175})
          for (int64_t n : {1, 15, 100})
            for (int64_t k : {17, 1100})
              for (Layout la : {Layout::kRowMajor, Layout::kTransposed})
                run_half(t, m, n, k, la, Layout::kTransposed, (m + n + k) % 2 == 1, rng, false,
                         true);
      // W's rows aliasing in L1 (K = 2048: bf16 pairs read in place in 10-row blocks, widened
      // rows through a copy), one and two x panels, the last block of W's rows partial.
      for (int64_t m : {16, 40})
        run_half(DType::kBF16, m, 23, 2048, Layout::kRowMajor, Layout::kTransposed, m == 40, rng,
                 false, true);
      // Rows computed whole (5 x panels: W's rows packed, but for bf16 pairs) and 32 at a time
      // (W read in place; at K = 2048 aliasing in L1): the same bits.
      for (DType t : {DType::kF16, DType::kBF16})
        for (int64_t k : {1100, 2048}) {
          const int64_t m = 150, n = 45;
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          std::vector<uint16_t> x(m * k), w(n * k);
          for (uint16_t& v : x) v = ops::f32_to_bf16_bits(dist(rng)) & 0x7bffu;  // valid f16 too
          for (uint16_t& v : w) v = ops::f32_to_bf16_bits(dist(rng)) & 0x7bffu;
          const auto widen = [t](const std::vector<uint16_t>& h) {
            std::vector<float> f(h.size());
            for (size_t i = 0; i < h.size(); ++i)
              f[i] = t == DType::kF16 ? ops::f16_bits_to_f32(h[i]) : ops::bf16_bits_to_f32(h[i]);
            return f;
          };
          const std::vector<float> xf = widen(x), wf = widen(w);
          std::vector<float> half(m * n), f32(m * n), half_parts(m * n), f32_parts(m * n);
          gemm_half_bt_in_place(t, m, n, k, x.data(), k, 1, w.data(), k, half.data(), n, false);
          gemm_f32_bt_in_place(m, n, k, xf.data(), k, 1, wf.data(), k, f32.data(), n, false);
          for (int64_t i0 = 0; i0 < m; i0 += 32) {
            const int64_t rows = std::min<int64_t>(32, m - i0);
            gemm_half_bt_in_place(t, rows, n, k, x.data() + i0 * k, k, 1, w.data(), k,
                                  half_parts.data() + i0 * n, n, false);
            gemm_f32_bt_in_place(rows, n, k, xf.data() + i0 * k, k, 1, wf.data(), k,
                                 f32_parts.data() + i0 * n, n, false);
          }
          const char* tn = t == DType::kF16 ? "f16" : "bf16";
          EXPECT_EQ(half, half_parts) << tn;
          EXPECT_EQ(f32, f32_parts) << tn;
          if (dot == 0 || t == DType::kF16) {
            EXPECT_EQ(half, f32) << tn;
          }
        }
    });
  }
  set_bf16_dot_for_testing(-1);
}

// gemm_bf16_b_rows: bf16 products with a row-major B (GPT-2's Conv1D weight, probabilities @
// V), pairs of B's rows interleaved for VDPBF16PS where the CPU has it (else, and for an odd
// K or a transposed A, GemmImpl): rows around the 32-row panels, columns around the 14-column
// blocks, K across 1024-value blocks, B broadcast along K; rows computed whole give the bits
// of the same rows 32 at a time.
TEST(Gemm, Bf16RowMajorB) {
  for (int dot : {0, 1}) {
    set_bf16_dot_for_testing(dot);
    if (dot == 1 && !gemm_bf16_dot_enabled()) break;
    SCOPED_TRACE(dot ? "bf16 pairs" : "widened");
    for_each_target([&] {
      std::mt19937 rng(29);
      for (int64_t m : {1, 5, 33, 100})
        for (int64_t n : {1, 15, 33, 100})
          for (int64_t k : {2, 17, 64, 2100})
            for (Layout la : {Layout::kRowMajor, Layout::kTransposed})
              for (Layout lb : {Layout::kRowMajor, Layout::kBroadcastRows})
                run_half(DType::kBF16, m, n, k, la, lb, (m + n + k) % 2 == 1, rng, false, false,
                         true);
      const int64_t m = 150, n = 45, k = 300;
      const Operand a = make_operand(m, k, Layout::kRowMajor, rng);
      const Operand b = make_operand(k, n, Layout::kRowMajor, rng);
      std::vector<uint16_t> ah(a.data.size()), bh(b.data.size());
      for (size_t i = 0; i < ah.size(); ++i) ah[i] = ops::f32_to_bf16_bits(a.data[i]);
      for (size_t i = 0; i < bh.size(); ++i) bh[i] = ops::f32_to_bf16_bits(b.data[i]);
      std::vector<float> whole(m * n), parts(m * n);
      gemm_bf16_b_rows(m, n, k, ah.data(), k, 1, bh.data(), n, whole.data(), n, false);
      for (int64_t i0 = 0; i0 < m; i0 += 32) {
        gemm_bf16_b_rows(std::min<int64_t>(32, m - i0), n, k, ah.data() + i0 * k, k, 1, bh.data(),
                         n, parts.data() + i0 * n, n, false);
      }
      EXPECT_EQ(whole, parts);
    });
  }
  set_bf16_dot_for_testing(-1);
}

// bf16 around the AMX tile edges (16 rows, 32 K values, 32 x 32 blocks, 512-value K blocks of
// the packed-B path): every B layout's path (row-major: VNNI packing of row pairs; transposed:
// W^T read in place, or copied for a K tail; padded and broadcast: the generic packers). On a
// CPU without AMX these run the f32-panel path and must pass the same way.
TEST(Gemm, Bf16TileEdges) {
  std::mt19937 rng(17);
  for (Layout lb :
       {Layout::kRowMajor, Layout::kTransposed, Layout::kPadded, Layout::kBroadcastCols}) {
    for (int64_t m : {1, 15, 16, 17, 33, 70})
      for (int64_t n : {1, 16, 31, 33, 64})
        for (int64_t k : {1, 2, 31, 32, 33, 96}) {
          run_half(DType::kBF16, m, n, k, Layout::kRowMajor, lb, false, rng);
        }
    run_half(DType::kBF16, 40, 50, 1100, Layout::kRowMajor, lb, false, rng);  // 3 K blocks
    run_half(DType::kBF16, 33, 17, 600, Layout::kPadded, lb, true, rng);
    run_half(DType::kBF16, 100, 70, 1024, Layout::kTransposed, lb, true, rng);
  }
}

// The VM computes one product in tiles that depend on the thread count: any split of the rows
// or columns of a bf16 product gives the bits of the whole (each element sums its K products in
// one order, whatever the path or the blocks).
TEST(Gemm, Bf16SplitsAreBitwiseTheWhole) {
  std::mt19937 rng(18);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t m = 75, n = 90, k = 1100;
  std::vector<uint16_t> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  for (uint16_t& x : a) x = ops::f32_to_bf16_bits(dist(rng));
  for (uint16_t& x : b) x = ops::f32_to_bf16_bits(dist(rng));
  for (bool transposed : {false, true}) {
    const int64_t b_rs = transposed ? 1 : n, b_cs = transposed ? k : 1;
    std::vector<float> whole(static_cast<size_t>(m * n)), parts(whole.size(), -1.0f);
    gemm_half(DType::kBF16, m, n, k, a.data(), k, 1, b.data(), b_rs, b_cs, whole.data(), n, false);
    for (int64_t i0 : {int64_t{0}, int64_t{37}}) {
      const int64_t rows = i0 == 0 ? 37 : m - 37;
      for (int64_t j0 : {int64_t{0}, int64_t{20}, int64_t{52}}) {
        const int64_t cols = j0 == 0 ? 20 : (j0 == 20 ? 32 : n - 52);
        gemm_half(DType::kBF16, rows, cols, k, a.data() + i0 * k, k, 1, b.data() + j0 * b_cs, b_rs,
                  b_cs, parts.data() + i0 * n + j0, n, false);
      }
    }
    EXPECT_EQ(std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)), 0)
        << (transposed ? "B^T" : "B") << (gemm_half_on_amx(DType::kBF16) ? " on AMX" : "");
  }
}

// B packed ahead of time (pack_b: the VM's cached constant weights) gives every bit of the
// per-call packing, for every B layout, tails of K and of the last panel, and tiles that start
// at a later panel (as the VM's column tiles do).
TEST(Gemm, PrePackedBIsBitwisePerCallPacking) {
  for_each_target([&] {
    std::mt19937 rng(8);
    const int64_t nr = gemm_micro_tile().n;
    for (Layout lb : {Layout::kRowMajor, Layout::kTransposed, Layout::kPadded})
      for (int64_t m : {5, 14, 23, 40})
        for (int64_t n : {std::max<int64_t>(nr - 3, 1), 2 * nr + 5})
          for (int64_t k : {1, 17, 300}) {
            const Operand a = make_operand(m, k, Layout::kRowMajor, rng);
            const Operand b = make_operand(k, n, lb, rng);
            const size_t floats = packed_b_floats(k, n);
            float* packed =
                static_cast<float*>(::operator new (floats * sizeof(float), std::align_val_t{64}));
            pack_b(DType::kF32, k, n, b.data.data(), b.rs, b.cs, packed);
            for (int64_t j0 : {int64_t{0}, n > nr ? nr : int64_t{0}}) {
              const int64_t cols = n - j0;
              std::vector<float> want(static_cast<size_t>(m * cols)), got(want.size());
              const float* bj = b.data.data() + j0 * b.cs;
              gemm_f32(m, cols, k, a.data.data(), a.rs, a.cs, bj, b.rs, b.cs, want.data(), cols,
                       false);
              gemm_f32_packed(m, cols, k, a.data.data(), a.rs, a.cs, bj, b.rs, b.cs,
                              PackedB{packed + j0 * k, k}, got.data(), cols, false);
              EXPECT_EQ(want, got)
                  << "m=" << m << " n=" << n << " k=" << k << " j0=" << j0 << " B=" << name(lb);
            }
            ::operator delete (packed, std::align_val_t{64});
          }
  });
}

// Products of up to four rows with a row-major B (decode through GPT-2's Conv1D, probabilities
// @ V) stream B's rows in place (GemvB): against the reference, with A row-major, transposed or
// padded, column tails around a vector, K around the unrolled steps and GemmImpl's K blocks,
// accumulate; and bitwise equal to the panel kernels (gemm_*_packed), whose order of sums the
// path keeps, for f32, bf16 and f16. On a CPU with AMX, bf16 products never take either path
// (gemm_half runs them on AMX tiles, and the interpreter packs no bf16 B there): bf16 is
// checked against the reference only.
TEST(Gemm, FewRowsRowMajorBIsBitwiseThePanelKernels) {
  for_each_target([&] {
    std::mt19937 rng(11);
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
      for (Layout la : {Layout::kRowMajor, Layout::kTransposed, Layout::kPadded})
        for (int64_t m = 1; m <= 4; ++m)
          for (int64_t n : {1, 15, 17, 100})
            for (int64_t k : {1, 3, 5, 256, 259, 600}) {
              const bool acc = (m + k) % 2 == 0;
              if (t == DType::kF32) {
                run_f32(m, n, k, la, Layout::kRowMajor, acc, rng);
              } else {
                run_half(t, m, n, k, la, Layout::kRowMajor, acc, rng);
              }
              if (gemm_half_on_amx(t)) continue;
              Operand a = make_operand(m, k, la, rng);
              const Operand b = make_operand(k, n, Layout::kRowMajor, rng);
              std::vector<uint16_t> ah(a.data.size()), bh(b.data.size());
              for (size_t i = 0; i < ah.size(); ++i)
                ah[i] = t == DType::kF16 ? ops::f32_to_f16_bits(a.data[i])
                                         : ops::f32_to_bf16_bits(a.data[i]);
              for (size_t i = 0; i < bh.size(); ++i)
                bh[i] = t == DType::kF16 ? ops::f32_to_f16_bits(b.data[i])
                                         : ops::f32_to_bf16_bits(b.data[i]);
              const void* bsrc = t == DType::kF32 ? static_cast<const void*>(b.data.data())
                                                  : static_cast<const void*>(bh.data());
              const size_t floats = packed_b_floats(k, n);
              float* packed = static_cast<float*>(
                  ::operator new (floats * sizeof(float), std::align_val_t{64}));
              pack_b(t, k, n, bsrc, b.rs, b.cs, packed);
              std::vector<float> want(static_cast<size_t>(m * n), 0.25f), got = want;
              if (t == DType::kF32) {
                gemm_f32(m, n, k, a.data.data(), a.rs, a.cs, b.data.data(), b.rs, b.cs, got.data(),
                         n, acc);
                gemm_f32_packed(m, n, k, a.data.data(), a.rs, a.cs, b.data.data(), b.rs, b.cs,
                                PackedB{packed, k}, want.data(), n, acc);
              } else {
                gemm_half(t, m, n, k, ah.data(), a.rs, a.cs, bh.data(), b.rs, b.cs, got.data(), n,
                          acc);
                gemm_half_packed(t, m, n, k, ah.data(), a.rs, a.cs, PackedB{packed, k}, want.data(),
                                 n, acc);
              }
              ::operator delete (packed, std::align_val_t{64});
              EXPECT_EQ(want, got) << "dtype=" << static_cast<int>(t) << " m=" << m << " n=" << n
                                   << " k=" << k << " A=" << name(la);
            }
  });
}

// Special values in packed positions: an Inf in A poisons exactly its row, a NaN in B its column.
TEST(Gemm, SpecialValues) {
  for_each_target([&] {
    const int64_t m = 20, n = 40, k = 30;
    std::vector<float> a(static_cast<size_t>(m * k), 1.0f), b(static_cast<size_t>(k * n), 1.0f);
    a[static_cast<size_t>(3 * k + 5)] = INFINITY;
    b[static_cast<size_t>(7 * n + 33)] = NAN;
    std::vector<float> c(static_cast<size_t>(m * n));
    gemm_f32(m, n, k, a.data(), k, 1, b.data(), n, 1, c.data(), n, false);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const float x = c[static_cast<size_t>(i * n + j)];
        if (j == 33) {
          EXPECT_TRUE(std::isnan(x)) << i << "," << j;
        } else if (i == 3) {
          EXPECT_EQ(x, INFINITY) << i << "," << j;
        } else {
          EXPECT_EQ(x, static_cast<float>(k)) << i << "," << j;
        }
      }
    }
  });
}

}  // namespace
}  // namespace dvm::vm::cpu
