// f32 linalg.matmul on Hopper: -moe-gpu-dedicated-kernels{chip=sm_90a}
// turns it into a call of the shared-memory tiled CUDA-core kernel (C_in
// passed along: the result is C_in + A @ B); ptxas accepts the PTX. Nothing
// of it runs here (scripts/gpu-check.sh: @matmul_f32_ragged and the router's
// matmuls).
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_80 | FileCheck %s --check-prefix=NOKERNEL

// VERIFY: ptxas accepted 11 kernel modules for sm_90a
// PTX-LABEL: kernel module moe_simt_matmul_100x130x70_f32_kernel
// Per K step: 16-byte shared loads of As[k] and Bs[k] (two groups of 4
// rows and of 4 columns a thread), 64 FMAs each. (N = 130: rows of B are not
// 16-byte aligned, every global load is a checked scalar one.)
// PTX-DAG: bar.sync 0;
// PTX-DAG: ld.shared.v4.b32
// PTX-DAG: fma.rn.f32
// PTX-NOT: ld.global.v4
// PTX: kernel module mm_kernel
// NOKERNEL-NOT: moe_simt_matmul

// CHECK-LABEL: func.func @mm
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<100x70xf32>, %[[B:[a-z0-9]+]]: tensor<70x130xf32>, %[[C:[a-z0-9]+]]: tensor<100x130xf32>
// CHECK: %[[Y:.*]] = call @moe_simt_matmul_100x130x70_f32(%[[A]], %[[B]], %[[C]]) : (tensor<100x70xf32>, tensor<70x130xf32>, tensor<100x130xf32>) -> tensor<100x130xf32>
// CHECK-NOT: linalg.matmul ins(%[[A]]
// Not f32, dynamic, or fewer than 1024 outputs (a dot product: left to the
// split reductions of the generic path).
// CHECK: linalg.matmul ins(%{{.*}} : tensor<64x64xbf16>, tensor<64x64xbf16>)
// CHECK: linalg.matmul ins(%{{.*}} : tensor<?x64xf32>, tensor<64x64xf32>)
// CHECK: linalg.matmul ins(%{{.*}} : tensor<1x8192xf32>, tensor<8192x1xf32>)
// One CTA of 256 threads per 128 x 128 tile (here 2 x 1), two 8 KiB tiles
// of shared memory.
// CHECK: func.func private @moe_simt_matmul_100x130x70_f32({{.*}}) -> tensor<100x130xf32> attributes {moe.dedicated_kernel = "f32 matmul, shared-memory tiles"}
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c2{{.*}}, {{.*}} = %c1{{.*}}, {{.*}} = %c1{{.*}}) threads({{.*}}) in ({{.*}} = %c256{{.*}}) dynamic_shared_memory_size %c16384_i32
// CHECK-COUNT-64: math.fma
func.func @mm(%a: tensor<100x70xf32>, %b: tensor<70x130xf32>, %c: tensor<100x130xf32>,
              %h: tensor<64x64xbf16>, %d: tensor<?x64xf32>, %w: tensor<64x64xf32>,
              %hc: tensor<64x64xf32>, %dc: tensor<?x64xf32>,
              %u: tensor<1x8192xf32>, %v: tensor<8192x1xf32>, %uc: tensor<1x1xf32>)
    -> (tensor<100x130xf32>, tensor<64x64xf32>, tensor<?x64xf32>, tensor<1x1xf32>) {
  %y = linalg.matmul ins(%a, %b : tensor<100x70xf32>, tensor<70x130xf32>)
                     outs(%c : tensor<100x130xf32>) -> tensor<100x130xf32>
  %p = linalg.matmul ins(%h, %h : tensor<64x64xbf16>, tensor<64x64xbf16>)
                     outs(%hc : tensor<64x64xf32>) -> tensor<64x64xf32>
  %q = linalg.matmul ins(%d, %w : tensor<?x64xf32>, tensor<64x64xf32>)
                     outs(%dc : tensor<?x64xf32>) -> tensor<?x64xf32>
  %r = linalg.matmul ins(%u, %v : tensor<1x8192xf32>, tensor<8192x1xf32>)
                     outs(%uc : tensor<1x1xf32>) -> tensor<1x1xf32>
  return %y, %p, %q, %r : tensor<100x130xf32>, tensor<64x64xf32>, tensor<?x64xf32>, tensor<1x1xf32>
}

// Few output tiles over a long K (a weight gradient summed over tokens): K
// is split so that about two CTAs run per SM. Here one tile and 257 steps
// of 16: 4 splits of 65 steps (the last 62) write partial sums, and a second
// kernel adds them in split order to C_in.
// CHECK-LABEL: func.func private @moe_simt_matmul_128x96x4100_f32
// CHECK: %[[P:.*]] = memref.alloc() : memref<4x128x96xf32>
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c1{{.*}}, {{.*}} = %c1{{.*}}, {{.*}} = %c4{{.*}})
// CHECK: memref.store %{{.*}}, %[[P]]
// CHECK: gpu.launch
// CHECK-COUNT-4: memref.load %[[P]]
// CHECK: memref.store
// K and N multiples of 4: tiles inside A and B load 16 bytes a thread.
// PTX-LABEL: kernel module moe_simt_matmul_128x96x4100_f32_kernel
// PTX-DAG: ld.global.v4.b32
// PTX-DAG: fma.rn.f32
// PTX-LABEL: kernel module moe_simt_matmul_128x96x4100_f32_sum_kernel
// PTX: add.rn.f32
func.func @split_k(%a: tensor<128x4100xf32>, %b: tensor<4100x96xf32>, %c: tensor<128x96xf32>)
    -> tensor<128x96xf32> {
  %y = linalg.matmul ins(%a, %b : tensor<128x4100xf32>, tensor<4100x96xf32>)
                     outs(%c : tensor<128x96xf32>) -> tensor<128x96xf32>
  return %y : tensor<128x96xf32>
}
