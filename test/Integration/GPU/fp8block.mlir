// Blockwise FP8 (!moe.fp8block) on the GPU against the CPU: quantization
// to every tiling the fp8-blockwise recipe uses (1 x 128, 128 x 1 and
// 128 x 128 per expert, sizes that leave partial tiles, power-of-two and
// f32 scales) and the grouped GEMMs reading such operands (forward, data
// gradient, weight gradient). Quantizes and round trips (dequantize of a
// quantize) run on the blockwise FP8 kernel (FP8BlockRoundTrip.cpp), which
// must give the CPU's bytes: elements are compared bit for bit, scales and
// dequantized values with tolerance 0; special values included.
// GEMMs in 1 x 128 / 128 x 128 tiles with K and N multiples of 64
// (@fp8_mma_gemms, @fp8_partial_gemms) run on the TMA kernel's FP8 wgmma
// form, promoted to f32
// every 128 of K, the forward reading the K-major copy of w's elements
// that w's quantize writes beside them (bound below). Other blockwise GEMMs
// run on the bf16 wgmma kernels after an exact dequantization to bf16
// (power-of-two scales) or on the generic kernels (f32 scales, which have
// no exact bf16 form); they differ from the CPU by summation order only
// (relative error 1e-6).
// RUN: moe-compile %s --target=sm_90a --verify-ptx --emit-ptx=%t.ptx -o %t.so | FileCheck %s
// CHECK: ptxas accepted {{[0-9]+}} kernel modules for sm_90a
// RUN: FileCheck %s --check-prefix=KERNELS < %t.ptx
// Whole 128 x 128 tiles: the weights' quantize writes their K-major copy
// itself; the partial ones of @fp8_partial_gemms take the byte transpose.
// RUN: grep "kernel module moe_transpose8" %t.ptx | FileCheck %s --check-prefix=TRANSPOSE
// TRANSPOSE: kernel module moe_transpose8_4x320x192_e4m3_kernel
// TRANSPOSE-NOT: kernel module
// KERNELS-DAG: kernel module moe_wgmma_gmm_256x200x136_e4_bf16_i32_tma_kernel
// KERNELS-DAG: kernel module moe_wgmma_gmm_256x136x200_e4_bf16_rhsT_i32_tma_kernel
// KERNELS-DAG: kernel module moe_wgmma_wgrad_256x200x136_e4_bf16_i32_tma_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_300x260_t1x128_e4m3_pow2_bf16_kernel
// KERNELS-DAG: kernel module moe_fp8block_round_trip_300x260_t1x128_e4m3_pow2_bf16_to_f32_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_300x96_t128x1_e5m2_f32s_f32_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_4x200x136_t128x128_e4m3_f32s_f32_kernel
// KERNELS-DAG: kernel module moe_fp8block_round_trip_256x200_t1x128_e4m3_pow2_f32_to_bf16_live_i32_kernel
// KERNELS-DAG: kernel module moe_fp8block_round_trip_256x200_t128x1_e4m3_pow2_f32_to_bf16_kernel
// KERNELS-DAG: kernel module moe_fp8block_round_trip_4x200x136_t128x128_e4m3_pow2_f32_to_bf16_kernel
// KERNELS-DAG: kernel module moe_fp8block_round_trip_5x130_t1x128_e4m3_f32s_f32_to_bf16_kernel
// KERNELS-DAG: kernel module moe_fp8block_round_trip_300_t1x128_e5m2_pow2_f32_to_f32_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_4x256x384_t128x128_e4m3_pow2_f32_and_T_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_4x256x384_t128x128_e4m3_f32s_f32_and_T_kernel
// KERNELS-DAG: kernel module moe_tma_fp8block_gmm_300x256x384_e4_e4m3_e4m3_i32_kernel
// KERNELS-DAG: kernel module moe_tma_fp8block_gmm_300x384x256_e4_e4m3_e4m3_rhsT_i32_kernel
// KERNELS-DAG: kernel module moe_tma_fp8block_gmm_300x320x192_e4_e4m3_e4m3_i32_kernel
// KERNELS-DAG: kernel module moe_tma_fp8block_gmm_300x192x320_e4_e4m3_e4m3_rhsT_i32_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_1020x256_t128x1_e4m3_pow2_f32_T_live_i32_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_1020x384_t128x1_e4m3_pow2_f32_T_live_i32_kernel
// KERNELS-DAG: kernel module moe_tma_fp8block_wgrad_1020x256x384_e4_e4m3_e4m3_i32_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_384x256_t128x1_e4m3_pow2_f32_T_live_i32_kernel
// KERNELS-DAG: kernel module moe_tma_fp8block_wgrad_384x256x128_e1_e4m3_e4m3_i32_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e5m2_f32s_f32_gather_512_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_f32_live_i32_gather_512_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_f32_live_i32_gather_512_scaled_2_xs_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_f32_live_i32_of_swiglu_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_pair_1020x384_e4m3_pow2_e4m3_pow2_f32_live_i32_of_swiglu_grad_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_pair_1020x512_e4m3_pow2_e4m3_pow2_f32_of_swiglu_grad_kernel
// KERNELS-DAG: kernel module moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_f32_of_swiglu_kernel
// (The f32-scaled forward GEMM calls the first GEMM kernel too: scales are
// f32 either way.)
// RUN: moe-compile %s --target=cpu -o %t.cpu.so
//
// Two more GPU builds, each checked against the same CPU build by
// scripts/gpu-check.sh: with --fp8block-exact, the tile-aligned GEMMs
// with power-of-two scales run on the bf16 kernels after the exact
// dequantization too (f32 scales: generic kernels); with --mxfp8-fp8-mma,
// the MXFP8 GEMM (@mx_fp8_mma_gemm) runs on FP8 wgmma promoted every 32.
// GPU-CHECK-VARIANT: exact --fp8block-exact
// RUN: moe-compile %s --target=sm_90a --fp8block-exact --verify-ptx --emit-ptx=%t.exact.ptx -o %t.exact.so
// RUN: FileCheck %s --check-prefix=EXACT < %t.exact.ptx
// EXACT-DAG: kernel module moe_wgmma_gmm_300x256x384_e4_bf16_i32_tma_kernel
// EXACT-DAG: kernel module moe_wgmma_gmm_300x384x256_e4_bf16_rhsT_i32_tma_kernel
// RUN: not grep -q moe_tma_fp8block %t.exact.ptx
// GPU-CHECK-VARIANT: fp8mma --mxfp8-fp8-mma
// RUN: moe-compile %s --target=sm_90a --mxfp8-fp8-mma --verify-ptx --emit-ptx=%t.mma.ptx -o %t.mma.so
// RUN: FileCheck %s --check-prefix=MMA < %t.mma.ptx
// MMA-DAG: kernel module moe_wgmma_mx_gmm_300x256x384_e4_e4m3_e4m3_i32_kernel

