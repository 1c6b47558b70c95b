// moe.combine_grad: with H a multiple of 32, each dot product is 32
// interleaved partial sums (h = l, l + 32, ...; consecutive GPU threads take
// consecutive l and read the gathered rows in whole lines), then their sum
// in order; otherwise one sum over h.
// RUN: moe-opt %s --split-input-file --convert-moe-to-linalg | FileCheck %s

// CHECK-DAG: #[[POS:.*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1)>
// CHECK-DAG: #[[GRAD:.*]] = affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>
// CHECK-DAG: #[[PART:.*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
// CHECK-LABEL: func.func @lanes
// CHECK: tensor.expand_shape %{{.*}} {{\[\[}}0], [1, 2]] output_shape [6, 2, 32] : tensor<6x64xf32> into tensor<6x2x32xf32>
// CHECK: %[[P:.*]] = linalg.generic {indexing_maps = [#[[POS]], #[[GRAD]], #[[PART]]], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
// CHECK-SAME: outs(%{{.*}} : tensor<6x2x32xf32>)
// CHECK: arith.select
// CHECK: arith.addf
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[P]] : tensor<6x2x32xf32>) outs(%{{.*}} : tensor<6x2xf32>)
func.func @lanes(%y: tensor<12x64xf32>, %pos: tensor<6x2xi32>, %dy: tensor<6x64xf32>) -> tensor<6x2xf32> {
  %dw = moe.combine_grad %y, %pos, %dy : tensor<12x64xf32>, tensor<6x2xi32>, tensor<6x64xf32> -> tensor<6x2xf32>
  return %dw : tensor<6x2xf32>
}

// -----

// CHECK-LABEL: func.func @one_sum
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]}
// CHECK-SAME: outs(%{{.*}} : tensor<6x2xf32>)
// CHECK-NOT: linalg.generic
// CHECK: return
func.func @one_sum(%y: tensor<12x48xf32>, %pos: tensor<6x2xi32>, %dy: tensor<6x48xf32>) -> tensor<6x2xf32> {
  %dw = moe.combine_grad %y, %pos, %dy : tensor<12x48xf32>, tensor<6x2xi32>, tensor<6x48xf32> -> tensor<6x2xf32>
  return %dw : tensor<6x2xf32>
}
