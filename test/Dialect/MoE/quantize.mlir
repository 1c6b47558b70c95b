// RUN: moe-opt %s -split-input-file -moe-quantize -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s -split-input-file -moe-quantize="scale=floor" 2>/dev/null | FileCheck %s --check-prefix=FLOOR
// RUN: moe-opt %s -split-input-file -moe-quantize="recipe=bf16" 2>/dev/null | FileCheck %s --check-prefix=BF16
// RUN: moe-opt %s -split-input-file -moe-quantize="recipe=fp8-blockwise" 2>&1 | FileCheck %s --check-prefix=BLOCK
// RUN: moe-opt %s -split-input-file -moe-quantize="recipe=fp8-blockwise block-scales=f32" 2>/dev/null | FileCheck %s --check-prefix=BLOCK-F32
// RUN: moe-opt %s -split-input-file -moe-quantize="keep-layers=1,7" 2>/dev/null | FileCheck %s --check-prefix=KEEP
// RUN: moe-opt %s -split-input-file -moe-quantize="keep-first-last" 2>/dev/null | FileCheck %s --check-prefix=FIRSTLAST
// RUN: moe-opt %s -split-input-file -moe-quantize="keep-first-last=true keep-layers=1" 2>/dev/null | FileCheck %s --check-prefix=BOTHKEEP
// Running it twice changes nothing more.
// RUN: moe-opt %s -split-input-file -moe-quantize -moe-quantize 2>/dev/null | FileCheck %s
// Bad options are errors that name the choices:
// RUN: not moe-opt %s -moe-quantize="recipe=fp4" 2>&1 | FileCheck %s --check-prefix=BAD-RECIPE
// RUN: not moe-opt %s -moe-quantize="scale=ceil" 2>&1 | FileCheck %s --check-prefix=BAD-SCALE
// RUN: not moe-opt %s -moe-quantize="keep-layers=first" 2>&1 | FileCheck %s --check-prefix=BAD-LAYERS
// RUN: not moe-opt %s -moe-quantize="precision=fp8" 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// RUN: not moe-opt %s -moe-quantize="recipe=fp8-blockwise block-scales=e8m0" 2>&1 | FileCheck %s --check-prefix=BAD-BLOCK-SCALES

// BAD-RECIPE: moe-quantize: unknown recipe 'fp4' (expected 'mxfp8', 'bf16' or 'fp8-blockwise')
// BAD-SCALE: moe-quantize: unknown scale 'ceil' (expected 'rceil' or 'floor')
// BAD-LAYERS: for the --keep-layers option: 'first' value invalid
// BAD-OPTION: no such option precision
// BAD-BLOCK-SCALES: moe-quantize: unknown block-scales 'e8m0' (expected 'pow2' or 'f32')

// -moe-quantize puts MXFP8 (or bf16) where the recipes do: on the operands
// of expert GEMMs, along the contraction dimension; results keep their
// types, weights stay high-precision function arguments (master weights).

