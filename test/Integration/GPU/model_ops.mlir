// The model ops and gradient ops (moe-model graphs, -moe-autodiff) on the
// GPU against the CPU, on fresh random inputs (scripts/gpu-check.sh).
// Lookups and in-order sums are bit-identical; exp, log, pow, sin and cos
// come from libdevice on the GPU and libm on the CPU (a few ulps apart), so
// functions using them allow 1e-5 relative.
// RUN: moe-compile %s --target=sm_90a --verify-ptx -o %t.so | FileCheck %s
// CHECK: ptxas accepted 100 kernel modules for sm_90a
// RUN: moe-compile %s --target=cpu -o %t.cpu.so

func.func @embedding(%t: tensor<1000x64xf32>, %ids: tensor<4x128xi32> {moe.test_range = [-1, 1001]})
    -> tensor<4x128x64xf32> {
  %h = moe.embedding %t, %ids : tensor<1000x64xf32>, tensor<4x128xi32> -> tensor<4x128x64xf32>
  return %h : tensor<4x128x64xf32>
}

func.func @embedding_grad(%ids: tensor<512xi32> {moe.test_range = [0, 64]}, %g: tensor<512x64xf32>)
    -> tensor<64x64xf32> {
  %d = moe.embedding_grad %ids, %g : tensor<512xi32>, tensor<512x64xf32> -> tensor<64x64xf32>
  return %d : tensor<64x64xf32>
}

// The weight gradient sums 512 products of magnitude ~1 that cancel to
// ~0.04: ptxas contracts the multiply-adds into FMAs, so the sums differ by
// up to a few hundred ulps of the terms (1.5e-5 measured on an H200).
func.func @rms_norm(%x: tensor<512x256xf32>, %w: tensor<256xf32>, %dy: tensor<512x256xf32>)
    -> (tensor<512x256xf32>, tensor<512x256xf32>, tensor<256xf32>)
    attributes {moe.test_tolerance = [5.0e-5, 1.0e-5]} {
  %y = moe.rms_norm %x, %w eps(1.0e-6) : tensor<512x256xf32>, tensor<256xf32> -> tensor<512x256xf32>
  %dx, %dw = moe.rms_norm_grad %x, %w, %dy eps(1.0e-6)
      : tensor<512x256xf32>, tensor<256xf32>, tensor<512x256xf32> -> tensor<512x256xf32>, tensor<256xf32>
  return %y, %dx, %dw : tensor<512x256xf32>, tensor<512x256xf32>, tensor<256xf32>
}

// Per-head norms (as q_norm / k_norm): the weight gradient sums 16384 rows
// of 64 columns, split over 1024 partial sums each on the GPU
// (-moe-gpu-split-reductions), so in another order than the CPU's.
func.func @rms_norm_heads(%x: tensor<2x512x16x64xf32>, %w: tensor<64xf32>, %dy: tensor<2x512x16x64xf32>)
    -> (tensor<2x512x16x64xf32>, tensor<64xf32>) attributes {moe.test_tolerance = [5.0e-4, 1.0e-4]} {
  %dx, %dw = moe.rms_norm_grad %x, %w, %dy eps(1.0e-6)
      : tensor<2x512x16x64xf32>, tensor<64xf32>, tensor<2x512x16x64xf32> -> tensor<2x512x16x64xf32>, tensor<64xf32>
  return %dx, %dw : tensor<2x512x16x64xf32>, tensor<64xf32>
}

func.func @rotary(%x: tensor<2x128x8x64xf32>) -> (tensor<2x128x8x64xf32>, tensor<2x128x8x64xf32>)
    attributes {moe.test_tolerance = [1.0e-5, 1.0e-5]} {
  %y = moe.rotary %x theta(1.0e6) : tensor<2x128x8x64xf32> -> tensor<2x128x8x64xf32>
  %z = moe.rotary %y theta(1.0e6) inverse : tensor<2x128x8x64xf32> -> tensor<2x128x8x64xf32>
  return %y, %z : tensor<2x128x8x64xf32>, tensor<2x128x8x64xf32>
}

