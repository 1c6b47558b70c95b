// The expert MLP with every SwiGLU epilogue writing its activation's MX
// encoding (8-bit elements and E8M0 scales) for the TMA GEMMs after it,
// which dequantize it in shared memory (--mx-activations=always; by
// default only where that lowers the peak of live tensors, so
// kernels.mlir's small functions keep the bf16 rounding). On the GPU against
// the CPU (scripts/gpu-check.sh compiles this file with the flag below).
// GPU-CHECK-FLAGS: --mx-activations=always
// RUN: moe-compile %s --target=sm_90a --mx-activations=always --verify-ptx \
// RUN:   --emit-ptx=%t.ptx -o %t.so | FileCheck %s
// CHECK: ptxas accepted 23 kernel modules for sm_90a
// RUN: FileCheck %s --check-prefix=KERNELS < %t.ptx
// RUN: moe-compile %s --target=cpu -o %t.cpu.so

// A train step's expert MLP, forward and backward (F = 256: each GEMM's N
// is a multiple of 256, so all four take the TMA kernel): the forward
// epilogue's encoding feeds the second GEMM (and it rounds the activation
// columnwise too, the groups padded to 32, for w2's weight gradient); the
// backward epilogue's (dh, with its columnwise rounding) feeds the data
// gradient through w1. Exact operands on both sides; the results differ
// by the GEMMs' summation order and the rare E4M3 flips that order causes
// in the quantized intermediates (see kernels.mlir's grouped_mlp_train):
// the relative Frobenius error, 1e-3.
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x256x512_e16_bf16_i32_live_tma_swiglu_e4m3_rceil_mx_h_col_e4m3_rceil_kernel
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x256x256_e16_bf16_i32_tma_e4m3_lhs_kernel
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x256x256_e16_bf16_rhsT_i32_live_tma_swiglu_grad_e4m3_rceil_mx_col_e4m3_rceil_kernel
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x512x256_e16_bf16_rhsT_i32_tma_e4m3_lhs_kernel
func.func @grouped_mlp_train_mx(%x: tensor<1024x256xbf16>, %logits: tensor<1024x16xf32>,
                                %w1: tensor<16x256x512xbf16>, %w2: tensor<16x256x256xbf16>,
                                %dy: tensor<4576x256xf32>)
    -> (tensor<4576x256xf32>, tensor<4576x256xf32>, tensor<16x256x512xf32>, tensor<16x256x256xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 2.0e-2, 1.0e-3]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %sq = moe.quantize %s : tensor<4576x256xbf16> -> !moe.mx<4576x256xf8E4M3FN, axis = 1>
  %w1q = moe.quantize %w1 : tensor<16x256x512xbf16> -> !moe.mx<16x256x512xf8E4M3FN, axis = 1>
  %w2q = moe.quantize %w2 : tensor<16x256x256xbf16> -> !moe.mx<16x256x256xf8E4M3FN, axis = 1>
  %y = moe.grouped_mlp %sq, %w1q, %w2q, %o
      : !moe.mx<4576x256xf8E4M3FN, axis = 1>, !moe.mx<16x256x512xf8E4M3FN, axis = 1>,
        !moe.mx<16x256x256xf8E4M3FN, axis = 1>, tensor<17xi32> -> tensor<4576x256xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %s, %w1, %w2, %o, %dy gemm_type(f8E4M3FN)
      : tensor<4576x256xbf16>, tensor<16x256x512xbf16>, tensor<16x256x256xbf16>, tensor<17xi32>,
        tensor<4576x256xf32> -> tensor<4576x256xf32>, tensor<16x256x512xf32>, tensor<16x256x256xf32>
  return %y, %dx, %dw1, %dw2
      : tensor<4576x256xf32>, tensor<4576x256xf32>, tensor<16x256x512xf32>, tensor<16x256x256xf32>
}
