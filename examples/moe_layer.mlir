// A Mixture-of-Experts layer in the moe dialect, as a model graph would hold
// it: router -> dispatch -> expert MLPs (SwiGLU) -> combine, plus a shared
// (always-on) expert, at small Qwen3-MoE-like proportions: 64 tokens, hidden
// 64, 8 experts, top-2, expert FFN 32.
//
// @main runs the layer twice on the same deterministic inputs: once in f32
// and once with MXFP8 (E4M3, one scale per 32) activations and expert
// weights, and prints tokens per expert, a corner of both outputs and the
// relative error of the MXFP8 layer.
//
//   moe-opt examples/moe_layer.mlir --moe-cpu-pipeline |
//     mlir-runner -e main -entry-point-result=void -shared-libs=...

#id2 = affine_map<(d0, d1) -> (d0, d1)>
#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#red = affine_map<(d0, d1) -> ()>

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)

// The layer. Expert weights are stacked: w1 [E, H, 2F] (gate | up), w2 [E, F, H].
func.func @moe_layer(%x: tensor<64x64xf32>, %router_w: tensor<64x8xf32>,
                     %w1: tensor<8x64x64xf32>, %w2: tensor<8x32x64xf32>,
                     %shared_w1: tensor<64x64xf32>, %shared_w2: tensor<32x64xf32>)
    -> (tensor<64x64xf32>, tensor<8xi32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x8xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<64x8xf32>) -> tensor<64x8xf32>
  %logits = linalg.matmul ins(%x, %router_w : tensor<64x64xf32>, tensor<64x8xf32>)
                          outs(%z : tensor<64x8xf32>) -> tensor<64x8xf32>
  %idx, %weights = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<64x8xf32> -> tensor<64x2xi32>, tensor<64x2xf32>
  %sorted, %offsets, %counts, %pos = moe.dispatch %x, %idx experts(8) pad_to(32)
      : tensor<64x64xf32>, tensor<64x2xi32>
      -> tensor<352x64xf32>, tensor<9xi32>, tensor<8xi32>, tensor<64x2xi32>
  %y = moe.grouped_mlp %sorted, %w1, %w2, %offsets
      : tensor<352x64xf32>, tensor<8x64x64xf32>, tensor<8x32x64xf32>, tensor<9xi32>
      -> tensor<352x64xf32>
  %routed = moe.combine %y, %weights, %pos
      : tensor<352x64xf32>, tensor<64x2xf32>, tensor<64x2xi32> -> tensor<64x64xf32>
  %shared = call @shared_expert(%x, %shared_w1, %shared_w2)
      : (tensor<64x64xf32>, tensor<64x64xf32>, tensor<32x64xf32>) -> tensor<64x64xf32>
  %out = arith.addf %routed, %shared : tensor<64x64xf32>
  return %out, %counts : tensor<64x64xf32>, tensor<8xi32>
}

// The same layer with MXFP8 expert GEMMs: activations quantized rowwise,
// weights along their contraction dimension; the SwiGLU output is quantized
// inside moe.grouped_mlp because w2 is block-scaled.
func.func @moe_layer_mxfp8(%x: tensor<64x64xf32>, %router_w: tensor<64x8xf32>,
                           %w1: tensor<8x64x64xf32>, %w2: tensor<8x32x64xf32>,
                           %shared_w1: tensor<64x64xf32>, %shared_w2: tensor<32x64xf32>)
    -> tensor<64x64xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x8xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<64x8xf32>) -> tensor<64x8xf32>
  %logits = linalg.matmul ins(%x, %router_w : tensor<64x64xf32>, tensor<64x8xf32>)
                          outs(%z : tensor<64x8xf32>) -> tensor<64x8xf32>
  %idx, %weights = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<64x8xf32> -> tensor<64x2xi32>, tensor<64x2xf32>
  %sorted, %offsets, %counts, %pos = moe.dispatch %x, %idx experts(8) pad_to(32)
      : tensor<64x64xf32>, tensor<64x2xi32>
      -> tensor<352x64xf32>, tensor<9xi32>, tensor<8xi32>, tensor<64x2xi32>
  %xq = moe.quantize %sorted : tensor<352x64xf32> -> !moe.mx<352x64xf8E4M3FN, axis = 1>
  %w1q = moe.quantize %w1 : tensor<8x64x64xf32> -> !moe.mx<8x64x64xf8E4M3FN, axis = 1>
  %w2q = moe.quantize %w2 : tensor<8x32x64xf32> -> !moe.mx<8x32x64xf8E4M3FN, axis = 1>
  %y = moe.grouped_mlp %xq, %w1q, %w2q, %offsets
      : !moe.mx<352x64xf8E4M3FN, axis = 1>, !moe.mx<8x64x64xf8E4M3FN, axis = 1>,
        !moe.mx<8x32x64xf8E4M3FN, axis = 1>, tensor<9xi32> -> tensor<352x64xf32>
  %routed = moe.combine %y, %weights, %pos
      : tensor<352x64xf32>, tensor<64x2xf32>, tensor<64x2xi32> -> tensor<64x64xf32>
  %shared = call @shared_expert(%x, %shared_w1, %shared_w2)
      : (tensor<64x64xf32>, tensor<64x64xf32>, tensor<32x64xf32>) -> tensor<64x64xf32>
  %out = arith.addf %routed, %shared : tensor<64x64xf32>
  return %out : tensor<64x64xf32>
}

