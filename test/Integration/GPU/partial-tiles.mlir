// GEMMs whose K and N are not multiples of the kernels' tiles (the dims of
// models nobody tuned for), on the GPU against the CPU reference (see
// kernels.mlir for how scripts/gpu-check.sh runs this file). Every one of
// them takes the TMA kernel: a partial last K stage reads zeros past K (a
// 3-D tensor map per expert for the rhs [E, K, N], so that it does not read
// the next expert's rows), a partial last column tile stores nothing past
// N, and K or N not a multiple of 8 is padded with zeros. On machines
// without a GPU, lit checks that the kernels compile and ptxas accepts them,
// and that none of these GEMMs is left to the generic kernels:
// RUN: moe-compile %s --target=sm_90a --verify-ptx --kernel-report -o %t.so 2>&1 | FileCheck %s
// CHECK-NOT: generic kernels
// CHECK: kernels for sm_90a: {{[0-9]+}} calls of {{[0-9]+}} dedicated kernels; 0 ops on the generic kernels, 0 on a slower kernel than their family's best
// CHECK: ptxas accepted {{[0-9]+}} kernel modules for sm_90a
// RUN: moe-compile %s --target=cpu -o %t.cpu.so

// K = 544 (8.5 stages of 64: the last one half zeros), N = 96 (one column
// tile of 256, 3 boxes of 32 stored), the uneven groups of kernels.mlir's
// TMA tests (an empty expert, a one-row group, rows past the last group).
// The rhs [E, K, N] through the 3-D map. Sums of 544 unit-normal products:
// atol 2e-3 as in kernels.mlir.
func.func @gemm_partial_k_n(%x: tensor<700x544xbf16>, %w: tensor<5x544x96xbf16>)
    -> tensor<700x96xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<700x544xbf16>, tensor<5x544x96xbf16>, tensor<6xi32> -> tensor<700x96xf32>
  return %y : tensor<700x96xf32>
}

// The same with the weights [E, N, K] (a data gradient's): the box of 256
// rows reads the next expert's rows for columns it does not store, and
// zeros past K.
func.func @gemm_partial_k_n_transpose_rhs(%x: tensor<700x544xbf16>, %w: tensor<5x96x544xbf16>)
    -> tensor<700x96xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %y = moe.grouped_matmul %x, %w, %o transpose_rhs
      : tensor<700x544xbf16>, tensor<5x96x544xbf16>, tensor<6xi32> -> tensor<700x96xf32>
  return %y : tensor<700x96xf32>
}

// N = 424: the second column tile holds 168 columns, the last box of 32 of
// them 8 (the copy engine's store clips it at N), and the direct stores of
// rows crossing a group's end stop at N.
func.func @gemm_partial_box(%x: tensor<700x512xbf16>, %w: tensor<5x512x424xbf16>)
    -> tensor<700x424xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<700x512xbf16>, tensor<5x512x424xbf16>, tensor<6xi32> -> tensor<700x424xf32>
  return %y : tensor<700x424xf32>
}

// A dense GEMM (one group) of fewer rows than a tile, K = 96 and N = 40 (a
// router over 40 experts).
func.func @gemm_dense_small(%x: tensor<40x96xbf16>, %w: tensor<1x96x40xbf16>)
    -> tensor<40x40xf32> attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 40]> : tensor<2xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<40x96xbf16>, tensor<1x96x40xbf16>, tensor<2xi32> -> tensor<40x40xf32>
  return %y : tensor<40x40xf32>
}

// K = N = 60 (a router over 60 experts and its data gradient): rows of 120
// bytes, which the copy engine cannot read: the operands are padded with
// zeros to 64 and the result's first 60 columns taken.
func.func @gemm_padded(%x: tensor<300x2048xbf16>, %w: tensor<1x2048x60xbf16>)
    -> tensor<300x60xf32> attributes {moe.test_tolerance = [4.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 300]> : tensor<2xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<300x2048xbf16>, tensor<1x2048x60xbf16>, tensor<2xi32> -> tensor<300x60xf32>
  return %y : tensor<300x60xf32>
}

