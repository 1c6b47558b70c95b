// MXFP8 grouped GEMMs on Hopper: FP8 wgmma per 32-wide K slice into a fresh
// accumulator, promoted into the f32 result with both operands' E8M0 scales.
// The IR -moe-gpu-dedicated-kernels{chip=sm_90a} produces, the PTX of the
// whole GPU pipeline, and ptxas accepting it for sm_90a. Nothing of it runs
// here.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a fp8-mma=true" | FileCheck %s
// RUN: moe-compile %s --target=sm_90a --mxfp8-fp8-mma --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
//
// Chips without the kernel keep the generic path.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_80 fp8-mma=true" | FileCheck %s --check-prefix=NOKERNEL
// By default MXFP8 goes through its exact bf16 dequantization to the bf16
// wgmma kernel (FP8 tensor-core sums are not exact). The TMA kernel reads
// an MX lhs given as elements and scales (here the function's) 8-bit and
// dequantizes it in shared memory; the weights go through the dequantize
// kernel:
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s --check-prefix=EXACT
// EXACT-LABEL: func.func @mxfp8(
// EXACT-SAME: %[[AD:[^:]*]]: tensor<200x128xf8E4M3FN>, %[[AS:[^:]*]]: tensor<200x4xf8E8M0FNU>
// EXACT-NOT: moe_wgmma_mx
// EXACT-NOT: moe_mx_dequantize_200x128
// EXACT: %[[W:.*]] = call @moe_mx_dequantize_3x128x256_a1_e4m3_to_bf16(
// EXACT: call @moe_wgmma_gmm_200x128x256_e3_bf16_i32_tma_e4m3_lhs(%[[AD]], %[[AS]], %[[W]], 
// EXACT-LABEL: func.func @kernels_shape
// EXACT: call @moe_mx_dequantize_16x256x128_a1_e5m2_to_bf16(
// EXACT: call @moe_wgmma_gmm_4576x256x128_e16_bf16_i64(

// VERIFY: ptxas accepted 10 kernel modules for sm_90a

// PTX-LABEL: kernel module moe_wgmma_mx_gmm_200x128x256_e3_e4m3_e4m3_i32_kernel
// PTX: .target sm_90a
// PTX: cp.async.cg.shared.global
// PTX: cp.async.wait_group 1;
// PTX: fence.proxy.async.shared::cta;
// PTX: bar.sync 0;
// PTX: wgmma.fence.sync.aligned;
// The partial: scale-d = 0 (a fresh accumulator), no transpose immediates
// (both operands K-major).
// PTX: setp.ne.b32 p, 0, 0;
// PTX-NEXT: wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {{.*}}, p, 1, 1;
// PTX: wgmma.commit_group.sync.aligned;
// PTX: wgmma.wait_group.sync.aligned 0;
// Promotion: acc = fma(partial * 2^sa, 2^sb, acc).
// PTX: mul.rn.f32
// PTX: fma.rn.f32
// PTX-LABEL: kernel module moe_wgmma_mx_gmm_4576x256x128_e16_e4m3_e5m2_i64_kernel
// PTX: wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e5m2

// NOKERNEL-NOT: moe_wgmma
// NOKERNEL-NOT: gpu.launch

// CHECK-LABEL: func.func @mxfp8
// CHECK-SAME: %[[XD:[a-z0-9]+]]: tensor<200x128xf8E4M3FN>, %[[XS:[a-z0-9]+]]: tensor<200x4xf8E8M0FNU>
// CHECK-SAME: %[[O:[a-z0-9]+]]: tensor<4xi32>
// CHECK: %[[X:.*]] = moe.mx_pack %[[XD]], %[[XS]]
// CHECK: %[[W:.*]] = moe.mx_pack
// CHECK: %[[AD:.*]], %[[AS:.*]] = moe.mx_unpack %[[X]]
// CHECK: %[[BD:.*]], %[[BS:.*]] = moe.mx_unpack %[[W]]
// CHECK: %[[Y:.*]] = call @moe_wgmma_mx_gmm_200x128x256_e3_e4m3_e4m3_i32(%[[AD]], %[[AS]], %[[BD]], %[[BS]], %[[O]]) : (tensor<200x128xf8E4M3FN>, tensor<200x4xf8E8M0FNU>, tensor<3x128x256xf8E4M3FN>, tensor<3x4x256xf8E8M0FNU>, tensor<4xi32>) -> tensor<200x256xf32>
// CHECK-NOT: moe.grouped_matmul
// CHECK: return %[[Y]]
func.func @mxfp8(%xd: tensor<200x128xf8E4M3FN>, %xs: tensor<200x4xf8E8M0FNU>,
                 %wd: tensor<3x128x256xf8E4M3FN>, %ws: tensor<3x4x256xf8E8M0FNU>,
                 %off: tensor<4xi32> {moe.test_range = [0, 200]}) -> tensor<200x256xf32> {
  %x = moe.mx_pack %xd, %xs : tensor<200x128xf8E4M3FN>, tensor<200x4xf8E8M0FNU>
      -> !moe.mx<200x128xf8E4M3FN, axis = 1>
  %w = moe.mx_pack %wd, %ws : tensor<3x128x256xf8E4M3FN>, tensor<3x4x256xf8E8M0FNU>
      -> !moe.mx<3x128x256xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %x, %w, %off
      : !moe.mx<200x128xf8E4M3FN, axis = 1>, !moe.mx<3x128x256xf8E4M3FN, axis = 1>,
        tensor<4xi32> -> tensor<200x256xf32>
  return %y : tensor<200x256xf32>
}

