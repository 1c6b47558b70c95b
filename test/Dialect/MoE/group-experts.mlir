// RUN: moe-opt %s --moe-group-experts | FileCheck %s
// RUN: moe-opt %s --moe-group-experts=remarks=true -verify-diagnostics -o /dev/null

// -moe-group-experts on each form it converts (the grouped ops, and the
// region / loop / per-expert matmuls gone) and on what it refuses (the IR
// unchanged and, with remarks=true, a remark saying why).

#id = affine_map<(i, j) -> (i, j)>
#mk = affine_map<(m, n, k) -> (m, k)>
#nk = affine_map<(m, n, k) -> (n, k)>
#mn = affine_map<(m, n, k) -> (m, n)>

//===----------------------------------------------------------------------===//
// (a) moe.experts
//===----------------------------------------------------------------------===//

// The SwiGLU expert MLP: both matmuls grouped, swiglu on all rows.
// CHECK-LABEL: func.func @experts_mlp(
// CHECK-SAME: %[[X:.*]]: tensor<7x4xf32>, %[[O:.*]]: tensor<4xi32>, %[[W1:.*]]: tensor<3x4x6xf32>, %[[W2:.*]]: tensor<3x3x4xf32>)
// CHECK-NOT: moe.experts
// CHECK: %[[H:.*]] = moe.grouped_matmul %[[X]], %[[W1]], %[[O]] : tensor<7x4xf32>, tensor<3x4x6xf32>, tensor<4xi32> -> tensor<7x6xf32>
// CHECK-NEXT: %[[A:.*]] = moe.swiglu %[[H]] : tensor<7x6xf32> -> tensor<7x3xf32>
// CHECK-NEXT: %[[Y:.*]] = moe.grouped_matmul %[[A]], %[[W2]], %[[O]] : tensor<7x3xf32>, tensor<3x3x4xf32>, tensor<4xi32> -> tensor<7x4xf32>
// CHECK-NEXT: return %[[Y]]
func.func @experts_mlp(%x: tensor<7x4xf32>, %off: tensor<4xi32>,
                       %w1: tensor<3x4x6xf32>, %w2: tensor<3x3x4xf32>) -> tensor<7x4xf32> {
  %y = moe.experts %x, %off weights(%w1, %w2 : tensor<3x4x6xf32>, tensor<3x3x4xf32>)
      : tensor<7x4xf32>, tensor<4xi32> -> tensor<7x4xf32> {
  ^bb0(%xg: tensor<?x4xf32>, %a: tensor<4x6xf32>, %b: tensor<3x4xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xf32>
    %e1 = tensor.empty(%n) : tensor<?x6xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %h = linalg.matmul ins(%xg, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                       outs(%z1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %act = moe.swiglu %h : tensor<?x6xf32> -> tensor<?x3xf32>
    %e2 = tensor.empty(%n) : tensor<?x4xf32>
    %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x4xf32>) -> tensor<?x4xf32>
    %o = linalg.matmul ins(%act, %b : tensor<?x3xf32>, tensor<3x4xf32>)
                       outs(%z2 : tensor<?x4xf32>) -> tensor<?x4xf32>
    moe.yield %o : tensor<?x4xf32>
  }
  return %y : tensor<7x4xf32>
}

// bf16 operands with f32 accumulators, swiglu rounding to bf16, and the
// second weight transposed (linalg.transpose of the slice, and A @ B^T maps).
// CHECK-LABEL: func.func @experts_bf16_transposed(
// CHECK-SAME: %[[X:.*]]: tensor<8x4xbf16>, %[[O:.*]]: tensor<3xi32>, %[[W1:.*]]: tensor<2x6x4xbf16>, %[[W2:.*]]: tensor<2x4x3xbf16>)
// CHECK-NOT: moe.experts
// CHECK: %[[H:.*]] = moe.grouped_matmul %[[X]], %[[W1]], %[[O]] transpose_rhs : tensor<8x4xbf16>, tensor<2x6x4xbf16>, tensor<3xi32> -> tensor<8x6xf32>
// CHECK-NEXT: %[[A:.*]] = moe.swiglu %[[H]] : tensor<8x6xf32> -> tensor<8x3xbf16>
// CHECK-NEXT: %[[Y:.*]] = moe.grouped_matmul %[[A]], %[[W2]], %[[O]] transpose_rhs : tensor<8x3xbf16>, tensor<2x4x3xbf16>, tensor<3xi32> -> tensor<8x4xf32>
// CHECK-NEXT: return %[[Y]]
func.func @experts_bf16_transposed(%x: tensor<8x4xbf16>, %off: tensor<3xi32>,
    %w1: tensor<2x6x4xbf16>, %w2: tensor<2x4x3xbf16>) -> tensor<8x4xf32> {
  %y = moe.experts %x, %off weights(%w1, %w2 : tensor<2x6x4xbf16>, tensor<2x4x3xbf16>)
      : tensor<8x4xbf16>, tensor<3xi32> -> tensor<8x4xf32> {
  ^bb0(%xg: tensor<?x4xbf16>, %a: tensor<6x4xbf16>, %b: tensor<4x3xbf16>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xbf16>
    %et = tensor.empty() : tensor<4x6xbf16>
    %at = linalg.transpose ins(%a : tensor<6x4xbf16>) outs(%et : tensor<4x6xbf16>) permutation = [1, 0]
    %e1 = tensor.empty(%n) : tensor<?x6xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %h = linalg.matmul ins(%xg, %at : tensor<?x4xbf16>, tensor<4x6xbf16>)
                       outs(%z1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %act = moe.swiglu %h : tensor<?x6xf32> -> tensor<?x3xbf16>
    %e2 = tensor.empty(%n) : tensor<?x4xf32>
    %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x4xf32>) -> tensor<?x4xf32>
    %o = linalg.matmul indexing_maps = [#mk, #nk, #mn]
                       ins(%act, %b : tensor<?x3xbf16>, tensor<4x3xbf16>)
                       outs(%z2 : tensor<?x4xf32>) -> tensor<?x4xf32>
    moe.yield %o : tensor<?x4xf32>
  }
  return %y : tensor<8x4xf32>
}

// Elementwise ops after the matmul that map +0 to +0 (silu in a
// linalg.generic, a product, a truncation on tensors) keep the rows outside
// every group at zero; a dynamic number of rows.
// CHECK-LABEL: func.func @experts_elementwise(
// CHECK-SAME: %[[X:.*]]: tensor<?x4xf32>, %[[O:.*]]: tensor<5xi64>, %[[W:.*]]: tensor<4x4x8xf32>)
// CHECK-NOT: moe.experts
// CHECK: %[[H:.*]] = moe.grouped_matmul %[[X]], %[[W]], %[[O]] : tensor<?x4xf32>, tensor<4x4x8xf32>, tensor<5xi64> -> tensor<?x8xf32>
// CHECK: %[[S:.*]] = linalg.generic {{.*}} ins(%[[H]] : tensor<?x8xf32>) outs(%{{.*}} : tensor<?x8xf32>)
// CHECK: math.exp
// CHECK: %[[P:.*]] = arith.mulf %[[S]], %[[H]] : tensor<?x8xf32>
// CHECK-NEXT: %[[T:.*]] = arith.truncf %[[P]] : tensor<?x8xf32> to tensor<?x8xbf16>
// CHECK-NEXT: return %[[T]]
func.func @experts_elementwise(%x: tensor<?x4xf32>, %off: tensor<5xi64>,
                               %w: tensor<4x4x8xf32>) -> tensor<?x8xbf16> {
  %y = moe.experts %x, %off weights(%w : tensor<4x4x8xf32>)
      : tensor<?x4xf32>, tensor<5xi64> -> tensor<?x8xbf16> {
  ^bb0(%xg: tensor<?x4xf32>, %a: tensor<4x8xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xf32>
    %e = tensor.empty(%n) : tensor<?x8xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x8xf32>) -> tensor<?x8xf32>
    %h = linalg.matmul ins(%xg, %a : tensor<?x4xf32>, tensor<4x8xf32>)
                       outs(%z : tensor<?x8xf32>) -> tensor<?x8xf32>
    %s = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%h : tensor<?x8xf32>) outs(%e : tensor<?x8xf32>) {
    ^bb0(%v: f32, %unused: f32):
      %one = arith.constant 1.0 : f32
      %nv = arith.negf %v : f32
      %ex = math.exp %nv : f32
      %d = arith.addf %one, %ex : f32
      %r = arith.divf %v, %d : f32
      linalg.yield %r : f32
    } -> tensor<?x8xf32>
    %p = arith.mulf %s, %h : tensor<?x8xf32>
    %t = arith.truncf %p : tensor<?x8xf32> to tensor<?x8xbf16>
    moe.yield %t : tensor<?x8xbf16>
  }
  return %y : tensor<?x8xbf16>
}

// A ReLU written as cmpf + select on tensors, then tanh: +0 stays +0
// (through an i1 false), so it is grouped.
// CHECK-LABEL: func.func @experts_relu_select(
// CHECK-NOT: moe.experts
// CHECK: %[[H:.*]] = moe.grouped_matmul
// CHECK: %[[C:.*]] = arith.cmpf ogt, %[[H]], %{{.*}} : tensor<7x6xf32>
// CHECK: %[[S:.*]] = arith.select %[[C]], %[[H]], %{{.*}} : tensor<7x6xi1>, tensor<7x6xf32>
// CHECK: %[[T:.*]] = math.tanh %[[S]] : tensor<7x6xf32>
// CHECK: return %[[T]]
func.func @experts_relu_select(%x: tensor<7x4xf32>, %off: tensor<4xi32>,
                               %w: tensor<3x4x6xf32>) -> tensor<7x6xf32> {
  %y = moe.experts %x, %off weights(%w : tensor<3x4x6xf32>)
      : tensor<7x4xf32>, tensor<4xi32> -> tensor<7x6xf32> {
  ^bb0(%xg: tensor<?x4xf32>, %a: tensor<4x6xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xf32>
    %e = tensor.empty(%n) : tensor<?x6xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x6xf32>) -> tensor<?x6xf32>
    %h = linalg.matmul ins(%xg, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                       outs(%z : tensor<?x6xf32>) -> tensor<?x6xf32>
    %c = arith.cmpf ogt, %h, %z : tensor<?x6xf32>
    %r = arith.select %c, %h, %z : tensor<?x6xi1>, tensor<?x6xf32>
    %t = math.tanh %r : tensor<?x6xf32>
    moe.yield %t : tensor<?x6xf32>
  }
  return %y : tensor<7x6xf32>
}

// moe.dispatch's sorted rows are zero beyond offsets[E]: a body without any
// matmul (a ReLU) is grouped too.
// CHECK-LABEL: func.func @experts_after_dispatch(
// CHECK: %[[S:.*]], %[[O:.*]], %{{.*}}, %{{.*}} = moe.dispatch
// CHECK-NOT: moe.experts
// CHECK: %[[R:.*]] = linalg.generic {{.*}} ins(%[[S]] : tensor<12x16xf32>)
// CHECK: arith.maximumf
// CHECK: return %[[R]]
func.func @experts_after_dispatch(%x: tensor<6x16xf32>, %idx: tensor<6x2xi32>) -> tensor<12x16xf32> {
  %s, %off, %cnt, %pos = moe.dispatch %x, %idx experts(4)
      : tensor<6x16xf32>, tensor<6x2xi32>
      -> tensor<12x16xf32>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %y = moe.experts %s, %off : tensor<12x16xf32>, tensor<5xi32> -> tensor<12x16xf32> {
  ^bb0(%xg: tensor<?x16xf32>):
    %c0 = arith.constant 0 : index
    %n = tensor.dim %xg, %c0 : tensor<?x16xf32>
    %e = tensor.empty(%n) : tensor<?x16xf32>
    %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%xg : tensor<?x16xf32>) outs(%e : tensor<?x16xf32>) {
    ^bb0(%v: f32, %unused: f32):
      %zero = arith.constant 0.0 : f32
      %m = arith.maximumf %v, %zero : f32
      linalg.yield %m : f32
    } -> tensor<?x16xf32>
    moe.yield %r : tensor<?x16xf32>
  }
  return %y : tensor<12x16xf32>
}

// Refused: a bf16 accumulator rounds after every add.
// CHECK-LABEL: func.func @refuse_bf16_accumulator(
// CHECK: moe.experts
// CHECK: linalg.matmul
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_bf16_accumulator(%x: tensor<7x4xbf16>, %off: tensor<4xi32>,
                                   %w: tensor<3x4x6xbf16>) -> tensor<7x6xbf16> {
  // expected-remark @+1 {{moe-group-experts: left unchanged: linalg.matmul accumulates in bf16 but moe.grouped_matmul in f32, rounded once: only an f32 accumulator gives the same bits}}
  %y = moe.experts %x, %off weights(%w : tensor<3x4x6xbf16>)
      : tensor<7x4xbf16>, tensor<4xi32> -> tensor<7x6xbf16> {
  ^bb0(%xg: tensor<?x4xbf16>, %a: tensor<4x6xbf16>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : bf16
    %n = tensor.dim %xg, %c0 : tensor<?x4xbf16>
    %e = tensor.empty(%n) : tensor<?x6xbf16>
    %z = linalg.fill ins(%zero : bf16) outs(%e : tensor<?x6xbf16>) -> tensor<?x6xbf16>
    %h = linalg.matmul ins(%xg, %a : tensor<?x4xbf16>, tensor<4x6xbf16>)
                       outs(%z : tensor<?x6xbf16>) -> tensor<?x6xbf16>
    moe.yield %h : tensor<?x6xbf16>
  }
  return %y : tensor<7x6xbf16>
}

// Refused: -0.0 as the matmul's init (a row whose products are all -0 would
// give -0, grouped_matmul +0).
// CHECK-LABEL: func.func @refuse_negative_zero_init(
// CHECK: moe.experts
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_negative_zero_init(%x: tensor<7x4xf32>, %off: tensor<4xi32>,
                                     %w: tensor<3x4x6xf32>) -> tensor<7x6xf32> {
  // expected-remark @+1 {{left unchanged: linalg.matmul accumulates into a tensor not known to be +0}}
  %y = moe.experts %x, %off weights(%w : tensor<3x4x6xf32>)
      : tensor<7x4xf32>, tensor<4xi32> -> tensor<7x6xf32> {
  ^bb0(%xg: tensor<?x4xf32>, %a: tensor<4x6xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant -0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xf32>
    %e = tensor.empty(%n) : tensor<?x6xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x6xf32>) -> tensor<?x6xf32>
    %h = linalg.matmul ins(%xg, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                       outs(%z : tensor<?x6xf32>) -> tensor<?x6xf32>
    moe.yield %h : tensor<?x6xf32>
  }
  return %y : tensor<7x6xf32>
}

// Refused: h + 1 is 1, not 0, on rows outside every group.
// CHECK-LABEL: func.func @refuse_nonzero_outside(
// CHECK: moe.experts
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_nonzero_outside(%x: tensor<7x4xf32>, %off: tensor<4xi32>,
                                  %w: tensor<3x4x6xf32>) -> tensor<7x6xf32> {
  // expected-remark @+1 {{left unchanged: the yielded value is not known to be +0 on rows outside every group}}
  %y = moe.experts %x, %off weights(%w : tensor<3x4x6xf32>)
      : tensor<7x4xf32>, tensor<4xi32> -> tensor<7x6xf32> {
  ^bb0(%xg: tensor<?x4xf32>, %a: tensor<4x6xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xf32>
    %e = tensor.empty(%n) : tensor<?x6xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x6xf32>) -> tensor<?x6xf32>
    %h = linalg.matmul ins(%xg, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                       outs(%z : tensor<?x6xf32>) -> tensor<?x6xf32>
    %p = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%h : tensor<?x6xf32>) outs(%e : tensor<?x6xf32>) {
    ^bb0(%v: f32, %unused: f32):
      %one = arith.constant 1.0 : f32
      %r = arith.addf %v, %one : f32
      linalg.yield %r : f32
    } -> tensor<?x6xf32>
    moe.yield %p : tensor<?x6xf32>
  }
  return %y : tensor<7x6xf32>
}

// Refused: -h is -0, not +0, on rows outside every group.
// CHECK-LABEL: func.func @refuse_negated(
// CHECK: moe.experts
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_negated(%x: tensor<7x4xf32>, %off: tensor<4xi32>,
                          %w: tensor<3x4x6xf32>) -> tensor<7x6xf32> {
  // expected-remark @+1 {{left unchanged: the yielded value is not known to be +0 on rows outside every group}}
  %y = moe.experts %x, %off weights(%w : tensor<3x4x6xf32>)
      : tensor<7x4xf32>, tensor<4xi32> -> tensor<7x6xf32> {
  ^bb0(%xg: tensor<?x4xf32>, %a: tensor<4x6xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xf32>
    %e = tensor.empty(%n) : tensor<?x6xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x6xf32>) -> tensor<?x6xf32>
    %h = linalg.matmul ins(%xg, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                       outs(%z : tensor<?x6xf32>) -> tensor<?x6xf32>
    %neg = arith.negf %h : tensor<?x6xf32>
    moe.yield %neg : tensor<?x6xf32>
  }
  return %y : tensor<7x6xf32>
}

// Refused: with nsz, h * h may be -0 on rows that are +0.
// CHECK-LABEL: func.func @refuse_fastmath(
// CHECK: moe.experts
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_fastmath(%x: tensor<7x4xf32>, %off: tensor<4xi32>,
                           %w: tensor<3x4x6xf32>) -> tensor<7x6xf32> {
  // expected-remark @+1 {{left unchanged: the yielded value is not known to be +0 on rows outside every group}}
  %y = moe.experts %x, %off weights(%w : tensor<3x4x6xf32>)
      : tensor<7x4xf32>, tensor<4xi32> -> tensor<7x6xf32> {
  ^bb0(%xg: tensor<?x4xf32>, %a: tensor<4x6xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xf32>
    %e = tensor.empty(%n) : tensor<?x6xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x6xf32>) -> tensor<?x6xf32>
    %h = linalg.matmul ins(%xg, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                       outs(%z : tensor<?x6xf32>) -> tensor<?x6xf32>
    %sq = arith.mulf %h, %h fastmath<nsz> : tensor<?x6xf32>
    moe.yield %sq : tensor<?x6xf32>
  }
  return %y : tensor<7x6xf32>
}

// Refused: the tokens' rows outside every group are not known to be zero,
// and nothing in the body zeroes them.
// CHECK-LABEL: func.func @refuse_identity(
// CHECK: moe.experts
func.func @refuse_identity(%x: tensor<7x4xf32>, %off: tensor<4xi32>) -> tensor<7x4xf32> {
  // expected-remark @+1 {{left unchanged: the yielded value is not known to be +0 on rows outside every group}}
  %y = moe.experts %x, %off : tensor<7x4xf32>, tensor<4xi32> -> tensor<7x4xf32> {
  ^bb0(%xg: tensor<?x4xf32>):
    %m = arith.mulf %xg, %xg : tensor<?x4xf32>
    moe.yield %m : tensor<?x4xf32>
  }
  return %y : tensor<7x4xf32>
}

// Refused: a per-expert bias broadcast over the rows (on all rows it would
// need a gather by group).
// CHECK-LABEL: func.func @refuse_per_expert_bias(
// CHECK: moe.experts
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_per_expert_bias(%x: tensor<7x4xf32>, %off: tensor<4xi32>,
    %w: tensor<3x4x6xf32>, %bias: tensor<3x6xf32>) -> tensor<7x6xf32> {
  // expected-remark @+1 {{left unchanged: 'linalg.generic' in the body is not elementwise}}
  %y = moe.experts %x, %off weights(%w, %bias : tensor<3x4x6xf32>, tensor<3x6xf32>)
      : tensor<7x4xf32>, tensor<4xi32> -> tensor<7x6xf32> {
  ^bb0(%xg: tensor<?x4xf32>, %a: tensor<4x6xf32>, %bb: tensor<6xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xf32>
    %e = tensor.empty(%n) : tensor<?x6xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x6xf32>) -> tensor<?x6xf32>
    %h = linalg.matmul ins(%xg, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                       outs(%z : tensor<?x6xf32>) -> tensor<?x6xf32>
    %p = linalg.generic {indexing_maps = [#id, affine_map<(i, j) -> (j)>, #id],
                         iterator_types = ["parallel", "parallel"]}
        ins(%h, %bb : tensor<?x6xf32>, tensor<6xf32>) outs(%e : tensor<?x6xf32>) {
    ^bb0(%v: f32, %c: f32, %unused: f32):
      %r = arith.addf %v, %c : f32
      linalg.yield %r : f32
    } -> tensor<?x6xf32>
    %o = linalg.matmul ins(%p, %a : tensor<?x6xf32>, tensor<4x6xf32>)
                       outs(%z : tensor<?x6xf32>) -> tensor<?x6xf32>
    moe.yield %o : tensor<?x6xf32>
  }
  return %y : tensor<7x6xf32>
}

// Refused: a reduction across the group's rows is not row-wise.
// CHECK-LABEL: func.func @refuse_cross_row(
// CHECK: moe.experts
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_cross_row(%x: tensor<7x4xf32>, %off: tensor<4xi32>) -> tensor<7x4xf32> {
  // expected-remark @+1 {{left unchanged: 'linalg.generic' in the body is not elementwise (all loops parallel, identity maps, no linalg.index)}}
  %y = moe.experts %x, %off : tensor<7x4xf32>, tensor<4xi32> -> tensor<7x4xf32> {
  ^bb0(%xg: tensor<?x4xf32>):
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<4xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<4xf32>) -> tensor<4xf32>
    %s = linalg.generic {indexing_maps = [#id, affine_map<(i, j) -> (j)>],
                         iterator_types = ["reduction", "parallel"]}
        ins(%xg : tensor<?x4xf32>) outs(%z : tensor<4xf32>) {
    ^bb0(%v: f32, %acc: f32):
      %r = arith.addf %v, %acc : f32
      linalg.yield %r : f32
    } -> tensor<4xf32>
    %m = linalg.generic {indexing_maps = [#id, affine_map<(i, j) -> (j)>, #id],
                         iterator_types = ["parallel", "parallel"]}
        ins(%xg, %s : tensor<?x4xf32>, tensor<4xf32>) outs(%xg : tensor<?x4xf32>) {
    ^bb0(%v: f32, %c: f32, %o: f32):
      %r = arith.mulf %v, %c : f32
      linalg.yield %r : f32
    } -> tensor<?x4xf32>
    moe.yield %m : tensor<?x4xf32>
  }
  return %y : tensor<7x4xf32>
}

//===----------------------------------------------------------------------===//
// (b) scf.for over experts
//===----------------------------------------------------------------------===//

// The loop a frontend writes for the expert MLP: raised, then grouped.
// CHECK-LABEL: func.func @loop_mlp(
// CHECK-SAME: %[[X:.*]]: tensor<7x4xf32>, %[[O:.*]]: tensor<4xi32>, %[[W1:.*]]: tensor<3x4x6xf32>, %[[W2:.*]]: tensor<3x3x4xf32>)
// CHECK-NOT: scf.for
// CHECK-NOT: moe.experts
// CHECK: %[[H:.*]] = moe.grouped_matmul %[[X]], %[[W1]], %[[O]] : tensor<7x4xf32>, tensor<3x4x6xf32>, tensor<4xi32> -> tensor<7x6xf32>
// CHECK-NEXT: %[[A:.*]] = moe.swiglu %[[H]] : tensor<7x6xf32> -> tensor<7x3xf32>
// CHECK-NEXT: %[[Y:.*]] = moe.grouped_matmul %[[A]], %[[W2]], %[[O]] : tensor<7x3xf32>, tensor<3x3x4xf32>, tensor<4xi32> -> tensor<7x4xf32>
// CHECK-NEXT: return %[[Y]]
func.func @loop_mlp(%x: tensor<7x4xf32>, %off: tensor<4xi32>,
                    %w1: tensor<3x4x6xf32>, %w2: tensor<3x3x4xf32>) -> tensor<7x4xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<7x4xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<7x4xf32>) -> tensor<7x4xf32>
  %r = scf.for %i = %c0 to %c3 step %c1 iter_args(%acc = %init) -> (tensor<7x4xf32>) {
    %lo32 = tensor.extract %off[%i] : tensor<4xi32>
    %i1 = arith.addi %i, %c1 : index
    %hi32 = tensor.extract %off[%i1] : tensor<4xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %n = arith.subi %hi, %lo : index
    %xs = tensor.extract_slice %x[%lo, 0] [%n, 4] [1, 1] : tensor<7x4xf32> to tensor<?x4xf32>
    %a = tensor.extract_slice %w1[%i, 0, 0] [1, 4, 6] [1, 1, 1] : tensor<3x4x6xf32> to tensor<4x6xf32>
    %b = tensor.extract_slice %w2[%i, 0, 0] [1, 3, 4] [1, 1, 1] : tensor<3x3x4xf32> to tensor<3x4xf32>
    %e1 = tensor.empty(%n) : tensor<?x6xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %h = linalg.matmul ins(%xs, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                       outs(%z1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %act = moe.swiglu %h : tensor<?x6xf32> -> tensor<?x3xf32>
    %e2 = tensor.empty(%n) : tensor<?x4xf32>
    %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x4xf32>) -> tensor<?x4xf32>
    %y = linalg.matmul ins(%act, %b : tensor<?x3xf32>, tensor<3x4xf32>)
                       outs(%z2 : tensor<?x4xf32>) -> tensor<?x4xf32>
    %acc2 = tensor.insert_slice %y into %acc[%lo, 0] [%n, 4] [1, 1]
        : tensor<?x4xf32> into tensor<7x4xf32>
    scf.yield %acc2 : tensor<7x4xf32>
  }
  return %r : tensor<7x4xf32>
}

// bf16 tokens, weights stored transposed ([E, N, K]) and used through
// linalg.transpose, i64 offsets, a weight with more experts than the loop
// runs over (its first E are used).
// CHECK-LABEL: func.func @loop_transposed(
// CHECK-SAME: %[[X:.*]]: tensor<6x4xbf16>, %[[O:.*]]: tensor<3xi64>, %[[W:.*]]: tensor<3x8x4xbf16>)
// CHECK-NOT: scf.for
// CHECK: %[[WS:.*]] = tensor.extract_slice %[[W]][0, 0, 0] [2, 8, 4] [1, 1, 1] : tensor<3x8x4xbf16> to tensor<2x8x4xbf16>
// CHECK: %[[Y:.*]] = moe.grouped_matmul %[[X]], %[[WS]], %[[O]] transpose_rhs : tensor<6x4xbf16>, tensor<2x8x4xbf16>, tensor<3xi64> -> tensor<6x8xf32>
// CHECK: return %[[Y]]
func.func @loop_transposed(%x: tensor<6x4xbf16>, %off: tensor<3xi64>,
                           %w: tensor<3x8x4xbf16>) -> tensor<6x8xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %init = arith.constant dense<0.0> : tensor<6x8xf32>
  %r = scf.for %i = %c0 to %c2 step %c1 iter_args(%acc = %init) -> (tensor<6x8xf32>) {
    %i1 = arith.addi %c1, %i : index
    %lo64 = tensor.extract %off[%i] : tensor<3xi64>
    %hi64 = tensor.extract %off[%i1] : tensor<3xi64>
    %lo = arith.index_cast %lo64 : i64 to index
    %hi = arith.index_cast %hi64 : i64 to index
    %n = arith.subi %hi, %lo : index
    %xs = tensor.extract_slice %x[%lo, 0] [%n, 4] [1, 1] : tensor<6x4xbf16> to tensor<?x4xbf16>
    %wt = tensor.extract_slice %w[%i, 0, 0] [1, 8, 4] [1, 1, 1] : tensor<3x8x4xbf16> to tensor<8x4xbf16>
    %et = tensor.empty() : tensor<4x8xbf16>
    %wk = linalg.transpose ins(%wt : tensor<8x4xbf16>) outs(%et : tensor<4x8xbf16>) permutation = [1, 0]
    %e1 = tensor.empty(%n) : tensor<?x8xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x8xf32>) -> tensor<?x8xf32>
    %y = linalg.matmul ins(%xs, %wk : tensor<?x4xbf16>, tensor<4x8xbf16>)
                       outs(%z1 : tensor<?x8xf32>) -> tensor<?x8xf32>
    %acc2 = tensor.insert_slice %y into %acc[%lo, 0] [%n, 8] [1, 1]
        : tensor<?x8xf32> into tensor<6x8xf32>
    scf.yield %acc2 : tensor<6x8xf32>
  }
  return %r : tensor<6x8xf32>
}

// Raised to moe.experts (equivalent), whose body is then refused: the
// remark is on the experts op, which has the loop's location.
// CHECK-LABEL: func.func @loop_raised_only(
// CHECK-NOT: scf.for
// CHECK: moe.experts %{{.*}}, %{{.*}} weights(%{{.*}} : tensor<3x4x6xbf16>) : tensor<7x4xbf16>, tensor<4xi32> -> tensor<7x6xbf16> {
// CHECK: linalg.matmul
// CHECK-NOT: moe.grouped_matmul
func.func @loop_raised_only(%x: tensor<7x4xbf16>, %off: tensor<4xi32>,
                            %w: tensor<3x4x6xbf16>) -> tensor<7x6xbf16> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %zero = arith.constant 0.0 : bf16
  %init = arith.constant dense<0.0> : tensor<7x6xbf16>
  // expected-remark @+1 {{left unchanged: linalg.matmul accumulates in bf16}}
  %r = scf.for %i = %c0 to %c3 step %c1 iter_args(%acc = %init) -> (tensor<7x6xbf16>) {
    %lo32 = tensor.extract %off[%i] : tensor<4xi32>
    %i1 = arith.addi %i, %c1 : index
    %hi32 = tensor.extract %off[%i1] : tensor<4xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %n = arith.subi %hi, %lo : index
    %xs = tensor.extract_slice %x[%lo, 0] [%n, 4] [1, 1] : tensor<7x4xbf16> to tensor<?x4xbf16>
    %a = tensor.extract_slice %w[%i, 0, 0] [1, 4, 6] [1, 1, 1] : tensor<3x4x6xbf16> to tensor<4x6xbf16>
    %e1 = tensor.empty(%n) : tensor<?x6xbf16>
    %z1 = linalg.fill ins(%zero : bf16) outs(%e1 : tensor<?x6xbf16>) -> tensor<?x6xbf16>
    %y = linalg.matmul ins(%xs, %a : tensor<?x4xbf16>, tensor<4x6xbf16>)
                       outs(%z1 : tensor<?x6xbf16>) -> tensor<?x6xbf16>
    %acc2 = tensor.insert_slice %y into %acc[%lo, 0] [%n, 6] [1, 1]
        : tensor<?x6xbf16> into tensor<7x6xbf16>
    scf.yield %acc2 : tensor<7x6xbf16>
  }
  return %r : tensor<7x6xbf16>
}

// Refused: the result starts from a tensor that is not known to be zero.
// CHECK-LABEL: func.func @refuse_loop_init(
// CHECK: scf.for
// CHECK-NOT: moe.experts
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_loop_init(%x: tensor<7x4xf32>, %off: tensor<4xi32>,
                            %w: tensor<3x4x6xf32>, %init: tensor<7x6xf32>) -> tensor<7x6xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %zero = arith.constant 0.0 : f32
  // expected-remark @+1 {{left unchanged: the loop's initial result is not known to be +0}}
  %r = scf.for %i = %c0 to %c3 step %c1 iter_args(%acc = %init) -> (tensor<7x6xf32>) {
    %lo32 = tensor.extract %off[%i] : tensor<4xi32>
    %i1 = arith.addi %i, %c1 : index
    %hi32 = tensor.extract %off[%i1] : tensor<4xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %n = arith.subi %hi, %lo : index
    %xs = tensor.extract_slice %x[%lo, 0] [%n, 4] [1, 1] : tensor<7x4xf32> to tensor<?x4xf32>
    %a = tensor.extract_slice %w[%i, 0, 0] [1, 4, 6] [1, 1, 1] : tensor<3x4x6xf32> to tensor<4x6xf32>
    %e1 = tensor.empty(%n) : tensor<?x6xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %y = linalg.matmul ins(%xs, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                       outs(%z1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %acc2 = tensor.insert_slice %y into %acc[%lo, 0] [%n, 6] [1, 1]
        : tensor<?x6xf32> into tensor<7x6xf32>
    scf.yield %acc2 : tensor<7x6xf32>
  }
  return %r : tensor<7x6xf32>
}

// Refused: the body uses the group's start row (not expressible in a
// moe.experts body).
// CHECK-LABEL: func.func @refuse_loop_uses_bounds(
// CHECK: scf.for
// CHECK-NOT: moe.experts
func.func @refuse_loop_uses_bounds(%x: tensor<7x4xf32>, %off: tensor<4xi32>) -> tensor<7x4xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %init = arith.constant dense<0.0> : tensor<7x4xf32>
  // expected-remark @+1 {{left unchanged: the loop body uses the expert index or the group bounds other than to slice the tokens, weights and result}}
  %r = scf.for %i = %c0 to %c3 step %c1 iter_args(%acc = %init) -> (tensor<7x4xf32>) {
    %lo32 = tensor.extract %off[%i] : tensor<4xi32>
    %i1 = arith.addi %i, %c1 : index
    %hi32 = tensor.extract %off[%i1] : tensor<4xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %n = arith.subi %hi, %lo : index
    %xs = tensor.extract_slice %x[%lo, 0] [%n, 4] [1, 1] : tensor<7x4xf32> to tensor<?x4xf32>
    %f = arith.sitofp %lo32 : i32 to f32
    %e = tensor.empty(%n) : tensor<?x4xf32>
    %s = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%xs : tensor<?x4xf32>) outs(%e : tensor<?x4xf32>) {
    ^bb0(%v: f32, %unused: f32):
      %m = arith.mulf %v, %f : f32
      linalg.yield %m : f32
    } -> tensor<?x4xf32>
    %acc2 = tensor.insert_slice %s into %acc[%lo, 0] [%n, 4] [1, 1]
        : tensor<?x4xf32> into tensor<7x4xf32>
    scf.yield %acc2 : tensor<7x4xf32>
  }
  return %r : tensor<7x4xf32>
}

// Refused: the loop runs over 2 experts but the offsets hold 3 groups.
// CHECK-LABEL: func.func @refuse_loop_bounds(
// CHECK: scf.for
// CHECK-NOT: moe.experts
func.func @refuse_loop_bounds(%x: tensor<7x4xf32>, %off: tensor<4xi32>,
                              %w: tensor<3x4x6xf32>) -> tensor<7x6xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %init = arith.constant dense<0.0> : tensor<7x6xf32>
  // expected-remark @+1 {{left unchanged: the offsets are not an i32/i64 tensor of E + 1 = 3 entries defined outside the loop}}
  %r = scf.for %i = %c0 to %c2 step %c1 iter_args(%acc = %init) -> (tensor<7x6xf32>) {
    %lo32 = tensor.extract %off[%i] : tensor<4xi32>
    %i1 = arith.addi %i, %c1 : index
    %hi32 = tensor.extract %off[%i1] : tensor<4xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %n = arith.subi %hi, %lo : index
    %xs = tensor.extract_slice %x[%lo, 0] [%n, 4] [1, 1] : tensor<7x4xf32> to tensor<?x4xf32>
    %a = tensor.extract_slice %w[%i, 0, 0] [1, 4, 6] [1, 1, 1] : tensor<3x4x6xf32> to tensor<4x6xf32>
    %e1 = tensor.empty(%n) : tensor<?x6xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %y = linalg.matmul ins(%xs, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                       outs(%z1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %acc2 = tensor.insert_slice %y into %acc[%lo, 0] [%n, 6] [1, 1]
        : tensor<?x6xf32> into tensor<7x6xf32>
    scf.yield %acc2 : tensor<7x6xf32>
  }
  return %r : tensor<7x6xf32>
}

//===----------------------------------------------------------------------===//
// (c) unrolled per-expert matmuls
//===----------------------------------------------------------------------===//

// Three experts (2, 3 and 1 rows) as an insert_slice chain into a zero
// result, weights sliced from one stacked tensor; row 6 is left at zero. A
// shared expert (a dense matmul on all tokens) stays dense.
// CHECK-LABEL: func.func @unrolled_chain(
// CHECK-SAME: %[[X:.*]]: tensor<7x4xf32>, %[[W:.*]]: tensor<3x4x5xf32>, %[[WS:.*]]: tensor<4x5xf32>)
// CHECK-DAG: %[[OFF:.*]] = arith.constant dense<[0, 2, 5, 6]> : tensor<4xi32>
// CHECK-DAG: %[[XS:.*]] = tensor.extract_slice %[[X]][0, 0] [6, 4] [1, 1] : tensor<7x4xf32> to tensor<6x4xf32>
// CHECK: %[[G:.*]] = moe.grouped_matmul %[[XS]], %[[W]], %[[OFF]] : tensor<6x4xf32>, tensor<3x4x5xf32>, tensor<4xi32> -> tensor<6x5xf32>
// CHECK: %[[R:.*]] = tensor.insert_slice %[[G]] into %{{.*}}[0, 0] [6, 5] [1, 1] : tensor<6x5xf32> into tensor<7x5xf32>
// CHECK: %[[SH:.*]] = linalg.matmul ins(%[[X]], %[[WS]] : tensor<7x4xf32>, tensor<4x5xf32>)
// CHECK-NOT: linalg.matmul
// CHECK: return %[[R]], %[[SH]]
func.func @unrolled_chain(%x: tensor<7x4xf32>, %w: tensor<3x4x5xf32>, %wsh: tensor<4x5xf32>)
    -> (tensor<7x5xf32>, tensor<7x5xf32>) {
  %zero = arith.constant 0.0 : f32
  %out0 = tensor.empty() : tensor<7x5xf32>
  %out = linalg.fill ins(%zero : f32) outs(%out0 : tensor<7x5xf32>) -> tensor<7x5xf32>
  %x0 = tensor.extract_slice %x[0, 0] [2, 4] [1, 1] : tensor<7x4xf32> to tensor<2x4xf32>
  %w0 = tensor.extract_slice %w[0, 0, 0] [1, 4, 5] [1, 1, 1] : tensor<3x4x5xf32> to tensor<4x5xf32>
  %e0 = tensor.empty() : tensor<2x5xf32>
  %z0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<2x5xf32>) -> tensor<2x5xf32>
  %y0 = linalg.matmul ins(%x0, %w0 : tensor<2x4xf32>, tensor<4x5xf32>) outs(%z0 : tensor<2x5xf32>) -> tensor<2x5xf32>
  %x1 = tensor.extract_slice %x[2, 0] [3, 4] [1, 1] : tensor<7x4xf32> to tensor<3x4xf32>
  %w1 = tensor.extract_slice %w[1, 0, 0] [1, 4, 5] [1, 1, 1] : tensor<3x4x5xf32> to tensor<4x5xf32>
  %e1 = tensor.empty() : tensor<3x5xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<3x5xf32>) -> tensor<3x5xf32>
  %y1 = linalg.matmul ins(%x1, %w1 : tensor<3x4xf32>, tensor<4x5xf32>) outs(%z1 : tensor<3x5xf32>) -> tensor<3x5xf32>
  %x2 = tensor.extract_slice %x[5, 0] [1, 4] [1, 1] : tensor<7x4xf32> to tensor<1x4xf32>
  %w2 = tensor.extract_slice %w[2, 0, 0] [1, 4, 5] [1, 1, 1] : tensor<3x4x5xf32> to tensor<4x5xf32>
  %e2 = tensor.empty() : tensor<1x5xf32>
  %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<1x5xf32>) -> tensor<1x5xf32>
  %y2 = linalg.matmul ins(%x2, %w2 : tensor<1x4xf32>, tensor<4x5xf32>) outs(%z2 : tensor<1x5xf32>) -> tensor<1x5xf32>
  %r0 = tensor.insert_slice %y0 into %out[0, 0] [2, 5] [1, 1] : tensor<2x5xf32> into tensor<7x5xf32>
  %r1 = tensor.insert_slice %y1 into %r0[2, 0] [3, 5] [1, 1] : tensor<3x5xf32> into tensor<7x5xf32>
  %r2 = tensor.insert_slice %y2 into %r1[5, 0] [1, 5] [1, 1] : tensor<1x5xf32> into tensor<7x5xf32>
  %sh = linalg.matmul ins(%x, %wsh : tensor<7x4xf32>, tensor<4x5xf32>) outs(%out : tensor<7x5xf32>) -> tensor<7x5xf32>
  return %r2, %sh : tensor<7x5xf32>, tensor<7x5xf32>
}

// Two experts as a concat, with separate weight tensors (stacked) and bf16
// operands.
// CHECK-LABEL: func.func @unrolled_concat(
// CHECK-SAME: %[[X:.*]]: tensor<5x4xbf16>, %[[A:.*]]: tensor<4x3xbf16>, %[[B:.*]]: tensor<4x3xbf16>)
// CHECK: %[[E:.*]] = tensor.empty() : tensor<2x4x3xbf16>
// CHECK: %[[S0:.*]] = tensor.insert_slice %[[A]] into %[[E]][0, 0, 0] [1, 4, 3] [1, 1, 1] : tensor<4x3xbf16> into tensor<2x4x3xbf16>
// CHECK: %[[S1:.*]] = tensor.insert_slice %[[B]] into %[[S0]][1, 0, 0] [1, 4, 3] [1, 1, 1] : tensor<4x3xbf16> into tensor<2x4x3xbf16>
// CHECK: %[[OFF:.*]] = arith.constant dense<[0, 3, 5]> : tensor<3xi32>
// CHECK: %[[G:.*]] = moe.grouped_matmul %[[X]], %[[S1]], %[[OFF]] : tensor<5x4xbf16>, tensor<2x4x3xbf16>, tensor<3xi32> -> tensor<5x3xf32>
// CHECK-NOT: linalg.matmul
// CHECK-NOT: tensor.concat
// CHECK: return %[[G]]
func.func @unrolled_concat(%x: tensor<5x4xbf16>, %wa: tensor<4x3xbf16>, %wb: tensor<4x3xbf16>) -> tensor<5x3xf32> {
  %zero = arith.constant 0.0 : f32
  %x0 = tensor.extract_slice %x[0, 0] [3, 4] [1, 1] : tensor<5x4xbf16> to tensor<3x4xbf16>
  %e0 = tensor.empty() : tensor<3x3xf32>
  %z0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<3x3xf32>) -> tensor<3x3xf32>
  %y0 = linalg.matmul ins(%x0, %wa : tensor<3x4xbf16>, tensor<4x3xbf16>) outs(%z0 : tensor<3x3xf32>) -> tensor<3x3xf32>
  %x1 = tensor.extract_slice %x[3, 0] [2, 4] [1, 1] : tensor<5x4xbf16> to tensor<2x4xbf16>
  %e1 = tensor.empty() : tensor<2x3xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<2x3xf32>) -> tensor<2x3xf32>
  %y1 = linalg.matmul ins(%x1, %wb : tensor<2x4xbf16>, tensor<4x3xbf16>) outs(%z1 : tensor<2x3xf32>) -> tensor<2x3xf32>
  %r = tensor.concat dim(0) %y0, %y1 : (tensor<3x3xf32>, tensor<2x3xf32>) -> tensor<5x3xf32>
  return %r : tensor<5x3xf32>
}

// Transposed weights (linalg.transpose of slices e = 1, 2 of one stacked
// [E, N, K] tensor), inserted out of order, from rows 1..4 of the input to
// rows 2..5 of the result.
// CHECK-LABEL: func.func @unrolled_transposed(
// CHECK-SAME: %[[X:.*]]: tensor<6x4xf32>, %[[W:.*]]: tensor<3x5x4xf32>, %[[D:.*]]: tensor<8x5xf32>)
// CHECK-DAG: %[[OFF:.*]] = arith.constant dense<[0, 1, 4]> : tensor<3xi32>
// CHECK-DAG: %[[XS:.*]] = tensor.extract_slice %[[X]][1, 0] [4, 4] [1, 1] : tensor<6x4xf32> to tensor<4x4xf32>
// CHECK-DAG: %[[WS:.*]] = tensor.extract_slice %[[W]][1, 0, 0] [2, 5, 4] [1, 1, 1] : tensor<3x5x4xf32> to tensor<2x5x4xf32>
// CHECK: %[[G:.*]] = moe.grouped_matmul %[[XS]], %[[WS]], %[[OFF]] transpose_rhs : tensor<4x4xf32>, tensor<2x5x4xf32>, tensor<3xi32> -> tensor<4x5xf32>
// CHECK: %[[R:.*]] = tensor.insert_slice %[[G]] into %[[D]][2, 0] [4, 5] [1, 1] : tensor<4x5xf32> into tensor<8x5xf32>
// CHECK-NOT: linalg.matmul
// CHECK-NOT: linalg.transpose
// CHECK: return %[[R]]
func.func @unrolled_transposed(%x: tensor<6x4xf32>, %w: tensor<3x5x4xf32>, %d: tensor<8x5xf32>) -> tensor<8x5xf32> {
  %zero = arith.constant 0.0 : f32
  %x1 = tensor.extract_slice %x[2, 0] [3, 4] [1, 1] : tensor<6x4xf32> to tensor<3x4xf32>
  %w1 = tensor.extract_slice %w[2, 0, 0] [1, 5, 4] [1, 1, 1] : tensor<3x5x4xf32> to tensor<5x4xf32>
  %t1e = tensor.empty() : tensor<4x5xf32>
  %t1 = linalg.transpose ins(%w1 : tensor<5x4xf32>) outs(%t1e : tensor<4x5xf32>) permutation = [1, 0]
  %e1 = tensor.empty() : tensor<3x5xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<3x5xf32>) -> tensor<3x5xf32>
  %y1 = linalg.matmul ins(%x1, %t1 : tensor<3x4xf32>, tensor<4x5xf32>) outs(%z1 : tensor<3x5xf32>) -> tensor<3x5xf32>
  %x0 = tensor.extract_slice %x[1, 0] [1, 4] [1, 1] : tensor<6x4xf32> to tensor<1x4xf32>
  %w0 = tensor.extract_slice %w[1, 0, 0] [1, 5, 4] [1, 1, 1] : tensor<3x5x4xf32> to tensor<5x4xf32>
  %t0e = tensor.empty() : tensor<4x5xf32>
  %t0 = linalg.transpose ins(%w0 : tensor<5x4xf32>) outs(%t0e : tensor<4x5xf32>) permutation = [1, 0]
  %e0 = tensor.empty() : tensor<1x5xf32>
  %z0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<1x5xf32>) -> tensor<1x5xf32>
  %y0 = linalg.matmul ins(%x0, %t0 : tensor<1x4xf32>, tensor<4x5xf32>) outs(%z0 : tensor<1x5xf32>) -> tensor<1x5xf32>
  %r1 = tensor.insert_slice %y1 into %d[3, 0] [3, 5] [1, 1] : tensor<3x5xf32> into tensor<8x5xf32>
  %r0 = tensor.insert_slice %y0 into %r1[2, 0] [1, 5] [1, 1] : tensor<1x5xf32> into tensor<8x5xf32>
  return %r0 : tensor<8x5xf32>
}

