// bf16 grouped GEMMs with N % 256 == 0 on Hopper's TMA + warp-specialized
// wgmma kernel: the host code that encodes the tensor maps, the launch (a
// persistent grid of at most 132 CTAs of 384 threads, four 48 KiB stages,
// the mbarriers and the result's staging boxes), and the PTX of the
// pipeline and of the result's stores through the copy engine. Nothing of it runs here
// (test/Integration/GPU/kernels.mlir runs it on the GPU).
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx

// VERIFY: ptxas accepted 3 kernel modules for sm_90a

// CHECK-LABEL: func.func @gmm
// CHECK: call @moe_wgmma_gmm_200x128x256_e3_bf16_i32_tma(
func.func @gmm(%x: tensor<200x128xbf16>, %w: tensor<3x128x256xbf16>,
               %off: tensor<4xi32>) -> tensor<200x256xf32> {
  %y = moe.grouped_matmul %x, %w, %off
      : tensor<200x128xbf16>, tensor<3x128x256xbf16>, tensor<4xi32> -> tensor<200x256xf32>
  return %y : tensor<200x256xf32>
}

// The data-gradient form, at the Qwen3 layer's shape: more tiles than CTAs.
// CHECK-LABEL: func.func @dgrad
// CHECK: call @moe_wgmma_gmm_65536x768x2048_e128_bf16_rhsT_i32_tma(
func.func @dgrad(%dy: tensor<65536x768xbf16>, %w: tensor<128x2048x768xbf16>,
                 %off: tensor<129xi32>) -> tensor<65536x2048xf32> {
  %y = moe.grouped_matmul %dy, %w, %off transpose_rhs
      : tensor<65536x768xbf16>, tensor<128x2048x768xbf16>, tensor<129xi32> -> tensor<65536x2048xf32>
  return %y : tensor<65536x2048xf32>
}

// The weight gradient: one tile per (expert, 128 K, 256 N), the group's rows
// the contraction.
// CHECK-LABEL: func.func @wgrad
// CHECK: call @moe_wgmma_wgrad_700x256x512_e5_bf16_i32_tma(
func.func @wgrad(%x: tensor<700x256xbf16>, %dy: tensor<700x512xbf16>,
                 %off: tensor<6xi32>) -> tensor<5x256x512xf32> {
  %w = moe.grouped_matmul_wgrad %x, %dy, %off
      : tensor<700x256xbf16>, tensor<700x512xbf16>, tensor<6xi32> -> tensor<5x256x512xf32>
  return %w : tensor<5x256x512xf32>
}

// CHECK: func.func private @moertTensorMap2D(i64, i64, i64, i64, i64, i64, i64) -> i64

// Weight gradient: the f32 result [5 * 256, 512] in boxes of 32 columns x 64
// rows; lhs [700, 256] and rhs [700, 512], both in boxes of 64 columns x 64
// rows (one stage); 5 x 2 x 2 = 20 tiles. A stage that ends
// inside the group's rows has its tail zeroed in shared memory, made
// visible to the tensor cores (proxy fence) and the other consumer
// (barrier 1 of 256 threads) before the MMAs, which read A transposed.
// CHECK-LABEL: func.func private @moe_wgmma_wgrad_700x256x512_e5_bf16_i32_tma(
// CHECK-SAME: moe.dedicated_kernel = "cp.async.bulk.tensor + wgmma.mma_async bf16 weight gradient"
// CHECK: call @moertTensorMap2D(%{{.*}}, %c4_i64, %c512_i64, %c1280_i64, %c2048_i64, %c32_i64, %c64_i64)
// CHECK: call @moertTensorMap2D(%{{.*}}, %c2_i64, %c256_i64, %c700_i64, %c512_i64{{.*}}, %c64_i64{{.*}}, %c64_i64{{.*}})
// CHECK: call @moertTensorMap2D(%{{.*}}, %c2_i64{{.*}}, %c512_i64{{.*}}, %c700_i64{{.*}}, %c1024_i64, %c64_i64{{.*}}, %c64_i64{{.*}})
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c20,
// CHECK-COUNT-6: nvvm.cp.async.bulk.tensor.shared.cluster.global
// CHECK: nvvm.fence.proxy
// CHECK: nvvm.barrier id = %c1_i32{{.*}} number_of_threads = %c256_i32
// CHECK: A[<bf16>, <one>, <col>], B[<bf16>, <one>, <row>]
// Every tile's 8 boxes a warpgroup through its two staging buffers: one
// thread waits until the buffer's last store has read it, the warpgroup
// (named barrier 6 or 7, 128 threads) writes it, fences it for the copy
// engine and one thread stores it.
// CHECK: nvvm.cp.async.bulk.wait_group 1 {read}
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c128_i32
// CHECK: nvvm.fence.proxy
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c128_i32
// CHECK: nvvm.cp.async.bulk.tensor.global.shared.cta %{{.*}}, %{{.*}}, box[%{{.*}}, %{{.*}}]
// CHECK-NEXT: nvvm.cp.async.bulk.commit.group
// CHECK-COUNT-7: nvvm.cp.async.bulk.tensor.global.shared.cta
// The CTA's last stores are complete before it exits.
// CHECK: nvvm.cp.async.bulk.wait_group 0
// CHECK-NOT: nvvm.cp.async.bulk.wait_group
// CHECK: gpu.terminator

