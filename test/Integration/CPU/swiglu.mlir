// RUN: cat %s | %run_cpu | FileCheck %s

// moe.swiglu and moe.swiglu_grad on the CPU.
//
// Part 1: swiglu with exact values. Expected values computed with a small
// Python script emulating f32 (every operation rounded to f32 with
// struct.pack('f'), silu(g) = g / (1 + exp(-g)) in that order), printed as
// printMemrefF32 does (%g, 6 significant digits; every value is >= 2e-7
// relative away from a 6-digit rounding boundary); by hand:
//   silu(0) * 5  = 0 / 2 * 5 = 0;  silu(0) * -3 = 0 * -3 = -0 (IEEE sign)
//   silu(1) * 2  = 2 / (1 + e^-1)  = 1.46212
//   silu(-1) * -3 = 3 / (1 + e)    = 0.806824
//   silu(2) * 0.5 = 1 / (1 + e^-2) = 0.880797
//   silu(20) * 1 = 20 / (1 + 2.1e-9) = 20 exactly in f32
//   silu(-20) * 1 = -20 / (1 + e^20) = -4.12231e-08
//   silu(3) * -1 = -3 / (1 + e^-3) = -2.85772
// The bf16 result is the f32 value rounded once to nearest-even bf16
// (1.46212 -> 1.4609375, 0.806824 -> 0.80859375, 0.880797 -> 0.87890625,
// -4.12231e-08 -> -4.1211e-08, -2.85772 -> -2.859375).
//
// Part 2: swiglu_grad against central finite differences computed in this
// test (see @fd_split / @fd_interleaved): perturb one element of x by
// +-h (h = 1e-2, f32), run moe.swiglu at both points, and divide
// sum(dy * (y+ - y-)) by 2h. The maximum |fd - swiglu_grad| is computed in IR
// and compared with `arith.cmpf olt` against tol = 1e-3 (printed as an i32 1).
// Tolerance: the central difference has truncation error h^2/6 * |f'''| *
// |dy * up| ~ 1.7e-5 * O(1) (1.3e-5 for these inputs, computed in double);
// the f32 rounding of y+ and y- (a few ulps of |y| <= ~3, i.e. ~1e-6) is
// amplified by 1/(2h) = 50, giving up to ~1e-4 (the f32 emulation in Python
// gives a max difference of 1.8e-5). tol = 1e-3 is >= 10x above both, and
// far below the error of a wrong formula (dropping the (1 + g (1 - s))
// factor of d_gate changes it by up to 0.53 here). The analytic gradient is
// also CHECKed exactly (Python f32 emulation of the documented formula:
// s = 1 / (1 + exp(-g)), d_gate = ((dy * up) * s) * (1 + g * (1 - s)),
// d_up = (dy * g) * s).

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)

