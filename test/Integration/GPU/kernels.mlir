// Every moe op on the GPU against the CPU reference, on fresh random inputs.
// scripts/gpu-check.sh compiles this file for the CPU and for sm_90a with
// moe-compile and runs `moert-check` on a GPU machine: integer and 8-bit
// results must be bit-identical; float results within the tolerance each
// function declares (moe.test_tolerance = [atol, rtol]) and justifies.
// On machines without a GPU, lit checks that the GPU pipeline compiles every
// function and that ptxas accepts the kernels:
// RUN: moe-compile %s --target=sm_90a --verify-ptx -o %t.so | FileCheck %s
// CHECK: ptxas accepted 146 kernel modules for sm_90a
// The same kernels for Blackwell (sm_100a, PTX ISA 8.6):
// RUN: moe-compile %s --target=sm_100a --verify-ptx -o %t.sm100.so | FileCheck %s --check-prefix=SM100
// SM100: ptxas accepted 203 kernel modules for sm_100a
// RUN: moe-compile %s --target=cpu -o %t.cpu.so

// MXFP8 quantize, rowwise, bf16 in: bit-identical (integer/exact f32 math).
func.func @quantize_rowwise(%x: tensor<256x512xbf16>)
    -> (tensor<256x512xf8E4M3FN>, tensor<256x16xf8E8M0FNU>) {
  %q = moe.quantize %x : tensor<256x512xbf16> -> !moe.mx<256x512xf8E4M3FN, axis = 1>
  %d, %s = moe.mx_unpack %q : !moe.mx<256x512xf8E4M3FN, axis = 1>
      -> tensor<256x512xf8E4M3FN>, tensor<256x16xf8E8M0FNU>
  return %d, %s : tensor<256x512xf8E4M3FN>, tensor<256x16xf8E8M0FNU>
}

// Columnwise (blocks along tokens, for weight gradients), E5M2, floor scale.
func.func @quantize_columnwise(%x: tensor<512x96xf32>)
    -> (tensor<512x96xf8E5M2>, tensor<16x96xf8E8M0FNU>) {
  %q = moe.quantize %x scale(floor) : tensor<512x96xf32> -> !moe.mx<512x96xf8E5M2, axis = 0>
  %d, %s = moe.mx_unpack %q : !moe.mx<512x96xf8E5M2, axis = 0>
      -> tensor<512x96xf8E5M2>, tensor<16x96xf8E8M0FNU>
  return %d, %s : tensor<512x96xf8E5M2>, tensor<16x96xf8E8M0FNU>
}

// Dequantize arbitrary bytes (NaN codes and NaN scales included; the MX
// dequantize kernel on the GPU): q * 2^e is exact in f32 on both (no flush
// of subnormals), so bit-identical.
func.func @dequantize(%d: tensor<128x256xf8E4M3FN>, %s: tensor<128x8xf8E8M0FNU>)
    -> tensor<128x256xf32> {
  %q = moe.mx_pack %d, %s : tensor<128x256xf8E4M3FN>, tensor<128x8xf8E8M0FNU>
      -> !moe.mx<128x256xf8E4M3FN, axis = 1>
  %y = moe.dequantize %q : !moe.mx<128x256xf8E4M3FN, axis = 1> -> tensor<128x256xf32>
  return %y : tensor<128x256xf32>
}

// The same along K of a weight [E, K, N] (each thread's 8 columns have 8
// scale bytes), E5M2 (infinities and NaNs among the codes) to bf16: the f32
// product rounded once, as the CPU does: bit-identical.
func.func @dequantize_weights(%d: tensor<4x64x96xf8E5M2>, %s: tensor<4x2x96xf8E8M0FNU>)
    -> tensor<4x64x96xbf16> {
  %q = moe.mx_pack %d, %s : tensor<4x64x96xf8E5M2>, tensor<4x2x96xf8E8M0FNU>
      -> !moe.mx<4x64x96xf8E5M2, axis = 1>
  %y = moe.dequantize %q : !moe.mx<4x64x96xf8E5M2, axis = 1> -> tensor<4x64x96xbf16>
  return %y : tensor<4x64x96xbf16>
}

