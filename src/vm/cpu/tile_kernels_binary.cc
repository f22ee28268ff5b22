// Tile kernels (see tile_kernels.h), compiled once per Highway target: multiply-add forms
// (fma, mul feeding fma, rotary's paired halves), comparisons and select.
#include "vm/cpu/kernel_targets.h"  // first: before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vm/cpu/tile_kernels_binary.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include "vm/cpu/tile_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {

// Four sources over a 3-D block (Rows: a, b by rows.a/oa, rows.b/ob; the third by rows.c/oc,
// the fourth by rows.e/oe): per row, row(dr, ar, br, cr, er) handles the columns it can (a
// fast loop for the common increments) and returns how many; the rest pick each source per
// vector (contiguous or broadcast) and go through f.
template <class F, class Row>
HWY_INLINE void Map4Rows(DF d, const Rows& rs, float* dst, const float* a, int ainc, const float* b,
                         int binc, const float* c, int cinc, const float* e, int einc, int64_t n,
                         F f, Row row) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t k = 0; k < rs.outer; ++k) {
    for (int64_t r = 0; r < rs.rows; ++r) {
      float* dr = dst + k * rs.od + r * rs.d;
      const float* ar = a + k * rs.oa + r * rs.a;
      const float* br = b + k * rs.ob + r * rs.b;
      const float* cr = c + k * rs.oc + r * rs.c;
      const float* er = e + k * rs.oe + r * rs.e;
      for (int64_t i = row(dr, ar, br, cr, er); i < n; i += N) {
        const int64_t m = std::min(N, n - i);
        const auto ld = [&](const float* s, int inc) {
          return inc ? LoadTail(d, s + i, m) : hn::Set(d, s[0]);
        };
        StoreTail(f(ld(ar, ainc), ld(br, binc), ld(cr, cinc), ld(er, einc)), d, dr + i, m);
      }
    }
  }
}

// The rows of a 2-D slice of MulAddRows with b and q the same for every row (rotary
// embedding's cos and sin, broadcast over the heads) and kV full vectors a row: b and q are
// loaded once per slice and stay in registers, so a row costs the loads of a and p only.
template <int kV, class F>
HWY_INLINE void MulAddRowsShared(DF d, const Rows& rs, float* dst, const float* a, const float* b,
                                 const float* p, const float* q, F f) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF bv[kV], qv[kV];
  for (int v = 0; v < kV; ++v) {
    bv[v] = hn::LoadU(d, b + v * N);
    qv[v] = hn::LoadU(d, q + v * N);
  }
  // Pointers stepped, not recomputed: fewer live registers (a spilled row counter cost a
  // store-to-load round trip per row).
  const int64_t sd = rs.d, sa = rs.a, sp = rs.c;
  for (int64_t r = rs.rows; r > 0; --r, dst += sd, a += sa, p += sp) {
    for (int v = 0; v < kV; ++v)
      hn::StoreU(f(hn::LoadU(d, a + v * N), bv[v], hn::LoadU(d, p + v * N), qv[v]), d, dst + v * N);
  }
}

// dst = p * q + (+-a) * b over a 3-D block; the all-contiguous case (rotary embedding,
// complex products) gets its own loop, other increments pick each source per vector.
template <bool kNeg>
HWY_INLINE void MulAddRows(const Rows& rs, float* dst, const float* a, int ainc, const float* b,
                           int binc, const float* p, int pinc, const float* q, int qinc,
                           int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto f = [](VF x, VF y, VF z, VF w)
                     DVM_INL { return hn::MulAdd(z, w, hn::Mul(kNeg ? hn::Neg(x) : x, y)); };
  const bool contiguous = ainc && binc && pinc && qinc;
  if (contiguous && rs.b == 0 && rs.e == 0 && n % N == 0 && n <= 4 * N) {
    for (int64_t k = 0; k < rs.outer; ++k) {
      float* dk = dst + k * rs.od;
      const float *ak = a + k * rs.oa, *bk = b + k * rs.ob, *pk = p + k * rs.oc,
                  *qk = q + k * rs.oe;
      switch (n / N) {
        case 1:
          MulAddRowsShared<1>(d, rs, dk, ak, bk, pk, qk, f);
          break;
        case 2:
          MulAddRowsShared<2>(d, rs, dk, ak, bk, pk, qk, f);
          break;
        case 3:
          MulAddRowsShared<3>(d, rs, dk, ak, bk, pk, qk, f);
          break;
        default:
          MulAddRowsShared<4>(d, rs, dk, ak, bk, pk, qk, f);
          break;
      }
    }
    return;
  }
  Map4Rows(d, rs, dst, a, ainc, b, binc, p, pinc, q, qinc, n, f,
           [&](float* dr, const float* ar, const float* br, const float* pr, const float* qr) {
             int64_t i = 0;
             for (; contiguous && i + N <= n; i += N) {
               hn::StoreU(f(hn::LoadU(d, ar + i), hn::LoadU(d, br + i), hn::LoadU(d, pr + i),
                            hn::LoadU(d, qr + i)),
                          d, dr + i);
             }
             return i;
           });
}

