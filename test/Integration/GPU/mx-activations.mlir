// The expert MLP with every SwiGLU epilogue writing its activation's MX
// encoding (8-bit elements and E8M0 scales) for the TMA GEMMs after it,
// which dequantize it in shared memory (--mx-activations=always; by
// default only where that lowers the peak of live tensors, so
// kernels.mlir's small functions keep the bf16 rounding). On the GPU against
// the CPU (scripts/gpu-check.sh compiles this file with the flag below).
// GPU-CHECK-FLAGS: --mx-activations=always
// RUN: moe-compile %s --target=sm_90a --mx-activations=always --verify-ptx \
// RUN:   --emit-ptx=%t.ptx -o %t.so | FileCheck %s
// CHECK: ptxas accepted 42 kernel modules for sm_90a
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

// The same at hidden 288 and F = 160 (see partial-tiles.mlir's
// grouped_mlp_train_partial): the epilogues' last column tiles hold 32
// outputs (forward) and 160 columns (backward), and the second GEMM reads
// its 8-bit lhs in 5 stages of 32 blocks, the last one half zeros (whose
// scale bytes are taken as 0, not read past the row).
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x288x320_e16_bf16_i32_live_tma_swiglu_e4m3_rceil_mx_h_col_e4m3_rceil_kernel
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x160x288_e16_bf16_i32_tma_e4m3_lhs_kernel
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x288x160_e16_bf16_rhsT_i32_live_tma_swiglu_grad_e4m3_rceil_mx_dh_kernel
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x320x288_e16_bf16_rhsT_i32_tma_e4m3_lhs_kernel
func.func @grouped_mlp_train_mx_partial(%x: tensor<1024x288xbf16>, %logits: tensor<1024x16xf32>,
                                        %w1: tensor<16x288x320xbf16>, %w2: tensor<16x160x288xbf16>,
                                        %dy: tensor<4576x288xf32>)
    -> (tensor<4576x288xf32>, tensor<4576x288xf32>, tensor<16x288x320xf32>, tensor<16x160x288xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 2.0e-2, 1.0e-3]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x288xbf16>, tensor<1024x4xi32>
      -> tensor<4576x288xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %sq = moe.quantize %s : tensor<4576x288xbf16> -> !moe.mx<4576x288xf8E4M3FN, axis = 1>
  %w1q = moe.quantize %w1 : tensor<16x288x320xbf16> -> !moe.mx<16x288x320xf8E4M3FN, axis = 1>
  %w2q = moe.quantize %w2 : tensor<16x160x288xbf16> -> !moe.mx<16x160x288xf8E4M3FN, axis = 1>
  %y = moe.grouped_mlp %sq, %w1q, %w2q, %o
      : !moe.mx<4576x288xf8E4M3FN, axis = 1>, !moe.mx<16x288x320xf8E4M3FN, axis = 1>,
        !moe.mx<16x160x288xf8E4M3FN, axis = 1>, tensor<17xi32> -> tensor<4576x288xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %s, %w1, %w2, %o, %dy gemm_type(f8E4M3FN)
      : tensor<4576x288xbf16>, tensor<16x288x320xbf16>, tensor<16x160x288xbf16>, tensor<17xi32>,
        tensor<4576x288xf32> -> tensor<4576x288xf32>, tensor<16x288x320xf32>, tensor<16x160x288xf32>
  return %y, %dx, %dw1, %dw2
      : tensor<4576x288xf32>, tensor<4576x288xf32>, tensor<16x288x320xf32>, tensor<16x160x288xf32>
}

