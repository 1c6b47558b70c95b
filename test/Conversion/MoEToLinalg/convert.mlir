// RUN: moe-opt %s -convert-moe-to-linalg -split-input-file | FileCheck %s

// An MX value becomes (data, scales) across signatures; quantize splits the
// scaled axis into blocks of 32, reduces |x| to an amax per block, makes the
// scale byte, then the elements.
// CHECK-LABEL: func.func @quantize
// CHECK-SAME: (%[[X:.*]]: tensor<4x64xbf16>) -> (tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>)
// CHECK: %[[XE:.*]] = tensor.expand_shape %[[X]] {{\[}}[0], [1, 2]] output_shape [4, 2, 32]
// CHECK: %[[AMAX:.*]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[XE]] : tensor<4x2x32xbf16>) outs(%{{.*}} : tensor<4x2xf32>)
// CHECK:   arith.maximumf
// CHECK: %[[S:.*]] = linalg.generic {{.*}} ins(%[[AMAX]] : tensor<4x2xf32>) outs(%{{.*}} : tensor<4x2xf8E8M0FNU>)
// CHECK:   math.ctlz
// CHECK: %[[D:.*]] = linalg.generic {{.*}} ins(%[[XE]], %[[S]] : tensor<4x2x32xbf16>, tensor<4x2xf8E8M0FNU>) outs(%{{.*}} : tensor<4x2x32xf8E4M3FN>)
// CHECK:   math.roundeven
// CHECK: %[[DC:.*]] = tensor.collapse_shape %[[D]] {{\[}}[0], [1, 2]] : tensor<4x2x32xf8E4M3FN> into tensor<4x64xf8E4M3FN>
// CHECK: return %[[DC]], %[[S]]
func.func @quantize(%x: tensor<4x64xbf16>) -> !moe.mx<4x64xf8E4M3FN, axis = 1> {
  %q = moe.quantize %x : tensor<4x64xbf16> -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  return %q : !moe.mx<4x64xf8E4M3FN, axis = 1>
}

// -----

// Columnwise blocks split dimension 0.
// CHECK-LABEL: func.func @quantize_columnwise
// CHECK: tensor.expand_shape %{{.*}} {{\[}}[0, 1], [2]] output_shape [2, 32, 8]
// CHECK: -> tensor<2x8xf8E8M0FNU>
func.func @quantize_columnwise(%x: tensor<64x8xf32>) -> !moe.mx<64x8xf8E5M2, axis = 0> {
  %q = moe.quantize %x scale(floor) : tensor<64x8xf32> -> !moe.mx<64x8xf8E5M2, axis = 0>
  return %q : !moe.mx<64x8xf8E5M2, axis = 0>
}

// -----

// A grouped matmul is a loop over experts; the MX operand is dequantized, each
// expert's rows [offsets[e], offsets[e+1]) multiply its weight slice in f32
// and land in a zero-initialised result, rounded to bf16 at the end.
// CHECK-LABEL: func.func @grouped_matmul
// CHECK-SAME: (%[[XD:.*]]: tensor<12x32xf8E4M3FN>, %[[XS:.*]]: tensor<12x1xf8E8M0FNU>, %[[W:.*]]: tensor<4x32x8xbf16>, %[[OFF:.*]]: tensor<5xi32>)
// CHECK: %[[XF:.*]] = tensor.collapse_shape {{.*}} into tensor<12x32xf32>
// CHECK: %[[R:.*]] = scf.for %[[E:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[ACC:.*]] = %{{.*}}) -> (tensor<12x8xf32>)
// CHECK:   tensor.extract %[[OFF]][%[[E]]]
// CHECK:   %[[ROWS:.*]] = tensor.extract_slice %[[XF]][%{{.*}}, 0] [%{{.*}}, 32] [1, 1] : tensor<12x32xf32> to tensor<?x32xf32>
// CHECK:   %[[WE:.*]] = tensor.extract_slice %[[W]][%[[E]], 0, 0] [1, 32, 8] [1, 1, 1] : tensor<4x32x8xbf16> to tensor<32x8xbf16>
// CHECK:   %[[MM:.*]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[ROWS]], %[[WE]] : tensor<?x32xf32>, tensor<32x8xbf16>)
// CHECK:   tensor.insert_slice %[[MM]] into %[[ACC]]
// CHECK: linalg.generic {{.*}} ins(%[[R]] : tensor<12x8xf32>) outs(%{{.*}} : tensor<12x8xbf16>)
// CHECK:   arith.truncf
func.func @grouped_matmul(%x: !moe.mx<12x32xf8E4M3FN, axis = 1>, %w: tensor<4x32x8xbf16>,
                          %off: tensor<5xi32>) -> tensor<12x8xbf16> {
  %y = moe.grouped_matmul %x, %w, %off
      : !moe.mx<12x32xf8E4M3FN, axis = 1>, tensor<4x32x8xbf16>, tensor<5xi32> -> tensor<12x8xbf16>
  return %y : tensor<12x8xbf16>
}