func.func @quantize_rows(%x: tensor<300x260xbf16>)
    -> (tensor<300x260xf8E4M3FN>, tensor<300x3xf32>, tensor<300x260xf32>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %q = moe.quantize %x : tensor<300x260xbf16>
      -> !moe.fp8block<300x260xf8E4M3FN, block = [1, 128], pow2>
  %d, %s = moe.mx_unpack %q : !moe.fp8block<300x260xf8E4M3FN, block = [1, 128], pow2>
      -> tensor<300x260xf8E4M3FN>, tensor<300x3xf32>
  %y = moe.dequantize %q : !moe.fp8block<300x260xf8E4M3FN, block = [1, 128], pow2>
      -> tensor<300x260xf32>
  return %d, %s, %y : tensor<300x260xf8E4M3FN>, tensor<300x3xf32>, tensor<300x260xf32>
}

func.func @quantize_columns(%x: tensor<300x96xf32>)
    -> (tensor<300x96xf8E5M2>, tensor<3x96xf32>, tensor<300x96xf32>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %q = moe.quantize %x : tensor<300x96xf32>
      -> !moe.fp8block<300x96xf8E5M2, block = [128, 1]>
  %d, %s = moe.mx_unpack %q : !moe.fp8block<300x96xf8E5M2, block = [128, 1]>
      -> tensor<300x96xf8E5M2>, tensor<3x96xf32>
  %y = moe.dequantize %q : !moe.fp8block<300x96xf8E5M2, block = [128, 1]>
      -> tensor<300x96xf32>
  return %d, %s, %y : tensor<300x96xf8E5M2>, tensor<3x96xf32>, tensor<300x96xf32>
}

func.func @quantize_weights(%w: tensor<4x200x136xf32>)
    -> (tensor<4x200x136xf8E4M3FN>, tensor<4x2x2xf32>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %q = moe.quantize %w : tensor<4x200x136xf32>
      -> !moe.fp8block<4x200x136xf8E4M3FN, block = [1, 128, 128]>
  %d, %s = moe.mx_unpack %q : !moe.fp8block<4x200x136xf8E4M3FN, block = [1, 128, 128]>
      -> tensor<4x200x136xf8E4M3FN>, tensor<4x2x2xf32>
  return %d, %s : tensor<4x200x136xf8E4M3FN>, tensor<4x2x2xf32>
}

