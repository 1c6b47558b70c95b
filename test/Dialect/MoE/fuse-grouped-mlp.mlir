// RUN: moe-opt %s -moe-fuse-grouped-mlp | FileCheck %s
// The fused ops expand back to exactly the sequences matched here:
// RUN: moe-opt %s -moe-fuse-grouped-mlp -moe-expand-grouped-mlp | FileCheck %s --check-prefix=EXPAND
// With -moe-quantize before or after (the same fused ops, except where the
// graph rounds the activation to bf16 before the recipe's quantize):
// RUN: moe-opt %s -moe-fuse-grouped-mlp -moe-quantize | FileCheck %s --check-prefixes=FQ,BOTH
// RUN: moe-opt %s -moe-quantize -moe-fuse-grouped-mlp | FileCheck %s --check-prefixes=QF,BOTH

// -moe-fuse-grouped-mlp: GEMM1 -> SwiGLU -> (quantize) -> GEMM2 becomes
// moe.grouped_mlp; the backward (swiglu_grad and the grouped GEMMs around
// it) becomes moe.grouped_mlp_backward. What it refuses is at the end.

//===----------------------------------------------------------------------===//
// Forward
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @fwd_float
// CHECK-SAME: (%[[X:.*]]: tensor<64x32xbf16>, %[[W1:.*]]: tensor<4x32x64xbf16>, %[[W2:.*]]: tensor<4x32x32xbf16>, %[[OFF:.*]]: tensor<5xi32>)
// CHECK-NEXT: %[[Y:.*]] = moe.grouped_mlp %[[X]], %[[W1]], %[[W2]], %[[OFF]] layout(interleaved) {moe.layer = 2 : i64} : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xbf16>
// CHECK-NEXT: return %[[Y]]
// EXPAND-LABEL: func.func @fwd_float
// EXPAND-NEXT: %[[H:.*]] = moe.grouped_matmul %arg0, %arg1, %arg3 {moe.layer = 2 : i64} : {{.*}} -> tensor<64x64xf32>
// EXPAND-NEXT: %[[A:.*]] = moe.swiglu %[[H]] layout(interleaved) {moe.layer = 2 : i64} : tensor<64x64xf32> -> tensor<64x32xbf16>
// EXPAND-NEXT: %[[Y:.*]] = moe.grouped_matmul %[[A]], %arg2, %arg3 {moe.layer = 2 : i64} : {{.*}} -> tensor<64x32xbf16>
// EXPAND-NEXT: return %[[Y]]
// Fused first, MXFP8 quantizes the fused op's operands (and so its f32
// activation). Quantized first, the bf16 activation gets quantized: two
// roundings, not grouped_mlp's one, so that stays unfused.
// FQ-LABEL: func.func @fwd_float
// FQ-COUNT-3: moe.quantize
// FQ-NEXT: moe.grouped_mlp {{.*}} layout(interleaved) {moe.layer = 2 : i64} : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x32xbf16>
// QF-LABEL: func.func @fwd_float
// QF-NOT: moe.grouped_mlp
// QF: moe.swiglu {{.*}} -> tensor<64x32xbf16>
// QF-NEXT: moe.quantize %{{.*}} : tensor<64x32xbf16> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
func.func @fwd_float(%x: tensor<64x32xbf16>, %w1: tensor<4x32x64xbf16>, %w2: tensor<4x32x32xbf16>,
                     %off: tensor<5xi32>) -> tensor<64x32xbf16> {
  %h = moe.grouped_matmul %x, %w1, %off {moe.layer = 2}
      : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x64xf32>
  // The activation is rounded once to w2's element type.
  %a = moe.swiglu %h layout(interleaved) {moe.layer = 2} : tensor<64x64xf32> -> tensor<64x32xbf16>
  %y = moe.grouped_matmul %a, %w2, %off {moe.layer = 2}
      : tensor<64x32xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xbf16>
  return %y : tensor<64x32xbf16>
}

