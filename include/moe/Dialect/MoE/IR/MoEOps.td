//===- MoEOps.td - moe dialect operations ------------------*- tablegen -*-===//
#ifndef MOE_OPS_TD
#define MOE_OPS_TD

include "moe/Dialect/MoE/IR/MoEDialect.td"
include "moe/Dialect/MoE/IR/MoETypes.td"
include "moe/Dialect/MoE/IR/MoEAttrs.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

def MoE_FloatTensor : RankedTensorOf<[F32, BF16, F16]>;
def MoE_IntTensor : RankedTensorOf<[I32, I64]>;
def MoE_F32Tensor : RankedTensorOf<[F32]>;
def MoE_MXTensor : Type<CPred<"::llvm::isa<::mlir::moe::MXTensorType>($_self)">,
                        "block-scaled MX tensor", "::mlir::moe::MXTensorType">;
def MoE_FloatOrMXTensor : AnyTypeOf<[MoE_FloatTensor, MoE_MXTensor],
                                    "float tensor or block-scaled MX tensor">;
def MoE_FP8BlockTensor
    : Type<CPred<"::llvm::isa<::mlir::moe::FP8BlockTensorType>($_self)">,
           "blockwise-scaled FP8 tensor", "::mlir::moe::FP8BlockTensorType">;
def MoE_BlockScaledTensor
    : Type<CPred<"::llvm::isa<::mlir::moe::BlockScaledType>($_self)">,
           "block-scaled tensor (MX or blockwise FP8)">;
def MoE_GemmOperand : AnyTypeOf<[MoE_FloatTensor, MoE_MXTensor,
                                 MoE_FP8BlockTensor],
    "float tensor or block-scaled tensor (MX or blockwise FP8)">;
def MoE_NarrowFloatTensor : RankedTensorOf<[F8E4M3FN, F8E5M2]>;
def MoE_ScaleTensor : RankedTensorOf<[F8E8M0FNU]>;
def MoE_BlockScaleTensor : RankedTensorOf<[F8E8M0FNU, F32]>;
def MoE_RowsTensor : AnyTypeOf<[MoE_FloatTensor, MoE_MXTensor,
                                MoE_NarrowFloatTensor, MoE_ScaleTensor],
    "float tensor, block-scaled MX tensor, or the data or scales of one">;
def MoE_PositiveFloat : AttrConstraint<
    CPred<"::llvm::cast<::mlir::FloatAttr>($_self).getValueAsDouble() > 0">,
    "whose value is positive">;

//===----------------------------------------------------------------------===//
// Routing
//===----------------------------------------------------------------------===//

