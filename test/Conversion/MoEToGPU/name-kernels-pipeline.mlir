// Through the whole GPU pipeline, a generic kernel is named after the model
// part its op belongs to; a dedicated kernel keeps its own name.
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx -o %t.so
// RUN: FileCheck %s < %t.ptx

// CHECK-DAG: .entry loss_model_norm_kernel
// CHECK-DAG: .entry moe_xent_lse_64x1000_f32_i32_kernel
func.func @loss(%x: tensor<64x1000xf32>, %w: tensor<1000xf32>, %y: tensor<64xi32>) -> tensor<f32> {
  %n = moe.rms_norm %x, %w eps(1.0e-6) : tensor<64x1000xf32>, tensor<1000xf32> -> tensor<64x1000xf32> loc("model.norm")
  %l = moe.cross_entropy %n, %y : tensor<64x1000xf32>, tensor<64xi32> -> tensor<f32> loc("loss")
  return %l : tensor<f32>
}