// Round trips on their own: a column count that is not a multiple of 4
// (element-wise accesses), a rank-1 tensor, bf16 input.
func.func @round_trips(%x: tensor<5x130xf32>, %v: tensor<300xf32>,
                       %w: tensor<3x256x128xbf16>)
    -> (tensor<5x130xbf16>, tensor<300xf32>, tensor<3x256x128xf32>,
        tensor<3x256x128xbf16>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %q = moe.quantize %x : tensor<5x130xf32>
      -> !moe.fp8block<5x130xf8E4M3FN, block = [1, 128]>
  %y = moe.dequantize %q : !moe.fp8block<5x130xf8E4M3FN, block = [1, 128]>
      -> tensor<5x130xbf16>
  %vq = moe.quantize %v : tensor<300xf32>
      -> !moe.fp8block<300xf8E5M2, block = [128], pow2>
  %vy = moe.dequantize %vq : !moe.fp8block<300xf8E5M2, block = [128], pow2>
      -> tensor<300xf32>
  %wq = moe.quantize %w : tensor<3x256x128xbf16>
      -> !moe.fp8block<3x256x128xf8E4M3FN, block = [1, 128, 1], pow2>
  %wy = moe.dequantize %wq : !moe.fp8block<3x256x128xf8E4M3FN, block = [1, 128, 1], pow2>
      -> tensor<3x256x128xf32>
  %wt = moe.quantize %w : tensor<3x256x128xbf16>
      -> !moe.fp8block<3x256x128xf8E4M3FN, block = [1, 128, 128]>
  %wty = moe.dequantize %wt : !moe.fp8block<3x256x128xf8E4M3FN, block = [1, 128, 128]>
      -> tensor<3x256x128xbf16>
  return %y, %vy, %wy, %wty : tensor<5x130xbf16>, tensor<300xf32>,
      tensor<3x256x128xf32>, tensor<3x256x128xbf16>
}

// Special values in each tiling, round trips and quantizes (the kernel
// converts elements with the hardware's f32 -> f8 conversion, the generic
// path with integer arithmetic): NaN and -NaN (s = 1, the elements NaN,
// the rest of the tile at scale 1), infinities (s = 1, saturated), an
// all-zero and an all -0 tile, a tile of f32 subnormals (a factor that
// overflows to FLT_MAX), a value near f32's max.
func.func @specials(%x: tensor<256x256xf32>)
    -> (tensor<256x256xbf16>, tensor<256x256xf32>, tensor<256x256xbf16>,
        tensor<256x256xf8E4M3FN>, tensor<256x2xf32>,
        tensor<256x256xf8E5M2>, tensor<2x256xf32>,
        tensor<256x256xf8E4M3FN>, tensor<2x2xf32>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %c140 = arith.constant 140 : index
  %c200 = arith.constant 200 : index
  %nan = arith.constant 0x7FC00000 : f32
  %negnan = arith.constant 0xFFC00000 : f32
  %inf = arith.constant 0xFF800000 : f32
  %big = arith.constant 3.0e38 : f32
  %zeros = arith.constant dense<0.0> : tensor<1x128xf32>
  %negzeros = arith.constant dense<-0.0> : tensor<1x128xf32>
  %tiny = arith.constant dense<1.0e-39> : tensor<128x128xf32>
  %a = tensor.insert %nan into %x[%c0, %c3] : tensor<256x256xf32>
  %b = tensor.insert %inf into %a[%c1, %c140] : tensor<256x256xf32>
  %c = tensor.insert_slice %zeros into %b[2, 0] [1, 128] [1, 1] : tensor<1x128xf32> into tensor<256x256xf32>
  %d = tensor.insert_slice %negzeros into %c[2, 128] [1, 128] [1, 1] : tensor<1x128xf32> into tensor<256x256xf32>
  %e = tensor.insert %big into %d[%c3, %c5] : tensor<256x256xf32>
  %n = tensor.insert %negnan into %e[%c200, %c200] : tensor<256x256xf32>
  %tile = tensor.extract_slice %n[128, 0] [128, 128] [1, 1] : tensor<256x256xf32> to tensor<128x128xf32>
  %sub = arith.mulf %tile, %tiny : tensor<128x128xf32>
  %f = tensor.insert_slice %sub into %n[128, 0] [128, 128] [1, 1] : tensor<128x128xf32> into tensor<256x256xf32>
  %q1 = moe.quantize %f : tensor<256x256xf32>
      -> !moe.fp8block<256x256xf8E4M3FN, block = [1, 128], pow2>
  %y1 = moe.dequantize %q1 : !moe.fp8block<256x256xf8E4M3FN, block = [1, 128], pow2>
      -> tensor<256x256xbf16>
  %d1, %s1 = moe.mx_unpack %q1 : !moe.fp8block<256x256xf8E4M3FN, block = [1, 128], pow2>
      -> tensor<256x256xf8E4M3FN>, tensor<256x2xf32>
  %q2 = moe.quantize %f : tensor<256x256xf32>
      -> !moe.fp8block<256x256xf8E5M2, block = [128, 1]>
  %y2 = moe.dequantize %q2 : !moe.fp8block<256x256xf8E5M2, block = [128, 1]>
      -> tensor<256x256xf32>
  %d2, %s2 = moe.mx_unpack %q2 : !moe.fp8block<256x256xf8E5M2, block = [128, 1]>
      -> tensor<256x256xf8E5M2>, tensor<2x256xf32>
  %q3 = moe.quantize %f : tensor<256x256xf32>
      -> !moe.fp8block<256x256xf8E4M3FN, block = [128, 128]>
  %y3 = moe.dequantize %q3 : !moe.fp8block<256x256xf8E4M3FN, block = [128, 128]>
      -> tensor<256x256xbf16>
  %d3, %s3 = moe.mx_unpack %q3 : !moe.fp8block<256x256xf8E4M3FN, block = [128, 128]>
      -> tensor<256x256xf8E4M3FN>, tensor<2x2xf32>
  return %y1, %y2, %y3, %d1, %s1, %d2, %s2, %d3, %s3
      : tensor<256x256xbf16>, tensor<256x256xf32>, tensor<256x256xbf16>,
        tensor<256x256xf8E4M3FN>, tensor<256x2xf32>,
        tensor<256x256xf8E5M2>, tensor<2x256xf32>,
        tensor<256x256xf8E4M3FN>, tensor<2x2xf32>
}

