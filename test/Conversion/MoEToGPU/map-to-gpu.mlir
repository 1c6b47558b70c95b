// RUN: moe-opt %s --convert-moe-to-linalg=parallel=true --convert-elementwise-to-linalg --one-shot-bufferize="bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map" \
// RUN:   --moe-copy-to-linalg --moe-gpu-map-loops=block-size=64 --gpu-map-parallel-loops --convert-parallel-loops-to-gpu \
// RUN:   --lower-affine --canonicalize --moe-gpu-device-buffers --gpu-kernel-outlining | FileCheck %s

// Every elementwise generic becomes one kernel over the flattened iteration
// space, each thread taking 4 consecutive elements in 16-byte vectors:
// 512 x 128 / 4 / 64 threads = 256 blocks of 64 threads. Buffers live on
// the device; nothing is loaded or stored on the host.
// CHECK-LABEL: func.func @swiglu
// CHECK-NOT: memref.alloc
// CHECK: %[[OUT:.*]] = gpu.alloc () : memref<512x128xf32>
// CHECK: gpu.launch_func @swiglu_kernel::@swiglu_kernel blocks in (%c256, %c1, %c1) threads in (%c64, %c1, %c1)
// CHECK-NOT: memref.load
// CHECK: return %[[OUT]]
func.func @swiglu(%h: tensor<512x256xf32>) -> tensor<512x128xf32> {
  %a = moe.swiglu %h : tensor<512x256xf32> -> tensor<512x128xf32>
  return %a : tensor<512x128xf32>
}

// The grouped matmul: kernels finding each row's group, computing the
// outputs (rows x N threads, a K loop each, none for rows in no group) and
// rounding f32 -> bf16.
// CHECK-LABEL: func.func @grouped_matmul
// CHECK-COUNT-3: gpu.launch_func
// CHECK-NOT: gpu.launch_func
// CHECK: gpu.module
// CHECK: gpu.func
// CHECK: scf.for
func.func @grouped_matmul(%x: tensor<96x32xbf16>, %w: tensor<4x32x16xbf16>,
                          %off: tensor<5xi32>) -> tensor<96x16xbf16> {
  %y = moe.grouped_matmul %x, %w, %off
      : tensor<96x32xbf16>, tensor<4x32x16xbf16>, tensor<5xi32> -> tensor<96x16xbf16>
  return %y : tensor<96x16xbf16>
}

// A constant becomes a device buffer filled from its host global, freed at
// the end of the function (each call would leak it otherwise).
// CHECK-LABEL: func.func @constant
// CHECK: %[[G:.*]] = memref.get_global
// CHECK: %[[D:.*]] = gpu.alloc () : memref<4xf32>
// CHECK: gpu.memcpy %[[D]], %[[G]]
// CHECK: gpu.launch_func {{.*}}args(%{{.*}}, %[[D]] :
// CHECK: gpu.dealloc %[[D]]
// CHECK-NEXT: return
func.func @constant(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = arith.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %y = arith.addf %x, %c : tensor<4xf32>
  return %y : tensor<4xf32>
}

// A constant's device copy that the function returns stays allocated (the
// caller frees the result).
// CHECK-LABEL: func.func @returned_constant
// CHECK: %[[D:.*]] = gpu.alloc () : memref<2x4xf32>
// CHECK: gpu.memcpy %[[D]]
// CHECK-NOT: gpu.dealloc
// CHECK: return %[[D]]
func.func @returned_constant() -> tensor<2x4xf32> {
  %c = arith.constant dense<1.0> : tensor<2x4xf32>
  return %c : tensor<2x4xf32>
}

// A reduction to one scalar has no parallel dimension: it runs as a kernel
// of one thread instead of on the host, its sum in a register (loaded
// before the loop, stored once after it).
// CHECK-LABEL: func.func @total
// CHECK: gpu.launch_func @total_kernel_{{[0-9]+}}::@total_kernel blocks in (%[[ONE:.*]], %[[ONE]], %[[ONE]]) threads in (%[[ONE]], %[[ONE]], %[[ONE]]) args(%{{.*}}, %arg0 : memref<64xf32>
// CHECK: gpu.func @total_kernel(%[[OUT:.*]]: memref<f32>, %[[X:.*]]: memref<64xf32>
// CHECK: %[[INIT:.*]] = memref.load %[[OUT]][]
// CHECK: %[[SUM:.*]] = scf.for {{.*}} iter_args(%[[ACC:.*]] = %[[INIT]]) -> (f32)
// CHECK: %[[T:.*]] = memref.load %[[X]]
// CHECK: %[[NEXT:.*]] = arith.addf %[[T]], %[[ACC]]
// CHECK-NOT: memref.store
// CHECK: scf.yield %[[NEXT]]
// CHECK: memref.store %[[SUM]], %[[OUT]][]
func.func @total(%x: tensor<64xf32>) -> tensor<f32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<f32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<f32>) -> tensor<f32>
  %s = linalg.reduce ins(%x : tensor<64xf32>) outs(%init : tensor<f32>) dimensions = [0]
    (%a: f32, %b: f32) {
      %r = arith.addf %a, %b : f32
      linalg.yield %r : f32
    }
  return %s : tensor<f32>
}
