// --traffic-report: each generic kernel's bytes, every buffer it reads and
// every buffer it writes counted whole and once; the dedicated kernels (here
// the bf16 GEMM on wgmma) are not reported.
// RUN: moe-compile %s --target=sm_90a --traffic-report --mlir-print-op-on-diagnostic=false -o %t.so 2>&1 | FileCheck %s
// CHECK-DAG: remark: generic kernel swiglu_kernel: reads 524288 bytes, writes 262144 bytes (whole buffers)
// CHECK-DAG: remark: generic kernel scale_kernel: reads 262144 bytes, writes 65536 bytes (whole buffers)
// CHECK-NOT: generic kernel moe_
//
// bench/kernel_traffic.py joins the report with a profile of the same
// artifact (Inputs/traffic-profile.txt, made up: swiglu 4 calls of 0.001 ms,
// scale once in 0.002 ms, a dedicated GEMM the report does not list):
// RUN: moe-compile %s --target=sm_90a --traffic-report -o %t.so 2> %t.report
// RUN: %python %moe_src_root/bench/kernel_traffic.py %S/Inputs/traffic-profile.txt %t.report --copy-rate 1 | FileCheck %s --check-prefix=JOIN
// Sorted by the time above what 1 TB/s allows: scale, 327680 bytes in 0.002
// ms (0.16 TB/s, 0.0017 ms above), then swiglu, 786432 bytes x 4 calls in
// 0.004 ms (0.79 TB/s, 0.0009 ms above).
// JOIN: ms/step  calls   MB/call   TB/s  copy%     over  kernel   (copy rate 1 TB/s)
// JOIN-NEXT: 0.002 1 0.3 0.16 16% 0.002 scale_kernel
// JOIN-NEXT: 0.004 4 0.8 0.79 79% 0.001 swiglu_kernel
// JOIN-NEXT: 0.006 ms in 2 generic kernels, 0.003 ms at the copy rate
// (FileCheck matches runs of spaces as one.)
//
// RUN: not %python %moe_src_root/bench/kernel_traffic.py %S/Inputs/traffic-profile.txt %t.missing 2>&1 | FileCheck %s --check-prefix=MISSING
// MISSING: kernel_traffic.py: [Errno 2] No such file or directory
// RUN: not %python %moe_src_root/bench/kernel_traffic.py %t.report %t.report 2>&1 | FileCheck %s --check-prefix=NONE
// NONE: kernel_traffic.py: no kernel is in both the profile and the report
// RUN: not %python %moe_src_root/bench/kernel_traffic.py %S/Inputs/traffic-profile.txt %t.report --copy-rate 0 2>&1 | FileCheck %s --check-prefix=RATE
// RATE: --copy-rate must be positive

func.func @swiglu(%h: tensor<512x256xf32>) -> tensor<512x128xf32> {
  %a = moe.swiglu %h : tensor<512x256xf32> -> tensor<512x128xf32>
  return %a : tensor<512x128xf32>
}

func.func @scale(%x: tensor<128x256xf32>, %s: tensor<128x256xf32>) -> tensor<128x256xbf16> {
  %e = tensor.empty() : tensor<128x256xbf16>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x, %s : tensor<128x256xf32>, tensor<128x256xf32>) outs(%e : tensor<128x256xbf16>) {
  ^bb0(%a: f32, %b: f32, %o: bf16):
    %m = arith.mulf %a, %b : f32
    %t = arith.truncf %m : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<128x256xbf16>
  return %y : tensor<128x256xbf16>
}

func.func @gemm(%x: tensor<256x128xbf16>, %w: tensor<1x128x256xbf16>, %off: tensor<2xi32>) -> tensor<256x256xf32> {
  %y = moe.grouped_matmul %x, %w, %off
      : tensor<256x128xbf16>, tensor<1x128x256xbf16>, tensor<2xi32> -> tensor<256x256xf32>
  return %y : tensor<256x256xf32>
}