// MX round trips (moe.dequantize of moe.quantize; one kernel on the GPU)
// against the generic CPU lowering: bit-identical. Blocks along the
// innermost dim (f32 -> bf16, as MXFP8 GEMM operands are rounded; 17 blocks
// a row, so the last warp's 4 blocks run past the end), along K of a
// weight-shaped tensor (bf16 -> f32, E5M2, floor scale), and along the
// innermost dim of a 3-D tensor.
func.func @mx_round_trip_rows(%x: tensor<300x544xf32>) -> tensor<300x544xbf16>
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %q = moe.quantize %x : tensor<300x544xf32> -> !moe.mx<300x544xf8E4M3FN, axis = 1>
  %y = moe.dequantize %q : !moe.mx<300x544xf8E4M3FN, axis = 1> -> tensor<300x544xbf16>
  return %y : tensor<300x544xbf16>
}
// Special values (the kernel rounds elements with the hardware's f32 -> f8
// conversion, the generic path with integer arithmetic): a NaN and an
// infinity (NaN blocks), an all-zero and an all -0 block, a block of f32
// subnormals, a value near f32's max, and with the floor scale E5M2 values
// that saturate.
func.func @mx_round_trip_specials(%x: tensor<8x64xf32>) -> (tensor<8x64xbf16>, tensor<8x64xf32>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %c40 = arith.constant 40 : index
  %nan = arith.constant 0x7FC00000 : f32
  %inf = arith.constant 0xFF800000 : f32
  %big = arith.constant 3.0e38 : f32
  %zeros = arith.constant dense<0.0> : tensor<1x32xf32>
  %negzeros = arith.constant dense<-0.0> : tensor<1x32xf32>
  %tiny = arith.constant dense<1.0e-39> : tensor<1x32xf32>
  %a = tensor.insert %nan into %x[%c0, %c3] : tensor<8x64xf32>
  %b = tensor.insert %inf into %a[%c1, %c40] : tensor<8x64xf32>
  %c = tensor.insert_slice %zeros into %b[2, 0] [1, 32] [1, 1] : tensor<1x32xf32> into tensor<8x64xf32>
  %d = tensor.insert_slice %negzeros into %c[2, 32] [1, 32] [1, 1] : tensor<1x32xf32> into tensor<8x64xf32>
  %e = tensor.insert %big into %d[%c3, %c5] : tensor<8x64xf32>
  %row = tensor.extract_slice %e[4, 0] [1, 32] [1, 1] : tensor<8x64xf32> to tensor<1x32xf32>
  %sub = arith.mulf %row, %tiny : tensor<1x32xf32>
  %f = tensor.insert_slice %sub into %e[4, 0] [1, 32] [1, 1] : tensor<1x32xf32> into tensor<8x64xf32>
  %q1 = moe.quantize %f : tensor<8x64xf32> -> !moe.mx<8x64xf8E4M3FN, axis = 1>
  %y1 = moe.dequantize %q1 : !moe.mx<8x64xf8E4M3FN, axis = 1> -> tensor<8x64xbf16>
  %q2 = moe.quantize %f scale(floor) : tensor<8x64xf32> -> !moe.mx<8x64xf8E5M2, axis = 1>
  %y2 = moe.dequantize %q2 : !moe.mx<8x64xf8E5M2, axis = 1> -> tensor<8x64xf32>
  return %y1, %y2 : tensor<8x64xbf16>, tensor<8x64xf32>
}
func.func @mx_round_trip_cols(%x: tensor<4x96x160xbf16>) -> tensor<4x96x160xf32>
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %q = moe.quantize %x scale(floor) : tensor<4x96x160xbf16> -> !moe.mx<4x96x160xf8E5M2, axis = 1>
  %y = moe.dequantize %q : !moe.mx<4x96x160xf8E5M2, axis = 1> -> tensor<4x96x160xf32>
  return %y : tensor<4x96x160xf32>
}
func.func @mx_round_trip_inner(%x: tensor<3x40x96xf32>) -> tensor<3x40x96xbf16>
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %q = moe.quantize %x : tensor<3x40x96xf32> -> !moe.mx<3x40x96xf8E4M3FN, axis = 2>
  %y = moe.dequantize %q : !moe.mx<3x40x96xf8E4M3FN, axis = 2> -> tensor<3x40x96xbf16>
  return %y : tensor<3x40x96xbf16>
}

// Round trips of both blockings of one x (blocks along K for the forward
// GEMM, along N for the data gradient): one kernel on the GPU, reading x
// once; bit-identical to the generic lowering. Different element types,
// scale rules and result types for the two, then special values (a NaN and
// an infinity: NaN blocks in both blockings; an all-zero row; f32
// subnormals; a value near f32's max).
func.func @mx_round_trip_pair(%x: tensor<3x64x96xf32>) -> (tensor<3x64x96xbf16>, tensor<3x64x96xf32>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %qk = moe.quantize %x : tensor<3x64x96xf32> -> !moe.mx<3x64x96xf8E4M3FN, axis = 1>
  %yk = moe.dequantize %qk : !moe.mx<3x64x96xf8E4M3FN, axis = 1> -> tensor<3x64x96xbf16>
  %qn = moe.quantize %x scale(floor) : tensor<3x64x96xf32> -> !moe.mx<3x64x96xf8E5M2, axis = 2>
  %yn = moe.dequantize %qn : !moe.mx<3x64x96xf8E5M2, axis = 2> -> tensor<3x64x96xf32>
  return %yk, %yn : tensor<3x64x96xbf16>, tensor<3x64x96xf32>
}
func.func @mx_round_trip_pair_specials(%x: tensor<64x64xf32>) -> (tensor<64x64xbf16>, tensor<64x64xbf16>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %c40 = arith.constant 40 : index
  %nan = arith.constant 0x7FC00000 : f32
  %inf = arith.constant 0xFF800000 : f32
  %big = arith.constant 3.0e38 : f32
  %zeros = arith.constant dense<0.0> : tensor<1x64xf32>
  %tiny = arith.constant dense<1.0e-39> : tensor<1x32xf32>
  %a = tensor.insert %nan into %x[%c0, %c3] : tensor<64x64xf32>
  %b = tensor.insert %inf into %a[%c1, %c40] : tensor<64x64xf32>
  %c = tensor.insert_slice %zeros into %b[2, 0] [1, 64] [1, 1] : tensor<1x64xf32> into tensor<64x64xf32>
  %e = tensor.insert %big into %c[%c40, %c5] : tensor<64x64xf32>
  %row = tensor.extract_slice %e[50, 0] [1, 32] [1, 1] : tensor<64x64xf32> to tensor<1x32xf32>
  %sub = arith.mulf %row, %tiny : tensor<1x32xf32>
  %f = tensor.insert_slice %sub into %e[50, 0] [1, 32] [1, 1] : tensor<1x32xf32> into tensor<64x64xf32>
  %qk = moe.quantize %f : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 0>
  %yk = moe.dequantize %qk : !moe.mx<64x64xf8E4M3FN, axis = 0> -> tensor<64x64xbf16>
  %qn = moe.quantize %f : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 1>
  %yn = moe.dequantize %qn : !moe.mx<64x64xf8E4M3FN, axis = 1> -> tensor<64x64xbf16>
  return %yk, %yn : tensor<64x64xbf16>, tensor<64x64xbf16>
}

// SwiGLU and its gradient: exp differs by an ulp or two between libm and
// libdevice, and the GPU may contract a*b+c into one fma: a few f32 ulps.
func.func @swiglu(%h: tensor<512x256xf32>) -> tensor<512x128xf32>
    attributes {moe.test_tolerance = [1.0e-6, 1.0e-5]} {
  %a = moe.swiglu %h : tensor<512x256xf32> -> tensor<512x128xf32>
  return %a : tensor<512x128xf32>
}

func.func @swiglu_grad(%h: tensor<512x256xf32>, %dy: tensor<512x128xf32>)
    -> tensor<512x256xf32> attributes {moe.test_tolerance = [1.0e-6, 1.0e-5]} {
  %g = moe.swiglu_grad %h, %dy layout(interleaved)
      : tensor<512x256xf32>, tensor<512x128xf32> -> tensor<512x256xf32>
  return %g : tensor<512x256xf32>
}