// dst = (a * b) * c + e over a 3-D block: a product feeding an fma's factor (layernorm's
// (x - mean) * rstd, then * weight + bias) in one pass, the product never stored. The same
// bits as the mul and the fma apart. a, c, e contiguous and b contiguous or one value per row
// (the common case) get their own loop; other increments pick each source per vector.
template <bool kB>
HWY_INLINE void MulFmaRow(DF d, float* dr, const float* ar, const float* br, const float* cr,
                          const float* er, int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vb = hn::Set(d, br[0]);
  const auto lb = [&](int64_t i) DVM_INL { return kB ? hn::LoadU(d, br + i) : vb; };
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const VF r0 = hn::MulAdd(hn::Mul(hn::LoadU(d, ar + i), lb(i)), hn::LoadU(d, cr + i),
                             hn::LoadU(d, er + i));
    const VF r1 = hn::MulAdd(hn::Mul(hn::LoadU(d, ar + i + N), lb(i + N)), hn::LoadU(d, cr + i + N),
                             hn::LoadU(d, er + i + N));
    hn::StoreU(r0, d, dr + i);
    hn::StoreU(r1, d, dr + i + N);
  }
  for (; i < n; i += N) {
    const int64_t m = std::min(N, n - i);
    const VF x = LoadTail(d, ar + i, m);
    const VF y = kB ? LoadTail(d, br + i, m) : vb;
    StoreTail(hn::MulAdd(hn::Mul(x, y), LoadTail(d, cr + i, m), LoadTail(d, er + i, m)), d, dr + i,
              m);
  }
}

void FusedMulFmaF32(const Rows& rs, float* dst, const float* a, int ainc, const float* b, int binc,
                    const float* c, int cinc, const float* e, int einc, int64_t n) {
  if (n <= 0) return;
  const DF d;
  const bool fast = ainc == 1 && cinc == 1 && einc == 1 && (binc == 0 || binc == 1);
  Map4Rows(
      d, rs, dst, a, ainc, b, binc, c, cinc, e, einc, n,
      [](VF x, VF y, VF z, VF w) DVM_INL { return hn::MulAdd(hn::Mul(x, y), z, w); },
      [&](float* dr, const float* ar, const float* br, const float* cr, const float* er) {
        if (!fast) return int64_t{0};
        if (binc) {
          MulFmaRow<true>(d, dr, ar, br, cr, er, n);
        } else {
          MulFmaRow<false>(d, dr, ar, br, cr, er, n);
        }
        return n;
      });
}

void FusedMulAddF32(bool negate, const Rows& rs, float* dst, const float* a, int ainc,
                    const float* b, int binc, const float* p, int pinc, const float* q, int qinc,
                    int64_t n) {
  if (n <= 0) return;
  if (negate) return MulAddRows<true>(rs, dst, a, ainc, b, binc, p, pinc, q, qinc, n);
  MulAddRows<false>(rs, dst, a, ainc, b, binc, p, pinc, q, qinc, n);
}

