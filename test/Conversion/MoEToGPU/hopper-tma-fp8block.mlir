// Blockwise FP8 grouped GEMMs on the TMA kernel's FP8 wgmma form (sm_90a,
// the default): 1 x 128 lhs tiles, 128 x 128 rhs tiles, K and N multiples of
// 128. The forward's rhs elements [E, K, N] are transposed to the K-major
// [E, N, K] that FP8 wgmma reads; the data gradient's (transpose_rhs) are
// K-major already. Each stage's four m64n128k32 wgmmas sum into a fresh
// partial, promoted into the f32 accumulators once complete.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a" | FileCheck %s
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a" | FileCheck %s --check-prefix=WGRAD
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a" | FileCheck %s --check-prefix=PAIR
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// VERIFY: ptxas accepted {{[0-9]+}} kernel modules for sm_90a
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// PTX-DAG: kernel module moe_transpose8_4x256x384_e4m3_kernel
// PTX-DAG: kernel module moe_tma_fp8block_gmm_300x256x384_e4_e4m3_e4m3_i32_kernel
// PTX-DAG: kernel module moe_tma_fp8block_gmm_300x384x256_e4_e4m3_e5m2_rhsT_i32_kernel
// PTX-DAG: kernel module moe_fp8block_quantize_4x256x384_t128x128_e4m3_pow2_f32_and_T_kernel
// PTX: setmaxnreg.inc.sync.aligned.u32{{.*}}232;
// PTX: wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e{{4m3|5m2}}
// With fp8block-exact the operands are dequantized for the bf16 kernels.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a fp8block-exact=true" | FileCheck %s --check-prefix=EXACT
// EXACT-NOT: moe_tma_fp8block
// EXACT-NOT: moe_transpose8
// EXACT: call @moe_wgmma_gmm_300x256x384_e4_bf16_i32_tma
// EXACT-NOT: moe_tma_fp8block

// CHECK-LABEL: func.func @forward
// CHECK: %[[AD:.*]], %[[AS:.*]] = moe.mx_unpack
// CHECK: %[[BD:.*]], %[[BS:.*]] = moe.mx_unpack
// CHECK: %[[BT:.*]] = call @moe_transpose8_4x256x384_e4m3(%[[BD]]) : (tensor<4x256x384xf8E4M3FN>) -> tensor<4x384x256xf8E4M3FN>
// CHECK: %[[Y:.*]] = call @moe_tma_fp8block_gmm_300x256x384_e4_e4m3_e4m3_i32(%[[AD]], %[[AS]], %[[BT]], %[[BS]], %arg4) : (tensor<300x256xf8E4M3FN>, tensor<300x2xf32>, tensor<4x384x256xf8E4M3FN>, tensor<4x2x3xf32>, tensor<5xi32>) -> tensor<300x384xf32>
// CHECK-NOT: moe.grouped_matmul
// CHECK: return %[[Y]]
func.func @forward(%xd: tensor<300x256xf8E4M3FN>, %xs: tensor<300x2xf32>,
                   %wd: tensor<4x256x384xf8E4M3FN>, %ws: tensor<4x2x3xf32>,
                   %o: tensor<5xi32>) -> tensor<300x384xf32> {
  %x = moe.mx_pack %xd, %xs : tensor<300x256xf8E4M3FN>, tensor<300x2xf32>
      -> !moe.fp8block<300x256xf8E4M3FN, block = [1, 128]>
  %w = moe.mx_pack %wd, %ws : tensor<4x256x384xf8E4M3FN>, tensor<4x2x3xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128]>
  %y = moe.grouped_matmul %x, %w, %o
      : !moe.fp8block<300x256xf8E4M3FN, block = [1, 128]>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128]>, tensor<5xi32>
      -> tensor<300x384xf32>
  return %y : tensor<300x384xf32>
}