// Forward GEMM: lhs rowwise along K (axis 1), rhs [E, K, N] along K (axis 1).
// CHECK-LABEL: func.func @forward
// CHECK-SAME: (%[[X:.*]]: tensor<64x32xf32>, %[[W:.*]]: tensor<4x32x64xbf16>, %[[OFF:.*]]: tensor<5xi32>)
// CHECK-NEXT: %[[QX:.*]] = moe.quantize %[[X]] : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
// CHECK-NEXT: %[[QW:.*]] = moe.quantize %[[W]] : tensor<4x32x64xbf16> -> !moe.mx<4x32x64xf8E4M3FN, axis = 1>
// CHECK-NEXT: %[[H:.*]] = moe.grouped_matmul %[[QX]], %[[QW]], %[[OFF]] : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x64xf32>
// CHECK-NEXT: return %[[H]]
// FLOOR-LABEL: func.func @forward
// FLOOR-NEXT: moe.quantize %{{.*}} scale(floor) : tensor<64x32xf32>
// FLOOR-NEXT: moe.quantize %{{.*}} scale(floor) : tensor<4x32x64xbf16>
// bf16: the f32 operand is rounded (nearest even), the bf16 one is kept.
// BF16-LABEL: func.func @forward
// BF16-SAME: (%[[X:.*]]: tensor<64x32xf32>, %[[W:.*]]: tensor<4x32x64xbf16>, %[[OFF:.*]]: tensor<5xi32>)
// BF16-NEXT: %[[E:.*]] = tensor.empty() : tensor<64x32xbf16>
// BF16-NEXT: %[[XB:.*]] = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%[[X]] : tensor<64x32xf32>) outs(%[[E]] : tensor<64x32xbf16>)
// BF16-NEXT: ^bb0(%[[IN:.*]]: f32, %{{.*}}: bf16):
// BF16-NEXT: %[[T:.*]] = arith.truncf %[[IN]] : f32 to bf16
// BF16-NEXT: linalg.yield %[[T]] : bf16
// BF16-NEXT: } -> tensor<64x32xbf16>
// BF16-NEXT: %[[H:.*]] = moe.grouped_matmul %[[XB]], %[[W]], %[[OFF]] : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x64xf32>
// BF16-NEXT: return %[[H]]
func.func @forward(%x: tensor<64x32xf32>, %w: tensor<4x32x64xbf16>, %off: tensor<5xi32>) -> tensor<64x64xf32> {
  %h = moe.grouped_matmul %x, %w, %off : tensor<64x32xf32>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x64xf32>
  return %h : tensor<64x64xf32>
}

// -----

// Data gradient: rhs [E, N, K] read transposed, blocks along K = axis 2.
// CHECK-LABEL: func.func @dgrad
// CHECK-NEXT: %[[QD:.*]] = moe.quantize %arg0 : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 1>
// CHECK-NEXT: %[[QW:.*]] = moe.quantize %arg1 : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 2>
// CHECK-NEXT: moe.grouped_matmul %[[QD]], %[[QW]], %arg2 transpose_rhs : !moe.mx<64x64xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<64x32xbf16>
func.func @dgrad(%dh: tensor<64x64xf32>, %w: tensor<4x32x64xf32>, %off: tensor<5xi32>) -> tensor<64x32xbf16> {
  %dx = moe.grouped_matmul %dh, %w, %off transpose_rhs : tensor<64x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xbf16>
  return %dx : tensor<64x32xbf16>
}

// -----

// Weight gradient: both operands columnwise (blocks along the rows).
// CHECK-LABEL: func.func @wgrad
// CHECK-NEXT: %[[QX:.*]] = moe.quantize %arg0 : tensor<64x32xbf16> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
// CHECK-NEXT: %[[QD:.*]] = moe.quantize %arg1 : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 0>
// CHECK-NEXT: moe.grouped_matmul_wgrad %[[QX]], %[[QD]], %arg2 : !moe.mx<64x32xf8E4M3FN, axis = 0>, !moe.mx<64x64xf8E4M3FN, axis = 0>, tensor<5xi32> -> tensor<4x32x64xf32>
// BF16-LABEL: func.func @wgrad
// BF16-NOT: linalg.generic {{.*}} ins(%arg0
// BF16: linalg.generic {{.*}} ins(%arg1 : tensor<64x64xf32>) outs(%{{.*}} : tensor<64x64xbf16>)
// BF16: moe.grouped_matmul_wgrad %arg0, %{{.*}}, %arg2 : tensor<64x32xbf16>, tensor<64x64xbf16>, tensor<5xi32> -> tensor<4x32x64xf32>
func.func @wgrad(%x: tensor<64x32xbf16>, %dh: tensor<64x64xf32>, %off: tensor<5xi32>) -> tensor<4x32x64xf32> {
  %dw = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<64x32xbf16>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  return %dw : tensor<4x32x64xf32>
}