// A shared expert is a dense SwiGLU MLP every token goes through.
func.func @shared_expert(%x: tensor<64x64xf32>, %w1: tensor<64x64xf32>,
                         %w2: tensor<32x64xf32>) -> tensor<64x64xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x64xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<64x64xf32>) -> tensor<64x64xf32>
  %h = linalg.matmul ins(%x, %w1 : tensor<64x64xf32>, tensor<64x64xf32>)
                     outs(%z : tensor<64x64xf32>) -> tensor<64x64xf32>
  %a = moe.swiglu %h : tensor<64x64xf32> -> tensor<64x32xf32>
  %o = linalg.matmul ins(%a, %w2 : tensor<64x32xf32>, tensor<32x64xf32>)
                     outs(%z : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %o : tensor<64x64xf32>
}

// Deterministic inputs: scale * sin(seed * (1 + flat index)).
func.func @fill2(%seed: f32, %scale: f32, %t: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %c1 = arith.constant 1 : index
  %n1 = tensor.dim %t, %c1 : tensor<?x?xf32>
  %r = linalg.generic {indexing_maps = [#id2], iterator_types = ["parallel", "parallel"]}
      outs(%t : tensor<?x?xf32>) {
  ^bb0(%o: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %ij = arith.muli %i, %n1 : index
    %k = arith.addi %ij, %j : index
    %k1 = arith.addi %k, %c1 : index
    %ki = arith.index_cast %k1 : index to i64
    %kf = arith.sitofp %ki : i64 to f32
    %a = arith.mulf %kf, %seed : f32
    %s = math.sin %a : f32
    %v = arith.mulf %s, %scale : f32
    linalg.yield %v : f32
  } -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}

func.func @main() {
  %e64 = tensor.empty() : tensor<64x64xf32>
  %e8 = tensor.empty() : tensor<64x8xf32>
  %ew1 = tensor.empty() : tensor<512x64xf32>
  %ew2 = tensor.empty() : tensor<256x64xf32>
  %es2 = tensor.empty() : tensor<32x64xf32>
  %s1 = arith.constant 0.37 : f32
  %s2 = arith.constant 0.71 : f32
  %s3 = arith.constant 1.13 : f32
  %s4 = arith.constant 0.53 : f32
  %s5 = arith.constant 0.29 : f32
  %s6 = arith.constant 0.83 : f32
  %one = arith.constant 1.0 : f32
  %w_scale = arith.constant 0.125 : f32
  %x_i = tensor.cast %e64 : tensor<64x64xf32> to tensor<?x?xf32>
  %x_d = call @fill2(%s1, %one, %x_i) : (f32, f32, tensor<?x?xf32>) -> tensor<?x?xf32>
  %x = tensor.cast %x_d : tensor<?x?xf32> to tensor<64x64xf32>
  %rw_i = tensor.cast %e8 : tensor<64x8xf32> to tensor<?x?xf32>
  %rw_d = call @fill2(%s2, %w_scale, %rw_i) : (f32, f32, tensor<?x?xf32>) -> tensor<?x?xf32>
  %rw = tensor.cast %rw_d : tensor<?x?xf32> to tensor<64x8xf32>
  %w1f_i = tensor.cast %ew1 : tensor<512x64xf32> to tensor<?x?xf32>
  %w1f_d = call @fill2(%s3, %w_scale, %w1f_i) : (f32, f32, tensor<?x?xf32>) -> tensor<?x?xf32>
  %w1f = tensor.cast %w1f_d : tensor<?x?xf32> to tensor<512x64xf32>
  %w2f_i = tensor.cast %ew2 : tensor<256x64xf32> to tensor<?x?xf32>
  %w2f_d = call @fill2(%s4, %w_scale, %w2f_i) : (f32, f32, tensor<?x?xf32>) -> tensor<?x?xf32>
  %w2f = tensor.cast %w2f_d : tensor<?x?xf32> to tensor<256x64xf32>
  %sw1_i = tensor.cast %e64 : tensor<64x64xf32> to tensor<?x?xf32>
  %sw1_d = call @fill2(%s5, %w_scale, %sw1_i) : (f32, f32, tensor<?x?xf32>) -> tensor<?x?xf32>
  %sw1 = tensor.cast %sw1_d : tensor<?x?xf32> to tensor<64x64xf32>
  %sw2_i = tensor.cast %es2 : tensor<32x64xf32> to tensor<?x?xf32>
  %sw2_d = call @fill2(%s6, %w_scale, %sw2_i) : (f32, f32, tensor<?x?xf32>) -> tensor<?x?xf32>
  %sw2 = tensor.cast %sw2_d : tensor<?x?xf32> to tensor<32x64xf32>
  %w1 = tensor.expand_shape %w1f [[0, 1], [2]] output_shape [8, 64, 64]
      : tensor<512x64xf32> into tensor<8x64x64xf32>
  %w2 = tensor.expand_shape %w2f [[0, 1], [2]] output_shape [8, 32, 64]
      : tensor<256x64xf32> into tensor<8x32x64xf32>

  %y, %counts = call @moe_layer(%x, %rw, %w1, %w2, %sw1, %sw2)
      : (tensor<64x64xf32>, tensor<64x8xf32>, tensor<8x64x64xf32>, tensor<8x32x64xf32>,
         tensor<64x64xf32>, tensor<32x64xf32>) -> (tensor<64x64xf32>, tensor<8xi32>)
  %yq = call @moe_layer_mxfp8(%x, %rw, %w1, %w2, %sw1, %sw2)
      : (tensor<64x64xf32>, tensor<64x8xf32>, tensor<8x64x64xf32>, tensor<8x32x64xf32>,
         tensor<64x64xf32>, tensor<32x64xf32>) -> tensor<64x64xf32>

  // Tokens routed to each expert (64 tokens x top-2 = 128).
  %cu = tensor.cast %counts : tensor<8xi32> to tensor<*xi32>
  call @printMemrefI32(%cu) : (tensor<*xi32>) -> ()
  // Output corner, f32 then MXFP8.
  %c = tensor.extract_slice %y[0, 0] [3, 6] [1, 1] : tensor<64x64xf32> to tensor<3x6xf32>
  %cq = tensor.extract_slice %yq[0, 0] [3, 6] [1, 1] : tensor<64x64xf32> to tensor<3x6xf32>
  %cc = tensor.cast %c : tensor<3x6xf32> to tensor<*xf32>
  %ccq = tensor.cast %cq : tensor<3x6xf32> to tensor<*xf32>
  call @printMemrefF32(%cc) : (tensor<*xf32>) -> ()
  call @printMemrefF32(%ccq) : (tensor<*xf32>) -> ()
  // Relative error ||yq - y|| / ||y||.
  %zero = arith.constant 0.0 : f32
  %acc0 = tensor.empty() : tensor<f32>
  %acc = linalg.fill ins(%zero : f32) outs(%acc0 : tensor<f32>) -> tensor<f32>
  %num = linalg.generic {indexing_maps = [#id2, #id2, #red], iterator_types = ["reduction", "reduction"]}
      ins(%yq, %y : tensor<64x64xf32>, tensor<64x64xf32>) outs(%acc : tensor<f32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %d = arith.subf %a, %b : f32
    %d2 = arith.mulf %d, %d : f32
    %r = arith.addf %s, %d2 : f32
    linalg.yield %r : f32
  } -> tensor<f32>
  %den = linalg.generic {indexing_maps = [#id2, #red], iterator_types = ["reduction", "reduction"]}
      ins(%y : tensor<64x64xf32>) outs(%acc : tensor<f32>) {
  ^bb0(%b: f32, %s: f32):
    %b2 = arith.mulf %b, %b : f32
    %r = arith.addf %s, %b2 : f32
    linalg.yield %r : f32
  } -> tensor<f32>
  %n = tensor.extract %num[] : tensor<f32>
  %d = tensor.extract %den[] : tensor<f32>
  %q = arith.divf %n, %d : f32
  %rel = math.sqrt %q : f32
  %relt = tensor.from_elements %rel : tensor<1xf32>
  %relu = tensor.cast %relt : tensor<1xf32> to tensor<*xf32>
  call @printMemrefF32(%relu) : (tensor<*xf32>) -> ()
  return
}
