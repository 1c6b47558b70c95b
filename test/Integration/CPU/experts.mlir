// RUN: cat %s | %run_cpu | FileCheck %s

// moe.experts (a per-expert body: matmul, swiglu, matmul) and
// moe.grouped_mlp on the CPU, each against the unfused sequence
//   h = moe.grouped_matmul(x, w1, offsets)   (f32)
//   a = moe.swiglu(h)                        (f32, or w2's element type)
//   y = moe.grouped_matmul(a, w2, offsets)
// on the same data. Both forms are printed and compared bit for bit in IR
// (@count_diff prints the number of differing elements: 0).
//
// Shapes: R = 7 rows, H = 4, F = 3 (w1 [3, 4, 6], w2 [3, 3, 4]), E = 3 with
// offsets [0, 3, 3, 6]: expert 1 is empty and row 6 belongs to no expert
// (its output is 0 in every form).
//
// Expected values: data drawn in Python (random.seed(1067), uniform(-1, 1)
// rounded to 2 decimals; the bf16 operands are those values rounded to
// nearest-even bf16), outputs computed by a Python f32 emulation of the
// unfused sequence (every add/mul/div rounded to f32, exp correctly rounded
// to f32, accumulation in order of increasing k, swiglu's result rounded to
// bf16 in the bf16 case). printMemrefF32 prints 6 significant digits; the
// last matmul sums terms of mixed sign, so where the computed value lies
// within 2 f32 ulps (of the sum of |terms|) of a 6-digit or bf16 rounding
// boundary, the CHECK accepts every candidate in that interval ({{a|b}}):
// only a 1-ulp difference in the platform's expf could pick the other one.

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)

func.func @pf(%t: tensor<?x?xf32>) {
  %u = tensor.cast %t : tensor<?x?xf32> to tensor<*xf32>
  call @printMemrefF32(%u) : (tensor<*xf32>) -> ()
  return
}
/// Prints the number of elements whose bit patterns differ (0 = identical).
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
/// bf16 -> f32 (exact) for printing and comparing.
func.func @ext(%t: tensor<7x4xbf16>) -> tensor<?x?xf32> {
  %e = tensor.empty() : tensor<7x4xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<7x4xbf16>) outs(%e : tensor<7x4xf32>) {
  ^bb0(%x: bf16, %o: f32):
    %y = arith.extf %x : bf16 to f32
    linalg.yield %y : f32
  } -> tensor<7x4xf32>
  %c = tensor.cast %r : tensor<7x4xf32> to tensor<?x?xf32>
  return %c : tensor<?x?xf32>
}