// CHECK-LABEL: func.func @data_gradient
// CHECK-NOT: moe_transpose8
// CHECK: call @moe_tma_fp8block_gmm_300x384x256_e4_e4m3_e5m2_rhsT_i32(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %arg4) : (tensor<300x384xf8E4M3FN>, tensor<300x3xf32>, tensor<4x256x384xf8E5M2>, tensor<4x2x3xf32>, tensor<5xi32>) -> tensor<300x256xf32>
func.func @data_gradient(%dyd: tensor<300x384xf8E4M3FN>, %dys: tensor<300x3xf32>,
                         %wd: tensor<4x256x384xf8E5M2>, %ws: tensor<4x2x3xf32>,
                         %o: tensor<5xi32>) -> tensor<300x256xf32> {
  %dy = moe.mx_pack %dyd, %dys : tensor<300x384xf8E4M3FN>, tensor<300x3xf32>
      -> !moe.fp8block<300x384xf8E4M3FN, block = [1, 128]>
  %w = moe.mx_pack %wd, %ws : tensor<4x256x384xf8E5M2>, tensor<4x2x3xf32>
      -> !moe.fp8block<4x256x384xf8E5M2, block = [1, 128, 128]>
  %dx = moe.grouped_matmul %dy, %w, %o transpose_rhs
      : !moe.fp8block<300x384xf8E4M3FN, block = [1, 128]>,
        !moe.fp8block<4x256x384xf8E5M2, block = [1, 128, 128]>, tensor<5xi32>
      -> tensor<300x256xf32>
  return %dx : tensor<300x256xf32>
}

// A weight quantized in the same function (as in training): its quantize
// kernel writes the K-major copy beside the data, and no transpose runs.
// CHECK-LABEL: func.func @quantized
// CHECK-NOT: moe_transpose8
// CHECK: %[[Q:.*]]:3 = call @moe_fp8block_quantize_4x256x384_t128x128_e4m3_pow2_f32_and_T(%arg1) : (tensor<4x256x384xf32>) -> (tensor<4x256x384xf8E4M3FN>, tensor<4x2x3xf32>, tensor<4x384x256xf8E4M3FN>)
// CHECK-NOT: moe_transpose8
// CHECK: call @moe_tma_fp8block_gmm_300x256x384_e4_e4m3_e4m3_i32(%{{.*}}, %{{.*}}, %[[Q]]#2, %{{.*}}, %arg2)
// CHECK: call @moe_tma_fp8block_gmm_300x384x256_e4_e4m3_e4m3_rhsT_i32(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %arg2)
// CHECK-NOT: moe_transpose8
// CHECK: return
func.func @quantized(%x: tensor<300x256xf32>, %w: tensor<4x256x384xf32>,
                     %o: tensor<5xi32>, %dy: tensor<300x384xf32>)
    -> (tensor<300x384xf32>, tensor<300x256xf32>) {
  %xq = moe.quantize %x : tensor<300x256xf32>
      -> !moe.fp8block<300x256xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %xq, %wq, %o
      : !moe.fp8block<300x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<300x384xf32>
  %dyq = moe.quantize %dy : tensor<300x384xf32>
      -> !moe.fp8block<300x384xf8E4M3FN, block = [1, 128], pow2>
  %dx = moe.grouped_matmul %dyq, %wq, %o transpose_rhs
      : !moe.fp8block<300x384xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<300x256xf32>
  return %y, %dx : tensor<300x384xf32>, tensor<300x256xf32>
}