// -----

// The experts region becomes the same loop with the body cloned inside, on
// the expert's rows and weight slices.
// CHECK-LABEL: func.func @experts
// CHECK-NOT: moe.experts
// CHECK: scf.for
// CHECK:   tensor.extract_slice %{{.*}} : tensor<12x16xf32> to tensor<?x16xf32>
// CHECK:   tensor.extract_slice %{{.*}} : tensor<4x16x16xf32> to tensor<16x16xf32>
// CHECK:   linalg.matmul
// CHECK:   tensor.insert_slice
// CHECK-NOT: moe.yield
func.func @experts(%x: tensor<12x16xf32>, %off: tensor<5xi32>, %w: tensor<4x16x16xf32>)
    -> tensor<12x16xf32> {
  %y = moe.experts %x, %off weights(%w : tensor<4x16x16xf32>)
      : tensor<12x16xf32>, tensor<5xi32> -> tensor<12x16xf32> {
  ^bb0(%rows: tensor<?x16xf32>, %we: tensor<16x16xf32>):
    %c0 = arith.constant 0 : index
    %n = tensor.dim %rows, %c0 : tensor<?x16xf32>
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty(%n) : tensor<?x16xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x16xf32>) -> tensor<?x16xf32>
    %o = linalg.matmul ins(%rows, %we : tensor<?x16xf32>, tensor<16x16xf32>)
                       outs(%z : tensor<?x16xf32>) -> tensor<?x16xf32>
    moe.yield %o : tensor<?x16xf32>
  }
  return %y : tensor<12x16xf32>
}

// -----

// grouped_mlp is expanded to its definition first, then lowered: two
// expert loops, SwiGLU in between; nothing of moe is left.
// CHECK-LABEL: func.func @grouped_mlp
// CHECK-NOT: moe.
// CHECK: scf.for
// CHECK: math.exp
// CHECK: scf.for
// CHECK-NOT: moe.
func.func @grouped_mlp(%x: tensor<12x16xbf16>, %w1: tensor<4x16x64xbf16>,
                       %w2: tensor<4x32x16xbf16>, %off: tensor<5xi32>) -> tensor<12x16xbf16> {
  %y = moe.grouped_mlp %x, %w1, %w2, %off
      : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x16xbf16>, tensor<5xi32>
      -> tensor<12x16xbf16>
  return %y : tensor<12x16xbf16>
}

// -----

// MX values flow through calls: both halves are passed.
// CHECK-LABEL: func.func @callee
// CHECK-SAME: (%{{.*}}: tensor<2x32xf8E4M3FN>, %{{.*}}: tensor<2x1xf8E8M0FNU>) -> tensor<2x32xf32>
// CHECK-LABEL: func.func @caller
// CHECK: %[[Q:.*]]:2 = call @make() : () -> (tensor<2x32xf8E4M3FN>, tensor<2x1xf8E8M0FNU>)
// CHECK: call @callee(%[[Q]]#0, %[[Q]]#1)
func.func @callee(%q: !moe.mx<2x32xf8E4M3FN, axis = 1>) -> tensor<2x32xf32> {
  %y = moe.dequantize %q : !moe.mx<2x32xf8E4M3FN, axis = 1> -> tensor<2x32xf32>
  return %y : tensor<2x32xf32>
}
func.func private @make() -> !moe.mx<2x32xf8E4M3FN, axis = 1>
func.func @caller() -> tensor<2x32xf32> {
  %q = call @make() : () -> !moe.mx<2x32xf8E4M3FN, axis = 1>
  %y = call @callee(%q) : (!moe.mx<2x32xf8E4M3FN, axis = 1>) -> tensor<2x32xf32>
  return %y : tensor<2x32xf32>
}
