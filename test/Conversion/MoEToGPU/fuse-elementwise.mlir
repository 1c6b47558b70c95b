// RUN: moe-opt %s --convert-moe-to-linalg=parallel=true --canonicalize --moe-gpu-fuse-elementwise | FileCheck %s

// An MX weight only dequantized to bf16 (the Hopper GEMM operand): the
// quantized elements and their dequantization are one pass from f32 to
// bf16; the 8-bit tensor is never materialized. The block amax (a
// reduction) and the scales stay their own passes.
// CHECK-LABEL: func.func @weights(
// CHECK: %[[X:.*]] = tensor.expand_shape %arg0
// CHECK: %[[AMAX:.*]] = linalg.generic {{.*}}"reduction"]} ins(%[[X]] : tensor<4x2x32x128xf32>)
// CHECK: %[[S:.*]] = linalg.generic {{.*}} ins(%[[AMAX]] : tensor<4x2x128xf32>) outs(%{{.*}} : tensor<4x2x128xf8E8M0FNU>)
// CHECK: %[[BF:.*]] = linalg.generic {{.*}} ins(%[[X]], %[[S]], %[[S]] : tensor<4x2x32x128xf32>, tensor<4x2x128xf8E8M0FNU>, tensor<4x2x128xf8E8M0FNU>) outs(%{{.*}} : tensor<4x2x32x128xbf16>)
// CHECK-NOT: -> tensor<4x2x32x128xf8E4M3FN>
// CHECK: %[[OUT:.*]] = tensor.collapse_shape %[[BF]]
// CHECK: return %[[OUT]]
func.func @weights(%w: tensor<4x64x128xf32>) -> tensor<4x64x128xbf16> {
  %q = moe.quantize %w : tensor<4x64x128xf32> -> !moe.mx<4x64x128xf8E4M3FN, axis = 1>
  %d = moe.dequantize %q : !moe.mx<4x64x128xf8E4M3FN, axis = 1> -> tensor<4x64x128xbf16>
  return %d : tensor<4x64x128xbf16>
}

// The 8-bit elements are also a result: computed once, not fused.
// CHECK-LABEL: func.func @also_returned(
// CHECK: %[[Q:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<4x2x32x128xf8E4M3FN>)
// CHECK: linalg.generic {{.*}} ins(%[[Q]], %{{.*}} : tensor<4x2x32x128xf8E4M3FN>, tensor<4x2x128xf8E8M0FNU>)
func.func @also_returned(%w: tensor<4x64x128xf32>)
    -> (tensor<4x64x128xbf16>, tensor<4x64x128xf8E4M3FN>) {
  %q = moe.quantize %w : tensor<4x64x128xf32> -> !moe.mx<4x64x128xf8E4M3FN, axis = 1>
  %d = moe.dequantize %q : !moe.mx<4x64x128xf8E4M3FN, axis = 1> -> tensor<4x64x128xbf16>
  %data, %scales = moe.mx_unpack %q : !moe.mx<4x64x128xf8E4M3FN, axis = 1>
      -> tensor<4x64x128xf8E4M3FN>, tensor<4x2x128xf8E8M0FNU>
  return %d, %data : tensor<4x64x128xbf16>, tensor<4x64x128xf8E4M3FN>
}
