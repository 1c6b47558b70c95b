// RUN: cat %s | %run_cpu | FileCheck %s

// moe.all_to_all over a group of one rank on the CPU: the identity on rows
// (copied; zero-padded when the result has more rows, cut when it has
// fewer) and recv_counts == send_counts (with P = 1, entry src * C/P + j is
// the count the only rank sent for slot j: send_counts itself).
// Expected values by hand from the op description.

shard.grid @g(shape = 1)
// A 2x1 grid: axis 1 alone is a group of one rank.
shard.grid @g2(shape = 2x1)

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)
func.func private @printMemrefI64(tensor<*xi64>)

func.func @pf(%t: tensor<?x?xf32>) {
  %u = tensor.cast %t : tensor<?x?xf32> to tensor<*xf32>
  call @printMemrefF32(%u) : (tensor<*xf32>) -> ()
  return
}
func.func @pi(%t: tensor<?xi32>) {
  %u = tensor.cast %t : tensor<?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}

func.func @main() {
  %x = arith.constant dense<[[1.5, -2.0], [3.25, 4.0], [-5.0, 6.125]]> : tensor<3x2xf32>
  %counts = arith.constant dense<[2, 1]> : tensor<2xi32>

  // 1. More rows: 3 copied, rows 3 and 4 zero.
  %r1, %rc1 = moe.all_to_all %x, %counts on @g grid_axes = [0]
      : tensor<3x2xf32>, tensor<2xi32> -> tensor<5x2xf32>, tensor<2xi32>
  %r1_ = tensor.cast %r1 : tensor<5x2xf32> to tensor<?x?xf32>
  %rc1_ = tensor.cast %rc1 : tensor<2xi32> to tensor<?xi32>
  call @pf(%r1_) : (tensor<?x?xf32>) -> ()
  call @pi(%rc1_) : (tensor<?xi32>) -> ()
  // CHECK-LABEL: sizes = [5, 2]
  // CHECK-NEXT: {{\[}}[1.5, -2],
  // CHECK-NEXT:  [3.25, 4],
  // CHECK-NEXT:  [-5, 6.125],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0]]
  // CHECK: sizes = [2]
  // CHECK-NEXT: {{^}}[2, 1]

  // 2. Same shape (all grid axes: grid_axes omitted).
  %r2, %rc2 = moe.all_to_all %x, %counts on @g
      : tensor<3x2xf32>, tensor<2xi32> -> tensor<3x2xf32>, tensor<2xi32>
  %r2_ = tensor.cast %r2 : tensor<3x2xf32> to tensor<?x?xf32>
  %rc2_ = tensor.cast %rc2 : tensor<2xi32> to tensor<?xi32>
  call @pf(%r2_) : (tensor<?x?xf32>) -> ()
  call @pi(%rc2_) : (tensor<?xi32>) -> ()
  // CHECK: sizes = [3, 2]
  // CHECK-NEXT: {{\[}}[1.5, -2],
  // CHECK-NEXT:  [3.25, 4],
  // CHECK-NEXT:  [-5, 6.125]]
  // CHECK: sizes = [2]
  // CHECK-NEXT: {{^}}[2, 1]

  // 3. Fewer rows: cut to the first 2.
  %r3, %rc3 = moe.all_to_all %x, %counts on @g
      : tensor<3x2xf32>, tensor<2xi32> -> tensor<2x2xf32>, tensor<2xi32>
  %r3_ = tensor.cast %r3 : tensor<2x2xf32> to tensor<?x?xf32>
  call @pf(%r3_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [2, 2]
  // CHECK-NEXT: {{\[}}[1.5, -2],
  // CHECK-NEXT:  [3.25, 4]]

  // 4. Dynamic result rows: as many as the input.
  %r4, %rc4 = moe.all_to_all %x, %counts on @g
      : tensor<3x2xf32>, tensor<2xi32> -> tensor<?x2xf32>, tensor<2xi32>
  %r4_ = tensor.cast %r4 : tensor<?x2xf32> to tensor<?x?xf32>
  call @pf(%r4_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [3, 2]
  // CHECK-NEXT: {{\[}}[1.5, -2],
  // CHECK-NEXT:  [3.25, 4],
  // CHECK-NEXT:  [-5, 6.125]]

  // 5. Axis 1 of a 2x1 grid (one rank), i64 counts (three slots), 4 rows.
  %counts64 = arith.constant dense<[0, 3, 1]> : tensor<3xi64>
  %r5, %rc5 = moe.all_to_all %x, %counts64 on @g2 grid_axes = [1]
      : tensor<3x2xf32>, tensor<3xi64> -> tensor<4x2xf32>, tensor<3xi64>
  %r5_ = tensor.cast %r5 : tensor<4x2xf32> to tensor<?x?xf32>
  %rc5_ = tensor.cast %rc5 : tensor<3xi64> to tensor<*xi64>
  call @pf(%r5_) : (tensor<?x?xf32>) -> ()
  call @printMemrefI64(%rc5_) : (tensor<*xi64>) -> ()
  // CHECK: sizes = [4, 2]
  // CHECK-NEXT: {{\[}}[1.5, -2],
  // CHECK-NEXT:  [3.25, 4],
  // CHECK-NEXT:  [-5, 6.125],
  // CHECK-NEXT:  [0, 0]]
  // CHECK: sizes = [3]
  // CHECK-NEXT: {{^}}[0, 3, 1]
  return
}