// f16 input: a -NaN keeps its sign in the code (taken from the input's
// bits), an infinity saturates.
func.func @specials_f16(%x: tensor<4x256xf16>)
    -> (tensor<4x256xf8E4M3FN>, tensor<4x2xf32>, tensor<4x256xf32>)
    attributes {moe.test_tolerance = [0.0, 0.0]} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c7 = arith.constant 7 : index
  %c130 = arith.constant 130 : index
  %negnan = arith.constant 0xFE00 : f16
  %inf = arith.constant 0x7C00 : f16
  %a = tensor.insert %negnan into %x[%c0, %c7] : tensor<4x256xf16>
  %b = tensor.insert %inf into %a[%c1, %c130] : tensor<4x256xf16>
  %q = moe.quantize %b : tensor<4x256xf16>
      -> !moe.fp8block<4x256xf8E4M3FN, block = [1, 128], pow2>
  %d, %s = moe.mx_unpack %q : !moe.fp8block<4x256xf8E4M3FN, block = [1, 128], pow2>
      -> tensor<4x256xf8E4M3FN>, tensor<4x2xf32>
  %y = moe.dequantize %q : !moe.fp8block<4x256xf8E4M3FN, block = [1, 128], pow2>
      -> tensor<4x256xf32>
  return %d, %s, %y : tensor<4x256xf8E4M3FN>, tensor<4x2xf32>, tensor<4x256xf32>
}

// The recipe's three GEMMs of one expert layer (K = 200, N = 136: partial
// tiles in both).
func.func @grouped_gemms(%x: tensor<256x200xf32>, %w: tensor<4x200x136xf32>,
                         %dy: tensor<256x136xf32>)
    -> (tensor<256x136xf32>, tensor<256x200xf32>, tensor<4x200x136xf32>)
    attributes {moe.test_tolerance = [1.0e-4, 1.0e-4, 1.0e-6]} {
  %o = arith.constant dense<[0, 50, 50, 180, 256]> : tensor<5xi32>
  %xq = moe.quantize %x : tensor<256x200xf32>
      -> !moe.fp8block<256x200xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w : tensor<4x200x136xf32>
      -> !moe.fp8block<4x200x136xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %xq, %wq, %o
      : !moe.fp8block<256x200xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x200x136xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<256x136xf32>
  %dyq = moe.quantize %dy : tensor<256x136xf32>
      -> !moe.fp8block<256x136xf8E4M3FN, block = [1, 128], pow2>
  %dx = moe.grouped_matmul %dyq, %wq, %o transpose_rhs
      : !moe.fp8block<256x136xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x200x136xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<256x200xf32>
  %xc = moe.quantize %x : tensor<256x200xf32>
      -> !moe.fp8block<256x200xf8E4M3FN, block = [128, 1], pow2>
  %dyc = moe.quantize %dy : tensor<256x136xf32>
      -> !moe.fp8block<256x136xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %xc, %dyc, %o
      : !moe.fp8block<256x200xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<256x136xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x200x136xf32>
  return %y, %dx, %dw : tensor<256x136xf32>, tensor<256x200xf32>, tensor<4x200x136xf32>
}

