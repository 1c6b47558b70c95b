// RUN: moe-opt %s --moe-place-weight-gradients | FileCheck %s

// The weight gradient moves past the combine of the data gradient: the
// [256, 512] f32 rows are freed before the [4, 64, 64] f32 gradient is
// allocated (at most 640 KiB live instead of 704 KiB). It stops before
// the first op that reads it.
// CHECK-LABEL: func.func @after_combine(
// CHECK: %[[DXR:.*]] = moe.grouped_matmul %arg1
// CHECK-NEXT: %[[DX:.*]] = moe.combine %[[DXR]]
// CHECK-NEXT: %[[DW:.*]] = moe.grouped_matmul_wgrad %arg0, %arg1, %arg3
// CHECK-NEXT: %[[S:.*]] = arith.addf %[[DW]], %[[DW]]
// CHECK-NEXT: return %[[DX]], %[[S]]
func.func @after_combine(%x: tensor<256x64xf32>, %dy: tensor<256x64xf32>, %w1: tensor<4x512x64xf32>,
                         %off: tensor<5xi32>, %w: tensor<64x4xf32>, %pos: tensor<64x4xi32>)
    -> (tensor<64x512xf32>, tensor<4x64x64xf32>) {
  %dxr = moe.grouped_matmul %dy, %w1, %off transpose_rhs
      : tensor<256x64xf32>, tensor<4x512x64xf32>, tensor<5xi32> -> tensor<256x512xf32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %off
      : tensor<256x64xf32>, tensor<256x64xf32>, tensor<5xi32> -> tensor<4x64x64xf32>
  %dx = moe.combine %dxr, %w, %pos
      : tensor<256x512xf32>, tensor<64x4xf32>, tensor<64x4xi32> -> tensor<64x512xf32>
  %s = arith.addf %dw, %dw : tensor<4x64x64xf32>
  return %dx, %s : tensor<64x512xf32>, tensor<4x64x64xf32>
}

// It stays when its operands die there and what follows allocates: moved
// down, the [256, 512] f32 operand would live through the next GEMM.
// CHECK-LABEL: func.func @stays(
// CHECK: moe.grouped_matmul_wgrad
// CHECK-NEXT: moe.grouped_matmul %arg1
func.func @stays(%x: tensor<256x64xf32>, %dy: tensor<256x64xf32>, %w1: tensor<4x512x64xf32>,
                 %off: tensor<5xi32>) -> (tensor<256x512xf32>, tensor<4x512x64xf32>) {
  %a = arith.addf %x, %x : tensor<256x64xf32>
  %big = moe.grouped_matmul %a, %w1, %off transpose_rhs
      : tensor<256x64xf32>, tensor<4x512x64xf32>, tensor<5xi32> -> tensor<256x512xf32>
  %dw = moe.grouped_matmul_wgrad %big, %dy, %off
      : tensor<256x512xf32>, tensor<256x64xf32>, tensor<5xi32> -> tensor<4x512x64xf32>
  %next = moe.grouped_matmul %dy, %w1, %off transpose_rhs
      : tensor<256x64xf32>, tensor<4x512x64xf32>, tensor<5xi32> -> tensor<256x512xf32>
  return %next, %dw : tensor<256x512xf32>, tensor<4x512x64xf32>
}

// Never past an exchange of rows (its overlap with compute is scheduled) or
// an op with memory effects.
// CHECK-LABEL: func.func @not_past_effects(
// CHECK: moe.grouped_matmul_wgrad
// CHECK-NEXT: memref.alloc
func.func @not_past_effects(%x: tensor<256x64xf32>, %dy: tensor<256x64xf32>, %w1: tensor<4x512x64xf32>,
                            %off: tensor<5xi32>, %w: tensor<64x4xf32>, %pos: tensor<64x4xi32>)
    -> (tensor<64x512xf32>, tensor<4x64x64xf32>, memref<4xf32>) {
  %dxr = moe.grouped_matmul %dy, %w1, %off transpose_rhs
      : tensor<256x64xf32>, tensor<4x512x64xf32>, tensor<5xi32> -> tensor<256x512xf32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %off
      : tensor<256x64xf32>, tensor<256x64xf32>, tensor<5xi32> -> tensor<4x64x64xf32>
  %m = memref.alloc() : memref<4xf32>
  %dx = moe.combine %dxr, %w, %pos
      : tensor<256x512xf32>, tensor<64x4xf32>, tensor<64x4xi32> -> tensor<64x512xf32>
  return %dx, %dw, %m : tensor<64x512xf32>, tensor<4x64x64xf32>, memref<4xf32>
}

// A weight gradient only rounded to bf16 (its kernel then writes bf16): the
// rounding runs right after the GEMM (its init moved up with it), and the
// pair moves as one past the combine and the sum, to where the fewest bytes
// are live (the f32 gradient counted as never existing).
// CHECK-LABEL: func.func @rounded(
// CHECK: %[[DXR:.*]] = moe.grouped_matmul %arg1
// CHECK-NEXT: %[[E:.*]] = tensor.empty() : tensor<4x64x64xbf16>
// CHECK-NEXT: %[[DX:.*]] = moe.combine %[[DXR]]
// CHECK-NEXT: %[[S:.*]] = arith.addf %[[DX]], %[[DX]]
// CHECK-NEXT: %[[DW:.*]] = moe.grouped_matmul_wgrad %arg0, %arg1, %arg3
// CHECK-NEXT: %[[R:.*]] = linalg.generic {{.*}} ins(%[[DW]] : tensor<4x64x64xf32>) outs(%[[E]] : tensor<4x64x64xbf16>)
// CHECK: return %[[S]], %[[R]]
func.func @rounded(%x: tensor<256x64xf32>, %dy: tensor<256x64xf32>, %w1: tensor<4x512x64xf32>,
                   %off: tensor<5xi32>, %w: tensor<64x4xf32>, %pos: tensor<64x4xi32>)
    -> (tensor<64x512xf32>, tensor<4x64x64xbf16>) {
  %dxr = moe.grouped_matmul %dy, %w1, %off transpose_rhs
      : tensor<256x64xf32>, tensor<4x512x64xf32>, tensor<5xi32> -> tensor<256x512xf32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %off
      : tensor<256x64xf32>, tensor<256x64xf32>, tensor<5xi32> -> tensor<4x64x64xf32>
  %dx = moe.combine %dxr, %w, %pos
      : tensor<256x512xf32>, tensor<64x4xf32>, tensor<64x4xi32> -> tensor<64x512xf32>
  %s = arith.addf %dx, %dx : tensor<64x512xf32>
  %e = tensor.empty() : tensor<4x64x64xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(e, k, n) -> (e, k, n)>, affine_map<(e, k, n) -> (e, k, n)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%dw : tensor<4x64x64xf32>) outs(%e : tensor<4x64x64xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<4x64x64xbf16>
  return %s, %r : tensor<64x512xf32>, tensor<4x64x64xbf16>
}
