// -moe-gpu-elide-host-syncs: no host wait before calls of host-only functions
// (moe.host_only), the stream continuing after them; any other call keeps
// its wait (one-stream.mlir has the whole GPU pipeline).
// RUN: moe-opt %s --moe-gpu-elide-host-syncs | FileCheck %s

func.func private @encode(i64) -> i64 attributes {moe.host_only}
func.func private @other(i64) -> i64

// A wait before host-only calls: the stream continues through them.
// CHECK-LABEL: func.func @host_only
// CHECK: %[[T0:.*]] = gpu.wait async
// CHECK: %[[T1:.*]] = gpu.memset async [%[[T0]]]
// CHECK-NOT: gpu.wait
// CHECK: call @encode
// CHECK: %[[C:.*]] = arith.addi
// CHECK: call @encode
// CHECK-NOT: gpu.wait
// CHECK: gpu.memset async [%[[T1]]]
// CHECK: gpu.wait [
// CHECK: return
func.func @host_only(%m: memref<16xf32>, %x: i64) -> i64 {
  %f = arith.constant 1.0 : f32
  %t0 = gpu.wait async
  %t1 = gpu.memset async [%t0] %m, %f : memref<16xf32>, f32
  gpu.wait [%t1]
  %a = func.call @encode(%x) : (i64) -> i64
  %b = arith.addi %a, %x : i64
  %c = func.call @encode(%b) : (i64) -> i64
  %t2 = gpu.wait async
  %t3 = gpu.memset async [%t2] %m, %f : memref<16xf32>, f32
  gpu.wait [%t3]
  return %c : i64
}

// Any other call keeps its synchronization.
// CHECK-LABEL: func.func @other_call
// CHECK: gpu.wait [
// CHECK: call @other
// CHECK: gpu.wait async
func.func @other_call(%m: memref<16xf32>, %x: i64) -> i64 {
  %f = arith.constant 1.0 : f32
  %t0 = gpu.wait async
  %t1 = gpu.memset async [%t0] %m, %f : memref<16xf32>, f32
  gpu.wait [%t1]
  %a = func.call @other(%x) : (i64) -> i64
  %t2 = gpu.wait async
  %t3 = gpu.memset async [%t2] %m, %f : memref<16xf32>, f32
  gpu.wait [%t3]
  return %a : i64
}
