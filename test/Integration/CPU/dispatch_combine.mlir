// RUN: cat %s | %run_cpu | FileCheck %s
// RUN: cat %s | %run_parallel_cpu | FileCheck %s

// moe.dispatch and moe.combine on the CPU.
//
// Expected values: by hand from the op descriptions (grouped by expert, token
// order then slot order inside a group, groups padded to pad_to, capacity
// C = ceil(capacity_factor * T * k / E) with later copies dropped, indices
// outside [0, E) dropped), cross-checked with an independent plain-Python
// implementation of the same rules. All token values and weights are small
// integers or dyadic fractions, so every combine sum below is exact.
//
// Token t (t = 0..5) is x[t] = [t + 1, 10 * (t + 1)]. The routing (E = 4,
// k = 2) is
//   t0 -> 0, 1    t1 -> 1, 3    t2 -> 0, 3
//   t3 -> 1, 0    t4 -> 3, 1    t5 -> 1, 0
// so expert 0 gets (t0,j0) (t2,j0) (t3,j1) (t5,j1)          count 4
//    expert 1 gets (t0,j1) (t1,j0) (t3,j0) (t4,j1) (t5,j0)  count 5
//    expert 2 gets nothing                                  count 0
//    expert 3 gets (t1,j1) (t2,j1) (t4,j0)                  count 3

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)
func.func private @printMemrefI64(tensor<*xi64>)

func.func @pf(%t: tensor<?x?xf32>) {
  %u = tensor.cast %t : tensor<?x?xf32> to tensor<*xf32>
  call @printMemrefF32(%u) : (tensor<*xf32>) -> ()
  return
}
func.func @pi(%t: tensor<?xi32>) {
  %u = tensor.cast %t : tensor<?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}
func.func @pi2(%t: tensor<?x?xi32>) {
  %u = tensor.cast %t : tensor<?x?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}

/// The number of elements that compare unequal (arith.cmpf une; 0 = all
/// equal).
func.func @count_diff(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>) -> tensor<1xi32> {
  %zero = arith.constant 0 : i32
  %e = tensor.empty() : tensor<1xi32>
  %init = linalg.fill ins(%zero : i32) outs(%e : tensor<1xi32>) -> tensor<1xi32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>,
                       affine_map<(i, j) -> (0)>],
      iterator_types = ["reduction", "reduction"]}
      ins(%a, %b : tensor<?x?xf32>, tensor<?x?xf32>) outs(%init : tensor<1xi32>) {
  ^bb0(%x: f32, %y: f32, %acc: i32):
    %ne = arith.cmpf une, %x, %y : f32
    %one = arith.extui %ne : i1 to i32
    %s = arith.addi %acc, %one : i32
    linalg.yield %s : i32
  } -> tensor<1xi32>
  return %r : tensor<1xi32>
}

/// bf16 -> f32 (exact).
func.func @ext(%t: tensor<5x3xbf16>) -> tensor<?x?xf32> {
  %e = tensor.empty() : tensor<5x3xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<5x3xbf16>) outs(%e : tensor<5x3xf32>) {
  ^bb0(%x: bf16, %o: f32):
    %y = arith.extf %x : bf16 to f32
    linalg.yield %y : f32
  } -> tensor<5x3xf32>
  %c = tensor.cast %r : tensor<5x3xf32> to tensor<?x?xf32>
  return %c : tensor<?x?xf32>
}

