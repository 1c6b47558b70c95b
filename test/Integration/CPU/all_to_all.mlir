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

  // 6. Slot-major result padded to 2 rows a slot (counts [2, 1]: slot 0 is
  // rows 0-1, slot 1 starts at 2 and is padded to 4), its groups
  // (moe.slot_offsets), and back from that layout: the input again.
  %r6, %rc6 = moe.all_to_all %x, %counts on @g slot_major_result pad_to(2)
      : tensor<3x2xf32>, tensor<2xi32> -> tensor<5x2xf32>, tensor<2xi32>
  %o6 = moe.slot_offsets %rc6 pad_to(2) : tensor<2xi32> -> tensor<3xi32>
  %b6, %bc6 = moe.all_to_all %r6, %rc6 on @g slot_major_input pad_to(2)
      : tensor<5x2xf32>, tensor<2xi32> -> tensor<3x2xf32>, tensor<2xi32>
  %r6_ = tensor.cast %r6 : tensor<5x2xf32> to tensor<?x?xf32>
  %o6_ = tensor.cast %o6 : tensor<3xi32> to tensor<?xi32>
  %b6_ = tensor.cast %b6 : tensor<3x2xf32> to tensor<?x?xf32>
  call @pf(%r6_) : (tensor<?x?xf32>) -> ()
  call @pi(%o6_) : (tensor<?xi32>) -> ()
  call @pf(%b6_) : (tensor<?x?xf32>) -> ()
  // CHECK: sizes = [5, 2]
  // CHECK-NEXT: {{\[}}[1.5, -2],
  // CHECK-NEXT:  [3.25, 4],
  // CHECK-NEXT:  [-5, 6.125],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0]]
  // CHECK: sizes = [3]
  // CHECK-NEXT: {{^}}[0, 2, 4]
  // CHECK: sizes = [3, 2]
  // CHECK-NEXT: {{\[}}[1.5, -2],
  // CHECK-NEXT:  [3.25, 4],
  // CHECK-NEXT:  [-5, 6.125]]

  // 7. Padded by 4, three slots (counts [1, 0, 2]): slot 0 at row 0, the
  // empty slot 1 takes no rows, slot 2 at row 4.
  %counts7 = arith.constant dense<[1, 0, 2]> : tensor<3xi32>
  %r7, %rc7 = moe.all_to_all %x, %counts7 on @g slot_major_result pad_to(4)
      : tensor<3x2xf32>, tensor<3xi32> -> tensor<9x2xf32>, tensor<3xi32>
  %o7 = moe.slot_offsets %rc7 pad_to(4) : tensor<3xi32> -> tensor<4xi32>
  %r7_ = tensor.cast %r7 : tensor<9x2xf32> to tensor<?x?xf32>
  %o7_ = tensor.cast %o7 : tensor<4xi32> to tensor<?xi32>
  call @pf(%r7_) : (tensor<?x?xf32>) -> ()
  call @pi(%o7_) : (tensor<?xi32>) -> ()
  // CHECK: sizes = [9, 2]
  // CHECK-NEXT: {{\[}}[1.5, -2],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [3.25, 4],
  // CHECK-NEXT:  [-5, 6.125],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0],
  // CHECK-NEXT:  [0, 0]]
  // CHECK: sizes = [4]
  // CHECK-NEXT: {{^}}[0, 4, 4, 8]
  return
}