func.func @pf(%t: tensor<?x?xf32>) {
  %u = tensor.cast %t : tensor<?x?xf32> to tensor<*xf32>
  call @printMemrefF32(%u) : (tensor<*xf32>) -> ()
  return
}
/// bf16 -> f32 (exact) for printing.
func.func @ext(%t: tensor<4x2xbf16>) -> tensor<?x?xf32> {
  %e = tensor.empty() : tensor<4x2xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<4x2xbf16>) outs(%e : tensor<4x2xf32>) {
  ^bb0(%x: bf16, %o: f32):
    %y = arith.extf %x : bf16 to f32
    linalg.yield %y : f32
  } -> tensor<4x2xf32>
  %c = tensor.cast %r : tensor<4x2xf32> to tensor<?x?xf32>
  return %c : tensor<?x?xf32>
}
/// Central finite differences of L(x) = sum(dy * swiglu(x)) (split layout):
/// for every element (r, i) of x, with h = 1e-2 in f32,
///   fd[r, i] = sum(dy * (swiglu(x + h e_ri) - swiglu(x - h e_ri))) / (2 h).
/// Outputs that x[r, i] does not feed are computed identically at x + h and
/// x - h and cancel exactly: only the affected output contributes.
func.func @fd_split(%x: tensor<2x6xf32>, %dy: tensor<2x3xf32>) -> tensor<2x6xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c6 = arith.constant 6 : index
  %h = arith.constant 1.0e-2 : f32
  %twoh = arith.constant 2.0e-2 : f32
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<2x6xf32>
  %res = scf.for %r = %c0 to %c2 step %c1 iter_args(%acc0 = %init) -> (tensor<2x6xf32>) {
    %row = scf.for %i = %c0 to %c6 step %c1 iter_args(%acc = %acc0) -> (tensor<2x6xf32>) {
      %v = tensor.extract %x[%r, %i] : tensor<2x6xf32>
      %vp = arith.addf %v, %h : f32
      %vm = arith.subf %v, %h : f32
      %xp = tensor.insert %vp into %x[%r, %i] : tensor<2x6xf32>
      %xm = tensor.insert %vm into %x[%r, %i] : tensor<2x6xf32>
      %yp = moe.swiglu %xp : tensor<2x6xf32> -> tensor<2x3xf32>
      %ym = moe.swiglu %xm : tensor<2x6xf32> -> tensor<2x3xf32>
      %se = tensor.empty() : tensor<f32>
      %s0 = linalg.fill ins(%zero : f32) outs(%se : tensor<f32>) -> tensor<f32>
      %s = linalg.generic {
          indexing_maps = [affine_map<(a, b) -> (a, b)>, affine_map<(a, b) -> (a, b)>,
                           affine_map<(a, b) -> (a, b)>, affine_map<(a, b) -> ()>],
          iterator_types = ["reduction", "reduction"]}
          ins(%dy, %yp, %ym : tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>)
          outs(%s0 : tensor<f32>) {
      ^bb0(%d: f32, %p: f32, %m: f32, %sum: f32):
        %dif = arith.subf %p, %m : f32
        %prod = arith.mulf %d, %dif : f32
        %add = arith.addf %sum, %prod : f32
        linalg.yield %add : f32
      } -> tensor<f32>
      %sv = tensor.extract %s[] : tensor<f32>
      %gv = arith.divf %sv, %twoh : f32
      %upd = tensor.insert %gv into %acc[%r, %i] : tensor<2x6xf32>
      scf.yield %upd : tensor<2x6xf32>
    }
    scf.yield %row : tensor<2x6xf32>
  }
  return %res : tensor<2x6xf32>
}

/// Central finite differences of L(x) = sum(dy * swiglu(x)) (interleaved layout):
/// for every element (r, i) of x, with h = 1e-2 in f32,
///   fd[r, i] = sum(dy * (swiglu(x + h e_ri) - swiglu(x - h e_ri))) / (2 h).
/// Outputs that x[r, i] does not feed are computed identically at x + h and
/// x - h and cancel exactly: only the affected output contributes.
func.func @fd_interleaved(%x: tensor<2x6xf32>, %dy: tensor<2x3xf32>) -> tensor<2x6xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c6 = arith.constant 6 : index
  %h = arith.constant 1.0e-2 : f32
  %twoh = arith.constant 2.0e-2 : f32
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<2x6xf32>
  %res = scf.for %r = %c0 to %c2 step %c1 iter_args(%acc0 = %init) -> (tensor<2x6xf32>) {
    %row = scf.for %i = %c0 to %c6 step %c1 iter_args(%acc = %acc0) -> (tensor<2x6xf32>) {
      %v = tensor.extract %x[%r, %i] : tensor<2x6xf32>
      %vp = arith.addf %v, %h : f32
      %vm = arith.subf %v, %h : f32
      %xp = tensor.insert %vp into %x[%r, %i] : tensor<2x6xf32>
      %xm = tensor.insert %vm into %x[%r, %i] : tensor<2x6xf32>
      %yp = moe.swiglu %xp layout(interleaved) : tensor<2x6xf32> -> tensor<2x3xf32>
      %ym = moe.swiglu %xm layout(interleaved) : tensor<2x6xf32> -> tensor<2x3xf32>
      %se = tensor.empty() : tensor<f32>
      %s0 = linalg.fill ins(%zero : f32) outs(%se : tensor<f32>) -> tensor<f32>
      %s = linalg.generic {
          indexing_maps = [affine_map<(a, b) -> (a, b)>, affine_map<(a, b) -> (a, b)>,
                           affine_map<(a, b) -> (a, b)>, affine_map<(a, b) -> ()>],
          iterator_types = ["reduction", "reduction"]}
          ins(%dy, %yp, %ym : tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>)
          outs(%s0 : tensor<f32>) {
      ^bb0(%d: f32, %p: f32, %m: f32, %sum: f32):
        %dif = arith.subf %p, %m : f32
        %prod = arith.mulf %d, %dif : f32
        %add = arith.addf %sum, %prod : f32
        linalg.yield %add : f32
      } -> tensor<f32>
      %sv = tensor.extract %s[] : tensor<f32>
      %gv = arith.divf %sv, %twoh : f32
      %upd = tensor.insert %gv into %acc[%r, %i] : tensor<2x6xf32>
      scf.yield %upd : tensor<2x6xf32>
    }
    scf.yield %row : tensor<2x6xf32>
  }
  return %res : tensor<2x6xf32>
}

