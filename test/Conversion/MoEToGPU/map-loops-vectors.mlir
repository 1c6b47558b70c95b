// RUN: moe-opt %s --split-input-file --verify-diagnostics --moe-gpu-map-loops="block-size=32 max-blocks=2" --canonicalize | FileCheck %s
// RUN: not moe-opt %s --split-input-file --moe-gpu-map-loops=vector-bytes=12 2>&1 | FileCheck %s --check-prefix=WIDTH
// WIDTH: error: moe-gpu-map-loops: vector-bytes must be a power of two up to 128 (or below 2 for scalar accesses), got 12

// Elementwise kernels move 16 bytes a thread at a time: a thread takes
// groups of consecutive elements (here 4 f32: 16-byte loads, 8-byte bf16
// stores) where it took one element, the grid sized for the groups (64 x 48
// / 4 = 768 groups, 2 blocks of 32 at --max-blocks=2), two groups at a time
// (their loads before their stores) while it has two. The vectors run
// where both buffers are aligned to them (checked in the kernel); the
// scalar loop takes the elements after the last whole group, or all of
// them where a buffer is not aligned (a caller's view at an odd offset).
// CHECK-LABEL: func.func @round
// CHECK: scf.parallel (%[[B:.*]], %[[T:.*]]) = (%c0, %c0) to (%c2, %c32)
// CHECK: %[[LIN:.*]] = arith.addi
// CHECK: %[[P:.*]] = memref.extract_aligned_pointer_as_index %arg0
// CHECK: arith.remui %[[P]], %c16
// CHECK: %[[Q:.*]] = memref.extract_aligned_pointer_as_index %[[OUT:.*]] :
// CHECK: arith.remui %[[Q]], %c8
// CHECK: %[[END:.*]] = arith.select %{{.*}}, %c3072, %c0
// CHECK: %[[FIRST:.*]] = arith.muli %[[LIN]], %c4
// CHECK: %[[PAIRS:.*]] = arith.subi %[[END]], %c256
// CHECK: scf.for %[[G:.*]] = %[[FIRST]] to %[[PAIRS]] step %c512
// CHECK: %[[V:.*]] = vector.load %arg0[%{{.*}}, %{{.*}}] {alignment = 16 : i64} : memref<64x48xf32>, vector<4xf32>
// CHECK-COUNT-4: arith.truncf
// CHECK: %[[W:.*]] = vector.from_elements
// CHECK: %[[G2:.*]] = arith.addi %[[G]], %c256
// CHECK: %[[V2:.*]] = vector.load %arg0[%{{.*}}, %{{.*}}] {alignment = 16 : i64} : memref<64x48xf32>, vector<4xf32>
// CHECK: %[[W2:.*]] = vector.from_elements
// CHECK-NEXT: vector.store %[[W]], %[[OUT]][%{{.*}}, %{{.*}}] {alignment = 8 : i64} : memref<64x48xbf16>, vector<4xbf16>
// CHECK-NEXT: vector.store %[[W2]], %[[OUT]]
// The last group, if odd:
// CHECK: scf.for %{{.*}} to %[[END]] step %c256
// CHECK: vector.load
// CHECK: %[[REST:.*]] = arith.addi %[[END]], %[[LIN]]
// CHECK: scf.for %{{.*}} = %[[REST]] to
// CHECK: memref.load %arg0
func.func @round(%x: memref<64x48xf32>) -> memref<64x48xbf16> {
  %out = memref.alloc() : memref<64x48xbf16>
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<64x48xf32>) outs(%out : memref<64x48xbf16>) {
  ^bb0(%a: f32, %o: bf16):
    %v = arith.truncf %a : f32 to bf16
    linalg.yield %v : bf16
  }
  return %out : memref<64x48xbf16>
}

// -----

// A row gather of bf16: 8 elements (16 bytes) a group, the row index read
// once for the group (it is the same for all 8: the rows are 16 long).
// CHECK-LABEL: func.func @gather
// CHECK: scf.for %[[G:.*]] =
// CHECK: %[[ROW:.*]] = arith.divsi %[[G]], %c16
// CHECK: %[[R:.*]] = memref.load %arg0[%[[ROW]]] : memref<64xindex>
// CHECK-NOT: memref.load
// CHECK: %[[V:.*]] = vector.load %arg1[%[[R]], %{{.*}}] {alignment = 16 : i64} : memref<16x16xbf16>, vector<8xbf16>
// CHECK: vector.store %[[V]], %{{.*}}[%[[ROW]], %{{.*}}] {alignment = 16 : i64} : memref<64x16xbf16>, vector<8xbf16>
func.func @gather(%idx: memref<64xindex>, %x: memref<16x16xbf16>) -> memref<64x16xbf16> {
  %out = memref.alloc() : memref<64x16xbf16>
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      outs(%out : memref<64x16xbf16>) {
  ^bb0(%o: bf16):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %r = memref.load %idx[%i] : memref<64xindex>
    %v = memref.load %x[%r, %j] : memref<16x16xbf16>
    linalg.yield %v : bf16
  }
  return %out : memref<64x16xbf16>
}

