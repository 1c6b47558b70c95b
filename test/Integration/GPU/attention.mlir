// Flash attention (Kernels/FlashAttention.cpp) forward and backward on the
// GPU against the CPU reference (scripts/gpu-check.sh), on bf16 inputs:
// grouped and one-to-one KV heads, head dims 64 and 128, causal or not,
// sequences that are not multiples of the 64-row tiles or shorter than one
// (the forward's second consumer then has no rows), batch > 1, a scale
// given, documents (i32 and i64 ids, random: not sorted), and a gradient
// without its forward (which the kernels then
// recompute). The kernels round the probabilities and their gradient to
// bf16 before the products with V, dO, K and Q (the reference keeps f32):
// results agree to bf16 precision, so they are compared by the norm of the
// difference.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels | FileCheck %s --check-prefix=KERNELS
// ptxas honours every setmaxnreg (it says when it ignores one):
// RUN: moe-compile %s --target=sm_90a --verify-ptx -o %t.so | FileCheck %s --implicit-check-not=setmaxnreg
// CHECK: ptxas accepted 39 kernel modules for sm_90a
// RUN: moe-compile %s --target=cpu -o %t.cpu.so
// The dK/dV kernel with its MMAs overlapped (flash-dkv-overlap): ptxas
// accepts it too, and the GPU check compares it with the CPU as well:
// GPU-CHECK-VARIANT: overlap --flash-dkv-overlap
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=flash-dkv-overlap | FileCheck %s --check-prefix=OVERLAP
// OVERLAP: call @moe_flash_dkv_b2_s200_h8_kv2_d128_causal_overlap(
// RUN: moe-compile %s --target=sm_90a --flash-dkv-overlap --verify-ptx -o %t.overlap.so | FileCheck %s --implicit-check-not=setmaxnreg

// KERNELS-LABEL: func.func @causal_gqa_d128
// KERNELS: %[[F:.*]]:2 = call @moe_flash_fwd_b2_s200_h8_kv2_d128_causal(
// KERNELS: %[[D:.*]] = call @moe_flash_delta_b2_s200_h8_kv2_d128_causal({{.*}}, %[[F]]#0)
// KERNELS: call @moe_flash_dq_b2_s200_h8_kv2_d128_causal({{.*}}, %[[F]]#1, %[[D]])
// KERNELS: call @moe_flash_dkv_b2_s200_h8_kv2_d128_causal({{.*}}, %[[F]]#1, %[[D]])
// KERNELS-NOT: moe.attention
func.func @causal_gqa_d128(%q: tensor<2x200x8x128xbf16>, %k: tensor<2x200x2x128xbf16>,
                           %v: tensor<2x200x2x128xbf16>, %do: tensor<2x200x8x128xbf16>)
    -> (tensor<2x200x8x128xf32>, tensor<2x200x8x128xf32>, tensor<2x200x2x128xf32>, tensor<2x200x2x128xf32>)
    attributes {moe.test_tolerance = [1.0e-2, 1.0e-2, 1.0e-2]} {
  %o = moe.attention %q, %k, %v causal
      : tensor<2x200x8x128xbf16>, tensor<2x200x2x128xbf16>, tensor<2x200x2x128xbf16> -> tensor<2x200x8x128xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal
      : tensor<2x200x8x128xbf16>, tensor<2x200x2x128xbf16>, tensor<2x200x2x128xbf16>, tensor<2x200x8x128xbf16>
      -> tensor<2x200x8x128xf32>, tensor<2x200x2x128xf32>, tensor<2x200x2x128xf32>
  return %o, %dq, %dk, %dv : tensor<2x200x8x128xf32>, tensor<2x200x8x128xf32>, tensor<2x200x2x128xf32>, tensor<2x200x2x128xf32>
}

