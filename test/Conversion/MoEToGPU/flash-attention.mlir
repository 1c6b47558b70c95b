// The flash attention kernels on Hopper at a sequence that is not a tile
// multiple (200), grouped KV heads and head dim 64: the calls and their
// launches (the forward: a CTA of three warpgroups per 128-query tile,
// head and batch entry, its tensor maps encoded first; dQ: a CTA of one
// warpgroup per 64-query tile; dK/dV: three warpgroups per 128 keys), and
// in the PTX every kernel feeds P
// (P^T, dS, dS^T) to its second MMA from registers: nothing is stored to
// shared memory. Nothing of it runs here (test/Integration/GPU/attention.mlir
// runs it on the GPU).
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx

// VERIFY: ptxas accepted 4 kernel modules for sm_90a

// CHECK-LABEL: func.func @attention
// CHECK: call @moe_flash_fwd_b2_s200_h4_kv2_d64_causal(
// CHECK: call @moe_flash_delta_b2_s200_h4_kv2_d64_causal(
// CHECK: call @moe_flash_dq_b2_s200_h4_kv2_d64_causal(
// CHECK: call @moe_flash_dkv_b2_s200_h4_kv2_d64_causal(
// Forward: q, k and v as [B][S][heads x D] in boxes of 64 x 64; two Q
// tiles and three (K, V) stages (8 KiB each), ten mbarriers, 128 bytes of
// scratch, 1 KiB alignment slack.
// CHECK-LABEL: func.func private @moe_flash_fwd_b2_s200_h4_kv2_d64_causal(
// CHECK: call @moertTensorMap3D(%{{.*}}, %c2_i64, %c256_i64, %c200_i64, %c2_i64{{.*}}, %c512_i64, %c102400_i64, %c64_i64{{.*}}, %c64_i64{{.*}})
// CHECK: call @moertTensorMap3D(%{{.*}}, %c2_i64{{.*}}, %c128_i64, %c200_i64{{.*}}, %c2_i64{{.*}}, %c256_i64{{.*}}, %c51200_i64, %c64_i64{{.*}}, %c64_i64{{.*}})
// CHECK: call @moertTensorMap3D(
// CHECK: gpu.launch {{.*}} in (%{{.*}} = %c2, %{{.*}} = %c4{{.*}}, %{{.*}} = %c2{{.*}}) threads({{.*}} = %c384, {{.*}} dynamic_shared_memory_size %c66768_i32
// dQ: Q, dO, two (K, V) slots and 128 bytes of scratch.
// CHECK-LABEL: func.func private @moe_flash_dq_b2_s200_h4_kv2_d64_causal(
// CHECK: gpu.launch {{.*}} in (%{{.*}} = %c4{{.*}}, %{{.*}} = %c4{{.*}}, %{{.*}} = %c2{{.*}}) threads({{.*}} = %c128, {{.*}} dynamic_shared_memory_size %c50304_i32
// dK/dV: a CTA per 128 keys, KV head and batch entry; maps of q, k, v and
// dO; each consumer's K and V, three (Q, dO) stages, seven mbarriers, 128
// bytes of scratch, 1 KiB slack.
// CHECK-LABEL: func.func private @moe_flash_dkv_b2_s200_h4_kv2_d64_causal(
// CHECK: call @moertTensorMap3D(%{{.*}}, %c2_i64, %c256_i64,
// CHECK: call @moertTensorMap3D(%{{.*}}, %c2_i64{{.*}}, %c128_i64,
// CHECK: call @moertTensorMap3D(%{{.*}}, %c2_i64{{.*}}, %c128_i64
// CHECK: call @moertTensorMap3D(%{{.*}}, %c2_i64{{.*}}, %c256_i64
// CHECK: gpu.launch {{.*}} in (%{{.*}} = %c2{{.*}}, %{{.*}} = %c2{{.*}}, %{{.*}} = %c2{{.*}}) threads({{.*}} = %c384, {{.*}} dynamic_shared_memory_size %c83128_i32

// PTX-LABEL: kernel module moe_flash_fwd_b2_s200_h4_kv2_d64_causal_kernel
// The producer's copies (two Q tiles, then K and V a stage), the
// consumers' S = Q K^T with Q's fragment in registers (K by descriptor,
// K-major) and PV with P from registers.
// PTX-COUNT-10: mbarrier.init.shared.b64
// PTX-NOT: st.shared
// PTX: cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// PTX-NOT: st.shared
// PTX: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}}}, {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}, %rd{{[0-9]+}}, p, 1, 1, 0;
// PTX-NOT: st.shared
// PTX: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}}}, {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}, %rd{{[0-9]+}}, p, 1, 1, 1;
// PTX-NOT: st.shared
// PTX-LABEL: kernel module moe_flash_delta_b2_s200_h4_kv2_d64_causal_kernel
// PTX-LABEL: kernel module moe_flash_dq_b2_s200_h4_kv2_d64_causal_kernel
// PTX-NOT: st.shared
// PTX-COUNT-4: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}}}, {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}, %rd{{[0-9]+}}, p, 1, 1, 1;
// PTX-NOT: st.shared
// PTX-LABEL: kernel module moe_flash_dkv_b2_s200_h4_kv2_d64_causal_kernel
// The consumers' branch comes first, the producer's copies after it.
// PTX-COUNT-7: mbarrier.init.shared.b64
// PTX-NOT: st.shared
// PTX-COUNT-8: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}}}, {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}, %rd{{[0-9]+}}, p, 1, 1, 1;
// PTX-NOT: st.shared
// PTX: cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// PTX-NOT: st.shared

func.func @attention(%q: tensor<2x200x4x64xbf16>, %k: tensor<2x200x2x64xbf16>,
                     %v: tensor<2x200x2x64xbf16>, %do: tensor<2x200x4x64xbf16>)
    -> (tensor<2x200x4x64xf32>, tensor<2x200x4x64xf32>, tensor<2x200x2x64xf32>,
        tensor<2x200x2x64xf32>) {
  %o = moe.attention %q, %k, %v causal
      : tensor<2x200x4x64xbf16>, tensor<2x200x2x64xbf16>, tensor<2x200x2x64xbf16>
      -> tensor<2x200x4x64xf32>
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal
      : tensor<2x200x4x64xbf16>, tensor<2x200x2x64xbf16>, tensor<2x200x2x64xbf16>,
        tensor<2x200x4x64xbf16>
      -> tensor<2x200x4x64xf32>, tensor<2x200x2x64xf32>, tensor<2x200x2x64xf32>
  return %o, %dq, %dk, %dv
      : tensor<2x200x4x64xf32>, tensor<2x200x4x64xf32>, tensor<2x200x2x64xf32>,
        tensor<2x200x2x64xf32>
}
