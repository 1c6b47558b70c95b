// Bad input to the tool itself: moe-opt must reject it with a located
// diagnostic (file:line:col: error: ...) and a non-zero exit, and never
// crash (`not` fails on a crash; FileCheck rejects any stack dump).

// Malformed IR, one chunk per split marker below; every chunk fails on its own
// and every error must be one of the CHECKed ones.
// RUN: not moe-opt %s -split-input-file 2>&1 | FileCheck %s --implicit-check-not=error: --implicit-check-not="Stack dump" --implicit-check-not="PLEASE submit"

// An empty file is an empty module.
// RUN: printf '' > %t.empty
// RUN: moe-opt %t.empty 2>&1 | FileCheck %s --check-prefix=EMPTY --implicit-check-not=error:
// EMPTY: module {
// EMPTY-NEXT: }

// Comments and blank lines only.
// RUN: printf '// nothing here\n\n   \n' > %t.comments
// RUN: moe-opt %t.comments 2>&1 | FileCheck %s --check-prefix=EMPTY --implicit-check-not=error:

// Binary junk, starting with a NUL byte.
// RUN: printf '\x00\xff\xfe\x01\x80\x7f\xc3\x28moe\x00\xfe' > %t.junk
// RUN: not moe-opt %t.junk 2>&1 | FileCheck %s --check-prefix=JUNK --implicit-check-not="Stack dump" --implicit-check-not="PLEASE submit"
// JUNK: {{.*}}.tmp.junk:1:{{[0-9]+}}: error: unexpected character

// Binary junk after a valid function.
// RUN: printf 'func.func @f() {\n  return\n}\n\xff\xfe\x00\x01' > %t.junk2
// RUN: not moe-opt %t.junk2 2>&1 | FileCheck %s --check-prefix=JUNK2 --implicit-check-not="Stack dump" --implicit-check-not="PLEASE submit"
// JUNK2: {{.*}}.tmp.junk2:4:1: error: unexpected character

// A UTF-8 byte-order mark is not MLIR.
// RUN: printf '\xef\xbb\xbffunc.func @f() {\n  return\n}\n' > %t.bom
// RUN: not moe-opt %t.bom 2>&1 | FileCheck %s --check-prefix=BOM --implicit-check-not="Stack dump" --implicit-check-not="PLEASE submit"
// BOM: {{.*}}.tmp.bom:1:1: error: unexpected character

// Truncated in the middle of an op's type list (the file just ends).
// (%%%% is lit's escape for printf's %%, which prints one %.)
// RUN: printf 'func.func @f(%%%%x: tensor<4x64xf32>) {\n  %%%%0 = moe.swiglu %%%%x : tensor<4x64xf32> -> ' > %t.trunc
// RUN: not moe-opt %t.trunc 2>&1 | FileCheck %s --check-prefix=TRUNC --implicit-check-not="Stack dump" --implicit-check-not="PLEASE submit"
// TRUNC: {{.*}}.tmp.trunc:2:{{[0-9]+}}: error: expected non-function type

// Truncated in the middle of an !moe.mx type.
// RUN: printf 'func.func @f(%%%%q: !moe.mx<4x64xf8E4M3FN, axis = ' > %t.trunc_mx
// RUN: not moe-opt %t.trunc_mx 2>&1 | FileCheck %s --check-prefix=TRUNC-MX --implicit-check-not="Stack dump" --implicit-check-not="PLEASE submit"
// TRUNC-MX: {{.*}}.tmp.trunc_mx:1:25: error: unbalanced '<' character in pretty dialect name

// Truncated right after a region opened.
// RUN: printf 'func.func @f(%%%%s: tensor<12x16xbf16>, %%%%o: tensor<5xi32>) {\n  %%%%y = moe.experts %%%%s, %%%%o : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16> {\n' > %t.trunc_region
// RUN: not moe-opt %t.trunc_region 2>&1 | FileCheck %s --check-prefix=TRUNC-REGION --implicit-check-not="Stack dump" --implicit-check-not="PLEASE submit"
// TRUNC-REGION: {{.*}}.tmp.trunc_region:2:86: error: expected operation name in quotes

// A file that does not exist: no location to give, but an error and no crash.
// RUN: not moe-opt %t.does-not-exist 2>&1 | FileCheck %s --check-prefix=NOFILE --implicit-check-not="Stack dump" --implicit-check-not="PLEASE submit"
// NOFILE: cannot open input file '{{.*}}.tmp.does-not-exist'

// -----

// Unbalanced braces: the function body is never closed.
func.func @unclosed() {
  return
// At the end of the chunk, the error points just past the last token.
// CHECK: bad-input.mlir:[[@LINE-2]]:9: error: expected operation name in quotes

// -----

// Unbalanced braces: one '}' too many.
func.func @extra_brace() {
  return
}
}
// The error points just past the '}' that closed the function.
// CHECK: bad-input.mlir:[[@LINE-3]]:2: error: expected operation name in quotes

