// MXFP8 grouped GEMMs on Blackwell's block-scaled MMA (tcgen05): the IR
// -moe-gpu-dedicated-kernels produces, the PTX of the whole GPU pipeline, and
// ptxas accepting it for sm_100a. Nothing of it may run on a GPU here.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_100a | FileCheck %s
// RUN: moe-compile %s --target=sm_100a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
//
// Chips without the kernel keep the generic path for MX operands: sm_90a
// gets no tcgen05 kernel (its bf16 wgmma kernel takes the plain bf16 op of
// @ineligible, see hopper-wgmma.mlir), and sm_90a compiles of the same file
// use no tcgen05 instruction.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s --check-prefix=NOKERNEL
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.sm90.ptx --verify-ptx -o %t.sm90.so
// RUN: FileCheck %s --check-prefix=SM90 < %t.sm90.ptx

// VERIFY: ptxas accepted 47 kernel modules for sm_100a

// PTX-LABEL: kernel module moe_bs_gmm_256x256x128_e4_e4m3_e4m3_i32_kernel
// PTX: .target sm_100a
// PTX: tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 {{.*}}, %r{{[0-9]+}};
// PTX: tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;
// PTX: mbarrier.init.shared.b64
// PTX: mbarrier.try_wait.parity.shared.b64
// PTX: fence.proxy.async.shared::cta;
// PTX: tcgen05.cp.cta_group::1.32x128b.warpx4
// PTX: tcgen05.cp.cta_group::1.32x128b.warpx4
// PTX-COUNT-4: tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale{{.*}} [%r{{[0-9]+}}], %rd{{[0-9]+}}, %rd{{[0-9]+}}, %r{{[0-9]+}}, [%r{{[0-9]+}}], [%r{{[0-9]+}}], %p{{[0-9]+}};
// PTX: tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64
// PTX: tcgen05.ld.sync.aligned.32x32b.x32.b32
// PTX: tcgen05.wait::ld.sync.aligned;
// PTX: tcgen05.dealloc.cta_group::1.sync.aligned.b32
// PTX-LABEL: kernel module moe_bs_gmm_200x128x256_e3_e5m2_e4m3_i64_kernel
// PTX: tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale

// SM90-NOT: tcgen05
// SM90-NOT: moe_bs_gmm
// NOKERNEL-NOT: moe_bs_gmm
// NOKERNEL-NOT: tcgen05

// The call: MX operands split into data and scales, then the kernel's
// function on tensors.
// CHECK-LABEL: func.func @mxfp8
// CHECK-SAME: %[[XD:[a-z0-9]+]]: tensor<256x256xf8E4M3FN>, %[[XS:[a-z0-9]+]]: tensor<256x8xf8E8M0FNU>
// CHECK: %[[X:.*]] = moe.mx_pack %[[XD]], %[[XS]]
// CHECK: %[[W:.*]] = moe.mx_pack
// CHECK: %[[AD:.*]], %[[AS:.*]] = moe.mx_unpack %[[X]]
// CHECK: %[[BD:.*]], %[[BS:.*]] = moe.mx_unpack %[[W]]
// CHECK: %[[Y:.*]] = call @moe_bs_gmm_256x256x128_e4_e4m3_e4m3_i32(%[[AD]], %[[AS]], %[[BD]], %[[BS]], %{{.*}}) : (tensor<256x256xf8E4M3FN>, tensor<256x8xf8E8M0FNU>, tensor<4x256x128xf8E4M3FN>, tensor<4x8x128xf8E8M0FNU>, tensor<5xi32>) -> tensor<256x128xf32>
// CHECK-NOT: moe.grouped_matmul
// CHECK: return %[[Y]]
func.func @mxfp8(%xd: tensor<256x256xf8E4M3FN>, %xs: tensor<256x8xf8E8M0FNU>,
                 %wd: tensor<4x256x128xf8E4M3FN>, %ws: tensor<4x8x128xf8E8M0FNU>,
                 %off: tensor<5xi32> {moe.test_range = [0, 256]}) -> tensor<256x128xf32> {
  %x = moe.mx_pack %xd, %xs : tensor<256x256xf8E4M3FN>, tensor<256x8xf8E8M0FNU>
      -> !moe.mx<256x256xf8E4M3FN, axis = 1>
  %w = moe.mx_pack %wd, %ws : tensor<4x256x128xf8E4M3FN>, tensor<4x8x128xf8E8M0FNU>
      -> !moe.mx<4x256x128xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %x, %w, %off
      : !moe.mx<256x256xf8E4M3FN, axis = 1>, !moe.mx<4x256x128xf8E4M3FN, axis = 1>,
        tensor<5xi32> -> tensor<256x128xf32>
  return %y : tensor<256x128xf32>
}