/// Prints max |a - b| and whether it is below %tol (1 = yes; a NaN anywhere
/// makes the maximum NaN and the answer 0).
func.func @check_close(%a: tensor<2x6xf32>, %b: tensor<2x6xf32>, %tol: f32) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<f32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<f32>) -> tensor<f32>
  %m = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>,
                       affine_map<(i, j) -> ()>],
      iterator_types = ["reduction", "reduction"]}
      ins(%a, %b : tensor<2x6xf32>, tensor<2x6xf32>) outs(%z : tensor<f32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %d = arith.subf %x, %y : f32
    %ad = math.absf %d : f32
    %mx = arith.maximumf %acc, %ad : f32
    linalg.yield %mx : f32
  } -> tensor<f32>
  %mv = tensor.extract %m[] : tensor<f32>
  %ok = arith.cmpf olt, %mv, %tol : f32
  %oki = arith.extui %ok : i1 to i32
  %mt = tensor.from_elements %mv : tensor<1x1xf32>
  %mt_ = tensor.cast %mt : tensor<1x1xf32> to tensor<*xf32>
  call @printMemrefF32(%mt_) : (tensor<*xf32>) -> ()
  %okt = tensor.from_elements %oki : tensor<1xi32>
  %okt_ = tensor.cast %okt : tensor<1xi32> to tensor<*xi32>
  call @printMemrefI32(%okt_) : (tensor<*xi32>) -> ()
  return
}

