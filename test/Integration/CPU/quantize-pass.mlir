// Which GEMMs the pass quantizes (layer 0 is kept as the reference):
// RUN: moe-opt %s -moe-quantize="keep-layers=0" | FileCheck %s --check-prefix=IR
// RUN: moe-opt %s -moe-quantize="keep-layers=0" --moe-cpu-pipeline \
// RUN:   | mlir-runner -e main -entry-point-result=void \
// RUN:     -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s --check-prefix=MX
// RUN: moe-opt %s -moe-quantize="recipe=bf16 keep-layers=0" --moe-cpu-pipeline \
// RUN:   | mlir-runner -e main -entry-point-result=void \
// RUN:     -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s --check-prefix=BF16
// Blockwise FP8 (power-of-two and f32 scales) meets the MXFP8 bounds:
// RUN: moe-opt %s -moe-quantize="recipe=fp8-blockwise keep-layers=0" | FileCheck %s --check-prefix=BLOCK-IR
// RUN: moe-opt %s -moe-quantize="recipe=fp8-blockwise keep-layers=0" --moe-cpu-pipeline \
// RUN:   | mlir-runner -e main -entry-point-result=void \
// RUN:     -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s --check-prefix=MX
// RUN: moe-opt %s -moe-quantize="recipe=fp8-blockwise block-scales=f32 keep-layers=0" --moe-cpu-pipeline \
// RUN:   | mlir-runner -e main -entry-point-result=void \
// RUN:     -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s --check-prefix=MX
// Without the pass both layers compute the same bits:
// RUN: moe-opt %s --moe-cpu-pipeline | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s --check-prefix=NONE
//
// -moe-quantize on the CPU: an expert MLP, forward and backward, unfused
// (@mlp_*) and fused (@fused_*), once as layer 0 and once as layer 1 (the
// same ops; `moe.layer` differs). With `keep-layers=0` the pass quantizes
// layer 1 only, so layer 0 is the high-precision result of the same program
// and @main compares the two: the relative Frobenius error
// err = ||q - r|| / ||r||, computed in f32 in the IR, printed, then checked
// with arith.cmpf and printed as flags
//   [err < tol_mx, err < tol_bf16, err > 0]    (1 = true).
// Inputs are hashed noise in [-1, 1) (weights / 4): 24 random bits, so
// mantissas are spread uniformly and rounding errors are independent.
//
// Tolerances. A format with p significant bits rounds to nearest with a
// relative error of at most u = 2^-p per (normal) element: u = 2^-4 for E4M3
// (3 stored mantissa bits), 2^-8 for bf16 (7 stored bits). MXFP8 with rceil
// never saturates (a block's amax maps into (224, 448]) and an element is
// subnormal only below amax * 2^-14.8, where its absolute error is
// negligible next to the block's norm; so a quantized tensor is within u of
// the original in relative Frobenius norm. Its typical (RMS) error is
// smaller: values spread over the top binades of their block round with a
// step of 2^-3 of the binade, about 0.024 relative for E4M3 and 0.0015 for
// bf16. Errors of independent elements add in quadrature, so
//  - one GEMM with both operands quantized (h = x @ w1): sqrt(2) * 0.024
//    = 0.034 (bf16: 0.002); checked against u: 2^-4 (bf16 2^-8);
//  - the MLP's results depend on 4 to 6 quantized tensors (y: x, w1, the
//    activation, w2, with the SwiGLU product doubling h's share; dx: dy, w2,
//    x, w1, dh, w1 again): sqrt(6) * 0.024 = 0.06 (bf16: 0.004); checked
//    against 2u: 2^-3 (bf16 2^-7).
// Measured: h 0.033, MLP results 0.060 to 0.064 (bf16: 0.0021 and 0.0037 to
// 0.0040): as predicted, within the bounds with a margin of 2. MXFP8 does
// not meet the bf16 bounds (flag 0), bf16 does (flag 1): the bf16 run shows
// that the finer recipe was applied. err > 0 shows that the pass changed
// something at all; without it the error is exactly 0. The fused ops give
// the same errors as the unfused ones (the same quantizations).