// Two GEMMs of one shape share one kernel function.
// CHECK-LABEL: func.func @same_shape_twice
// CHECK: call @moe_bs_gmm_256x256x128_e4_e4m3_e4m3_i32(
// CHECK: call @moe_bs_gmm_256x256x128_e4_e4m3_e4m3_i32(
func.func @same_shape_twice(%x: tensor<256x256xbf16>, %w: tensor<4x256x128xbf16>,
                            %off: tensor<5xi32> {moe.test_range = [0, 256]})
    -> (tensor<256x128xf32>, tensor<256x128xf32>) {
  %xq = moe.quantize %x : tensor<256x256xbf16> -> !moe.mx<256x256xf8E4M3FN, axis = 1>
  %wq = moe.quantize %w : tensor<4x256x128xbf16> -> !moe.mx<4x256x128xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %xq, %wq, %off
      : !moe.mx<256x256xf8E4M3FN, axis = 1>, !moe.mx<4x256x128xf8E4M3FN, axis = 1>,
        tensor<5xi32> -> tensor<256x128xf32>
  %z = moe.grouped_matmul %xq, %wq, %off
      : !moe.mx<256x256xf8E4M3FN, axis = 1>, !moe.mx<4x256x128xf8E4M3FN, axis = 1>,
        tensor<5xi32> -> tensor<256x128xf32>
  return %y, %z : tensor<256x128xf32>, tensor<256x128xf32>
}

// Rows not a multiple of the 128-row tile (masked), E5M2 x E4M3, i64
// offsets, N = 2 tiles.
// CHECK-LABEL: func.func @ragged_rows
// CHECK: call @moe_bs_gmm_200x128x256_e3_e5m2_e4m3_i64(
func.func @ragged_rows(%x: tensor<200x128xf32>, %w: tensor<3x128x256xf32>,
                       %off: tensor<4xi64> {moe.test_range = [0, 200]}) -> tensor<200x256xf32> {
  %xq = moe.quantize %x : tensor<200x128xf32> -> !moe.mx<200x128xf8E5M2, axis = 1>
  %wq = moe.quantize %w : tensor<3x128x256xf32> -> !moe.mx<3x128x256xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %xq, %wq, %off
      : !moe.mx<200x128xf8E5M2, axis = 1>, !moe.mx<3x128x256xf8E4M3FN, axis = 1>,
        tensor<4xi64> -> tensor<200x256xf32>
  return %y : tensor<200x256xf32>
}