// Router: the indices must match exactly (the ranking of f32 scores does
// not depend on the last ulp of exp: both are monotonic, rows share the
// denominator); weights within a few ulps.
func.func @router(%logits: tensor<1024x64xf32>) -> (tensor<1024x8xi32>, tensor<1024x8xf32>)
    attributes {moe.test_tolerance = [1.0e-7, 1.0e-5]} {
  %i, %w = moe.router %logits top_k(8) softmax norm_topk_prob
      : tensor<1024x64xf32> -> tensor<1024x8xi32>, tensor<1024x8xf32>
  return %i, %w : tensor<1024x8xi32>, tensor<1024x8xf32>
}

// Dispatch moves data and counts: bit-identical.
func.func @dispatch(%x: tensor<1024x64xbf16>,
                    %idx: tensor<1024x4xi32> {moe.test_range = [0, 16]})
    -> (tensor<4576x64xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(16) pad_to(32)
      : tensor<1024x64xbf16>, tensor<1024x4xi32>
      -> tensor<4576x64xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  return %s, %o, %c, %p : tensor<4576x64xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
}

// Quantized tokens dispatched (rows with their scales; zero rows are zero
// bytes): bit-identical, data and scales.
func.func @dispatch_mx(%x: tensor<1024x64xbf16>,
                       %idx: tensor<1024x4xi32> {moe.test_range = [0, 16]})
    -> (tensor<4576x64xf8E4M3FN>, tensor<4576x2xf8E8M0FNU>, tensor<17xi32>) {
  %q = moe.quantize %x : tensor<1024x64xbf16> -> !moe.mx<1024x64xf8E4M3FN, axis = 1>
  %s, %o, %c, %p = moe.dispatch %q, %idx experts(16) pad_to(32)
      : !moe.mx<1024x64xf8E4M3FN, axis = 1>, tensor<1024x4xi32>
      -> !moe.mx<4576x64xf8E4M3FN, axis = 1>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %d, %sc = moe.mx_unpack %s : !moe.mx<4576x64xf8E4M3FN, axis = 1>
      -> tensor<4576x64xf8E4M3FN>, tensor<4576x2xf8E8M0FNU>
  return %d, %sc, %o : tensor<4576x64xf8E4M3FN>, tensor<4576x2xf8E8M0FNU>, tensor<17xi32>
}