def MoE_RouterOp : MoE_Op<"router", [Pure]> {
  let summary = "picks the top-k experts of every token and their combine weights";
  let description = [{
    Takes router logits `[T, E]` (T tokens, E experts) and returns, for every
    token, the indices of its `top_k` experts `[T, k]` (best first) and the
    weights `[T, k]` (f32) with which `moe.combine` mixes their outputs.

    - `softmax` (default order): scores are `softmax(logits)` over all E
      experts; the top-k scores are the weights. With `norm_topk_prob` the
      k weights are divided by their sum (Qwen3-MoE, Mixtral).
    - `softmax` with `softmax_after_topk`: the top-k logits are picked
      first and the weights are the softmax over those k logits only (they
      sum to one; `norm_topk_prob` changes nothing).
    - `sigmoid`: scores are `sigmoid(logits)`; `norm_topk_prob` divides the
      k weights by their sum (DeepSeek-V3 style).

    With `bias` `[E]` (DeepSeek-V3's auxiliary-loss-free balancing), the
    experts are ranked by `score + bias[e]` (with `softmax_after_topk`,
    `logit + bias[e]`); the weights are computed from the unbiased scores
    of the experts picked, so the bias steers the choice only and carries
    no gradient.

    All arithmetic is f32. Ties are broken deterministically: the lower
    expert index wins. A NaN score never wins against a number.

    Example:

    ```mlir
    %idx, %w = moe.router %logits top_k(8) softmax norm_topk_prob
        : tensor<16384x128xf32> -> tensor<16384x8xi32>, tensor<16384x8xf32>
    %idx2, %w2 = moe.router %logits bias(%b : tensor<128xf32>) top_k(8) sigmoid
        norm_topk_prob
        : tensor<16384x128xf32> -> tensor<16384x8xi32>, tensor<16384x8xf32>
    ```
  }];
  let arguments = (ins
    MoE_FloatTensor:$logits,
    Optional<MoE_F32Tensor>:$bias,
    ConfinedAttr<I64Attr, [IntMinValue<1>]>:$top_k,
    MoE_ScoreFunction:$score,
    UnitAttr:$softmax_after_topk,
    UnitAttr:$norm_topk_prob
  );
  let results = (outs MoE_IntTensor:$indices, MoE_F32Tensor:$weights);
  let assemblyFormat = [{
    $logits (`bias` `(` $bias^ `:` type($bias) `)`)? `top_k` `(` $top_k `)` $score
    (`softmax_after_topk` $softmax_after_topk^)?
    (`norm_topk_prob` $norm_topk_prob^)?
    attr-dict `:` type($logits) `->` type($indices) `,` type($weights)
  }];
  let hasVerifier = 1;
}

def MoE_DispatchOp : MoE_Op<"dispatch", [Pure]> {
  let summary = "permutes token copies into expert order, one contiguous group per expert";
  let description = [{
    Every token `t` goes to each of its k experts `indices[t, j]`. The copies
    are gathered into `sorted`, grouped by expert: expert `e` owns rows
    `[offsets[e], offsets[e+1])`. Inside a group, copies keep token order
    (then slot order), so the permutation is deterministic.

    Results:
    - `sorted` `[R, H]`: the token copies in expert order; padding rows
      and rows at or beyond `offsets[E]` are zero.
    - `offsets` `[E + 1]`: group boundaries (`offsets[0] = 0`).
    - `counts` `[E]`: the real (unpadded, kept) number of copies per expert.
    - `positions` `[T, k]`: the row of `sorted` holding copy `(t, j)`, or
      `-1` if it was dropped; `moe.combine` reads it.

    Dropless by default. `capacity_factor` limits every expert to
    `C = ceil(capacity_factor * T * k / E)` copies; later copies (in token
    order) are dropped. `pad_to(m)` rounds every group up to a multiple of
    `m` rows (grouped-GEMM tiles, the scale blocks of weight-gradient
    operands along tokens: moe-train pads to 32 under mxfp8 and to 128
    under fp8-blockwise, so that no block holds two experts' rows); empty
    experts stay empty. An index outside `[0, E)` drops that copy.

    `R` must be at least the worst case: `T*k + E*(m-1)` rounded down to a
    multiple of `m` (dropless), or `E * roundup(C, m)` with a capacity.

    The tokens may be an MX tensor with its blocks along the row (`axis =
    1`): rows move with their scales, and padding rows are an all-zero
    block's encoding (elements 0, scale 2^-127), so dispatching quantized
    tokens equals quantizing the dispatched ones, bit for bit.

    Example:

    ```mlir
    %sorted, %offsets, %counts, %pos = moe.dispatch %x, %idx experts(4)
        : tensor<6x16xbf16>, tensor<6x2xi32>
        -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
    ```
  }];
  let arguments = (ins
    MoE_FloatOrMXTensor:$tokens,
    MoE_IntTensor:$indices,
    ConfinedAttr<I64Attr, [IntMinValue<1>]>:$num_experts,
    OptionalAttr<ConfinedAttr<F64Attr, [MoE_PositiveFloat]>>:$capacity_factor,
    DefaultValuedAttr<ConfinedAttr<I64Attr, [IntMinValue<1>]>, "1">:$pad_to
  );
  let results = (outs MoE_FloatOrMXTensor:$sorted, MoE_IntTensor:$offsets,
                      MoE_IntTensor:$counts, MoE_IntTensor:$positions);
  let assemblyFormat = [{
    $tokens `,` $indices `experts` `(` $num_experts `)`
    (`capacity_factor` `(` $capacity_factor^ `)`)?
    (`pad_to` `(` $pad_to^ `)`)?
    attr-dict `:` type($tokens) `,` type($indices) `->` type($sorted) `,`
    type($offsets) `,` type($counts) `,` type($positions)
  }];
  let extraClassDeclaration = [{
    /// The per-expert capacity, or -1 when dropless.
    int64_t getCapacity();
    /// The smallest row count `sorted` must have.
    int64_t getMinRows();
    /// The dropless worst case of `copies` token copies over `experts`
    /// groups each padded to a multiple of `padTo`: `copies + experts *
    /// (padTo - 1)` rounded down to a multiple of `padTo`; nullopt when it
    /// does not fit in int64_t.
    static std::optional<int64_t> droplessRows(int64_t copies,
                                               int64_t experts,
                                               int64_t padTo);
  }];
  let hasVerifier = 1;
}

def MoE_CombineOp : MoE_Op<"combine", [Pure]> {
  let summary = "weighted sum of every token's expert outputs";
  let description = [{
    The inverse of `moe.dispatch`: `out[t] = sum_j weights[t, j] *
    expert_out[positions[t, j]]`, summed in f32 in slot order `j = 0..k-1`
    and rounded once to the result type. Slots with a negative position
    (dropped copies) contribute nothing.

    Example:

    ```mlir
    %y = moe.combine %expert_out, %w, %pos
        : tensor<12x16xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x16xbf16>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$expert_out, MoE_F32Tensor:$weights,
                       MoE_IntTensor:$positions);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $expert_out `,` $weights `,` $positions attr-dict `:` type($expert_out) `,`
    type($weights) `,` type($positions) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Experts
//===----------------------------------------------------------------------===//

def MoE_ExpertsOp : MoE_Op<"experts", [
    IsolatedFromAbove, SingleBlock, RecursiveMemoryEffects]> {
  let summary = "applies one expert's body to every expert's group of rows";
  let description = [{
    The form frontends write: the body describes one expert and is applied,
    for every expert `e`, to its rows `[offsets[e], offsets[e+1])` of
    `tokens` and to slice `e` of every stacked weight (`[E, ...]` → `[...]`).
    The body's block arguments are the group's rows (`tensor<?x...>`) and
    one argument per weight; it yields the group's output rows. Rows that
    belong to no expert produce zeros. The body is isolated from above:
    everything per-expert comes in through `weights`.

    `-moe-group-experts` turns the body's matmuls into `moe.grouped_matmul`.

    Example:

    ```mlir
    %y = moe.experts %sorted, %offsets weights(%w1, %w2
           : tensor<4x16x64xbf16>, tensor<4x32x16xbf16>)
           : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xf32> {
    ^bb0(%x: tensor<?x16xbf16>, %a: tensor<16x64xbf16>, %b: tensor<32x16xbf16>):
      ...
      moe.yield %out : tensor<?x16xf32>
    }
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$tokens, MoE_IntTensor:$offsets,
                       Variadic<AnyRankedTensor>:$weights);
  let results = (outs MoE_FloatTensor:$result);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $tokens `,` $offsets (`weights` `(` $weights^ `:` type($weights) `)`)?
    `:` type($tokens) `,` type($offsets) `->` type($result)
    attr-dict-with-keyword $body
  }];
  let extraClassDeclaration = [{
    /// Number of experts (the size of `offsets` minus one).
    int64_t getNumExperts();
  }];
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let hasCanonicalizer = 1;
}

def MoE_YieldOp : MoE_Op<"yield", [Pure, Terminator, HasParent<"ExpertsOp">,
                                   ReturnLike]> {
  let summary = "returns one expert's output rows from a moe.experts body";
  let description = [{
    Terminates the body of `moe.experts`; its operand is the expert's output
    for its group of rows.

    Example:

    ```mlir
    moe.yield %out : tensor<?x16xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
}

//===----------------------------------------------------------------------===//
// Grouped GEMMs
//===----------------------------------------------------------------------===//

def MoE_GroupedMatmulOp : MoE_Op<"grouped_matmul", [Pure]> {
  let summary = "one GEMM per expert group of rows, all experts in one op";
  let description = [{
    `lhs` `[R, K]` holds rows grouped by `offsets` `[E + 1]`; `rhs` holds one
    matrix per expert, `[E, K, N]` (or `[E, N, K]` with `transpose_rhs`).
    Row `r` of group `e` gives `result[r] = lhs[r] @ rhs[e]`; rows at or
    beyond `offsets[E]` give zeros. Products are accumulated in f32 (in
    order of increasing `k`) and rounded once to the result type.

    Either operand may be block-scaled (`!moe.mx`); its blocks must run along
    the contraction dimension K (`axis = 1` for `lhs`; for `rhs` `axis = 1`,
    or `axis = 2` with `transpose_rhs`). The result is then exactly that of
    dequantizing the operand to f32 first. A blockwise FP8 operand
    (`!moe.fp8block`) may have any tiles; its result is likewise that of the
    dequantized operand (kernels that accumulate FP8 products in the tensor
    cores' narrower accumulator state their bound against this).

    Example:

    ```mlir
    %h = moe.grouped_matmul %x, %w1, %offsets
        : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x64xf32>
    %dx = moe.grouped_matmul %dh, %w1, %offsets transpose_rhs
        : tensor<12x64xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x16xf32>
    ```
  }];
  let arguments = (ins MoE_GemmOperand:$lhs, MoE_GemmOperand:$rhs,
                       MoE_IntTensor:$offsets, UnitAttr:$transpose_rhs);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` $offsets (`transpose_rhs` $transpose_rhs^)? attr-dict
    `:` qualified(type($lhs)) `,` qualified(type($rhs)) `,` type($offsets)
    `->` type($result)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

def MoE_GroupedMatmulWgradOp : MoE_Op<"grouped_matmul_wgrad", [Pure]> {
  let summary = "per-expert weight gradient: contracts each group's rows";
  let description = [{
    The weight-gradient form of `moe.grouped_matmul`: for every expert `e`,
    `result[e] = lhs[g]^T @ rhs[g]` where `g` are the rows
    `[offsets[e], offsets[e+1])` of `lhs` `[R, K]` and `rhs` `[R, N]`; the
    result is `[E, K, N]`. An empty group gives a zero matrix. Accumulation
    is f32 in row order. MX operands must have their blocks along the rows
    (`axis = 0`, columnwise); blockwise FP8 operands may have any tiles
    (the recipe uses 128 x 1, tiles along the rows).

    Example:

    ```mlir
    %dw = moe.grouped_matmul_wgrad %x, %dh, %offsets
        : tensor<12x16xbf16>, tensor<12x64xbf16>, tensor<5xi32> -> tensor<4x16x64xf32>
    ```
  }];
  let arguments = (ins MoE_GemmOperand:$lhs, MoE_GemmOperand:$rhs,
                       MoE_IntTensor:$offsets);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` $offsets attr-dict `:` qualified(type($lhs)) `,`
    qualified(type($rhs)) `,` type($offsets) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Activation
//===----------------------------------------------------------------------===//

def MoE_SwigluOp : MoE_Op<"swiglu", [Pure]> {
  let summary = "SwiGLU activation: silu(gate) * up";
  let description = [{
    The last dimension `2F` of `input` holds the gate and the up
    projection; the result `[..., F]` is `silu(gate) * up` with
    `silu(g) = g / (1 + exp(-g))`, computed in f32 and rounded once.
    `split` (default): gate is `[..., 0:F]`, up is `[..., F:2F]`.
    `interleaved`: gate is element `2i`, up is element `2i+1`.

    Example:

    ```mlir
    %a = moe.swiglu %h : tensor<12x64xf32> -> tensor<12x32xbf16>
    %b = moe.swiglu %h layout(interleaved) : tensor<12x64xf32> -> tensor<12x32xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$input,
                       DefaultValuedAttr<MoE_SwigluLayout,
                                         "::mlir::moe::SwigluLayout::split">:$layout);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $input (`layout` `(` $layout^ `)`)? attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_SwigluGradOp : MoE_Op<"swiglu_grad", [Pure]> {
  let summary = "gradient of moe.swiglu with respect to its input";
  let description = [{
    Given the forward input `[..., 2F]` and the gradient of the output
    `[..., F]`, returns the gradient of the input `[..., 2F]` in the same
    layout: with `s = sigmoid(gate)`,
    `d_gate = grad * up * s * (1 + gate * (1 - s))` and
    `d_up = grad * gate * s`. Computed in f32, rounded once.

    Example:

    ```mlir
    %dh = moe.swiglu_grad %h, %da : tensor<12x64xf32>, tensor<12x32xf32> -> tensor<12x64xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$input, MoE_FloatTensor:$grad,
                       DefaultValuedAttr<MoE_SwigluLayout,
                                         "::mlir::moe::SwigluLayout::split">:$layout);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $grad (`layout` `(` $layout^ `)`)? attr-dict `:` type($input) `,`
    type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// MX quantization
//===----------------------------------------------------------------------===//

def MoE_QuantizeOp : MoE_Op<"quantize", [Pure]> {
  let summary = "quantizes a tensor to a block-scaled (MX or blockwise FP8) "
                "tensor";
  let description = [{
    For every block of `block` (32) consecutive values along the type's
    `axis`, in f32 (exact from bf16):

    1. `amax` = the largest magnitude in the block.
    2. The shared exponent `e`:
       - `rceil` (default; NVIDIA's recipe, never clips):
         `e = ceil(log2(amax / max_elem))`, computed exactly;
       - `floor` (OCP MX spec): `e = floor(log2(amax)) - emax_elem`
         (emax is 8 for E4M3, 15 for E5M2); values may saturate.
       `e` is clamped to `[-127, 127]` and stored as `e + 127`.
    3. Every element becomes `x * 2^-e` in f32, rounded to nearest even to
       the element type and saturated to `±max_elem`.

    Special blocks: an all-zero block gets scale `2^-127` (byte 0) and zero
    elements. A block holding a NaN or an infinity gets the NaN scale
    (`0xFF`); its elements are converted with `e = 0` (NaN stays NaN,
    infinities saturate), and the whole block dequantizes to NaN.

    To a blockwise FP8 type (`!moe.fp8block`), for every tile, in f32:

    1. `amax` = the largest magnitude in the tile.
    2. The scale `s = max_elem / amax`, rounded to nearest f32. An `amax` of
       0, infinity or NaN gives `s = 1`; an `s` that overflows to infinity
       becomes the largest finite f32. With the type's `pow2`, `s` keeps
       only its exponent (the largest power of two not above it).
    3. Every element becomes `x * s` in f32, rounded to nearest even to the
       element type and saturated to `±max_elem` (NaN stays NaN).
    4. The stored scale is `1 / s`, rounded to nearest f32 (exact under
       `pow2`).

    These are Transformer Engine's `Float8BlockScaling` rules (epsilon 0).
    `scale(...)` applies to MX results only.

    Example:

    ```mlir
    %q = moe.quantize %x : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E4M3FN, axis = 1>
    %c = moe.quantize %x scale(floor)
        : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E4M3FN, axis = 0>
    %b = moe.quantize %x
        : tensor<128x2048xbf16> -> !moe.fp8block<128x2048xf8E4M3FN, block = [1, 128]>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$input,
                       DefaultValuedAttr<MoE_ScaleMode,
                                         "::mlir::moe::ScaleMode::rceil">:$scale_mode);
  let results = (outs MoE_BlockScaledTensor:$result);
  let assemblyFormat = [{
    $input (`scale` `(` $scale_mode^ `)`)? attr-dict `:` type($input) `->`
    qualified(type($result))
  }];
  let hasVerifier = 1;
}

def MoE_DequantizeOp : MoE_Op<"dequantize", [Pure]> {
  let summary = "expands a block-scaled (MX or blockwise FP8) tensor to "
                "floats";
  let description = [{
    Every element becomes `q * 2^e` in f32, with `2^e` its block's scale; a
    NaN scale (`0xFF`) makes the whole block NaN. For a blockwise FP8 input
    it becomes `q * s_inv` in f32, with `s_inv` its tile's stored scale. The
    f32 value is rounded to the result element type.

    Example:

    ```mlir
    %x = moe.dequantize %q : !moe.mx<128x2048xf8E4M3FN, axis = 1> -> tensor<128x2048xf32>
    ```
  }];
  let arguments = (ins MoE_BlockScaledTensor:$input);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $input attr-dict `:` qualified(type($input)) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_MXPackOp : MoE_Op<"mx_pack", [Pure]> {
  let summary = "builds a block-scaled tensor from its data and scale tensors";
  let description = [{
    Views a data tensor and a scale tensor (see `!moe.mx` and
    `!moe.fp8block`) as one block-scaled tensor. No data moves.

    Example:

    ```mlir
    %q = moe.mx_pack %data, %scales : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
        -> !moe.mx<4x64xf8E4M3FN, axis = 1>
    %b = moe.mx_pack %data, %tile_scales : tensor<4x256xf8E4M3FN>, tensor<4x2xf32>
        -> !moe.fp8block<4x256xf8E4M3FN, block = [1, 128]>
    ```
  }];
  let arguments = (ins MoE_NarrowFloatTensor:$data,
                       MoE_BlockScaleTensor:$scales);
  let results = (outs MoE_BlockScaledTensor:$result);
  let assemblyFormat = [{
    $data `,` $scales attr-dict `:` type($data) `,` type($scales) `->`
    qualified(type($result))
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
}

def MoE_MXUnpackOp : MoE_Op<"mx_unpack", [Pure]> {
  let summary = "splits a block-scaled tensor into its data and scale tensors";
  let description = [{
    The inverse of `moe.mx_pack`: returns the narrow elements and the scales
    (E8M0 for `!moe.mx`, f32 for `!moe.fp8block`) of a block-scaled tensor.
    No data moves.

    Example:

    ```mlir
    %data, %scales = moe.mx_unpack %q : !moe.mx<4x64xf8E4M3FN, axis = 1>
        -> tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
    ```
  }];
  let arguments = (ins MoE_BlockScaledTensor:$input);
  let results = (outs MoE_NarrowFloatTensor:$data,
                      MoE_BlockScaleTensor:$scales);
  let assemblyFormat = [{
    $input attr-dict `:` qualified(type($input)) `->` type($data) `,` type($scales)
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Fused grouped MLP
//===----------------------------------------------------------------------===//

def MoE_GroupedMlpOp : MoE_Op<"grouped_mlp", [Pure]> {
  let summary = "fused expert MLP: grouped GEMM1, SwiGLU, quantize, grouped GEMM2";
  let description = [{
    One op for the whole expert MLP of every group:

    ```
    h   = moe.grouped_matmul(input, w1, offsets)        // [R, 2F], f32
    a   = moe.swiglu(h) {layout}                        // [R, F],  f32
    a'  = moe.quantize(a) {scale_mode} if w2 is MX      // rowwise, w2's elements
          else a rounded to w2's element type
    out = moe.grouped_matmul(a', w2, offsets)           // [R, H]
    ```

    `w1` is `[E, H, 2F]`, `w2` is `[E, F, H]`; either may be block-scaled
    (blocks along their K dimension, `axis = 1`), and so may `input`. The
    result is exactly that of the unfused ops above; a lowering is free not
    to materialize `h` or `a`.

    Example:

    ```mlir
    %y = moe.grouped_mlp %x, %w1, %w2, %offsets
        : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x16xbf16>, tensor<5xi32>
        -> tensor<12x16xbf16>
    ```
  }];
  let arguments = (ins MoE_FloatOrMXTensor:$input, MoE_FloatOrMXTensor:$w1,
                       MoE_FloatOrMXTensor:$w2, MoE_IntTensor:$offsets,
                       DefaultValuedAttr<MoE_SwigluLayout,
                                         "::mlir::moe::SwigluLayout::split">:$layout,
                       DefaultValuedAttr<MoE_ScaleMode,
                                         "::mlir::moe::ScaleMode::rceil">:$scale_mode);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $w1 `,` $w2 `,` $offsets (`layout` `(` $layout^ `)`)?
    (`scale` `(` $scale_mode^ `)`)? attr-dict `:` qualified(type($input)) `,`
    qualified(type($w1)) `,` qualified(type($w2)) `,` type($offsets) `->`
    type($result)
  }];
  let hasVerifier = 1;
}

def MoE_GroupedMlpBackwardOp : MoE_Op<"grouped_mlp_backward", [Pure]> {
  let summary = "fused backward of the expert MLP: recomputes h, no saved intermediates";
  let description = [{
    The gradients of `moe.grouped_mlp` for every group, given the forward
    input `x` `[R, H]`, the weights `w1` `[E, H, 2F]` and `w2` `[E, F, N]`,
    the offsets and the gradient `dy` `[R, N]` of the forward result. The
    pre-activation `h` and the activation `a` are recomputed from `x`: no
    full-precision intermediate of the forward pass is kept. The op is
    defined as this sequence of existing ops:

    ```
    h   = moe.grouped_matmul(Q(x, 1), Q(w1, 1), offsets)          // [R, 2F], f32
    a   = moe.swiglu(h) {layout}     // [R, F]: f32 if gemm_type is an f8 type,
                                     //         bf16 if it is bf16 (Q(a) the
                                     //         same), else w2's element type
    da  = moe.grouped_matmul(Q(dy, 1), Q(w2, 2), offsets) transpose_rhs
                                                                   // [R, F],  f32
    dh  = moe.swiglu_grad(h, da) {layout}                         // [R, 2F], f32
    dx  = moe.grouped_matmul(Q(dh, 1), Q(w1, 2), offsets) transpose_rhs
    dw1 = moe.grouped_matmul_wgrad(Q(x, 0), Q(dh, 0), offsets)
    dw2 = moe.grouped_matmul_wgrad(Q(a, 0), Q(dy, 0), offsets)
    ```

    `Q(v, k)` brings a GEMM operand to the recipe's precision, `k` being the
    dimension the GEMM contracts (blocks run along it):
    - no `gemm_type`: `Q(v, k) = v`;
    - `gemm_type(bf16)`: `v` rounded to bf16 (nearest even) if it is f32,
      else `v`;
    - `gemm_type(f8E4M3FN)` or `gemm_type(f8E5M2)`:
      `moe.quantize(v) {scale_mode}` to `!moe.mx<..., axis = k>` with those
      elements (block 32).

    The operands are the high-precision values (master weights): each feeds
    GEMMs that contract along different dimensions (`x` rowwise for `h`,
    columnwise for `dw1`), so the op quantizes them itself, as a
    `-moe-quantize`d unfused sequence does. With an f8 `gemm_type`, R, H, 2F
    and N (the dimensions the GEMMs contract) must be static multiples of 32. Results are accumulated in f32 and
    rounded once to their types.

    Example:

    ```mlir
    %dx, %dw1, %dw2 = moe.grouped_mlp_backward %x, %w1, %w2, %offsets, %dy
        gemm_type(f8E4M3FN)
        : tensor<64x32xbf16>, tensor<4x32x64xf32>, tensor<4x32x32xf32>,
          tensor<5xi32>, tensor<64x32xbf16>
        -> tensor<64x32xbf16>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
    ```
  }];
  let arguments = (ins MoE_FloatTensor:$x, MoE_FloatTensor:$w1,
                       MoE_FloatTensor:$w2, MoE_IntTensor:$offsets,
                       MoE_FloatTensor:$dy,
                       DefaultValuedAttr<MoE_SwigluLayout,
                                         "::mlir::moe::SwigluLayout::split">:$layout,
                       DefaultValuedAttr<MoE_ScaleMode,
                                         "::mlir::moe::ScaleMode::rceil">:$scale_mode,
                       OptionalAttr<TypeAttr>:$gemm_type);
  let results = (outs MoE_FloatTensor:$dx, MoE_FloatTensor:$dw1,
                      MoE_FloatTensor:$dw2);
  let assemblyFormat = [{
    $x `,` $w1 `,` $w2 `,` $offsets `,` $dy (`layout` `(` $layout^ `)`)?
    (`gemm_type` `(` $gemm_type^ `)`)? (`scale` `(` $scale_mode^ `)`)?
    attr-dict `:` type($x) `,` type($w1) `,` type($w2) `,` type($offsets) `,`
    type($dy) `->` type($dx) `,` type($dw1) `,` type($dw2)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Expert-parallel communication
//===----------------------------------------------------------------------===//

def MoE_AllToAllOp : MoE_Op<"all_to_all", [
    Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "variable-size exchange of rows between the ranks of a grid axis";
  let description = [{
    Every rank of the `shard.grid` axes `grid_axes` (all axes if empty)
    sends rows of `input` to every rank of the group and receives rows from
    every rank. `send_counts` `[C]` (`C` a multiple of the group size `P`)
    says how many consecutive rows go where: `C/P` counts per destination
    rank, in rank order (for example one count per local expert of that
    rank). Counts are exchanged first; then rows.

    `recv_counts` has the same shape: entry `src * C/P + j` is the count
    that rank `src` sent for slot `j`. `result` holds the received rows,
    ordered by source rank then slot; rows beyond those received are zero.

    ```
    P = 2, C = 2                 rank 0               rank 1
    input rows                   a0 a1 | b0           c0 | d0 d1
    send_counts                  [2, 1]               [1, 2]
    result rows                  a0 a1 | c0           b0 | d0 d1
    recv_counts                  [2, 1]               [1, 2]
    ```

    With a group of one rank the op is the identity (rows copied, padded
    with zeros or cut to the result's row count), unless a slot-major side
    pads its slots: then each slot's rows move to their padded place.

    Rows may be 8-bit: an MX tensor with its blocks along the row (`axis =
    1`; each row travels with its scales, rows beyond those received are an
    all-zero block's encoding), or the data or scales of one (rows moved as
    bytes).

    Slot-major sides. With `slot_major_result` the received rows are grouped
    by slot instead: slot `j` holds the rows every rank sent for slot `j`,
    by source rank, and starts where the earlier slots end, rounded up to a
    multiple of `pad_to`; rows between slots and after the last are zero.
    When the slots are an expert-parallel rank's local experts, that is the
    rows grouped by expert, ready for grouped GEMMs (group `j` starts at
    `sum over j' < j of roundup(sum over src of recv_counts[src * C/P + j'],
    pad_to)`). `slot_major_input` reads the input in that layout (the counts
    being `send_counts`), by slot then destination rank: the exchange back
    of a slot-major result is the one with a slot-major input.

    ```
    P = 2, C = 4 (slots x, y)    rank 0               rank 1
    input rows                   a0 | a1 || b0        c0 | c1 c2 || d0
    send_counts                  [1, 1, 1, 0]         [1, 2, 0, 1]
    result on rank 0             a0 a1 | c0 c1 c2     (by source, then slot)
    slot_major_result            a0 c0 | a1 c1 c2     (by slot, then source)
    ... pad_to(4)                a0 c0 0 0 | a1 c1 c2 0
    ```

    Example:

    ```mlir
    shard.grid @ep(shape = 2)
    %r, %rc = moe.all_to_all %x, %counts on @ep grid_axes = [0]
        : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
    ```
  }];
  let arguments = (ins MoE_RowsTensor:$input, MoE_IntTensor:$send_counts,
                       FlatSymbolRefAttr:$grid,
                       DefaultValuedAttr<DenseI16ArrayAttr, "{}">:$grid_axes,
                       UnitAttr:$slot_major_input, UnitAttr:$slot_major_result,
                       DefaultValuedAttr<ConfinedAttr<I64Attr, [IntMinValue<1>]>, "1">:$pad_to);
  let results = (outs MoE_RowsTensor:$result, MoE_IntTensor:$recv_counts);
  let extraClassDeclaration = [{
    /// The number of ranks exchanging rows (the product of the grid axes'
    /// sizes; all axes if `grid_axes` is empty), or ShapedType::kDynamic when
    /// the grid is missing or a size is dynamic.
    int64_t getGroupSize(::mlir::SymbolTableCollection &symbols);
  }];
  let assemblyFormat = [{
    $input `,` $send_counts `on` $grid (`grid_axes` `=` $grid_axes^)?
    (`slot_major_input` $slot_major_input^)?
    (`slot_major_result` $slot_major_result^)?
    (`pad_to` `(` $pad_to^ `)`)? attr-dict
    `:` type($input) `,` type($send_counts) `->` type($result) `,`
    type($recv_counts)
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
}

def MoE_SlotOffsetsOp : MoE_Op<"slot_offsets", [Pure]> {
  let summary = "group boundaries of a slot-major exchange result";
  let description = [{
    The groups of rows that `moe.all_to_all ... slot_major_result
    pad_to(m)` makes, from its `recv_counts` [C] (`C = P * S`: `S` slots
    per source rank): group `j` holds the rows every rank sent for slot `j`,
    and `offsets[j] = sum over j' < j of roundup(sum over src of
    counts[src * S + j'], m)` for `j` in `[0, S]`. Expert parallelism
    groups the received rows by local expert this way, so that grouped ops
    read them where they arrived.

    ```mlir
    %offsets = moe.slot_offsets %recv_counts pad_to(32) : tensor<128xi32> -> tensor<65xi32>
    ```
  }];
  let arguments = (ins MoE_IntTensor:$counts,
                       DefaultValuedAttr<ConfinedAttr<I64Attr, [IntMinValue<1>]>, "1">:$pad_to);
  let results = (outs MoE_IntTensor:$offsets);
  let assemblyFormat = [{
    $counts (`pad_to` `(` $pad_to^ `)`)? attr-dict `:` type($counts) `->`
    type($offsets)
  }];
  let extraClassDeclaration = [{
    /// The number of slots (groups): the offsets' size minus one.
    int64_t getNumSlots() { return getOffsets().getType().getDimSize(0) - 1; }
  }];
  let hasVerifier = 1;
}

include "moe/Dialect/MoE/IR/MoEModelOps.td"

#endif // MOE_OPS_TD
