// The paired MX round trips of a dispatch's rows read the rows from the
// tokens through the dispatch's source indices; the gathered f32 rows are
// never materialized. test/Integration/GPU/kernels.mlir runs both forms
// against the CPU (dispatch_round_trip_pair, weighted_dispatch_round_trip_pair).
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a \
// RUN:   --convert-moe-to-linalg=parallel=true --moe-gpu-fuse-row-gathers -canonicalize | FileCheck %s
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx

// VERIFY: ptxas accepted 31 kernel modules for sm_90a

// CHECK-LABEL: func.func @dispatched(
// CHECK-NOT: moe.gathered_rows
// CHECK: %[[R:.*]]:2 = call @moe_mx_round_trip_pair_4576x64_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16_gather_1024(%arg0, %{{.*}}) : (tensor<1024x64xf32>, tensor<4576xindex>) -> (tensor<4576x64xbf16>, tensor<4576x64xbf16>)
// CHECK-NOT: moe.gathered_rows
// CHECK: return %[[R]]#0, %[[R]]#1
// Lane i loads row i's source; each row's source goes to every lane.
// PTX-LABEL: kernel module moe_mx_round_trip_pair_4576x64_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16_gather_1024_kernel
// PTX-COUNT-32: shfl.sync.idx.b32
func.func @dispatched(%x: tensor<1024x64xf32>, %idx: tensor<1024x4xi32>)
    -> (tensor<4576x64xbf16>, tensor<4576x64xbf16>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(16) pad_to(32)
      : tensor<1024x64xf32>, tensor<1024x4xi32>
      -> tensor<4576x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %qk = moe.quantize %s : tensor<4576x64xf32> -> !moe.mx<4576x64xf8E4M3FN, axis = 0>
  %yk = moe.dequantize %qk : !moe.mx<4576x64xf8E4M3FN, axis = 0> -> tensor<4576x64xbf16>
  %qn = moe.quantize %s : tensor<4576x64xf32> -> !moe.mx<4576x64xf8E4M3FN, axis = 1>
  %yn = moe.dequantize %qn : !moe.mx<4576x64xf8E4M3FN, axis = 1> -> tensor<4576x64xbf16>
  return %yk, %yn : tensor<4576x64xbf16>, tensor<4576x64xbf16>
}