// The combine's gradient as autodiff writes it (weights[t, k] * grad[t]
// over [T, K, H]) re-sorted by a dispatch: on the GPU the gather computes
// each product it reads (-moe-gpu-fuse-elementwise), the same single
// multiply as the CPU's: bit-identical.
func.func @weighted_dispatch(%w: tensor<1024x4xf32>, %g: tensor<1024x64xf32>,
                             %idx: tensor<1024x4xi32> {moe.test_range = [0, 16]})
    -> (tensor<4096x64xf32>, tensor<17xi32>) {
  %e = tensor.empty() : tensor<1024x4x64xf32>
  %p = linalg.generic {indexing_maps = [affine_map<(t, k, h) -> (t, k)>, affine_map<(t, k, h) -> (t, h)>,
                                        affine_map<(t, k, h) -> (t, k, h)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w, %g : tensor<1024x4xf32>, tensor<1024x64xf32>) outs(%e : tensor<1024x4x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  } -> tensor<1024x4x64xf32>
  %c = tensor.collapse_shape %p [[0, 1], [2]] : tensor<1024x4x64xf32> into tensor<4096x64xf32>
  %i = tensor.collapse_shape %idx [[0, 1]] : tensor<1024x4xi32> into tensor<4096xi32>
  %i1 = tensor.expand_shape %i [[0, 1]] output_shape [4096, 1] : tensor<4096xi32> into tensor<4096x1xi32>
  %s, %o, %n, %pos = moe.dispatch %c, %i1 experts(16)
      : tensor<4096x64xf32>, tensor<4096x1xi32> -> tensor<4096x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<4096x1xi32>
  return %s, %o : tensor<4096x64xf32>, tensor<17xi32>
}

// Both MX roundings of dispatched rows: on sm_90a one pair kernel reads each
// row from the tokens through the dispatch's source indices (the f32 rows
// are never written; -moe-gpu-fuse-row-gathers). Copies routed outside the
// experts (-1, 16) are dropped, padding rows are zeros: bit-identical.
func.func @dispatch_round_trip_pair(%x: tensor<1024x64xf32>,
                                    %idx: tensor<1024x4xi32> {moe.test_range = [-1, 17]})
    -> (tensor<4576x64xbf16>, tensor<4576x64xbf16>, tensor<17xi32>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(16) pad_to(32)
      : tensor<1024x64xf32>, tensor<1024x4xi32>
      -> tensor<4576x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %qk = moe.quantize %s : tensor<4576x64xf32> -> !moe.mx<4576x64xf8E4M3FN, axis = 0>
  %yk = moe.dequantize %qk : !moe.mx<4576x64xf8E4M3FN, axis = 0> -> tensor<4576x64xbf16>
  %qn = moe.quantize %s : tensor<4576x64xf32> -> !moe.mx<4576x64xf8E4M3FN, axis = 1>
  %yn = moe.dequantize %qn : !moe.mx<4576x64xf8E4M3FN, axis = 1> -> tensor<4576x64xbf16>
  return %yk, %yn, %o : tensor<4576x64xbf16>, tensor<4576x64xbf16>, tensor<17xi32>
}

// The same of the combine's gradient re-sorted (weighted_dispatch above): the
// pair kernel computes each product w[t, k] * g[t] it reads, the same
// single multiply: bit-identical.
func.func @weighted_dispatch_round_trip_pair(%w: tensor<1024x4xf32>, %g: tensor<1024x64xf32>,
                                             %idx: tensor<1024x4xi32> {moe.test_range = [-1, 17]})
    -> (tensor<4096x64xbf16>, tensor<4096x64xbf16>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %e = tensor.empty() : tensor<1024x4x64xf32>
  %p = linalg.generic {indexing_maps = [affine_map<(t, k, h) -> (t, k)>, affine_map<(t, k, h) -> (t, h)>,
                                        affine_map<(t, k, h) -> (t, k, h)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w, %g : tensor<1024x4xf32>, tensor<1024x64xf32>) outs(%e : tensor<1024x4x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  } -> tensor<1024x4x64xf32>
  %c = tensor.collapse_shape %p [[0, 1], [2]] : tensor<1024x4x64xf32> into tensor<4096x64xf32>
  %i = tensor.collapse_shape %idx [[0, 1]] : tensor<1024x4xi32> into tensor<4096xi32>
  %i1 = tensor.expand_shape %i [[0, 1]] output_shape [4096, 1] : tensor<4096xi32> into tensor<4096x1xi32>
  %s, %o, %n, %pos = moe.dispatch %c, %i1 experts(16)
      : tensor<4096x64xf32>, tensor<4096x1xi32> -> tensor<4096x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<4096x1xi32>
  %qk = moe.quantize %s : tensor<4096x64xf32> -> !moe.mx<4096x64xf8E4M3FN, axis = 0>
  %yk = moe.dequantize %qk : !moe.mx<4096x64xf8E4M3FN, axis = 0> -> tensor<4096x64xbf16>
  %qn = moe.quantize %s : tensor<4096x64xf32> -> !moe.mx<4096x64xf8E4M3FN, axis = 1>
  %yn = moe.dequantize %qn : !moe.mx<4096x64xf8E4M3FN, axis = 1> -> tensor<4096x64xbf16>
  return %yk, %yn : tensor<4096x64xbf16>, tensor<4096x64xbf16>
}

// The same two round trips split: a wide value ([rows, 64, 16] f32) lives
// between the first round trip's reader and the second, so pairing them
// would hold the second result through the block's peak; each becomes a
// pair kernel of one result reading the rows from the tokens (_n_only,
// _k_only). 16 equal bf16 terms sum exactly: bit-identical.
func.func @dispatch_round_trip_split(%x: tensor<1024x64xf32>,
                                     %idx: tensor<1024x4xi32> {moe.test_range = [-1, 17]})
    -> (tensor<4576x64xf32>, tensor<4576x64xbf16>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(16) pad_to(32)
      : tensor<1024x64xf32>, tensor<1024x4xi32>
      -> tensor<4576x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %qn = moe.quantize %s : tensor<4576x64xf32> -> !moe.mx<4576x64xf8E4M3FN, axis = 1>
  %yn = moe.dequantize %qn : !moe.mx<4576x64xf8E4M3FN, axis = 1> -> tensor<4576x64xbf16>
  %e = tensor.empty() : tensor<4576x64x16xf32>
  %wide = linalg.generic {indexing_maps = [affine_map<(r, h, j) -> (r, h)>, affine_map<(r, h, j) -> (r, h, j)>],
                          iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%yn : tensor<4576x64xbf16>) outs(%e : tensor<4576x64x16xf32>) {
  ^bb0(%a: bf16, %out: f32):
    %f = arith.extf %a : bf16 to f32
    linalg.yield %f : f32
  } -> tensor<4576x64x16xf32>
  %zero = arith.constant 0.0 : f32
  %e2 = tensor.empty() : tensor<4576x64xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e2 : tensor<4576x64xf32>) -> tensor<4576x64xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(r, h, j) -> (r, h, j)>, affine_map<(r, h, j) -> (r, h)>],
                         iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%wide : tensor<4576x64x16xf32>) outs(%init : tensor<4576x64xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %t = arith.addf %acc, %a : f32
    linalg.yield %t : f32
  } -> tensor<4576x64xf32>
  %qk = moe.quantize %s : tensor<4576x64xf32> -> !moe.mx<4576x64xf8E4M3FN, axis = 0>
  %yk = moe.dequantize %qk : !moe.mx<4576x64xf8E4M3FN, axis = 0> -> tensor<4576x64xbf16>
  return %sum, %yk : tensor<4576x64xf32>, tensor<4576x64xbf16>
}

// And of the combine's gradient re-sorted (each kernel multiplies w[t, k] *
// g[t] itself).
func.func @weighted_dispatch_round_trip_split(%w: tensor<1024x4xf32>, %g: tensor<1024x64xf32>,
                                              %idx: tensor<1024x4xi32> {moe.test_range = [-1, 17]})
    -> (tensor<4096x64xf32>, tensor<4096x64xbf16>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %ep = tensor.empty() : tensor<1024x4x64xf32>
  %pr = linalg.generic {indexing_maps = [affine_map<(t, k, h) -> (t, k)>, affine_map<(t, k, h) -> (t, h)>,
                                         affine_map<(t, k, h) -> (t, k, h)>],
                        iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w, %g : tensor<1024x4xf32>, tensor<1024x64xf32>) outs(%ep : tensor<1024x4x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  } -> tensor<1024x4x64xf32>
  %cr = tensor.collapse_shape %pr [[0, 1], [2]] : tensor<1024x4x64xf32> into tensor<4096x64xf32>
  %i = tensor.collapse_shape %idx [[0, 1]] : tensor<1024x4xi32> into tensor<4096xi32>
  %i1 = tensor.expand_shape %i [[0, 1]] output_shape [4096, 1] : tensor<4096xi32> into tensor<4096x1xi32>
  %s, %o, %n, %pos = moe.dispatch %cr, %i1 experts(16)
      : tensor<4096x64xf32>, tensor<4096x1xi32> -> tensor<4096x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<4096x1xi32>
  %qn = moe.quantize %s : tensor<4096x64xf32> -> !moe.mx<4096x64xf8E4M3FN, axis = 1>
  %yn = moe.dequantize %qn : !moe.mx<4096x64xf8E4M3FN, axis = 1> -> tensor<4096x64xbf16>
  %e = tensor.empty() : tensor<4096x64x16xf32>
  %wide = linalg.generic {indexing_maps = [affine_map<(r, h, j) -> (r, h)>, affine_map<(r, h, j) -> (r, h, j)>],
                          iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%yn : tensor<4096x64xbf16>) outs(%e : tensor<4096x64x16xf32>) {
  ^bb0(%a: bf16, %out: f32):
    %f = arith.extf %a : bf16 to f32
    linalg.yield %f : f32
  } -> tensor<4096x64x16xf32>
  %zero = arith.constant 0.0 : f32
  %e2 = tensor.empty() : tensor<4096x64xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e2 : tensor<4096x64xf32>) -> tensor<4096x64xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(r, h, j) -> (r, h, j)>, affine_map<(r, h, j) -> (r, h)>],
                         iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%wide : tensor<4096x64x16xf32>) outs(%init : tensor<4096x64xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %t = arith.addf %acc, %a : f32
    linalg.yield %t : f32
  } -> tensor<4096x64xf32>
  %qk = moe.quantize %s : tensor<4096x64xf32> -> !moe.mx<4096x64xf8E4M3FN, axis = 0>
  %yk = moe.dequantize %qk : !moe.mx<4096x64xf8E4M3FN, axis = 0> -> tensor<4096x64xbf16>
  return %sum, %yk : tensor<4096x64xf32>, tensor<4096x64xbf16>
}

