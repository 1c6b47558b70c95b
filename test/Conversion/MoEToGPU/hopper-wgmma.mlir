// bf16 grouped GEMMs on Hopper's warpgroup MMA (wgmma): the IR
// -moe-gpu-dedicated-kernels{chip=sm_90a} produces, the PTX of the whole GPU
// pipeline, and ptxas accepting it for sm_90a. Nothing of it runs here.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
//
// Chips without the kernel keep the generic path.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_80 | FileCheck %s --check-prefix=NOKERNEL

// VERIFY: ptxas accepted 18 kernel modules for sm_90a

// PTX-LABEL: kernel module moe_wgmma_gmm_200x128x128_e3_bf16_i32_kernel
// PTX: .target sm_90a
// The descriptors: 128-byte swizzle (layout type 1 at bit 62), SBO 1024
// (bits 32-45: 64), LBO 8192 (bits 16-29: 512).
// PTX: or.b64 {{.*}}, 4611686293338849280;
// PTX: cp.async.cg.shared.global
// PTX: cp.async.wait_group 1;
// PTX: fence.proxy.async.shared::cta;
// PTX: bar.sync 0;
// PTX: wgmma.fence.sync.aligned;
// PTX: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 0, 1;
// Each iteration's MMAs complete before the next (two CTAs share an SM).
// PTX: wgmma.commit_group.sync.aligned;
// PTX-NEXT: wgmma.wait_group.sync.aligned 0;
// PTX-LABEL: kernel module moe_wgmma_gmm_4576x256x128_e16_bf16_i64_kernel
// PTX: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16
// A transposed rhs is read K-major: trans-b (the last immediate) is 0.
// PTX-LABEL: kernel module moe_wgmma_gmm_64x128x128_e2_bf16_rhsT_i32_kernel
// PTX: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 0, 0;

// NOKERNEL-NOT: moe_wgmma_gmm
// NOKERNEL-NOT: gpu.launch

// CHECK-LABEL: func.func @bf16
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<200x128xbf16>, %[[W:[a-z0-9]+]]: tensor<3x128x128xbf16>, %[[O:[a-z0-9]+]]: tensor<4xi32>
// CHECK: %[[Y:.*]] = call @moe_wgmma_gmm_200x128x128_e3_bf16_i32(%[[X]], %[[W]], %[[O]]) : (tensor<200x128xbf16>, tensor<3x128x128xbf16>, tensor<4xi32>) -> tensor<200x128xf32>
// CHECK-NOT: moe.grouped_matmul
// CHECK: return %[[Y]]
func.func @bf16(%x: tensor<200x128xbf16>, %w: tensor<3x128x128xbf16>,
                %off: tensor<4xi32> {moe.test_range = [0, 200]}) -> tensor<200x128xf32> {
  %y = moe.grouped_matmul %x, %w, %off
      : tensor<200x128xbf16>, tensor<3x128x128xbf16>, tensor<4xi32> -> tensor<200x128xf32>
  return %y : tensor<200x128xf32>
}

// The shape of test/Integration/GPU/kernels.mlir (N = 128, i64 offsets).
// CHECK-LABEL: func.func @kernels_shape
// CHECK: call @moe_wgmma_gmm_4576x256x128_e16_bf16_i64(
func.func @kernels_shape(%x: tensor<4576x256xbf16>, %w: tensor<16x256x128xbf16>,
                         %off: tensor<17xi64> {moe.test_range = [0, 4576]}) -> tensor<4576x128xf32> {
  %y = moe.grouped_matmul %x, %w, %off
      : tensor<4576x256xbf16>, tensor<16x256x128xbf16>, tensor<17xi64> -> tensor<4576x128xf32>
  return %y : tensor<4576x128xf32>
}