// f32 scales: the generic kernels.
func.func @grouped_gemm_f32_scales(%x: tensor<256x200xf32>, %w: tensor<4x200x136xf32>)
    -> tensor<256x136xf32>
    attributes {moe.test_tolerance = [1.0e-4, 1.0e-4, 1.0e-6]} {
  %o = arith.constant dense<[0, 100, 120, 120, 256]> : tensor<5xi32>
  %xq = moe.quantize %x : tensor<256x200xf32>
      -> !moe.fp8block<256x200xf8E4M3FN, block = [1, 128]>
  %wq = moe.quantize %w : tensor<4x200x136xf32>
      -> !moe.fp8block<4x200x136xf8E4M3FN, block = [1, 128, 128]>
  %y = moe.grouped_matmul %xq, %wq, %o
      : !moe.fp8block<256x200xf8E4M3FN, block = [1, 128]>,
        !moe.fp8block<4x200x136xf8E4M3FN, block = [1, 128, 128]>, tensor<5xi32>
      -> tensor<256x136xf32>
  return %y : tensor<256x136xf32>
}

// Tile-aligned K and N (rows are not): on FP8 wgmma; with fp8block-exact
// on the bf16 kernels (power-of-two scales) and the generic ones (f32).
// The bound of the FP8 path: each promoted partial sums 128 exact FP8
// products in the tensor core's accumulator, which keeps about 14 bits
// (DeepSeek-V3's measurement on H800, the reason for promoting every 128):
// a relative error of about 2^-14 per addition, growing as the square root
// of the 128 additions for inputs of random sign, sqrt(128) * 2^-14 = 7e-4
// of a partial; partials of independent tiles add in quadrature, so the
// result's relative Frobenius error stays below 1e-3 (elementwise: 5e-2
// absolute plus 1e-2 relative, for outputs of magnitude up to sqrt(K)).
func.func @fp8_mma_gemms(%x: tensor<300x256xf32>, %w: tensor<4x256x384xf32>,
                         %dy: tensor<300x384xf32>)
    -> (tensor<300x384xf32>, tensor<300x256xf32>, tensor<300x384xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %o = arith.constant dense<[0, 90, 90, 220, 300]> : tensor<5xi32>
  %xq = moe.quantize %x : tensor<300x256xf32>
      -> !moe.fp8block<300x256xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %xq, %wq, %o
      : !moe.fp8block<300x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<300x384xf32>
  %dyq = moe.quantize %dy : tensor<300x384xf32>
      -> !moe.fp8block<300x384xf8E4M3FN, block = [1, 128], pow2>
  %dx = moe.grouped_matmul %dyq, %wq, %o transpose_rhs
      : !moe.fp8block<300x384xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<300x256xf32>
  // f32 scales (not powers of two).
  %xf = moe.quantize %x : tensor<300x256xf32>
      -> !moe.fp8block<300x256xf8E4M3FN, block = [1, 128]>
  %wf = moe.quantize %w : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128]>
  %yf = moe.grouped_matmul %xf, %wf, %o
      : !moe.fp8block<300x256xf8E4M3FN, block = [1, 128]>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128]>, tensor<5xi32>
      -> tensor<300x384xf32>
  return %y, %dx, %yf : tensor<300x384xf32>, tensor<300x256xf32>, tensor<300x384xf32>
}