// The combine's gradient re-sorted: the kernel multiplies w[t, k] and g[t]
// itself (operands in the product's order); the [T, K, H] product is gone.
// CHECK-LABEL: func.func @weighted(
// CHECK-NOT: tensor<256x4x64xf32>
// CHECK: call @moe_mx_round_trip_pair_1024x64_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16_gather_1024_scaled_4_sx(%arg1, %{{.*}}, %arg0) : (tensor<256x64xf32>, tensor<1024xindex>, tensor<256x4xf32>)
// CHECK-NOT: tensor<256x4x64xf32>
// CHECK: return
// PTX-LABEL: kernel module moe_mx_round_trip_pair_1024x64_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16_gather_1024_scaled_4_sx_kernel
// PTX-COUNT-64: shfl.sync.idx.b32
func.func @weighted(%w: tensor<256x4xf32>, %g: tensor<256x64xf32>, %idx: tensor<256x4xi32>)
    -> (tensor<1024x64xbf16>, tensor<1024x64xbf16>) {
  %e = tensor.empty() : tensor<256x4x64xf32>
  %p = linalg.generic {indexing_maps = [affine_map<(t, k, h) -> (t, k)>, affine_map<(t, k, h) -> (t, h)>,
                                        affine_map<(t, k, h) -> (t, k, h)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w, %g : tensor<256x4xf32>, tensor<256x64xf32>) outs(%e : tensor<256x4x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  } -> tensor<256x4x64xf32>
  %c = tensor.collapse_shape %p [[0, 1], [2]] : tensor<256x4x64xf32> into tensor<1024x64xf32>
  %i = tensor.collapse_shape %idx [[0, 1]] : tensor<256x4xi32> into tensor<1024xi32>
  %i1 = tensor.expand_shape %i [[0, 1]] output_shape [1024, 1] : tensor<1024xi32> into tensor<1024x1xi32>
  %s, %o, %n, %pos = moe.dispatch %c, %i1 experts(16)
      : tensor<1024x64xf32>, tensor<1024x1xi32> -> tensor<1024x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<1024x1xi32>
  %qk = moe.quantize %s : tensor<1024x64xf32> -> !moe.mx<1024x64xf8E4M3FN, axis = 0>
  %yk = moe.dequantize %qk : !moe.mx<1024x64xf8E4M3FN, axis = 0> -> tensor<1024x64xbf16>
  %qn = moe.quantize %s : tensor<1024x64xf32> -> !moe.mx<1024x64xf8E4M3FN, axis = 1>
  %yn = moe.dequantize %qn : !moe.mx<1024x64xf8E4M3FN, axis = 1> -> tensor<1024x64xbf16>
  return %yk, %yn : tensor<1024x64xbf16>, tensor<1024x64xbf16>
}

// The product in the other operand order is another kernel (g[t] * w[t, k]).
// CHECK-LABEL: func.func @weighted_reversed(
// CHECK: call @moe_mx_round_trip_pair_1024x64_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16_gather_1024_scaled_4_xs(%arg1, %{{.*}}, %arg0)
func.func @weighted_reversed(%w: tensor<256x4xf32>, %g: tensor<256x64xf32>, %idx: tensor<256x4xi32>)
    -> (tensor<1024x64xbf16>, tensor<1024x64xbf16>) {
  %e = tensor.empty() : tensor<256x4x64xf32>
  %p = linalg.generic {indexing_maps = [affine_map<(t, k, h) -> (t, k)>, affine_map<(t, k, h) -> (t, h)>,
                                        affine_map<(t, k, h) -> (t, k, h)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w, %g : tensor<256x4xf32>, tensor<256x64xf32>) outs(%e : tensor<256x4x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %b, %a : f32
    linalg.yield %m : f32
  } -> tensor<256x4x64xf32>
  %c = tensor.collapse_shape %p [[0, 1], [2]] : tensor<256x4x64xf32> into tensor<1024x64xf32>
  %i = tensor.collapse_shape %idx [[0, 1]] : tensor<256x4xi32> into tensor<1024xi32>
  %i1 = tensor.expand_shape %i [[0, 1]] output_shape [1024, 1] : tensor<1024xi32> into tensor<1024x1xi32>
  %s, %o, %n, %pos = moe.dispatch %c, %i1 experts(16)
      : tensor<1024x64xf32>, tensor<1024x1xi32> -> tensor<1024x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<1024x1xi32>
  %qk = moe.quantize %s : tensor<1024x64xf32> -> !moe.mx<1024x64xf8E4M3FN, axis = 0>
  %yk = moe.dequantize %qk : !moe.mx<1024x64xf8E4M3FN, axis = 0> -> tensor<1024x64xbf16>
  %qn = moe.quantize %s : tensor<1024x64xf32> -> !moe.mx<1024x64xf8E4M3FN, axis = 1>
  %yn = moe.dequantize %qn : !moe.mx<1024x64xf8E4M3FN, axis = 1> -> tensor<1024x64xbf16>
  return %yk, %yn : tensor<1024x64xbf16>, tensor<1024x64xbf16>
}

// Rows something else reads too stay gathered: the pair kernel reads them.
// CHECK-LABEL: func.func @rows_read_elsewhere(
// CHECK: %[[S:.*]] = linalg.generic {{.*}} attrs = {moe.gathered_rows}
// CHECK: call @moe_mx_round_trip_pair_4576x64_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16(%[[S]])
func.func @rows_read_elsewhere(%x: tensor<1024x64xf32>, %idx: tensor<1024x4xi32>)
    -> (tensor<4576x64xbf16>, tensor<4576x64xbf16>, tensor<4576x64xf32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(16) pad_to(32)
      : tensor<1024x64xf32>, tensor<1024x4xi32>
      -> tensor<4576x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %qk = moe.quantize %s : tensor<4576x64xf32> -> !moe.mx<4576x64xf8E4M3FN, axis = 0>
  %yk = moe.dequantize %qk : !moe.mx<4576x64xf8E4M3FN, axis = 0> -> tensor<4576x64xbf16>
  %qn = moe.quantize %s : tensor<4576x64xf32> -> !moe.mx<4576x64xf8E4M3FN, axis = 1>
  %yn = moe.dequantize %qn : !moe.mx<4576x64xf8E4M3FN, axis = 1> -> tensor<4576x64xbf16>
  return %yk, %yn, %s : tensor<4576x64xbf16>, tensor<4576x64xbf16>, tensor<4576x64xf32>
}

// Split to hold less (a wide value lives between the two round trips'
// readers): one pair kernel per result, each reading the rows from the tokens.
// CHECK-LABEL: func.func @split(
// CHECK-NOT: moe.gathered_rows
// CHECK: call @moe_mx_round_trip_pair_4576x64_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16_n_only_gather_1024(%arg0, %[[SRC:.*]]) : (tensor<1024x64xf32>, tensor<4576xindex>) -> tensor<4576x64xbf16>
// CHECK: linalg.generic
// CHECK: call @moe_mx_round_trip_pair_4576x64_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16_k_only_gather_1024(%arg0, %[[SRC]]) : (tensor<1024x64xf32>, tensor<4576xindex>) -> tensor<4576x64xbf16>
// PTX-LABEL: kernel module moe_mx_round_trip_pair_4576x64_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16_n_only_gather_1024_kernel
// PTX: st.shared.b32
// PTX-LABEL: kernel module moe_mx_round_trip_pair_4576x64_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16_k_only_gather_1024_kernel
func.func @split(%x: tensor<1024x64xf32>, %idx: tensor<1024x4xi32>)
    -> (tensor<4576x64xf32>, tensor<4576x64xbf16>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(16) pad_to(32)
      : tensor<1024x64xf32>, tensor<1024x4xi32>
      -> tensor<4576x64xf32>, tensor<17xi32>, tensor<16xi32>, tensor<1024x4xi32>
  %qn = moe.quantize %s : tensor<4576x64xf32> -> !moe.mx<4576x64xf8E4M3FN, axis = 1>
  %yn = moe.dequantize %qn : !moe.mx<4576x64xf8E4M3FN, axis = 1> -> tensor<4576x64xbf16>
  %e = tensor.empty() : tensor<4576x64x16xf32>
  %wide = linalg.generic {indexing_maps = [affine_map<(r, h, j) -> (r, h)>, affine_map<(r, h, j) -> (r, h, j)>],
                          iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%yn : tensor<4576x64xbf16>) outs(%e : tensor<4576x64x16xf32>) {
  ^bb0(%a: bf16, %out: f32):
    %f = arith.extf %a : bf16 to f32
    linalg.yield %f : f32
  } -> tensor<4576x64x16xf32>
  %zero = arith.constant 0.0 : f32
  %e2 = tensor.empty() : tensor<4576x64xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e2 : tensor<4576x64xf32>) -> tensor<4576x64xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(r, h, j) -> (r, h, j)>, affine_map<(r, h, j) -> (r, h)>],
                         iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%wide : tensor<4576x64x16xf32>) outs(%init : tensor<4576x64xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %t = arith.addf %acc, %a : f32
    linalg.yield %t : f32
  } -> tensor<4576x64xf32>
  %qk = moe.quantize %s : tensor<4576x64xf32> -> !moe.mx<4576x64xf8E4M3FN, axis = 0>
  %yk = moe.dequantize %qk : !moe.mx<4576x64xf8E4M3FN, axis = 0> -> tensor<4576x64xbf16>
  return %sum, %yk : tensor<4576x64xf32>, tensor<4576x64xbf16>
}