// MXFP8: the activation is quantized rowwise to w2's MX type; the scale mode
// of that quantize becomes the op's.
// CHECK-LABEL: func.func @fwd_mx
// CHECK-SAME: (%[[X:.*]]: !moe.mx<64x32xf8E4M3FN, axis = 1>, %[[W1:.*]]: !moe.mx<4x32x64xf8E4M3FN, axis = 1>, %[[W2:.*]]: !moe.mx<4x32x32xf8E4M3FN, axis = 1>, %[[OFF:.*]]: tensor<5xi32>)
// CHECK-NEXT: %[[Y:.*]] = moe.grouped_mlp %[[X]], %[[W1]], %[[W2]], %[[OFF]] scale(floor) : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x32xf32>
// CHECK-NEXT: return %[[Y]]
// EXPAND-LABEL: func.func @fwd_mx
// EXPAND-NEXT: moe.grouped_matmul
// EXPAND-NEXT: moe.swiglu %{{.*}} : tensor<64x64xf32> -> tensor<64x32xf32>
// EXPAND-NEXT: moe.quantize %{{.*}} scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
// EXPAND-NEXT: moe.grouped_matmul
func.func @fwd_mx(%x: !moe.mx<64x32xf8E4M3FN, axis = 1>, %w1: !moe.mx<4x32x64xf8E4M3FN, axis = 1>,
                  %w2: !moe.mx<4x32x32xf8E4M3FN, axis = 1>, %off: tensor<5xi32>) -> tensor<64x32xf32> {
  %h = moe.grouped_matmul %x, %w1, %off
      : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %q = moe.quantize %a scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %q, %w2, %off
      : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x32xf32>
  return %y : tensor<64x32xf32>
}

// The bf16 recipe's rounding of an f32 SwiGLU before a bf16 w2 is the
// rounding SwiGLU itself does: fused.
// CHECK-LABEL: func.func @fwd_bf16_rounded
// CHECK: %[[XB:.*]] = linalg.generic
// CHECK-NOT: linalg.generic
// CHECK: %[[Y:.*]] = moe.grouped_mlp %[[XB]], %arg1, %arg2, %arg3 : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xf32>
// CHECK-NEXT: return %[[Y]]
#id = affine_map<(i, j) -> (i, j)>
func.func @fwd_bf16_rounded(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xbf16>, %w2: tensor<4x32x32xbf16>,
                            %off: tensor<5xi32>) -> tensor<64x32xf32> {
  %e = tensor.empty() : tensor<64x32xbf16>
  %xb = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<64x32xf32>) outs(%e : tensor<64x32xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<64x32xbf16>
  %h = moe.grouped_matmul %xb, %w1, %off
      : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %ab = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<64x32xf32>) outs(%e : tensor<64x32xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<64x32xbf16>
  %y = moe.grouped_matmul %ab, %w2, %off
      : tensor<64x32xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  return %y : tensor<64x32xf32>
}

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