func.func @main() {
  %off = arith.constant dense<[0, 3, 3, 6]> : tensor<4xi32>

  //===--------------------------------------------------------------------===//
  // 1. f32: moe.experts with a body vs the unfused grouped ops.
  //===--------------------------------------------------------------------===//
  %x = arith.constant dense<[[-0.97, 0.86, -0.65, 0.33], [-0.36, -0.04, -0.74, -0.26], [-0.08, -0.42, 0.22, -0.26], [0.26, 0.16, 0.55, -0.91], [0.29, 0.36, -0.85, -0.02], [0.47, 0.62, 0.29, -0.02], [0.49, -0.76, -0.67, 0.38]]> : tensor<7x4xf32>
  %w1 = arith.constant dense<[[[-0.68, -0.24, -0.03, -0.09, -0.65, 0.78], [-0.36, 0.1, -0.17, -0.84, -0.2, 0.77], [-0.66, 0.36, 0.16, -0.69, -0.64, 0.12], [-0.42, -0.76, 0.7, -0.36, -0.46, -0.51]], [[-0.15, 0.63, -0.12, 0.01, 0.1, 0.85], [0.07, 0.35, 0.46, -0.49, -0.83, 0.84], [0.16, -0.98, 0.96, -0.38, 0.7, 0.54], [0.13, 0.8, -0.55, -0.98, -0.06, 0.53]], [[0.58, -0.26, -0.52, 0.97, -0.07, -0.39], [-0.23, -0.13, 0.74, 0.53, -0.2, -0.34], [0.48, 0.73, 0.94, 0.5, 0.26, -0.67], [0.63, -0.78, 0.72, -0.96, 0.5, -0.47]]]> : tensor<3x4x6xf32>
  %w2 = arith.constant dense<[[[0.03, 0.86, 0.84, -0.91], [0.26, 0.23, 0.79, -0.72], [-0.01, -0.6, -0.23, 0.98]], [[0.5, -0.2, 0.09, -0.72], [0.31, -0.92, -0.66, -0.12], [0.96, -0.31, -0.01, -0.76]], [[0.11, -0.1, -0.35, -0.05], [-0.73, 0.64, 0.75, 0.35], [0.93, 0.04, 0.88, -0.89]]]> : tensor<3x3x4xf32>

  %ye = moe.experts %x, %off weights(%w1, %w2 : tensor<3x4x6xf32>, tensor<3x3x4xf32>)
      : tensor<7x4xf32>, tensor<4xi32> -> tensor<7x4xf32> {
  ^bb0(%xg: tensor<?x4xf32>, %a: tensor<4x6xf32>, %b: tensor<3x4xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xf32>
    %e1 = tensor.empty(%n) : tensor<?x6xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %hg = linalg.matmul ins(%xg, %a : tensor<?x4xf32>, tensor<4x6xf32>)
                        outs(%z1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %ag = moe.swiglu %hg : tensor<?x6xf32> -> tensor<?x3xf32>
    %e2 = tensor.empty(%n) : tensor<?x4xf32>
    %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x4xf32>) -> tensor<?x4xf32>
    %og = linalg.matmul ins(%ag, %b : tensor<?x3xf32>, tensor<3x4xf32>)
                        outs(%z2 : tensor<?x4xf32>) -> tensor<?x4xf32>
    moe.yield %og : tensor<?x4xf32>
  }
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<7x4xf32>, tensor<3x4x6xf32>, tensor<4xi32> -> tensor<7x6xf32>
  %act = moe.swiglu %h : tensor<7x6xf32> -> tensor<7x3xf32>
  %yu = moe.grouped_matmul %act, %w2, %off
      : tensor<7x3xf32>, tensor<3x3x4xf32>, tensor<4xi32> -> tensor<7x4xf32>
  %ye_ = tensor.cast %ye : tensor<7x4xf32> to tensor<?x?xf32>
  %yu_ = tensor.cast %yu : tensor<7x4xf32> to tensor<?x?xf32>
  call @pf(%ye_) : (tensor<?x?xf32>) -> ()
  call @pf(%yu_) : (tensor<?x?xf32>) -> ()
  call @count_diff(%ye_, %yu_) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK-LABEL: sizes = [7, 4]
  // CHECK-NEXT: {{\[}}[-0.0181296, -0.12178, -0.150655, 0.154498],
  // CHECK-NEXT:  [0.0132543, 0.328455, {{0\.335637|0\.335638}}, {{-0\.339043|-0\.339044}}],
  // CHECK-NEXT:  [0.00502251, 0.0228628, 0.0344548, -0.0292662],
  // CHECK-NEXT:  [0.190954, -0.161037, -0.152474, -0.0949796],
  // CHECK-NEXT:  [-0.130986, 0.0467615, {{-0\.00938336|-0\.00938339|-0\.00938342}}, 0.0981394],
  // CHECK-NEXT:  [-0.140834, -0.0211935, -0.19722, 0.142758],
  // CHECK-NEXT:  [0, 0, 0, 0]]
  // CHECK: sizes = [7, 4]
  // CHECK-NEXT: {{\[}}[-0.0181296, -0.12178, -0.150655, 0.154498],
  // CHECK-NEXT:  [0.0132543, 0.328455, {{0\.335637|0\.335638}}, {{-0\.339043|-0\.339044}}],
  // CHECK-NEXT:  [0.00502251, 0.0228628, 0.0344548, -0.0292662],
  // CHECK-NEXT:  [0.190954, -0.161037, -0.152474, -0.0949796],
  // CHECK-NEXT:  [-0.130986, 0.0467615, {{-0\.00938336|-0\.00938339|-0\.00938342}}, 0.0981394],
  // CHECK-NEXT:  [-0.140834, -0.0211935, -0.19722, 0.142758],
  // CHECK-NEXT:  [0, 0, 0, 0]]
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]

  //===--------------------------------------------------------------------===//
  // 2. bf16 input and weights: moe.grouped_mlp vs the unfused sequence (the
  //    swiglu result rounded to bf16, w2's element type), and vs moe.experts
  //    with the same body in bf16; f32 result, then bf16 result.
  //===--------------------------------------------------------------------===//
  %xb = arith.constant dense<[[-0.96875, 0.859375, -0.6484375, 0.330078125], [-0.359375, -0.0400390625, -0.73828125, -0.259765625], [-0.080078125, -0.419921875, 0.2197265625, -0.259765625], [0.259765625, 0.16015625, 0.55078125, -0.91015625], [0.2890625, 0.359375, -0.8515625, -0.02001953125], [0.470703125, 0.62109375, 0.2890625, -0.02001953125], [0.490234375, -0.76171875, -0.671875, 0.380859375]]> : tensor<7x4xbf16>
  %w1b = arith.constant dense<[[[-0.6796875, -0.240234375, -0.030029296875, -0.08984375, -0.6484375, 0.78125], [-0.359375, 0.10009765625, -0.169921875, -0.83984375, -0.2001953125, 0.76953125], [-0.66015625, 0.359375, 0.16015625, -0.69140625, -0.640625, 0.1201171875], [-0.419921875, -0.76171875, 0.69921875, -0.359375, -0.4609375, -0.51171875]], [[-0.150390625, 0.62890625, -0.1201171875, 0.010009765625, 0.10009765625, 0.8515625], [0.06982421875, 0.349609375, 0.4609375, -0.490234375, -0.828125, 0.83984375], [0.16015625, -0.98046875, 0.9609375, -0.380859375, 0.69921875, 0.5390625], [0.1298828125, 0.80078125, -0.55078125, -0.98046875, -0.06005859375, 0.53125]], [[0.578125, -0.259765625, -0.51953125, 0.96875, -0.06982421875, -0.390625], [-0.23046875, -0.1298828125, 0.73828125, 0.53125, -0.2001953125, -0.33984375], [0.48046875, 0.73046875, 0.94140625, 0.5, 0.259765625, -0.671875], [0.62890625, -0.78125, 0.71875, -0.9609375, 0.5, -0.470703125]]]> : tensor<3x4x6xbf16>
  %w2b = arith.constant dense<[[[0.030029296875, 0.859375, 0.83984375, -0.91015625], [0.259765625, 0.23046875, 0.7890625, -0.71875], [-0.010009765625, -0.6015625, -0.23046875, 0.98046875]], [[0.5, -0.2001953125, 0.08984375, -0.71875], [0.310546875, -0.921875, -0.66015625, -0.1201171875], [0.9609375, -0.310546875, -0.010009765625, -0.76171875]], [[0.10986328125, -0.10009765625, -0.349609375, -0.050048828125], [-0.73046875, 0.640625, 0.75, 0.349609375], [0.9296875, 0.0400390625, 0.87890625, -0.890625]]]> : tensor<3x3x4xbf16>

  %m = moe.grouped_mlp %xb, %w1b, %w2b, %off
      : tensor<7x4xbf16>, tensor<3x4x6xbf16>, tensor<3x3x4xbf16>, tensor<4xi32>
      -> tensor<7x4xf32>
  %hb = moe.grouped_matmul %xb, %w1b, %off
      : tensor<7x4xbf16>, tensor<3x4x6xbf16>, tensor<4xi32> -> tensor<7x6xf32>
  %ab = moe.swiglu %hb : tensor<7x6xf32> -> tensor<7x3xbf16>
  %mu = moe.grouped_matmul %ab, %w2b, %off
      : tensor<7x3xbf16>, tensor<3x3x4xbf16>, tensor<4xi32> -> tensor<7x4xf32>
  %me = moe.experts %xb, %off weights(%w1b, %w2b : tensor<3x4x6xbf16>, tensor<3x3x4xbf16>)
      : tensor<7x4xbf16>, tensor<4xi32> -> tensor<7x4xf32> {
  ^bb0(%xg: tensor<?x4xbf16>, %a: tensor<4x6xbf16>, %b: tensor<3x4xbf16>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x4xbf16>
    %e1 = tensor.empty(%n) : tensor<?x6xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %hg = linalg.matmul ins(%xg, %a : tensor<?x4xbf16>, tensor<4x6xbf16>)
                        outs(%z1 : tensor<?x6xf32>) -> tensor<?x6xf32>
    %ag = moe.swiglu %hg : tensor<?x6xf32> -> tensor<?x3xbf16>
    %e2 = tensor.empty(%n) : tensor<?x4xf32>
    %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x4xf32>) -> tensor<?x4xf32>
    %og = linalg.matmul ins(%ag, %b : tensor<?x3xbf16>, tensor<3x4xbf16>)
                        outs(%z2 : tensor<?x4xf32>) -> tensor<?x4xf32>
    moe.yield %og : tensor<?x4xf32>
  }
  %m_ = tensor.cast %m : tensor<7x4xf32> to tensor<?x?xf32>
  %mu_ = tensor.cast %mu : tensor<7x4xf32> to tensor<?x?xf32>
  %me_ = tensor.cast %me : tensor<7x4xf32> to tensor<?x?xf32>
  call @pf(%m_) : (tensor<?x?xf32>) -> ()
  call @pf(%mu_) : (tensor<?x?xf32>) -> ()
  call @count_diff(%m_, %mu_) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  call @count_diff(%me_, %mu_) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [7, 4]
  // CHECK-NEXT: {{\[}}[-0.0180303, -0.121506, -0.150195, 0.154052],
  // CHECK-NEXT:  [0.0133822, 0.327673, 0.335359, -0.338856],
  // CHECK-NEXT:  [0.00503349, 0.0228381, 0.0344467, -0.0292854],
  // CHECK-NEXT:  [0.191745, -0.161797, {{-0\.153293|-0\.153294}}, -0.0951624],
  // CHECK-NEXT:  [-0.131892, 0.0467888, -0.0101571, {{0\.0990076|0\.0990077}}],
  // CHECK-NEXT:  [-0.140324, -0.0211241, -0.196262, 0.142365],
  // CHECK-NEXT:  [0, 0, 0, 0]]
  // CHECK: sizes = [7, 4]
  // CHECK-NEXT: {{\[}}[-0.0180303, -0.121506, -0.150195, 0.154052],
  // CHECK-NEXT:  [0.0133822, 0.327673, 0.335359, -0.338856],
  // CHECK-NEXT:  [0.00503349, 0.0228381, 0.0344467, -0.0292854],
  // CHECK-NEXT:  [0.191745, -0.161797, {{-0\.153293|-0\.153294}}, -0.0951624],
  // CHECK-NEXT:  [-0.131892, 0.0467888, -0.0101571, {{0\.0990076|0\.0990077}}],
  // CHECK-NEXT:  [-0.140324, -0.0211241, -0.196262, 0.142365],
  // CHECK-NEXT:  [0, 0, 0, 0]]
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]

  %mb = moe.grouped_mlp %xb, %w1b, %w2b, %off
      : tensor<7x4xbf16>, tensor<3x4x6xbf16>, tensor<3x3x4xbf16>, tensor<4xi32>
      -> tensor<7x4xbf16>
  %mub = moe.grouped_matmul %ab, %w2b, %off
      : tensor<7x3xbf16>, tensor<3x3x4xbf16>, tensor<4xi32> -> tensor<7x4xbf16>
  %mb_ = call @ext(%mb) : (tensor<7x4xbf16>) -> tensor<?x?xf32>
  %mub_ = call @ext(%mub) : (tensor<7x4xbf16>) -> tensor<?x?xf32>
  call @pf(%mb_) : (tensor<?x?xf32>) -> ()
  call @pf(%mub_) : (tensor<?x?xf32>) -> ()
  call @count_diff(%mb_, %mub_) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  // CHECK: sizes = [7, 4]
  // CHECK-NEXT: {{\[}}[-0.0180664, -0.121582, -0.150391, 0.154297],
  // CHECK-NEXT:  [0.0133667, 0.328125, 0.335938, -0.337891],
  // CHECK-NEXT:  [0.0050354, 0.0228271, 0.0344238, -0.0292969],
  // CHECK-NEXT:  [0.191406, -0.162109, -0.15332, -0.0952148],
  // CHECK-NEXT:  [-0.131836, 0.046875, -0.0101318, 0.0991211],
  // CHECK-NEXT:  [-0.140625, -0.0211182, -0.196289, 0.142578],
  // CHECK-NEXT:  [0, 0, 0, 0]]
  // CHECK: sizes = [7, 4]
  // CHECK-NEXT: {{\[}}[-0.0180664, -0.121582, -0.150391, 0.154297],
  // CHECK-NEXT:  [0.0133667, 0.328125, 0.335938, -0.337891],
  // CHECK-NEXT:  [0.0050354, 0.0228271, 0.0344238, -0.0292969],
  // CHECK-NEXT:  [0.191406, -0.162109, -0.15332, -0.0952148],
  // CHECK-NEXT:  [-0.131836, 0.046875, -0.0101318, 0.0991211],
  // CHECK-NEXT:  [-0.140625, -0.0211182, -0.196289, 0.142578],
  // CHECK-NEXT:  [0, 0, 0, 0]]
  // CHECK: sizes = [1]
  // CHECK-NEXT: {{^}}[0]
  return
}