// Refused: the second expert's rows do not follow the first's in the input.
// CHECK-LABEL: func.func @refuse_unrolled_gap(
// CHECK-COUNT-2: linalg.matmul
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_unrolled_gap(%x: tensor<6x4xf32>, %w: tensor<2x4x3xf32>) -> tensor<4x3xf32> {
  %zero = arith.constant 0.0 : f32
  %x0 = tensor.extract_slice %x[0, 0] [2, 4] [1, 1] : tensor<6x4xf32> to tensor<2x4xf32>
  %w0 = tensor.extract_slice %w[0, 0, 0] [1, 4, 3] [1, 1, 1] : tensor<2x4x3xf32> to tensor<4x3xf32>
  %e = tensor.empty() : tensor<2x3xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<2x3xf32>) -> tensor<2x3xf32>
  %y0 = linalg.matmul ins(%x0, %w0 : tensor<2x4xf32>, tensor<4x3xf32>) outs(%z : tensor<2x3xf32>) -> tensor<2x3xf32>
  %x1 = tensor.extract_slice %x[3, 0] [2, 4] [1, 1] : tensor<6x4xf32> to tensor<2x4xf32>
  %w1 = tensor.extract_slice %w[1, 0, 0] [1, 4, 3] [1, 1, 1] : tensor<2x4x3xf32> to tensor<4x3xf32>
  %y1 = linalg.matmul ins(%x1, %w1 : tensor<2x4xf32>, tensor<4x3xf32>) outs(%z : tensor<2x3xf32>) -> tensor<2x3xf32>
  // expected-remark @+1 {{left unchanged: the per-expert inputs are not consecutive row slices of one tensor, in the order of the results}}
  %r = tensor.concat dim(0) %y0, %y1 : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  return %r : tensor<4x3xf32>
}

