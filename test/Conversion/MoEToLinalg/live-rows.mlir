// RUN: moe-opt %s --split-input-file --convert-moe-to-linalg=parallel=true | FileCheck %s
// RUN: moe-opt %s --split-input-file --convert-moe-to-linalg="parallel=true live-rows=false" | FileCheck %s --check-prefix=OFF
// RUN: moe-opt %s --split-input-file --moe-gpu-pipeline="chip=sm_90a format=isa" --mlir-print-ir-after=gpu-kernel-outlining -o /dev/null 2>&1 | FileCheck %s --check-prefix=GPU

// Live rows: the expert computation reads its rows only through the groups
// of the dispatch's offsets (grouped GEMMs) and its positions (combine), so
// the gather, MXFP8 round trip and SwiGLU compute rows [0, offsets[4]) only,
// in storage of the worst case's 16 rows; their other rows stay unspecified.
func.func @layer(%x: tensor<8x32xf32>, %idx: tensor<8x2xi32>, %w: tensor<8x2xf32>,
                 %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>) -> tensor<8x32xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4)
      : tensor<8x32xf32>, tensor<8x2xi32> -> tensor<16x32xf32>, tensor<5xi32>, tensor<4xi32>, tensor<8x2xi32>
  %q = moe.quantize %s : tensor<16x32xf32> -> !moe.mx<16x32xf8E4M3FN, axis = 1>
  %d = moe.dequantize %q : !moe.mx<16x32xf8E4M3FN, axis = 1> -> tensor<16x32xbf16>
  %h = moe.grouped_matmul %d, %w1, %o : tensor<16x32xbf16>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<16x64xf32>
  %a = moe.swiglu %h : tensor<16x64xf32> -> tensor<16x32xf32>
  %y = moe.grouped_matmul %a, %w2, %o : tensor<16x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<16x32xf32>
  %out = moe.combine %y, %w, %p : tensor<16x32xf32>, tensor<8x2xf32>, tensor<8x2xi32> -> tensor<8x32xf32>
  return %out : tensor<8x32xf32>
}
// The gather: offsets[4], clamped to [0, 16], bounds its rows.
// CHECK-LABEL: func.func @layer(
// CHECK: %[[END:.*]] = tensor.extract %[[OFFS:.*]][%c4{{.*}}] : tensor<5xi32>
// CHECK: %[[N:.*]] = arith.minsi %{{.*}}, %c16{{.*}} : index
// CHECK: %[[SRC:.*]] = bufferization.alloc_tensor() : tensor<16xindex>
// CHECK: tensor.extract_slice %[[SRC]][0] [%[[N]]] [1]
// CHECK: %[[ROWS:.*]] = bufferization.alloc_tensor() : tensor<16x32xf32>
// CHECK: %[[LIVE:.*]] = tensor.extract_slice %[[ROWS]][0, 0] [%[[N]], 32] [1, 1]
// CHECK: %[[G:.*]] = linalg.generic {{.*}} outs(%[[LIVE]] : tensor<?x32xf32>)
// CHECK: %[[S:.*]] = tensor.insert_slice %[[G]] into %[[ROWS]][0, 0] [%[[N]], 32] [1, 1]
// Quantize: amax, scales and elements of the live rows.
// CHECK: tensor.extract %[[OFFS]][%c4{{.*}}] : tensor<5xi32>
// CHECK: %[[NQ:.*]] = arith.minsi %{{.*}}, %c16{{.*}} : index
// CHECK: tensor.extract_slice %[[S]][0, 0] [%[[NQ]], 32] [1, 1]
// CHECK: bufferization.alloc_tensor() : tensor<16x1xf32>
// CHECK: bufferization.alloc_tensor() : tensor<16x1xf8E8M0FNU>
// CHECK: bufferization.alloc_tensor() : tensor<16x1x32xf8E4M3FN>
// Dequantize and SwiGLU likewise.
// CHECK: bufferization.alloc_tensor() : tensor<16x1x32xbf16>
// CHECK: bufferization.alloc_tensor() : tensor<16x32xf32>
// CHECK: return
// OFF-LABEL: func.func @layer(
// OFF-NOT: bufferization.alloc_tensor
// OFF-NOT: tensor.extract_slice {{.*}} to tensor<?x32xf32>
// OFF: return

