// Reference model graphs built with the public GraphBuilder: used by the demo, the benchmarks
// and the tests, and a starting point for users (inference, random weights are inputs).
#pragma once

#include "dvm/graph.h"

namespace dvm::models {

struct TransformerConfig {
  int64_t hidden = 768;
  int64_t heads = 12;
  int64_t ffn = 3072;
  double eps = 1e-12;
  bool causal = false;    // decoder-style causal self-attention (no mask input)
  bool pre_norm = false;  // GPT-style pre-layernorm; BERT is post-norm
};

// One transformer layer over x [B, S, hidden] with symbols B and S.
// Inputs, in order: x, [mask [B, 1, 1, S] additive f32 when !causal], w_qkv [3h, h], b_qkv,
// w_o [h, h], b_o, ln1_w, ln1_b, w_1 [ffn, h], b_1, w_2 [h, ffn], b_2, ln2_w, ln2_b.
StatusOr<Graph> transformer_layer(const TransformerConfig& config, const std::string& name);

// Shapes of transformer_layer's inputs for a batch and sequence length.
std::vector<std::vector<int64_t>> transformer_layer_input_shapes(const TransformerConfig& config,
                                                                 int64_t batch, int64_t seq);

}  // namespace dvm::models
