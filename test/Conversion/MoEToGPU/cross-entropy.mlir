// moe.cross_entropy and moe.cross_entropy_grad become the cross-entropy
// kernels (a CTA a row): the IR -moe-gpu-dedicated-kernels produces, the PTX,
// and ptxas accepting it. test/Integration/GPU/model_ops.mlir runs them
// against the CPU.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_100a | FileCheck %s --check-prefix=SM100
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_80 | FileCheck %s --check-prefix=NOKERNEL

// VERIFY: ptxas accepted 18 kernel modules for sm_90a
// NOKERNEL-NOT: moe_xent
// SM100: call @moe_xent_lse_64x1000_f32_i32(

// The loss and its gradient: the gradient reuses the loss's row statistics.
// Rows of 1000 f32 (vectors of 4): 256 threads a row.
// CHECK-LABEL: func.func @loss_and_grad
// CHECK: %[[LSE:.*]] = call @moe_xent_lse_64x1000_f32_i32(%[[L:.*]]) : (tensor<64x1000xf32>) -> tensor<64xf32>
// CHECK: %[[ONE:.*]] = call @moe_xent_loss_64x1000_f32_i32(%[[L]], %[[Y:.*]], %[[LSE]])
// CHECK: %[[LOSS:.*]] = tensor.collapse_shape %[[ONE]] [] : tensor<1xf32> into tensor<f32>
// CHECK: %[[S:.*]] = call @moe_xent_scale_64x1000_f32_i32(%[[Y]], %[[G:.*]]) : (tensor<64xi32>, tensor<f32>) -> tensor<1xf32>
// CHECK-NOT: moe_xent_lse
// CHECK: %[[D:.*]] = call @moe_xent_grad_64x1000_f32_i32_to_f32(%[[L]], %[[Y]], %[[LSE]], %[[S]])
// CHECK-NOT: moe.cross_entropy
// CHECK: return %[[LOSS]], %[[D]]
// PTX: .entry moe_xent_lse_64x1000_f32_i32_kernel
// PTX: ld.global.v4.b32
// PTX: .entry moe_xent_grad_64x1000_f32_i32_to_f32_kernel
func.func @loss_and_grad(%l: tensor<64x1000xf32>, %y: tensor<64xi32>, %g: tensor<f32>)
    -> (tensor<f32>, tensor<64x1000xf32>) {
  %loss = moe.cross_entropy %l, %y : tensor<64x1000xf32>, tensor<64xi32> -> tensor<f32>
  %d = moe.cross_entropy_grad %l, %y, %g : tensor<64x1000xf32>, tensor<64xi32>, tensor<f32> -> tensor<64x1000xf32>
  return %loss, %d : tensor<f32>, tensor<64x1000xf32>
}

// Every user rounds the gradient to bf16 (the recipes' LM-head GEMM
// operands, one through a reshape): the kernel writes bf16 and the roundings
// go. A gradient without its loss computes the row statistics itself.
// CHECK-LABEL: func.func @rounded
// CHECK: %[[LSE:.*]] = call @moe_xent_lse_32x24_f32_i64(
// CHECK: %[[D:.*]] = call @moe_xent_grad_32x24_f32_i64_to_bf16({{.*}}, %[[LSE]], {{.*}}) : ({{.*}}) -> tensor<32x24xbf16>
// CHECK-NOT: arith.truncf
// CHECK: %[[E:.*]] = tensor.expand_shape %[[D]] {{\[\[}}0, 1], [2]] output_shape [1, 32, 24] : tensor<32x24xbf16> into tensor<1x32x24xbf16>
// CHECK: return %[[D]], %[[E]]
func.func @rounded(%l: tensor<32x24xf32>, %y: tensor<32xi64>, %g: tensor<f32>)
    -> (tensor<32x24xbf16>, tensor<1x32x24xbf16>) {
  %d = moe.cross_entropy_grad %l, %y, %g : tensor<32x24xf32>, tensor<32xi64>, tensor<f32> -> tensor<32x24xf32>
  %e = tensor.empty() : tensor<32x24xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(n, v) -> (n, v)>, affine_map<(n, v) -> (n, v)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%d : tensor<32x24xf32>) outs(%e : tensor<32x24xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<32x24xbf16>
  %x = tensor.expand_shape %d [[0, 1], [2]] output_shape [1, 32, 24] : tensor<32x24xf32> into tensor<1x32x24xf32>
  %e3 = tensor.empty() : tensor<1x32x24xbf16>
  %r3 = linalg.generic {indexing_maps = [affine_map<(a, n, v) -> (a, n, v)>, affine_map<(a, n, v) -> (a, n, v)>],
                        iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x : tensor<1x32x24xf32>) outs(%e3 : tensor<1x32x24xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<1x32x24xbf16>
  return %r, %r3 : tensor<32x24xbf16>, tensor<1x32x24xbf16>
}

// A user that reads the f32 gradient keeps it f32 (and its rounding stays).
// CHECK-LABEL: func.func @kept
// CHECK: call @moe_xent_grad_32x24_f32_i64_to_f32(
// CHECK: arith.truncf
func.func @kept(%l: tensor<32x24xf32>, %y: tensor<32xi64>, %g: tensor<f32>)
    -> (tensor<32x24xbf16>, tensor<32x24xf32>) {
  %d = moe.cross_entropy_grad %l, %y, %g : tensor<32x24xf32>, tensor<32xi64>, tensor<f32> -> tensor<32x24xf32>
  %e = tensor.empty() : tensor<32x24xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(n, v) -> (n, v)>, affine_map<(n, v) -> (n, v)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%d : tensor<32x24xf32>) outs(%e : tensor<32x24xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<32x24xbf16>
  return %r, %d : tensor<32x24xbf16>, tensor<32x24xf32>
}

// Dynamic shapes keep the generic lowering.
// CHECK-LABEL: func.func @dynamic
// CHECK: moe.cross_entropy
func.func @dynamic(%l: tensor<?x24xf32>, %y: tensor<?xi32>) -> tensor<f32> {
  %loss = moe.cross_entropy %l, %y : tensor<?x24xf32>, tensor<?xi32> -> tensor<f32>
  return %loss : tensor<f32>
}