// KERNELS-LABEL: func.func @full_mha_d64
// KERNELS: call @moe_flash_fwd_b1_s256_h4_kv4_d64(
func.func @full_mha_d64(%q: tensor<1x256x4x64xbf16>, %k: tensor<1x256x4x64xbf16>,
                        %v: tensor<1x256x4x64xbf16>, %do: tensor<1x256x4x64xbf16>)
    -> (tensor<1x256x4x64xf32>, tensor<1x256x4x64xf32>, tensor<1x256x4x64xf32>, tensor<1x256x4x64xf32>)
    attributes {moe.test_tolerance = [1.0e-2, 1.0e-2, 1.0e-2]} {
  %o = moe.attention %q, %k, %v
      : tensor<1x256x4x64xbf16>, tensor<1x256x4x64xbf16>, tensor<1x256x4x64xbf16> -> tensor<1x256x4x64xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do
      : tensor<1x256x4x64xbf16>, tensor<1x256x4x64xbf16>, tensor<1x256x4x64xbf16>, tensor<1x256x4x64xbf16>
      -> tensor<1x256x4x64xf32>, tensor<1x256x4x64xf32>, tensor<1x256x4x64xf32>
  return %o, %dq, %dk, %dv : tensor<1x256x4x64xf32>, tensor<1x256x4x64xf32>, tensor<1x256x4x64xf32>, tensor<1x256x4x64xf32>
}

// KERNELS-LABEL: func.func @causal_short_d64_scaled
// KERNELS: call @moe_flash_fwd_b3_s70_h2_kv1_d64_causal_s3FB999999999999A(
func.func @causal_short_d64_scaled(%q: tensor<3x70x2x64xbf16>, %k: tensor<3x70x1x64xbf16>,
                                   %v: tensor<3x70x1x64xbf16>, %do: tensor<3x70x2x64xbf16>)
    -> (tensor<3x70x2x64xf32>, tensor<3x70x2x64xf32>, tensor<3x70x1x64xf32>, tensor<3x70x1x64xf32>)
    attributes {moe.test_tolerance = [1.0e-2, 1.0e-2, 1.0e-2]} {
  %o = moe.attention %q, %k, %v causal scale(0.1)
      : tensor<3x70x2x64xbf16>, tensor<3x70x1x64xbf16>, tensor<3x70x1x64xbf16> -> tensor<3x70x2x64xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal scale(0.1)
      : tensor<3x70x2x64xbf16>, tensor<3x70x1x64xbf16>, tensor<3x70x1x64xbf16>, tensor<3x70x2x64xbf16>
      -> tensor<3x70x2x64xf32>, tensor<3x70x1x64xf32>, tensor<3x70x1x64xf32>
  return %o, %dq, %dk, %dv : tensor<3x70x2x64xf32>, tensor<3x70x2x64xf32>, tensor<3x70x1x64xf32>, tensor<3x70x1x64xf32>
}

// Shorter than one tile: the forward's CTA has 128 query rows, its second
// consumer none of them (its Q box lies past S: zeros).
// KERNELS-LABEL: func.func @causal_one_tile_d64
// KERNELS: call @moe_flash_fwd_b2_s40_h2_kv2_d64_causal(
func.func @causal_one_tile_d64(%q: tensor<2x40x2x64xbf16>, %k: tensor<2x40x2x64xbf16>,
                               %v: tensor<2x40x2x64xbf16>, %do: tensor<2x40x2x64xbf16>)
    -> (tensor<2x40x2x64xf32>, tensor<2x40x2x64xf32>, tensor<2x40x2x64xf32>, tensor<2x40x2x64xf32>)
    attributes {moe.test_tolerance = [1.0e-2, 1.0e-2, 1.0e-2]} {
  %o = moe.attention %q, %k, %v causal
      : tensor<2x40x2x64xbf16>, tensor<2x40x2x64xbf16>, tensor<2x40x2x64xbf16> -> tensor<2x40x2x64xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal
      : tensor<2x40x2x64xbf16>, tensor<2x40x2x64xbf16>, tensor<2x40x2x64xbf16>, tensor<2x40x2x64xbf16>
      -> tensor<2x40x2x64xf32>, tensor<2x40x2x64xf32>, tensor<2x40x2x64xf32>
  return %o, %dq, %dk, %dv : tensor<2x40x2x64xf32>, tensor<2x40x2x64xf32>, tensor<2x40x2x64xf32>, tensor<2x40x2x64xf32>
}