// The transpose: 64 x 64 byte tiles, grid (N / 64, K / 64, E).
// CHECK-LABEL: func.func private @moe_transpose8_4x256x384_e4m3(
// CHECK-SAME: moe.dedicated_kernel = "8-bit transpose"
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c6, {{.*}} = %c4, {{.*}} = %c4{{.*}}) threads({{.*}}) in ({{.*}} = %c256,

// The GEMM: 384 threads (the producer warpgroup, two consumers), the
// tensor maps of 128 x 128 byte boxes, four wgmmas a stage into a fresh
// partial, the stage handed back, then the promotion.
// CHECK-LABEL: func.func private @moe_tma_fp8block_gmm_300x256x384_e4_e4m3_e4m3_i32(
// CHECK-SAME: moe.dedicated_kernel = "cp.async.bulk.tensor + wgmma.mma_async f8, promoted every 128"
// The f32 result [300, 384] (boxes of 64 rows x 32), lhs [300, 256] and
// the K-major rhs [4 * 384, 256] (boxes of 128 x 128 bytes).
// CHECK: call @moertTensorMap2D({{.*}}, %c4_i64, %c384_i64, %c300_i64, %c1536_i64, %c32_i64, %c64_i64)
// CHECK: call @moertTensorMap2D({{.*}}, %c1_i64, %c256_i64, %c300_i64{{.*}}, %c256_i64{{.*}}, %c128_i64, %c128_i64{{.*}})
// CHECK: call @moertTensorMap2D({{.*}}, %c1_i64{{.*}}, %c256_i64{{.*}}, %c1536_i64{{.*}}, %c256_i64{{.*}}, %c128_i64{{.*}}, %c128_i64{{.*}})
// CHECK: gpu.launch
// CHECK: nvvm.cp.async.bulk.tensor.shared.cluster.global
// CHECK: nvvm.wgmma.fence.aligned
// CHECK: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 128, k = 32>, D[<f32>, <zero>], A[<e4m3>, <one>, <row>], B[<e4m3>, <one>, <col>]
// CHECK-COUNT-3: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 128, k = 32>, D[<f32>, <one>]
// CHECK-NOT: nvvm.wgmma.mma_async
// CHECK: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: nvvm.mbarrier.arrive
// CHECK: llvm.intr.fma

// The fused quantize: codes to shared memory by column, then 16-byte rows.
// CHECK-LABEL: func.func private @moe_fp8block_quantize_4x256x384_t128x128_e4m3_pow2_f32_and_T(
// CHECK: llvm.store {{.*}} : i8, !llvm.ptr<3>
// CHECK: nvvm.barrier0
// CHECK: llvm.store {{.*}} : vector<4xi32>, !llvm.ptr<1>

// A weight gradient of 128 x 1 operands over a dispatch's groups padded to
// 128 rows: both operands quantized transposed ([K, R] and [N, R], rows
// rounded up to 128: the group rows are the MMAs' K; only the rows before
// the groups' end, which nothing past reads: `_live_`), then the TMA
// kernel's FP8 weight-gradient form. Without the padding proof the operands are
// dequantized for the bf16 kernel.
// WGRAD-LABEL: func.func @weight_gradient
// WGRAD: %[[S:.*]], %[[O:.*]], %{{.*}}, %{{.*}} = moe.dispatch
// WGRAD: %[[X:.*]]:2 = call @moe_fp8block_quantize_1020x256_t128x1_e4m3_pow2_f32_T_live_i32(%[[S]], %[[O]]) : (tensor<1020x256xf32>, tensor<5xi32>) -> (tensor<256x1024xf8E4M3FN>, tensor<8x256xf32>)
// WGRAD: %[[DY:.*]]:2 = call @moe_fp8block_quantize_1020x384_t128x1_e4m3_pow2_f32_T_live_i32(%arg2, %[[O]]) : (tensor<1020x384xf32>, tensor<5xi32>) -> (tensor<384x1024xf8E4M3FN>, tensor<8x384xf32>)
// WGRAD: call @moe_tma_fp8block_wgrad_1020x256x384_e4_e4m3_e4m3_i32(%[[X]]#0, %[[X]]#1, %[[DY]]#0, %[[DY]]#1, %[[O]])
// WGRAD-NOT: moe.grouped_matmul_wgrad
// WGRAD-LABEL: func.func @weight_gradient_unpadded
// WGRAD-NOT: moe_tma_fp8block_wgrad
// WGRAD: call @moe_wgmma_wgrad
func.func @weight_gradient(%x: tensor<512x256xf32>, %idx: tensor<512x1xi32>,
                           %dy: tensor<1020x384xf32>) -> tensor<4x256x384xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %xq = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dyq = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %xq, %dyq, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  return %dw : tensor<4x256x384xf32>
}

func.func @weight_gradient_unpadded(%x: tensor<1024x256xf32>, %dy: tensor<1024x384xf32>,
                                    %o: tensor<5xi32>) -> tensor<4x256x384xf32> {
  %xq = moe.quantize %x : tensor<1024x256xf32>
      -> !moe.fp8block<1024x256xf8E4M3FN, block = [128, 1], pow2>
  %dyq = moe.quantize %dy : tensor<1024x384xf32>
      -> !moe.fp8block<1024x384xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %xq, %dyq, %o
      : !moe.fp8block<1024x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1024x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  return %dw : tensor<4x256x384xf32>
}