func.func @attention(%q: tensor<2x64x8x32xf32>, %k: tensor<2x64x2x32xf32>, %v: tensor<2x64x2x32xf32>,
                     %do: tensor<2x64x8x32xf32>)
    -> (tensor<2x64x8x32xf32>, tensor<2x64x8x32xf32>, tensor<2x64x2x32xf32>, tensor<2x64x2x32xf32>)
    attributes {moe.test_tolerance = [1.0e-5, 1.0e-4]} {
  %o = moe.attention %q, %k, %v causal
      : tensor<2x64x8x32xf32>, tensor<2x64x2x32xf32>, tensor<2x64x2x32xf32> -> tensor<2x64x8x32xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal
      : tensor<2x64x8x32xf32>, tensor<2x64x2x32xf32>, tensor<2x64x2x32xf32>, tensor<2x64x8x32xf32>
      -> tensor<2x64x8x32xf32>, tensor<2x64x2x32xf32>, tensor<2x64x2x32xf32>
  return %o, %dq, %dk, %dv : tensor<2x64x8x32xf32>, tensor<2x64x8x32xf32>, tensor<2x64x2x32xf32>, tensor<2x64x2x32xf32>
}

func.func @cross_entropy(%l: tensor<256x1000xf32>, %y: tensor<256xi32> {moe.test_range = [-1, 1000]})
    -> (tensor<f32>, tensor<256x1000xf32>) attributes {moe.test_tolerance = [1.0e-6, 1.0e-5]} {
  %loss = moe.cross_entropy %l, %y : tensor<256x1000xf32>, tensor<256xi32> -> tensor<f32>
  %d = moe.cross_entropy_grad %l, %y, %loss : tensor<256x1000xf32>, tensor<256xi32>, tensor<f32> -> tensor<256x1000xf32>
  return %loss, %d : tensor<f32>, tensor<256x1000xf32>
}

// The recipes' form: the gradient rounded to bf16 (the LM head's GEMM
// operand), which the kernel writes directly; an odd vocabulary (scalar
// loads), i64 labels. A bf16 value may round one ulp (2^-8) apart.
func.func @cross_entropy_bf16_grad(%l: tensor<300x1001xf32>, %y: tensor<300xi64> {moe.test_range = [-1, 1001]})
    -> (tensor<f32>, tensor<300x1001xbf16>) attributes {moe.test_tolerance = [1.0e-6, 8.0e-3]} {
  %loss = moe.cross_entropy %l, %y : tensor<300x1001xf32>, tensor<300xi64> -> tensor<f32>
  %d = moe.cross_entropy_grad %l, %y, %loss : tensor<300x1001xf32>, tensor<300xi64>, tensor<f32> -> tensor<300x1001xf32>
  %e = tensor.empty() : tensor<300x1001xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(n, v) -> (n, v)>, affine_map<(n, v) -> (n, v)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%d : tensor<300x1001xf32>) outs(%e : tensor<300x1001xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<300x1001xbf16>
  return %loss, %r : tensor<f32>, tensor<300x1001xbf16>
}

// bf16 logits over a wide vocabulary (vector loads, full CTAs); a gradient
// of logits without a loss (its row statistics computed for it).
func.func @cross_entropy_wide(%l: tensor<48x50002xbf16>, %y: tensor<48xi32> {moe.test_range = [0, 50002]},
                              %l2: tensor<48x50002xbf16>, %y2: tensor<48xi32> {moe.test_range = [-5, 50002]},
                              %g: tensor<f32>)
    -> (tensor<f32>, tensor<48x50002xf32>) attributes {moe.test_tolerance = [1.0e-6, 1.0e-5]} {
  %loss = moe.cross_entropy %l, %y : tensor<48x50002xbf16>, tensor<48xi32> -> tensor<f32>
  %d = moe.cross_entropy_grad %l2, %y2, %g : tensor<48x50002xbf16>, tensor<48xi32>, tensor<f32> -> tensor<48x50002xf32>
  return %loss, %d : tensor<f32>, tensor<48x50002xf32>
}

func.func @router_combine_grad(%logits: tensor<512x16xf32>, %dw: tensor<512x4xf32>,
                               %y: tensor<2048x64xf32>, %dy: tensor<512x64xf32>)
    -> (tensor<512x16xf32>, tensor<512x4xf32>) attributes {moe.test_tolerance = [1.0e-6, 1.0e-5]} {
  %idx, %w = moe.router %logits top_k(4) softmax norm_topk_prob
      : tensor<512x16xf32> -> tensor<512x4xi32>, tensor<512x4xf32>
  %dl = moe.router_grad %logits, %idx, %dw top_k(4) softmax norm_topk_prob
      : tensor<512x16xf32>, tensor<512x4xi32>, tensor<512x4xf32> -> tensor<512x16xf32>
  %s, %o, %c, %p = moe.dispatch %dy, %idx experts(16)
      : tensor<512x64xf32>, tensor<512x4xi32> -> tensor<2048x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<512x4xi32>
  %dwc = moe.combine_grad %y, %p, %dy : tensor<2048x64xf32>, tensor<512x4xi32>, tensor<512x64xf32> -> tensor<512x4xf32>
  return %dl, %dwc : tensor<512x16xf32>, tensor<512x4xf32>
}

