// RUN: cat %s | %run_cpu | FileCheck %s
// RUN: cat %s | %run_parallel_cpu | FileCheck %s

// moe.grouped_matmul and moe.grouped_matmul_wgrad on the CPU, each compared
// with an explicit per-expert loop written in this file (scf.for over the
// experts, tensor.extract_slice of the group's rows and of the expert's
// weights, linalg.matmul (and linalg.transpose for wgrad), tensor.insert_slice
// into a zero result). Both results are printed and CHECKed against the
// same expected numbers, and compared bit for bit in IR (@count_diff prints
// the number of differing elements: 0).
//
// Groups (E = 4, R = 7): offsets [0, 2, 2, 5, 6]: expert 0 owns rows 0-1,
// expert 1 none (empty), expert 2 rows 2-4, expert 3 row 5; row 6 belongs to
// no expert and must give zeros (forward) and contribute nothing (wgrad).
//
// Expected values. f32 case: small integers, by hand:
//   row 0 = [1, 2, 3] @ W0  = [1 + 3, 2 + 3]            = [4, 5]
//   row 1 = [0, 1, -1] @ W0 = [-1, 1 - 1]               = [-1, 0]
//   row 2 = [2, 0, 1] @ W2  = [4, -2 + 3]               = [4, 1]
//   row 3 = [-1, 1, 1] @ W2 = [-2 + 1, 1 + 3]           = [-1, 4]
//   row 4 = [3, 1, 0] @ W2  = [6 + 1, -3]               = [7, -3]
//   row 5 = [1, -2, 2] @ W3 = [1 - 6 + 10, 2 - 8 + 12]  = [5, 6]
//   wgrad dW0 = A[0:2]^T G[0:2] = [[1, 0], [2, 1], [3, -1]], dW1 = 0,
//   dW2 = A[2:5]^T G[2:5] = [[2+1+6, 4-1], [-1+2, 1], [1-1, 2+1]]
//       = [[9, 3], [1, 1], [0, 3]], dW3 = [1,-2,2]^T [1, 1].
// bf16 case: values drawn at random (Python, seed 7) and rounded to bf16;
// expected values computed in Python emulating f32 (products of two bf16
// are exact in f32; every addition rounded to f32 in order of increasing k,
// resp. increasing row for wgrad), then rounded to nearest-even bf16 for the
// bf16 result. Values printed with 6 significant digits (%g).

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)

/// The number of elements whose bit patterns differ (0 = bit-identical).
func.func @count_diff(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>) {
  %zero = arith.constant 0 : i32
  %e = tensor.empty() : tensor<1xi32>
  %init = linalg.fill ins(%zero : i32) outs(%e : tensor<1xi32>) -> tensor<1xi32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>,
                       affine_map<(i, j) -> (0)>],
      iterator_types = ["reduction", "reduction"]}
      ins(%a, %b : tensor<?x?xf32>, tensor<?x?xf32>) outs(%init : tensor<1xi32>) {
  ^bb0(%x: f32, %y: f32, %acc: i32):
    %xb = arith.bitcast %x : f32 to i32
    %yb = arith.bitcast %y : f32 to i32
    %ne = arith.cmpi ne, %xb, %yb : i32
    %one = arith.extui %ne : i1 to i32
    %s = arith.addi %acc, %one : i32
    linalg.yield %s : i32
  } -> tensor<1xi32>
  %u = tensor.cast %r : tensor<1xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}

