// RUN: moe-opt %s --moe-cpu-pipeline | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s
//
// MXFP8 quantize and dequantize, bit-exact, on hand-computed blocks (one block
// of 32 per row). The expected bytes were derived by hand from the rules in
// moe.quantize's description (derivations inline) and cross-checked with
// ml_dtypes' float8_e4m3fn / float8_e5m2 casts. Random blocks of every kind are
// compared with an independent reference in mx_reference.py.
//
// A scaled dimension that is not a multiple of 32 is rejected by the type's
// verifier (see test/Dialect/MoE/invalid.mlir): pad it (moe.dispatch pad_to).

#id = affine_map<(d0, d1) -> (d0, d1)>
func.func private @printMemrefI32(tensor<*xi32>)
func.func private @printMemrefF32(tensor<*xf32>)

func.func @bytes(%t: tensor<?x?xf8E4M3FN>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?xf8E4M3FN>
  %d1 = tensor.dim %t, %c1 : tensor<?x?xf8E4M3FN>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xi32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<?x?xf8E4M3FN>) outs(%e : tensor<?x?xi32>) {
  ^bb0(%a: f8E4M3FN, %o: i32):
    %b = arith.bitcast %a : f8E4M3FN to i8
    %x = arith.extui %b : i8 to i32
    linalg.yield %x : i32
  } -> tensor<?x?xi32>
  %u = tensor.cast %r : tensor<?x?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}

func.func @bytes_e5m2(%t: tensor<?x?xf8E5M2>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?xf8E5M2>
  %d1 = tensor.dim %t, %c1 : tensor<?x?xf8E5M2>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xi32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<?x?xf8E5M2>) outs(%e : tensor<?x?xi32>) {
  ^bb0(%a: f8E5M2, %o: i32):
    %b = arith.bitcast %a : f8E5M2 to i8
    %x = arith.extui %b : i8 to i32
    linalg.yield %x : i32
  } -> tensor<?x?xi32>
  %u = tensor.cast %r : tensor<?x?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}

func.func @scale_bytes(%t: tensor<?x?xf8E8M0FNU>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?xf8E8M0FNU>
  %d1 = tensor.dim %t, %c1 : tensor<?x?xf8E8M0FNU>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xi32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<?x?xf8E8M0FNU>) outs(%e : tensor<?x?xi32>) {
  ^bb0(%a: f8E8M0FNU, %o: i32):
    %b = arith.bitcast %a : f8E8M0FNU to i8
    %x = arith.extui %b : i8 to i32
    linalg.yield %x : i32
  } -> tensor<?x?xi32>
  %u = tensor.cast %r : tensor<?x?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}

