// A program of two TMA GEMMs on the GPU pipeline: the dedicated kernels'
// functions are inlined (their kernels keep their names) and the four
// tensor-map encodes (host-only) sit between launches of one stream: the
// host waits once, before the return.
// RUN: moe-opt %s --moe-gpu-pipeline="chip=sm_90a format=isa" \
// RUN:   --mlir-print-ir-after=moe-gpu-elide-host-syncs -o /dev/null 2>&1 | FileCheck %s

// CHECK-LABEL: func.func @two_gemms
// CHECK-NOT: call @moe_wgmma
// CHECK-NOT: gpu.wait [
// CHECK: call @moertTensorMap2D
// CHECK-NOT: gpu.wait [
// CHECK: gpu.launch_func async [{{.*}}] @moe_wgmma_gmm_200x128x256_e3_bf16_i32_tma_kernel::@moe_wgmma_gmm_200x128x256_e3_bf16_i32_tma_kernel
// CHECK-NOT: gpu.wait [
// CHECK: call @moertTensorMap2D
// CHECK-NOT: gpu.wait [
// CHECK: gpu.launch_func async [{{.*}}] @moe_wgmma_gmm_200x256x256_e3_bf16_i32_tma_kernel::@moe_wgmma_gmm_200x256x256_e3_bf16_i32_tma_kernel
// CHECK: gpu.wait [
// CHECK-NOT: gpu.wait [
// CHECK: return
func.func @two_gemms(%x: tensor<200x128xbf16>, %w: tensor<3x128x256xbf16>,
                     %w2: tensor<3x256x256xbf16>, %off: tensor<4xi32>) -> tensor<200x256xf32> {
  %y = moe.grouped_matmul %x, %w, %off
      : tensor<200x128xbf16>, tensor<3x128x256xbf16>, tensor<4xi32> -> tensor<200x256xf32>
  %yb = arith.truncf %y : tensor<200x256xf32> to tensor<200x256xbf16>
  %z = moe.grouped_matmul %yb, %w2, %off
      : tensor<200x256xbf16>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<200x256xf32>
  return %z : tensor<200x256xf32>
}