func.func @pf2(%t: tensor<?x?xf32>) {
  %u = tensor.cast %t : tensor<?x?xf32> to tensor<*xf32>
  call @printMemrefF32(%u) : (tensor<*xf32>) -> ()
  return
}
func.func @pf3(%t: tensor<?x?x?xf32>) {
  %u = tensor.cast %t : tensor<?x?x?xf32> to tensor<*xf32>
  call @printMemrefF32(%u) : (tensor<*xf32>) -> ()
  return
}
/// A [d0, d1] f32 tensor of non-dyadic values
///   t[i, j] = ((i * a + j * b) mod 17) * 0.1 - 0.8
/// (0.1 is not a binary fraction, so the GEMM sums below round and their
/// order matters).
func.func @gen2(%d0: index, %d1: index, %a: index, %b: index) -> tensor<?x?xf32> {
  %e = tensor.empty(%d0, %d1) : tensor<?x?xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]} outs(%e : tensor<?x?xf32>) {
  ^bb0(%o: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %ia = arith.muli %i, %a : index
    %jb = arith.muli %j, %b : index
    %s = arith.addi %ia, %jb : index
    %c17 = arith.constant 17 : index
    %m = arith.remui %s, %c17 : index
    %mi = arith.index_cast %m : index to i32
    %mf = arith.sitofp %mi : i32 to f32
    %tenth = arith.constant 0.1 : f32
    %off = arith.constant 0.8 : f32
    %v = arith.mulf %mf, %tenth : f32
    %w = arith.subf %v, %off : f32
    linalg.yield %w : f32
  } -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
/// bf16 -> f32 (exact) for printing.
func.func @ext(%t: tensor<?x?xbf16>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?xbf16>
  %d1 = tensor.dim %t, %c1 : tensor<?x?xbf16>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<?x?xbf16>) outs(%e : tensor<?x?xf32>) {
  ^bb0(%x: bf16, %o: f32):
    %y = arith.extf %x : bf16 to f32
    linalg.yield %y : f32
  } -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
/// f32 -> bf16 (round to nearest even).
func.func @trunc(%t: tensor<?x?xf32>) -> tensor<?x?xbf16> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?xf32>
  %d1 = tensor.dim %t, %c1 : tensor<?x?xf32>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xbf16>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<?x?xf32>) outs(%e : tensor<?x?xbf16>) {
  ^bb0(%x: f32, %o: bf16):
    %y = arith.truncf %x : f32 to bf16
    linalg.yield %y : bf16
  } -> tensor<?x?xbf16>
  return %r : tensor<?x?xbf16>
}

/// Reference forward: for every expert e, rows [off[e], off[e+1]) of %a times
/// %w[e] with linalg.matmul (f32 accumulator), inserted into a zero result.
func.func @ref_fwd_f32(%a: tensor<?x?xf32>, %w: tensor<?x?x?xf32>, %off: tensor<?xi32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %rows = tensor.dim %a, %c0 : tensor<?x?xf32>
  %kk = tensor.dim %a, %c1 : tensor<?x?xf32>
  %nn = tensor.dim %w, %c2 : tensor<?x?x?xf32>
  %noff = tensor.dim %off, %c0 : tensor<?xi32>
  %ne = arith.subi %noff, %c1 : index
  %e0 = tensor.empty(%rows, %nn) : tensor<?x?xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e0 : tensor<?x?xf32>) -> tensor<?x?xf32>
  %res = scf.for %e = %c0 to %ne step %c1 iter_args(%acc = %init) -> (tensor<?x?xf32>) {
    %lo_i = tensor.extract %off[%e] : tensor<?xi32>
    %e1 = arith.addi %e, %c1 : index
    %hi_i = tensor.extract %off[%e1] : tensor<?xi32>
    %lo = arith.index_cast %lo_i : i32 to index
    %hi = arith.index_cast %hi_i : i32 to index
    %m = arith.subi %hi, %lo : index
    %as = tensor.extract_slice %a[%lo, 0] [%m, %kk] [1, 1] : tensor<?x?xf32> to tensor<?x?xf32>
    %ws = tensor.extract_slice %w[%e, 0, 0] [1, %kk, %nn] [1, 1, 1] : tensor<?x?x?xf32> to tensor<?x?xf32>
    %ce = tensor.empty(%m, %nn) : tensor<?x?xf32>
    %cz = linalg.fill ins(%zero : f32) outs(%ce : tensor<?x?xf32>) -> tensor<?x?xf32>
    %mm = linalg.matmul ins(%as, %ws : tensor<?x?xf32>, tensor<?x?xf32>) outs(%cz : tensor<?x?xf32>) -> tensor<?x?xf32>
    %upd = tensor.insert_slice %mm into %acc[%lo, 0] [%m, %nn] [1, 1] : tensor<?x?xf32> into tensor<?x?xf32>
    scf.yield %upd : tensor<?x?xf32>
  }
  return %res : tensor<?x?xf32>
}