// The dispatched rows quantized in 1 x 128 tiles (the forward GEMM's lhs)
// and 128 x 1 tiles (the weight gradient's): one pair kernel reads them once
// and writes both, the columnwise data transposed.
// WGRAD-LABEL: func.func @paired
// WGRAD: %[[S:.*]], %[[O:.*]], %{{.*}}, %{{.*}} = moe.dispatch
// WGRAD: %[[P:.*]]:4 = call @moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_f32_live_i32(%[[S]], %[[O]]) : (tensor<1020x256xf32>, tensor<5xi32>) -> (tensor<1020x256xf8E4M3FN>, tensor<1020x2xf32>, tensor<256x1024xf8E4M3FN>, tensor<8x256xf32>)
// WGRAD: moe.mx_pack %[[P]]#0, %[[P]]#1
// WGRAD: call @moe_tma_fp8block_gmm_1020x256x384_e4_e4m3_e4m3_i32(
// WGRAD: %[[DY:.*]]:2 = call @moe_fp8block_quantize_1020x384_t128x1_e4m3_pow2_f32_T_live_i32(%arg3, %[[O]])
// WGRAD: call @moe_tma_fp8block_wgrad_1020x256x384_e4_e4m3_e4m3_i32(%[[P]]#2, %[[P]]#3, %[[DY]]#0, %[[DY]]#1, %[[O]])
// WGRAD-NOT: moe.quantize
// WGRAD: return
// A pair's CTA has 512 threads, 8 of the region's rows each.
// PAIR-LABEL: func.func private @moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_f32_live_i32(
// PAIR: gpu.launch blocks({{.*}}) in (%{{.*}} = %c16, {{.*}}) threads({{.*}}) in (%{{.*}} = %c512, {{.*}}) dynamic_shared_memory_size %c25088_i32
func.func @paired(%x: tensor<512x256xf32>, %idx: tensor<512x1xi32>,
                  %w: tensor<4x256x384xf32>, %dy: tensor<1020x384xf32>)
    -> (tensor<1020x384xf32>, tensor<4x256x384xf32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %xq = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %xq, %wq, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<1020x384xf32>
  %xc = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dyc = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %xc, %dyc, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  return %y, %dw : tensor<1020x384xf32>, tensor<4x256x384xf32>
}

// A SwiGLU's result quantized in both tilings: the pair kernel computes it
// from h (and the SwiGLU's gradient from h and da), so the op is gone.
// WGRAD-LABEL: func.func @paired_swiglu
// WGRAD-NOT: moe.swiglu
// WGRAD: %[[A:.*]]:4 = call @moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_f32_live_i32_of_swiglu(%arg2, %[[O:.*]]) : (tensor<1020x512xf32>, tensor<5xi32>)
// WGRAD: %[[DH:.*]]:4 = call @moe_fp8block_quantize_pair_1020x512_e4m3_pow2_e4m3_pow2_f32_of_swiglu_grad(%arg2, %arg3) : (tensor<1020x512xf32>, tensor<1020x256xf32>)
// WGRAD-NOT: moe.swiglu
// WGRAD: return
func.func @paired_swiglu(%x: tensor<512x256xf32>, %idx: tensor<512x1xi32>,
                         %h: tensor<1020x512xf32>, %da: tensor<1020x256xf32>,
                         %w2: tensor<4x256x384xf32>, %dy: tensor<1020x384xf32>)
    -> (tensor<1020x384xf32>, tensor<4x256x384xf32>, tensor<1020x512xf8E4M3FN>,
        tensor<4x256x512xf32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %a = moe.swiglu %h : tensor<1020x512xf32> -> tensor<1020x256xf32>
  %aq = moe.quantize %a : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w2 : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %aq, %wq, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<1020x384xf32>
  %ac = moe.quantize %a : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dyc = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw2 = moe.grouped_matmul_wgrad %ac, %dyc, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  // (dh's rowwise data is returned: every row is computed, no `_live_`.)
  %dh = moe.swiglu_grad %h, %da
      : tensor<1020x512xf32>, tensor<1020x256xf32> -> tensor<1020x512xf32>
  %dhq = moe.quantize %dh : tensor<1020x512xf32>
      -> !moe.fp8block<1020x512xf8E4M3FN, block = [1, 128], pow2>
  %dhd, %dhs = moe.mx_unpack %dhq : !moe.fp8block<1020x512xf8E4M3FN, block = [1, 128], pow2>
      -> tensor<1020x512xf8E4M3FN>, tensor<1020x4xf32>
  %sc = moe.quantize %s : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dhc = moe.quantize %dh : tensor<1020x512xf32>
      -> !moe.fp8block<1020x512xf8E4M3FN, block = [128, 1], pow2>
  %dw1 = moe.grouped_matmul_wgrad %sc, %dhc, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x512xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x512xf32>
  return %y, %dw2, %dhd, %dw1
      : tensor<1020x384xf32>, tensor<4x256x384xf32>, tensor<1020x512xf8E4M3FN>,
        tensor<4x256x512xf32>
}

