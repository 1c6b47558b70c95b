// RUN: cat %s | %run_cpu | FileCheck %s
// RUN: cat %s | %run_parallel_cpu | FileCheck %s

// moe.router on the CPU: top-k selection (ties: the lower expert index wins;
// NaN never wins against a number) and the four weight recipes.
//
// Expected values: the indices by hand (all score functions are monotonic,
// so every variant picks the same experts for k = 2). The weights were
// computed with a small independent Python script that emulates f32
// (every operation rounded to f32 with struct.pack('f')), in the op's
// documented order:
//   softmax(r)  = exp(r - max(r)) / sum_e exp(r_e - max(r))
//   sigmoid(v)  = 1 / (1 + exp(-v))
//   norm(w)     = w / (w_0 + w_1 + ...)
// and printed the way printMemrefF32 prints (C++ ostream default: %g, 6
// significant digits). Every weight is at least ~1.3e-7 (relative) away from
// a 6-digit rounding boundary, so a 1-ulp difference in expf cannot change
// the printed digits. Spot checks by hand:
//   row 2, softmax norm:  e^4 / (e^4 + e^2) = 1 / (1 + e^-2) = 0.880797
//   row 3, softmax norm:  1 / (1 + e^-0.5) = 0.622459
//   row 0, softmax: e^0 / (e^-2 + 1 + 1 + e^-1) = 1 / 2.503214 = 0.399486
//   row 2, sigmoid norm:  0.982014 / (0.982014 + 0.880797) = 0.527168

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)

func.func @print_f32(%t: tensor<?x?xf32>) {
  %u = tensor.cast %t : tensor<?x?xf32> to tensor<*xf32>
  call @printMemrefF32(%u) : (tensor<*xf32>) -> ()
  return
}
func.func @print_i32(%t: tensor<?x?xi32>) {
  %u = tensor.cast %t : tensor<?x?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}