// The backward SwiGLU epilogue with both MX roundings of dh (groups padded
// to 32 rows, so the kernel computes the columnwise blocks too, which it
// does only for the least memory, as this file is compiled: each 32-row
// block's column amax is shared by two warps). dh differs from the
// CPU's by the GEMM's summation order (f32 ulps), which can flip an
// isolated element's E4M3 rounding by one quantum (and a block's scale
// when its amax sits on a power of two): the check is the relative
// Frobenius error, 1e-3. A wrong amax (one warp's 16 rows, a stale slot)
// moves whole blocks and fails it. Routing outside the experts (-1, 16)
// leaves rows in no group, which must come out zero.
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x256x256_e16_bf16_rhsT_i32_tma_swiglu_grad_e4m3_rceil_col_e4m3_rceil_kernel
func.func @swiglu_grad_epilogue_col(%g: tensor<1024x256xbf16>,
                                    %idx: tensor<1024x4xi32> {moe.test_range = [-1, 17]},
                                    %w2: tensor<16x256x256xbf16>, %h: tensor<4576x512xf32>)
    -> (tensor<4576x512xbf16>, tensor<4576x512xbf16>)
    attributes {moe.test_tolerance = [5.0e-2, 2.0e-2, 1.0e-3]} {
  %dy, %o, %c, %p = moe.dispatch %g, %idx experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %da = moe.grouped_matmul %dy, %w2, %o transpose_rhs
      : tensor<4576x256xbf16>, tensor<16x256x256xbf16>, tensor<17xi32> -> tensor<4576x256xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<4576x512xf32>, tensor<4576x256xf32> -> tensor<4576x512xf32>
  %q1 = moe.quantize %dh : tensor<4576x512xf32> -> !moe.mx<4576x512xf8E4M3FN, axis = 1>
  %r1 = moe.dequantize %q1 : !moe.mx<4576x512xf8E4M3FN, axis = 1> -> tensor<4576x512xbf16>
  %q0 = moe.quantize %dh : tensor<4576x512xf32> -> !moe.mx<4576x512xf8E4M3FN, axis = 0>
  %r0 = moe.dequantize %q0 : !moe.mx<4576x512xf8E4M3FN, axis = 0> -> tensor<4576x512xbf16>
  return %r1, %r0 : tensor<4576x512xbf16>, tensor<4576x512xbf16>
}

// The backward SwiGLU epilogue with both MX roundings of dh (as
// swiglu_grad_epilogue_col above) at hidden 288 and F = 160: the
// column tile of 256 holds 160 columns of da, whose 5 blocks of 32 store
// their rowwise and columnwise roundings (the gate's and the up's) and
// whose 3 blocks past F store nothing. Tolerance as there.
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x288x160_e16_bf16_rhsT_i32_tma_swiglu_grad_e4m3_rceil_col_e4m3_rceil_kernel
func.func @swiglu_grad_epilogue_col_partial(%g: tensor<1024x288xbf16>,
                                            %idx: tensor<1024x4xi32> {moe.test_range = [-1, 17]},
                                            %w2: tensor<16x160x288xbf16>, %h: tensor<4576x320xf32>)
    -> (tensor<4576x320xbf16>, tensor<4576x320xbf16>)
    attributes {moe.test_tolerance = [5.0e-2, 2.0e-2, 1.0e-3]} {
  %dy, %o, %c, %p = moe.dispatch %g, %idx experts(16) pad_to(32)
      : tensor<1024x288xbf16>, tensor<1024x4xi32>
      -> tensor<4576x288xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %da = moe.grouped_matmul %dy, %w2, %o transpose_rhs
      : tensor<4576x288xbf16>, tensor<16x160x288xbf16>, tensor<17xi32> -> tensor<4576x160xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<4576x320xf32>, tensor<4576x160xf32> -> tensor<4576x320xf32>
  %q1 = moe.quantize %dh : tensor<4576x320xf32> -> !moe.mx<4576x320xf8E4M3FN, axis = 1>
  %r1 = moe.dequantize %q1 : !moe.mx<4576x320xf8E4M3FN, axis = 1> -> tensor<4576x320xbf16>
  %q0 = moe.quantize %dh : tensor<4576x320xf32> -> !moe.mx<4576x320xf8E4M3FN, axis = 0>
  %r0 = moe.dequantize %q0 : !moe.mx<4576x320xf8E4M3FN, axis = 0> -> tensor<4576x320xbf16>
  return %r1, %r0 : tensor<4576x320xbf16>, tensor<4576x320xbf16>
}