// A SwiGLU's result that something else reads too stays an op: the pair
// kernel reads it.
// WGRAD-LABEL: func.func @swiglu_read_elsewhere
// WGRAD: %[[A:.*]] = moe.swiglu
// WGRAD: call @moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_f32_live_i32(%[[A]],
func.func @swiglu_read_elsewhere(%x: tensor<512x256xf32>, %idx: tensor<512x1xi32>,
                                 %h: tensor<1020x512xf32>, %w2: tensor<4x256x384xf32>,
                                 %dy: tensor<1020x384xf32>)
    -> (tensor<1020x384xf32>, tensor<4x256x384xf32>, tensor<1020x256xf32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %a = moe.swiglu %h : tensor<1020x512xf32> -> tensor<1020x256xf32>
  %aq = moe.quantize %a : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w2 : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %aq, %wq, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<1020x384xf32>
  %ac = moe.quantize %a : tensor<1020x256xf32>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dyc = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw2 = moe.grouped_matmul_wgrad %ac, %dyc, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  return %y, %dw2, %a : tensor<1020x384xf32>, tensor<4x256x384xf32>, tensor<1020x256xf32>
}

// A SwiGLU with a bf16 result (rounded before it is quantized) stays an
// op: the pair kernel reads its result.
// WGRAD-LABEL: func.func @swiglu_bf16
// WGRAD: %[[A:.*]] = moe.swiglu
// WGRAD: call @moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_bf16_live_i32(%[[A]],
func.func @swiglu_bf16(%x: tensor<512x256xf32>, %idx: tensor<512x1xi32>,
                       %h: tensor<1020x512xf32>, %w2: tensor<4x256x384xf32>,
                       %dy: tensor<1020x384xf32>)
    -> (tensor<1020x384xf32>, tensor<4x256x384xf32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %a = moe.swiglu %h : tensor<1020x512xf32> -> tensor<1020x256xbf16>
  %aq = moe.quantize %a : tensor<1020x256xbf16>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w2 : tensor<4x256x384xf32>
      -> !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %aq, %wq, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<1020x384xf32>
  %ac = moe.quantize %a : tensor<1020x256xbf16>
      -> !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>
  %dyc = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw2 = moe.grouped_matmul_wgrad %ac, %dyc, %o
      : !moe.fp8block<1020x256xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x256x384xf32>
  return %y, %dw2 : tensor<1020x384xf32>, tensor<4x256x384xf32>
}

// The FP8 weight gradient: K-major boxes of both transposed operands.
// WGRAD-LABEL: func.func private @moe_tma_fp8block_wgrad_1020x256x384_e4_e4m3_e4m3_i32(
// WGRAD-SAME: moe.dedicated_kernel = "cp.async.bulk.tensor + wgmma.mma_async f8 weight gradient, promoted every 128"
// WGRAD: call @moertTensorMap2D({{.*}}, %c1_i64{{.*}}, %c1024_i64{{.*}}, %c256_i64{{.*}}, %c1024_i64{{.*}}, %c128_i64{{.*}}, %c128_i64{{.*}})
// WGRAD: call @moertTensorMap2D({{.*}}, %c1_i64{{.*}}, %c1024_i64{{.*}}, %c384_i64{{.*}}, %c1024_i64{{.*}}, %c128_i64{{.*}}, %c128_i64{{.*}})
// WGRAD: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 128, k = 32>, D[<f32>, <zero>], A[<e4m3>, <one>, <row>], B[<e4m3>, <one>, <col>]
