// Dense GEMMs on the grouped GEMM kernels (-moe-dense-to-grouped: one group
// of all rows), forward and backward, in bf16 (the dense precision of the
// bf16 and mxfp8 recipes), on the GPU against the CPU (scripts/gpu-check.sh
// runs the passes of the GPU-CHECK-PASSES line first). An LM head's shapes,
// smaller: x @ w with w [K, N], then a projection read transposed (w2 [N2,
// N], as tied embeddings are), into cross-entropy. Both sides accumulate in
// f32 in other orders, and the f32 values computed in between (h, the
// logits' gradient) are then rounded to bf16 for the next GEMM: where the
// two sides' f32 values straddle a rounding boundary, that element differs
// by one bf16 ulp (2^-8 relative), about 1% of them. The loss agrees to a
// few ulps; the gradients to 1e-3 of their norm (measured: 1.3e-4).
// GPU-CHECK-PASSES: -moe-dense-to-grouped -moe-autodiff -moe-quantize=recipe=bf16
// RUN: moe-opt %s -moe-dense-to-grouped -moe-autodiff -moe-quantize=recipe=bf16 | moe-compile - --target=sm_90a --verify-ptx -o %t.so | FileCheck %s
// CHECK: ptxas accepted {{[0-9]+}} kernel modules for sm_90a
// RUN: moe-opt %s -moe-dense-to-grouped -moe-autodiff -moe-quantize=recipe=bf16 | moe-compile - --target=sm_90a --emit-ptx=%t.ptx -o %t.so
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// Every GEMM on a wgmma kernel: forward, data gradients (one with the
// weight transposed, one with it plain) and weight gradients.
// PTX-DAG: .entry moe_wgmma_gmm_256x512x1024_e1_bf16_i32_tma_kernel
// PTX-DAG: .entry moe_wgmma_gmm_256x1024x768_e1_bf16_rhsT_i32
// PTX-DAG: .entry moe_wgmma_gmm_256x768x1024_e1_bf16_i32
// PTX-DAG: .entry moe_wgmma_gmm_256x1024x512_e1_bf16_rhsT_i32
// PTX-DAG: .entry moe_wgmma_wgrad_256x512x1024_e1_bf16_i32
// PTX-DAG: .entry moe_wgmma_wgrad_256x768x1024_e1_bf16_i32
// RUN: moe-opt %s -moe-dense-to-grouped -moe-autodiff -moe-quantize=recipe=bf16 | moe-compile - --target=cpu -o %t.cpu.so

func.func @loss(%x: tensor<256x512xf32>, %w: tensor<512x1024xf32>, %w2: tensor<768x1024xf32>,
                %labels: tensor<256xi32> {moe.test_range = [0, 768]}) -> tensor<f32>
    attributes {moe.test_tolerance = [1.0e-5, 1.0e-3, 1.0e-3]} {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<256x1024xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  %h = linalg.matmul ins(%x, %w : tensor<256x512xf32>, tensor<512x1024xf32>) outs(%z : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  %et = tensor.empty() : tensor<1024x768xf32>
  %w2t = linalg.transpose ins(%w2 : tensor<768x1024xf32>) outs(%et : tensor<1024x768xf32>) permutation = [1, 0]
  %e2 = tensor.empty() : tensor<256x768xf32>
  %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<256x768xf32>) -> tensor<256x768xf32>
  %logits = linalg.matmul ins(%h, %w2t : tensor<256x1024xf32>, tensor<1024x768xf32>) outs(%z2 : tensor<256x768xf32>) -> tensor<256x768xf32>
  %l = moe.cross_entropy %logits, %labels : tensor<256x768xf32>, tensor<256xi32> -> tensor<f32>
  return %l : tensor<f32>
}