// On the GPU every kernel of the live rows launches for the worst case (16
// rows x 32, in vectors of 4: one block of 128) and reads the row count
// from offsets[4] in device memory; its threads stride over the live
// elements only (the gather: rows x 32 of them, 4 at a time). The host
// reads no device buffer (its only loads are the deallocation's ownership
// flags, in host memory). The MXFP8 round trip is one kernel that reads
// offsets[4] likewise.
// GPU-LABEL: func.func @layer(
// GPU-NOT: memref.load %{{(memref|arg)}}
// GPU: gpu.launch_func @layer_kernel_[[GATHER:[0-9]+]]::@layer_kernel blocks in (%c1, %c1, %c1) threads in (%c128, %c1, %c1) args(%[[O:.*]] : memref<5xi32>, %{{.*}} : memref<8x32xf32>
// GPU-NOT: memref.load %{{(memref|arg)}}
// GPU: gpu.launch_func @moe_mx_round_trip_16x32_a1_e4m3_rceil_f32_to_bf16_live_i32_kernel::@moe_mx_round_trip_16x32_a1_e4m3_rceil_f32_to_bf16_live_i32_kernel {{.*}} args(%[[O]] : memref<5xi32>, %{{.*}}, %{{.*}})
// GPU-NOT: memref.load %{{(memref|arg)}}
// GPU: return
// GPU: gpu.module @layer_kernel_[[GATHER]]
// GPU: known_grid_size = array<i32: 1, 1, 1>
// GPU: %[[END:.*]] = memref.load %arg0[%c4] : memref<5xi32>
// GPU: %[[C:.*]] = arith.index_cast %[[END]] : i32 to index
// GPU: %[[LO:.*]] = arith.maxsi %[[C]], %c0
// GPU: %[[N:.*]] = arith.minsi %[[LO]], %c16
// GPU: %[[ELTS:.*]] = arith.muli %[[N]], %c32
// GPU: %[[GROUPS:.*]] = arith.select %{{.*}}, %{{.*}}, %c0
// GPU: scf.for %{{.*}} = %{{.*}} to %[[GROUPS]] step %c512
// GPU: vector.load
// GPU: scf.for %{{.*}} = %{{.*}} to %[[ELTS]] step %c128

// -----

// Rows that reach a result other than through groups and positions stay
// computed: here the dispatched rows are returned.
func.func @returned(%x: tensor<8x32xf32>, %idx: tensor<8x2xi32>,
                    %w1: tensor<4x32x64xf32>) -> (tensor<16x64xf32>, tensor<16x32xf32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4)
      : tensor<8x32xf32>, tensor<8x2xi32> -> tensor<16x32xf32>, tensor<5xi32>, tensor<4xi32>, tensor<8x2xi32>
  %h = moe.grouped_matmul %s, %w1, %o : tensor<16x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<16x64xf32>
  return %h, %s : tensor<16x64xf32>, tensor<16x32xf32>
}
// CHECK-LABEL: func.func @returned(
// CHECK-NOT: bufferization.alloc_tensor
// CHECK: return

// -----

// MX blocks along the rows (a weight gradient's operand) cross offsets[E]
// unless every group is padded to whole blocks: the quantize stays whole,
// and so do the rows it reads.
func.func @row_blocks(%x: tensor<8x32xf32>, %idx: tensor<8x2xi32>,
                      %dy: tensor<16x32xf32>) -> tensor<4x32x32xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4)
      : tensor<8x32xf32>, tensor<8x2xi32> -> tensor<16x32xf32>, tensor<5xi32>, tensor<4xi32>, tensor<8x2xi32>
  %a = moe.swiglu %s : tensor<16x32xf32> -> tensor<16x16xf32>
  %q = moe.quantize %a : tensor<16x16xf32> -> !moe.mx<16x16xf8E4M3FN, axis = 0, block = 16>
  %g = moe.dequantize %q : !moe.mx<16x16xf8E4M3FN, axis = 0, block = 16> -> tensor<16x16xf32>
  %dw = moe.grouped_matmul_wgrad %g, %dy, %o : tensor<16x16xf32>, tensor<16x32xf32>, tensor<5xi32> -> tensor<4x16x32xf32>
  %z = tensor.empty() : tensor<4x32x32xf32>
  %r = tensor.insert_slice %dw into %z[0, 0, 0] [4, 16, 32] [1, 1, 1] : tensor<4x16x32xf32> into tensor<4x32x32xf32>
  return %r : tensor<4x32x32xf32>
}
// CHECK-LABEL: func.func @row_blocks(
// CHECK-NOT: bufferization.alloc_tensor
// CHECK: return