// Two MulAddRowsShared bodies row by row: x's row, then y's, their shared rows of b and q
// in registers (4 * kV of them).
template <int kV, class FX, class FY>
HWY_INLINE void MulAddPairShared(DF d, const MulAddArgs& x, const MulAddArgs& y, int64_t k, FX fx,
                                 FY fy) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const Rows &rx = x.rows, &ry = y.rows;
  VF xb[kV], xq[kV], yb[kV], yq[kV];
  for (int v = 0; v < kV; ++v) {
    xb[v] = hn::LoadU(d, x.b + k * rx.ob + v * N);
    xq[v] = hn::LoadU(d, x.q + k * rx.oe + v * N);
    yb[v] = hn::LoadU(d, y.b + k * ry.ob + v * N);
    yq[v] = hn::LoadU(d, y.q + k * ry.oe + v * N);
  }
  float *xd = x.dst + k * rx.od, *yd = y.dst + k * ry.od;
  const float *xa = x.a + k * rx.oa, *xp = x.p + k * rx.oc;
  const float *ya = y.a + k * ry.oa, *yp = y.p + k * ry.oc;
  // Strides in locals: the stores through float pointers could alias the argument structs,
  // which would reload every stride on every row.
  const int64_t xsd = rx.d, xsa = rx.a, xsc = rx.c, ysd = ry.d, ysa = ry.a, ysc = ry.c;
  const auto rows = [&](auto nt_on) DVM_INL {
    for (int64_t r = rx.rows; r > 0; --r) {
      const bool ntx = nt_on && StreamRow(d, true, xd), nty = nt_on && StreamRow(d, true, yd);
      for (int v = 0; v < kV; ++v)
        StoreMaybeNt(fx(hn::LoadU(d, xa + v * N), xb[v], hn::LoadU(d, xp + v * N), xq[v]), d,
                     xd + v * N, ntx);
      for (int v = 0; v < kV; ++v)
        StoreMaybeNt(fy(hn::LoadU(d, ya + v * N), yb[v], hn::LoadU(d, yp + v * N), yq[v]), d,
                     yd + v * N, nty);
      xd += xsd, xa += xsa, xp += xsc;
      yd += ysd, ya += ysa, yp += ysc;
    }
  };
  if (g_stream_stores) {
    rows(std::true_type{});
  } else {
    rows(std::false_type{});
  }
}

template <bool kNegX, bool kNegY>
HWY_INLINE void MulAddPair(const MulAddArgs& x, const MulAddArgs& y, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto fx = [](VF a, VF b, VF p, VF q)
                      DVM_INL { return hn::MulAdd(p, q, hn::Mul(kNegX ? hn::Neg(a) : a, b)); };
  const auto fy = [](VF a, VF b, VF p, VF q)
                      DVM_INL { return hn::MulAdd(p, q, hn::Mul(kNegY ? hn::Neg(a) : a, b)); };
  for (int64_t k = 0; k < x.rows.outer; ++k) {
    switch (n / N) {
      case 1:
        MulAddPairShared<1>(d, x, y, k, fx, fy);
        break;
      case 2:
        MulAddPairShared<2>(d, x, y, k, fx, fy);
        break;
      case 3:
        MulAddPairShared<3>(d, x, y, k, fx, fy);
        break;
      default:
        MulAddPairShared<4>(d, x, y, k, fx, fy);
        break;
    }
  }
}

// Rows of one block (outer index k) of a MulAddArgs, as a one-block call.
MulAddArgs BlockOf(const MulAddArgs& m, int64_t k) {
  MulAddArgs one = m;
  one.rows.outer = 1;
  one.dst += k * m.rows.od;
  one.a += k * m.rows.oa;
  one.b += k * m.rows.ob;
  one.p += k * m.rows.oc;
  one.q += k * m.rows.oe;
  return one;
}

void FusedMulAddPairF32(const MulAddArgs& x, const MulAddArgs& y, int64_t n) {
  if (n <= 0) return;
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const auto shared = [n, N](const MulAddArgs& m) {
    return m.ainc && m.binc && m.pinc && m.qinc && m.rows.b == 0 && m.rows.e == 0 && n % N == 0 &&
           n <= 4 * N;
  };
  if (!shared(x) || !shared(y)) {  // block by block, x's block then y's
    for (int64_t k = 0; k < x.rows.outer; ++k) {
      const MulAddArgs xk = BlockOf(x, k), yk = BlockOf(y, k);
      FusedMulAddF32(xk.negate, xk.rows, xk.dst, xk.a, xk.ainc, xk.b, xk.binc, xk.p, xk.pinc, xk.q,
                     xk.qinc, n);
      FusedMulAddF32(yk.negate, yk.rows, yk.dst, yk.a, yk.ainc, yk.b, yk.binc, yk.p, yk.pinc, yk.q,
                     yk.qinc, n);
    }
    return;
  }
  if (x.negate) {
    return y.negate ? MulAddPair<true, true>(x, y, n) : MulAddPair<true, false>(x, y, n);
  }
  return y.negate ? MulAddPair<false, true>(x, y, n) : MulAddPair<false, false>(x, y, n);
}