// IR-LABEL: func.func @mlp_ref
// IR-NOT: moe.quantize
// IR-NOT: !moe.mx
// IR: return
// IR-LABEL: func.func @mlp_q
// IR: moe.grouped_matmul {{.*}} {moe.layer = 1 : i64} : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>
// IR: moe.grouped_matmul_wgrad {{.*}} : !moe.mx<64x32xf8E4M3FN, axis = 0>, !moe.mx<64x64xf8E4M3FN, axis = 0>
// IR-LABEL: func.func @fused_ref
// IR-NEXT: moe.grouped_mlp %arg0, %arg1, %arg2, %arg3 {moe.layer = 0 : i64} : tensor<64x32xf32>
// IR-NEXT: moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 {moe.layer = 0 : i64} :
// IR-LABEL: func.func @fused_q
// IR-COUNT-3: moe.quantize
// IR-NEXT: moe.grouped_mlp {{.*}} {moe.layer = 1 : i64} : !moe.mx
// IR-NEXT: moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 gemm_type(f8E4M3FN) {moe.layer = 1 : i64} :

// h, the four results of the unfused MLP, then the four of the fused one.
// Blockwise FP8: 1 x 128 tiles along K, 128 x 128 per expert for the
// weights, 128 x 1 along the rows for weight gradients; the fused ops are
// expanded into their GEMMs. Its scales map a tile's amax into (224, 448]
// (pow2) or onto 448 (f32), so the MXFP8 error analysis holds as it is.
// BLOCK-IR-LABEL: func.func @mlp_q
// BLOCK-IR: moe.grouped_matmul {{.*}} : !moe.fp8block<64x32xf8E4M3FN, block = [1, 128], pow2>, !moe.fp8block<4x32x64xf8E4M3FN, block = [1, 128, 128], pow2>
// BLOCK-IR: moe.grouped_matmul {{.*}} transpose_rhs {{.*}} : !moe.fp8block<64x32xf8E4M3FN, block = [1, 128], pow2>, !moe.fp8block<4x32x32xf8E4M3FN, block = [1, 128, 128], pow2>
// BLOCK-IR: moe.grouped_matmul_wgrad {{.*}} : !moe.fp8block<64x32xf8E4M3FN, block = [128, 1], pow2>, !moe.fp8block<64x64xf8E4M3FN, block = [128, 1], pow2>
// BLOCK-IR-LABEL: func.func @fused_ref
// BLOCK-IR-NEXT: moe.grouped_mlp %arg0, %arg1, %arg2, %arg3 {moe.layer = 0 : i64} : tensor<64x32xf32>
// BLOCK-IR-LABEL: func.func @fused_q
// BLOCK-IR-NOT: moe.grouped_mlp
// BLOCK-IR: moe.grouped_matmul_wgrad {{.*}} {moe.layer = 1 : i64} : !moe.fp8block
// BLOCK-IR-NOT: moe.grouped_mlp

// MX-COUNT-9: [1,  0,  1]
// BF16-COUNT-9: [1,  1,  1]
// NONE-COUNT-9: [1,  1,  0]

#id2 = affine_map<(i, j) -> (i, j)>
#id3 = affine_map<(e, i, j) -> (e, i, j)>

func.func private @printMemrefI32(tensor<*xi32>)
func.func private @printMemrefF32(tensor<*xf32>)

//===----------------------------------------------------------------------===//
// The model, twice: layer 0 (kept) and layer 1 (quantized)
//===----------------------------------------------------------------------===//

func.func @mlp_ref(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                   %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<64x64xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off {moe.layer = 0} : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %y = moe.grouped_matmul %a, %w2, %off {moe.layer = 0} : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs {moe.layer = 0} : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %dx = moe.grouped_matmul %dh, %w1, %off transpose_rhs {moe.layer = 0} : tensor<64x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off {moe.layer = 0} : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off {moe.layer = 0} : tensor<64x32xf32>, tensor<64x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2, %h : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<64x64xf32>
}