// K and N multiples of 64 but not of 128 (gpt-oss-20b's 2880 is one): the
// same FP8 kernel, its last K stage partial (zeros past K: the last scale
// block covers 64 values) and its last column tile partial (the first 64
// columns stored); the bound of @fp8_mma_gemms.
func.func @fp8_partial_gemms(%x: tensor<300x320xf32>, %w: tensor<4x320x192xf32>,
                             %dy: tensor<300x192xf32>)
    -> (tensor<300x192xf32>, tensor<300x320xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %o = arith.constant dense<[0, 90, 90, 220, 300]> : tensor<5xi32>
  %xq = moe.quantize %x : tensor<300x320xf32>
      -> !moe.fp8block<300x320xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w : tensor<4x320x192xf32>
      -> !moe.fp8block<4x320x192xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %xq, %wq, %o
      : !moe.fp8block<300x320xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x320x192xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<300x192xf32>
  %dyq = moe.quantize %dy : tensor<300x192xf32>
      -> !moe.fp8block<300x192xf8E4M3FN, block = [1, 128], pow2>
  %dx = moe.grouped_matmul %dyq, %wq, %o transpose_rhs
      : !moe.fp8block<300x192xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x320x192xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<300x320xf32>
  return %y, %dx : tensor<300x192xf32>, tensor<300x320xf32>
}

// The same kernel's MXFP8 form (promotion every 32 of K), under fp8-mma
// (otherwise exact through bf16).
func.func @mx_fp8_mma_gemm(%x: tensor<300x256xf32>, %w: tensor<4x256x384xf32>)
    -> tensor<300x384xf32>
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %o = arith.constant dense<[0, 90, 90, 220, 300]> : tensor<5xi32>
  %xq = moe.quantize %x : tensor<300x256xf32> -> !moe.mx<300x256xf8E4M3FN, axis = 1>
  %wq = moe.quantize %w : tensor<4x256x384xf32> -> !moe.mx<4x256x384xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %xq, %wq, %o
      : !moe.mx<300x256xf8E4M3FN, axis = 1>, !moe.mx<4x256x384xf8E4M3FN, axis = 1>,
        tensor<5xi32> -> tensor<300x384xf32>
  return %y : tensor<300x384xf32>
}

// The weight gradient of 128 x 1 operands over a dispatch's groups padded
// to 128 rows (what moe-train builds under fp8-blockwise; tokens routed to
// -1 or 4 are dropped): both operands quantized transposed, then FP8 wgmma
// promoted every 128 group rows (one row tile of both operands), with the
// scales of the result's row and column; with fp8block-exact, the bf16
// kernel on the dequantized operands. Bound as @fp8_mma_gemms's.
func.func @fp8_wgrad(%x: tensor<512x256xf32>,
                     %idx: tensor<512x1xi32> {moe.test_range = [-1, 5]},
                     %dy: tensor<1020x384xf32>) -> tensor<4x256x384xf32>
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %xq = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dyq = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %xq, %dyq, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  return %dw : tensor<4x256x384xf32>
}

// A dense GEMM's weight gradient (one group, constant offsets [0, 384]:
// every row block in it), as moe-train's --dense fp8-blockwise makes it:
// the same FP8 wgmma kernel. Bound as @fp8_wgrad's.
func.func @dense_fp8_wgrad(%x: tensor<384x256xf32>, %dy: tensor<384x128xf32>)
    -> tensor<1x256x128xf32>
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %o = arith.constant dense<[0, 384]> : tensor<2xi32>
  %xq = moe.quantize %x : tensor<384x256xf32>
      -> !moe.fp8block<384x256xf8E4M3FN, block = [128, 1], pow2>
  %dyq = moe.quantize %dy : tensor<384x128xf32>
      -> !moe.fp8block<384x128xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %xq, %dyq, %o
      : !moe.fp8block<384x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<384x128xf8E4M3FN, block = [128, 1], pow2>, tensor<2xi32>
      -> tensor<1x256x128xf32>
  return %dw : tensor<1x256x128xf32>
}

// The dispatched rows quantized in both tilings by one pair kernel (the
// forward GEMM's 1 x 128 lhs, E4M3 with power-of-two scales; the weight
// gradient's 128 x 1 operand, here E5M2 with f32 scales, transposed), which
// reads each row from the tokens through the dispatch's source index (the
// gathered rows are never written, -moe-gpu-fuse-row-gathers): its four
// results compared bit for bit (the transposed data through the weight
// gradient, within its bound), and the GEMMs as above. (Its rowwise data
// is returned, so every row is computed; @fp8_wgrad's operands only up to
// the groups' end, `_live_`.)
func.func @fp8_pair(%x: tensor<512x256xf32>,
                    %idx: tensor<512x1xi32> {moe.test_range = [-1, 5]},
                    %w: tensor<4x256x384xf32>, %dy: tensor<1020x384xf32>)
    -> (tensor<1020x256xf8E4M3FN>, tensor<1020x2xf32>, tensor<1020x384xf32>,
        tensor<4x256x384xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %xq = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %xq, %wq, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<1020x384xf32>
  %xd, %xs = moe.mx_unpack %xq : !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
      -> tensor<1020x256xf8E4M3FN>, tensor<1020x2xf32>
  %xc = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E5M2, block = [128, 1]>
  %dyc = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %xc, %dyc, %o
      : !moe.fp8block<1020x256xf8E5M2, block = [128, 1]>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  return %xd, %xs, %y, %dw
      : tensor<1020x256xf8E4M3FN>, tensor<1020x2xf32>, tensor<1020x384xf32>,
        tensor<4x256x384xf32>
}

