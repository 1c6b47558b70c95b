// The pass fuses every MLP below (forward and backward):
// RUN: moe-opt %s -moe-fuse-grouped-mlp | FileCheck %s --check-prefix=IR
// Run without and with it; both print the results' bit patterns (the
// buffer addresses printMemref shows are dropped):
// RUN: moe-opt %s --moe-cpu-pipeline | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | grep -v base@ > %t.unfused
// RUN: moe-opt %s -moe-fuse-grouped-mlp --moe-cpu-pipeline | mlir-runner -e main \
// RUN:   -entry-point-result=void -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils \
// RUN:   | grep -v base@ > %t.fused
// RUN: FileCheck %s < %t.unfused
// RUN: FileCheck %s < %t.fused
// Bit-identical, every element of every result:
// RUN: diff %t.unfused %t.fused
//
// -moe-fuse-grouped-mlp on the CPU: the forward and backward of one expert
// MLP, written as unfused grouped GEMMs + SwiGLU, in three recipes:
//   @mlp_float  f32 input, bf16 weights, interleaved gate/up, bf16 activation
//   @mlp_mx     MXFP8: every GEMM operand quantized as -moe-quantize does
//   @mlp_bf16   bf16 recipe: every f32 GEMM operand rounded to bf16
// With the pass each becomes moe.grouped_mlp + moe.grouped_mlp_backward
// (checked with IR). The two runs above print the bit patterns of y, dx,
// dw1 and dw2 and must print the same bytes. Inside each run, @main also
// compares every result with the hand-written fused ops (@fused_*): the
// number of differing bit patterns must be 0.
//
// Sizes: R = 64 rows, H = 32, F = 32 (2F = 64), N = 32, E = 4 experts with
// offsets [0, 20, 20, 45, 60]: expert 1 is empty and rows 60-63 belong to no
// expert. Every quantized dimension is a multiple of 32. Inputs are
// non-dyadic (multiples of 0.1), so sums round and their order matters.

// IR-LABEL: func.func @mlp_float
// IR-NEXT: moe.grouped_mlp %arg0, %arg1, %arg2, %arg3 layout(interleaved)
// IR-NEXT: moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 layout(interleaved) :
// IR-NEXT: return
// IR-LABEL: func.func @mlp_mx
// IR-COUNT-3: moe.quantize
// IR-NEXT: moe.grouped_mlp
// IR-NEXT: moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 gemm_type(f8E4M3FN) scale(floor) :
// IR-NEXT: return
// IR-LABEL: func.func @mlp_bf16
// IR-COUNT-3: linalg.generic
// IR: moe.grouped_mlp
// IR-NEXT: moe.grouped_mlp_backward %arg0, %arg1, %arg2, %arg3, %arg4 gemm_type(bf16) :
// IR-NEXT: return

#id2 = affine_map<(i, j) -> (i, j)>
#id3 = affine_map<(e, i, j) -> (e, i, j)>

func.func private @printMemrefI32(tensor<*xi32>)

//===----------------------------------------------------------------------===//
// The unfused MLPs (what the pass sees)
//===----------------------------------------------------------------------===//