/// Reference forward: for every expert e, rows [off[e], off[e+1]) of %a times
/// %w[e] with linalg.matmul (f32 accumulator), inserted into a zero result.
func.func @ref_fwd_bf16(%a: tensor<?x?xbf16>, %w: tensor<?x?x?xbf16>, %off: tensor<?xi32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %rows = tensor.dim %a, %c0 : tensor<?x?xbf16>
  %kk = tensor.dim %a, %c1 : tensor<?x?xbf16>
  %nn = tensor.dim %w, %c2 : tensor<?x?x?xbf16>
  %noff = tensor.dim %off, %c0 : tensor<?xi32>
  %ne = arith.subi %noff, %c1 : index
  %e0 = tensor.empty(%rows, %nn) : tensor<?x?xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e0 : tensor<?x?xf32>) -> tensor<?x?xf32>
  %res = scf.for %e = %c0 to %ne step %c1 iter_args(%acc = %init) -> (tensor<?x?xf32>) {
    %lo_i = tensor.extract %off[%e] : tensor<?xi32>
    %e1 = arith.addi %e, %c1 : index
    %hi_i = tensor.extract %off[%e1] : tensor<?xi32>
    %lo = arith.index_cast %lo_i : i32 to index
    %hi = arith.index_cast %hi_i : i32 to index
    %m = arith.subi %hi, %lo : index
    %as = tensor.extract_slice %a[%lo, 0] [%m, %kk] [1, 1] : tensor<?x?xbf16> to tensor<?x?xbf16>
    %ws = tensor.extract_slice %w[%e, 0, 0] [1, %kk, %nn] [1, 1, 1] : tensor<?x?x?xbf16> to tensor<?x?xbf16>
    %ce = tensor.empty(%m, %nn) : tensor<?x?xf32>
    %cz = linalg.fill ins(%zero : f32) outs(%ce : tensor<?x?xf32>) -> tensor<?x?xf32>
    %mm = linalg.matmul ins(%as, %ws : tensor<?x?xbf16>, tensor<?x?xbf16>) outs(%cz : tensor<?x?xf32>) -> tensor<?x?xf32>
    %upd = tensor.insert_slice %mm into %acc[%lo, 0] [%m, %nn] [1, 1] : tensor<?x?xf32> into tensor<?x?xf32>
    scf.yield %upd : tensor<?x?xf32>
  }
  return %res : tensor<?x?xf32>
}

/// Reference wgrad: for every expert e, transpose(rows g of %a) @ rows g of
/// %g with linalg.transpose + linalg.matmul, inserted at [e, 0, 0] of a zero
/// [E, K, N] result (an empty group leaves its zeros).
func.func @ref_wgrad_f32(%a: tensor<?x?xf32>, %g: tensor<?x?xf32>, %off: tensor<?xi32>) -> tensor<?x?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %kk = tensor.dim %a, %c1 : tensor<?x?xf32>
  %nn = tensor.dim %g, %c1 : tensor<?x?xf32>
  %noff = tensor.dim %off, %c0 : tensor<?xi32>
  %ne = arith.subi %noff, %c1 : index
  %e0 = tensor.empty(%ne, %kk, %nn) : tensor<?x?x?xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e0 : tensor<?x?x?xf32>) -> tensor<?x?x?xf32>
  %res = scf.for %e = %c0 to %ne step %c1 iter_args(%acc = %init) -> (tensor<?x?x?xf32>) {
    %lo_i = tensor.extract %off[%e] : tensor<?xi32>
    %e1 = arith.addi %e, %c1 : index
    %hi_i = tensor.extract %off[%e1] : tensor<?xi32>
    %lo = arith.index_cast %lo_i : i32 to index
    %hi = arith.index_cast %hi_i : i32 to index
    %m = arith.subi %hi, %lo : index
    %as = tensor.extract_slice %a[%lo, 0] [%m, %kk] [1, 1] : tensor<?x?xf32> to tensor<?x?xf32>
    %gs = tensor.extract_slice %g[%lo, 0] [%m, %nn] [1, 1] : tensor<?x?xf32> to tensor<?x?xf32>
    %te = tensor.empty(%kk, %m) : tensor<?x?xf32>
    %at = linalg.transpose ins(%as : tensor<?x?xf32>) outs(%te : tensor<?x?xf32>) permutation = [1, 0]
    %ce = tensor.empty(%kk, %nn) : tensor<?x?xf32>
    %cz = linalg.fill ins(%zero : f32) outs(%ce : tensor<?x?xf32>) -> tensor<?x?xf32>
    %mm = linalg.matmul ins(%at, %gs : tensor<?x?xf32>, tensor<?x?xf32>) outs(%cz : tensor<?x?xf32>) -> tensor<?x?xf32>
    %upd = tensor.insert_slice %mm into %acc[%e, 0, 0] [1, %kk, %nn] [1, 1, 1] : tensor<?x?xf32> into tensor<?x?x?xf32>
    scf.yield %upd : tensor<?x?x?xf32>
  }
  return %res : tensor<?x?x?xf32>
}