// -----

// Unbalanced brackets in a tensor type.
func.func @bad_tensor(%x: tensor<4x64xf32) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: expected '>'
  return
}

// -----

// An unterminated string attribute.
func.func @bad_string() attributes {note = "abc} {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: expected '"' in string literal
  return
}

// -----

// An unknown type of the moe dialect.
func.func @unknown_type(%x: !moe.nope<4x64xf8E4M3FN, axis = 1>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: unknown  type `nope` in dialect `moe`
  return
}

// -----

// A type of a dialect that does not exist.
func.func @unknown_dialect(%x: !nodialect.t<4>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: `!"nodialect"<"t<4>">` type created with unregistered dialect
  return
}

// -----

// !moe.mx without its axis.
func.func @mx_missing_axis(%q: !moe.mx<4x64xf8E4M3FN>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: expected ','
  return
}

// -----

// !moe.mx with `axis` but no value.
func.func @mx_axis_no_value(%q: !moe.mx<4x64xf8E4M3FN, axis>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: expected '='
  return
}

// -----

// !moe.mx with a negative axis.
func.func @mx_negative_axis(%q: !moe.mx<4x64xf8E4M3FN, axis = -1>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: expects the MX axis to be in [0, rank), got axis = -1 for a 2-d MX tensor
  return
}

// -----

// !moe.mx with a fractional axis.
func.func @mx_float_axis(%q: !moe.mx<4x64xf8E4M3FN, axis = 1.5>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: expected integer value
  return
}

// -----

// !moe.mx with block = 0.
func.func @mx_block_zero(%q: !moe.mx<4x64xf8E4M3FN, axis = 1, block = 0>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: expects the MX block size to be in [1, 1048576], got block = 0
  return
}

// -----

// !moe.mx with a negative block.
func.func @mx_block_negative(%q: !moe.mx<4x64xf8E4M3FN, axis = 1, block = -32>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: expects the MX block size to be in [1, 1048576], got block = -32
  return
}

// -----

// !moe.mx with a block that does not fit in 64 bits.
func.func @mx_block_huge(%q: !moe.mx<4x64xf8E4M3FN, axis = 1, block = 99999999999999999999>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: integer value too large
  return
}

// -----

// !moe.mx with trailing garbage.
func.func @mx_trailing(%q: !moe.mx<4x64xf8E4M3FN, axis = 1, block = 32, extra = 1>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: expected '>'
  return
}

// -----

// !moe.mx without a shape.
func.func @mx_no_shape(%q: !moe.mx<, axis = 1>) {
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: expected non-function type
  return
}

// -----

// router: top_k(-1).
func.func @topk_negative(%l: tensor<16x8xf32>) {
  %i, %w = moe.router %l top_k(-1) softmax : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: 'moe.router' op attribute 'top_k' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1
  return
}

// -----

// router: top_k(k) with a non-integer k.
func.func @topk_float(%l: tensor<16x8xf32>) {
  %i, %w = moe.router %l top_k(2.0) softmax : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: floating point value not valid for specified type
  return
}

// -----

// dispatch: experts(N) with N beyond 64 bits.
func.func @experts_overflow(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(99999999999999999999) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: integer constant out of range for attribute
  return
}

// -----

// dispatch: the largest int64 expert count must not overflow offsets' size.
func.func @experts_int64_max(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(9223372036854775807) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: 'moe.dispatch' op expects 9223372036854775808 offsets (one more than the 9223372036854775807 experts), got 5
  return
}

// -----

// dispatch: pad_to(int64 max) overflows the worst-case row count.
func.func @pad_to_int64_max(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(9223372036854775807) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: 'moe.dispatch' op expects the worst-case row count (6 tokens x 2 + 4 experts x (pad_to - 1), pad_to = 9223372036854775807) to fit in 64 bits
  return
}

// -----

// An unknown op of the moe dialect.
func.func @unknown_op(%x: tensor<4xf32>) {
  %0 = moe.nope %x : tensor<4xf32>
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: custom op 'moe.nope' is unknown
  return
}

// -----

// A use of an undefined value.
func.func @undefined_value() {
  %0 = moe.swiglu %undefined : tensor<4x64xf32> -> tensor<4x32xf32>
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: use of undeclared SSA value name
  return
}

// -----

// An operand of the wrong type for its use.
func.func @wrong_operand_type(%x: tensor<4x64xf32>) {
  %0 = moe.swiglu %x : tensor<4x64xbf16> -> tensor<4x32xf32>
// CHECK: bad-input.mlir:[[@LINE-1]]:{{[0-9]+}}: error: use of value '%x' expects different type than prior uses: 'tensor<4x64xbf16>' vs 'tensor<4x64xf32>'
  return
}
