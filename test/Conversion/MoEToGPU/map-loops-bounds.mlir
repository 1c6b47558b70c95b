// RUN: moe-opt %s --split-input-file --moe-gpu-map-loops=block-size=32 --verify-diagnostics | FileCheck %s

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