func.func @main() {
  %x = arith.constant dense<[[1.0, 10.0], [2.0, 20.0], [3.0, 30.0],
                             [4.0, 40.0], [5.0, 50.0], [6.0, 60.0]]> : tensor<6x2xf32>
  %idx = arith.constant dense<[[0, 1], [1, 3], [0, 3],
                               [1, 0], [3, 1], [1, 0]]> : tensor<6x2xi32>

  //===--------------------------------------------------------------------===//
  // 1. Dropless, R = 14 > 12 copies: rows 12 and 13 (beyond offsets[E]) zero.
  //    offsets [0, 4, 9, 9, 12], counts [4, 5, 0, 3].
  //    rows 0-3:  x0 x2 x3 x5 (expert 0)    rows 4-8: x0 x1 x3 x4 x5 (expert 1)
  //    rows 9-11: x1 x2 x4 (expert 3)       positions (row of each copy):
  //    t0 [0, 4]  t1 [5, 9]  t2 [1, 10]  t3 [6, 2]  t4 [11, 7]  t5 [8, 3]
  //===--------------------------------------------------------------------===//
  %s1, %o1, %c1, %p1 = moe.dispatch %x, %idx experts(4)
      : tensor<6x2xf32>, tensor<6x2xi32>
      -> tensor<14x2xf32>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s1_ = tensor.cast %s1 : tensor<14x2xf32> to tensor<?x?xf32>
  %o1_ = tensor.cast %o1 : tensor<5xi32> to tensor<?xi32>
  %c1_ = tensor.cast %c1 : tensor<4xi32> to tensor<?xi32>
  %p1_ = tensor.cast %p1 : tensor<6x2xi32> to tensor<?x?xi32>
  call @pf(%s1_) : (tensor<?x?xf32>) -> ()
  call @pi(%o1_) : (tensor<?xi32>) -> ()
  call @pi(%c1_) : (tensor<?xi32>) -> ()
  call @pi2(%p1_) : (tensor<?x?xi32>) -> ()
  // CHECK-LABEL: sizes = [14, 2]
  // CHECK-NEXT: {{\[}}[1, 10],
  // CHECK-NEXT:  [3, 30],
  // CHECK-NEXT:  [4, 40],
  // CHECK-NEXT:  [6, 60],
  // CHECK-NEXT:  [1, 10],
  // CHECK-NEXT:  [2, 20],
  // CHECK-NEXT:  [4, 40],
  // CHECK-NEXT:  [5, 50],
  // CHECK-NEXT:  [6, 60],
  // CHECK-NEXT:  [2, 20],
  // CHECK-NEXT:  [3, 30],
  // CHECK-NEXT:  [5, 50],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0]]
  // CHECK: sizes = [5]
  // CHECK-NEXT: {{^}}[0, 4, 9, 9, 12]
  // CHECK: sizes = [4]
  // CHECK-NEXT: {{^}}[4, 5, 0, 3]
  // CHECK: sizes = [6, 2]
  // CHECK-NEXT: {{\[}}[0, 4],
  // CHECK-NEXT:  [5, 9],
  // CHECK-NEXT:  [1, 10],
  // CHECK-NEXT:  [6, 2],
  // CHECK-NEXT:  [11, 7],
  // CHECK-NEXT:  [8, 3]]

  //===--------------------------------------------------------------------===//
  // 2. pad_to(4): groups of 4, 8, 0, 4 rows -> offsets [0, 4, 12, 12, 16]
  //    (all multiples of 4; the empty expert stays empty), counts unchanged.
  //    R = 24 (the minimum: 12 + 4 * 3 = 24). Rows 9-11 (expert 1 padding),
  //    15 (expert 3 padding) and 16-23 are zero. Expert 3's copies move to
  //    rows 12-14: t1 [5, 12]  t2 [1, 13]  t4 [14, 7].
  //===--------------------------------------------------------------------===//
  %s2, %o2, %c2, %p2 = moe.dispatch %x, %idx experts(4) pad_to(4)
      : tensor<6x2xf32>, tensor<6x2xi32>
      -> tensor<24x2xf32>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s2_ = tensor.cast %s2 : tensor<24x2xf32> to tensor<?x?xf32>
  %o2_ = tensor.cast %o2 : tensor<5xi32> to tensor<?xi32>
  %c2_ = tensor.cast %c2 : tensor<4xi32> to tensor<?xi32>
  %p2_ = tensor.cast %p2 : tensor<6x2xi32> to tensor<?x?xi32>
  call @pf(%s2_) : (tensor<?x?xf32>) -> ()
  call @pi(%o2_) : (tensor<?xi32>) -> ()
  call @pi(%c2_) : (tensor<?xi32>) -> ()
  call @pi2(%p2_) : (tensor<?x?xi32>) -> ()
  // CHECK: sizes = [24, 2]
  // CHECK-NEXT: {{\[}}[1, 10],
  // CHECK-NEXT:  [3, 30],
  // CHECK-NEXT:  [4, 40],
  // CHECK-NEXT:  [6, 60],
  // CHECK-NEXT:  [1, 10],
  // CHECK-NEXT:  [2, 20],
  // CHECK-NEXT:  [4, 40],
  // CHECK-NEXT:  [5, 50],
  // CHECK-NEXT:  [6, 60],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [2, 20],
  // CHECK-NEXT:  [3, 30],
  // CHECK-NEXT:  [5, 50],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0]]
  // CHECK: sizes = [5]
  // CHECK-NEXT: {{^}}[0, 4, 12, 12, 16]
  // CHECK: sizes = [4]
  // CHECK-NEXT: {{^}}[4, 5, 0, 3]
  // CHECK: sizes = [6, 2]
  // CHECK-NEXT: {{\[}}[0, 4],
  // CHECK-NEXT:  [5, 12],
  // CHECK-NEXT:  [1, 13],
  // CHECK-NEXT:  [6, 2],
  // CHECK-NEXT:  [14, 7],
  // CHECK-NEXT:  [8, 3]]

  //===--------------------------------------------------------------------===//
  // 3. capacity_factor(1.0): C = ceil(1.0 * 6 * 2 / 4) = 3 copies per expert.
  //    Expert 0 keeps (t0,j0) (t2,j0) (t3,j1) and drops (t5,j1); expert 1
  //    keeps (t0,j1) (t1,j0) (t3,j0) and drops (t4,j1) (t5,j0); expert 3
  //    keeps its 3. counts [3, 3, 0, 3] (kept), offsets [0, 3, 6, 6, 9],
  //    R = 12 (= E * C), rows 9-11 zero.
  //    positions t0 [0, 3]  t1 [4, 6]  t2 [1, 7]  t3 [5, 2]  t4 [8, -1]
  //              t5 [-1, -1]
  //===--------------------------------------------------------------------===//
  %s3, %o3, %c3, %p3 = moe.dispatch %x, %idx experts(4) capacity_factor(1.0)
      : tensor<6x2xf32>, tensor<6x2xi32>
      -> tensor<12x2xf32>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s3_ = tensor.cast %s3 : tensor<12x2xf32> to tensor<?x?xf32>
  %o3_ = tensor.cast %o3 : tensor<5xi32> to tensor<?xi32>
  %c3_ = tensor.cast %c3 : tensor<4xi32> to tensor<?xi32>
  %p3_ = tensor.cast %p3 : tensor<6x2xi32> to tensor<?x?xi32>
  call @pf(%s3_) : (tensor<?x?xf32>) -> ()
  call @pi(%o3_) : (tensor<?xi32>) -> ()
  call @pi(%c3_) : (tensor<?xi32>) -> ()
  call @pi2(%p3_) : (tensor<?x?xi32>) -> ()
  // CHECK: sizes = [12, 2]
  // CHECK-NEXT: {{\[}}[1, 10],
  // CHECK-NEXT:  [3, 30],
  // CHECK-NEXT:  [4, 40],
  // CHECK-NEXT:  [1, 10],
  // CHECK-NEXT:  [2, 20],
  // CHECK-NEXT:  [4, 40],
  // CHECK-NEXT:  [2, 20],
  // CHECK-NEXT:  [3, 30],
  // CHECK-NEXT:  [5, 50],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0]]
  // CHECK: sizes = [5]
  // CHECK-NEXT: {{^}}[0, 3, 6, 6, 9]
  // CHECK: sizes = [4]
  // CHECK-NEXT: {{^}}[3, 3, 0, 3]
  // CHECK: sizes = [6, 2]
  // CHECK-NEXT: {{\[}}[0, 3],
  // CHECK-NEXT:  [4, 6],
  // CHECK-NEXT:  [1, 7],
  // CHECK-NEXT:  [5, 2],
  // CHECK-NEXT:  [8, -1],
  // CHECK-NEXT:  [-1, -1]]

  //===--------------------------------------------------------------------===//
  // 4. capacity_factor(1.0) and pad_to(2): kept 3, 3, 0, 3 -> groups of 4, 4,
  //    0, 4 rows; offsets [0, 4, 8, 8, 12]; R = 16 (min(12 + 4, 4 * 4));
  //    rows 3, 7, 11 (padding) and 12-15 zero.
  //    positions t0 [0, 4]  t1 [5, 8]  t2 [1, 9]  t3 [6, 2]  t4 [10, -1]
  //              t5 [-1, -1]
  //===--------------------------------------------------------------------===//
  %s4, %o4, %c4, %p4 = moe.dispatch %x, %idx experts(4) capacity_factor(1.0) pad_to(2)
      : tensor<6x2xf32>, tensor<6x2xi32>
      -> tensor<16x2xf32>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s4_ = tensor.cast %s4 : tensor<16x2xf32> to tensor<?x?xf32>
  %o4_ = tensor.cast %o4 : tensor<5xi32> to tensor<?xi32>
  %c4_ = tensor.cast %c4 : tensor<4xi32> to tensor<?xi32>
  %p4_ = tensor.cast %p4 : tensor<6x2xi32> to tensor<?x?xi32>
  call @pf(%s4_) : (tensor<?x?xf32>) -> ()
  call @pi(%o4_) : (tensor<?xi32>) -> ()
  call @pi(%c4_) : (tensor<?xi32>) -> ()
  call @pi2(%p4_) : (tensor<?x?xi32>) -> ()
  // CHECK: sizes = [16, 2]
  // CHECK-NEXT: {{\[}}[1, 10],
  // CHECK-NEXT:  [3, 30],
  // CHECK-NEXT:  [4, 40],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [1, 10],
  // CHECK-NEXT:  [2, 20],
  // CHECK-NEXT:  [4, 40],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [2, 20],
  // CHECK-NEXT:  [3, 30],
  // CHECK-NEXT:  [5, 50],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0]]
  // CHECK: sizes = [5]
  // CHECK-NEXT: {{^}}[0, 4, 8, 8, 12]
  // CHECK: sizes = [4]
  // CHECK-NEXT: {{^}}[3, 3, 0, 3]
  // CHECK: sizes = [6, 2]
  // CHECK-NEXT: {{\[}}[0, 4],
  // CHECK-NEXT:  [5, 8],
  // CHECK-NEXT:  [1, 9],
  // CHECK-NEXT:  [6, 2],
  // CHECK-NEXT:  [10, -1],
  // CHECK-NEXT:  [-1, -1]]

  //===--------------------------------------------------------------------===//
  // 5. Out-of-range indices drop their copy (i64 indices and results).
  //    t0 -> 0, 4(out)   t1 -> -1(out), 2   t2 -> 2, 0   (E = 4)
  //    expert 0: (t0,j0) (t2,j1); expert 2: (t1,j1) (t2,j0).
  //    offsets [0, 2, 2, 4, 4], counts [2, 0, 2, 0],
  //    sorted x0 x2 x1 x2 0 0, positions [[0, -1], [-1, 2], [3, 1]].
  //===--------------------------------------------------------------------===//
  %x3 = tensor.extract_slice %x[0, 0] [3, 2] [1, 1] : tensor<6x2xf32> to tensor<3x2xf32>
  %idx5 = arith.constant dense<[[0, 4], [-1, 2], [2, 0]]> : tensor<3x2xi64>
  %s5, %o5, %c5, %p5 = moe.dispatch %x3, %idx5 experts(4)
      : tensor<3x2xf32>, tensor<3x2xi64>
      -> tensor<6x2xf32>, tensor<5xi64>, tensor<4xi64>, tensor<3x2xi64>
  %s5_ = tensor.cast %s5 : tensor<6x2xf32> to tensor<?x?xf32>
  %o5_ = tensor.cast %o5 : tensor<5xi64> to tensor<*xi64>
  %c5_ = tensor.cast %c5 : tensor<4xi64> to tensor<*xi64>
  %p5_ = tensor.cast %p5 : tensor<3x2xi64> to tensor<*xi64>
  call @pf(%s5_) : (tensor<?x?xf32>) -> ()
  call @printMemrefI64(%o5_) : (tensor<*xi64>) -> ()
  call @printMemrefI64(%c5_) : (tensor<*xi64>) -> ()
  call @printMemrefI64(%p5_) : (tensor<*xi64>) -> ()
  // CHECK: sizes = [6, 2]
  // CHECK-NEXT: {{\[}}[1, 10],
  // CHECK-NEXT:  [3, 30],
  // CHECK-NEXT:  [2, 20],
  // CHECK-NEXT:  [3, 30],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0]]
  // CHECK: sizes = [5]
  // CHECK-NEXT: {{^}}[0, 2, 2, 4, 4]
  // CHECK: sizes = [4]
  // CHECK-NEXT: {{^}}[2, 0, 2, 0]
  // CHECK: sizes = [3, 2]
  // CHECK-NEXT: {{\[}}[0, -1],
  // CHECK-NEXT:  [-1, 2],
  // CHECK-NEXT:  [3, 1]]

  //===--------------------------------------------------------------------===//
  // 5b. A token that picks the same expert twice: inside the group, token
  //     order then slot order. t0 -> 1, 1; t1 -> 0, 1 (E = 2): expert 0 gets
  //     (t1,j0) (row 0), expert 1 (t0,j0) (t0,j1) (t1,j1) (rows 1-3).
  //     sorted x1 x0 x0 x1, offsets [0, 1, 4], positions [[1, 2], [0, 3]].
  //===--------------------------------------------------------------------===//
  %x2 = tensor.extract_slice %x[0, 0] [2, 2] [1, 1] : tensor<6x2xf32> to tensor<2x2xf32>
  %idx6 = arith.constant dense<[[1, 1], [0, 1]]> : tensor<2x2xi32>
  %s6, %o6, %c6, %p6 = moe.dispatch %x2, %idx6 experts(2)
      : tensor<2x2xf32>, tensor<2x2xi32>
      -> tensor<4x2xf32>, tensor<3xi32>, tensor<2xi32>, tensor<2x2xi32>
  %s6_ = tensor.cast %s6 : tensor<4x2xf32> to tensor<?x?xf32>
  %o6_ = tensor.cast %o6 : tensor<3xi32> to tensor<?xi32>
  %p6_ = tensor.cast %p6 : tensor<2x2xi32> to tensor<?x?xi32>
  call @pf(%s6_) : (tensor<?x?xf32>) -> ()
  call @pi(%o6_) : (tensor<?xi32>) -> ()
  call @pi2(%p6_) : (tensor<?x?xi32>) -> ()
  // CHECK: sizes = [4, 2]
  // CHECK-NEXT: {{\[}}[2, 20],
  // CHECK-NEXT:  [1, 10],
  // CHECK-NEXT:  [1, 10],
  // CHECK-NEXT:  [2, 20]]
  // CHECK: sizes = [3]
  // CHECK-NEXT: {{^}}[0, 1, 4]
  // CHECK: sizes = [2, 2]
  // CHECK-NEXT: {{\[}}[1, 2],
  // CHECK-NEXT:  [0, 3]]

  //===--------------------------------------------------------------------===//
  // 6. Round trip: k = 1, all weights 1: combine(dispatch(x)) == x exactly
  //    (1 * v is exact and 0 + v == v). Arbitrary non-dyadic values, E = 3
  //    with expert 1 used once; every element compared with arith.cmpf in IR
  //    (count of unequal elements printed: 0) and printed. The -0.0 input
  //    comes back as +0.0 (the f32 sum starts at +0 and +0 + -0 = +0), which
  //    is why the comparison is numeric, not bitwise.
  //===--------------------------------------------------------------------===//
  %xr = arith.constant dense<[[0.1, -2.75, 3.14159], [1.0e-3, 7.0, -0.333333],
                              [65504.0, -1.5e-5, 0.2], [2.5, 0.7, -9.9],
                              [-0.0, 123.456, 1.0e10]]> : tensor<5x3xf32>
  %idxr = arith.constant dense<[[2], [0], [2], [1], [0]]> : tensor<5x1xi32>
  %ones = arith.constant dense<1.0> : tensor<5x1xf32>
  %sr, %or, %cr, %pr = moe.dispatch %xr, %idxr experts(3)
      : tensor<5x3xf32>, tensor<5x1xi32>
      -> tensor<5x3xf32>, tensor<4xi32>, tensor<3xi32>, tensor<5x1xi32>
  %yr = moe.combine %sr, %ones, %pr
      : tensor<5x3xf32>, tensor<5x1xf32>, tensor<5x1xi32> -> tensor<5x3xf32>
  %yr_ = tensor.cast %yr : tensor<5x3xf32> to tensor<?x?xf32>
  %xr_ = tensor.cast %xr : tensor<5x3xf32> to tensor<?x?xf32>
  %dr = call @count_diff(%xr_, %yr_) : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<1xi32>
  %dr_ = tensor.cast %dr : tensor<1xi32> to tensor<?xi32>
  call @pf(%yr_) : (tensor<?x?xf32>) -> ()
  call @pi(%dr_) : (tensor<?xi32>) -> ()
  // CHECK: sizes = [5, 3]
  // CHECK-NEXT: {{\[}}[0.1, -2.75, 3.14159],
  // CHECK-NEXT:  [0.001, 7, -0.333333],
  // CHECK-NEXT:  [65504, -1.5e-05, 0.2],
  // CHECK-NEXT:  [2.5, 0.7, -9.9],
  // CHECK-NEXT:  [0, 123.456, 1e+10]]
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]

  // The same round trip in bf16 (bf16 tokens, sorted and result; the f32
  // sum 0 + 1 * v is v, so rounding it back to bf16 is exact): unequal count 0.
  %xrb = arith.constant dense<[[0.1, -2.75, 3.14159], [1.0e-3, 7.0, -0.333333],
                               [65504.0, -1.5e-5, 0.2], [2.5, 0.7, -9.9],
                               [0.5, 123.456, 1.0e10]]> : tensor<5x3xbf16>
  %srb, %orb, %crb, %prb = moe.dispatch %xrb, %idxr experts(3)
      : tensor<5x3xbf16>, tensor<5x1xi32>
      -> tensor<5x3xbf16>, tensor<4xi32>, tensor<3xi32>, tensor<5x1xi32>
  %yrb = moe.combine %srb, %ones, %prb
      : tensor<5x3xbf16>, tensor<5x1xf32>, tensor<5x1xi32> -> tensor<5x3xbf16>
  %xrb32 = call @ext(%xrb) : (tensor<5x3xbf16>) -> tensor<?x?xf32>
  %yrb32 = call @ext(%yrb) : (tensor<5x3xbf16>) -> tensor<?x?xf32>
  %drb = call @count_diff(%xrb32, %yrb32) : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<1xi32>
  %drb_ = tensor.cast %drb : tensor<1xi32> to tensor<?xi32>
  call @pi(%drb_) : (tensor<?xi32>) -> ()
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]

  //===--------------------------------------------------------------------===//
  // 7. Weighted k = 2 combine of the positions of case 1 (dropless) and of
  //    case 3 (capacity, dropped slots contribute nothing) over expert
  //    outputs y[r] = [r + 1, -2 (r + 1)]:
  //      out[t] = w[t,0] * y[pos[t,0]] + w[t,1] * y[pos[t,1]]
  //    dropless:
  //      t0: 0.75  * y0  + 0.25  * y4  = 0.75 + 1.25       = 2
  //      t1: 0.5   * y5  + 0.5   * y9  = 3 + 5             = 8
  //      t2: 0.125 * y1  + 0.875 * y10 = 0.25 + 9.625      = 9.875
  //      t3: 1     * y6  + 0     * y2  = 7                 = 7
  //      t4: 0.25  * y11 + 0.5   * y7  = 3 + 4             = 7
  //      t5: 0.375 * y8  + 0.625 * y3  = 3.375 + 2.5       = 5.875
  //    capacity (pos t0 [0,3] t1 [4,6] t2 [1,7] t3 [5,2] t4 [8,-1] t5 [-1,-1]):
  //      t0: 0.75 * 1 + 0.25 * 4 = 1.75     t1: 0.5 * 5 + 0.5 * 7 = 6
  //      t2: 0.125 * 2 + 0.875 * 8 = 7.25   t3: 1 * 6 + 0 * 3 = 6
  //      t4: 0.25 * 9 = 2.25                t5: 0
  //    (second column: -2 times the first).
  //===--------------------------------------------------------------------===//
  %y = arith.constant dense<[[1.0, -2.0], [2.0, -4.0], [3.0, -6.0], [4.0, -8.0],
                             [5.0, -10.0], [6.0, -12.0], [7.0, -14.0], [8.0, -16.0],
                             [9.0, -18.0], [10.0, -20.0], [11.0, -22.0], [12.0, -24.0],
                             [13.0, -26.0], [14.0, -28.0]]> : tensor<14x2xf32>
  %w = arith.constant dense<[[0.75, 0.25], [0.5, 0.5], [0.125, 0.875],
                             [1.0, 0.0], [0.25, 0.5], [0.375, 0.625]]> : tensor<6x2xf32>
  %out1 = moe.combine %y, %w, %p1
      : tensor<14x2xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x2xf32>
  %y12 = tensor.extract_slice %y[0, 0] [12, 2] [1, 1] : tensor<14x2xf32> to tensor<12x2xf32>
  %out3 = moe.combine %y12, %w, %p3
      : tensor<12x2xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x2xf32>
  %out1_ = tensor.cast %out1 : tensor<6x2xf32> to tensor<?x?xf32>
  %out3_ = tensor.cast %out3 : tensor<6x2xf32> to tensor<?x?xf32>
  call @pf(%out1_) : (tensor<?x?xf32>) -> ()
  call @pf(%out3_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [6, 2]
  // CHECK-NEXT: {{\[}}[2, -4],
  // CHECK-NEXT:  [8, -16],
  // CHECK-NEXT:  [9.875, -19.75],
  // CHECK-NEXT:  [7, -14],
  // CHECK-NEXT:  [7, -14],
  // CHECK-NEXT:  [5.875, -11.75]]
  // CHECK: sizes = [6, 2]
  // CHECK-NEXT: {{\[}}[1.75, -3.5],
  // CHECK-NEXT:  [6, -12],
  // CHECK-NEXT:  [7.25, -14.5],
  // CHECK-NEXT:  [6, -12],
  // CHECK-NEXT:  [2.25, -4.5],
  // CHECK-NEXT:  [0, 0]]
  return
}