// -----

// Already block-scaled operands are left alone; the float one is quantized.
// CHECK-LABEL: func.func @mixed
// CHECK-NEXT: %[[QW:.*]] = moe.quantize %arg1 : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 1>
// CHECK-NEXT: moe.grouped_matmul %arg0, %[[QW]], %arg2 : !moe.mx<64x32xf8E5M2, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>
// BF16-LABEL: func.func @mixed
// BF16: linalg.generic {{.*}} ins(%arg1 : tensor<4x32x64xf32>)
// BF16: moe.grouped_matmul %arg0, %{{.*}}, %arg2 : !moe.mx<64x32xf8E5M2, axis = 1>, tensor<4x32x64xbf16>
func.func @mixed(%x: !moe.mx<64x32xf8E5M2, axis = 1>, %w: tensor<4x32x64xf32>, %off: tensor<5xi32>) -> tensor<64x64xf32> {
  %h = moe.grouped_matmul %x, %w, %off : !moe.mx<64x32xf8E5M2, axis = 1>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  return %h : tensor<64x64xf32>
}

// -----

// Nothing to do: both operands block-scaled (either recipe), or bf16 (the
// bf16 recipe; MXFP8 quantizes them).
// CHECK-LABEL: func.func @nothing_to_do
// CHECK-NEXT: moe.grouped_matmul %arg0, %arg1, %arg4 :
// CHECK-NEXT: moe.quantize %arg2
// CHECK-NEXT: moe.quantize %arg3
// CHECK-NEXT: moe.grouped_matmul
// BF16-LABEL: func.func @nothing_to_do
// BF16-NOT: linalg.generic
// BF16: return
func.func @nothing_to_do(%x: !moe.mx<64x32xf8E4M3FN, axis = 1>, %w: !moe.mx<4x32x64xf8E4M3FN, axis = 1>,
                         %xb: tensor<64x32xbf16>, %wb: tensor<4x32x64xbf16>, %off: tensor<5xi32>)
    -> (tensor<64x64xf32>, tensor<64x64xf32>) {
  %h = moe.grouped_matmul %x, %w, %off : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x64xf32>
  %h2 = moe.grouped_matmul %xb, %wb, %off {moe.layer = 7} : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x64xf32>
  return %h, %h2 : tensor<64x64xf32>, tensor<64x64xf32>
}

// -----

// The fused MLP: input, w1 and w2 rowwise along K; a block-scaled w2 makes
// the op quantize its activation, with the recipe's scale mode.
// CHECK-LABEL: func.func @grouped_mlp
// CHECK-NEXT: %[[QX:.*]] = moe.quantize %arg0 : tensor<64x32xbf16> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
// CHECK-NEXT: %[[Q1:.*]] = moe.quantize %arg1 : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 1>
// CHECK-NEXT: %[[Q2:.*]] = moe.quantize %arg2 : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 1>
// CHECK-NEXT: moe.grouped_mlp %[[QX]], %[[Q1]], %[[Q2]], %arg3 layout(interleaved) : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x32xbf16>
// FLOOR-LABEL: func.func @grouped_mlp
// FLOOR: moe.grouped_mlp {{.*}} layout(interleaved) scale(floor)
// BF16-LABEL: func.func @grouped_mlp
// BF16-COUNT-2: linalg.generic
// BF16-NOT: linalg.generic
// BF16: moe.grouped_mlp %arg0, %{{.*}}, %{{.*}}, %arg3 layout(interleaved) : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xbf16>
func.func @grouped_mlp(%x: tensor<64x32xbf16>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                       %off: tensor<5xi32>) -> tensor<64x32xbf16> {
  %y = moe.grouped_mlp %x, %w1, %w2, %off layout(interleaved)
      : tensor<64x32xbf16>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xbf16>
  return %y : tensor<64x32xbf16>
}

