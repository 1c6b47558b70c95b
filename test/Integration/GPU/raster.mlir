// GEMMs whose row of tiles reads more than 32 MiB of B (an
// expert of Mixtral's 4096 x 28672, an LM head's vocabulary): the TMA
// kernel walks each expert's tiles in groups of 8 row tiles, column tile
// after column tile, so that the CTAs in flight share their A and B tiles
// in L2. On the GPU against the CPU reference (see kernels.mlir for how
// scripts/gpu-check.sh runs this file); on machines without a GPU, lit
// checks that the kernels compile and ptxas accepts them.
// RUN: moe-compile %s --target=sm_90a --verify-ptx -o %t.so | FileCheck %s
// CHECK: ptxas accepted 2 kernel modules for sm_90a
// RUN: moe-compile %s --target=cpu -o %t.cpu.so

// K = 512, N = 33024 (129 column tiles, the last one partial: 33.8 MB of B
// a row of tiles). Expert 3's 1069 rows are 9 row tiles: a group of 8, then
// a group of one; expert 0 is empty, expert 1 one row, expert 2 one tile;
// rows past the last group. Sums of 512 unit-normal products: atol 2e-3.
func.func @gemm_grouped_raster(%x: tensor<1300x512xbf16>, %w: tensor<5x512x33024xbf16>)
    -> tensor<1300x33024xf32> attributes {moe.test_tolerance = [2.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 0, 1, 129, 1198, 1290]> : tensor<6xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<1300x512xbf16>, tensor<5x512x33024xbf16>, tensor<6xi32> -> tensor<1300x33024xf32>
  return %y : tensor<1300x33024xf32>
}

// A weight gradient of one expert over 1024 rows, K = 1152 (9 row tiles of
// the result: groups of 8 and 1), N = 16640 (65 column tiles; 34 MB of the
// rhs a row of tiles). Sums of 1024 products: atol 3e-3.
func.func @wgrad_grouped_raster(%x: tensor<1024x1152xbf16>, %dy: tensor<1024x16640xbf16>)
    -> tensor<1x1152x16640xf32> attributes {moe.test_tolerance = [3.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 1024]> : tensor<2xi32>
  %dw = moe.grouped_matmul_wgrad %x, %dy, %o
      : tensor<1024x1152xbf16>, tensor<1024x16640xbf16>, tensor<2xi32> -> tensor<1x1152x16640xf32>
  return %dw : tensor<1x1152x16640xf32>
}