func.func @gemm_padded_k_transpose_rhs(%g: tensor<300x60xbf16>, %w: tensor<1x2048x60xbf16>)
    -> tensor<300x2048xf32> attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 300]> : tensor<2xi32>
  %y = moe.grouped_matmul %g, %w, %o transpose_rhs
      : tensor<300x60xbf16>, tensor<1x2048x60xbf16>, tensor<2xi32> -> tensor<300x2048xf32>
  return %y : tensor<300x2048xf32>
}

// Weight gradients with K = 288 (the last row tile of 128 holds 32 rows:
// stored through a 3-D map, nothing into the next expert's rows) and N = 424
// (a partial last column tile and box), over the uneven groups.
func.func @wgrad_partial_k_n(%x: tensor<700x288xbf16>, %dy: tensor<700x424xbf16>)
    -> tensor<5x288x424xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %o
      : tensor<700x288xbf16>, tensor<700x424xbf16>, tensor<6xi32> -> tensor<5x288x424xf32>
  return %dw : tensor<5x288x424xf32>
}

// The same rounded to bf16 by its only user: bf16 boxes through the 3-D map
// (results within one bf16 ulp: rtol 8e-3, as in kernels.mlir).
func.func @wgrad_partial_bf16_out(%x: tensor<700x288xbf16>, %dy: tensor<700x424xbf16>)
    -> tensor<5x288x424xbf16> attributes {moe.test_tolerance = [2.0e-3, 8.0e-3]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %o
      : tensor<700x288xbf16>, tensor<700x424xbf16>, tensor<6xi32> -> tensor<5x288x424xf32>
  %e = tensor.empty() : tensor<5x288x424xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(a, b, c) -> (a, b, c)>, affine_map<(a, b, c) -> (a, b, c)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%dw : tensor<5x288x424xf32>) outs(%e : tensor<5x288x424xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<5x288x424xbf16>
  return %r : tensor<5x288x424xbf16>
}

// K = 96 (a row tile of 128 holding 96 rows) and N = 60: the router's weight
// gradient over 60 experts, padded to 64 columns.
func.func @wgrad_padded(%x: tensor<300x96xbf16>, %dy: tensor<300x60xbf16>)
    -> tensor<1x96x60xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 300]> : tensor<2xi32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %o
      : tensor<300x96xbf16>, tensor<300x60xbf16>, tensor<2xi32> -> tensor<1x96x60xf32>
  return %dw : tensor<1x96x60xf32>
}

// MXFP8 operands at K = 544 (17 blocks of 32 a row; dequantized exactly to
// bf16 for the TMA kernel), N = 96.
func.func @gemm_partial_mxfp8(%x: tensor<700x544xf32>, %w: tensor<5x544x96xf32>)
    -> tensor<700x96xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 130, 131, 520, 650]> : tensor<6xi32>
  %qx = moe.quantize %x : tensor<700x544xf32> -> !moe.mx<700x544xf8E4M3FN, axis = 1>
  %qw = moe.quantize %w : tensor<5x544x96xf32> -> !moe.mx<5x544x96xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %qx, %qw, %o
      : !moe.mx<700x544xf8E4M3FN, axis = 1>, !moe.mx<5x544x96xf8E4M3FN, axis = 1>, tensor<6xi32> -> tensor<700x96xf32>
  return %y : tensor<700x96xf32>
}

// More tiles than CTAs (each CTA stores several tiles) with an odd number of
// staging boxes a tile: N = 96 is three f32 boxes of 32 (the next tile's
// first box goes to the buffer the last one used). 17000 rows over 5
// uneven groups: 138 row tiles. Sums of 64 products: atol 1e-3.
func.func @gemm_odd_boxes(%x: tensor<17000x64xbf16>, %w: tensor<5x64x96xbf16>)
    -> tensor<17000x96xf32> attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 5000, 5001, 12000, 16900]> : tensor<6xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<17000x64xbf16>, tensor<5x64x96xbf16>, tensor<6xi32> -> tensor<17000x96xf32>
  return %y : tensor<17000x96xf32>
}