// -----

// The fused backward quantizes its operands itself (x feeds GEMMs along two
// axes): the recipe becomes its gemm_type.
// CHECK-LABEL: func.func @grouped_mlp_backward
// CHECK-NEXT: moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 gemm_type(f8E4M3FN) :
// CHECK-NEXT: moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 gemm_type(f8E5M2) :
// FLOOR-LABEL: func.func @grouped_mlp_backward
// FLOOR-NEXT: moe.grouped_mlp_backward {{.*}} gemm_type(f8E4M3FN) scale(floor) :
// BF16-LABEL: func.func @grouped_mlp_backward
// BF16-NEXT: moe.grouped_mlp_backward {{.*}} gemm_type(bf16) :
// BF16-NEXT: moe.grouped_mlp_backward {{.*}} gemm_type(f8E5M2) :
func.func @grouped_mlp_backward(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                                %off: tensor<5xi32>, %dy: tensor<64x32xf32>) {
  %a:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
  // Already has a recipe: left alone.
  %b:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(f8E5M2)
      : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
  return
}

// -----

// Dense matmuls (attention, shared experts, router) stay as they are.
// CHECK-LABEL: func.func @dense
// CHECK-NOT: moe.quantize
// CHECK: linalg.matmul
// BF16-LABEL: func.func @dense
// BF16-NOT: arith.truncf
// BF16: linalg.matmul
func.func @dense(%a: tensor<64x32xf32>, %b: tensor<32x64xf32>, %c: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<64x32xf32>, tensor<32x64xf32>) outs(%c : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %r : tensor<64x64xf32>
}

// -----

// A contraction dimension that is not a multiple of 32 (or is dynamic)
// cannot be MX-quantized: the GEMM is left as it is, with a warning. (bf16
// has no such limit.)
// CHECK-LABEL: func.func @not_multiple_of_32
// CHECK-NOT: moe.quantize
// CHECK: return
// BF16-LABEL: func.func @not_multiple_of_32
// BF16-COUNT-9: linalg.generic
// BF16-NOT: linalg.generic
// BF16: return
// Blockwise FP8 takes any size (partial tiles) and warns about nothing; the
// fused MLP becomes its GEMMs (unused here, so they are gone; see
// Integration/CPU/quantize-pass.mlir for the expansion's results).
// BLOCK-NOT: warning
// BLOCK-LABEL: func.func @not_multiple_of_32
// BLOCK: moe.grouped_matmul {{.*}} : !moe.fp8block<64x48xf8E4M3FN, block = [1, 128], pow2>, !moe.fp8block<4x48x64xf8E4M3FN, block = [1, 128, 128], pow2>
// BLOCK: moe.grouped_matmul_wgrad {{.*}} : !moe.fp8block<40x32xf8E4M3FN, block = [128, 1], pow2>, !moe.fp8block<40x64xf8E4M3FN, block = [128, 1], pow2>
// BLOCK: moe.grouped_matmul {{.*}} : !moe.fp8block<64x?xf8E4M3FN, block = [1, 128], pow2>, !moe.fp8block<4x?x64xf8E4M3FN, block = [1, 128, 128], pow2>
// BLOCK-NOT: moe.grouped_mlp
// BLOCK: return
// BLOCK-F32-LABEL: func.func @not_multiple_of_32
// BLOCK-F32: moe.grouped_matmul {{.*}} : !moe.fp8block<64x48xf8E4M3FN, block = [1, 128]>, !moe.fp8block<4x48x64xf8E4M3FN, block = [1, 128, 128]>
func.func @not_multiple_of_32(%x: tensor<64x48xf32>, %w: tensor<4x48x64xf32>, %off: tensor<5xi32>,
                              %r: tensor<40x32xf32>, %g: tensor<40x64xf32>,
                              %xd: tensor<64x?xf32>, %wd: tensor<4x?x64xf32>,
                              %w1: tensor<4x32x80xf32>, %w2: tensor<4x40x32xf32>,
                              %xm: tensor<64x32xf32>) {
  // expected-warning @+1 {{moe-quantize: 'moe.grouped_matmul' left in high precision: lhs dim 1 (K) is 48, not a multiple of the MX block size 32}}
  %0 = moe.grouped_matmul %x, %w, %off : tensor<64x48xf32>, tensor<4x48x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  // expected-warning @+1 {{moe-quantize: 'moe.grouped_matmul_wgrad' left in high precision: lhs dim 0 (rows) is 40, not a multiple of the MX block size 32}}
  %1 = moe.grouped_matmul_wgrad %r, %g, %off : tensor<40x32xf32>, tensor<40x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  // expected-warning @+1 {{moe-quantize: 'moe.grouped_matmul' left in high precision: lhs dim 1 (K) is dynamic, an MX block dimension must be static}}
  %2 = moe.grouped_matmul %xd, %wd, %off : tensor<64x?xf32>, tensor<4x?x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  // expected-warning @+1 {{moe-quantize: 'moe.grouped_mlp' left in high precision: w2 dim 1 (ffn) is 40, not a multiple of the MX block size 32}}
  %3 = moe.grouped_mlp %xm, %w1, %w2, %off : tensor<64x32xf32>, tensor<4x32x80xf32>, tensor<4x40x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  return
}

