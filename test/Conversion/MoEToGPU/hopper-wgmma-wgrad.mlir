// Weight gradients on Hopper's warpgroup MMA: moe.grouped_matmul_wgrad with
// bf16 operands, or MXFP8 ones blocked along the rows (dequantized to bf16
// first, exactly), becomes the wgmma weight-gradient kernel (N % 256 == 0:
// the TMA kernel, hopper-wgmma-tma.mlir); the PTX of the
// whole GPU pipeline and ptxas accepting it for sm_90a. Nothing of it runs
// here (scripts/gpu-check.sh runs it against the CPU).
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_80 | FileCheck %s --check-prefix=NOKERNEL

// VERIFY: ptxas accepted 7 kernel modules for sm_90a

// The rows past the group are zero-filled copies (source size 0 or 16);
// the A tile is read transposed (the 4th immediate: trans-a = 1).
// PTX-LABEL: kernel module moe_wgmma_wgrad_200x128x128_e3_bf16_i32_kernel
// PTX: .target sm_90a
// PTX: cp.async.cg.shared.global [%{{.*}}], [%{{.*}}], 16, %r{{[0-9]+}};
// PTX: wgmma.fence.sync.aligned;
// PTX: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1, 1;
// PTX: wgmma.wait_group.sync.aligned 0;
// PTX-LABEL: kernel module moe_wgmma_wgrad_96x256x128_e4_bf16_i32_kernel

// NOKERNEL-NOT: moe_wgmma_wgrad
// NOKERNEL: moe.grouped_matmul_wgrad
// NOKERNEL-NOT: moe_wgmma_wgrad

// CHECK-LABEL: func.func @bf16
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<200x128xbf16>, %[[G:[a-z0-9]+]]: tensor<200x128xbf16>, %[[O:[a-z0-9]+]]: tensor<4xi32>
// CHECK: %[[W:.*]] = call @moe_wgmma_wgrad_200x128x128_e3_bf16_i32(%[[X]], %[[G]], %[[O]]) : (tensor<200x128xbf16>, tensor<200x128xbf16>, tensor<4xi32>) -> tensor<3x128x128xf32>
// CHECK-NOT: moe.grouped_matmul_wgrad
// CHECK: return %[[W]]
func.func @bf16(%x: tensor<200x128xbf16>, %g: tensor<200x128xbf16>,
                %off: tensor<4xi32> {moe.test_range = [0, 200]}) -> tensor<3x128x128xf32> {
  %w = moe.grouped_matmul_wgrad %x, %g, %off
      : tensor<200x128xbf16>, tensor<200x128xbf16>, tensor<4xi32> -> tensor<3x128x128xf32>
  return %w : tensor<3x128x128xf32>
}

// MXFP8 columnwise operands (blocks of 32 rows): dequantized, then the same
// kernel; the quantize-dequantize pairs are one round-trip kernel each.
// CHECK-LABEL: func.func @mxfp8
// CHECK: %[[XB:.*]] = call @moe_mx_round_trip_96x256_a0_e4m3_rceil_f32_to_bf16(%arg0)
// CHECK: %[[GB:.*]] = call @moe_mx_round_trip_96x128_a0_e5m2_rceil_f32_to_bf16(%arg1)
// CHECK: call @moe_wgmma_wgrad_96x256x128_e4_bf16_i32(%[[XB]], %[[GB]], %{{.*}})
func.func @mxfp8(%x: tensor<96x256xf32>, %g: tensor<96x128xf32>,
                 %off: tensor<5xi32> {moe.test_range = [0, 96]}) -> tensor<4x256x128xf32> {
  %xq = moe.quantize %x : tensor<96x256xf32> -> !moe.mx<96x256xf8E4M3FN, axis = 0>
  %gq = moe.quantize %g : tensor<96x128xf32> -> !moe.mx<96x128xf8E5M2, axis = 0>
  %w = moe.grouped_matmul_wgrad %xq, %gq, %off
      : !moe.mx<96x256xf8E4M3FN, axis = 0>, !moe.mx<96x128xf8E5M2, axis = 0>, tensor<5xi32> -> tensor<4x256x128xf32>
  return %w : tensor<4x256x128xf32>
}

// K not a multiple of 128: the TMA kernel's partial row tile; f32 operands
// keep the generic path.
// CHECK-LABEL: func.func @generic
// CHECK: call @moe_wgmma_wgrad_64x64x128_e2_bf16_i32_tma(
// CHECK: moe.grouped_matmul_wgrad %{{.*}} : tensor<64x128xf32>, tensor<64x128xf32>
// CHECK-NOT: moe.dequantize
func.func @generic(%x: tensor<64x64xbf16>, %g: tensor<64x128xbf16>,
                   %xf: tensor<64x128xf32>, %off: tensor<3xi32>)
    -> (tensor<2x64x128xf32>, tensor<2x128x128xf32>) {
  %a = moe.grouped_matmul_wgrad %x, %g, %off
      : tensor<64x64xbf16>, tensor<64x128xbf16>, tensor<3xi32> -> tensor<2x64x128xf32>
  %b = moe.grouped_matmul_wgrad %xf, %xf, %off
      : tensor<64x128xf32>, tensor<64x128xf32>, tensor<3xi32> -> tensor<2x128x128xf32>
  return %a, %b : tensor<2x64x128xf32>, tensor<2x128x128xf32>
}

// A weight gradient every user rounds to bf16 (a bf16 parameter's): the TMA
// kernel stores bf16 itself (_obf16) and the rounding goes.
// CHECK-LABEL: func.func @rounded_to_bf16
// CHECK: %[[W:.*]] = call @moe_wgmma_wgrad_512x128x256_e4_bf16_i32_tma_obf16({{.*}}) : ({{.*}}) -> tensor<4x128x256xbf16>
// CHECK-NOT: linalg.generic
// CHECK: return %[[W]]
// PTX-LABEL: kernel module moe_wgmma_wgrad_512x128x256_e4_bf16_i32_tma_obf16_kernel
// PTX: cvt.rn.bf16x2.f32
// PTX: cp.async.bulk.tensor.2d.global.shared::cta
func.func @rounded_to_bf16(%x: tensor<512x128xbf16>, %g: tensor<512x256xbf16>,
                           %off: tensor<5xi32> {moe.test_range = [0, 512]}) -> tensor<4x128x256xbf16> {
  %w = moe.grouped_matmul_wgrad %x, %g, %off
      : tensor<512x128xbf16>, tensor<512x256xbf16>, tensor<5xi32> -> tensor<4x128x256xf32>
  %e = tensor.empty() : tensor<4x128x256xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(a, b, c) -> (a, b, c)>, affine_map<(a, b, c) -> (a, b, c)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w : tensor<4x128x256xf32>) outs(%e : tensor<4x128x256xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<4x128x256xbf16>
  return %r : tensor<4x128x256xbf16>
}