// Float != is unordered (NaN != x is true), so it is computed as !(x == y).
void CompareF32(BinaryOp op, int32_t* dst, const float* a, int ainc, const float* b, int binc,
                int64_t n) {
  const DF d;
  const DI di;
  const VI one = hn::Set(di, 1);
  const auto run = [&](auto f) { Map2Rows(di, d, Rows{}, dst, a, ainc, b, binc, n, f); };
  const auto nonzero = [d, one](VF x) {
    return hn::Xor(MaskToI32(d, hn::Eq(x, hn::Zero(d))), one);
  };
  switch (op) {
    case BinaryOp::kEq:
      return run([d](VF x, VF y) { return MaskToI32(d, hn::Eq(x, y)); });
    case BinaryOp::kNe:
      return run([d, one](VF x, VF y) { return hn::Xor(MaskToI32(d, hn::Eq(x, y)), one); });
    case BinaryOp::kLt:
      return run([d](VF x, VF y) { return MaskToI32(d, hn::Lt(x, y)); });
    case BinaryOp::kLe:
      return run([d](VF x, VF y) { return MaskToI32(d, hn::Le(x, y)); });
    case BinaryOp::kGt:
      return run([d](VF x, VF y) { return MaskToI32(d, hn::Gt(x, y)); });
    case BinaryOp::kGe:
      return run([d](VF x, VF y) { return MaskToI32(d, hn::Ge(x, y)); });
    case BinaryOp::kLogicalAnd:
      return run([nonzero](VF x, VF y) { return hn::And(nonzero(x), nonzero(y)); });
    case BinaryOp::kLogicalOr:
      return run([nonzero](VF x, VF y) { return hn::Or(nonzero(x), nonzero(y)); });
    default:
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = ops::compare_f32(op, a[ainc ? i : 0], b[binc ? i : 0]);
      }
  }
}

void Select32(uint32_t* dst, const int32_t* cond, int cinc, const uint32_t* a, int ainc,
              const uint32_t* b, int binc, int64_t n) {
  const DU du;
  using VU = hn::Vec<DU>;
  // The condition is reinterpreted as u32: non-zero iff the i32 is non-zero.
  const uint32_t* c = reinterpret_cast<const uint32_t*>(cond);
  Map3Rows(du, Rows{}, dst, c, cinc, a, ainc, b, binc, n,
           [du](VU vc, VU va, VU vb) { return hn::IfThenElse(hn::Ne(vc, hn::Zero(du)), va, vb); });
}

void FmaF32(const Rows& rs, float* dst, const float* a, int ainc, const float* b, int binc,
            const float* c, int cinc, int64_t n) {
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
  // No fused multiply-add instruction: keep the single rounding of the spec.
  if (SplitOuter(rs, [&](const Rows& one, int64_t od, int64_t oa, int64_t ob, int64_t oc) {
        FmaF32(one, dst + od, a + oa, ainc, b + ob, binc, c + oc, cinc, n);
      }))
    return;
  for (int64_t r = 0; r < rs.rows; ++r) {
    float* dr = dst + r * rs.d;
    const float *ar = a + r * rs.a, *br = b + r * rs.b, *cr = c + r * rs.c;
    for (int64_t i = 0; i < n; ++i) {
      dr[i] = std::fma(ar[ainc ? i : 0], br[binc ? i : 0], cr[cinc ? i : 0]);
    }
  }
#else
  const DF d;
  Map3Rows(d, rs, dst, a, ainc, b, binc, c, cinc, n,
           [](VF x, VF y, VF z) { return hn::MulAdd(x, y, z); });
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();