// Ops the kernel does not handle are left exactly as they are.
// CHECK-LABEL: func.func @ineligible
// CHECK-NOT: call
// CHECK: moe.grouped_matmul {{.*}} : tensor<256x256xbf16>, tensor<4x256x128xbf16>
// CHECK: moe.grouped_matmul {{.*}} transpose_rhs : !moe.mx<256x128xf8E4M3FN, axis = 1>, !moe.mx<4x256x128xf8E4M3FN, axis = 2>
// CHECK: moe.grouped_matmul {{.*}} : !moe.mx<256x256xf8E4M3FN, axis = 1>, !moe.mx<4x256x96xf8E4M3FN, axis = 1>
// CHECK: moe.grouped_matmul {{.*}} : !moe.mx<256x96xf8E4M3FN, axis = 1>, !moe.mx<4x96x128xf8E4M3FN, axis = 1>
// CHECK: moe.grouped_matmul {{.*}} : !moe.mx<256x256xf8E4M3FN, axis = 1>, tensor<4x256x128xbf16>
// CHECK-NOT: call
// CHECK: return
func.func @ineligible(%x: tensor<256x256xbf16>, %w: tensor<4x256x128xbf16>,
                      %x2: tensor<256x128xbf16>, %w96: tensor<4x256x96xbf16>,
                      %x96: tensor<256x96xbf16>, %wk96: tensor<4x96x128xbf16>,
                      %off: tensor<5xi32> {moe.test_range = [0, 256]})
    -> (tensor<256x128xf32>, tensor<256x256xf32>, tensor<256x96xf32>,
        tensor<256x128xf32>, tensor<256x128xf32>) {
  // bf16 operands.
  %a = moe.grouped_matmul %x, %w, %off
      : tensor<256x256xbf16>, tensor<4x256x128xbf16>, tensor<5xi32> -> tensor<256x128xf32>
  // transpose_rhs.
  %x2q = moe.quantize %x2 : tensor<256x128xbf16> -> !moe.mx<256x128xf8E4M3FN, axis = 1>
  %wt = moe.quantize %w : tensor<4x256x128xbf16> -> !moe.mx<4x256x128xf8E4M3FN, axis = 2>
  %b = moe.grouped_matmul %x2q, %wt, %off transpose_rhs
      : !moe.mx<256x128xf8E4M3FN, axis = 1>, !moe.mx<4x256x128xf8E4M3FN, axis = 2>,
        tensor<5xi32> -> tensor<256x256xf32>
  // N = 96 is not a multiple of the 128-column tile.
  %xq = moe.quantize %x : tensor<256x256xbf16> -> !moe.mx<256x256xf8E4M3FN, axis = 1>
  %w96q = moe.quantize %w96 : tensor<4x256x96xbf16> -> !moe.mx<4x256x96xf8E4M3FN, axis = 1>
  %c = moe.grouped_matmul %xq, %w96q, %off
      : !moe.mx<256x256xf8E4M3FN, axis = 1>, !moe.mx<4x256x96xf8E4M3FN, axis = 1>,
        tensor<5xi32> -> tensor<256x96xf32>
  // K = 96 is not a multiple of the 128-deep K stage.
  %x96q = moe.quantize %x96 : tensor<256x96xbf16> -> !moe.mx<256x96xf8E4M3FN, axis = 1>
  %wk96q = moe.quantize %wk96 : tensor<4x96x128xbf16> -> !moe.mx<4x96x128xf8E4M3FN, axis = 1>
  %d = moe.grouped_matmul %x96q, %wk96q, %off
      : !moe.mx<256x96xf8E4M3FN, axis = 1>, !moe.mx<4x96x128xf8E4M3FN, axis = 1>,
        tensor<5xi32> -> tensor<256x128xf32>
  // Only one operand block-scaled.
  %e = moe.grouped_matmul %xq, %w, %off
      : !moe.mx<256x256xf8E4M3FN, axis = 1>, tensor<4x256x128xbf16>,
        tensor<5xi32> -> tensor<256x128xf32>
  return %a, %b, %c, %d, %e
      : tensor<256x128xf32>, tensor<256x256xf32>, tensor<256x96xf32>,
        tensor<256x128xf32>, tensor<256x128xf32>
}