func.func @mlp_float(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xbf16>, %w2: tensor<4x32x32xbf16>,
                     %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off : tensor<64x32xf32>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h layout(interleaved) : tensor<64x64xf32> -> tensor<64x32xbf16>
  %y = moe.grouped_matmul %a, %w2, %off : tensor<64x32xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs : tensor<64x32xf32>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da layout(interleaved) : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %dx = moe.grouped_matmul %dh, %w1, %off transpose_rhs : tensor<64x64xf32>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %x, %dh, %off : tensor<64x32xf32>, tensor<64x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off : tensor<64x32xbf16>, tensor<64x32xf32>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

func.func @mlp_mx(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                  %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %qx = moe.quantize %x scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw1 = moe.quantize %w1 scale(floor) : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 1>
  %h = moe.grouped_matmul %qx, %qw1, %off : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %qa = moe.quantize %a scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw2 = moe.quantize %w2 scale(floor) : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %qa, %qw2, %off : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x32xf32>
  %qdy = moe.quantize %dy scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw2t = moe.quantize %w2 scale(floor) : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 2>
  %da = moe.grouped_matmul %qdy, %qw2t, %off transpose_rhs : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x32xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %qdh = moe.quantize %dh scale(floor) : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 1>
  %qw1t = moe.quantize %w1 scale(floor) : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 2>
  %dx = moe.grouped_matmul %qdh, %qw1t, %off transpose_rhs : !moe.mx<64x64xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<64x32xf32>
  %qxc = moe.quantize %x scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %qdhc = moe.quantize %dh scale(floor) : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 0>
  %dw1 = moe.grouped_matmul_wgrad %qxc, %qdhc, %off : !moe.mx<64x32xf8E4M3FN, axis = 0>, !moe.mx<64x64xf8E4M3FN, axis = 0>, tensor<5xi32> -> tensor<4x32x64xf32>
  %qac = moe.quantize %a scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %qdyc = moe.quantize %dy scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 0>
  %dw2 = moe.grouped_matmul_wgrad %qac, %qdyc, %off : !moe.mx<64x32xf8E4M3FN, axis = 0>, !moe.mx<64x32xf8E4M3FN, axis = 0>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

// The bf16 recipe as -moe-quantize{recipe=bf16} writes it (one rounding per
// use; the rounding of dh shared by its two GEMMs, as after CSE).
func.func @mlp_bf16(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                    %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %ex = tensor.empty() : tensor<64x32xbf16>
  %xb = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<64x32xf32>) outs(%ex : tensor<64x32xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %b = arith.truncf %in : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<64x32xbf16>
  %ew1 = tensor.empty() : tensor<4x32x64xbf16>
  %w1b = linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w1 : tensor<4x32x64xf32>) outs(%ew1 : tensor<4x32x64xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %b = arith.truncf %in : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<4x32x64xbf16>
  %ew2 = tensor.empty() : tensor<4x32x32xbf16>
  %w2b = linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w2 : tensor<4x32x32xf32>) outs(%ew2 : tensor<4x32x32xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %b = arith.truncf %in : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<4x32x32xbf16>
  %h = moe.grouped_matmul %xb, %w1b, %off : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %ab = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<64x32xf32>) outs(%ex : tensor<64x32xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %b = arith.truncf %in : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<64x32xbf16>
  %y = moe.grouped_matmul %ab, %w2b, %off : tensor<64x32xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  %dyb = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%dy : tensor<64x32xf32>) outs(%ex : tensor<64x32xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %b = arith.truncf %in : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<64x32xbf16>
  %da = moe.grouped_matmul %dyb, %w2b, %off transpose_rhs : tensor<64x32xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<64x64xf32>, tensor<64x32xf32> -> tensor<64x64xf32>
  %edh = tensor.empty() : tensor<64x64xbf16>
  %dhb = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%dh : tensor<64x64xf32>) outs(%edh : tensor<64x64xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %b = arith.truncf %in : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<64x64xbf16>
  %dx = moe.grouped_matmul %dhb, %w1b, %off transpose_rhs : tensor<64x64xbf16>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  %dw1 = moe.grouped_matmul_wgrad %xb, %dhb, %off : tensor<64x32xbf16>, tensor<64x64xbf16>, tensor<5xi32> -> tensor<4x32x64xf32>
  %dw2 = moe.grouped_matmul_wgrad %ab, %dyb, %off : tensor<64x32xbf16>, tensor<64x32xbf16>, tensor<5xi32> -> tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

//===----------------------------------------------------------------------===//
// The same, written fused
//===----------------------------------------------------------------------===//

func.func @fused_float(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xbf16>, %w2: tensor<4x32x32xbf16>,
                       %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %y = moe.grouped_mlp %x, %w1, %w2, %off layout(interleaved)
      : tensor<64x32xf32>, tensor<4x32x64xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy layout(interleaved)
      : tensor<64x32xf32>, tensor<4x32x64xbf16>, tensor<4x32x32xbf16>, tensor<5xi32>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

func.func @fused_mx(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                    %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %qx = moe.quantize %x scale(floor) : tensor<64x32xf32> -> !moe.mx<64x32xf8E4M3FN, axis = 1>
  %qw1 = moe.quantize %w1 scale(floor) : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 1>
  %qw2 = moe.quantize %w2 scale(floor) : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 1>
  %y = moe.grouped_mlp %qx, %qw1, %qw2, %off scale(floor)
      : !moe.mx<64x32xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>,
        !moe.mx<4x32x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<64x32xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(f8E4M3FN) scale(floor)
      : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

func.func @fused_bf16(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                      %off: tensor<5xi32>, %dy: tensor<64x32xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) {
  %ex = tensor.empty() : tensor<64x32xbf16>
  %xb = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<64x32xf32>) outs(%ex : tensor<64x32xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %b = arith.truncf %in : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<64x32xbf16>
  %ew1 = tensor.empty() : tensor<4x32x64xbf16>
  %w1b = linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w1 : tensor<4x32x64xf32>) outs(%ew1 : tensor<4x32x64xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %b = arith.truncf %in : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<4x32x64xbf16>
  %ew2 = tensor.empty() : tensor<4x32x32xbf16>
  %w2b = linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w2 : tensor<4x32x32xf32>) outs(%ew2 : tensor<4x32x32xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %b = arith.truncf %in : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<4x32x32xbf16>
  %y = moe.grouped_mlp %xb, %w1b, %w2b, %off
      : tensor<64x32xbf16>, tensor<4x32x64xbf16>, tensor<4x32x32xbf16>, tensor<5xi32> -> tensor<64x32xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(bf16)
      : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
  return %y, %dx, %dw1, %dw2 : tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
}

//===----------------------------------------------------------------------===//
// Data, comparison and printing
//===----------------------------------------------------------------------===//

/// t[i, j] = ((i * a + j * b) mod 17) * 0.1 - 0.8, times s.
func.func @gen2(%a: index, %b: index, %s: f32) -> tensor<64x32xf32> {
  %e = tensor.empty() : tensor<64x32xf32>
  %r = linalg.generic {indexing_maps = [#id2], iterator_types = ["parallel", "parallel"]}
      outs(%e : tensor<64x32xf32>) {
  ^bb0(%o: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %ia = arith.muli %i, %a : index
    %jb = arith.muli %j, %b : index
    %sum = arith.addi %ia, %jb : index
    %c17 = arith.constant 17 : index
    %m = arith.remui %sum, %c17 : index
    %mi = arith.index_cast %m : index to i32
    %mf = arith.sitofp %mi : i32 to f32
    %tenth = arith.constant 0.1 : f32
    %off = arith.constant 0.8 : f32
    %v = arith.mulf %mf, %tenth : f32
    %w = arith.subf %v, %off : f32
    %ws = arith.mulf %w, %s : f32
    linalg.yield %ws : f32
  } -> tensor<64x32xf32>
  return %r : tensor<64x32xf32>
}

/// t[e, i, j] = ((e * 5 + i * a + j * b) mod 17) * 0.1 - 0.8, times s.
func.func @gen3(%n: index, %a: index, %b: index, %s: f32) -> tensor<?x?x?xf32> {
  %c4 = arith.constant 4 : index
  %c32 = arith.constant 32 : index
  %t = tensor.empty(%c4, %c32, %n) : tensor<?x?x?xf32>
  %r = linalg.generic {indexing_maps = [#id3], iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%t : tensor<?x?x?xf32>) {
  ^bb0(%o: f32):
    %e = linalg.index 0 : index
    %i = linalg.index 1 : index
    %j = linalg.index 2 : index
    %c5 = arith.constant 5 : index
    %e5 = arith.muli %e, %c5 : index
    %ia = arith.muli %i, %a : index
    %jb = arith.muli %j, %b : index
    %s0 = arith.addi %ia, %jb : index
    %sum = arith.addi %s0, %e5 : index
    %c17 = arith.constant 17 : index
    %m = arith.remui %sum, %c17 : index
    %mi = arith.index_cast %m : index to i32
    %mf = arith.sitofp %mi : i32 to f32
    %tenth = arith.constant 0.1 : f32
    %off = arith.constant 0.8 : f32
    %v = arith.mulf %mf, %tenth : f32
    %w = arith.subf %v, %off : f32
    %ws = arith.mulf %w, %s : f32
    linalg.yield %ws : f32
  } -> tensor<?x?x?xf32>
  return %r : tensor<?x?x?xf32>
}

func.func @to_bf16_3(%t: tensor<?x?x?xf32>) -> tensor<?x?x?xbf16> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?x?xf32>
  %d1 = tensor.dim %t, %c1 : tensor<?x?x?xf32>
  %d2 = tensor.dim %t, %c2 : tensor<?x?x?xf32>
  %init = tensor.empty(%d0, %d1, %d2) : tensor<?x?x?xbf16>
  %r = linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t : tensor<?x?x?xf32>) outs(%init : tensor<?x?x?xbf16>) {
  ^bb0(%in: f32, %o: bf16):
    %b = arith.truncf %in : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<?x?x?xbf16>
  return %r : tensor<?x?x?xbf16>
}

/// The bit patterns of a 2-d f32 tensor, as i32.
func.func @bits(%t: tensor<?x?xf32>) -> tensor<?x?xi32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?xf32>
  %d1 = tensor.dim %t, %c1 : tensor<?x?xf32>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xi32>
  %r = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<?x?xf32>) outs(%e : tensor<?x?xi32>) {
  ^bb0(%x: f32, %o: i32):
    %b = arith.bitcast %x : f32 to i32
    linalg.yield %b : i32
  } -> tensor<?x?xi32>
  return %r : tensor<?x?xi32>
}

/// Prints the number of elements whose bit patterns differ, then the bit
/// patterns of %a.
func.func @compare(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>) {
  %ba = func.call @bits(%a) : (tensor<?x?xf32>) -> tensor<?x?xi32>
  %bb = func.call @bits(%b) : (tensor<?x?xf32>) -> tensor<?x?xi32>
  %zero = arith.constant 0 : i32
  %e = tensor.empty() : tensor<1xi32>
  %init = linalg.fill ins(%zero : i32) outs(%e : tensor<1xi32>) -> tensor<1xi32>
  %n = linalg.generic {
      indexing_maps = [#id2, #id2, affine_map<(i, j) -> (0)>],
      iterator_types = ["reduction", "reduction"]}
      ins(%ba, %bb : tensor<?x?xi32>, tensor<?x?xi32>) outs(%init : tensor<1xi32>) {
  ^bb0(%x: i32, %y: i32, %acc: i32):
    %ne = arith.cmpi ne, %x, %y : i32
    %one = arith.extui %ne : i1 to i32
    %s = arith.addi %acc, %one : i32
    linalg.yield %s : i32
  } -> tensor<1xi32>
  %nu = tensor.cast %n : tensor<1xi32> to tensor<*xi32>
  func.call @printMemrefI32(%nu) : (tensor<*xi32>) -> ()
  %bu = tensor.cast %ba : tensor<?x?xi32> to tensor<*xi32>
  func.call @printMemrefI32(%bu) : (tensor<*xi32>) -> ()
  return
}

func.func @compare_all(%y: tensor<64x32xf32>, %dx: tensor<64x32xf32>, %dw1: tensor<4x32x64xf32>, %dw2: tensor<4x32x32xf32>,
                       %fy: tensor<64x32xf32>, %fdx: tensor<64x32xf32>, %fdw1: tensor<4x32x64xf32>, %fdw2: tensor<4x32x32xf32>) {
  %y2 = tensor.cast %y : tensor<64x32xf32> to tensor<?x?xf32>
  %fy2 = tensor.cast %fy : tensor<64x32xf32> to tensor<?x?xf32>
  func.call @compare(%y2, %fy2) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  %dx2 = tensor.cast %dx : tensor<64x32xf32> to tensor<?x?xf32>
  %fdx2 = tensor.cast %fdx : tensor<64x32xf32> to tensor<?x?xf32>
  func.call @compare(%dx2, %fdx2) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  %dw1c = tensor.collapse_shape %dw1 [[0, 1], [2]] : tensor<4x32x64xf32> into tensor<128x64xf32>
  %fdw1c = tensor.collapse_shape %fdw1 [[0, 1], [2]] : tensor<4x32x64xf32> into tensor<128x64xf32>
  %dw12 = tensor.cast %dw1c : tensor<128x64xf32> to tensor<?x?xf32>
  %fdw12 = tensor.cast %fdw1c : tensor<128x64xf32> to tensor<?x?xf32>
  func.call @compare(%dw12, %fdw12) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  %dw2c = tensor.collapse_shape %dw2 [[0, 1], [2]] : tensor<4x32x32xf32> into tensor<128x32xf32>
  %fdw2c = tensor.collapse_shape %fdw2 [[0, 1], [2]] : tensor<4x32x32xf32> into tensor<128x32xf32>
  %dw22 = tensor.cast %dw2c : tensor<128x32xf32> to tensor<?x?xf32>
  %fdw22 = tensor.cast %fdw2c : tensor<128x32xf32> to tensor<?x?xf32>
  func.call @compare(%dw22, %fdw22) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  return
}

func.func @main() {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %c7 = arith.constant 7 : index
  %c11 = arith.constant 11 : index
  %c13 = arith.constant 13 : index
  %one = arith.constant 1.0 : f32
  %quarter = arith.constant 0.25 : f32
  %off = arith.constant dense<[0, 20, 20, 45, 60]> : tensor<5xi32>
  // Per recipe (float, mxfp8, bf16) and result (y, dx, dw1, dw2): the
  // number of elements that differ from the hand-fused ops.
  // CHECK-COUNT-12: {{^}}[0]{{$}}
  %x = func.call @gen2(%c3, %c7, %one) : (index, index, f32) -> tensor<64x32xf32>
  %dy = func.call @gen2(%c11, %c2, %one) : (index, index, f32) -> tensor<64x32xf32>
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %w1d = func.call @gen3(%c64, %c13, %c1, %quarter) : (index, index, index, f32) -> tensor<?x?x?xf32>
  %w1 = tensor.cast %w1d : tensor<?x?x?xf32> to tensor<4x32x64xf32>
  %w2d = func.call @gen3(%c32, %c2, %c3, %quarter) : (index, index, index, f32) -> tensor<?x?x?xf32>
  %w2 = tensor.cast %w2d : tensor<?x?x?xf32> to tensor<4x32x32xf32>
  %w1bd = func.call @to_bf16_3(%w1d) : (tensor<?x?x?xf32>) -> tensor<?x?x?xbf16>
  %w1b = tensor.cast %w1bd : tensor<?x?x?xbf16> to tensor<4x32x64xbf16>
  %w2bd = func.call @to_bf16_3(%w2d) : (tensor<?x?x?xf32>) -> tensor<?x?x?xbf16>
  %w2b = tensor.cast %w2bd : tensor<?x?x?xbf16> to tensor<4x32x32xbf16>

  %r:4 = func.call @mlp_float(%x, %w1b, %w2b, %off, %dy)
      : (tensor<64x32xf32>, tensor<4x32x64xbf16>, tensor<4x32x32xbf16>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>)
  %f:4 = func.call @fused_float(%x, %w1b, %w2b, %off, %dy)
      : (tensor<64x32xf32>, tensor<4x32x64xbf16>, tensor<4x32x32xbf16>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>)
  func.call @compare_all(%r#0, %r#1, %r#2, %r#3, %f#0, %f#1, %f#2, %f#3)
      : (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>,
         tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) -> ()

  %rm:4 = func.call @mlp_mx(%x, %w1, %w2, %off, %dy)
      : (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>)
  %fm:4 = func.call @fused_mx(%x, %w1, %w2, %off, %dy)
      : (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>)
  func.call @compare_all(%rm#0, %rm#1, %rm#2, %rm#3, %fm#0, %fm#1, %fm#2, %fm#3)
      : (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>,
         tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) -> ()

  %rb:4 = func.call @mlp_bf16(%x, %w1, %w2, %off, %dy)
      : (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>)
  %fb:4 = func.call @fused_bf16(%x, %w1, %w2, %off, %dy)
      : (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>)
  func.call @compare_all(%rb#0, %rb#1, %rb#2, %rb#3, %fb#0, %fb#1, %fb#2, %fb#3)
      : (tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>,
         tensor<64x32xf32>, tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>) -> ()
  return
}