// Combine: a k-term f32 weighted sum (fma contraction on the GPU).
func.func @combine(%y: tensor<4096x64xf32>, %w: tensor<1024x4xf32>,
                   %pos: tensor<1024x4xi32> {moe.test_range = [-1, 4096]})
    -> tensor<1024x64xf32> attributes {moe.test_tolerance = [1.0e-5, 1.0e-5]} {
  %o = moe.combine %y, %w, %pos : tensor<4096x64xf32>, tensor<1024x4xf32>, tensor<1024x4xi32>
      -> tensor<1024x64xf32>
  return %o : tensor<1024x64xf32>
}

// Grouped GEMMs over a real routing, bf16 and MXFP8 operands. Products of
// bf16 (or dequantized MX) values are exact in f32; sums of K = 256 terms in
// the same order, but the GPU may fuse each multiply-add: the difference is
// bounded by K * ulp(|partial sums|) ~ 256 * 2^-24 * 16 = 2.4e-4 for unit
// normal inputs, hence atol 1e-3 + rtol 1e-4.
func.func @grouped_matmul_bf16(%x: tensor<1024x256xbf16>, %logits: tensor<1024x16xf32>,
                               %w: tensor<16x256x128xbf16>) -> tensor<4576x128xf32>
    attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %y = moe.grouped_matmul %s, %w, %o
      : tensor<4576x256xbf16>, tensor<16x256x128xbf16>, tensor<17xi32> -> tensor<4576x128xf32>
  return %y : tensor<4576x128xf32>
}

func.func @grouped_matmul_mxfp8(%x: tensor<1024x256xbf16>, %logits: tensor<1024x16xf32>,
                                %w: tensor<16x256x128xbf16>) -> tensor<4576x128xf32>
    attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %sq = moe.quantize %s : tensor<4576x256xbf16> -> !moe.mx<4576x256xf8E4M3FN, axis = 1>
  %wq = moe.quantize %w : tensor<16x256x128xbf16> -> !moe.mx<16x256x128xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %sq, %wq, %o
      : !moe.mx<4576x256xf8E4M3FN, axis = 1>, !moe.mx<16x256x128xf8E4M3FN, axis = 1>,
        tensor<17xi32> -> tensor<4576x128xf32>
  return %y : tensor<4576x128xf32>
}

// The data-gradient form: transpose_rhs, weights [E, N, K], which the wgmma
// kernel reads K-major (no transposed copy).
func.func @grouped_matmul_bf16_transpose_rhs(%x: tensor<1024x256xbf16>, %logits: tensor<1024x16xf32>,
                                             %w: tensor<16x128x256xbf16>) -> tensor<4576x128xf32>
    attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %y = moe.grouped_matmul %s, %w, %o transpose_rhs
      : tensor<4576x256xbf16>, tensor<16x128x256xbf16>, tensor<17xi32> -> tensor<4576x128xf32>
  return %y : tensor<4576x128xf32>
}

// The TMA kernel (N a multiple of 256): uneven fixed groups: expert 0 empty,
// 1 of 130 rows (a tile and 2 rows), 2 of one row, 3 of 389, 4 of 130, and
// rows 650..699 past the last group (zeros). K = 512: 8 stages, twice round
// the 4-buffer ring. Sums of 512 unit-normal products (~23 in magnitude):
// the order bound 512 * 2^-24 * 32 ~ 1e-3, hence atol 2e-3.
func.func @grouped_matmul_tma_uneven(%x: tensor<700x512xbf16>, %w: tensor<5x512x256xbf16>)
    -> tensor<700x256xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<700x512xbf16>, tensor<5x512x256xbf16>, tensor<6xi32> -> tensor<700x256xf32>
  return %y : tensor<700x256xf32>
}

// The same groups with the weights [E, N, K] (the data gradient's form, read
// K-major by one 256-row box).
func.func @grouped_matmul_tma_uneven_transpose_rhs(%x: tensor<700x512xbf16>,
                                                   %w: tensor<5x256x512xbf16>)
    -> tensor<700x256xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %y = moe.grouped_matmul %x, %w, %o transpose_rhs
      : tensor<700x512xbf16>, tensor<5x256x512xbf16>, tensor<6xi32> -> tensor<700x256xf32>
  return %y : tensor<700x256xf32>
}

// N = 384, a multiple of 128 but not of 256 (an LM head's vocabulary, such
// as Qwen3's 151936): the TMA kernel's last column tile reads zeros past N
// and stores its first half only, in the copy engine's boxes and in the
// direct stores of the row tiles that cross a group's end.
func.func @grouped_matmul_tma_half_tile(%x: tensor<700x512xbf16>, %w: tensor<5x512x384xbf16>)
    -> tensor<700x384xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<700x512xbf16>, tensor<5x512x384xbf16>, tensor<6xi32> -> tensor<700x384xf32>
  return %y : tensor<700x384xf32>
}

