// RUN: moe-opt %s --split-input-file --moe-gpu-map-loops=block-size=128 | FileCheck %s

// Partial column sums [columns, parts] of rows [rows, columns] (a norm's
// weight gradient after -moe-gpu-split-reductions): the column moves the
// innermost index of the 16 loads of each iteration, so it varies fastest
// across threads (the flat index modulo 128 columns), not the part; a warp
// reads 32 adjacent elements of a row.
// CHECK-LABEL: func.func @columns
// CHECK: scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step %c131072
// CHECK-NEXT: %[[C:.*]] = arith.remsi %[[I]], %c128
// CHECK-NEXT: %[[P:.*]] = arith.divsi %[[I]], %c128
// CHECK: memref.load %arg1[%[[C]], %[[P]]] : memref<128x1024xf32>
// CHECK: scf.for
// CHECK: memref.load %arg0[%{{.*}}, %[[C]]] : memref<16384x128xf32>
func.func @columns(%rows: memref<16384x128xf32>, %parts: memref<128x1024xf32>) {
  %e = memref.expand_shape %rows [[0, 1], [2]] output_shape [16, 1024, 128]
      : memref<16384x128xf32> into memref<16x1024x128xf32>
  linalg.generic {indexing_maps = [affine_map<(c, p, j) -> (j, p, c)>, affine_map<(c, p, j) -> (c, p)>],
                  iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%e : memref<16x1024x128xf32>) outs(%parts : memref<128x1024xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %s = arith.addf %acc, %x : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Rows summed 8 ways along memory (partial sum p of terms p + 8 j): the part
// is the innermost index, as written; the order stays.
// CHECK-LABEL: func.func @rows
// CHECK: scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step %c524288
// CHECK-NEXT: %[[P:.*]] = arith.remsi %[[I]], %c8
// CHECK-NEXT: %[[R:.*]] = arith.divsi %[[I]], %c8
func.func @rows(%rows: memref<65536x128xf32>, %parts: memref<65536x8xf32>) {
  %e = memref.expand_shape %rows [[0], [1, 2]] output_shape [65536, 16, 8]
      : memref<65536x128xf32> into memref<65536x16x8xf32>
  linalg.generic {indexing_maps = [affine_map<(r, p, j) -> (r, j, p)>, affine_map<(r, p, j) -> (r, p)>],
                  iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%e : memref<65536x16x8xf32>) outs(%parts : memref<65536x8xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %s = arith.addf %acc, %x : f32
    linalg.yield %s : f32
  }
  return
}
