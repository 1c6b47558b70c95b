// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Verifier errors of the model ops and the gradient ops, one per split.

func.func @embedding_table_rank(%t: tensor<32xf32>, %ids: tensor<8xi32>) {
  // expected-error @+1 {{expects table to have rank 2, got rank 1}}
  %h = moe.embedding %t, %ids : tensor<32xf32>, tensor<8xi32> -> tensor<8x64xf32>
  return
}

// -----

func.func @embedding_rows(%t: tensor<32x64xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{expects result dim 1 (the ids' dim 1) to be 8, got 4}}
  %h = moe.embedding %t, %ids : tensor<32x64xf32>, tensor<2x8xi32> -> tensor<2x4x64xf32>
  return
}

// -----

func.func @embedding_width(%t: tensor<32x64xf32>, %ids: tensor<8xi32>) {
  // expected-error @+1 {{expects result last dim (the table's row size) to be 64, got 32}}
  %h = moe.embedding %t, %ids : tensor<32x64xf32>, tensor<8xi32> -> tensor<8x32xf32>
  return
}

// -----

func.func @embedding_grad_vocab(%ids: tensor<8xi32>, %g: tensor<8x64xf32>) {
  // expected-error @+1 {{expects a static vocabulary size (result dim 0)}}
  %t = moe.embedding_grad %ids, %g : tensor<8xi32>, tensor<8x64xf32> -> tensor<?x64xf32>
  return
}

// -----

func.func @rms_norm_weight(%x: tensor<4x64xf32>, %w: tensor<32xf32>) {
  // expected-error @+1 {{expects weight size (the input's last dim) to be 64, got 32}}
  %y = moe.rms_norm %x, %w eps(1.0e-6) : tensor<4x64xf32>, tensor<32xf32> -> tensor<4x64xf32>
  return
}

// -----

func.func @rms_norm_eps(%x: tensor<4x64xf32>, %w: tensor<64xf32>) {
  // expected-error @+1 {{attribute 'eps' failed to satisfy constraint: 64-bit float attribute whose value is not negative}}
  %y = moe.rms_norm %x, %w eps(-1.0) : tensor<4x64xf32>, tensor<64xf32> -> tensor<4x64xf32>
  return
}

// -----

func.func @rms_norm_grad_weight(%x: tensor<4x64xf32>, %w: tensor<64xf32>) {
  // expected-error @+1 {{expects weight_grad to have the shape of the weight ('tensor<64xf32>'), got 'tensor<32xf32>'}}
  %dx, %dw = moe.rms_norm_grad %x, %w, %x eps(1.0e-6) : tensor<4x64xf32>, tensor<64xf32>, tensor<4x64xf32> -> tensor<4x64xf32>, tensor<32xf32>
  return
}

// -----

func.func @rotary_odd(%x: tensor<2x8x4x15xf32>) {
  // expected-error @+1 {{expects an even head dim (pairs are rotated), got 15}}
  %y = moe.rotary %x theta(10000.0) : tensor<2x8x4x15xf32> -> tensor<2x8x4x15xf32>
  return
}

// -----

func.func @rotary_theta(%x: tensor<2x8x4x16xf32>) {
  // expected-error @+1 {{attribute 'theta' failed to satisfy constraint}}
  %y = moe.rotary %x theta(0.0) : tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @attention_groups(%q: tensor<2x8x6x16xf32>, %k: tensor<2x8x4x16xf32>) {
  // expected-error @+1 {{expects the query heads (6) to be a multiple of the key/value heads (4)}}
  %o = moe.attention %q, %k, %k : tensor<2x8x6x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32> -> tensor<2x8x6x16xf32>
  return
}

// -----

func.func @attention_documents_rank(%q: tensor<2x8x4x16xf32>, %d: tensor<16xi32>) {
  // expected-error @+1 {{expects documents [batch, seq] to have rank 2, got rank 1}}
  %o = moe.attention %q, %q, %q documents(%d : tensor<16xi32>) : tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @attention_documents_seq(%q: tensor<2x8x4x16xf32>, %dq: tensor<2x8x4x16xf32>, %d: tensor<2x9xi32>) {
  // expected-error @+1 {{expects documents dim 1 (sequence) to be 8, got 9}}
  %g:3 = moe.attention_grad %q, %q, %q, %dq causal documents(%d : tensor<2x9xi32>) : tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>
  return
}

// -----

func.func @attention_documents_type(%q: tensor<2x8x4x16xf32>, %d: tensor<2x8xf32>) {
  // expected-error @+1 {{operand #3 must be ranked tensor of 32-bit signless integer or 64-bit signless integer values}}
  %o = moe.attention %q, %q, %q documents(%d : tensor<2x8xf32>) : tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @attention_head_dim(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x8xf32>) {
  // expected-error @+1 {{expects key dim 3 (head dim) to be 16, got 8}}
  %o = moe.attention %q, %k, %k : tensor<2x8x4x16xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32> -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @attention_value(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %v: tensor<2x8x1x16xf32>) {
  // expected-error @+1 {{expects value to have the shape of key}}
  %o = moe.attention %q, %k, %v : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x1x16xf32> -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @attention_grad_key(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>) {
  // expected-error @+1 {{expects key_grad to have the shape of the key}}
  %dq, %dk, %dv = moe.attention_grad %q, %k, %k, %q : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32> -> tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>
  return
}

// -----

func.func @cross_entropy_labels(%l: tensor<16x32xf32>, %y: tensor<8xi32>) {
  // expected-error @+1 {{expects labels size (the logits' rows) to be 16, got 8}}
  %loss = moe.cross_entropy %l, %y : tensor<16x32xf32>, tensor<8xi32> -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_loss_rank(%l: tensor<16x32xf32>, %y: tensor<16xi32>) {
  // expected-error @+1 {{expects loss to have rank 0, got rank 1}}
  %loss = moe.cross_entropy %l, %y : tensor<16x32xf32>, tensor<16xi32> -> tensor<1xf32>
  return
}

// -----

func.func @cross_entropy_grad_rank(%l: tensor<16x32xf32>, %y: tensor<16xi32>, %g: tensor<1xf32>) {
  // expected-error @+1 {{expects grad (of the 0-d loss) to have rank 0, got rank 1}}
  %d = moe.cross_entropy_grad %l, %y, %g : tensor<16x32xf32>, tensor<16xi32>, tensor<1xf32> -> tensor<16x32xf32>
  return
}

// -----

func.func @router_grad_topk(%l: tensor<16x8xf32>, %i: tensor<16x3xi32>, %g: tensor<16x3xf32>) {
  // expected-error @+1 {{expects indices dim 1 (top_k) to be 2, got 3}}
  %d = moe.router_grad %l, %i, %g top_k(2) softmax : tensor<16x8xf32>, tensor<16x3xi32>, tensor<16x3xf32> -> tensor<16x8xf32>
  return
}

// -----

func.func @router_grad_sigmoid_after(%l: tensor<16x8xf32>, %i: tensor<16x2xi32>, %g: tensor<16x2xf32>) {
  // expected-error @+1 {{softmax_after_topk needs the softmax score function}}
  %d = moe.router_grad %l, %i, %g top_k(2) sigmoid softmax_after_topk : tensor<16x8xf32>, tensor<16x2xi32>, tensor<16x2xf32> -> tensor<16x8xf32>
  return
}

// -----

func.func @combine_grad_rows(%y: tensor<32x64xf32>, %p: tensor<16x2xi32>, %g: tensor<16x32xf32>) {
  // expected-error @+1 {{expects grad dim 1 (row size) to be 64, got 32}}
  %d = moe.combine_grad %y, %p, %g : tensor<32x64xf32>, tensor<16x2xi32>, tensor<16x32xf32> -> tensor<16x2xf32>
  return
}

// -----

func.func @router_loss_pairs(%l: tensor<16x8xf32>, %c: tensor<8xi32>) {
  // expected-error @+1 {{expects one counts per logits, got 2 logits and 1 counts}}
  %a = moe.router_loss logits(%l, %l : tensor<16x8xf32>, tensor<16x8xf32>) counts(%c : tensor<8xi32>) aux_coef(1.0e-3) z_coef(0.0) -> tensor<f32>
  return
}

// -----

func.func @router_loss_experts(%l: tensor<16x8xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{expects every layer to have the same number of experts, got 8 and 4 (layer 0)}}
  %a = moe.router_loss logits(%l : tensor<16x8xf32>) counts(%c : tensor<4xi32>) aux_coef(1.0e-3) z_coef(0.0) -> tensor<f32>
  return
}

// -----

func.func @router_loss_coef(%l: tensor<16x8xf32>, %c: tensor<8xi32>) {
  // expected-error @+1 {{expects z_coef to be a finite non-negative number, got -1}}
  %a = moe.router_loss logits(%l : tensor<16x8xf32>) counts(%c : tensor<8xi32>) aux_coef(1.0e-3) z_coef(-1.0) -> tensor<f32>
  return
}

// -----

func.func @router_loss_none() {
  // expected-error @+1 {{expects the logits of at least one layer}}
  %a = "moe.router_loss"() {aux_coef = 1.0e-3 : f64, z_coef = 0.0 : f64, operandSegmentSizes = array<i32: 0, 0>} : () -> tensor<f32>
  return
}

// -----

func.func @router_loss_grad_shape(%l: tensor<16x8xf32>, %c: tensor<8xi32>, %g: tensor<f32>) {
  // expected-error @+1 {{expects result #0 to have the shape of logits #0 ('tensor<16x8xf32>'), got 'tensor<8x16xf32>'}}
  %d = moe.router_loss_grad %g logits(%l : tensor<16x8xf32>) counts(%c : tensor<8xi32>) aux_coef(1.0e-3) z_coef(0.0) : tensor<f32> -> tensor<8x16xf32>
  return
}
