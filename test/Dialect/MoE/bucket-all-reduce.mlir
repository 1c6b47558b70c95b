// RUN: moe-opt %s -split-input-file -pass-pipeline='builtin.module(func.func(moe-bucket-all-reduce{bucket-mib=1}))' | FileCheck %s
// RUN: moe-opt %s -split-input-file -pass-pipeline='builtin.module(func.func(moe-bucket-all-reduce{bucket-mib=0}))' | FileCheck %s --check-prefix=NONE
// RUN: moe-opt %s -split-input-file -pass-pipeline='builtin.module(func.func(moe-bucket-all-reduce{bucket-mib=1}),moe-cpu-pipeline)' -o /dev/null

// Four gradient sums over the same axes, of 0.25 MiB (%a), 4 bytes (%s,
// 0-d), 0.5 MiB (%b) and 0.5 MiB (%c), computed in that order: a bucket
// closes once it holds 1 MiB, which the fourth completes, so all four are
// one sum right after %c is computed. A sum over other axes is bucketed
// apart (here alone, so left as it is); a sum read before the terminator
// stays where it is.
// CHECK-LABEL: func.func @grads
// CHECK: %[[A:.*]] = arith.mulf %arg0, %arg0 : tensor<256x256xf32>
// CHECK: %[[S:.*]] = linalg.generic
// CHECK: %[[B:.*]] = arith.addf %arg1, %arg1 : tensor<512x256xf32>
// CHECK: %[[C:.*]] = arith.subf %arg1, %arg1 : tensor<512x256xf32>
// CHECK: %[[E:.*]] = tensor.empty() : tensor<327681xf32>
// CHECK: %[[FA:.*]] = tensor.collapse_shape %[[A]] {{\[\[}}0, 1]] : tensor<256x256xf32> into tensor<65536xf32>
// CHECK: %[[I1:.*]] = tensor.insert_slice %[[FA]] into %[[E]][0] [65536] [1]
// CHECK: %[[FS:.*]] = tensor.expand_shape %[[S]] [] output_shape [1] : tensor<f32> into tensor<1xf32>
// CHECK: %[[I2:.*]] = tensor.insert_slice %[[FS]] into %[[I1]][65536] [1] [1]
// CHECK: %[[I3:.*]] = tensor.insert_slice %{{.*}} into %[[I2]][65537] [131072] [1]
// CHECK: %[[I4:.*]] = tensor.insert_slice %{{.*}} into %[[I3]][196609] [131072] [1]
// CHECK: %[[SUM:.*]] = shard.all_reduce %[[I4]] on @g grid_axes = [0, 1] : tensor<327681xf32> -> tensor<327681xf32>
// CHECK: %[[RA:.*]] = tensor.extract_slice %[[SUM]][0] [65536] [1]
// CHECK: tensor.expand_shape %[[RA]] {{\[\[}}0, 1]] output_shape [256, 256]
// CHECK: %[[RS:.*]] = tensor.extract_slice %[[SUM]][65536] [1] [1]
// CHECK: tensor.collapse_shape %[[RS]] [] : tensor<1xf32> into tensor<f32>
// CHECK: shard.all_reduce %{{.*}} on @g grid_axes = [0] : tensor<512x256xf32>
// CHECK: shard.all_reduce %{{.*}} on @g grid_axes = [0, 1] : tensor<4xf32>
// CHECK: return
// NONE-COUNT-8: shard.all_reduce
// NONE-NOT: shard.all_reduce
shard.grid @g(shape = 2x2)
func.func @grads(%x: tensor<256x256xf32>, %y: tensor<512x256xf32>, %v: tensor<4xf32>)
    -> (tensor<256x256xf32>, tensor<f32>, tensor<512x256xf32>, tensor<512x256xf32>,
        tensor<512x256xf32>, tensor<4xf32>) {
  %a = arith.mulf %x, %x : tensor<256x256xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<f32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<f32>) -> tensor<f32>
  %s = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>],
                       iterator_types = ["reduction"]}
      ins(%v : tensor<4xf32>) outs(%z : tensor<f32>) {
    ^bb0(%in: f32, %acc: f32):
      %t = arith.addf %in, %acc : f32
      linalg.yield %t : f32
  } -> tensor<f32>
  %b = arith.addf %y, %y : tensor<512x256xf32>
  %c = arith.subf %y, %y : tensor<512x256xf32>
  %ra = shard.all_reduce %a on @g grid_axes = [0, 1] : tensor<256x256xf32> -> tensor<256x256xf32>
  %rs = shard.all_reduce %s on @g grid_axes = [0, 1] : tensor<f32> -> tensor<f32>
  %rb = shard.all_reduce %b on @g grid_axes = [0, 1] : tensor<512x256xf32> -> tensor<512x256xf32>
  %rc = shard.all_reduce %c on @g grid_axes = [0, 1] : tensor<512x256xf32> -> tensor<512x256xf32>
  %rd = shard.all_reduce %b on @g grid_axes = [0] : tensor<512x256xf32> -> tensor<512x256xf32>
  %rv = shard.all_reduce %v on @g grid_axes = [0, 1] : tensor<4xf32> -> tensor<4xf32>
  %used = arith.addf %rv, %rv : tensor<4xf32>
  return %ra, %rs, %rb, %rc, %rd, %used
      : tensor<256x256xf32>, tensor<f32>, tensor<512x256xf32>, tensor<512x256xf32>,
        tensor<512x256xf32>, tensor<4xf32>
}

// -----

// Buckets close at the size: with 1 MiB, two 1 MiB sums are two buckets of
// one (left as they are).
// CHECK-LABEL: func.func @full
// CHECK-NOT: tensor.insert_slice
// CHECK-COUNT-2: shard.all_reduce
shard.grid @g(shape = 2)
func.func @full(%x: tensor<512x512xf32>, %y: tensor<512x512xf32>) -> (tensor<512x512xf32>, tensor<512x512xf32>) {
  %rx = shard.all_reduce %x on @g grid_axes = [0] : tensor<512x512xf32> -> tensor<512x512xf32>
  %ry = shard.all_reduce %y on @g grid_axes = [0] : tensor<512x512xf32> -> tensor<512x512xf32>
  return %rx, %ry : tensor<512x512xf32>, tensor<512x512xf32>
}
