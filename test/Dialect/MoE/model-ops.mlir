// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s -mlir-print-op-generic | moe-opt | FileCheck %s

// The model ops and the gradient ops print and parse back.

// CHECK-LABEL: func.func @layer
// CHECK: moe.embedding %{{.*}}, %{{.*}} : tensor<32x64xf32>, tensor<2x8xi32> -> tensor<2x8x64xf32>
// CHECK: moe.rms_norm %{{.*}}, %{{.*}} eps(9.9999999999999995E-7) : tensor<2x8x64xf32>, tensor<64xf32> -> tensor<2x8x64xf32>
// CHECK: moe.rotary %{{.*}} theta(1.000000e+06) : tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>
// CHECK: moe.rotary %{{.*}} theta(1.000000e+06) inverse : tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>
// CHECK: moe.attention %{{.*}}, %{{.*}}, %{{.*}} causal : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32> -> tensor<2x8x4x16xf32>
// CHECK: moe.attention %{{.*}}, %{{.*}}, %{{.*}} scale(2.500000e-01) : tensor<2x8x4x16xf32>
// CHECK: moe.attention %{{.*}}, %{{.*}}, %{{.*}} causal documents(%{{.*}} : tensor<2x8xi32>) scale(2.500000e-01) : tensor<2x8x4x16xf32>
// CHECK: moe.cross_entropy %{{.*}}, %{{.*}} : tensor<16x32xf32>, tensor<16xi32> -> tensor<f32>
func.func @layer(%table: tensor<32x64xf32>, %ids: tensor<2x8xi32>, %w: tensor<64xf32>,
                 %q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %v: tensor<2x8x2x16xf32>,
                 %logits: tensor<16x32xf32>, %labels: tensor<16xi32>) -> tensor<f32> {
  %h = moe.embedding %table, %ids : tensor<32x64xf32>, tensor<2x8xi32> -> tensor<2x8x64xf32>
  %n = moe.rms_norm %h, %w eps(1.0e-6) : tensor<2x8x64xf32>, tensor<64xf32> -> tensor<2x8x64xf32>
  %qr = moe.rotary %q theta(1.0e6) : tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>
  %qi = moe.rotary %qr theta(1.0e6) inverse : tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>
  %o = moe.attention %qi, %k, %v causal : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32> -> tensor<2x8x4x16xf32>
  %o2 = moe.attention %o, %k, %v scale(0.25) : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32> -> tensor<2x8x4x16xf32>
  %o3 = moe.attention %o2, %k, %v causal documents(%ids : tensor<2x8xi32>) scale(0.25) : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32> -> tensor<2x8x4x16xf32>
  %l = moe.cross_entropy %logits, %labels : tensor<16x32xf32>, tensor<16xi32> -> tensor<f32>
  return %l : tensor<f32>
}

// CHECK-LABEL: func.func @grads
// CHECK: moe.embedding_grad %{{.*}}, %{{.*}} : tensor<2x8xi32>, tensor<2x8x64xf32> -> tensor<32x64xf32>
// CHECK: moe.rms_norm_grad %{{.*}}, %{{.*}}, %{{.*}} eps(9.9999999999999995E-7) : tensor<2x8x64xf32>, tensor<64xf32>, tensor<2x8x64xf32> -> tensor<2x8x64xf32>, tensor<64xf32>
// CHECK: moe.attention_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} causal :
// CHECK: moe.attention_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} documents(%{{.*}} : tensor<2x8xi32>) :
// CHECK: moe.cross_entropy_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x32xf32>, tensor<16xi32>, tensor<f32> -> tensor<16x32xf32>
// CHECK: moe.router_grad %{{.*}}, %{{.*}}, %{{.*}} top_k(2) softmax norm_topk_prob : tensor<16x8xf32>, tensor<16x2xi32>, tensor<16x2xf32> -> tensor<16x8xf32>
// CHECK: moe.combine_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<32x64xf32>, tensor<16x2xi32>, tensor<16x64xf32> -> tensor<16x2xf32>
func.func @grads(%ids: tensor<2x8xi32>, %dh: tensor<2x8x64xf32>, %h: tensor<2x8x64xf32>, %w: tensor<64xf32>,
                 %q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %v: tensor<2x8x2x16xf32>,
                 %logits: tensor<16x32xf32>, %labels: tensor<16xi32>, %dl: tensor<f32>,
                 %rl: tensor<16x8xf32>, %ri: tensor<16x2xi32>, %rg: tensor<16x2xf32>,
                 %ye: tensor<32x64xf32>, %dy: tensor<16x64xf32>) {
  %dt = moe.embedding_grad %ids, %dh : tensor<2x8xi32>, tensor<2x8x64xf32> -> tensor<32x64xf32>
  %dx, %dw = moe.rms_norm_grad %h, %w, %dh eps(1.0e-6) : tensor<2x8x64xf32>, tensor<64xf32>, tensor<2x8x64xf32> -> tensor<2x8x64xf32>, tensor<64xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %q causal : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>
  %dq2, %dk2, %dv2 = moe.attention_grad %q, %k, %v, %q documents(%ids : tensor<2x8xi32>) : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>
  %dlg = moe.cross_entropy_grad %logits, %labels, %dl : tensor<16x32xf32>, tensor<16xi32>, tensor<f32> -> tensor<16x32xf32>
  %drl = moe.router_grad %rl, %ri, %rg top_k(2) softmax norm_topk_prob : tensor<16x8xf32>, tensor<16x2xi32>, tensor<16x2xf32> -> tensor<16x8xf32>
  %dwt = moe.combine_grad %ye, %ri, %dy : tensor<32x64xf32>, tensor<16x2xi32>, tensor<16x64xf32> -> tensor<16x2xf32>
  return
}

// CHECK-LABEL: func.func @router_losses
// CHECK: moe.router_loss logits(%{{.*}}, %{{.*}} : tensor<16x8xf32>, tensor<12x8xf32>) counts(%{{.*}}, %{{.*}} : tensor<8xi32>, tensor<8xi32>) aux_coef(1.000000e-03) z_coef(0.000000e+00) -> tensor<f32>
// CHECK: moe.router_loss_grad %{{.*}} logits(%{{.*}}, %{{.*}} : tensor<16x8xf32>, tensor<12x8xf32>) counts(%{{.*}}, %{{.*}} : tensor<8xi32>, tensor<8xi32>) aux_coef(1.000000e-03) z_coef(2.500000e-01) : tensor<f32> -> tensor<16x8xf32>, tensor<12x8xf32>
func.func @router_losses(%l0: tensor<16x8xf32>, %l1: tensor<12x8xf32>, %c0: tensor<8xi32>,
                         %c1: tensor<8xi32>, %g: tensor<f32>) -> tensor<f32> {
  %a = moe.router_loss logits(%l0, %l1 : tensor<16x8xf32>, tensor<12x8xf32>)
      counts(%c0, %c1 : tensor<8xi32>, tensor<8xi32>) aux_coef(1.0e-3) z_coef(0.0) -> tensor<f32>
  %d0, %d1 = moe.router_loss_grad %g logits(%l0, %l1 : tensor<16x8xf32>, tensor<12x8xf32>)
      counts(%c0, %c1 : tensor<8xi32>, tensor<8xi32>) aux_coef(1.0e-3) z_coef(0.25)
      : tensor<f32> -> tensor<16x8xf32>, tensor<12x8xf32>
  return %a : tensor<f32>
}