// The kernel's function: buffers of the inputs, the result allocated, one
// gpu.launch of ceil(R/128) x N/128 blocks of 128 threads with 33808 bytes
// of dynamic shared memory, the tensor of the result returned.
// CHECK-LABEL: func.func private @moe_bs_gmm_256x256x128_e4_e4m3_e4m3_i32(
// The A rows are read only inside the groups of the offsets argument (the
// live-rows analysis of -convert-moe-to-linalg reads these attributes).
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<256x256xf8E4M3FN> {moe.group_rows}, %[[AS:[a-z0-9]+]]: tensor<256x8xf8E8M0FNU> {moe.group_rows}, %[[B:[a-z0-9]+]]: tensor<4x256x128xf8E4M3FN>, %[[BS:[a-z0-9]+]]: tensor<4x8x128xf8E8M0FNU>, %[[O:[a-z0-9]+]]: tensor<5xi32> {moe.group_offsets}) -> tensor<256x128xf32>
// CHECK-SAME: moe.dedicated_kernel
// CHECK-DAG: bufferization.to_buffer %[[A]] read_only : tensor<256x256xf8E4M3FN> to memref<256x256xf8E4M3FN>
// CHECK-DAG: bufferization.to_buffer %[[AS]] read_only
// CHECK-DAG: bufferization.to_buffer %[[B]] read_only
// CHECK-DAG: bufferization.to_buffer %[[BS]] read_only
// CHECK-DAG: bufferization.to_buffer %[[O]] read_only
// CHECK: %[[OUT:.*]] = memref.alloc() : memref<256x128xf32>
// CHECK: %[[C2:.*]] = arith.constant 2 : index
// CHECK: %[[C1:.*]] = arith.constant 1 : index
// CHECK: %[[C128:.*]] = arith.constant 128 : index
// CHECK: %[[SMEM:.*]] = arith.constant 33808 : i32
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %[[C2]], {{.*}} = %[[C1]], {{.*}}) threads({{.*}}) in ({{.*}} = %[[C128]], {{.*}}) dynamic_shared_memory_size %[[SMEM]]
// CHECK: gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
//   Tensor memory: 256 columns, by warp 0.
// CHECK: nvvm.tcgen05.alloc %{{.*}}, %{{.*}} : !llvm.ptr<3>, i32
// CHECK: nvvm.tcgen05.relinquish_alloc_permit
// CHECK: nvvm.mbarrier.init
// CHECK: nvvm.barrier0
//   The expert loop, the K loop, shared memory filled, scales to TMEM, four
//   MMAs (K = 32 each) from one thread, commit, wait.
// CHECK: scf.for
// CHECK: scf.for
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK: nvvm.barrier0
// CHECK: nvvm.tcgen05.mma_smem_desc
// CHECK: nvvm.tcgen05.cp %{{.*}}, %{{.*}} {multicast = #nvvm.tcgen05_cp_multicast<warpx4>, shape = #nvvm.tcgen05_cp_shape<shape_32x128b>}
// CHECK: nvvm.tcgen05.cp
// CHECK: nvvm.tcgen05.mma.block_scale {{.*}} {ctaGroup = #nvvm.cta_group<cta_1>, kind = #nvvm.block_scale_kind<mxf8f6f4>} : (!llvm.ptr<6>, i64, i64, i32, i1, !llvm.ptr<6>, !llvm.ptr<6>)
// CHECK: nvvm.tcgen05.mma.block_scale
// CHECK: nvvm.tcgen05.mma.block_scale
// CHECK: nvvm.tcgen05.mma.block_scale
// CHECK: nvvm.tcgen05.commit %{{.*}} : !llvm.ptr<3>
// CHECK: nvvm.mbarrier.try_wait.parity
//   The accumulator, 4 x 32 columns per thread, stored for rows of the group.
// CHECK: nvvm.tcgen05.ld %{{.*}} {shape = #nvvm.tcgen05_ldst_shape<shape_32x32b>} : vector<32xi32>
// CHECK: nvvm.tcgen05.wait <load>
// CHECK: memref.store %{{.*}}, %[[OUT]]
// CHECK: nvvm.tcgen05.dealloc
// CHECK: gpu.terminator
// CHECK: %[[R:.*]] = bufferization.to_tensor %[[OUT]] restrict writable : memref<256x128xf32> to tensor<256x128xf32>
// CHECK: return %[[R]]
// CHECK-NOT: func.func private @moe_bs_gmm_256x256x128
// CHECK-LABEL: func.func private @moe_bs_gmm_200x128x256_e3_e5m2_e4m3_i64(
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c2{{.*}}, {{.*}} = %c2{{.*}}, {{.*}})