// Backward alone: h and a exist only for it; they are recomputed by the op.
// CHECK-LABEL: func.func @bwd_float
// CHECK-SAME: (%[[X:.*]]: tensor<64x32xf32>, %[[W1:.*]]: tensor<4x32x64xf32>, %[[W2:.*]]: tensor<4x32x32xf32>, %[[OFF:.*]]: tensor<5xi32>, %[[DY:.*]]: tensor<64x32xf32>)
// CHECK-NEXT: %[[DX:.*]], %[[DW1:.*]], %[[DW2:.*]] = moe.grouped_mlp_backward %[[X]], %[[W1]], %[[W2]], %[[OFF]], %[[DY]] layout(interleaved) : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32> -> tensor<64x32xbf16>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
// CHECK-NEXT: return %[[DX]], %[[DW1]], %[[DW2]]
// EXPAND-LABEL: func.func @bwd_float
// EXPAND-NEXT: %[[H:.*]] = moe.grouped_matmul %arg0, %arg1, %arg3 : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
// (In the order that frees buffers soonest: the data gradients, w1's
// gradient, and w2's last: the activation and dy, 16 KB, are not larger
// than its result; see bwd_many_rows.)
// EXPAND-NEXT: %[[A:.*]] = moe.swiglu %[[H]] layout(interleaved) : tensor<64x64xf32> -> tensor<64x32xf32>
// EXPAND-NEXT: %[[DA:.*]] = moe.grouped_matmul %arg4, %arg2, %arg3 transpose_rhs : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
// EXPAND-NEXT: %[[DH:.*]] = moe.swiglu_grad %[[H]], %[[DA]] layout(interleaved) : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
// EXPAND-NEXT: %[[DX:.*]] = moe.grouped_matmul %[[DH]], %arg1, %arg3 transpose_rhs : tensor<64x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xbf16>
// EXPAND-NEXT: %[[DW1:.*]] = moe.grouped_matmul_wgrad %arg0, %[[DH]], %arg3 : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
// EXPAND-NEXT: %[[DW2:.*]] = moe.grouped_matmul_wgrad %[[A]], %arg4, %arg3 : tensor<64x32xf32>, tensor<64x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
// EXPAND-NEXT: return %[[DX]], %[[DW1]], %[[DW2]]
// BOTH-LABEL: func.func @bwd_float
// BOTH-NEXT: moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 layout(interleaved) gemm_type(f8E4M3FN) :
func.func @bwd_float(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                     %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xbf16>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h layout(interleaved) : tensor<64x64xf32> -> tensor<64x32xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off : tensor<64x32xf32>, tensor<64x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da layout(interleaved) : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %dx = moe.grouped_matmul %dh, %w1, %off transpose_rhs : tensor<64x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xbf16>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  return %dx, %dw1, %dw2 : tensor<64x32xbf16>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

// Many rows: the activation and dy (2 x 32 KB) are larger than w2's
// gradient (16 KB), which is then computed first, releasing them.
// EXPAND-LABEL: func.func @bwd_many_rows
// EXPAND-NEXT: %[[H:.*]] = moe.grouped_matmul %arg0, %arg1, %arg3
// EXPAND-NEXT: %[[A:.*]] = moe.swiglu %[[H]]
// EXPAND-NEXT: %[[DW2:.*]] = moe.grouped_matmul_wgrad %[[A]], %arg4, %arg3
// EXPAND-NEXT: %[[DA:.*]] = moe.grouped_matmul %arg4, %arg2, %arg3 transpose_rhs
// EXPAND-NEXT: %[[DH:.*]] = moe.swiglu_grad %[[H]], %[[DA]]
// EXPAND-NEXT: %[[DX:.*]] = moe.grouped_matmul %[[DH]], %arg1, %arg3 transpose_rhs
// EXPAND-NEXT: %[[DW1:.*]] = moe.grouped_matmul_wgrad %arg0, %[[DH]], %arg3
// EXPAND-NEXT: return %[[DX]], %[[DW1]], %[[DW2]]
func.func @bwd_many_rows(%x: tensor<256x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                         %off: tensor<5xi32>, %dy: tensor<256x32xf32>)
    -> (tensor<256x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<256x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<256x64xf32>
  %a = moe.swiglu %h : tensor<256x64xf32> -> tensor<256x32xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off : tensor<256x32xf32>, tensor<256x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<256x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<256x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<256x64xf32>, tensor<256x32xf32> -> tensor<256x64xf32>
  %dx = moe.grouped_matmul %dh, %w1, %off transpose_rhs : tensor<256x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<256x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<256x32xf32>, tensor<256x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  return %dx, %dw1, %dw2 : tensor<256x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

// Forward and backward of one MLP in one function, every GEMM operand
// quantized as -moe-quantize does (the forward's h and a also feed the
// backward): both fuse, nothing of the forward is kept for the backward.
// CHECK-LABEL: func.func @fwd_bwd_mx
// CHECK-SAME: (%[[X:.*]]: tensor<64x32xf32>, %[[W1:.*]]: tensor<4x32x64xf32>, %[[W2:.*]]: tensor<4x32x32xf32>, %[[OFF:.*]]: tensor<5xi32>, %[[DY:.*]]: tensor<64x32xf32>)
// CHECK: %[[QX:.*]] = moe.quantize %[[X]] scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
// CHECK-NEXT: %[[QW1:.*]] = moe.quantize %[[W1]] scale(floor) : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 1>
// CHECK-NEXT: %[[QW2:.*]] = moe.quantize %[[W2]] scale(floor) : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 1>
// CHECK-NEXT: %[[Y:.*]] = moe.grouped_mlp %[[QX]], %[[QW1]], %[[QW2]], %[[OFF]] scale(floor)
// CHECK-NEXT: %[[DX:.*]], %[[DW1:.*]], %[[DW2:.*]] = moe.grouped_mlp_backward %[[X]], %[[W1]], %[[W2]], %[[OFF]], %[[DY]] gemm_type(f8E4M3FN) scale(floor)
// CHECK-NEXT: return %[[Y]], %[[DX]], %[[DW1]], %[[DW2]]
// EXPAND-LABEL: func.func @fwd_bwd_mx
// 3 quantizes of the fused forward's operands, its activation's, and the
// backward's 10 (every operand of its 5 GEMMs: x, w1, dy and dh along two axes).
// EXPAND-COUNT-14: moe.quantize {{.*}} scale(floor)
// EXPAND-NOT: moe.quantize
// EXPAND: return
func.func @fwd_bwd_mx(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                      %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %qx = moe.quantize %x scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw1 = moe.quantize %w1 scale(floor) : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 1>
  %h = moe.grouped_matmul %qx, %qw1, %off : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %qa = moe.quantize %a scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw2 = moe.quantize %w2 scale(floor) : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %qa, %qw2, %off : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x32xf32>
  // Backward.
  %qdy = moe.quantize %dy scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw2t = moe.quantize %w2 scale(floor) : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 2>
  %da = moe.grouped_matmul %qdy, %qw2t, %off transpose_rhs : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %qdh = moe.quantize %dh scale(floor) : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 1>
  %qw1t = moe.quantize %w1 scale(floor) : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 2>
  %dx = moe.grouped_matmul %qdh, %qw1t, %off transpose_rhs : !moe.mx<64x64xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<64x32xf32>
  %qxc = moe.quantize %x scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %qdhc = moe.quantize %dh scale(floor) : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 0>
  %dw1 = moe.grouped_matmul_wgrad %qxc, %qdhc, %off : !moe.mx<64x32xf8E4M3FN, axis = 0>, !moe.mx<64x64xf8E4M3FN, axis = 0>, tensor<5xi32> -> tensor<4x32x64xf32>
  %qac = moe.quantize %a scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %qdyc = moe.quantize %dy scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %dw2 = moe.grouped_matmul_wgrad %qac, %qdyc, %off : !moe.mx<64x32xf8E4M3FN, axis = 0>, !moe.mx<64x32xf8E4M3FN, axis = 0>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

// bf16 recipe: f32 operands rounded (one rounding of dh shared by both of
// its GEMMs, as after CSE); bf16 operands (x here) used as they are.
// CHECK-LABEL: func.func @bwd_bf16
// CHECK-NOT: moe.swiglu
// CHECK: %[[DX:.*]], %[[DW1:.*]], %[[DW2:.*]] = moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 gemm_type(bf16) : tensor<64x32xbf16>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>
// CHECK-NEXT: return %[[DX]], %[[DW1]], %[[DW2]]
// EXPAND-LABEL: func.func @bwd_bf16
// EXPAND: moe.swiglu %{{.*}} : tensor<64x64xf32> -> tensor<64x32xbf16>
// EXPAND-COUNT-6: linalg.generic
// EXPAND-NOT: linalg.generic
// EXPAND: return
func.func @bwd_bf16(%x: tensor<64x32xbf16>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                    %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %e1 = tensor.empty() : tensor<4x32x64xbf16>
  %w1b = linalg.generic {indexing_maps = [affine_map<(e, i, j) -> (e, i, j)>, affine_map<(e, i, j) -> (e, i, j)>],
                         iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w1 : tensor<4x32x64xf32>) outs(%e1 : tensor<4x32x64xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<4x32x64xbf16>
  %e2 = tensor.empty() : tensor<4x32x32xbf16>
  %w2b = linalg.generic {indexing_maps = [affine_map<(e, i, j) -> (e, i, j)>, affine_map<(e, i, j) -> (e, i, j)>],
                         iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w2 : tensor<4x32x32xf32>) outs(%e2 : tensor<4x32x32xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<4x32x32xbf16>
  %e3 = tensor.empty() : tensor<64x32xbf16>
  %dyb = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%dy : tensor<64x32xf32>) outs(%e3 : tensor<64x32xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<64x32xbf16>
  %h = moe.grouped_matmul %x, %w1b, %off : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x64xf32>
  // a bf16 SwiGLU is the f32 one rounded by the recipe.
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xbf16>
  %da = moe.grouped_matmul %dyb, %w2b, %off transpose_rhs : tensor<64x32xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %e4 = tensor.empty() : tensor<64x64xbf16>
  %dhb = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%dh : tensor<64x64xf32>) outs(%e4 : tensor<64x64xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<64x64xbf16>
  %dx = moe.grouped_matmul %dhb, %w1b, %off transpose_rhs : tensor<64x64xbf16>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dhb, %off : tensor<64x32xbf16>, tensor<64x64xbf16>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dyb, %off : tensor<64x32xbf16>, tensor<64x32xbf16>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

//===----------------------------------------------------------------------===//
// Refused: the sequence is not exactly the fused op's definition, or an
// intermediate is needed elsewhere.
//===----------------------------------------------------------------------===//

// Two different offsets values (even with equal contents).
// CHECK-LABEL: func.func @refuse_offsets
// CHECK-NOT: moe.grouped_mlp
// CHECK: moe.grouped_matmul
// CHECK: moe.swiglu
// CHECK: moe.grouped_matmul
func.func @refuse_offsets(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                          %off: tensor<5xi32>, %off2: tensor<5xi32>) -> tensor<64x32xf32> {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %y = moe.grouped_matmul %a, %w2, %off2 : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  return %y : tensor<64x32xf32>
}

// h is needed elsewhere: fusing would not save it.
// CHECK-LABEL: func.func @refuse_h_used
// CHECK-NOT: moe.grouped_mlp
// CHECK: return
func.func @refuse_h_used(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                         %off: tensor<5xi32>) -> (tensor<64x32xf32>, tensor<64x64xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %y = moe.grouped_matmul %a, %w2, %off : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  return %y, %h : tensor<64x32xf32>, tensor<64x64xf32>
}

// The activation is needed elsewhere.
// CHECK-LABEL: func.func @refuse_a_used
// CHECK-NOT: moe.grouped_mlp
// CHECK: return
func.func @refuse_a_used(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                         %off: tensor<5xi32>) -> (tensor<64x32xf32>, tensor<64x32xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %y = moe.grouped_matmul %a, %w2, %off : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  return %y, %a : tensor<64x32xf32>, tensor<64x32xf32>
}

// h rounded to bf16 (grouped_mlp's h is f32).
// CHECK-LABEL: func.func @refuse_h_bf16
// CHECK-NOT: moe.grouped_mlp
// CHECK: return
func.func @refuse_h_bf16(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                         %off: tensor<5xi32>) -> tensor<64x32xf32> {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xbf16>
  %a = moe.swiglu %h : tensor<64x64xbf16> -> tensor<64x32xf32>
  %y = moe.grouped_matmul %a, %w2, %off : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  return %y : tensor<64x32xf32>
}

// The activation is bf16 before the quantize (grouped_mlp quantizes the f32
// SwiGLU: one rounding, not two).
// CHECK-LABEL: func.func @refuse_double_rounding
// CHECK-NOT: moe.grouped_mlp
// CHECK: moe.quantize
// CHECK: return
func.func @refuse_double_rounding(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>,
                                  %w2: !moe.mx<4x32x32xf8E4M3FN, axis = 1>, %off: tensor<5xi32>) -> tensor<64x32xf32> {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xbf16>
  %q = moe.quantize %a : tensor<64x32xbf16> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %q, %w2, %off : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x32xf32>
  return %y : tensor<64x32xf32>
}

// The activation's MX elements differ from w2's.
// CHECK-LABEL: func.func @refuse_other_mx_type
// CHECK-NOT: moe.grouped_mlp
// CHECK: return
func.func @refuse_other_mx_type(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>,
                                %w2: !moe.mx<4x32x32xf8E4M3FN, axis = 1>, %off: tensor<5xi32>) -> tensor<64x32xf32> {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %q = moe.quantize %a : tensor<64x32xf32> -> !moe.mx<64x32xf8E5M2, axis = 1>
  %y = moe.grouped_matmul %q, %w2, %off : !moe.mx<64x32xf8E5M2, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x32xf32>
  return %y : tensor<64x32xf32>
}

// An f32 activation into a GEMM with a bf16 w2 (grouped_mlp would round it).
// CHECK-LABEL: func.func @refuse_unrounded
// CHECK-NOT: moe.grouped_mlp
// CHECK: return
func.func @refuse_unrounded(%x: tensor<64x32xbf16>, %w1: tensor<4x32x64xbf16>, %w2: tensor<4x32x32xbf16>,
                            %off: tensor<5xi32>) -> tensor<64x32xf32> {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %y = moe.grouped_matmul %a, %w2, %off : tensor<64x32xf32>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  return %y : tensor<64x32xf32>
}

// Backward: dh is needed elsewhere.
// CHECK-LABEL: func.func @refuse_bwd_dh_used
// CHECK-NOT: moe.grouped_mlp_backward
// CHECK: moe.swiglu_grad
// CHECK: return
func.func @refuse_bwd_dh_used(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                              %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<64x64xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %dx = moe.grouped_matmul %dh, %w1, %off transpose_rhs : tensor<64x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off : tensor<64x32xf32>, tensor<64x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %dx, %dw1, %dw2, %dh : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<64x64xf32>
}

// Backward: the data gradient uses another weight than GEMM1.
// CHECK-LABEL: func.func @refuse_bwd_other_weight
// CHECK-NOT: moe.grouped_mlp_backward
// CHECK: return
func.func @refuse_bwd_other_weight(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w1b: tensor<4x32x64xf32>,
                                   %w2: tensor<4x32x32xf32>, %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %dx = moe.grouped_matmul %dh, %w1b, %off transpose_rhs : tensor<64x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off : tensor<64x32xf32>, tensor<64x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

// Backward: a mix of quantized and unquantized GEMM operands (dh feeds the
// w1 gradient unquantized) is no recipe of the fused op.
// CHECK-LABEL: func.func @refuse_bwd_mixed
// CHECK-NOT: moe.grouped_mlp_backward
// CHECK: return
func.func @refuse_bwd_mixed(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                            %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %qdh = moe.quantize %dh : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 1>
  %dx = moe.grouped_matmul %qdh, %w1, %off transpose_rhs : !moe.mx<64x64xf8E4M3FN, axis = 1>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off : tensor<64x32xf32>, tensor<64x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

// Backward: the activation's layout is not the gradient's.
// CHECK-LABEL: func.func @refuse_bwd_layout
// CHECK-NOT: moe.grouped_mlp_backward
// CHECK: return
func.func @refuse_bwd_layout(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                             %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h layout(interleaved) : tensor<64x64xf32> -> tensor<64x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %dx = moe.grouped_matmul %dh, %w1, %off transpose_rhs : tensor<64x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off : tensor<64x32xf32>, tensor<64x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

// Backward: quantized with two scale modes.
// CHECK-LABEL: func.func @refuse_bwd_scale_modes
// CHECK-NOT: moe.grouped_mlp_backward
// CHECK: return
func.func @refuse_bwd_scale_modes(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                                  %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %qx = moe.quantize %x : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw1 = moe.quantize %w1 : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 1>
  %h = moe.grouped_matmul %qx, %qw1, %off : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %qdy = moe.quantize %dy : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw2t = moe.quantize %w2 : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 2>
  %da = moe.grouped_matmul %qdy, %qw2t, %off transpose_rhs : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %qdh = moe.quantize %dh : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 1>
  %qw1t = moe.quantize %w1 : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 2>
  %dx = moe.grouped_matmul %qdh, %qw1t, %off transpose_rhs : !moe.mx<64x64xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<64x32xf32>
  %qxc = moe.quantize %x : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %qdhc = moe.quantize %dh scale(floor) : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 0>
  %dw1 = moe.grouped_matmul_wgrad %qxc, %qdhc, %off : !moe.mx<64x32xf8E4M3FN, axis = 0>, !moe.mx<64x64xf8E4M3FN, axis = 0>, tensor<5xi32> -> tensor<4x32x64xf32>
  %qac = moe.quantize %a : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %qdyc = moe.quantize %dy : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %dw2 = moe.grouped_matmul_wgrad %qac, %qdyc, %off : !moe.mx<64x32xf8E4M3FN, axis = 0>, !moe.mx<64x32xf8E4M3FN, axis = 0>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

// Backward without a w2 gradient (w2 frozen): nothing to fuse into the op's
// three results.
// CHECK-LABEL: func.func @refuse_bwd_no_dw2
// CHECK-NOT: moe.grouped_mlp_backward
// CHECK: return
func.func @refuse_bwd_no_dw2(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                             %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<4x32x64xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %dx = moe.grouped_matmul %dh, %w1, %off transpose_rhs : tensor<64x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  return %dx, %dw1 : tensor<64x32xf32>, tensor<4x32x64xf32>
}

// Backward with dynamic rows and a dynamic w1 gate/up width: the op needs
// that width statically, so nothing is fused.
// CHECK-LABEL: func.func @refuse_bwd_dynamic_gate_up
// CHECK-NOT: moe.grouped_mlp_backward
// CHECK: return
func.func @refuse_bwd_dynamic_gate_up(%x: tensor<?x32xf32>, %w1: tensor<4x32x?xf32>, %w2: tensor<4x32x32xf32>,
                                      %off: tensor<5xi32>, %dy: tensor<?x32xf32>)
    -> (tensor<?x32xf32>, tensor<4x32x?xf32>, tensor<4x32x32xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<?x32xf32>, tensor<4x32x?xf32>, tensor<5xi32> -> tensor<?x64xf32>
  %a = moe.swiglu %h : tensor<?x64xf32> -> tensor<?x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<?x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<?x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<?x64xf32>, tensor<?x32xf32> -> tensor<?x64xf32>
  %dx = moe.grouped_matmul %dh, %w1, %off transpose_rhs : tensor<?x64xf32>, tensor<4x32x?xf32>, tensor<5xi32> -> tensor<?x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<?x32xf32>, tensor<?x64xf32>, tensor<5xi32> -> tensor<4x32x?xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off : tensor<?x32xf32>, tensor<?x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %dx, %dw1, %dw2 : tensor<?x32xf32>, tensor<4x32x?xf32>, tensor<4x32x32xf32>
}

// Dynamic rows are fine.
// CHECK-LABEL: func.func @bwd_dynamic_rows
// CHECK-NEXT: moe.grouped_mlp_backward {{.*}} : tensor<?x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<?x32xf32> -> tensor<?x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
func.func @bwd_dynamic_rows(%x: tensor<?x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                            %off: tensor<5xi32>, %dy: tensor<?x32xf32>)
    -> (tensor<?x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<?x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<?x64xf32>
  %a = moe.swiglu %h : tensor<?x64xf32> -> tensor<?x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<?x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<?x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<?x64xf32>, tensor<?x32xf32> -> tensor<?x64xf32>
  %dx = moe.grouped_matmul %dh, %w1, %off transpose_rhs : tensor<?x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<?x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<?x32xf32>, tensor<?x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off : tensor<?x32xf32>, tensor<?x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %dx, %dw1, %dw2 : tensor<?x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

// MXFP8 with F = 16: the backward never blocks along F (2F = 32 is), so it
// fuses into a valid op.
// CHECK-LABEL: func.func @bwd_mx_small_ffn
// CHECK: moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 gemm_type(f8E4M3FN) : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<4x16x32xf32>
func.func @bwd_mx_small_ffn(%x: tensor<64x32xf32>, %w1: tensor<4x32x32xf32>, %w2: tensor<4x16x32xf32>,
                            %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<4x16x32xf32>) {
  %qx = moe.quantize %x : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw1 = moe.quantize %w1 : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 1>
  %h = moe.grouped_matmul %qx, %qw1, %off : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x32xf32>
  %a = moe.swiglu %h : tensor<64x32xf32> -> tensor<64x16xf32>
  %qdy = moe.quantize %dy : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw2t = moe.quantize %w2 : tensor<4x16x32xf32> -> !moe.mx<4x16x32xf8E4M3FN, axis = 2>
  %da = moe.grouped_matmul %qdy, %qw2t, %off transpose_rhs : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x16x32xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<64x16xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x32xf32>, tensor<64x16xf32> -> tensor<64x32xf32>
  %qdh = moe.quantize %dh : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw1t = moe.quantize %w1 : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 2>
  %dx = moe.grouped_matmul %qdh, %qw1t, %off transpose_rhs : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<64x32xf32>
  %qxc = moe.quantize %x : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %qdhc = moe.quantize %dh : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %dw1 = moe.grouped_matmul_wgrad %qxc, %qdhc, %off : !moe.mx<64x32xf8E4M3FN, axis = 0>, !moe.mx<64x32xf8E4M3FN, axis = 0>, tensor<5xi32> -> tensor<4x32x32xf32>
  %qac = moe.quantize %a : tensor<64x16xf32> -> !moe.mx<64x16xf8E4M3FN, axis = 0>
  %qdyc = moe.quantize %dy : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %dw2 = moe.grouped_matmul_wgrad %qac, %qdyc, %off : !moe.mx<64x16xf8E4M3FN, axis = 0>, !moe.mx<64x32xf8E4M3FN, axis = 0>, tensor<5xi32> -> tensor<4x16x32xf32>
  return %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<4x16x32xf32>
}

// The backward's GEMMs in another block than the SwiGLU gradient.
// CHECK-LABEL: func.func @refuse_bwd_other_block
// CHECK-NOT: moe.grouped_mlp_backward
// CHECK: return
func.func @refuse_bwd_other_block(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                                  %off: tensor<5xi32>, %dy: tensor<64x32xf32>, %c: i1)
    -> (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %dx = scf.if %c -> tensor<64x32xf32> {
    %d = moe.grouped_matmul %dh, %w1, %off transpose_rhs : tensor<64x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xf32>
    scf.yield %d : tensor<64x32xf32>
  } else {
    scf.yield %dy : tensor<64x32xf32>
  }
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off : tensor<64x32xf32>, tensor<64x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}
