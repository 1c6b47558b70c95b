// RUN: moe-opt %s --moe-hoist-quantize --split-input-file | FileCheck %s

// A rowwise quantize of dispatched rows: the tokens are quantized (T rows
// instead of T * k) and the dispatch moves 8-bit rows with their scales.
// CHECK-LABEL: func.func @dispatch
// CHECK-SAME: (%[[X:.*]]: tensor<16x64xf32>, %[[IDX:.*]]: tensor<16x2xi32>)
// CHECK: %[[Q:.*]] = moe.quantize %[[X]] scale(floor) : tensor<16x64xf32> -> !moe.mx<16x64xf8E4M3FN, axis = 1>
// CHECK: %[[S:[^,]*]], %[[O:[^,]*]], %[[C:[^,]*]], %[[P:[^ ]*]] = moe.dispatch %[[Q]], %[[IDX]] experts(4) pad_to(32) : !moe.mx<16x64xf8E4M3FN, axis = 1>, tensor<16x2xi32> -> !moe.mx<128x64xf8E4M3FN, axis = 1>, tensor<5xi32>, tensor<4xi32>, tensor<16x2xi32>
// CHECK-NOT: moe.quantize
// CHECK: return %[[S]], %[[O]], %[[C]], %[[P]]
func.func @dispatch(%x: tensor<16x64xf32>, %idx: tensor<16x2xi32>)
    -> (!moe.mx<128x64xf8E4M3FN, axis = 1>, tensor<5xi32>, tensor<4xi32>, tensor<16x2xi32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(32)
      : tensor<16x64xf32>, tensor<16x2xi32> -> tensor<128x64xf32>, tensor<5xi32>, tensor<4xi32>, tensor<16x2xi32>
  %q = moe.quantize %s scale(floor) : tensor<128x64xf32> -> !moe.mx<128x64xf8E4M3FN, axis = 1>
  return %q, %o, %c, %p : !moe.mx<128x64xf8E4M3FN, axis = 1>, tensor<5xi32>, tensor<4xi32>, tensor<16x2xi32>
}

// -----

// An expert-parallel layer: dispatch, exchange, local dispatch, quantize.
// The quantize moves before all three; the exchange sends MX rows.
shard.grid @ep(shape = 2)
// CHECK-LABEL: func.func @exchange
// CHECK: %[[Q:.*]] = moe.quantize %{{.*}} : tensor<16x64xbf16> -> !moe.mx<16x64xf8E5M2, axis = 1>
// CHECK: %[[S:[^,]*]], %{{[^,]*}}, %[[C:[^,]*]], %{{.*}} = moe.dispatch %[[Q]], {{.*}} -> !moe.mx<32x64xf8E5M2, axis = 1>,
// CHECK: %[[R:[^,]*]], %[[RC:[^ ]*]] = moe.all_to_all %[[S]], %[[C]] on @ep grid_axes = [0] : !moe.mx<32x64xf8E5M2, axis = 1>, tensor<4xi32> -> !moe.mx<64x64xf8E5M2, axis = 1>, tensor<4xi32>
// CHECK: %[[L:[^,]*]], %{{[^,]*}}, %{{.*}}, %{{.*}} = moe.dispatch %[[R]], {{.*}} experts(2) : !moe.mx<64x64xf8E5M2, axis = 1>, tensor<64x1xi32> -> !moe.mx<64x64xf8E5M2, axis = 1>,
// CHECK-NOT: moe.quantize
// CHECK: return %[[L]], %[[RC]]
func.func @exchange(%x: tensor<16x64xbf16>, %idx: tensor<16x2xi32>, %local: tensor<64x1xi32>)
    -> (!moe.mx<64x64xf8E5M2, axis = 1>, tensor<4xi32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4)
      : tensor<16x64xbf16>, tensor<16x2xi32> -> tensor<32x64xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<16x2xi32>
  %r, %rc = moe.all_to_all %s, %c on @ep grid_axes = [0]
      : tensor<32x64xbf16>, tensor<4xi32> -> tensor<64x64xbf16>, tensor<4xi32>
  %l, %lo, %lc, %lp = moe.dispatch %r, %local experts(2)
      : tensor<64x64xbf16>, tensor<64x1xi32> -> tensor<64x64xbf16>, tensor<3xi32>, tensor<2xi32>, tensor<64x1xi32>
  %q = moe.quantize %l : tensor<64x64xbf16> -> !moe.mx<64x64xf8E5M2, axis = 1>
  return %q, %rc : !moe.mx<64x64xf8E5M2, axis = 1>, tensor<4xi32>
}

// -----

// Left alone: rows read by something else too (moving the quantize would
// move the rows twice), and a columnwise quantize (its blocks mix rows).
// CHECK-LABEL: func.func @stays
// CHECK: %[[S:[^,]*]], {{.*}} = moe.dispatch %{{.*}} : tensor<16x64xf32>, tensor<16x2xi32> -> tensor<128x64xf32>
// CHECK: moe.quantize %[[S]] : tensor<128x64xf32> -> !moe.mx<128x64xf8E4M3FN, axis = 1>
// CHECK: %[[S2:[^,]*]], {{.*}} = moe.dispatch %{{.*}} : tensor<16x64xf32>, tensor<16x2xi32> -> tensor<128x64xf32>
// CHECK: moe.quantize %[[S2]] : tensor<128x64xf32> -> !moe.mx<128x64xf8E4M3FN, axis = 0>
func.func @stays(%x: tensor<16x64xf32>, %idx: tensor<16x2xi32>)
    -> (!moe.mx<128x64xf8E4M3FN, axis = 1>, tensor<128x64xf32>, !moe.mx<128x64xf8E4M3FN, axis = 0>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(32)
      : tensor<16x64xf32>, tensor<16x2xi32> -> tensor<128x64xf32>, tensor<5xi32>, tensor<4xi32>, tensor<16x2xi32>
  %q = moe.quantize %s : tensor<128x64xf32> -> !moe.mx<128x64xf8E4M3FN, axis = 1>
  %s2, %o2, %c2, %p2 = moe.dispatch %x, %idx experts(4) pad_to(32)
      : tensor<16x64xf32>, tensor<16x2xi32> -> tensor<128x64xf32>, tensor<5xi32>, tensor<4xi32>, tensor<16x2xi32>
  %q2 = moe.quantize %s2 : tensor<128x64xf32> -> !moe.mx<128x64xf8E4M3FN, axis = 0>
  return %q, %s, %q2 : !moe.mx<128x64xf8E4M3FN, axis = 1>, tensor<128x64xf32>, !moe.mx<128x64xf8E4M3FN, axis = 0>
}