// The same with the weights [E, N, K]: the last tile's box reads the next
// expert's rows (or zeros past the last) for columns it does not store.
func.func @grouped_matmul_tma_half_tile_transpose_rhs(%x: tensor<700x512xbf16>,
                                                      %w: tensor<5x384x512xbf16>)
    -> tensor<700x384xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %y = moe.grouped_matmul %x, %w, %o transpose_rhs
      : tensor<700x512xbf16>, tensor<5x384x512xbf16>, tensor<6xi32> -> tensor<700x384xf32>
  return %y : tensor<700x384xf32>
}

// The TMA kernel reading an MX lhs 8-bit (elements and scales, as the
// SwiGLU epilogue writes them for the second GEMM): the converter warps
// dequantize each stage in shared memory. The same uneven groups (the last
// row tile runs 60 rows past R, which the copy fills with zeros) over K =
// 512 (16 scales a row, two a stage). Element codes 0..95 (E4M3 up to 30,
// no NaN) and scales 2^-11..2^-4, random per block: products exact on both,
// sums of 512 terms (~1 in magnitude) in another order: atol 2e-3.
func.func @grouped_matmul_tma_mx_lhs(%d: tensor<700x512xf8E4M3FN> {moe.test_range = [0, 96]},
                                     %s: tensor<700x16xf8E8M0FNU> {moe.test_range = [116, 124]},
                                     %w: tensor<5x512x256xbf16>)
    -> tensor<700x256xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %q = moe.mx_pack %d, %s : tensor<700x512xf8E4M3FN>, tensor<700x16xf8E8M0FNU>
      -> !moe.mx<700x512xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %q, %w, %o
      : !moe.mx<700x512xf8E4M3FN, axis = 1>, tensor<5x512x256xbf16>, tensor<6xi32> -> tensor<700x256xf32>
  return %y : tensor<700x256xf32>
}

// The same with E5M2 elements (codes 0..111: up to 2^13, no infinity or NaN;
// scales 2^-19..2^-12) and the weights [E, N, K] (a data gradient's form).
func.func @grouped_matmul_tma_mx_lhs_e5m2_transpose_rhs(
    %d: tensor<700x512xf8E5M2> {moe.test_range = [0, 112]},
    %s: tensor<700x16xf8E8M0FNU> {moe.test_range = [108, 116]},
    %w: tensor<5x256x512xbf16>)
    -> tensor<700x256xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %q = moe.mx_pack %d, %s : tensor<700x512xf8E5M2>, tensor<700x16xf8E8M0FNU>
      -> !moe.mx<700x512xf8E5M2, axis = 1>
  %y = moe.grouped_matmul %q, %w, %o transpose_rhs
      : !moe.mx<700x512xf8E5M2, axis = 1>, tensor<5x256x512xbf16>, tensor<6xi32> -> tensor<700x256xf32>
  return %y : tensor<700x256xf32>
}

// More tiles than the persistent grid's 132 CTAs ((36 + 16) x 4 at most):
// each CTA runs several tiles, its ring's phases running on across them.
func.func @grouped_matmul_tma_persistent(%x: tensor<1024x256xbf16>, %logits: tensor<1024x16xf32>,
                                         %w: tensor<16x256x1024xbf16>) -> tensor<4576x1024xf32>
    attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %y = moe.grouped_matmul %s, %w, %o
      : tensor<4576x256xbf16>, tensor<16x256x1024xbf16>, tensor<17xi32> -> tensor<4576x1024xf32>
  return %y : tensor<4576x1024xf32>
}

// Weight gradient over the same routing (sums over each group's rows; the
// wgmma weight-gradient kernel on sm_90a).
func.func @grouped_matmul_wgrad(%x: tensor<1024x256xbf16>, %logits: tensor<1024x16xf32>,
                                %dy: tensor<4576x128xbf16>) -> tensor<16x256x128xf32>
    attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %dw = moe.grouped_matmul_wgrad %s, %dy, %o
      : tensor<4576x256xbf16>, tensor<4576x128xbf16>, tensor<17xi32> -> tensor<16x256x128xf32>
  return %dw : tensor<16x256x128xf32>
}

// The TMA weight-gradient kernel (N a multiple of 256) over the uneven fixed
// groups of grouped_matmul_tma_uneven: an empty expert (zeros), groups that
// end inside a stage of 64 rows (the copy brings in the next group's rows,
// or rows past the last group, which the kernel zeros in shared memory),
// a one-row group. Sums of up to 389 unit-normal products: atol 2e-3.
func.func @grouped_matmul_wgrad_tma_uneven(%x: tensor<700x256xbf16>, %dy: tensor<700x512xbf16>)
    -> tensor<5x256x512xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %o
      : tensor<700x256xbf16>, tensor<700x512xbf16>, tensor<6xi32> -> tensor<5x256x512xf32>
  return %dw : tensor<5x256x512xf32>
}

// The TMA weight gradient with N = 384 (the LM head's, vocabulary not a
// multiple of 256): the last column tile half used.
func.func @grouped_matmul_wgrad_tma_half_tile(%x: tensor<700x256xbf16>, %dy: tensor<700x384xbf16>)
    -> tensor<5x256x384xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %o
      : tensor<700x256xbf16>, tensor<700x384xbf16>, tensor<6xi32> -> tensor<5x256x384xf32>
  return %dw : tensor<5x256x384xf32>
}

// The TMA weight gradient rounded to bf16 by its only user (a bf16
// parameter's gradient): the kernel stores bf16 boxes itself, no f32 array
// and no rounding pass. Both round the f32 sum once: results within one
// bf16 ulp (the sums' f32 orders differ): rtol 8e-3, atol as above.
func.func @grouped_matmul_wgrad_tma_bf16_out(%x: tensor<700x256xbf16>, %dy: tensor<700x512xbf16>)
    -> tensor<5x256x512xbf16> attributes {moe.test_tolerance = [2.0e-3, 8.0e-3]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %o
      : tensor<700x256xbf16>, tensor<700x512xbf16>, tensor<6xi32> -> tensor<5x256x512xf32>
  %e = tensor.empty() : tensor<5x256x512xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(a, b, c) -> (a, b, c)>, affine_map<(a, b, c) -> (a, b, c)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%dw : tensor<5x256x512xf32>) outs(%e : tensor<5x256x512xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<5x256x512xbf16>
  return %r : tensor<5x256x512xbf16>
}