func.func @main() {
  // Rows (one block each):
  //  0 all zeros
  //  1 1.0, NaN, 2.0
  //  2 1.0, +Inf, -Inf
  //  3 448, 500, -448, 0.5           (amax beyond 448)
  //  4 448, 2^-8, 2^-10, 3*2^-10, 0.875*2^-6, -2^-8   (subnormal results)
  //  5 1.8                            (rceil and floor differ)
  //  6 480                            (floor saturates)
  %x = arith.constant dense<[[0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000],
      [0x3F800000, 0x7FC00000, 0x40000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000],
      [0x3F800000, 0x7F800000, 0xFF800000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000],
      [0x43E00000, 0x43FA0000, 0xC3E00000, 0x3F000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000],
      [0x43E00000, 0x3B800000, 0x3A800000, 0x3B400000, 0x3C600000, 0xBB800000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000],
      [0x3FE66666, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000],
      [0x43F00000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000]]> : tensor<7x32xf32>

  // ---- E4M3, rowwise, rceil: e = ceil(log2(amax / 448)) ----
  %q = moe.quantize %x : tensor<7x32xf32> -> !moe.mx<7x32xf8E4M3FN, axis = 1>
  %d, %s = moe.mx_unpack %q : !moe.mx<7x32xf8E4M3FN, axis = 1>
      -> tensor<7x32xf8E4M3FN>, tensor<7x1xf8E8M0FNU>
  %dd = tensor.cast %d : tensor<7x32xf8E4M3FN> to tensor<?x?xf8E4M3FN>
  %ss = tensor.cast %s : tensor<7x1xf8E8M0FNU> to tensor<?x?xf8E8M0FNU>
  call @bytes(%dd) : (tensor<?x?xf8E4M3FN>) -> ()
  // row 0: zeros.
  // CHECK:      [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // row 1: NaN block: elements converted with e = 0: 1.0 = 0.0111.000 = 56,
  //        NaN = 0x7F = 127, 2.0 = 0.1000.000 = 64.
  // CHECK-NEXT: [56, 127, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // row 2: Inf block: e = 0; +Inf saturates to 448 = 0x7E = 126, -Inf to 0xFE.
  // CHECK-NEXT: [56, 126, 254, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // row 3: amax 500: 500/448 in (1, 2) so e = 1; 448/2 = 224 = 0.1110.110 = 118,
  //        500/2 = 250 rounds to 256 = 0.1111.000 = 120 (240 is 10 away, 256 is 6),
  //        -224 = 246, 0.25 = 0.0101.000 = 40.
  // CHECK-NEXT: [118, 120, 246, 40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // row 4: amax 448: e = 0. 2^-8 = 2 * 2^-9 (subnormal) = 2; 2^-10 is half the
  //        smallest subnormal: tie, to even 0; 3*2^-10 = 1.5 * 2^-9: tie, to
  //        even 2; 0.875*2^-6 = 7 * 2^-9 = 7; -2^-8 = 0x82 = 130.
  // CHECK-NEXT: [126, 2, 0, 2, 7, 130, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // row 5: amax 1.8: log2(1.8/448) = -7.96, e = -7; 1.8*128 = 230.4 -> 224 = 118.
  // CHECK-NEXT: [118, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // row 6: amax 480: e = 1; 240 = 0.1110.111 = 119.
  // CHECK-NEXT: [119, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  call @scale_bytes(%ss) : (tensor<?x?xf8E8M0FNU>) -> ()
  // Scale bytes are e + 127: zero block 0 (2^-127), NaN/Inf blocks 255.
  // CHECK:      [0],
  // CHECK-NEXT: [255],
  // CHECK-NEXT: [255],
  // CHECK-NEXT: [128],
  // CHECK-NEXT: [127],
  // CHECK-NEXT: [120],
  // CHECK-NEXT: [128]]

  %y = moe.dequantize %q : !moe.mx<7x32xf8E4M3FN, axis = 1> -> tensor<7x32xf32>
  %y3 = tensor.extract_slice %y[3, 0] [2, 6] [1, 1] : tensor<7x32xf32> to tensor<2x6xf32>
  %yu = tensor.cast %y3 : tensor<2x6xf32> to tensor<*xf32>
  call @printMemrefF32(%yu) : (tensor<*xf32>) -> ()
  // Dequantize: q * 2^e.
  // CHECK:      [448, 512, -448, 0.5, 0, 0],
  // CHECK-NEXT: [448, 0.00390625, 0, 0.00390625, 0.0136719, -0.00390625]]
  %y1 = tensor.extract_slice %y[1, 0] [1, 3] [1, 1] : tensor<7x32xf32> to tensor<1x3xf32>
  %y1u = tensor.cast %y1 : tensor<1x3xf32> to tensor<*xf32>
  call @printMemrefF32(%y1u) : (tensor<*xf32>) -> ()
  // A NaN scale makes the whole block NaN.
  // CHECK: [nan, nan, nan]

  // ---- E4M3, rowwise, floor: e = floor(log2(amax)) - 8 ----
  %qf = moe.quantize %x scale(floor) : tensor<7x32xf32> -> !moe.mx<7x32xf8E4M3FN, axis = 1>
  %df, %sf = moe.mx_unpack %qf : !moe.mx<7x32xf8E4M3FN, axis = 1>
      -> tensor<7x32xf8E4M3FN>, tensor<7x1xf8E8M0FNU>
  %ddf = tensor.cast %df : tensor<7x32xf8E4M3FN> to tensor<?x?xf8E4M3FN>
  %ssf = tensor.cast %sf : tensor<7x1xf8E8M0FNU> to tensor<?x?xf8E8M0FNU>
  call @bytes(%ddf) : (tensor<?x?xf8E4M3FN>) -> ()
  // CHECK:      [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // CHECK-NEXT: [56, 127, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // CHECK-NEXT: [56, 126, 254, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // row 3: floor(log2 500) = 8, e = 0: 500 saturates to 448; 0.5 = 0.0110.000 = 48.
  // CHECK-NEXT: [126, 126, 254, 48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // CHECK-NEXT: [126, 2, 0, 2, 7, 130, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // row 5: e = 0 - 8: 1.8 * 256 = 460.8 saturates to 448.
  // CHECK-NEXT: [126, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  // row 6: e = 8 - 8 = 0: 480 saturates to 448.
  // CHECK-NEXT: [126, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  call @scale_bytes(%ssf) : (tensor<?x?xf8E8M0FNU>) -> ()
  // CHECK:      [0],
  // CHECK-NEXT: [255],
  // CHECK-NEXT: [255],
  // CHECK-NEXT: [127],
  // CHECK-NEXT: [127],
  // CHECK-NEXT: [119],
  // CHECK-NEXT: [127]]

  // ---- E5M2 (max 57344 = 1.75 * 2^15), rowwise, rceil ----
  %x5 = arith.constant dense<[[1.0, 0.33333334, 57344.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]> : tensor<1x32xf32>
  %q5 = moe.quantize %x5 : tensor<1x32xf32> -> !moe.mx<1x32xf8E5M2, axis = 1>
  %d5, %s5 = moe.mx_unpack %q5 : !moe.mx<1x32xf8E5M2, axis = 1>
      -> tensor<1x32xf8E5M2>, tensor<1x1xf8E8M0FNU>
  %dd5 = tensor.cast %d5 : tensor<1x32xf8E5M2> to tensor<?x?xf8E5M2>
  %ss5 = tensor.cast %s5 : tensor<1x1xf8E8M0FNU> to tensor<?x?xf8E8M0FNU>
  call @bytes_e5m2(%dd5) : (tensor<?x?xf8E5M2>) -> ()
  // amax = max: e = 0. 1.0 = 0.01111.00 = 60; 1/3 = 1.333 * 2^-2 -> 1.25 * 2^-2
  // = 0.01101.01 = 53; 57344 = 0.11110.11 = 123.
  // CHECK: [60, 53, 123, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
  call @scale_bytes(%ss5) : (tensor<?x?xf8E8M0FNU>) -> ()
  // CHECK: {{\[\[}}127]]
  %y5 = moe.dequantize %q5 : !moe.mx<1x32xf8E5M2, axis = 1> -> tensor<1x32xf32>
  %y5s = tensor.extract_slice %y5[0, 0] [1, 3] [1, 1] : tensor<1x32xf32> to tensor<1x3xf32>
  %y5u = tensor.cast %y5s : tensor<1x3xf32> to tensor<*xf32>
  call @printMemrefF32(%y5u) : (tensor<*xf32>) -> ()
  // CHECK: [1, 0.3125, 57344]

  // ---- columnwise: blocks of 32 rows (axis = 0) ----
  // Column 0 is all 1.0: e = -8, elements 256 = 0.1111.000 = 120.
  // Column 1 is 0..31: amax 31, log2(31/448) = -3.85, e = -3: elements 8x;
  // 17*8 = 136 and 31*8 = 248 are ties that go to the even neighbour
  // (128 = 112, 256 = 120).
  %xc = arith.constant dense<[[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 3.0], [1.0, 4.0], [1.0, 5.0], [1.0, 6.0], [1.0, 7.0], [1.0, 8.0], [1.0, 9.0], [1.0, 10.0], [1.0, 11.0], [1.0, 12.0], [1.0, 13.0], [1.0, 14.0], [1.0, 15.0], [1.0, 16.0], [1.0, 17.0], [1.0, 18.0], [1.0, 19.0], [1.0, 20.0], [1.0, 21.0], [1.0, 22.0], [1.0, 23.0], [1.0, 24.0], [1.0, 25.0], [1.0, 26.0], [1.0, 27.0], [1.0, 28.0], [1.0, 29.0], [1.0, 30.0], [1.0, 31.0]]> : tensor<32x2xf32>
  %qc = moe.quantize %xc : tensor<32x2xf32> -> !moe.mx<32x2xf8E4M3FN, axis = 0>
  %dc, %sc = moe.mx_unpack %qc : !moe.mx<32x2xf8E4M3FN, axis = 0>
      -> tensor<32x2xf8E4M3FN>, tensor<1x2xf8E8M0FNU>
  %ddc = tensor.cast %dc : tensor<32x2xf8E4M3FN> to tensor<?x?xf8E4M3FN>
  %ssc = tensor.cast %sc : tensor<1x2xf8E8M0FNU> to tensor<?x?xf8E8M0FNU>
  call @bytes(%ddc) : (tensor<?x?xf8E4M3FN>) -> ()
  // CHECK:      {{\[\[}}120, 0]
  // CHECK-NEXT: [120, 80]
  // CHECK-NEXT: [120, 88]
  // CHECK-NEXT: [120, 92]
  // CHECK-NEXT: [120, 96]
  // CHECK-NEXT: [120, 98]
  // CHECK-NEXT: [120, 100]
  // CHECK-NEXT: [120, 102]
  // CHECK-NEXT: [120, 104]
  // CHECK-NEXT: [120, 105]
  // CHECK-NEXT: [120, 106]
  // CHECK-NEXT: [120, 107]
  // CHECK-NEXT: [120, 108]
  // CHECK-NEXT: [120, 109]
  // CHECK-NEXT: [120, 110]
  // CHECK-NEXT: [120, 111]
  // CHECK-NEXT: [120, 112]
  // CHECK-NEXT: [120, 112]
  // CHECK-NEXT: [120, 113]
  // CHECK-NEXT: [120, 114]
  // CHECK-NEXT: [120, 114]
  // CHECK-NEXT: [120, 114]
  // CHECK-NEXT: [120, 115]
  // CHECK-NEXT: [120, 116]
  // CHECK-NEXT: [120, 116]
  // CHECK-NEXT: [120, 116]
  // CHECK-NEXT: [120, 117]
  // CHECK-NEXT: [120, 118]
  // CHECK-NEXT: [120, 118]
  // CHECK-NEXT: [120, 118]
  // CHECK-NEXT: [120, 119]
  // CHECK-NEXT: [120, 120]
  call @scale_bytes(%ssc) : (tensor<?x?xf8E8M0FNU>) -> ()
  // CHECK: {{\[\[}}119, 124]]

  // bf16 input (exact in f32): 1.5 -> e = -8, 384 = 0.1111.100 = 124.
  %xb = arith.constant dense<1.5> : tensor<1x32xbf16>
  %qb = moe.quantize %xb : tensor<1x32xbf16> -> !moe.mx<1x32xf8E4M3FN, axis = 1>
  %db, %sb = moe.mx_unpack %qb : !moe.mx<1x32xf8E4M3FN, axis = 1>
      -> tensor<1x32xf8E4M3FN>, tensor<1x1xf8E8M0FNU>
  %ddb = tensor.cast %db : tensor<1x32xf8E4M3FN> to tensor<?x?xf8E4M3FN>
  call @bytes(%ddb) : (tensor<?x?xf8E4M3FN>) -> ()
  // CHECK: {{\[\[}}124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124, 124]]
  return
}