/// Reference wgrad: for every expert e, transpose(rows g of %a) @ rows g of
/// %g with linalg.transpose + linalg.matmul, inserted at [e, 0, 0] of a zero
/// [E, K, N] result (an empty group leaves its zeros).
func.func @ref_wgrad_bf16(%a: tensor<?x?xbf16>, %g: tensor<?x?xbf16>, %off: tensor<?xi32>) -> tensor<?x?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %kk = tensor.dim %a, %c1 : tensor<?x?xbf16>
  %nn = tensor.dim %g, %c1 : tensor<?x?xbf16>
  %noff = tensor.dim %off, %c0 : tensor<?xi32>
  %ne = arith.subi %noff, %c1 : index
  %e0 = tensor.empty(%ne, %kk, %nn) : tensor<?x?x?xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e0 : tensor<?x?x?xf32>) -> tensor<?x?x?xf32>
  %res = scf.for %e = %c0 to %ne step %c1 iter_args(%acc = %init) -> (tensor<?x?x?xf32>) {
    %lo_i = tensor.extract %off[%e] : tensor<?xi32>
    %e1 = arith.addi %e, %c1 : index
    %hi_i = tensor.extract %off[%e1] : tensor<?xi32>
    %lo = arith.index_cast %lo_i : i32 to index
    %hi = arith.index_cast %hi_i : i32 to index
    %m = arith.subi %hi, %lo : index
    %as = tensor.extract_slice %a[%lo, 0] [%m, %kk] [1, 1] : tensor<?x?xbf16> to tensor<?x?xbf16>
    %gs = tensor.extract_slice %g[%lo, 0] [%m, %nn] [1, 1] : tensor<?x?xbf16> to tensor<?x?xbf16>
    %te = tensor.empty(%kk, %m) : tensor<?x?xbf16>
    %at = linalg.transpose ins(%as : tensor<?x?xbf16>) outs(%te : tensor<?x?xbf16>) permutation = [1, 0]
    %ce = tensor.empty(%kk, %nn) : tensor<?x?xf32>
    %cz = linalg.fill ins(%zero : f32) outs(%ce : tensor<?x?xf32>) -> tensor<?x?xf32>
    %mm = linalg.matmul ins(%at, %gs : tensor<?x?xbf16>, tensor<?x?xbf16>) outs(%cz : tensor<?x?xf32>) -> tensor<?x?xf32>
    %upd = tensor.insert_slice %mm into %acc[%e, 0, 0] [1, %kk, %nn] [1, 1, 1] : tensor<?x?xf32> into tensor<?x?x?xf32>
    scf.yield %upd : tensor<?x?x?xf32>
  }
  return %res : tensor<?x?x?xf32>
}