// As @fp8_pair, but only the GEMMs are returned: the dispatch gathers the
// rows before the groups' end only, and the pair kernel computes those
// (`_live_`), reading their source indices up to there.
func.func @fp8_pair_live(%x: tensor<512x256xf32>,
                         %idx: tensor<512x1xi32> {moe.test_range = [-1, 5]},
                         %w: tensor<4x256x384xf32>, %dy: tensor<1020x384xf32>)
    -> (tensor<1020x384xf32>, tensor<4x256x384xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %xq = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %xq, %wq, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<1020x384xf32>
  %xc = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dyc = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %xc, %dyc, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  return %y, %dw : tensor<1020x384xf32>, tensor<4x256x384xf32>
}

// A combine's gradient re-sorted (g[t] * w[t, k] for each of a token's 2
// copies, dispatched, groups padded to 128) quantized in both tilings: the
// pair kernel computes the products itself (`_scaled_2_xs`), from g and w.
func.func @fp8_pair_weighted(%w: tensor<256x2xf32>, %g: tensor<256x256xf32>,
                             %idx: tensor<256x2xi32> {moe.test_range = [-1, 5]},
                             %wt: tensor<4x256x384xf32>, %a: tensor<1020x384xf32>)
    -> (tensor<1020x384xf32>, tensor<4x384x256xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %e = tensor.empty() : tensor<256x2x256xf32>
  %prod = linalg.generic {indexing_maps = [affine_map<(t, k, h) -> (t, k)>, affine_map<(t, k, h) -> (t, h)>,
                                           affine_map<(t, k, h) -> (t, k, h)>],
                          iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w, %g : tensor<256x2xf32>, tensor<256x256xf32>) outs(%e : tensor<256x2x256xf32>) {
  ^bb0(%ws: f32, %gs: f32, %o: f32):
    %m = arith.mulf %gs, %ws : f32
    linalg.yield %m : f32
  } -> tensor<256x2x256xf32>
  %copies = tensor.collapse_shape %prod [[0, 1], [2]] : tensor<256x2x256xf32> into tensor<512x256xf32>
  %i = tensor.collapse_shape %idx [[0, 1]] : tensor<256x2xi32> into tensor<512xi32>
  %i1 = tensor.expand_shape %i [[0, 1]] output_shape [512, 1] : tensor<512xi32> into tensor<512x1xi32>
  %s, %o, %c, %p = moe.dispatch %copies, %i1 experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %sq = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %wt : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %sq, %wq, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<1020x384xf32>
  %ac = moe.quantize %a : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %sc = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %ac, %sc, %o
      : !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x384x256xf32>
  return %y, %dw : tensor<1020x384xf32>, tensor<4x384x256xf32>
}

// A SwiGLU's result quantized in both tilings (the next GEMM's lhs and the
// weight gradient's operand): the pair kernel computes silu(gate) * up from
// h itself (`_of_swiglu`), so the activation is never written; h's rows
// are read up to the groups' end. The GEMMs as above.
func.func @fp8_swiglu_pair(%x: tensor<512x256xf32>,
                           %idx: tensor<512x1xi32> {moe.test_range = [-1, 5]},
                           %h: tensor<1020x512xf32>, %w: tensor<4x256x384xf32>,
                           %dy: tensor<1020x384xf32>)
    -> (tensor<1020x384xf32>, tensor<4x256x384xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %a = moe.swiglu %h : tensor<1020x512xf32> -> tensor<1020x256xf32>
  %aq = moe.quantize %a : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %aq, %wq, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<1020x384xf32>
  %ac = moe.quantize %a : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dyc = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %ac, %dyc, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  return %y, %dw : tensor<1020x384xf32>, tensor<4x256x384xf32>
}