// The same for a bf16 weight gradient: N = 2880 leaves one bf16 box of 64
// in the last column tile; 5 experts x 4 row tiles x 12 column tiles = 240
// tiles on 132 CTAs, so the CTAs that store the last column tile store it
// again next (132 is a multiple of 12). Expert 3 is empty: its tiles have no
// stages, so their boxes follow the CTA's previous tile (of expert 0) at
// once. Sums of up to 4000 products (~63): atol 1e-2, rtol 8e-3 (one bf16
// ulp).
func.func @wgrad_odd_boxes_bf16_out(%x: tensor<8000x512xbf16>, %dy: tensor<8000x2880xbf16>)
    -> tensor<5x512x2880xbf16> attributes {moe.test_tolerance = [1.0e-2, 8.0e-3]} {
  %o = arith.constant dense<[0, 3000, 3001, 7000, 7000, 7900]> : tensor<6xi32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %o
      : tensor<8000x512xbf16>, tensor<8000x2880xbf16>, tensor<6xi32> -> tensor<5x512x2880xf32>
  %e = tensor.empty() : tensor<5x512x2880xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(a, b, c) -> (a, b, c)>, affine_map<(a, b, c) -> (a, b, c)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%dw : tensor<5x512x2880xf32>) outs(%e : tensor<5x512x2880xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<5x512x2880xbf16>
  return %r : tensor<5x512x2880xbf16>
}

// A train step's expert MLP (as kernels.mlir's grouped_mlp_train) at hidden
// 288 and F = 160, dims no tile divides: every GEMM's last K stage is half
// zeros (K = 288, or 160 for the second GEMM), the first GEMM's SwiGLU
// epilogue has a last column tile of 32 outputs (its B boxes read, past F,
// the up columns and zeros, whose products it stores nowhere), the backward
// one a last tile of 160 columns of da (its loads of h past F clamped to F),
// and the second GEMM and the data gradients partial column tiles too.
// Tolerances as kernels.mlir's.
func.func @grouped_mlp_train_partial(%x: tensor<1024x288xbf16>, %logits: tensor<1024x16xf32>,
                                     %w1: tensor<16x288x320xbf16>, %w2: tensor<16x160x288xbf16>,
                                     %dy: tensor<4576x288xf32>)
    -> (tensor<4576x288xf32>, tensor<4576x288xf32>, tensor<16x288x320xf32>, tensor<16x160x288xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 2.0e-2, 1.0e-3]} {
  %i, %wt = moe.router %logits top_k(4) softmax
      : tensor<1024x16xf32> -> tensor<1024x4xi32>, tensor<1024x4xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(16) pad_to(32)
      : tensor<1024x288xbf16>, tensor<1024x4xi32>
      -> tensor<4576x288xbf16>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %sq = moe.quantize %s : tensor<4576x288xbf16> -> !moe.mx<4576x288xf8E4M3FN, axis = 1>
  %w1q = moe.quantize %w1 : tensor<16x288x320xbf16> -> !moe.mx<16x288x320xf8E4M3FN, axis = 1>
  %w2q = moe.quantize %w2 : tensor<16x160x288xbf16> -> !moe.mx<16x160x288xf8E4M3FN, axis = 1>
  %y = moe.grouped_mlp %sq, %w1q, %w2q, %o
      : !moe.mx<4576x288xf8E4M3FN, axis = 1>, !moe.mx<16x288x320xf8E4M3FN, axis = 1>,
        !moe.mx<16x160x288xf8E4M3FN, axis = 1>, tensor<17xi32> -> tensor<4576x288xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %s, %w1, %w2, %o, %dy gemm_type(f8E4M3FN)
      : tensor<4576x288xbf16>, tensor<16x288x320xbf16>, tensor<16x160x288xbf16>, tensor<17xi32>,
        tensor<4576x288xf32> -> tensor<4576x288xf32>, tensor<16x288x320xf32>, tensor<16x160x288xf32>
  return %y, %dx, %dw1, %dw2
      : tensor<4576x288xf32>, tensor<4576x288xf32>, tensor<16x288x320xf32>, tensor<16x160x288xf32>
}