// A gradient alone: its forward runs first, for the logsumexp.
// KERNELS-LABEL: func.func @grad_alone
// KERNELS: %[[F:.*]]:2 = call @moe_flash_fwd_b1_s130_h4_kv2_d128_causal(
// KERNELS: call @moe_flash_dq_b1_s130_h4_kv2_d128_causal({{.*}}, %[[F]]#1,
func.func @grad_alone(%q: tensor<1x130x4x128xbf16>, %k: tensor<1x130x2x128xbf16>,
                      %v: tensor<1x130x2x128xbf16>, %do: tensor<1x130x4x128xbf16>)
    -> (tensor<1x130x4x128xf32>, tensor<1x130x2x128xf32>, tensor<1x130x2x128xf32>)
    attributes {moe.test_tolerance = [1.0e-2, 1.0e-2, 1.0e-2]} {
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal
      : tensor<1x130x4x128xbf16>, tensor<1x130x2x128xbf16>, tensor<1x130x2x128xbf16>, tensor<1x130x4x128xbf16>
      -> tensor<1x130x4x128xf32>, tensor<1x130x2x128xf32>, tensor<1x130x2x128xf32>
  return %dq, %dk, %dv : tensor<1x130x4x128xf32>, tensor<1x130x2x128xf32>, tensor<1x130x2x128xf32>
}

// KERNELS-LABEL: func.func @documents_causal_gqa_d128
// KERNELS: %[[R:.*]] = call @moe_flash_ranges_b2_s200_i32(%[[DOC:[a-z0-9_]+]])
// KERNELS: %[[F:.*]]:2 = call @moe_flash_fwd_b2_s200_h8_kv2_d128_causal_docs_i32(%{{.*}}, %{{.*}}, %{{.*}}, %[[DOC]], %[[R]])
// KERNELS-NOT: call @moe_flash_ranges
// KERNELS: call @moe_flash_dq_b2_s200_h8_kv2_d128_causal_docs_i32({{.*}}, %[[DOC]], %[[R]])
// KERNELS: call @moe_flash_dkv_b2_s200_h8_kv2_d128_causal_docs_i32({{.*}}, %[[DOC]], %[[R]])
func.func @documents_causal_gqa_d128(%q: tensor<2x200x8x128xbf16>, %k: tensor<2x200x2x128xbf16>,
                                     %v: tensor<2x200x2x128xbf16>, %do: tensor<2x200x8x128xbf16>,
                                     %docs: tensor<2x200xi32> {moe.test_range = [0, 3]})
    -> (tensor<2x200x8x128xf32>, tensor<2x200x8x128xf32>, tensor<2x200x2x128xf32>, tensor<2x200x2x128xf32>)
    attributes {moe.test_tolerance = [1.0e-2, 1.0e-2, 1.0e-2]} {
  %o = moe.attention %q, %k, %v causal documents(%docs : tensor<2x200xi32>)
      : tensor<2x200x8x128xbf16>, tensor<2x200x2x128xbf16>, tensor<2x200x2x128xbf16> -> tensor<2x200x8x128xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal documents(%docs : tensor<2x200xi32>)
      : tensor<2x200x8x128xbf16>, tensor<2x200x2x128xbf16>, tensor<2x200x2x128xbf16>, tensor<2x200x8x128xbf16>
      -> tensor<2x200x8x128xf32>, tensor<2x200x2x128xf32>, tensor<2x200x2x128xf32>
  return %o, %dq, %dk, %dv : tensor<2x200x8x128xf32>, tensor<2x200x8x128xf32>, tensor<2x200x2x128xf32>, tensor<2x200x2x128xf32>
}

// KERNELS-LABEL: func.func @documents_full_d64
// KERNELS: call @moe_flash_fwd_b3_s130_h4_kv4_d64_docs_i64(
func.func @documents_full_d64(%q: tensor<3x130x4x64xbf16>, %k: tensor<3x130x4x64xbf16>,
                              %v: tensor<3x130x4x64xbf16>, %do: tensor<3x130x4x64xbf16>,
                              %docs: tensor<3x130xi64> {moe.test_range = [0, 2]})
    -> (tensor<3x130x4x64xf32>, tensor<3x130x4x64xf32>, tensor<3x130x4x64xf32>, tensor<3x130x4x64xf32>)
    attributes {moe.test_tolerance = [1.0e-2, 1.0e-2, 1.0e-2]} {
  %o = moe.attention %q, %k, %v documents(%docs : tensor<3x130xi64>)
      : tensor<3x130x4x64xbf16>, tensor<3x130x4x64xbf16>, tensor<3x130x4x64xbf16> -> tensor<3x130x4x64xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do documents(%docs : tensor<3x130xi64>)
      : tensor<3x130x4x64xbf16>, tensor<3x130x4x64xbf16>, tensor<3x130x4x64xbf16>, tensor<3x130x4x64xbf16>
      -> tensor<3x130x4x64xf32>, tensor<3x130x4x64xf32>, tensor<3x130x4x64xf32>
  return %o, %dq, %dk, %dv : tensor<3x130x4x64xf32>, tensor<3x130x4x64xf32>, tensor<3x130x4x64xf32>, tensor<3x130x4x64xf32>
}