// -----

// Blockwise FP8 tiles of one row (1 x 128) are row-local: the rows before
// them are live-bounded (the gather), the generic quantize and dequantize
// compute every row (tiles of the live rows would need their count on the
// host), and on the GPU their round trip is the kernel's live variant,
// reading offsets[4] on the device.
func.func @fp8block_rows(%x: tensor<8x32xf32>, %idx: tensor<8x2xi32>, %w: tensor<8x2xf32>,
                         %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>) -> tensor<8x32xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4)
      : tensor<8x32xf32>, tensor<8x2xi32> -> tensor<16x32xf32>, tensor<5xi32>, tensor<4xi32>, tensor<8x2xi32>
  %q = moe.quantize %s : tensor<16x32xf32> -> !moe.fp8block<16x32xf8E4M3FN, block = [1, 128], pow2>
  %d = moe.dequantize %q : !moe.fp8block<16x32xf8E4M3FN, block = [1, 128], pow2> -> tensor<16x32xbf16>
  %h = moe.grouped_matmul %d, %w1, %o : tensor<16x32xbf16>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<16x64xf32>
  %a = moe.swiglu %h : tensor<16x64xf32> -> tensor<16x32xf32>
  %y = moe.grouped_matmul %a, %w2, %o : tensor<16x32xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<16x32xf32>
  %out = moe.combine %y, %w, %p : tensor<16x32xf32>, tensor<8x2xf32>, tensor<8x2xi32> -> tensor<8x32xf32>
  return %out : tensor<8x32xf32>
}
// CHECK-LABEL: func.func @fp8block_rows(
// CHECK: %[[ROWS:.*]] = bufferization.alloc_tensor() : tensor<16x32xf32>
// CHECK: linalg.generic {{.*}} outs(%{{.*}} : tensor<16x1x1x128xf8E4M3FN>)
// CHECK: linalg.generic {{.*}} outs(%{{.*}} : tensor<16x1x1x128xbf16>)
// GPU-LABEL: func.func @fp8block_rows(
// GPU: gpu.launch_func @moe_fp8block_round_trip_16x32_t1x128_e4m3_pow2_f32_to_bf16_live_i32_kernel::@moe_fp8block_round_trip_16x32_t1x128_e4m3_pow2_f32_to_bf16_live_i32_kernel {{.*}} args(%{{.*}} : memref<5xi32>,

// -----

// 128 x 1 tiles along the rows (a weight gradient's operand) with every
// group padded to 128: no tile crosses offsets[E], so the quantize is
// row-local too and the rows it reads stay live-bounded.
func.func @fp8block_row_tiles(%x: tensor<8x32xf32>, %idx: tensor<8x2xi32>,
                              %dy: tensor<512x32xf32>) -> tensor<4x32x32xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<8x32xf32>, tensor<8x2xi32> -> tensor<512x32xf32>, tensor<5xi32>, tensor<4xi32>, tensor<8x2xi32>
  %a = moe.swiglu %s : tensor<512x32xf32> -> tensor<512x16xf32>
  %q = moe.quantize %a : tensor<512x16xf32> -> !moe.fp8block<512x16xf8E4M3FN, block = [128, 1]>
  %g = moe.dequantize %q : !moe.fp8block<512x16xf8E4M3FN, block = [128, 1]> -> tensor<512x16xf32>
  %dw = moe.grouped_matmul_wgrad %g, %dy, %o : tensor<512x16xf32>, tensor<512x32xf32>, tensor<5xi32> -> tensor<4x16x32xf32>
  %z = tensor.empty() : tensor<4x32x32xf32>
  %r = tensor.insert_slice %dw into %z[0, 0, 0] [4, 16, 32] [1, 1, 1] : tensor<4x16x32xf32> into tensor<4x32x32xf32>
  return %r : tensor<4x32x32xf32>
}
// The SwiGLU (and the gather before it) computes the live rows only.
// CHECK-LABEL: func.func @fp8block_row_tiles(
// CHECK: bufferization.alloc_tensor() : tensor<512x16xf32>
// CHECK: return