func.func @mlp_q(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                 %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<64x64xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off {moe.layer = 1} : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %y = moe.grouped_matmul %a, %w2, %off {moe.layer = 1} : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs {moe.layer = 1} : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %dx = moe.grouped_matmul %dh, %w1, %off transpose_rhs {moe.layer = 1} : tensor<64x64xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off {moe.layer = 1} : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off {moe.layer = 1} : tensor<64x32xf32>, tensor<64x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2, %h : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<64x64xf32>
}

func.func @fused_ref(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                     %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %y = moe.grouped_mlp %x, %w1, %w2, %off {moe.layer = 0}
      : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy {moe.layer = 0}
      : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

func.func @fused_q(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                   %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %y = moe.grouped_mlp %x, %w1, %w2, %off {moe.layer = 1}
      : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<64x32xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy {moe.layer = 1}
      : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

//===----------------------------------------------------------------------===//
// Data and the error check
//===----------------------------------------------------------------------===//

/// A hash of a linear index to a float in [-1, 1) with 24 random bits
/// (uniformly spread mantissas, unlike multiples of 0.1).
func.func @noise(%idx: index, %seed: i32) -> f32 {
  %i = arith.index_cast %idx : index to i32
  %golden = arith.constant -1640531535 : i32  // 0x9E3779B1
  %m1 = arith.constant -2048144777 : i32      // 0x85EBCA77
  %m2 = arith.constant -1028477379 : i32      // 0xC2B2AE3D
  %c15 = arith.constant 15 : i32
  %c13 = arith.constant 13 : i32
  %c16 = arith.constant 16 : i32
  %c8 = arith.constant 8 : i32
  %s = arith.addi %i, %seed : i32
  %h0 = arith.muli %s, %golden : i32
  %t0 = arith.shrui %h0, %c15 : i32
  %h1 = arith.xori %h0, %t0 : i32
  %h2 = arith.muli %h1, %m1 : i32
  %t1 = arith.shrui %h2, %c13 : i32
  %h3 = arith.xori %h2, %t1 : i32
  %h4 = arith.muli %h3, %m2 : i32
  %t2 = arith.shrui %h4, %c16 : i32
  %h5 = arith.xori %h4, %t2 : i32
  %top = arith.shrui %h5, %c8 : i32
  %f = arith.uitofp %top : i32 to f32
  %scale = arith.constant 1.1920928955078125e-07 : f32  // 2^-23
  %one = arith.constant 1.0 : f32
  %u = arith.mulf %f, %scale : f32
  %v = arith.subf %u, %one : f32
  return %v : f32
}

/// x / dy [64, 32]: noise in [-1, 1).
func.func @gen2(%seed: i32) -> tensor<64x32xf32> {
  %e = tensor.empty() : tensor<64x32xf32>
  %r = linalg.generic {indexing_maps = [#id2], iterator_types = ["parallel", "parallel"]}
      outs(%e : tensor<64x32xf32>) {
  ^bb0(%o: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %c32 = arith.constant 32 : index
    %i32 = arith.muli %i, %c32 : index
    %lin = arith.addi %i32, %j : index
    %v = func.call @noise(%lin, %seed) : (index, i32) -> f32
    linalg.yield %v : f32
  } -> tensor<64x32xf32>
  return %r : tensor<64x32xf32>
}

/// Weights [4, 32, n]: noise in [-1, 1) / 4.
func.func @gen3(%n: index, %seed: i32) -> tensor<?x?x?xf32> {
  %c4 = arith.constant 4 : index
  %c32 = arith.constant 32 : index
  %t = tensor.empty(%c4, %c32, %n) : tensor<?x?x?xf32>
  %r = linalg.generic {indexing_maps = [#id3], iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%t : tensor<?x?x?xf32>) {
  ^bb0(%o: f32):
    %e = linalg.index 0 : index
    %i = linalg.index 1 : index
    %j = linalg.index 2 : index
    %e32 = arith.muli %e, %c32 : index
    %ei = arith.addi %e32, %i : index
    %ein = arith.muli %ei, %n : index
    %lin = arith.addi %ein, %j : index
    %v = func.call @noise(%lin, %seed) : (index, i32) -> f32
    %quarter = arith.constant 0.25 : f32
    %w = arith.mulf %v, %quarter : f32
    linalg.yield %w : f32
  } -> tensor<?x?x?xf32>
  return %r : tensor<?x?x?xf32>
}

/// Prints ||q - r||_F / ||r||_F and the flags
/// [err < tol_mx, err < tol_bf16, err > 0].
func.func @check(%q: tensor<?x?xf32>, %r: tensor<?x?xf32>, %tol_mx: f32, %tol_bf16: f32) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<2xf32>) -> tensor<2xf32>
  // [sum (q - r)^2, sum r^2]
  %sums:2 = linalg.generic {
      indexing_maps = [#id2, #id2, affine_map<(i, j) -> (0)>, affine_map<(i, j) -> (1)>],
      iterator_types = ["reduction", "reduction"]}
      ins(%q, %r : tensor<?x?xf32>, tensor<?x?xf32>) outs(%init, %init : tensor<2xf32>, tensor<2xf32>) {
  ^bb0(%a: f32, %b: f32, %d2: f32, %r2: f32):
    %d = arith.subf %a, %b : f32
    %dd = arith.mulf %d, %d : f32
    %bb = arith.mulf %b, %b : f32
    %s1 = arith.addf %d2, %dd : f32
    %s2 = arith.addf %r2, %bb : f32
    linalg.yield %s1, %s2 : f32, f32
  } -> (tensor<2xf32>, tensor<2xf32>)
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %num = tensor.extract %sums#0[%c0] : tensor<2xf32>
  %den = tensor.extract %sums#1[%c1] : tensor<2xf32>
  %ratio = arith.divf %num, %den : f32
  %err = math.sqrt %ratio : f32
  %f0 = arith.cmpf olt, %err, %tol_mx : f32
  %f1 = arith.cmpf olt, %err, %tol_bf16 : f32
  %f2 = arith.cmpf ogt, %err, %zero : f32
  %i0 = arith.extui %f0 : i1 to i32
  %i1 = arith.extui %f1 : i1 to i32
  %i2 = arith.extui %f2 : i1 to i32
  %errs = tensor.from_elements %err : tensor<1xf32>
  %erru = tensor.cast %errs : tensor<1xf32> to tensor<*xf32>
  func.call @printMemrefF32(%erru) : (tensor<*xf32>) -> ()
  %flags = tensor.from_elements %i0, %i1, %i2 : tensor<3xi32>
  %flagsu = tensor.cast %flags : tensor<3xi32> to tensor<*xi32>
  func.call @printMemrefI32(%flagsu) : (tensor<*xi32>) -> ()
  return
}

/// The MLP's results: their errors compound over the quantized tensors they
/// depend on: 2u (2^-3 MXFP8, 2^-7 bf16).
func.func @check_all(%y: tensor<64x32xf32>, %dx: tensor<64x32xf32>, %dw1: tensor<4x32x64xf32>, %dw2: tensor<4x32x32xf32>,
                     %ry: tensor<64x32xf32>, %rdx: tensor<64x32xf32>, %rdw1: tensor<4x32x64xf32>, %rdw2: tensor<4x32x32xf32>) {
  %tol_mx = arith.constant 0.125 : f32       // 2^-3
  %tol_bf16 = arith.constant 0.0078125 : f32 // 2^-7
  %y2 = tensor.cast %y : tensor<64x32xf32> to tensor<?x?xf32>
  %ry2 = tensor.cast %ry : tensor<64x32xf32> to tensor<?x?xf32>
  func.call @check(%y2, %ry2, %tol_mx, %tol_bf16) : (tensor<?x?xf32>, tensor<?x?xf32>, f32, f32) -> ()
  %dx2 = tensor.cast %dx : tensor<64x32xf32> to tensor<?x?xf32>
  %rdx2 = tensor.cast %rdx : tensor<64x32xf32> to tensor<?x?xf32>
  func.call @check(%dx2, %rdx2, %tol_mx, %tol_bf16) : (tensor<?x?xf32>, tensor<?x?xf32>, f32, f32) -> ()
  %dw1c = tensor.collapse_shape %dw1 [[0, 1], [2]] : tensor<4x32x64xf32> into tensor<128x64xf32>
  %rdw1c = tensor.collapse_shape %rdw1 [[0, 1], [2]] : tensor<4x32x64xf32> into tensor<128x64xf32>
  %dw12 = tensor.cast %dw1c : tensor<128x64xf32> to tensor<?x?xf32>
  %rdw12 = tensor.cast %rdw1c : tensor<128x64xf32> to tensor<?x?xf32>
  func.call @check(%dw12, %rdw12, %tol_mx, %tol_bf16) : (tensor<?x?xf32>, tensor<?x?xf32>, f32, f32) -> ()
  %dw2c = tensor.collapse_shape %dw2 [[0, 1], [2]] : tensor<4x32x32xf32> into tensor<128x32xf32>
  %rdw2c = tensor.collapse_shape %rdw2 [[0, 1], [2]] : tensor<4x32x32xf32> into tensor<128x32xf32>
  %dw22 = tensor.cast %dw2c : tensor<128x32xf32> to tensor<?x?xf32>
  %rdw22 = tensor.cast %rdw2c : tensor<128x32xf32> to tensor<?x?xf32>
  func.call @check(%dw22, %rdw22, %tol_mx, %tol_bf16) : (tensor<?x?xf32>, tensor<?x?xf32>, f32, f32) -> ()
  return
}

func.func @main() {
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  // E = 4 experts over R = 64 rows: expert 1 empty, rows 60-63 unowned.
  %off = arith.constant dense<[0, 20, 20, 45, 60]> : tensor<5xi32>
  %s1 = arith.constant 1 : i32
  %s2 = arith.constant 100000 : i32
  %s3 = arith.constant 200000 : i32
  %s4 = arith.constant 300000 : i32
  %x = func.call @gen2(%s1) : (i32) -> tensor<64x32xf32>
  %dy = func.call @gen2(%s2) : (i32) -> tensor<64x32xf32>
  %w1d = func.call @gen3(%c64, %s3) : (index, i32) -> tensor<?x?x?xf32>
  %w1 = tensor.cast %w1d : tensor<?x?x?xf32> to tensor<4x32x64xf32>
  %w2d = func.call @gen3(%c32, %s4) : (index, i32) -> tensor<?x?x?xf32>
  %w2 = tensor.cast %w2d : tensor<?x?x?xf32> to tensor<4x32x32xf32>

  %r:5 = func.call @mlp_ref(%x, %w1, %w2, %off, %dy)
      : (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<64x64xf32>)
  %q:5 = func.call @mlp_q(%x, %w1, %w2, %off, %dy)
      : (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<64x64xf32>)
  // One GEMM, h = x @ w1 (one quantization per operand): within u, 2^-4
  // for MXFP8 and 2^-8 for bf16.
  %u_mx = arith.constant 0.0625 : f32        // 2^-4
  %u_bf16 = arith.constant 0.00390625 : f32  // 2^-8
  %qh = tensor.cast %q#4 : tensor<64x64xf32> to tensor<?x?xf32>
  %rh = tensor.cast %r#4 : tensor<64x64xf32> to tensor<?x?xf32>
  func.call @check(%qh, %rh, %u_mx, %u_bf16) : (tensor<?x?xf32>, tensor<?x?xf32>, f32, f32) -> ()
  func.call @check_all(%q#0, %q#1, %q#2, %q#3, %r#0, %r#1, %r#2, %r#3)
      : (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>,
         tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) -> ()

  %fr:4 = func.call @fused_ref(%x, %w1, %w2, %off, %dy)
      : (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>)
  %fq:4 = func.call @fused_q(%x, %w1, %w2, %off, %dy)
      : (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>)
  func.call @check_all(%fq#0, %fq#1, %fq#2, %fq#3, %fr#0, %fr#1, %fr#2, %fr#3)
      : (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>,
         tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) -> ()
  return
}