// -----

// The bf16 recipe: rows narrowed to bf16 after an exchange and a dispatch
// are narrowed before both, which then move bf16 rows (half the bytes);
// the backward of the fused MLP (gemm_type(bf16): it rounds f32 rows to
// bf16 itself) reads the bf16 rows, so the f32 rows have no other reader.
shard.grid @ep(shape = 2)
#id = affine_map<(i, j) -> (i, j)>
// CHECK-LABEL: func.func @narrow
// CHECK-SAME: (%[[X:[^:]*]]: tensor<16x64xf32>
// CHECK: %[[N:.*]] = linalg.generic {{.*}} ins(%[[X]] : tensor<16x64xf32>) outs(%{{.*}} : tensor<16x64xbf16>)
// CHECK: arith.truncf
// CHECK: %[[S:[^,]*]], %[[O:[^,]*]], %[[C:[^,]*]], %{{.*}} = moe.dispatch %[[N]], {{.*}} : tensor<16x64xbf16>, tensor<16x2xi32> -> tensor<32x64xbf16>,
// CHECK: %[[R:[^,]*]], %{{.*}} = moe.all_to_all %[[S]], %[[C]] on @ep grid_axes = [0] : tensor<32x64xbf16>, tensor<4xi32> -> tensor<64x64xbf16>, tensor<4xi32>
// CHECK-NOT: arith.truncf
// CHECK: moe.grouped_mlp %[[R]]
// CHECK: moe.grouped_mlp_backward %[[R]], {{.*}} gemm_type(bf16) : tensor<64x64xbf16>,
func.func @narrow(%x: tensor<16x64xf32>, %idx: tensor<16x2xi32>, %w1: tensor<4x64x64xbf16>,
                  %w2: tensor<4x32x64xbf16>, %o: tensor<5xi32>, %dy: tensor<64x64xf32>)
    -> (tensor<64x64xf32>, tensor<64x64xf32>) {
  %s, %off, %c, %p = moe.dispatch %x, %idx experts(4)
      : tensor<16x64xf32>, tensor<16x2xi32> -> tensor<32x64xf32>, tensor<5xi32>, tensor<4xi32>, tensor<16x2xi32>
  %r, %rc = moe.all_to_all %s, %c on @ep grid_axes = [0]
      : tensor<32x64xf32>, tensor<4xi32> -> tensor<64x64xf32>, tensor<4xi32>
  %e = tensor.empty() : tensor<64x64xbf16>
  %n = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%r : tensor<64x64xf32>) outs(%e : tensor<64x64xbf16>) {
    ^bb0(%in: f32, %out: bf16):
      %t = arith.truncf %in : f32 to bf16
      linalg.yield %t : bf16
  } -> tensor<64x64xbf16>
  %y = moe.grouped_mlp %n, %w1, %w2, %o : tensor<64x64xbf16>, tensor<4x64x64xbf16>, tensor<4x32x64xbf16>, tensor<5xi32> -> tensor<64x64xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %r, %w1, %w2, %o, %dy gemm_type(bf16)
      : tensor<64x64xf32>, tensor<4x64x64xbf16>, tensor<4x32x64xbf16>, tensor<5xi32>, tensor<64x64xf32>
      -> tensor<64x64xf32>, tensor<4x64x64xbf16>, tensor<4x32x64xbf16>
  return %y, %dx : tensor<64x64xf32>, tensor<64x64xf32>
}

// -----

// Rows read in f32 by another op stay f32 (narrowing them first would
// change what that op reads).
#id = affine_map<(i, j) -> (i, j)>
// CHECK-LABEL: func.func @other_reader
// CHECK: moe.dispatch %{{.*}} : tensor<16x64xf32>
// CHECK: linalg.generic
// CHECK: arith.truncf
func.func @other_reader(%x: tensor<16x64xf32>, %idx: tensor<16x2xi32>)
    -> (tensor<32x64xbf16>, tensor<32x64xf32>) {
  %s, %off, %c, %p = moe.dispatch %x, %idx experts(4)
      : tensor<16x64xf32>, tensor<16x2xi32> -> tensor<32x64xf32>, tensor<5xi32>, tensor<4xi32>, tensor<16x2xi32>
  %e = tensor.empty() : tensor<32x64xbf16>
  %n = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%s : tensor<32x64xf32>) outs(%e : tensor<32x64xbf16>) {
    ^bb0(%in: f32, %out: bf16):
      %t = arith.truncf %in : f32 to bf16
      linalg.yield %t : bf16
  } -> tensor<32x64xbf16>
  %twice = arith.addf %s, %s : tensor<32x64xf32>
  return %n, %twice : tensor<32x64xbf16>, tensor<32x64xf32>
}