// The shape of test/Integration/GPU/kernels.mlir (N = 128, K = 256), here
// with i64 offsets and an e5m2 rhs.
// CHECK-LABEL: func.func @kernels_shape
// CHECK: call @moe_wgmma_mx_gmm_4576x256x128_e16_e4m3_e5m2_i64(
func.func @kernels_shape(%xd: tensor<4576x256xf8E4M3FN>, %xs: tensor<4576x8xf8E8M0FNU>,
                         %wd: tensor<16x256x128xf8E5M2>, %ws: tensor<16x8x128xf8E8M0FNU>,
                         %off: tensor<17xi64> {moe.test_range = [0, 4576]}) -> tensor<4576x128xf32> {
  %x = moe.mx_pack %xd, %xs : tensor<4576x256xf8E4M3FN>, tensor<4576x8xf8E8M0FNU>
      -> !moe.mx<4576x256xf8E4M3FN, axis = 1>
  %w = moe.mx_pack %wd, %ws : tensor<16x256x128xf8E5M2>, tensor<16x8x128xf8E8M0FNU>
      -> !moe.mx<16x256x128xf8E5M2, axis = 1>
  %y = moe.grouped_matmul %x, %w, %off
      : !moe.mx<4576x256xf8E4M3FN, axis = 1>, !moe.mx<16x256x128xf8E5M2, axis = 1>,
        tensor<17xi64> -> tensor<4576x128xf32>
  return %y : tensor<4576x128xf32>
}

// Ineligible: K not a multiple of 64, N not a multiple of 128, transposed
// weights (blocks along the rhs's last axis). They take the exact path, as
// without fp8-mma: operands dequantized to bf16 (here by round trips of
// their quantization) for the bf16 wgmma kernels.
// CHECK-LABEL: func.func @ineligible
// CHECK-NOT: call @moe_wgmma_mx
// CHECK: call @moe_wgmma_gmm_64x96x128_e2_bf16_i32_tma
// CHECK: call @moe_wgmma_gmm_64x128x64_e2_bf16_i32_tma
// CHECK: call @moe_wgmma_gmm_64x128x128_e2_bf16_rhsT_i32
// CHECK-NOT: call @moe_wgmma_mx
// CHECK: return
func.func @ineligible(%x96b: tensor<64x96xbf16>, %w96b: tensor<2x96x128xbf16>,
                      %xb: tensor<64x128xbf16>, %w64b: tensor<2x128x64xbf16>,
                      %wtb: tensor<2x128x128xbf16>, %off: tensor<3xi32>)
    -> (tensor<64x128xf32>, tensor<64x64xf32>, tensor<64x128xf32>) {
  %x96 = moe.quantize %x96b : tensor<64x96xbf16> -> !moe.mx<64x96xf8E4M3FN, axis = 1>
  %w96 = moe.quantize %w96b : tensor<2x96x128xbf16> -> !moe.mx<2x96x128xf8E4M3FN, axis = 1>
  %x = moe.quantize %xb : tensor<64x128xbf16> -> !moe.mx<64x128xf8E4M3FN, axis = 1>
  %w64 = moe.quantize %w64b : tensor<2x128x64xbf16> -> !moe.mx<2x128x64xf8E4M3FN, axis = 1>
  %wt = moe.quantize %wtb : tensor<2x128x128xbf16> -> !moe.mx<2x128x128xf8E4M3FN, axis = 2>
  %a = moe.grouped_matmul %x96, %w96, %off
      : !moe.mx<64x96xf8E4M3FN, axis = 1>, !moe.mx<2x96x128xf8E4M3FN, axis = 1>,
        tensor<3xi32> -> tensor<64x128xf32>
  %b = moe.grouped_matmul %x, %w64, %off
      : !moe.mx<64x128xf8E4M3FN, axis = 1>, !moe.mx<2x128x64xf8E4M3FN, axis = 1>,
        tensor<3xi32> -> tensor<64x64xf32>
  %c = moe.grouped_matmul %x, %wt, %off transpose_rhs
      : !moe.mx<64x128xf8E4M3FN, axis = 1>, !moe.mx<2x128x128xf8E4M3FN, axis = 2>,
        tensor<3xi32> -> tensor<64x128xf32>
  return %a, %b, %c : tensor<64x128xf32>, tensor<64x64xf32>, tensor<64x128xf32>
}

// The kernel function: both operands' data and scales, FP8 wgmma with a
// fresh accumulator (scale-d zero), A K-major (row) and B K-major (col).
// CHECK-LABEL: func.func private @moe_wgmma_mx_gmm_200x128x256_e3_e4m3_e4m3_i32(
// CHECK-SAME: moe.dedicated_kernel = "wgmma.mma_async f8 promoted"
// CHECK: gpu.launch
// CHECK-SAME: dynamic_shared_memory_size
// CHECK: nvvm.cp.async.shared.global
// CHECK: nvvm.wgmma.fence.aligned
// CHECK-NEXT: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 128, k = 32>, D[<f32>, <zero>], A[<e4m3>, <one>, <row>], B[<e4m3>, <one>, <col>]
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: llvm.intr.fma
// CHECK-LABEL: func.func private @moe_wgmma_mx_gmm_4576x256x128_e16_e4m3_e5m2_i64(
// CHECK: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 128, k = 32>, D[<f32>, <zero>], A[<e4m3>, <one>, <row>], B[<e5m2>, <one>, <col>]
