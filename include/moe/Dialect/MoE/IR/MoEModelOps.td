//===- MoEModelOps.td - transformer ops around the MoE block -*- tablegen -*-===//
//
// The layers of an MoE language model besides the experts (embedding,
// RMSNorm, rotary position embedding, attention, the loss) and the gradient
// ops that -moe-autodiff emits for them and for the router and the combine.
// Matmuls and elementwise arithmetic stay upstream ops (linalg, arith).
//
//===----------------------------------------------------------------------===//
#ifndef MOE_MODEL_OPS_TD
#define MOE_MODEL_OPS_TD

def MoE_NonNegativeFloat : AttrConstraint<
    CPred<"::llvm::cast<::mlir::FloatAttr>($_self).getValueAsDouble() >= 0.0">,
    "whose value is not negative">;

//===----------------------------------------------------------------------===//
// Embedding
//===----------------------------------------------------------------------===//

def MoE_EmbeddingOp : MoE_Op<"embedding", [Pure]> {
  let summary = "looks up one row of a table per token id";
  let description = [{
    `result[..., h] = table[ids[...], h]` for a table `[V, H]` and ids of any
    shape; the result has the ids' shape followed by `H`. An id outside
    `[0, V)` gives a zero row.

    Example:

    ```mlir
    %h = moe.embedding %table, %ids
        : tensor<32x64xf32>, tensor<4x16xi32> -> tensor<4x16x64xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$table, MoE_IntTensor:$ids);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $table `,` $ids attr-dict `:` type($table) `,` type($ids) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_EmbeddingGradOp : MoE_Op<"embedding_grad", [Pure]> {
  let summary = "gradient of moe.embedding with respect to the table";
  let description = [{
    `result[v, h] = sum of grad[..., h] over the positions whose id is v`,
    summed in f32 in position order; rows of ids that never occur are zero,
    and ids outside `[0, V)` contribute nothing. `grad` has the ids' shape
    followed by `H`; the result `[V, H]` is the table's shape.

    Example:

    ```mlir
    %dtable = moe.embedding_grad %ids, %dh
        : tensor<4x16xi32>, tensor<4x16x64xf32> -> tensor<32x64xf32>
    ```
  }];
  let arguments = (ins MoE_IntTensor:$ids, MoE_FloatTensor:$grad);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $ids `,` $grad attr-dict `:` type($ids) `,` type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// RMSNorm
//===----------------------------------------------------------------------===//

def MoE_RMSNormOp : MoE_Op<"rms_norm", [Pure]> {
  let summary = "RMSNorm over the last dimension, with a learned scale";
  let description = [{
    For every row `x` (the last dimension, size `H`) of `input`:
    `y = x * rsqrt(mean(x^2) + eps) * weight`, with `weight` `[H]`.
    Computed in f32 (the mean summed in order), rounded once to the result
    type. Qwen3 applies it to the hidden states (`H` = hidden size) and to
    every attention head (`H` = head dim).

    Example:

    ```mlir
    %y = moe.rms_norm %x, %w eps(1.0e-6)
        : tensor<64x128xf32>, tensor<128xf32> -> tensor<64x128xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$input, MoE_FloatTensor:$weight,
                       ConfinedAttr<F64Attr, [MoE_NonNegativeFloat]>:$eps);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight `eps` `(` $eps `)` attr-dict `:` type($input) `,`
    type($weight) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_RMSNormGradOp : MoE_Op<"rms_norm_grad", [Pure]> {
  let summary = "gradients of moe.rms_norm with respect to input and weight";
  let description = [{
    Given the forward input `x`, the weight and the gradient `grad` of the
    result, with `r = rsqrt(mean(x^2) + eps)` per row:
    `d_input = r * grad * weight - x * r^3 * sum(grad * weight * x) / H` and
    `d_weight[h] = sum over all rows of grad[.., h] * x[.., h] * r`, in f32.

    Example:

    ```mlir
    %dx, %dw = moe.rms_norm_grad %x, %w, %dy eps(1.0e-6)
        : tensor<64x128xf32>, tensor<128xf32>, tensor<64x128xf32>
        -> tensor<64x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$input, MoE_FloatTensor:$weight,
                       MoE_FloatTensor:$grad,
                       ConfinedAttr<F64Attr, [MoE_NonNegativeFloat]>:$eps);
  let results = (outs MoE_FloatTensor:$input_grad,
                      MoE_FloatTensor:$weight_grad);
  let assemblyFormat = [{
    $input `,` $weight `,` $grad `eps` `(` $eps `)` attr-dict `:`
    type($input) `,` type($weight) `,` type($grad) `->` type($input_grad) `,`
    type($weight_grad)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Rotary position embedding and attention
//===----------------------------------------------------------------------===//

def MoE_RotaryOp : MoE_Op<"rotary", [Pure]> {
  let summary = "rotary position embedding of queries or keys";
  let description = [{
    `input` `[B, S, N, D]` (batch, sequence position, head, head dim; `D`
    even). Position `s` rotates the pair `(x[i], x[i + D/2])` (the
    "rotate half" layout of Llama and Qwen) by the angle `s * f_i`,
    `f_i = 1 / theta^(2i / D)`:
    `y[i] = x[i] cos - x[i + D/2] sin`, `y[i + D/2] = x[i + D/2] cos + x[i] sin`,
    in f32. With `inverse` the rotation goes the other way (the angle is
    negated): it undoes the forward rotation and is its gradient.

    Example:

    ```mlir
    %qr = moe.rotary %q theta(1.0e6) : tensor<2x16x4x64xf32> -> tensor<2x16x4x64xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$input,
                       ConfinedAttr<F64Attr, [MoE_PositiveFloat]>:$theta,
                       UnitAttr:$inverse);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $input `theta` `(` $theta `)` (`inverse` $inverse^)? attr-dict `:`
    type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_AttentionOp : MoE_Op<"attention", [Pure]> {
  let summary = "scaled dot-product attention with grouped key/value heads";
  let description = [{
    `query` `[B, S, N, D]`, `key` and `value` `[B, S, M, D]` with `N` a
    multiple of `M`: query head `n` attends with key/value head
    `n / (N / M)` (grouped-query attention). For every batch `b`, head `n`
    and position `i`:
    `p[j] = softmax_j(scale * <query[b, i, n], key[b, j, n / G]>)` over
    `j <= i` (with `causal`) or all `j`, and
    `result[b, i, n] = sum_j p[j] * value[b, j, n / G]`.
    `scale` defaults to `1 / sqrt(D)`. All arithmetic in f32. The inputs may
    be bf16 (the training recipes round them so) with an f32 result; the
    GPU's flash kernels then also round `p` to bf16 before its product with
    the values, as FlashAttention does (results within bf16 precision of
    this definition).

    `documents` `[B, S]` (i32 or i64), if given, masks attention at
    document boundaries in packed rows: position `i` attends to key `j`
    only when `documents[b, i] == documents[b, j]` (besides `causal`), so
    each sequence packed into a row sees only itself. Every query sees at
    least its own key, so no row is empty.

    Example:

    ```mlir
    %o = moe.attention %q, %k, %v causal
        : tensor<2x16x8x64xf32>, tensor<2x16x2x64xf32>, tensor<2x16x2x64xf32>
        -> tensor<2x16x8x64xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$query, MoE_FloatTensor:$key,
                       MoE_FloatTensor:$value,
                       Optional<MoE_IntTensor>:$documents, UnitAttr:$causal,
                       OptionalAttr<ConfinedAttr<F64Attr, [MoE_PositiveFloat]>>:$scale);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`causal` $causal^)?
    (`documents` `(` $documents^ `:` type($documents) `)`)?
    (`scale` `(` $scale^ `)`)? attr-dict `:` type($query) `,` type($key) `,`
    type($value) `->` type($result)
  }];
  let extraClassDeclaration = [{
    /// The softmax scale: the attribute, or 1/sqrt(head dim).
    double getScaleOrDefault();
  }];
  let hasVerifier = 1;
}

def MoE_AttentionGradOp : MoE_Op<"attention_grad", [Pure]> {
  let summary = "gradients of moe.attention with respect to query, key and value";
  let description = [{
    Recomputes the attention probabilities `p` from `query` and `key` (no
    saved `[S, S]` matrices) and, given the gradient `grad` of the result,
    returns `d_query`, `d_key`, `d_value` (shapes of the operands; the key
    and value gradients sum over the query heads of each group):
    `d_value = p^T grad`, `dp = grad value^T`,
    `ds = p * (dp - rowsum(dp * p)) * scale`, `d_query = ds key`,
    `d_key = ds^T query`. All arithmetic in f32. With bf16 inputs the GPU's
    flash kernels round `p` and `ds` to bf16 before their products (as the
    forward does `p`). `documents` masks as it does for `moe.attention`.

    Example:

    ```mlir
    %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal
        : tensor<2x16x8x64xf32>, tensor<2x16x2x64xf32>, tensor<2x16x2x64xf32>,
          tensor<2x16x8x64xf32>
        -> tensor<2x16x8x64xf32>, tensor<2x16x2x64xf32>, tensor<2x16x2x64xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$query, MoE_FloatTensor:$key,
                       MoE_FloatTensor:$value, MoE_FloatTensor:$grad,
                       Optional<MoE_IntTensor>:$documents, UnitAttr:$causal,
                       OptionalAttr<ConfinedAttr<F64Attr, [MoE_PositiveFloat]>>:$scale);
  let results = (outs MoE_FloatTensor:$query_grad, MoE_FloatTensor:$key_grad,
                      MoE_FloatTensor:$value_grad);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $grad (`causal` $causal^)?
    (`documents` `(` $documents^ `:` type($documents) `)`)?
    (`scale` `(` $scale^ `)`)? attr-dict `:` type($query) `,` type($key) `,`
    type($value) `,` type($grad) `->` type($query_grad) `,` type($key_grad)
    `,` type($value_grad)
  }];
  let extraClassDeclaration = [{
    /// The softmax scale: the attribute, or 1/sqrt(head dim).
    double getScaleOrDefault();
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

def MoE_CrossEntropyOp : MoE_Op<"cross_entropy", [Pure]> {
  let summary = "mean next-token cross-entropy of logits against labels";
  let description = [{
    `logits` `[N, V]`, `labels` `[N]`. The loss is
    `sum_n (logsumexp(logits[n]) - logits[n, labels[n]]) / count` over the
    rows whose label is in `[0, V)`; any other label (such as -100, the
    Hugging Face padding label) is ignored. `count` is the number of
    counted rows; with none the loss is 0. Computed in f32, returned as a
    0-d tensor.

    Example:

    ```mlir
    %loss = moe.cross_entropy %logits, %labels
        : tensor<64x32xf32>, tensor<64xi32> -> tensor<f32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$logits, MoE_IntTensor:$labels);
  let results = (outs MoE_F32Tensor:$loss);
  let assemblyFormat = [{
    $logits `,` $labels attr-dict `:` type($logits) `,` type($labels) `->`
    type($loss)
  }];
  let hasVerifier = 1;
}

def MoE_CrossEntropyGradOp : MoE_Op<"cross_entropy_grad", [Pure]> {
  let summary = "gradient of moe.cross_entropy with respect to the logits";
  let description = [{
    `result[n, v] = (softmax(logits[n])[v] - (v == labels[n])) * grad / count`
    for counted rows, 0 for ignored ones; `grad` is the 0-d gradient of the
    loss. In f32.

    Example:

    ```mlir
    %dlogits = moe.cross_entropy_grad %logits, %labels, %dloss
        : tensor<64x32xf32>, tensor<64xi32>, tensor<f32> -> tensor<64x32xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$logits, MoE_IntTensor:$labels,
                       MoE_F32Tensor:$grad);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $labels `,` $grad attr-dict `:` type($logits) `,`
    type($labels) `,` type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_RouterLossOp : MoE_Op<"router_loss", [Pure, AttrSizedOperandSegments]> {
  let summary = "the routers' load-balancing and z losses over all MoE layers";
  let description = [{
    The auxiliary losses of the routers of a model's MoE layers: for layer
    `l`, `logits[l]` `[T_l, E]` (the router's logits) and `counts[l]` `[E]`
    (how many of the layer's top-k assignments each expert got, as
    `moe.dispatch` counts them). With `N = sum_l T_l` rows in all,
    `p[l, t] = softmax(logits[l][t])`,
    `C[e] = sum_l counts[l][e]` and `P[e] = sum_l sum_t p[l, t][e]`:

    - load balancing (Switch Transformer; transformers' Qwen3-MoE and
      Mixtral `load_balancing_loss_func` without an attention mask, every
      layer's rows together): `aux = E * sum_e (C[e] / N) * (P[e] / N)`;
    - router z-loss (ST-MoE): `z = sum_l sum_t logsumexp(logits[l][t])^2 / N`.

    The result is `aux_coef * aux + z_coef * z`, in f32, as a 0-d tensor.
    The counts carry no gradient (the assignment is piecewise constant).

    Example:

    ```mlir
    %aux = moe.router_loss logits(%l0, %l1 : tensor<64x8xf32>, tensor<64x8xf32>)
        counts(%c0, %c1 : tensor<8xi32>, tensor<8xi32>)
        aux_coef(1.000000e-03) z_coef(0.000000e+00) -> tensor<f32>
    ```
  }];
  let arguments = (ins Variadic<MoE_FloatTensor>:$logits,
                       Variadic<MoE_IntTensor>:$counts,
                       F64Attr:$aux_coef, F64Attr:$z_coef);
  let results = (outs MoE_F32Tensor:$loss);
  let assemblyFormat = [{
    `logits` `(` $logits `:` type($logits) `)`
    `counts` `(` $counts `:` type($counts) `)`
    `aux_coef` `(` $aux_coef `)` `z_coef` `(` $z_coef `)`
    attr-dict `->` type($loss)
  }];
  let hasVerifier = 1;
}

def MoE_RouterLossGradOp : MoE_Op<"router_loss_grad",
                                  [Pure, AttrSizedOperandSegments]> {
  let summary = "gradient of moe.router_loss with respect to the logits";
  let description = [{
    One result per `logits[l]`, of its shape: with `C`, `N`, `E` and `p` as
    in `moe.router_loss`, `lse[l, t] = logsumexp(logits[l][t])`,
    `s[l, t] = sum_e C[e] * p[l, t][e]` and `grad` the 0-d gradient of the
    loss,
    `result[l][t, j] = grad * p[l, t][j] * (aux_coef * E / N^2 *
    (C[j] - s[l, t]) + z_coef * 2 * lse[l, t] / N)`. In f32.

    Example:

    ```mlir
    %d0, %d1 = moe.router_loss_grad %g
        logits(%l0, %l1 : tensor<64x8xf32>, tensor<64x8xf32>)
        counts(%c0, %c1 : tensor<8xi32>, tensor<8xi32>)
        aux_coef(1.000000e-03) z_coef(0.000000e+00)
        : tensor<f32> -> tensor<64x8xf32>, tensor<64x8xf32>
    ```
  }];
  let arguments = (ins MoE_F32Tensor:$grad,
                       Variadic<MoE_FloatTensor>:$logits,
                       Variadic<MoE_IntTensor>:$counts,
                       F64Attr:$aux_coef, F64Attr:$z_coef);
  let results = (outs Variadic<MoE_FloatTensor>:$results);
  let assemblyFormat = [{
    $grad
    `logits` `(` $logits `:` type($logits) `)`
    `counts` `(` $counts `:` type($counts) `)`
    `aux_coef` `(` $aux_coef `)` `z_coef` `(` $z_coef `)`
    attr-dict `:` type($grad) `->` type($results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Gradients of the routing ops
//===----------------------------------------------------------------------===//

def MoE_RouterGradOp : MoE_Op<"router_grad", [Pure]> {
  let summary = "gradient of moe.router's weights with respect to the logits";
  let description = [{
    Given the logits and the indices a `moe.router` with the same
    attributes picked, and the gradient `grad` `[T, k]` of its weights,
    returns the gradient of the logits `[T, E]` (the indices are piecewise
    constant and have none). With `g` the gradient of the selected scores
    (after `norm_topk_prob`: `g_j = (grad_j - sum_k grad_k w_k) / S`, `S`
    the sum of the selected scores):
    - `softmax`: `d_logits = p * (G - <G, p>)`, `p` the softmax over all
      experts and `G` `g` scattered to the selected experts;
    - `softmax_after_topk`: `d_logits[i_j] = w_j (grad_j - sum_k grad_k w_k)`,
      zero elsewhere;
    - `sigmoid`: `d_logits[i_j] = g_j s_j (1 - s_j)`, zero elsewhere.
    In f32.

    Example:

    ```mlir
    %dlogits = moe.router_grad %logits, %idx, %dw top_k(2) softmax norm_topk_prob
        : tensor<16x8xf32>, tensor<16x2xi32>, tensor<16x2xf32> -> tensor<16x8xf32>
    ```
  }];
  let arguments = (ins
    MoE_FloatTensor:$logits, MoE_IntTensor:$indices, MoE_F32Tensor:$grad,
    ConfinedAttr<I64Attr, [IntMinValue<1>]>:$top_k,
    MoE_ScoreFunction:$score,
    UnitAttr:$softmax_after_topk,
    UnitAttr:$norm_topk_prob
  );
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $indices `,` $grad `top_k` `(` $top_k `)` $score
    (`softmax_after_topk` $softmax_after_topk^)?
    (`norm_topk_prob` $norm_topk_prob^)?
    attr-dict `:` type($logits) `,` type($indices) `,` type($grad) `->`
    type($result)
  }];
  let hasVerifier = 1;
}

def MoE_CombineGradOp : MoE_Op<"combine_grad", [Pure]> {
  let summary = "gradient of moe.combine's weights";
  let description = [{
    `result[t, j] = <grad[t], expert_out[positions[t, j]]>` summed in f32
    (0 for dropped copies; when H is a multiple of 32, as 32 interleaved
    partial sums, over h = l, l + 32, ..., added in order of l): the
    gradient of `moe.combine`'s weights given
    the gradient `grad` `[T, H]` of its result. (The gradient of the expert
    outputs is a `moe.dispatch` of `weights * grad`.)

    Example:

    ```mlir
    %dw = moe.combine_grad %expert_out, %pos, %dy
        : tensor<12x16xf32>, tensor<6x2xi32>, tensor<6x16xf32> -> tensor<6x2xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$expert_out, MoE_IntTensor:$positions,
                       MoE_FloatTensor:$grad);
  let results = (outs MoE_F32Tensor:$result);
  let assemblyFormat = [{
    $expert_out `,` $positions `,` $grad attr-dict `:` type($expert_out) `,`
    type($positions) `,` type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

#endif // MOE_MODEL_OPS_TD