// Refused: bf16 accumulators.
// CHECK-LABEL: func.func @refuse_unrolled_bf16(
// CHECK-COUNT-2: linalg.matmul
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_unrolled_bf16(%x: tensor<4x4xbf16>, %w: tensor<2x4x3xbf16>) -> tensor<4x3xbf16> {
  %zero = arith.constant 0.0 : bf16
  %x0 = tensor.extract_slice %x[0, 0] [2, 4] [1, 1] : tensor<4x4xbf16> to tensor<2x4xbf16>
  %w0 = tensor.extract_slice %w[0, 0, 0] [1, 4, 3] [1, 1, 1] : tensor<2x4x3xbf16> to tensor<4x3xbf16>
  %e = tensor.empty() : tensor<2x3xbf16>
  %z = linalg.fill ins(%zero : bf16) outs(%e : tensor<2x3xbf16>) -> tensor<2x3xbf16>
  %y0 = linalg.matmul ins(%x0, %w0 : tensor<2x4xbf16>, tensor<4x3xbf16>) outs(%z : tensor<2x3xbf16>) -> tensor<2x3xbf16>
  %x1 = tensor.extract_slice %x[2, 0] [2, 4] [1, 1] : tensor<4x4xbf16> to tensor<2x4xbf16>
  %w1 = tensor.extract_slice %w[1, 0, 0] [1, 4, 3] [1, 1, 1] : tensor<2x4x3xbf16> to tensor<4x3xbf16>
  %y1 = linalg.matmul ins(%x1, %w1 : tensor<2x4xbf16>, tensor<4x3xbf16>) outs(%z : tensor<2x3xbf16>) -> tensor<2x3xbf16>
  // expected-remark @+1 {{left unchanged: linalg.matmul accumulates in bf16}}
  %r = tensor.concat dim(0) %y0, %y1 : (tensor<2x3xbf16>, tensor<2x3xbf16>) -> tensor<4x3xbf16>
  return %r : tensor<4x3xbf16>
}

