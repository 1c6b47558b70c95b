// Grouped matrix-vector products (N under 16 columns): the matrix-vector
// kernel, a warp a row (1024 rows or more) or a CTA a row, on the GPU
// against the CPU reference (see kernels.mlir for how scripts/gpu-check.sh
// runs this file); on machines without a GPU, lit checks that every
// product takes the kernel and that ptxas accepts it.
// RUN: moe-compile %s --target=sm_90a --verify-ptx -o %t.so | FileCheck %s
// CHECK: ptxas accepted 5 kernel modules for sm_90a
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a report=true" -o /dev/null 2>&1 | FileCheck %s --check-prefix=CALLS
// CALLS: remark: kernels for sm_90a: 5 calls of 5 dedicated kernels; 0 ops on the generic kernels, 0 on a slower kernel than their family's best
// RUN: moe-compile %s --target=cpu -o %t.cpu.so
//
// Tolerances: bf16 products are exact in f32 and f32 ones round once; the
// kernel sums them in another order than the reference's k-ascending chain.
// Sums of K unit-normal products (|sum| ~ sqrt(K)) differ by a few ulps of
// the partial sums: atol 1e-3 for K up to 3000, 4e-3 for 16384 terms.

// A row sum weighted by a vector (a loss's projection): 4100 rows, a warp
// each, K = 2880 in 16-byte loads, one group.
func.func @matvec_row_sum(%x: tensor<4100x2880xbf16>, %v: tensor<1x2880x1xbf16>)
    -> tensor<4100x1xf32> attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 4100]> : tensor<2xi32>
  %y = moe.grouped_matmul %x, %v, %o
      : tensor<4100x2880xbf16>, tensor<1x2880x1xbf16>, tensor<2xi32> -> tensor<4100x1xf32>
  return %y : tensor<4100x1xf32>
}

// f32, 5 columns of an untransposed rhs (loaded one value at a time), a CTA
// a row (1000 rows). Expert 0 holds rows [0, 900); expert 1's offsets
// decrease (empty); expert 2 holds [700, 950), so rows 700-899 are its (the
// last group holding a row wins); rows 950-999 are in no group (+0).
func.func @matvec_f32_grouped(%x: tensor<1000x1056xf32>, %w: tensor<3x1056x5xf32>)
    -> tensor<1000x5xf32> attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 900, 700, 950]> : tensor<4xi64>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<1000x1056xf32>, tensor<3x1056x5xf32>, tensor<4xi64> -> tensor<1000x5xf32>
  return %y : tensor<1000x5xf32>
}

// A transposed rhs [40, 7, 1001]: 40 experts (two rounds of 32 lanes to find
// a row's group), K = 1001 (not a multiple of 8: one value a load), empty
// groups, a decreasing offset (rows 652-681 are expert 20's, not 17's), and
// rows 1642-1799 past the last group.
func.func @matvec_transposed_experts(%x: tensor<1800x1001xbf16>, %w: tensor<40x7x1001xbf16>)
    -> tensor<1800x7xf32> attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 37, 37, 101, 191, 191, 191, 292, 367, 367, 404, 479,
      479, 554, 554, 554, 554, 618, 682, 682, 652, 682, 757, 821, 821, 922, 997,
      997, 997, 1087, 1177, 1252, 1252, 1327, 1402, 1466, 1466, 1466, 1466,
      1541, 1642]> : tensor<41xi32>
  %y = moe.grouped_matmul %x, %w, %o transpose_rhs
      : tensor<1800x1001xbf16>, tensor<40x7x1001xbf16>, tensor<41xi32> -> tensor<1800x7xf32>
  return %y : tensor<1800x7xf32>
}

// A dot product of 16384 terms (a loss summed over tokens): one row, the
// CTA's 256 threads.
func.func @matvec_dot(%x: tensor<1x16384xbf16>, %v: tensor<1x16384x1xbf16>)
    -> tensor<1x1xf32> attributes {moe.test_tolerance = [4.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 1]> : tensor<2xi32>
  %y = moe.grouped_matmul %x, %v, %o
      : tensor<1x16384xbf16>, tensor<1x16384x1xbf16>, tensor<2xi32> -> tensor<1x1xf32>
  return %y : tensor<1x1xf32>
}

// A bf16 lhs and an f32 rhs, transposed, 15 columns (the most the kernel
// takes), 2048 rows a warp each in 16-byte loads.
func.func @matvec_mixed_15(%x: tensor<2048x512xbf16>, %w: tensor<2x15x512xf32>)
    -> tensor<2048x15xf32> attributes {moe.test_tolerance = [1.0e-3, 1.0e-4]} {
  %o = arith.constant dense<[0, 1024, 2048]> : tensor<3xi32>
  %y = moe.grouped_matmul %x, %w, %o transpose_rhs
      : tensor<2048x512xbf16>, tensor<2x15x512xf32>, tensor<3xi32> -> tensor<2048x15xf32>
  return %y : tensor<2048x15xf32>
}