// The same with N = 384: the last tile's second half of bf16 boxes is past N.
func.func @grouped_matmul_wgrad_tma_bf16_out_half_tile(%x: tensor<700x256xbf16>, %dy: tensor<700x384xbf16>)
    -> tensor<5x256x384xbf16> attributes {moe.test_tolerance = [2.0e-3, 8.0e-3]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %o
      : tensor<700x256xbf16>, tensor<700x384xbf16>, tensor<6xi32> -> tensor<5x256x384xf32>
  %e = tensor.empty() : tensor<5x256x384xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(a, b, c) -> (a, b, c)>, affine_map<(a, b, c) -> (a, b, c)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%dw : tensor<5x256x384xf32>) outs(%e : tensor<5x256x384xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<5x256x384xbf16>
  return %r : tensor<5x256x384xbf16>
}

// The same on the wgmma weight-gradient kernel with MXFP8 operands blocked
// along the rows (as the backward recipe quantizes them; dequantized to
// bf16 exactly): E4M3 activations, E5M2 gradients, and experts 12-15
// routed no rows (their gradients are zero). Tolerance as above: exact
// products, f32 sums of each group's rows in another order.
func.func @grouped_matmul_wgrad_mxfp8(%x: tensor<1024x256xbf16>,
                                      %idx: tensor<1024x4xi32> {moe.test_range = [0, 12]},
                                      %dy: tensor<4576x128xbf16>) -> tensor<16x256x128xf32>
    attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %sq = moe.quantize %s : tensor<4576x256xbf16> -> !moe.mx<4576x256xf8E4M3FN, axis = 0>
  %dq = moe.quantize %dy : tensor<4576x128xbf16> -> !moe.mx<4576x128xf8E5M2, axis = 0>
  %dw = moe.grouped_matmul_wgrad %sq, %dq, %o
      : !moe.mx<4576x256xf8E4M3FN, axis = 0>, !moe.mx<4576x128xf8E5M2, axis = 0>, tensor<17xi32>
      -> tensor<16x256x128xf32>
  return %dw : tensor<16x256x128xf32>
}

// The fused expert MLP with MXFP8 weights, and a whole layer.
func.func @moe_layer_mxfp8(%x: tensor<1024x256xbf16>, %logits: tensor<1024x16xf32>,
                           %w1: tensor<16x256x256xbf16>, %w2: tensor<16x128x256xbf16>)
    -> tensor<1024x256xf32> attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %i, %wt = moe.router %logits top_k(4) softmax norm_topk_prob
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %sq = moe.quantize %s : tensor<4576x256xbf16> -> !moe.mx<4576x256xf8E4M3FN, axis = 1>
  %w1q = moe.quantize %w1 : tensor<16x256x256xbf16> -> !moe.mx<16x256x256xf8E4M3FN, axis = 1>
  %w2q = moe.quantize %w2 : tensor<16x128x256xbf16> -> !moe.mx<16x128x256xf8E4M3FN, axis = 1>
  %y = moe.grouped_mlp %sq, %w1q, %w2q, %o
      : !moe.mx<4576x256xf8E4M3FN, axis = 1>, !moe.mx<16x256x256xf8E4M3FN, axis = 1>,
        !moe.mx<16x128x256xf8E4M3FN, axis = 1>, tensor<17xi32> -> tensor<4576x256xf32>
  %out = moe.combine %y, %wt, %p
      : tensor<4576x256xf32>, tensor<1024x4xf32>, tensor<1024x4xi32> -> tensor<1024x256xf32>
  return %out : tensor<1024x256xf32>
}

// The fused expert MLP's backward (recomputes h and the activation; MXFP8
// operands along each GEMM's contraction axis): the recomputed activation
// is quantized, so a 1-ulp difference in exp on the GPU can flip an
// element's E4M3 rounding, moving one term of a weight-gradient sum by an
// E4M3 quantum (2^-3 of the element). Such flips are rare and isolated:
// the check is the relative Frobenius error of each result, bounded by
// 1e-3 (a flip in one of 4576 rows moves ||dw|| by far less).
func.func @grouped_mlp_backward(%x: tensor<1024x256xbf16>, %logits: tensor<1024x16xf32>,
                                %w1: tensor<16x256x256xbf16>, %w2: tensor<16x128x256xbf16>,
                                %dy: tensor<4576x256xf32>)
    -> (tensor<4576x256xf32>, tensor<16x256x256xf32>, tensor<16x128x256xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 2.0e-2, 1.0e-3]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %s, %w1, %w2, %o, %dy gemm_type(f8E4M3FN)
      : tensor<4576x256xbf16>, tensor<16x256x256xbf16>, tensor<16x128x256xbf16>, tensor<17xi32>,
        tensor<4576x256xf32> -> tensor<4576x256xf32>, tensor<16x256x256xf32>, tensor<16x128x256xf32>
  return %dx, %dw1, %dw2 : tensor<4576x256xf32>, tensor<16x256x256xf32>, tensor<16x128x256xf32>
}