// A blockwise FP8 pair quantize (both tilings of the dispatched rows, for
// an FP8 GEMM and a weight gradient) reads the rows from the tokens too.
// The dispatch gathers only the rows before the groups' end (nothing reads
// later ones); the kernel takes the gather's source indices as a [rows]
// tensor and reads them before that end only (`_live_`).
// CHECK-LABEL: func.func @fp8_pair(
// CHECK-NOT: moe.gathered_rows
// CHECK: %[[SRC:.*]] = tensor.insert_slice %{{.*}} into %{{.*}}[0] [%{{.*}}] [1] : tensor<?xindex> into tensor<1020xindex>
// CHECK: call @moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_f32_live_i32_gather_512(%arg0, %[[SRC]], %{{.*}}) : (tensor<512x256xf32>, tensor<1020xindex>, tensor<5xi32>)
// CHECK-NOT: moe.gathered_rows
// CHECK: return
// Each of a thread's 16 rows of a region: 4 columns of its source row in
// one 16-byte load.
// PTX-LABEL: kernel module moe_fp8block_quantize_pair_1020x256_e4m3_pow2_e4m3_pow2_f32_live_i32_gather_512_kernel
// PTX-COUNT-16: ld.global.v4.b32
func.func @fp8_pair(%x: tensor<512x256xf32>, %idx: tensor<512x1xi32>,
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

// A pair computing a SwiGLU of dispatched rows reads h, not rows it
// quantizes: it is not a gathered-rows pair, and the gather stays.
// CHECK-LABEL: func.func @fp8_swiglu_of_dispatched(
// CHECK: %[[S:.*]] = linalg.generic {{.*}} attrs = {moe.gathered_rows}
// CHECK: call @moe_fp8block_quantize_pair_1020x128_e4m3_pow2_e4m3_pow2_f32_live_i32_of_swiglu(%{{.*}}, %{{.*}}) : (tensor<1020x256xf32>, tensor<5xi32>)
// CHECK-NOT: _gather_
// CHECK: return
func.func @fp8_swiglu_of_dispatched(%x: tensor<512x256xf32>, %idx: tensor<512x1xi32>,
                                    %w: tensor<4x128x384xf32>, %dy: tensor<1020x384xf32>)
    -> (tensor<1020x384xf32>, tensor<4x128x384xf32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(128)
      : tensor<512x256xf32>, tensor<512x1xi32>
      -> tensor<1020x256xf32>, tensor<5xi32>, tensor<4xi32>, tensor<512x1xi32>
  %a = moe.swiglu %s : tensor<1020x256xf32> -> tensor<1020x128xf32>
  %aq = moe.quantize %a : tensor<1020x128xf32>
      -> !moe.fp8block<1020x128xf8E4M3FN, block = [1, 128], pow2>
  %wq = moe.quantize %w : tensor<4x128x384xf32>
      -> !moe.fp8block<4x128x384xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %aq, %wq, %o
      : !moe.fp8block<1020x128xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x128x384xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<1020x384xf32>
  %ac = moe.quantize %a : tensor<1020x128xf32>
      -> !moe.fp8block<1020x128xf8E4M3FN, block = [128, 1], pow2>
  %dyc = moe.quantize %dy : tensor<1020x384xf32>
      -> !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>
  %dw = moe.grouped_matmul_wgrad %ac, %dyc, %o
      : !moe.fp8block<1020x128xf8E4M3FN, block = [128, 1], pow2>,
        !moe.fp8block<1020x384xf8E4M3FN, block = [128, 1], pow2>, tensor<5xi32>
      -> tensor<4x128x384xf32>
  return %y, %dw : tensor<1020x384xf32>, tensor<4x128x384xf32>
}
