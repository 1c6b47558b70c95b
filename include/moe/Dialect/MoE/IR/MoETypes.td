//===- MoETypes.td - moe dialect types ---------------------*- tablegen -*-===//
#ifndef MOE_TYPES_TD
#define MOE_TYPES_TD

include "moe/Dialect/MoE/IR/MoEDialect.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/BuiltinTypeInterfaces.td"
include "moe/Dialect/MoE/IR/MoETypeInterfaces.td"

def MoE_MXTensorType : TypeDef<MoE_Dialect, "MXTensor",
    [DeclareTypeInterfaceMethods<MoE_BlockScaledTypeInterface, ["withShape"]>]> {
  let mnemonic = "mx";
  let summary = "a block-scaled (MX) tensor: narrow elements plus one E8M0 scale per block";
  let description = [{
    A tensor of narrow floating-point elements in which every block of
    `block` consecutive elements along dimension `axis` shares one scale
    `2^e`, stored as `f8E8M0FNU` (exponent bias 127; `0xFF` is NaN). The
    represented value of element `q` is `q * 2^e`, computed in f32.

    Element types: `f8E4M3FN` (max 448) and `f8E5M2` (max 57344). The scale
    type is always `f8E8M0FNU`. The scaled dimension must be static and a
    multiple of the block size; other dimensions may be dynamic.

    `axis` is the dimension the blocks run along: for a `[tokens, K]`
    activation feeding a forward or data-gradient GEMM it is the last
    dimension (rowwise); for a weight-gradient operand it is the token
    dimension (columnwise, `axis = 0`). A GEMM operand is only exact when its
    blocks run along the contraction dimension.

    The value lowers to two tensors: the data (the shape, element type) and
    the scales (the shape with the scaled dimension divided by `block`,
    element type `f8E8M0FNU`); `moe.mx_pack` and `moe.mx_unpack` convert
    between the two views.

    Example:

    ```mlir
    // 128 tokens x 2048 hidden, E4M3, one scale per 32 values of a row.
    !moe.mx<128x2048xf8E4M3FN, axis = 1>
    // Stacked expert weights [E, K, N], blocks along K.
    !moe.mx<128x2048x768xf8E4M3FN, axis = 1, block = 32>
    ```
  }];
  let parameters = (ins
    ArrayRefParameter<"int64_t">:$shape,
    "::mlir::Type":$elementType,
    "unsigned":$axis,
    DefaultValuedParameter<"unsigned", "32">:$blockSize
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let skipDefaultBuilders = 0;
  let extraClassDeclaration = [{
    /// Number of dimensions.
    int64_t getRank() const { return getShape().size(); }
    /// The shape of the scale tensor: `shape` with the scaled dimension
    /// divided by the block size.
    ::llvm::SmallVector<int64_t> getScalesShape() const;
    /// The element type of the scales (`f8E8M0FNU`).
    ::mlir::Type getScaleType() const;
    // getDataType(), getScalesType(), withShape(): BlockScaledType.
  }];
}

def MoE_FP8BlockTensorType : TypeDef<MoE_Dialect, "FP8BlockTensor",
    [DeclareTypeInterfaceMethods<MoE_BlockScaledTypeInterface, ["withShape"]>]> {
  let mnemonic = "fp8block";
  let summary = "a blockwise-scaled FP8 tensor: FP8 elements plus one f32 "
                "scale per tile";
  let description = [{
    A tensor of FP8 elements cut into tiles of `block` (one size per
    dimension; the last tile along a dimension may be partial). Every tile
    shares one f32 scale `s_inv`; the represented value of element `q` is
    `q * s_inv`, computed in f32. This is the blockwise recipe of
    DeepSeek-V3 and Transformer Engine's `Float8BlockScaling`: activations
    and gradients in 1 x 128 tiles along the contraction dimension, weights
    in 128 x 128 tiles (which serve the forward and, transposed, the data
    gradient alike).

    Element types: `f8E4M3FN` (max 448) and `f8E5M2` (max 57344). With
    `pow2`, every scale is a power of two (see `moe.quantize`), so applying
    it is exact.

    The value lowers to two tensors: the data (the shape, element type) and
    the scales (f32, `ceildiv(dim, block)` along every dimension);
    `moe.mx_pack` and `moe.mx_unpack` convert between the two views.

    Example:

    ```mlir
    // 4096 tokens x 2048 hidden, one scale per 128 values of a row.
    !moe.fp8block<4096x2048xf8E4M3FN, block = [1, 128]>
    // Stacked expert weights [E, K, N], 128 x 128 tiles, power-of-two scales.
    !moe.fp8block<128x2048x768xf8E4M3FN, block = [1, 128, 128], pow2>
    ```
  }];
  let parameters = (ins
    ArrayRefParameter<"int64_t">:$shape,
    "::mlir::Type":$elementType,
    ArrayRefParameter<"int64_t">:$block,
    "bool":$pow2
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let skipDefaultBuilders = 0;
  let extraClassDeclaration = [{
    /// Number of dimensions.
    int64_t getRank() const { return getShape().size(); }
    /// The shape of the scale tensor: `ceildiv(shape[i], block[i])`.
    ::llvm::SmallVector<int64_t> getScalesShape() const;
    /// The element type of the scales (f32).
    ::mlir::Type getScaleType() const;
    // getDataType(), getScalesType(), withShape(): BlockScaledType.
  }];
}

#endif // MOE_TYPES_TD