// -----

// CHECK-LABEL: func.func @backward_not_multiple_of_32
// CHECK-NEXT: moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 :
// BF16-LABEL: func.func @backward_not_multiple_of_32
// BF16-NEXT: moe.grouped_mlp_backward {{.*}} gemm_type(bf16) :
func.func @backward_not_multiple_of_32(%x: tensor<40x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                                       %off: tensor<5xi32>, %dy: tensor<40x32xf32>) {
  // expected-warning @+1 {{moe-quantize: 'moe.grouped_mlp_backward' left in high precision: x dim 0 (rows) is 40, not a multiple of the MX block size 32}}
  %a:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<40x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<40x32xf32>
      -> tensor<40x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
  return
}

// -----

// Layers (moe.layer, set by model builders): keep-layers keeps the listed
// ones in high precision, keep-first-last the smallest and largest present
// (here 0 and 7). The quantizes inherit the GEMM's layer.
// CHECK-LABEL: func.func @layers
// CHECK: moe.quantize %arg0 {moe.layer = 0 : i64}
// CHECK: moe.grouped_matmul {{.*}} {moe.layer = 0 : i64} : !moe.mx
// CHECK: moe.quantize %arg0 {moe.layer = 1 : i64}
// CHECK: moe.grouped_matmul {{.*}} {moe.layer = 1 : i64} : !moe.mx
// CHECK: moe.grouped_matmul {{.*}} {moe.layer = 7 : i64} : !moe.mx
// CHECK: moe.grouped_matmul {{.*}} : !moe.mx
// KEEP-LABEL: func.func @layers
// KEEP: moe.grouped_matmul {{.*}} {moe.layer = 0 : i64} : !moe.mx
// KEEP: moe.grouped_matmul %arg0, %arg1, %arg2 {moe.layer = 1 : i64} : tensor<64x32xf32>
// KEEP: moe.grouped_matmul %arg0, %arg1, %arg2 {moe.layer = 7 : i64} : tensor<64x32xf32>
// KEEP: moe.grouped_matmul {{.*}} : !moe.mx
// FIRSTLAST-LABEL: func.func @layers
// FIRSTLAST: moe.grouped_matmul %arg0, %arg1, %arg2 {moe.layer = 0 : i64} : tensor<64x32xf32>
// FIRSTLAST: moe.grouped_matmul {{.*}} {moe.layer = 1 : i64} : !moe.mx
// FIRSTLAST: moe.grouped_matmul %arg0, %arg1, %arg2 {moe.layer = 7 : i64} : tensor<64x32xf32>
// FIRSTLAST: moe.grouped_matmul {{.*}} : !moe.mx
// BOTHKEEP-LABEL: func.func @layers
// BOTHKEEP: moe.grouped_matmul %arg0, %arg1, %arg2 {moe.layer = 0 : i64} : tensor<64x32xf32>
// BOTHKEEP: moe.grouped_matmul %arg0, %arg1, %arg2 {moe.layer = 1 : i64} : tensor<64x32xf32>
// BOTHKEEP: moe.grouped_matmul %arg0, %arg1, %arg2 {moe.layer = 7 : i64} : tensor<64x32xf32>
// BOTHKEEP: moe.grouped_matmul {{.*}} : !moe.mx
// BF16-LABEL: func.func @layers
// BF16: moe.grouped_matmul {{.*}} {moe.layer = 0 : i64} : tensor<64x32xbf16>
func.func @layers(%x: tensor<64x32xf32>, %w: tensor<4x32x64xf32>, %off: tensor<5xi32>) {
  %0 = moe.grouped_matmul %x, %w, %off {moe.layer = 0} : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %1 = moe.grouped_matmul %x, %w, %off {moe.layer = 1} : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %2 = moe.grouped_matmul %x, %w, %off {moe.layer = 7} : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  // No layer: never kept.
  %3 = moe.grouped_matmul %x, %w, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  return
}