// A train step's expert MLP: the forward and its backward in one function.
// The backward's recomputed h and activation are the forward's (CSE), so
// the first GEMM's SwiGLU epilogue returns h and the f32 activation besides
// the second GEMM's operand (the kernel moe_wgmma_gmm_..._swiglu_e4m3_rceil_h_a);
// F = 256, two tiles of outputs. Tolerances as for the backward above.
func.func @grouped_mlp_train(%x: tensor<1024x256xbf16>, %logits: tensor<1024x16xf32>,
                             %w1: tensor<16x256x512xbf16>, %w2: tensor<16x256x256xbf16>,
                             %dy: tensor<4576x256xf32>)
    -> (tensor<4576x256xf32>, tensor<4576x256xf32>, tensor<16x256x512xf32>, tensor<16x256x256xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 2.0e-2, 1.0e-3]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x256xbf16>, tensor<1024x4xi32>
      -> tensor<4576x256xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %sq = moe.quantize %s : tensor<4576x256xbf16> -> !moe.mx<4576x256xf8E4M3FN, axis = 1>
  %w1q = moe.quantize %w1 : tensor<16x256x512xbf16> -> !moe.mx<16x256x512xf8E4M3FN, axis = 1>
  %w2q = moe.quantize %w2 : tensor<16x256x256xbf16> -> !moe.mx<16x256x256xf8E4M3FN, axis = 1>
  %y = moe.grouped_mlp %sq, %w1q, %w2q, %o
      : !moe.mx<4576x256xf8E4M3FN, axis = 1>, !moe.mx<16x256x512xf8E4M3FN, axis = 1>,
        !moe.mx<16x256x256xf8E4M3FN, axis = 1>, tensor<17xi32> -> tensor<4576x256xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %s, %w1, %w2, %o, %dy gemm_type(f8E4M3FN)
      : tensor<4576x256xbf16>, tensor<16x256x512xbf16>, tensor<16x256x256xbf16>, tensor<17xi32>,
        tensor<4576x256xf32> -> tensor<4576x256xf32>, tensor<16x256x512xf32>, tensor<16x256x256xf32>
  return %y, %dx, %dw1, %dw2
      : tensor<4576x256xf32>, tensor<4576x256xf32>, tensor<16x256x512xf32>, tensor<16x256x256xf32>
}

// The f32 matmul kernel at sizes that are no multiple of its 64 x 64 x 16
// tiles, accumulating into a given C (C + A @ B): each output is summed over
// K = 200 in order, with FMAs; |terms| ~ 1, sums ~ 14: atol 1e-4.
func.func @matmul_f32_ragged(%a: tensor<300x200xf32>, %b: tensor<200x130xf32>,
                             %c: tensor<300x130xf32>) -> tensor<300x130xf32>
    attributes {moe.test_tolerance = [1.0e-4, 1.0e-5]} {
  %y = linalg.matmul ins(%a, %b : tensor<300x200xf32>, tensor<200x130xf32>)
                     outs(%c : tensor<300x130xf32>) -> tensor<300x130xf32>
  return %y : tensor<300x130xf32>
}

// Tiles inside A and B take 16-byte loads, the others (M = 200 and N = 96
// end inside a tile, the last K step holds 8 of 16) checked scalar ones:
// both in one matmul; sums of 72 terms in order, atol 1e-4.
func.func @matmul_f32_edges(%a: tensor<200x72xf32>, %b: tensor<72x96xf32>,
                            %c: tensor<200x96xf32>) -> tensor<200x96xf32>
    attributes {moe.test_tolerance = [1.0e-4, 1.0e-5]} {
  %y = linalg.matmul ins(%a, %b : tensor<200x72xf32>, tensor<72x96xf32>)
                     outs(%c : tensor<200x96xf32>) -> tensor<200x96xf32>
  return %y : tensor<200x96xf32>
}

// Few output tiles over a long K (a weight gradient summed over tokens): K
// is split in 4 (65, 65, 65 and 62 steps of 16), the partial sums added in
// split order; sums of 4100 terms of |~1| in a different order than the
// CPU's single chain: atol 1e-3.
func.func @matmul_f32_split_k(%a: tensor<128x4100xf32>, %b: tensor<4100x96xf32>,
                              %c: tensor<128x96xf32>) -> tensor<128x96xf32>
    attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %y = linalg.matmul ins(%a, %b : tensor<128x4100xf32>, tensor<4100x96xf32>)
                     outs(%c : tensor<128x96xf32>) -> tensor<128x96xf32>
  return %y : tensor<128x96xf32>
}

// Dense layers around the experts: a matmul (shared expert, router
// projection) and a row softmax from upstream ops; f32 sums of 256 terms in
// the same order, fma contraction allowed on the GPU.
func.func @dense_matmul_softmax(%x: tensor<512x256xf32>, %w: tensor<256x64xf32>)
    -> tensor<512x64xf32> attributes {moe.test_tolerance = [1.0e-5, 1.0e-4]} {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<512x64xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<512x64xf32>) -> tensor<512x64xf32>
  %y = linalg.matmul ins(%x, %w : tensor<512x256xf32>, tensor<256x64xf32>)
                     outs(%z : tensor<512x64xf32>) -> tensor<512x64xf32>
  %s = linalg.softmax dimension(1) ins(%y : tensor<512x64xf32>) outs(%e : tensor<512x64xf32>) -> tensor<512x64xf32>
  return %s : tensor<512x64xf32>
}

// An expert body as frontends write it (grouped by -moe-group-experts in
// the GPU pipeline), and an all_to_all within one rank (a copy).
func.func @experts_region(%x: tensor<1024x64xf32>, %logits: tensor<1024x16xf32>,
                          %w: tensor<16x64x64xf32>) -> tensor<4576x64xf32>
    attributes {moe.test_tolerance = [1.0e-4, 1.0e-4]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x64xf32>, tensor<1024x4xi32>
      -> tensor<4576x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %y = moe.experts %s, %o weights(%w : tensor<16x64x64xf32>)
      : tensor<4576x64xf32>, tensor<17xi32> -> tensor<4576x64xf32> {
  ^bb0(%rows: tensor<?x64xf32>, %we: tensor<64x64xf32>):
    %c0 = arith.constant 0 : index
    %n = tensor.dim %rows, %c0 : tensor<?x64xf32>
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty(%n) : tensor<?x64xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x64xf32>) -> tensor<?x64xf32>
    %h = linalg.matmul ins(%rows, %we : tensor<?x64xf32>, tensor<64x64xf32>)
                       outs(%z : tensor<?x64xf32>) -> tensor<?x64xf32>
    moe.yield %h : tensor<?x64xf32>
  }
  return %y : tensor<4576x64xf32>
}

shard.grid @single(shape = 1)
func.func @all_to_all_one_rank(%x: tensor<512x64xbf16>, %n: tensor<4xi32> {moe.test_range = [0, 128]})
    -> (tensor<640x64xbf16>, tensor<4xi32>) {
  %r, %rc = moe.all_to_all %x, %n on @single
      : tensor<512x64xbf16>, tensor<4xi32> -> tensor<640x64xbf16>, tensor<4xi32>
  return %r, %rc : tensor<640x64xbf16>, tensor<4xi32>
}
