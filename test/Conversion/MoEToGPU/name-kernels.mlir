// Generic kernels take the name location of the ops they came from (the
// whole pipeline: name-kernels-pipeline.mlir).
// RUN: moe-opt %s --moe-gpu-name-kernels | FileCheck %s

// CHECK-LABEL: func.func @step
// CHECK: gpu.launch {{.*}} module(@step_optimizer_kernel) function(@step_optimizer_kernel)
// CHECK: gpu.launch {{.*}} function(@step_model_layers_3_mlp_kernel)
// CHECK: gpu.launch {{.*}} function(@named_kernel)
// CHECK: gpu.launch blocks
// CHECK-NOT: function(
// CHECK: return
func.func @step(%m: memref<64xf32>) {
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %f = arith.constant 2.0 : f32
  gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
             threads(%tx, %ty, %tz) in (%a = %c64, %b = %c1, %c = %c1) {
    memref.store %f, %m[%tx] : memref<64xf32>
    gpu.terminator
  } loc("optimizer")
  gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
             threads(%tx, %ty, %tz) in (%a = %c64, %b = %c1, %c = %c1) {
    memref.store %f, %m[%tx] : memref<64xf32>
    gpu.terminator
  } loc(callsite(fused["model.layers.3.mlp", "x.mlir":1:1] at "caller"))
  gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
             threads(%tx, %ty, %tz) in (%a = %c64, %b = %c1, %c = %c1) {
    memref.store %f, %m[%tx] : memref<64xf32>
    gpu.terminator
  } {function = @named_kernel, module = @named_kernel} loc("lm_head")
  gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
             threads(%tx, %ty, %tz) in (%a = %c64, %b = %c1, %c = %c1) {
    memref.store %f, %m[%tx] : memref<64xf32>
    gpu.terminator
  } loc("x.mlir":2:2)
  return
}

