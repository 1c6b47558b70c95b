// RUN: moe-opt %s --split-input-file --moe-gpu-map-loops="block-size=32 vector-bytes=0" --verify-diagnostics | FileCheck %s

// A trip count read from (device) memory, with a static bound (64): the
// grid is sized for the bound (2 blocks of 32), each thread strides up to
// the count, which it reads itself (the host's load is left dead).
// CHECK-LABEL: func.func @bounded
// CHECK: scf.parallel (%[[B:.*]]) = (%c0{{.*}}) to (%c2{{.*}}) step
// CHECK: scf.parallel (%[[T:.*]]) = (%c0{{.*}}) to (%c32{{.*}}) step
// CHECK: %[[K:.*]] = memref.load %arg0[%{{.*}}] : memref<1xindex>
// CHECK: %[[N:.*]] = arith.minsi %[[K]], %c64
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[N]] step %c64
// CHECK: memref.store %{{.*}}, %arg1[%{{.*}}] : memref<64xf32>
func.func @bounded(%count: memref<1xindex>, %out: memref<64xf32>) {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %k = memref.load %count[%c0] : memref<1xindex>
  %n = arith.minsi %k, %c64 : index
  %v = memref.subview %out[0] [%n] [1] : memref<64xf32> to memref<?xf32, strided<[1]>>
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%one : f32) outs(%v : memref<?xf32, strided<[1]>>)
  return
}

// -----

// Without a bound, the launch could only be sized by reading the count on
// the host: an error, not a silent host read of device memory.
func.func @unbounded(%count: memref<1xindex>, %out: memref<64xf32>) {
  %c0 = arith.constant 0 : index
  %k = memref.load %count[%c0] : memref<1xindex>
  %v = memref.subview %out[0] [%k] [1] : memref<64xf32> to memref<?xf32, strided<[1]>>
  %one = arith.constant 1.0 : f32
  // expected-error @+1 {{the trip count of this loop is read from memory and has no static bound}}
  linalg.fill ins(%one : f32) outs(%v : memref<?xf32, strided<[1]>>)
  return
}

// -----

// A gather of 4-byte elements with more iterations than threads (2 blocks
// of 32 at --max-blocks=2, 1024 iterations: 16 a thread): each thread runs
// 4 iterations together, their loads first and their stores after (the
// stored buffer is an allocation nothing loads from), then the rest.
// (Scalar accesses, vector-bytes=0: map-loops-vectors.mlir has the vectors.)
// RUN: moe-opt %s --split-input-file --verify-diagnostics --moe-gpu-map-loops="block-size=32 max-blocks=2 vector-bytes=0" --canonicalize | FileCheck %s --check-prefix=UNROLL
// UNROLL-LABEL: func.func @gather
// UNROLL: scf.for %[[I:.*]] = %[[FIRST:.*]] to %[[MAIN:.*]] step %c256
// UNROLL: %[[A:.*]] = memref.load %arg1
// UNROLL: arith.addi %[[I]], %c64
// UNROLL: %[[B:.*]] = memref.load %arg1
// UNROLL: arith.addi %[[I]], %c128
// UNROLL: %[[C:.*]] = memref.load %arg1
// UNROLL: arith.addi %[[I]], %c192
// UNROLL: %[[D:.*]] = memref.load %arg1
// UNROLL-NEXT: memref.store %[[A]], %[[OUT:.*]][
// UNROLL-NEXT: memref.store %[[B]], %[[OUT]][
// UNROLL-NEXT: memref.store %[[C]], %[[OUT]][
// UNROLL-NEXT: memref.store %[[D]], %[[OUT]][
// UNROLL: %[[N:.*]] = arith.ceildivsi
// UNROLL: %[[N0:.*]] = arith.maxsi %[[N]], %c0
// UNROLL: %[[SKIP:.*]] = arith.muli %[[N0]], %c256
// UNROLL: %[[REST:.*]] = arith.addi %[[FIRST]], %[[SKIP]]
// UNROLL: scf.for %{{.*}} = %[[REST]] to %c1024 step %c64
// UNROLL: memref.load %arg1
// UNROLL: memref.store
// An in-place update (the stored buffer is also loaded) keeps one iteration
// at a time.
// UNROLL-LABEL: func.func @in_place
// UNROLL: scf.for %{{.*}} step %c64
// UNROLL-NOT: scf.for
// UNROLL: return
func.func @gather(%idx: memref<64xindex>, %x: memref<16x16xf32>) -> memref<64x16xf32> {
  %out = memref.alloc() : memref<64x16xf32>
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      outs(%out : memref<64x16xf32>) {
  ^bb0(%o: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %r = memref.load %idx[%i] : memref<64xindex>
    %v = memref.load %x[%r, %j] : memref<16x16xf32>
    linalg.yield %v : f32
  }
  return %out : memref<64x16xf32>
}
func.func @in_place(%x: memref<64x16xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      outs(%x : memref<64x16xf32>) {
  ^bb0(%o: f32):
    %v = arith.addf %o, %o : f32
    linalg.yield %v : f32
  }
  return
}
// A load through a view the pass cannot see through (memref.transpose) of
// the stored buffer: one iteration at a time.
// UNROLL-LABEL: func.func @through_transpose
// UNROLL: scf.for %{{.*}} step %c64
// UNROLL-NOT: scf.for
// UNROLL: return
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

// Row sums: each thread's sum stays in a register through its reduction
// loop (one load of the output before it, one store after it). Where the
// loop also reads the output elsewhere (its element 0, here), the loads and
// stores stay in the loop.
// RUN: moe-opt %s --split-input-file --verify-diagnostics --moe-gpu-map-loops="block-size=32" | FileCheck %s --check-prefix=ACC
// ACC-LABEL: func.func @row_sums
// ACC: %[[INIT:.*]] = memref.load %arg1[
// ACC: %[[S:.*]] = scf.for {{.*}} iter_args(%{{.*}} = %[[INIT]]) -> (f32)
// ACC-NOT: memref.store
// ACC: scf.yield
// ACC: memref.store %[[S]], %arg1[
// ACC-LABEL: func.func @row_sums_reading_out
// ACC: scf.for
// ACC-NOT: iter_args
// ACC: memref.store
// ACC: return
func.func @row_sums(%x: memref<64x256xf32>, %out: memref<64xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
                  iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<64x256xf32>) outs(%out : memref<64xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = arith.addf %o, %a : f32
    linalg.yield %v : f32
  }
  return
}
func.func @row_sums_reading_out(%x: memref<64x256xf32>, %out: memref<64xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
                  iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<64x256xf32>) outs(%out : memref<64xf32>) {
  ^bb0(%a: f32, %o: f32):
    %c0 = arith.constant 0 : index
    %first = memref.load %out[%c0] : memref<64xf32>
    %t = arith.addf %a, %first : f32
    %v = arith.addf %o, %t : f32
    linalg.yield %v : f32
  }
  return
}
