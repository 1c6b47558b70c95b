// The bf16 recipe's expert MLP on Hopper: the first GEMM's TMA kernel
// computes SwiGLU in its epilogue and writes the activation rounded to bf16
// (the second GEMM's operand), and the data gradient's kernel computes the
// SwiGLU gradient from h and writes it rounded to bf16 (the operand of the
// data gradient through w1 and of w1's weight gradient). Neither h's f32
// activation nor the f32 gradient is written; the backward's recomputed
// GEMM keeps h (f32) for the gradient's epilogue. On the GPU against the CPU
// (scripts/gpu-check.sh).
// RUN: moe-compile %s --target=sm_90a --verify-ptx --emit-ptx=%t.ptx -o %t.so \
// RUN:   | FileCheck %s
// CHECK: ptxas accepted 30 kernel modules for sm_90a
// RUN: FileCheck %s --check-prefix=KERNELS < %t.ptx
// RUN: moe-compile %s --target=cpu -o %t.cpu.so

// A train step's expert MLP, forward and backward (F = 256: every GEMM's N
// a multiple of 256). The epilogues perform the generic lowering's f32
// operations and roundings (Activations.h); the results differ from the
// CPU's by the GEMMs' summation order and the bf16 flips it causes in the
// rounded intermediates: the relative Frobenius error, 1e-3.
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x256x512_e16_bf16_i32_tma_swiglu_bf16_h_kernel
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x256x256_e16_bf16_rhsT_i32_tma_swiglu_grad_bf16_kernel
func.func @grouped_mlp_train_bf16(%x: tensor<1024x256xbf16>, %logits: tensor<1024x16xf32>,
                                  %w1: tensor<16x256x512xbf16>, %w2: tensor<16x256x256xbf16>,
                                  %dy: tensor<4576x256xf32>)
    -> (tensor<4576x256xf32>, tensor<4576x256xf32>, tensor<16x256x512xf32>, tensor<16x256x256xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 2.0e-2, 1.0e-3]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %y = moe.grouped_mlp %s, %w1, %w2, %o
      : tensor<4576x256xbf16>, tensor<16x256x512xbf16>, tensor<16x256x256xbf16>, tensor<17xi32>
      -> tensor<4576x256xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %s, %w1, %w2, %o, %dy gemm_type(bf16)
      : tensor<4576x256xbf16>, tensor<16x256x512xbf16>, tensor<16x256x256xbf16>, tensor<17xi32>,
        tensor<4576x256xf32> -> tensor<4576x256xf32>, tensor<16x256x512xf32>, tensor<16x256x256xf32>
  return %y, %dx, %dw1, %dw2
      : tensor<4576x256xf32>, tensor<4576x256xf32>, tensor<16x256x512xf32>, tensor<16x256x256xf32>
}

// The forward alone, at hidden 288 and F = 160 (no pad_to: groups start
// anywhere): the epilogue's last column tile holds 32 outputs, and only
// the activation is written.
// KERNELS-DAG: kernel module moe_wgmma_gmm_4096x288x320_e16_bf16_i32_live_tma_swiglu_bf16_kernel
func.func @grouped_mlp_bf16_partial(%x: tensor<1024x288xbf16>, %logits: tensor<1024x16xf32>,
                                    %w1: tensor<16x288x320xbf16>, %w2: tensor<16x160x288xbf16>)
    -> tensor<4096x288xf32> attributes {moe.test_tolerance = [5.0e-2, 2.0e-2, 1.0e-3]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16)
      : tensor<1024x288xbf16>, tensor<1024x4xi32>
      -> tensor<4096x288xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %y = moe.grouped_mlp %s, %w1, %w2, %o
      : tensor<4096x288xbf16>, tensor<16x288x320xbf16>, tensor<16x160x288xbf16>, tensor<17xi32>
      -> tensor<4096x288xf32>
  return %y : tensor<4096x288xf32>
}

// The backward alone at the same dims: the gradient's epilogue reads h in
// tiles of 256 of its 320 columns, the last one partial.
// KERNELS-DAG: kernel module moe_wgmma_gmm_4576x288x160_e16_bf16_rhsT_i32_tma_swiglu_grad_bf16_kernel
func.func @grouped_mlp_backward_bf16_partial(%x: tensor<1024x288xbf16>, %logits: tensor<1024x16xf32>,
                                             %w1: tensor<16x288x320xbf16>, %w2: tensor<16x160x288xbf16>,
                                             %dy: tensor<4576x288xf32>)
    -> (tensor<4576x288xf32>, tensor<16x288x320xf32>, tensor<16x160x288xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 2.0e-2, 1.0e-3]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x288xbf16>, tensor<1024x4xi32>
      -> tensor<4576x288xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %s, %w1, %w2, %o, %dy gemm_type(bf16)
      : tensor<4576x288xbf16>, tensor<16x288x320xbf16>, tensor<16x160x288xbf16>, tensor<17xi32>,
        tensor<4576x288xf32> -> tensor<4576x288xf32>, tensor<16x288x320xf32>, tensor<16x160x288xf32>
  return %dx, %dw1, %dw2
      : tensor<4576x288xf32>, tensor<16x288x320xf32>, tensor<16x160x288xf32>
}
