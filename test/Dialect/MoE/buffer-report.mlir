// RUN: moe-opt %s -split-input-file -moe-buffer-report -o /dev/null 2>&1 | FileCheck %s
// The pipelines run it after -moe-buffer-lifetimes with `buffer-report`:
// RUN: moe-compile %S/../../Integration/CPU/grouped_matmul.mlir --target=cpu \
// RUN:   --buffer-report -o %t.so 2>&1 | FileCheck %s --check-prefix=COMPILE
// COMPILE: remark: buffers of @{{.*}}: peak {{[0-9.]+}} {{B|KiB|MiB}} ({{[0-9]+}} live)

// The peak counts what is allocated and not yet freed, in program order:
// 4 KiB + 256 B while both live; index elements are 8 bytes.
// CHECK: remark: buffers of @peak: peak 4.25 KiB (2 live) at loc({{.*}}:13:{{[0-9]+}}); largest: 4.00 KiB memref<1024xf32>, 256 B memref<64xf32>
func.func @peak(%c: f32) {
  %a = memref.alloc() : memref<64xf32>
  linalg.fill ins(%c : f32) outs(%a : memref<64xf32>)
  %b = memref.alloc() : memref<1024xf32>
  linalg.fill ins(%c : f32) outs(%b : memref<1024xf32>)
  memref.dealloc %b : memref<1024xf32>
  memref.dealloc %a : memref<64xf32>
  %i = memref.alloc() : memref<256xindex>
  memref.dealloc %i : memref<256xindex>
  return
}

// -----

// Freed through a view's base buffer; a buffer still held at the return
// counts to the end; a dynamic size is not counted but reported.
// CHECK: remark: buffers of @held: peak 2.00 KiB (1 live) at loc({{.*}}:32:{{[0-9]+}}); largest: 2.00 KiB memref<512xf32>; not counted: 1 of dynamic size or element type
func.func @held(%n: index) -> memref<512xf32> {
  %a = memref.alloc() : memref<256xf32>
  %v = memref.subview %a[128] [128] [1] : memref<256xf32> to memref<128xf32, strided<[1], offset: 128>>
  %base, %off, %size, %stride = memref.extract_strided_metadata %v : memref<128xf32, strided<[1], offset: 128>> -> memref<f32>, index, index, index
  memref.dealloc %base : memref<f32>
  %r = memref.alloc() : memref<512xf32>
  %d = memref.alloc(%n) : memref<?xf32>
  memref.dealloc %d : memref<?xf32>
  return %r : memref<512xf32>
}
