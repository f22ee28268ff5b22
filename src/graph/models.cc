// Reference model graphs (see include/dvm/models.h).
#include "dvm/models.h"

namespace dvm::models {

StatusOr<Graph> transformer_layer(const TransformerConfig& c, const std::string& name) {
  GraphBuilder gb(name);
  SymExpr B = gb.symbol("B", {1, 4096}), S = gb.symbol("S", {1, 1 << 20});
  int64_t h = c.hidden, d = c.hidden / c.heads;
  Tensor x = gb.input("x", DType::kF32, {B, S, h});
  Tensor mask = c.causal ? Tensor{} : gb.input("mask", DType::kF32, {B, 1, 1, S});
  Tensor w_qkv = gb.input("w_qkv", DType::kF32, {3 * h, h});
  Tensor b_qkv = gb.input("b_qkv", DType::kF32, {3 * h});
  Tensor w_o = gb.input("w_o", DType::kF32, {h, h});
  Tensor b_o = gb.input("b_o", DType::kF32, {h});
  Tensor ln1_w = gb.input("ln1_w", DType::kF32, {h});
  Tensor ln1_b = gb.input("ln1_b", DType::kF32, {h});
  Tensor w_1 = gb.input("w_1", DType::kF32, {c.ffn, h});
  Tensor b_1 = gb.input("b_1", DType::kF32, {c.ffn});
  Tensor w_2 = gb.input("w_2", DType::kF32, {h, c.ffn});
  Tensor b_2 = gb.input("b_2", DType::kF32, {h});
  Tensor ln2_w = gb.input("ln2_w", DType::kF32, {h});
  Tensor ln2_b = gb.input("ln2_b", DType::kF32, {h});

  Tensor a_in = c.pre_norm ? gb.layer_norm(x, ln1_w, ln1_b, c.eps) : x;
  Tensor qkv = gb.linear(a_in, w_qkv, b_qkv);
  std::vector<Tensor> parts = gb.split(qkv, {h, h, h}, -1);
  auto heads = [&](Tensor t) {
    return gb.permute(gb.reshape(t, {B, S, c.heads, d}), {0, 2, 1, 3});  // [B, H, S, d]
  };
  Tensor ctx = gb.attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), mask, c.causal);
  ctx = gb.reshape(gb.permute(ctx, {0, 2, 1, 3}), {B, S, h});
  Tensor attn = gb.linear(ctx, w_o, b_o);
  Tensor x1, out;
  if (c.pre_norm) {
    x1 = gb.add(x, attn);
    Tensor f =
        gb.linear(gb.gelu(gb.linear(gb.layer_norm(x1, ln2_w, ln2_b, c.eps), w_1, b_1)), w_2, b_2);
    out = gb.add(x1, f);
  } else {
    x1 = gb.layer_norm(gb.add(x, attn), ln1_w, ln1_b, c.eps);
    Tensor f = gb.linear(gb.gelu(gb.linear(x1, w_1, b_1)), w_2, b_2);
    out = gb.layer_norm(gb.add(x1, f), ln2_w, ln2_b, c.eps);
  }
  gb.output("y", out);
  return gb.build();
}

std::vector<std::vector<int64_t>> transformer_layer_input_shapes(const TransformerConfig& c,
                                                                 int64_t batch, int64_t seq) {
  int64_t h = c.hidden;
  std::vector<std::vector<int64_t>> s = {{batch, seq, h}};
  if (!c.causal) s.push_back({batch, 1, 1, seq});
  std::vector<std::vector<int64_t>> rest = {{3 * h, h}, {3 * h}, {h, h},     {h}, {h}, {h},
                                            {c.ffn, h}, {c.ffn}, {h, c.ffn}, {h}, {h}, {h}};
  s.insert(s.end(), rest.begin(), rest.end());
  return s;
}

}  // namespace dvm::models