// -----

// An update in place (an optimizer's step: each element loaded and stored
// by its own iteration) runs in vectors too: no iteration reads what
// another stores.
// CHECK-LABEL: func.func @in_place
// CHECK-DAG: vector.load %arg0[{{.*}}] {alignment = 16 : i64} : memref<64x16xf32>, vector<4xf32>
// CHECK-DAG: vector.load %arg1[{{.*}}] {alignment = 16 : i64} : memref<64x16xf32>, vector<4xf32>
// CHECK-COUNT-4: arith.addf
// CHECK: vector.store %{{.*}}, %arg0[{{.*}}] {alignment = 16 : i64}
func.func @in_place(%x: memref<64x16xf32>, %u: memref<64x16xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%u : memref<64x16xf32>) outs(%x : memref<64x16xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = arith.addf %o, %a : f32
    linalg.yield %v : f32
  }
  return
}

// -----

// A transpose: the stores are consecutive, the loads a column apart; the
// loads stay scalar (4 a group), the stores take vectors.
// CHECK-LABEL: func.func @transpose
// CHECK: scf.for
// CHECK-COUNT-4: memref.load %arg0
// CHECK: vector.store %{{.*}} {alignment = 16 : i64} : memref<32x64xf32>, vector<4xf32>
func.func @transpose(%x: memref<64x32xf32>) -> memref<32x64xf32> {
  %out = memref.alloc() : memref<32x64xf32>
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (j, i)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<64x32xf32>) outs(%out : memref<32x64xf32>) {
  ^bb0(%a: f32, %o: f32):
    linalg.yield %a : f32
  }
  return %out : memref<32x64xf32>
}

// -----

// Rows of 30 f32: a group of 4 would cross rows, a group of 2 does not
// (8-byte vectors).
// CHECK-LABEL: func.func @narrow_rows
// CHECK: vector.load %arg0[{{.*}}] {alignment = 8 : i64} : memref<64x30xf32>, vector<2xf32>
// Rows of 15: no group; scalar accesses (4 iterations at a time).
// CHECK-LABEL: func.func @odd_rows
// CHECK-NOT: vector.
// CHECK: return
func.func @narrow_rows(%x: memref<64x30xf32>) -> memref<64x30xf32> {
  %out = memref.alloc() : memref<64x30xf32>
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<64x30xf32>) outs(%out : memref<64x30xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = arith.mulf %a, %a : f32
    linalg.yield %v : f32
  }
  return %out : memref<64x30xf32>
}
func.func @odd_rows(%x: memref<64x15xf32>) -> memref<64x15xf32> {
  %out = memref.alloc() : memref<64x15xf32>
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<64x15xf32>) outs(%out : memref<64x15xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = arith.mulf %a, %a : f32
    linalg.yield %v : f32
  }
  return %out : memref<64x15xf32>
}

// -----

// A store that reads another iteration's element of the stored buffer
// (here through a view the pass does not see through) keeps scalar
// accesses.
// CHECK-LABEL: func.func @through_transpose
// CHECK-NOT: vector.
// CHECK: return
func.func @through_transpose(%x: memref<32x32xf32>) -> memref<32x32xf32> {
  %out = memref.alloc() : memref<32x32xf32>
  %t = memref.transpose %out (i, j) -> (j, i) : memref<32x32xf32> to memref<32x32xf32, strided<[1, 32]>>
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%t : memref<32x32xf32, strided<[1, 32]>>) outs(%out : memref<32x32xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = arith.addf %a, %a : f32
    linalg.yield %v : f32
  }
  return %out : memref<32x32xf32>
}

// -----

// A sum over all elements of a [6, 8, 12] buffer through a collapse to one
// dimension reads the buffer at the flat index (a view of the same memory,
// memref.reinterpret_cast), not at indices divided out of it.
// CHECK-LABEL: func.func @flat_sum
// CHECK: %[[FLAT:.*]] = memref.reinterpret_cast %arg0 to offset: [0], sizes: [576], strides: [1] : memref<6x8x12xf32> to memref<576xf32>
// CHECK-NOT: arith.divsi
// CHECK: memref.load %[[FLAT]][
func.func @flat_sum(%x: memref<6x8x12xf32>, %out: memref<f32>) {
  %flat = memref.collapse_shape %x [[0, 1, 2]] : memref<6x8x12xf32> into memref<576xf32>
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>],
                  iterator_types = ["reduction"]}
      ins(%flat : memref<576xf32>) outs(%out : memref<f32>) {
  ^bb0(%a: f32, %o: f32):
    %s = arith.mulf %a, %a : f32
    %v = arith.addf %o, %s : f32
    linalg.yield %v : f32
  }
  return
}