// Refused: the experts read two different tensors.
// CHECK-LABEL: func.func @refuse_unrolled_two_inputs(
// CHECK-COUNT-2: linalg.matmul
// CHECK-NOT: moe.grouped_matmul
func.func @refuse_unrolled_two_inputs(%x: tensor<2x4xf32>, %x2: tensor<2x4xf32>,
                                      %w: tensor<2x4x3xf32>, %d: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %zero = arith.constant 0.0 : f32
  %x0 = tensor.extract_slice %x[0, 0] [2, 4] [1, 1] : tensor<2x4xf32> to tensor<2x4xf32>
  %w0 = tensor.extract_slice %w[0, 0, 0] [1, 4, 3] [1, 1, 1] : tensor<2x4x3xf32> to tensor<4x3xf32>
  %e = tensor.empty() : tensor<2x3xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<2x3xf32>) -> tensor<2x3xf32>
  %y0 = linalg.matmul ins(%x0, %w0 : tensor<2x4xf32>, tensor<4x3xf32>) outs(%z : tensor<2x3xf32>) -> tensor<2x3xf32>
  %x1 = tensor.extract_slice %x2[0, 0] [2, 4] [1, 1] : tensor<2x4xf32> to tensor<2x4xf32>
  %w1 = tensor.extract_slice %w[1, 0, 0] [1, 4, 3] [1, 1, 1] : tensor<2x4x3xf32> to tensor<4x3xf32>
  %y1 = linalg.matmul ins(%x1, %w1 : tensor<2x4xf32>, tensor<4x3xf32>) outs(%z : tensor<2x3xf32>) -> tensor<2x3xf32>
  %r0 = tensor.insert_slice %y0 into %d[0, 0] [2, 3] [1, 1] : tensor<2x3xf32> into tensor<4x3xf32>
  // expected-remark @+1 {{left unchanged: the per-expert inputs are not consecutive row slices of one tensor}}
  %r1 = tensor.insert_slice %y1 into %r0[2, 0] [2, 3] [1, 1] : tensor<2x3xf32> into tensor<4x3xf32>
  return %r1 : tensor<4x3xf32>
}