// Host: the f32 result [200, 256] in boxes of 32 x 64 rows; A [200, 128]
// bf16 in boxes of 64 x 128 rows; B [3 * 128, 256] in 64 x 64 boxes (four
// per 256 columns); tiles bound (2 + 3) x 1 = 5 CTAs. Shared memory: the
// ring (196608 bytes), the barriers, 32 KiB of staging boxes and 1 KiB of
// alignment slack each for the two.
// CHECK-LABEL: func.func private @moe_wgmma_gmm_200x128x256_e3_bf16_i32_tma(
// CHECK-SAME: moe.dedicated_kernel = "cp.async.bulk.tensor + wgmma.mma_async bf16"
// CHECK: call @moertTensorMap2D(%{{.*}}, %c4_i64, %c256_i64, %c200_i64, %c1024_i64, %c32_i64, %c64_i64)
// CHECK: call @moertTensorMap2D(%{{.*}}, %c2_i64, %c128_i64, %c200_i64{{.*}}, %c256_i64{{.*}}, %c64_i64{{.*}}, %c128_i64{{.*}})
// CHECK: call @moertTensorMap2D(%{{.*}}, %c2_i64{{.*}}, %c256_i64{{.*}}, %c384_i64, %c512_i64, %c64_i64{{.*}}, %c64_i64{{.*}})
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c5, {{.*}} = %c1{{.*}}, {{.*}} = %c1{{.*}}) threads({{.*}}) in ({{.*}} = %c384, {{.*}}) dynamic_shared_memory_size %c231424_i32
// Four `full` barriers (the producer's one arrival) and four `empty` (256
// consumer threads).
// CHECK-COUNT-4: nvvm.mbarrier.init {{.*}}%c256_i32
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK: nvvm.mbarrier.arrive.expect_tx %{{.*}}, %c49152_i32
// CHECK-COUNT-5: nvvm.cp.async.bulk.tensor.shared.cluster.global
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 256, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <row>]
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: nvvm.mbarrier.arrive
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: nvvm.mbarrier.arrive
// A warpgroup whose 64 rows all lie in the group stores them through the
// copy engine; the one whose rows cross the group's end stores the rows
// before it directly.
// CHECK: scf.if
// CHECK: nvvm.cp.async.bulk.tensor.global.shared.cta
// CHECK: } else {
// CHECK: llvm.store {{.*}} {alignment = 8 : i64} : vector<2xf32>, !llvm.ptr<1>

// 132 CTAs for (512 + 128) x 8 tiles; B [128 * 2048, 768] K-major in one
// 64 x 256 box a stage.
// CHECK-LABEL: func.func private @moe_wgmma_gmm_65536x768x2048_e128_bf16_rhsT_i32_tma(
// CHECK: call @moertTensorMap2D(%{{.*}}, %c4_i64, %c2048_i64, %c65536_i64, %c8192_i64, %c32_i64, %c64_i64)
// CHECK: call @moertTensorMap2D(%{{.*}}, %c2_i64, %c768_i64, %c65536_i64{{.*}}, %c1536_i64, %c64_i64{{.*}}, %c128_i64)
// CHECK: call @moertTensorMap2D(%{{.*}}, %c2_i64{{.*}}, %c768_i64{{.*}}, %c262144_i64, %c1536_i64{{.*}}, %c64_i64{{.*}}, %c256_i64)
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c132,
// CHECK-COUNT-2: nvvm.cp.async.bulk.tensor.shared.cluster.global
// CHECK-NOT: nvvm.cp.async.bulk.tensor.shared.cluster.global
// CHECK: B[<bf16>, <one>, <col>]

// PTX-LABEL: kernel module moe_wgmma_gmm_200x128x256_e3_bf16_i32_tma_kernel
// PTX: .maxntid 384, 1, 1
// The warpgroup index broadcast from lane 0 (warp-uniform roles).
// PTX: shfl.sync.idx.b32
// PTX: mbarrier.try_wait.parity.shared.b64
// PTX: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// PTX: wgmma.commit_group.sync.aligned;
// PTX-NEXT: wgmma.wait_group.sync.aligned 1;
// PTX: mbarrier.arrive.shared.b64
// PTX: mbarrier.arrive.expect_tx.shared.b64
// PTX: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// PTX: cp.async.bulk.wait_group.read 1;
// PTX: bar.sync %r{{[0-9]+}}, 128;
// PTX: st.shared.v2.b32
// PTX: fence.proxy.async.shared::cta;
// PTX: bar.sync %r{{[0-9]+}}, 128;
// PTX: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// PTX-NEXT: cp.async.bulk.commit_group;
// PTX: cp.async.bulk.wait_group 0;
// PTX-LABEL: kernel module moe_wgmma_wgrad_700x256x512_e5_bf16_i32_tma_kernel
// PTX: bar.sync 1, 256;
// PTX: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1, 1;