func.func @main() {
  %off = arith.constant dense<[0, 2, 2, 5, 6]> : tensor<5xi32>
  %off_ = tensor.cast %off : tensor<5xi32> to tensor<?xi32>

  //===--------------------------------------------------------------------===//
  // f32 forward
  //===--------------------------------------------------------------------===//
  %a = arith.constant dense<[[1.0, 2.0, 3.0], [0.0, 1.0, -1.0], [2.0, 0.0, 1.0],
                             [-1.0, 1.0, 1.0], [3.0, 1.0, 0.0], [1.0, -2.0, 2.0],
                             [5.0, 5.0, 5.0]]> : tensor<7x3xf32>
  %w = arith.constant dense<[[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
                             [[9.0, 9.0], [9.0, 9.0], [9.0, 9.0]],
                             [[2.0, -1.0], [1.0, 0.0], [0.0, 3.0]],
                             [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]]> : tensor<4x3x2xf32>
  %a_ = tensor.cast %a : tensor<7x3xf32> to tensor<?x?xf32>
  %w_ = tensor.cast %w : tensor<4x3x2xf32> to tensor<?x?x?xf32>

  %y = moe.grouped_matmul %a, %w, %off
      : tensor<7x3xf32>, tensor<4x3x2xf32>, tensor<5xi32> -> tensor<7x2xf32>
  %y_ = tensor.cast %y : tensor<7x2xf32> to tensor<?x?xf32>
  call @pf2(%y_) : (tensor<?x?xf32>) -> ()
  // CHECK-LABEL: sizes = [7, 2]
  // CHECK-NEXT: {{\[}}[4, 5],
  // CHECK-NEXT:  [-1, 0],
  // CHECK-NEXT:  [4, 1],
  // CHECK-NEXT:  [-1, 4],
  // CHECK-NEXT:  [7, -3],
  // CHECK-NEXT:  [5, 6],
  // CHECK-NEXT:  [0, 0]]
  %yref = call @ref_fwd_f32(%a_, %w_, %off_)
      : (tensor<?x?xf32>, tensor<?x?x?xf32>, tensor<?xi32>) -> tensor<?x?xf32>
  call @pf2(%yref) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [7, 2]
  // CHECK-NEXT: {{\[}}[4, 5],
  // CHECK-NEXT:  [-1, 0],
  // CHECK-NEXT:  [4, 1],
  // CHECK-NEXT:  [-1, 4],
  // CHECK-NEXT:  [7, -3],
  // CHECK-NEXT:  [5, 6],
  // CHECK-NEXT:  [0, 0]]
  // Bit for bit: grouped_matmul == per-expert loop (0 elements differ).
  call @count_diff(%y_, %yref) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]

  // transpose_rhs: the same products from W^T ([E, N, K], built with
  // linalg.transpose).
  %wt0 = tensor.empty() : tensor<4x2x3xf32>
  %wt = linalg.transpose ins(%w : tensor<4x3x2xf32>) outs(%wt0 : tensor<4x2x3xf32>)
      permutation = [0, 2, 1]
  %yt = moe.grouped_matmul %a, %wt, %off transpose_rhs
      : tensor<7x3xf32>, tensor<4x2x3xf32>, tensor<5xi32> -> tensor<7x2xf32>
  %yt_ = tensor.cast %yt : tensor<7x2xf32> to tensor<?x?xf32>
  call @pf2(%yt_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [7, 2]
  // CHECK-NEXT: {{\[}}[4, 5],
  // CHECK-NEXT:  [-1, 0],
  // CHECK-NEXT:  [4, 1],
  // CHECK-NEXT:  [-1, 4],
  // CHECK-NEXT:  [7, -3],
  // CHECK-NEXT:  [5, 6],
  // CHECK-NEXT:  [0, 0]]
  call @count_diff(%yt_, %yref) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]

  //===--------------------------------------------------------------------===//
  // bf16 forward: f32 result, and bf16 result (the f32 sum rounded once).
  //===--------------------------------------------------------------------===//
  %ab = arith.constant dense<[[-3.796875, -2.640625, 3.296875], [1.5234375, 3.640625, 0.24609375], [-1.734375, 0.453125, -0.330078125], [3.796875, 2.34375, -0.29296875], [0.28125, 1.2265625, 2.203125], [-2.28125, 0.5, 1.5546875], [2.296875, 2.03125, -3.125]]> : tensor<7x3xbf16>
  %wb = arith.constant dense<[[[-2.390625, -1.5078125], [3.203125, 0.419921875], [-2.140625, -2.9375]], [[-2.46875, 0.55859375], [-0.7421875, -0.69140625], [-1.7421875, 3.078125]], [[-1.4296875, -2.421875], [-0.369140625, 3.78125], [-2.8125, 0.3359375]], [[-2.625, -1.2109375], [-3.5625, -0.1884765625], [-1.484375, 2.03125]]]> : tensor<4x3x2xbf16>
  %ab_ = tensor.cast %ab : tensor<7x3xbf16> to tensor<?x?xbf16>
  %wb_ = tensor.cast %wb : tensor<4x3x2xbf16> to tensor<?x?x?xbf16>

  %yb = moe.grouped_matmul %ab, %wb, %off
      : tensor<7x3xbf16>, tensor<4x3x2xbf16>, tensor<5xi32> -> tensor<7x2xf32>
  %yb_ = tensor.cast %yb : tensor<7x2xf32> to tensor<?x?xf32>
  call @pf2(%yb_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [7, 2]
  // CHECK-NEXT: {{\[}}[-6.43872, -5.06845],
  // CHECK-NEXT:  [7.49261, -1.49118],
  // CHECK-NEXT:  [3.24069, 5.80293],
  // CHECK-NEXT:  [-5.46954, -0.431671],
  // CHECK-NEXT:  [-7.05116, 4.6969],
  // CHECK-NEXT:  [1.89929, 5.82617],
  // CHECK-NEXT:  [0, 0]]
  %ybref = call @ref_fwd_bf16(%ab_, %wb_, %off_)
      : (tensor<?x?xbf16>, tensor<?x?x?xbf16>, tensor<?xi32>) -> tensor<?x?xf32>
  call @pf2(%ybref) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [7, 2]
  // CHECK-NEXT: {{\[}}[-6.43872, -5.06845],
  // CHECK-NEXT:  [7.49261, -1.49118],
  // CHECK-NEXT:  [3.24069, 5.80293],
  // CHECK-NEXT:  [-5.46954, -0.431671],
  // CHECK-NEXT:  [-7.05116, 4.6969],
  // CHECK-NEXT:  [1.89929, 5.82617],
  // CHECK-NEXT:  [0, 0]]

  %wbt0 = tensor.empty() : tensor<4x2x3xbf16>
  %wbt = linalg.transpose ins(%wb : tensor<4x3x2xbf16>) outs(%wbt0 : tensor<4x2x3xbf16>)
      permutation = [0, 2, 1]
  %ybt = moe.grouped_matmul %ab, %wbt, %off transpose_rhs
      : tensor<7x3xbf16>, tensor<4x2x3xbf16>, tensor<5xi32> -> tensor<7x2xf32>
  %ybt_ = tensor.cast %ybt : tensor<7x2xf32> to tensor<?x?xf32>
  call @pf2(%ybt_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [7, 2]
  // CHECK-NEXT: {{\[}}[-6.43872, -5.06845],
  // CHECK-NEXT:  [7.49261, -1.49118],
  // CHECK-NEXT:  [3.24069, 5.80293],
  // CHECK-NEXT:  [-5.46954, -0.431671],
  // CHECK-NEXT:  [-7.05116, 4.6969],
  // CHECK-NEXT:  [1.89929, 5.82617],
  // CHECK-NEXT:  [0, 0]]
  call @count_diff(%ybt_, %ybref) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]
  call @count_diff(%yb_, %ybref) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]

  %ybb = moe.grouped_matmul %ab, %wb, %off
      : tensor<7x3xbf16>, tensor<4x3x2xbf16>, tensor<5xi32> -> tensor<7x2xbf16>
  %ybb_ = tensor.cast %ybb : tensor<7x2xbf16> to tensor<?x?xbf16>
  %ybb32 = call @ext(%ybb_) : (tensor<?x?xbf16>) -> tensor<?x?xf32>
  call @pf2(%ybb32) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [7, 2]
  // CHECK-NEXT: {{\[}}[-6.4375, -5.0625],
  // CHECK-NEXT:  [7.5, -1.49219],
  // CHECK-NEXT:  [3.23438, 5.8125],
  // CHECK-NEXT:  [-5.46875, -0.431641],
  // CHECK-NEXT:  [-7.0625, 4.6875],
  // CHECK-NEXT:  [1.89844, 5.8125],
  // CHECK-NEXT:  [0, 0]]
  %ybbref = call @trunc(%ybref) : (tensor<?x?xf32>) -> tensor<?x?xbf16>
  %ybbref32 = call @ext(%ybbref) : (tensor<?x?xbf16>) -> tensor<?x?xf32>
  call @pf2(%ybbref32) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [7, 2]
  // CHECK-NEXT: {{\[}}[-6.4375, -5.0625],
  // CHECK-NEXT:  [7.5, -1.49219],
  // CHECK-NEXT:  [3.23438, 5.8125],
  // CHECK-NEXT:  [-5.46875, -0.431641],
  // CHECK-NEXT:  [-7.0625, 4.6875],
  // CHECK-NEXT:  [1.89844, 5.8125],
  // CHECK-NEXT:  [0, 0]]
  call @count_diff(%ybb32, %ybbref32) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]

  //===--------------------------------------------------------------------===//
  // wgrad, f32 and bf16: [E, K, N] = [4, 3, 2]; expert 1 (empty) gives zeros,
  // row 6 (no expert; G row [7, 7] resp. random) is not read.
  //===--------------------------------------------------------------------===//
  %g = arith.constant dense<[[1.0, 0.0], [0.0, 1.0], [1.0, 2.0], [-1.0, 1.0],
                             [2.0, 0.0], [1.0, 1.0], [7.0, 7.0]]> : tensor<7x2xf32>
  %g_ = tensor.cast %g : tensor<7x2xf32> to tensor<?x?xf32>
  %dw = moe.grouped_matmul_wgrad %a, %g, %off
      : tensor<7x3xf32>, tensor<7x2xf32>, tensor<5xi32> -> tensor<4x3x2xf32>
  %dw_ = tensor.cast %dw : tensor<4x3x2xf32> to tensor<?x?x?xf32>
  call @pf3(%dw_) : (tensor<?x?x?xf32>) -> ()
  // CHECK: sizes = [4, 3, 2]
  // CHECK-NEXT: {{\[\[}}[1, 0],
  // CHECK-NEXT:    [2, 1],
  // CHECK-NEXT:    [3, -1]],
  // CHECK-NEXT: {{\[}}[0, 0],
  // CHECK-NEXT:    [0, 0],
  // CHECK-NEXT:    [0, 0]],
  // CHECK-NEXT: {{\[}}[9, 3],
  // CHECK-NEXT:    [1, 1],
  // CHECK-NEXT:    [0, 3]],
  // CHECK-NEXT: {{\[}}[1, 1],
  // CHECK-NEXT:    [-2, -2],
  // CHECK-NEXT:    [2, 2]]]
  %dwref = call @ref_wgrad_f32(%a_, %g_, %off_)
      : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xi32>) -> tensor<?x?x?xf32>
  call @pf3(%dwref) : (tensor<?x?x?xf32>) -> ()
  // CHECK: sizes = [4, 3, 2]
  // CHECK-NEXT: {{\[\[}}[1, 0],
  // CHECK-NEXT:    [2, 1],
  // CHECK-NEXT:    [3, -1]],
  // CHECK-NEXT: {{\[}}[0, 0],
  // CHECK-NEXT:    [0, 0],
  // CHECK-NEXT:    [0, 0]],
  // CHECK-NEXT: {{\[}}[9, 3],
  // CHECK-NEXT:    [1, 1],
  // CHECK-NEXT:    [0, 3]],
  // CHECK-NEXT: {{\[}}[1, 1],
  // CHECK-NEXT:    [-2, -2],
  // CHECK-NEXT:    [2, 2]]]
  %dw2 = tensor.collapse_shape %dw_ [[0, 1], [2]] : tensor<?x?x?xf32> into tensor<?x?xf32>
  %dwref2 = tensor.collapse_shape %dwref [[0, 1], [2]] : tensor<?x?x?xf32> into tensor<?x?xf32>
  call @count_diff(%dw2, %dwref2) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]

  %gb = arith.constant dense<[[3.09375, 2.984375], [-1.625, -0.4140625], [-1.6640625, -3.546875], [-3.46875, -2.859375], [-2.765625, -3.828125], [0.423828125, 1.0078125], [0.1474609375, 1.125]]> : tensor<7x2xbf16>
  %gb_ = tensor.cast %gb : tensor<7x2xbf16> to tensor<?x?xbf16>
  %dwb = moe.grouped_matmul_wgrad %ab, %gb, %off
      : tensor<7x3xbf16>, tensor<7x2xbf16>, tensor<5xi32> -> tensor<4x3x2xf32>
  %dwb_ = tensor.cast %dwb : tensor<4x3x2xf32> to tensor<?x?x?xf32>
  call @pf3(%dwb_) : (tensor<?x?x?xf32>) -> ()
  // CHECK: sizes = [4, 3, 2]
  // CHECK-NEXT: {{\[\[}}[-14.2222, -11.9621],
  // CHECK-NEXT:    [-14.0854, -9.38806],
  // CHECK-NEXT:    [9.7998, 9.73721]],
  // CHECK-NEXT: {{\[}}[0, 0],
  // CHECK-NEXT:    [0, 0],
  // CHECK-NEXT:    [0, 0]],
  // CHECK-NEXT: {{\[}}[-11.0621, -5.78174],
  // CHECK-NEXT:    [-12.2761, -13.0043],
  // CHECK-NEXT:    [-4.52751, -6.42538]],
  // CHECK-NEXT: {{\[}}[-0.966858, -2.29907],
  // CHECK-NEXT:    [0.211914, 0.503906],
  // CHECK-NEXT:    [0.65892, 1.56683]]]
  %dwbref = call @ref_wgrad_bf16(%ab_, %gb_, %off_)
      : (tensor<?x?xbf16>, tensor<?x?xbf16>, tensor<?xi32>) -> tensor<?x?x?xf32>
  call @pf3(%dwbref) : (tensor<?x?x?xf32>) -> ()
  // CHECK: sizes = [4, 3, 2]
  // CHECK-NEXT: {{\[\[}}[-14.2222, -11.9621],
  // CHECK-NEXT:    [-14.0854, -9.38806],
  // CHECK-NEXT:    [9.7998, 9.73721]],
  // CHECK-NEXT: {{\[}}[0, 0],
  // CHECK-NEXT:    [0, 0],
  // CHECK-NEXT:    [0, 0]],
  // CHECK-NEXT: {{\[}}[-11.0621, -5.78174],
  // CHECK-NEXT:    [-12.2761, -13.0043],
  // CHECK-NEXT:    [-4.52751, -6.42538]],
  // CHECK-NEXT: {{\[}}[-0.966858, -2.29907],
  // CHECK-NEXT:    [0.211914, 0.503906],
  // CHECK-NEXT:    [0.65892, 1.56683]]]
  %dwb2 = tensor.collapse_shape %dwb_ [[0, 1], [2]] : tensor<?x?x?xf32> into tensor<?x?xf32>
  %dwbref2 = tensor.collapse_shape %dwbref [[0, 1], [2]] : tensor<?x?x?xf32> into tensor<?x?xf32>
  call @count_diff(%dwb2, %dwbref2) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]
  //===--------------------------------------------------------------------===//
  // Rounding-sensitive case: K = 37 non-dyadic values, so the f32 sums
  // round and only the same accumulation order (increasing k, resp.
  // increasing row) gives the same bits (checked in Python: summing expert
  // 0's products in reverse order changes 13 of its 20 outputs). R = 10, E = 3 with offsets
  // [0, 4, 4, 9] (expert 1 empty, row 9 in no group), N = 5. Checked bit
  // for bit against the per-expert loops (0 elements differ).
  //===--------------------------------------------------------------------===//
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %c7 = arith.constant 7 : index
  %c10 = arith.constant 10 : index
  %c11 = arith.constant 11 : index
  %c13 = arith.constant 13 : index
  %c37 = arith.constant 37 : index
  %c111 = arith.constant 111 : index
  %offl = arith.constant dense<[0, 4, 4, 9]> : tensor<4xi32>
  %offl_ = tensor.cast %offl : tensor<4xi32> to tensor<?xi32>
  %al_ = call @gen2(%c10, %c37, %c7, %c3) : (index, index, index, index) -> tensor<?x?xf32>
  %wl2 = call @gen2(%c111, %c5, %c11, %c13) : (index, index, index, index) -> tensor<?x?xf32>
  %gl_ = call @gen2(%c10, %c5, %c5, %c3) : (index, index, index, index) -> tensor<?x?xf32>
  %al = tensor.cast %al_ : tensor<?x?xf32> to tensor<10x37xf32>
  %gl = tensor.cast %gl_ : tensor<?x?xf32> to tensor<10x5xf32>
  %wl2s = tensor.cast %wl2 : tensor<?x?xf32> to tensor<111x5xf32>
  %wl = tensor.expand_shape %wl2s [[0, 1], [2]] output_shape [3, 37, 5]
      : tensor<111x5xf32> into tensor<3x37x5xf32>
  %wl_ = tensor.cast %wl : tensor<3x37x5xf32> to tensor<?x?x?xf32>
  %yl = moe.grouped_matmul %al, %wl, %offl
      : tensor<10x37xf32>, tensor<3x37x5xf32>, tensor<4xi32> -> tensor<10x5xf32>
  %yl_ = tensor.cast %yl : tensor<10x5xf32> to tensor<?x?xf32>
  %ylref = call @ref_fwd_f32(%al_, %wl_, %offl_)
      : (tensor<?x?xf32>, tensor<?x?x?xf32>, tensor<?xi32>) -> tensor<?x?xf32>
  call @count_diff(%yl_, %ylref) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]
  %dwl = moe.grouped_matmul_wgrad %al, %gl, %offl
      : tensor<10x37xf32>, tensor<10x5xf32>, tensor<4xi32> -> tensor<3x37x5xf32>
  %dwl_ = tensor.cast %dwl : tensor<3x37x5xf32> to tensor<?x?x?xf32>
  %dwlref = call @ref_wgrad_f32(%al_, %gl_, %offl_)
      : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xi32>) -> tensor<?x?x?xf32>
  %dwl2 = tensor.collapse_shape %dwl_ [[0, 1], [2]] : tensor<?x?x?xf32> into tensor<?x?xf32>
  %dwlref2 = tensor.collapse_shape %dwlref [[0, 1], [2]] : tensor<?x?x?xf32> into tensor<?x?xf32>
  call @count_diff(%dwl2, %dwlref2) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]
  return
}