func.func @main() {
  //===--------------------------------------------------------------------===//
  // Part 1: exact values. Rows: gate | up.
  //===--------------------------------------------------------------------===//
  %x = arith.constant dense<[[0.0, 0.0, 5.0, -3.0],
                             [1.0, -1.0, 2.0, -3.0],
                             [2.0, 20.0, 0.5, 1.0],
                             [-20.0, 3.0, 1.0, -1.0]]> : tensor<4x4xf32>
  // The same pairs interleaved: g0 u0 g1 u1.
  %xi = arith.constant dense<[[0.0, 5.0, 0.0, -3.0],
                              [1.0, 2.0, -1.0, -3.0],
                              [2.0, 0.5, 20.0, 1.0],
                              [-20.0, 1.0, 3.0, -1.0]]> : tensor<4x4xf32>
  %y = moe.swiglu %x : tensor<4x4xf32> -> tensor<4x2xf32>
  %yi = moe.swiglu %xi layout(interleaved) : tensor<4x4xf32> -> tensor<4x2xf32>
  %yb = moe.swiglu %x : tensor<4x4xf32> -> tensor<4x2xbf16>
  %y_ = tensor.cast %y : tensor<4x2xf32> to tensor<?x?xf32>
  %yi_ = tensor.cast %yi : tensor<4x2xf32> to tensor<?x?xf32>
  %yb_ = call @ext(%yb) : (tensor<4x2xbf16>) -> tensor<?x?xf32>
  call @pf(%y_) : (tensor<?x?xf32>) -> ()
  call @pf(%yi_) : (tensor<?x?xf32>) -> ()
  call @pf(%yb_) : (tensor<?x?xf32>) -> ()
  // CHECK-LABEL: sizes = [4, 2]
  // CHECK-NEXT: {{\[}}[0, -0],
  // CHECK-NEXT:  [1.46212, 0.806824],
  // CHECK-NEXT:  [0.880797, 20],
  // CHECK-NEXT:  [-4.12231e-08, -2.85772]]
  // CHECK: sizes = [4, 2]
  // CHECK-NEXT: {{\[}}[0, -0],
  // CHECK-NEXT:  [1.46212, 0.806824],
  // CHECK-NEXT:  [0.880797, 20],
  // CHECK-NEXT:  [-4.12231e-08, -2.85772]]
  // CHECK: sizes = [4, 2]
  // CHECK-NEXT: {{\[}}[0, -0],
  // CHECK-NEXT:  [1.46094, 0.808594],
  // CHECK-NEXT:  [0.878906, 20],
  // CHECK-NEXT:  [-4.1211e-08, -2.85938]]

  //===--------------------------------------------------------------------===//
  // Part 2: swiglu_grad vs finite differences, split and interleaved.
  // gate [[0.5, -1.25, 2.0], [-2.5, 0.0, 1.1]]
  // up   [[1.5, -0.75, 0.3], [-1.0, 2.0, -1.7]]
  // dy   [[1.0, -0.5, 0.8], [0.3, 1.2, -1.5]]
  //===--------------------------------------------------------------------===//
  %tol = arith.constant 1.0e-3 : f32
  %dy = arith.constant dense<[[1.0, -0.5, 0.8], [0.3, 1.2, -1.5]]> : tensor<2x3xf32>
  %h = arith.constant dense<[[0.5, -1.25, 2.0, 1.5, -0.75, 0.3],
                             [-2.5, 0.0, 1.1, -1.0, 2.0, -1.7]]> : tensor<2x6xf32>
  %dh = moe.swiglu_grad %h, %dy : tensor<2x6xf32>, tensor<2x3xf32> -> tensor<2x6xf32>
  %fd = call @fd_split(%h, %dy) : (tensor<2x6xf32>, tensor<2x3xf32>) -> tensor<2x6xf32>
  %dh_ = tensor.cast %dh : tensor<2x6xf32> to tensor<?x?xf32>
  %fd_ = tensor.cast %fd : tensor<2x6xf32> to tensor<?x?xf32>
  call @pf(%dh_) : (tensor<?x?xf32>) -> ()
  call @pf(%fd_) : (tensor<?x?xf32>) -> ()
  call @check_close(%dh, %fd, %tol) : (tensor<2x6xf32>, tensor<2x6xf32>, f32) -> ()
  // Analytic: [d_gate | d_up]; gate 0 gives d_up = 0 and d_gate = dy*up/2.
  // CHECK: sizes = [2, 6]
  // CHECK-NEXT: {{\[}}[1.10994, 0.00236968, 0.261788, 0.31123, 0.139188, 1.40928],
  // CHECK-NEXT:  [0.0298203, 1.2, 2.43874, -0.0568936, 0, -1.23793]]
  // Finite differences (printed for the record, compared in IR):
  // CHECK: sizes = [2, 6]
  // CHECK-NEXT: {{\[}}[{{.*}}],
  // CHECK-NEXT:  [{{.*}}]]
  // Max |analytic - fd|, then (max < tol):
  // CHECK: sizes = [1, 1]
  // CHECK-NEXT: {{\[}}[{{[0-9.e+-]+}}]]
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[1]

  %hi = arith.constant dense<[[0.5, 1.5, -1.25, -0.75, 2.0, 0.3],
                              [-2.5, -1.0, 0.0, 2.0, 1.1, -1.7]]> : tensor<2x6xf32>
  %dhi = moe.swiglu_grad %hi, %dy layout(interleaved)
      : tensor<2x6xf32>, tensor<2x3xf32> -> tensor<2x6xf32>
  %fdi = call @fd_interleaved(%hi, %dy) : (tensor<2x6xf32>, tensor<2x3xf32>) -> tensor<2x6xf32>
  %dhi_ = tensor.cast %dhi : tensor<2x6xf32> to tensor<?x?xf32>
  %fdi_ = tensor.cast %fdi : tensor<2x6xf32> to tensor<?x?xf32>
  call @pf(%dhi_) : (tensor<?x?xf32>) -> ()
  call @pf(%fdi_) : (tensor<?x?xf32>) -> ()
  call @check_close(%dhi, %fdi, %tol) : (tensor<2x6xf32>, tensor<2x6xf32>, f32) -> ()
  // The same numbers, interleaved (d_g0 d_u0 d_g1 d_u1 ...).
  // CHECK: sizes = [2, 6]
  // CHECK-NEXT: {{\[}}[1.10994, 0.31123, 0.00236968, 0.139188, 0.261788, 1.40928],
  // CHECK-NEXT:  [0.0298203, -0.0568936, 1.2, 0, 2.43874, -1.23793]]
  // CHECK: sizes = [2, 6]
  // CHECK-NEXT: {{\[}}[{{.*}}],
  // CHECK-NEXT:  [{{.*}}]]
  // CHECK: sizes = [1, 1]
  // CHECK-NEXT: {{\[}}[{{[0-9.e+-]+}}]]
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[1]
  return
}