// A router with a selection bias (auxiliary-loss-free balancing): ranked by
// sigmoid + bias, weighted by the unbiased sigmoid (indices bit-identical).
func.func @router_bias(%logits: tensor<512x16xf32>, %bias: tensor<16xf32>)
    -> (tensor<512x4xi32>, tensor<512x4xf32>) attributes {moe.test_tolerance = [1.0e-6, 1.0e-5]} {
  %idx, %w = moe.router %logits bias(%bias : tensor<16xf32>) top_k(4) sigmoid norm_topk_prob
      : tensor<512x16xf32> -> tensor<512x4xi32>, tensor<512x4xf32>
  return %idx, %w : tensor<512x4xi32>, tensor<512x4xf32>
}

// The routers' load-balancing and z losses over two layers and their
// gradient, with the counts a dispatch of each layer's top-4 makes (exp and
// log from libdevice and libm, sums of 512 rows in another order once split).
func.func @router_loss(%l0: tensor<512x16xf32>, %l1: tensor<512x16xf32>, %x: tensor<512x8xf32>,
                       %g: tensor<f32>)
    -> (tensor<f32>, tensor<512x16xf32>, tensor<512x16xf32>, tensor<16xi32>)
    attributes {moe.test_tolerance = [1.0e-4, 1.0e-5]} {
  %i0, %w0 = moe.router %l0 top_k(4) softmax : tensor<512x16xf32> -> tensor<512x4xi32>, tensor<512x4xf32>
  %i1, %w1 = moe.router %l1 top_k(4) softmax : tensor<512x16xf32> -> tensor<512x4xi32>, tensor<512x4xf32>
  %s0, %o0, %c0, %p0 = moe.dispatch %x, %i0 experts(16)
      : tensor<512x8xf32>, tensor<512x4xi32> -> tensor<2048x8xf32>, tensor<17xi32>, tensor<16xi32>, tensor<512x4xi32>
  %s1, %o1, %c1, %p1 = moe.dispatch %x, %i1 experts(16)
      : tensor<512x8xf32>, tensor<512x4xi32> -> tensor<2048x8xf32>, tensor<17xi32>, tensor<16xi32>, tensor<512x4xi32>
  %loss = moe.router_loss logits(%l0, %l1 : tensor<512x16xf32>, tensor<512x16xf32>)
      counts(%c0, %c1 : tensor<16xi32>, tensor<16xi32>) aux_coef(1.0e-2) z_coef(1.0e-3) -> tensor<f32>
  %d0, %d1 = moe.router_loss_grad %g logits(%l0, %l1 : tensor<512x16xf32>, tensor<512x16xf32>)
      counts(%c0, %c1 : tensor<16xi32>, tensor<16xi32>) aux_coef(1.0e-2) z_coef(1.0e-3)
      : tensor<f32> -> tensor<512x16xf32>, tensor<512x16xf32>
  return %loss, %d0, %d1, %c1 : tensor<f32>, tensor<512x16xf32>, tensor<512x16xf32>, tensor<16xi32>
}

// Long sums to one value: -moe-gpu-split-reductions spreads them over 1024
// (1000 for 10^6 terms) partial sums on the GPU, so they sum in another order
// than the CPU's single pass. That pass is itself the less exact one: 10^6
// sequential f32 additions of unit-variance terms (partial sums up to ~10^3)
// drift by up to ~n * 2^-24 * |partial sum| from the exact sum; 0.025 was
// seen on an H200 for the 10^6-term sum, bounded here by 0.25.
func.func @long_sums(%a: tensor<1x65536xf32>, %b: tensor<65536x1xf32>, %c: tensor<1000000xf32>)
    -> (tensor<1x1xf32>, tensor<f32>) attributes {moe.test_tolerance = [2.5e-1, 1.0e-4]} {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x1xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%a, %b : tensor<1x65536xf32>, tensor<65536x1xf32>) outs(%z : tensor<1x1xf32>) -> tensor<1x1xf32>
  %e0 = tensor.empty() : tensor<f32>
  %z0 = linalg.fill ins(%c0 : f32) outs(%e0 : tensor<f32>) -> tensor<f32>
  %s = linalg.reduce ins(%c : tensor<1000000xf32>) outs(%z0 : tensor<f32>) dimensions = [0]
    (%x: f32, %acc: f32) {
      %r = arith.addf %x, %acc : f32
      linalg.yield %r : f32
    }
  return %m, %s : tensor<1x1xf32>, tensor<f32>
}