// A SwiGLU gradient quantized in both tilings: the pair kernel computes dh
// from h and the result's gradient da (`_of_swiglu_grad`). F = 192: a
// region of 128 of dh's columns holds gate and up columns both.
func.func @fp8_swiglu_grad_pair(%x: tensor<512x128xf32>,
                                %idx: tensor<512x1xi32> {moe.test_range = [-1, 5]},
                                %h: tensor<1020x384xf32>, %da: tensor<1020x192xf32>,
                                %w: tensor<4x384x256xf32>)
    -> (tensor<1020x256xf32>, tensor<4x128x384xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x128xf32>, tensor<512x1xi32>
      -> tensor<1020x128xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %dh = moe.swiglu_grad %h, %da
      : tensor<1020x384xf32>, tensor<1020x192xf32> -> tensor<1020x384xf32>
  %dhq = moe.quantize %dh : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w : tensor<4x384x256xf32>
      -> !moe.fp8block<4x384x256xf8E4M3FN, block = [1, 128, 128], pow2>
  %dx = moe.grouped_matmul %dhq, %wq, %o
      : !moe.fp8block<1020x384xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x384x256xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<1020x256xf32>
  %xc = moe.quantize %s : tensor<1020x128xf32>
      -> !moe.fp8block<1020x128xf8E4M3FN, block = [128, 1], pow2>
  %dhc = moe.quantize %dh : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %xc, %dhc, %o
      : !moe.fp8block<1020x128xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x128x384xf32>
  return %dx, %dw : tensor<1020x256xf32>, tensor<4x128x384xf32>
}

// As @fp8_swiglu_grad_pair with F = 256 (gate and up regions of the same
// columns run side by side) and dh's rowwise data and scales returned,
// compared bit for bit (every row computed: no `_live_`).
func.func @fp8_swiglu_grad_pair_codes(%x: tensor<512x128xf32>,
                                      %idx: tensor<512x1xi32> {moe.test_range = [-1, 5]},
                                      %h: tensor<1020x512xf32>, %da: tensor<1020x256xf32>)
    -> (tensor<1020x512xf8E4M3FN>, tensor<1020x4xf32>, tensor<4x128x512xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x128xf32>, tensor<512x1xi32>
      -> tensor<1020x128xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %dh = moe.swiglu_grad %h, %da
      : tensor<1020x512xf32>, tensor<1020x256xf32> -> tensor<1020x512xf32>
  %dhq = moe.quantize %dh : tensor<1020x512xf32>
      -> !moe.fp8block<1020x512xf8E4M3FN, block = [1, 128], pow2>
  %dhd, %dhs = moe.mx_unpack %dhq : !moe.fp8block<1020x512xf8E4M3FN, block = [1, 128], pow2>
      -> tensor<1020x512xf8E4M3FN>, tensor<1020x4xf32>
  %xc = moe.quantize %s : tensor<1020x128xf32>
      -> !moe.fp8block<1020x128xf8E4M3FN, block = [128, 1], pow2>
  %dhc = moe.quantize %dh : tensor<1020x512xf32>
      -> !moe.fp8block<1020x512xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %xc, %dhc, %o
      : !moe.fp8block<1020x128xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x512xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x128x512xf32>
  return %dhd, %dhs, %dw
      : tensor<1020x512xf8E4M3FN>, tensor<1020x4xf32>, tensor<4x128x512xf32>
}

// As @fp8_swiglu_pair with the activation's rowwise codes and scales
// returned, compared bit for bit (every row computed: no `_live_`).
func.func @fp8_swiglu_pair_codes(%x: tensor<512x256xf32>,
                                 %idx: tensor<512x1xi32> {moe.test_range = [-1, 5]},
                                 %h: tensor<1020x512xf32>, %dy: tensor<1020x384xf32>)
    -> (tensor<1020x256xf8E4M3FN>, tensor<1020x2xf32>, tensor<4x256x384xf32>)
    attributes {moe.test_tolerance = [5.0e-2, 1.0e-2, 1.0e-3]} {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %a = moe.swiglu %h : tensor<1020x512xf32> -> tensor<1020x256xf32>
  %aq = moe.quantize %a : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
  %ad, %as = moe.mx_unpack %aq : !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
      -> tensor<1020x256xf8E4M3FN>, tensor<1020x2xf32>
  %ac = moe.quantize %a : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dyc = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %ac, %dyc, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  return %ad, %as, %dw : tensor<1020x256xf8E4M3FN>, tensor<1020x2xf32>, tensor<4x256x384xf32>
}
