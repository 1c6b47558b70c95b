// Constants, and a compare and select made of them, are copied into each
// launch that reads them (defs before uses); the host keeps its own. A
// value that is neither (a function argument) stays a value from above.
// RUN: moe-opt %s -moe-gpu-sink-index-computations | FileCheck %s

// CHECK-LABEL: func.func @sink
// CHECK: %[[C16:.*]] = arith.constant 16 : index
// CHECK: gpu.launch
// CHECK-NEXT: %[[K4:.*]] = arith.constant 4 : index
// CHECK-NEXT: %[[K16:.*]] = arith.constant 16 : index
// CHECK-NEXT: %[[CMP:.*]] = arith.cmpi ult, %[[K4]], %[[K16]] : index
// CHECK-NEXT: %[[SEL:.*]] = arith.select %[[CMP]], %[[K4]], %[[K16]] : index
// CHECK: memref.load %{{.*}}[%[[SEL]]]
// CHECK: arith.addf %{{.*}}, %{{.*}} : f32
// CHECK: gpu.launch
// CHECK-NEXT: arith.constant 16 : index
// CHECK: memref.store %arg1
func.func @sink(%a: memref<16xf32>, %x: f32) {
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c16 = arith.constant 16 : index
  %lt = arith.cmpi ult, %c4, %c16 : index
  %i = arith.select %lt, %c4, %c16 : index
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %c1, %sy = %c1, %sz = %c1) {
    %v = memref.load %a[%i] : memref<16xf32>
    %w = arith.addf %v, %v : f32
    memref.store %w, %a[%c16] : memref<16xf32>
    gpu.terminator
  }
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %c1, %sy = %c1, %sz = %c1) {
    memref.store %x, %a[%c16] : memref<16xf32>
    gpu.terminator
  }
  %u = arith.addi %c16, %i : index
  return
}