// Sorted documents, as packed rows have (70 tokens each, the boundaries
// shifted by 50 in the second row; computed here, so both targets see the
// same): each CTA visits only the tiles of its documents, causal or not.
// KERNELS-LABEL: func.func @documents_packed
// KERNELS: call @moe_flash_fwd_b2_s300_h4_kv2_d128_causal_docs_i32(
// KERNELS: call @moe_flash_fwd_b2_s300_h4_kv2_d64_docs_i32(
func.func @documents_packed(%q: tensor<2x300x4x128xbf16>, %k: tensor<2x300x2x128xbf16>,
                            %v: tensor<2x300x2x128xbf16>, %do: tensor<2x300x4x128xbf16>,
                            %q64: tensor<2x300x4x64xbf16>, %k64: tensor<2x300x2x64xbf16>)
    -> (tensor<2x300x4x128xf32>, tensor<2x300x4x128xf32>, tensor<2x300x2x128xf32>, tensor<2x300x2x128xf32>,
        tensor<2x300x4x64xf32>, tensor<2x300x4x64xf32>, tensor<2x300x2x64xf32>, tensor<2x300x2x64xf32>)
    attributes {moe.test_tolerance = [1.0e-2, 1.0e-2, 1.0e-2]} {
  %e = tensor.empty() : tensor<2x300xi32>
  %docs = linalg.generic {indexing_maps = [affine_map<(b, s) -> (b, s)>],
                          iterator_types = ["parallel", "parallel"]}
      outs(%e : tensor<2x300xi32>) {
  ^bb0(%out: i32):
    %b = linalg.index 0 : index
    %s = linalg.index 1 : index
    %c50 = arith.constant 50 : index
    %c70 = arith.constant 70 : index
    %shift = arith.muli %b, %c50 : index
    %t = arith.addi %s, %shift : index
    %d = arith.divui %t, %c70 : index
    %i = arith.index_cast %d : index to i32
    linalg.yield %i : i32
  } -> tensor<2x300xi32>
  %o = moe.attention %q, %k, %v causal documents(%docs : tensor<2x300xi32>)
      : tensor<2x300x4x128xbf16>, tensor<2x300x2x128xbf16>, tensor<2x300x2x128xbf16> -> tensor<2x300x4x128xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal documents(%docs : tensor<2x300xi32>)
      : tensor<2x300x4x128xbf16>, tensor<2x300x2x128xbf16>, tensor<2x300x2x128xbf16>, tensor<2x300x4x128xbf16>
      -> tensor<2x300x4x128xf32>, tensor<2x300x2x128xf32>, tensor<2x300x2x128xf32>
  %o2 = moe.attention %q64, %k64, %k64 documents(%docs : tensor<2x300xi32>)
      : tensor<2x300x4x64xbf16>, tensor<2x300x2x64xbf16>, tensor<2x300x2x64xbf16> -> tensor<2x300x4x64xf32>
  %dq2, %dk2, %dv2 = moe.attention_grad %q64, %k64, %k64, %q64 documents(%docs : tensor<2x300xi32>)
      : tensor<2x300x4x64xbf16>, tensor<2x300x2x64xbf16>, tensor<2x300x2x64xbf16>, tensor<2x300x4x64xbf16>
      -> tensor<2x300x4x64xf32>, tensor<2x300x2x64xf32>, tensor<2x300x2x64xf32>
  return %o, %dq, %dk, %dv, %o2, %dq2, %dk2, %dv2
      : tensor<2x300x4x128xf32>, tensor<2x300x4x128xf32>, tensor<2x300x2x128xf32>, tensor<2x300x2x128xf32>,
        tensor<2x300x4x64xf32>, tensor<2x300x4x64xf32>, tensor<2x300x2x64xf32>, tensor<2x300x2x64xf32>
}