// Partial tiles (K not a multiple of 64, N not a multiple of 128) take the
// TMA kernel; f32 operands stay moe.grouped_matmul.
// The transposed rhs is eligible as it is (the kernel reads it K-major, no
// copy), and the MXFP8 pair (blocks along K) through its exact bf16
// dequantization (hopper-wgmma-mxfp8.mlir has the FP8 kernel), here one
// round-trip kernel per quantize-dequantize pair (the lhs's rows past the
// last group are unread: `_live`).
// CHECK-LABEL: func.func @ineligible
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<64x128xbf16>, %{{[a-z0-9]+}}: tensor<2x128x64xbf16>, %[[WT:[a-z0-9]+]]: tensor<2x128x128xbf16>
// CHECK: call @moe_wgmma_gmm_64x96x128_e2_bf16_i32_tma(
// CHECK: call @moe_wgmma_gmm_64x128x64_e2_bf16_i32_tma(
// CHECK-NOT: linalg.transpose
// CHECK: call @moe_wgmma_gmm_64x128x128_e2_bf16_rhsT_i32(%[[X]], %[[WT]],
// CHECK: moe.grouped_matmul %{{.*}} : tensor<64x128xf32>, tensor<2x128x128xf32>
// CHECK: %[[XB:.*]] = call @moe_mx_round_trip_64x128_a1_e4m3_rceil_bf16_to_bf16_live_i32(
// CHECK: %[[WB:.*]] = call @moe_mx_round_trip_2x128x128_a1_e4m3_rceil_bf16_to_bf16(
// CHECK: call @moe_wgmma_gmm_64x128x128_e2_bf16_i32(%[[XB]], %[[WB]],
// CHECK: return
func.func @ineligible(%x96: tensor<64x96xbf16>, %w96: tensor<2x96x128xbf16>,
                      %x: tensor<64x128xbf16>, %w64: tensor<2x128x64xbf16>,
                      %wt: tensor<2x128x128xbf16>, %xf: tensor<64x128xf32>,
                      %wf: tensor<2x128x128xf32>, %off: tensor<3xi32>)
    -> (tensor<64x128xf32>, tensor<64x64xf32>, tensor<64x128xf32>, tensor<64x128xf32>,
        tensor<64x128xf32>) {
  %a = moe.grouped_matmul %x96, %w96, %off
      : tensor<64x96xbf16>, tensor<2x96x128xbf16>, tensor<3xi32> -> tensor<64x128xf32>
  %b = moe.grouped_matmul %x, %w64, %off
      : tensor<64x128xbf16>, tensor<2x128x64xbf16>, tensor<3xi32> -> tensor<64x64xf32>
  %c = moe.grouped_matmul %x, %wt, %off transpose_rhs
      : tensor<64x128xbf16>, tensor<2x128x128xbf16>, tensor<3xi32> -> tensor<64x128xf32>
  %d = moe.grouped_matmul %xf, %wf, %off
      : tensor<64x128xf32>, tensor<2x128x128xf32>, tensor<3xi32> -> tensor<64x128xf32>
  %xq = moe.quantize %x : tensor<64x128xbf16> -> !moe.mx<64x128xf8E4M3FN, axis = 1>
  %wq = moe.quantize %wt : tensor<2x128x128xbf16> -> !moe.mx<2x128x128xf8E4M3FN, axis = 1>
  %e = moe.grouped_matmul %xq, %wq, %off
      : !moe.mx<64x128xf8E4M3FN, axis = 1>, !moe.mx<2x128x128xf8E4M3FN, axis = 1>,
        tensor<3xi32> -> tensor<64x128xf32>
  return %a, %b, %c, %d, %e : tensor<64x128xf32>, tensor<64x64xf32>, tensor<64x128xf32>,
      tensor<64x128xf32>, tensor<64x128xf32>
}

// A dispatch's rows past its last group that nothing reads (the GEMM's rows
// are combined back through the dispatch's positions): the `_live` variant
// leaves them unwritten instead of zeroing them. Its row and offsets
// arguments say so for the analysis (moe.group_rows, moe.group_offsets).
// CHECK-LABEL: func.func @live_rows
// CHECK: %[[Y:.*]] = call @moe_wgmma_gmm_128x128x128_e4_bf16_i32_live(
// CHECK: moe.combine %[[Y]]
// CHECK: func.func private @moe_wgmma_gmm_128x128x128_e4_bf16_i32_live(%{{[a-z0-9]+}}: tensor<128x128xbf16> {moe.group_rows}, %{{[a-z0-9]+}}: tensor<4x128x128xbf16>, %{{[a-z0-9]+}}: tensor<5xi32> {moe.group_offsets})
// PTX-LABEL: kernel module moe_wgmma_gmm_128x128x128_e4_bf16_i32_live_kernel
// PTX: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16
func.func @live_rows(%x: tensor<64x128xbf16>, %idx: tensor<64x2xi32>,
                     %cw: tensor<64x2xf32>, %w: tensor<4x128x128xbf16>) -> tensor<64x128xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4)
      : tensor<64x128xbf16>, tensor<64x2xi32> -> tensor<128x128xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<64x2xi32>
  %y = moe.grouped_matmul %s, %w, %o
      : tensor<128x128xbf16>, tensor<4x128x128xbf16>, tensor<5xi32> -> tensor<128x128xf32>
  %out = moe.combine %y, %cw, %p : tensor<128x128xf32>, tensor<64x2xf32>, tensor<64x2xi32> -> tensor<64x128xf32>
  return %out : tensor<64x128xf32>
}