func.func @main() {
  // Row 0: tie between experts 1 and 2 at the top; row 1: all tied; row 2:
  // distinct; row 3: tie between 0 and 2 for the second slot (0 must win);
  // row 4: ties at the top (1, 3) and below (0, 2).
  %logits = arith.constant dense<[[1.0, 3.0, 3.0, 2.0],
                                  [0.0, 0.0, 0.0, 0.0],
                                  [2.0, -1.0, 0.5, 4.0],
                                  [0.5, 1.0, 0.5, -3.0],
                                  [-1.0, 5.0, -1.0, 5.0]]> : tensor<5x4xf32>

  // A. softmax over all experts, top-2, weights = the top-2 probabilities.
  %ia, %wa = moe.router %logits top_k(2) softmax
      : tensor<5x4xf32> -> tensor<5x2xi32>, tensor<5x2xf32>
  // B. + norm_topk_prob.
  %ib, %wb = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<5x4xf32> -> tensor<5x2xi32>, tensor<5x2xf32>
  // C. softmax_after_topk, top-3 (ties decide the third slot too).
  %ic, %wc = moe.router %logits top_k(3) softmax softmax_after_topk
      : tensor<5x4xf32> -> tensor<5x3xi32>, tensor<5x3xf32>
  // C'. softmax_after_topk + norm_topk_prob: must be identical to C.
  %ic2, %wc2 = moe.router %logits top_k(3) softmax softmax_after_topk norm_topk_prob
      : tensor<5x4xf32> -> tensor<5x3xi32>, tensor<5x3xf32>
  // D. sigmoid.
  %id, %wd = moe.router %logits top_k(2) sigmoid
      : tensor<5x4xf32> -> tensor<5x2xi32>, tensor<5x2xf32>
  // E. sigmoid + norm_topk_prob.
  %ie, %we = moe.router %logits top_k(2) sigmoid norm_topk_prob
      : tensor<5x4xf32> -> tensor<5x2xi32>, tensor<5x2xf32>

  %ia_ = tensor.cast %ia : tensor<5x2xi32> to tensor<?x?xi32>
  %wa_ = tensor.cast %wa : tensor<5x2xf32> to tensor<?x?xf32>
  call @print_i32(%ia_) : (tensor<?x?xi32>) -> ()
  call @print_f32(%wa_) : (tensor<?x?xf32>) -> ()
  // CHECK-LABEL: sizes = [5, 2]
  // CHECK-NEXT: {{\[}}[1, 2],
  // CHECK-NEXT:  [0, 1],
  // CHECK-NEXT:  [3, 0],
  // CHECK-NEXT:  [1, 0],
  // CHECK-NEXT:  [1, 3]]
  // CHECK: sizes = [5, 2]
  // CHECK-NEXT: {{\[}}[0.399486, 0.399486],
  // CHECK-NEXT:  [0.25, 0.25],
  // CHECK-NEXT:  [0.853045, 0.115447],
  // CHECK-NEXT:  [0.448154, 0.271819],
  // CHECK-NEXT:  [0.498764, 0.498764]]

  %ib_ = tensor.cast %ib : tensor<5x2xi32> to tensor<?x?xi32>
  %wb_ = tensor.cast %wb : tensor<5x2xf32> to tensor<?x?xf32>
  call @print_i32(%ib_) : (tensor<?x?xi32>) -> ()
  call @print_f32(%wb_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [5, 2]
  // CHECK-NEXT: {{\[}}[1, 2],
  // CHECK-NEXT:  [0, 1],
  // CHECK-NEXT:  [3, 0],
  // CHECK-NEXT:  [1, 0],
  // CHECK-NEXT:  [1, 3]]
  // CHECK: sizes = [5, 2]
  // CHECK-NEXT: {{\[}}[0.5, 0.5],
  // CHECK-NEXT:  [0.5, 0.5],
  // CHECK-NEXT:  [0.880797, 0.119203],
  // CHECK-NEXT:  [0.622459, 0.377541],
  // CHECK-NEXT:  [0.5, 0.5]]

  %ic_ = tensor.cast %ic : tensor<5x3xi32> to tensor<?x?xi32>
  %wc_ = tensor.cast %wc : tensor<5x3xf32> to tensor<?x?xf32>
  call @print_i32(%ic_) : (tensor<?x?xi32>) -> ()
  call @print_f32(%wc_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [5, 3]
  // CHECK-NEXT: {{\[}}[1, 2, 3],
  // CHECK-NEXT:  [0, 1, 2],
  // CHECK-NEXT:  [3, 0, 2],
  // CHECK-NEXT:  [1, 0, 2],
  // CHECK-NEXT:  [1, 3, 0]]
  // CHECK: sizes = [5, 3]
  // CHECK-NEXT: {{\[}}[0.422319, 0.422319, 0.155362],
  // CHECK-NEXT:  [0.333333, 0.333333, 0.333333],
  // CHECK-NEXT:  [0.857977, 0.116115, 0.0259087],
  // CHECK-NEXT:  [0.451863, 0.274069, 0.274069],
  // CHECK-NEXT:  [0.499381, 0.499381, 0.00123784]]

  // C' == C, checked bit for bit in IR: the number of differing weights
  // (compared as i32 bit patterns) and differing indices, printed as [0, 0].
  %zero = arith.constant 0 : i32
  %cnt0 = tensor.empty() : tensor<1x2xi32>
  %cnt1 = linalg.fill ins(%zero : i32) outs(%cnt0 : tensor<1x2xi32>) -> tensor<1x2xi32>
  %diff = linalg.generic {
      indexing_maps = [affine_map<(t, j, c) -> (t, j)>, affine_map<(t, j, c) -> (t, j)>,
                       affine_map<(t, j, c) -> (t, j)>, affine_map<(t, j, c) -> (t, j)>,
                       affine_map<(t, j, c) -> (0, c)>],
      iterator_types = ["reduction", "reduction", "parallel"]}
      ins(%wc, %wc2, %ic, %ic2 : tensor<5x3xf32>, tensor<5x3xf32>, tensor<5x3xi32>, tensor<5x3xi32>)
      outs(%cnt1 : tensor<1x2xi32>) {
  ^bb0(%a: f32, %b: f32, %x: i32, %y: i32, %acc: i32):
    %c = linalg.index 2 : index
    %ab = arith.bitcast %a : f32 to i32
    %bb = arith.bitcast %b : f32 to i32
    %c0 = arith.constant 0 : index
    %is_w = arith.cmpi eq, %c, %c0 : index
    %l = arith.select %is_w, %ab, %x : i32
    %r = arith.select %is_w, %bb, %y : i32
    %ne = arith.cmpi ne, %l, %r : i32
    %one = arith.extui %ne : i1 to i32
    %s = arith.addi %acc, %one : i32
    linalg.yield %s : i32
  } -> tensor<1x2xi32>
  %diff_ = tensor.cast %diff : tensor<1x2xi32> to tensor<?x?xi32>
  call @print_i32(%diff_) : (tensor<?x?xi32>) -> ()
  // CHECK: sizes = [1, 2]
  // CHECK-NEXT: {{\[}}[0, 0]]

  %id_ = tensor.cast %id : tensor<5x2xi32> to tensor<?x?xi32>
  %wd_ = tensor.cast %wd : tensor<5x2xf32> to tensor<?x?xf32>
  call @print_i32(%id_) : (tensor<?x?xi32>) -> ()
  call @print_f32(%wd_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [5, 2]
  // CHECK-NEXT: {{\[}}[1, 2],
  // CHECK-NEXT:  [0, 1],
  // CHECK-NEXT:  [3, 0],
  // CHECK-NEXT:  [1, 0],
  // CHECK-NEXT:  [1, 3]]
  // CHECK: sizes = [5, 2]
  // CHECK-NEXT: {{\[}}[0.952574, 0.952574],
  // CHECK-NEXT:  [0.5, 0.5],
  // CHECK-NEXT:  [0.982014, 0.880797],
  // CHECK-NEXT:  [0.731059, 0.622459],
  // CHECK-NEXT:  [0.993307, 0.993307]]

  %ie_ = tensor.cast %ie : tensor<5x2xi32> to tensor<?x?xi32>
  %we_ = tensor.cast %we : tensor<5x2xf32> to tensor<?x?xf32>
  call @print_i32(%ie_) : (tensor<?x?xi32>) -> ()
  call @print_f32(%we_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [5, 2]
  // CHECK-NEXT: {{\[}}[1, 2],
  // CHECK-NEXT:  [0, 1],
  // CHECK-NEXT:  [3, 0],
  // CHECK-NEXT:  [1, 0],
  // CHECK-NEXT:  [1, 3]]
  // CHECK: sizes = [5, 2]
  // CHECK-NEXT: {{\[}}[0.5, 0.5],
  // CHECK-NEXT:  [0.5, 0.5],
  // CHECK-NEXT:  [0.527168, 0.472832],
  // CHECK-NEXT:  [0.540117, 0.459883],
  // CHECK-NEXT:  [0.5, 0.5]]

  // F. NaN never wins against a number, not even against -inf (softmax
  // after top-k ranks the raw logits, and -inf is a common mask value).
  //   row 0 (sigmoid): [NaN, 1, 0, NaN] -> experts 1, 2, then 0 (NaNs last,
  //          lower index first); weights sigmoid(1) = 0.731059, sigmoid(0)
  //          = 0.5, NaN (printed as nan or -nan: the sign of a NaN is
  //          unspecified).
  //   row 1 (softmax_after_topk, k = 2): [NaN, -inf, 2, NaN] -> experts 2,
  //          1; weights softmax([2, -inf]) = [1, 0].
  %nan_logits = arith.constant dense<[[0x7FC00000, 1.0, 0.0, 0x7FC00000],
                                      [0x7FC00000, 0xFF800000, 2.0, 0x7FC00000]]> : tensor<2x4xf32>
  %r0 = tensor.extract_slice %nan_logits[0, 0] [1, 4] [1, 1] : tensor<2x4xf32> to tensor<1x4xf32>
  %r1 = tensor.extract_slice %nan_logits[1, 0] [1, 4] [1, 1] : tensor<2x4xf32> to tensor<1x4xf32>
  %if, %wf = moe.router %r0 top_k(3) sigmoid
      : tensor<1x4xf32> -> tensor<1x3xi32>, tensor<1x3xf32>
  %ig, %wg = moe.router %r1 top_k(2) softmax softmax_after_topk
      : tensor<1x4xf32> -> tensor<1x2xi32>, tensor<1x2xf32>
  %if_ = tensor.cast %if : tensor<1x3xi32> to tensor<?x?xi32>
  %wf_ = tensor.cast %wf : tensor<1x3xf32> to tensor<?x?xf32>
  %ig_ = tensor.cast %ig : tensor<1x2xi32> to tensor<?x?xi32>
  %wg_ = tensor.cast %wg : tensor<1x2xf32> to tensor<?x?xf32>
  call @print_i32(%if_) : (tensor<?x?xi32>) -> ()
  call @print_f32(%wf_) : (tensor<?x?xf32>) -> ()
  call @print_i32(%ig_) : (tensor<?x?xi32>) -> ()
  call @print_f32(%wg_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [1, 3]
  // CHECK-NEXT: {{\[}}[1, 2, 0]]
  // CHECK: sizes = [1, 3]
  // CHECK-NEXT: {{\[}}[0.731059, 0.5, {{-?nan}}]]
  // CHECK: sizes = [1, 2]
  // CHECK-NEXT: {{\[}}[2, 1]]
  // CHECK: sizes = [1, 2]
  // CHECK-NEXT: {{\[}}[1, 0]]
  return
}