// -----

// Attention's f32 inputs become bf16 under either recipe; a kept layer's
// stay f32; results keep their types.
// CHECK-LABEL: func.func @attention
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: moe.attention %{{.*}}, %{{.*}}, %{{.*}} causal {moe.layer = 1 : i64} : tensor<1x16x4x64xbf16>, tensor<1x16x2x64xbf16>, tensor<1x16x2x64xbf16> -> tensor<1x16x4x64xf32>
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: moe.attention_grad {{.*}} causal {moe.layer = 1 : i64} : tensor<1x16x4x64xbf16>, tensor<1x16x2x64xbf16>, tensor<1x16x2x64xbf16>, tensor<1x16x4x64xbf16> -> tensor<1x16x4x64xf32>, tensor<1x16x2x64xf32>, tensor<1x16x2x64xf32>
// BF16-LABEL: func.func @attention
// BF16: moe.attention {{.*}} : tensor<1x16x4x64xbf16>, tensor<1x16x2x64xbf16>, tensor<1x16x2x64xbf16> -> tensor<1x16x4x64xf32>
// KEEP-LABEL: func.func @attention
// KEEP: moe.attention %arg0, %arg1, %arg2 causal {moe.layer = 1 : i64} : tensor<1x16x4x64xf32>
func.func @attention(%q: tensor<1x16x4x64xf32>, %k: tensor<1x16x2x64xf32>, %v: tensor<1x16x2x64xf32>,
                     %do: tensor<1x16x4x64xf32>)
    -> (tensor<1x16x4x64xf32>, tensor<1x16x4x64xf32>, tensor<1x16x2x64xf32>, tensor<1x16x2x64xf32>) {
  %o = moe.attention %q, %k, %v causal {moe.layer = 1}
      : tensor<1x16x4x64xf32>, tensor<1x16x2x64xf32>, tensor<1x16x2x64xf32> -> tensor<1x16x4x64xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal {moe.layer = 1}
      : tensor<1x16x4x64xf32>, tensor<1x16x2x64xf32>, tensor<1x16x2x64xf32>, tensor<1x16x4x64xf32>
      -> tensor<1x16x4x64xf32>, tensor<1x16x2x64xf32>, tensor<1x16x2x64xf32>
  return %o, %dq, %dk, %dv : tensor<1x16x4x64xf32>, tensor<1x16x4x64xf32>, tensor<1x16x2x64xf32>, tensor<1x16x2x64xf32>
}
