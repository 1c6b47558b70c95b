// Kernel modules that differ only in their names merge into the first;
// their launches follow it. A module whose body differs stays.
// RUN: moe-opt %s -split-input-file -moe-gpu-merge-kernels | FileCheck %s

// CHECK-LABEL: gpu.module @step_layers_0_kernel
// CHECK-NOT: gpu.module @step_layers_1_kernel
// CHECK: gpu.module @step_layers_1_other_kernel
// CHECK-NOT: gpu.module
// CHECK-LABEL: func.func @step
// CHECK: gpu.launch_func @step_layers_0_kernel::@step_layers_0_kernel
// CHECK: gpu.launch_func @step_layers_0_kernel::@step_layers_0_kernel
// CHECK: gpu.launch_func @step_layers_1_other_kernel::@step_layers_1_other_kernel
module attributes {gpu.container_module} {
  gpu.module @step_layers_0_kernel {
    gpu.func @step_layers_0_kernel(%a: memref<16xf32>) kernel {
      %i = gpu.thread_id x
      %v = memref.load %a[%i] : memref<16xf32>
      %w = arith.addf %v, %v : f32
      memref.store %w, %a[%i] : memref<16xf32>
      gpu.return
    }
  }
  gpu.module @step_layers_1_kernel {
    gpu.func @step_layers_1_kernel(%a: memref<16xf32>) kernel {
      %i = gpu.thread_id x
      %v = memref.load %a[%i] : memref<16xf32>
      %w = arith.addf %v, %v : f32
      memref.store %w, %a[%i] : memref<16xf32>
      gpu.return
    } loc("model.layers.1")
  }
  gpu.module @step_layers_1_other_kernel {
    gpu.func @step_layers_1_other_kernel(%a: memref<16xf32>) kernel {
      %i = gpu.thread_id x
      %v = memref.load %a[%i] : memref<16xf32>
      %w = arith.mulf %v, %v : f32
      memref.store %w, %a[%i] : memref<16xf32>
      gpu.return
    }
  }
  func.func @step(%a: memref<16xf32>) {
    %c1 = arith.constant 1 : index
    %c16 = arith.constant 16 : index
    gpu.launch_func @step_layers_0_kernel::@step_layers_0_kernel blocks in (%c1, %c1, %c1) threads in (%c16, %c1, %c1) args(%a : memref<16xf32>)
    gpu.launch_func @step_layers_1_kernel::@step_layers_1_kernel blocks in (%c1, %c1, %c1) threads in (%c16, %c1, %c1) args(%a : memref<16xf32>)
    gpu.launch_func @step_layers_1_other_kernel::@step_layers_1_other_kernel blocks in (%c1, %c1, %c1) threads in (%c16, %c1, %c1) args(%a : memref<16xf32>)
    return
  }
}

// -----

// Inside one module, kernel functions that differ only in their names (a
// dedicated kernel's function inlined at each call, outlined once per call)
// merge into the first; a copy with another body stays.
// CHECK-LABEL: gpu.module @gemm_kernel
// CHECK: gpu.func @gemm_kernel(
// CHECK-NOT: gpu.func @gemm_kernel_0(
// CHECK: gpu.func @gemm_kernel_1(
// CHECK-LABEL: func.func @step2
// CHECK: gpu.launch_func @gemm_kernel::@gemm_kernel blocks
// CHECK: gpu.launch_func @gemm_kernel::@gemm_kernel blocks
// CHECK: gpu.launch_func @gemm_kernel::@gemm_kernel_1 blocks
module attributes {gpu.container_module} {
  gpu.module @gemm_kernel {
    gpu.func @gemm_kernel(%a: memref<16xf32>) kernel {
      %i = gpu.thread_id x
      %v = memref.load %a[%i] : memref<16xf32>
      %w = arith.addf %v, %v : f32
      memref.store %w, %a[%i] : memref<16xf32>
      gpu.return
    }
    gpu.func @gemm_kernel_0(%a: memref<16xf32>) kernel {
      %i = gpu.thread_id x
      %v = memref.load %a[%i] : memref<16xf32>
      %w = arith.addf %v, %v : f32
      memref.store %w, %a[%i] : memref<16xf32>
      gpu.return
    }
    gpu.func @gemm_kernel_1(%a: memref<16xf32>) kernel {
      %i = gpu.thread_id x
      %v = memref.load %a[%i] : memref<16xf32>
      %w = arith.mulf %v, %v : f32
      memref.store %w, %a[%i] : memref<16xf32>
      gpu.return
    }
  }
  func.func @step2(%a: memref<16xf32>) {
    %c1 = arith.constant 1 : index
    %c16 = arith.constant 16 : index
    gpu.launch_func @gemm_kernel::@gemm_kernel blocks in (%c1, %c1, %c1) threads in (%c16, %c1, %c1) args(%a : memref<16xf32>)
    gpu.launch_func @gemm_kernel::@gemm_kernel_0 blocks in (%c1, %c1, %c1) threads in (%c16, %c1, %c1) args(%a : memref<16xf32>)
    gpu.launch_func @gemm_kernel::@gemm_kernel_1 blocks in (%c1, %c1, %c1) threads in (%c16, %c1, %c1) args(%a : memref<16xf32>)
    return
  }
}

// -----

// A launch of a copy in a module merged away goes to the kept module's copy,
// which merges into the first copy in turn.
// CHECK-LABEL: gpu.module @a_kernel
// CHECK: gpu.func @a_kernel(
// CHECK-NOT: gpu.func
// CHECK-NOT: gpu.module @b_kernel
// CHECK-LABEL: func.func @step3
// CHECK-COUNT-4: gpu.launch_func @a_kernel::@a_kernel blocks
module attributes {gpu.container_module} {
  gpu.module @a_kernel {
    gpu.func @a_kernel(%a: memref<16xf32>) kernel {
      %i = gpu.thread_id x
      %v = memref.load %a[%i] : memref<16xf32>
      memref.store %v, %a[%i] : memref<16xf32>
      gpu.return
    }
    gpu.func @a_kernel_0(%a: memref<16xf32>) kernel {
      %i = gpu.thread_id x
      %v = memref.load %a[%i] : memref<16xf32>
      memref.store %v, %a[%i] : memref<16xf32>
      gpu.return
    }
  }
  gpu.module @b_kernel {
    gpu.func @b_kernel(%a: memref<16xf32>) kernel {
      %i = gpu.thread_id x
      %v = memref.load %a[%i] : memref<16xf32>
      memref.store %v, %a[%i] : memref<16xf32>
      gpu.return
    }
    gpu.func @b_kernel_0(%a: memref<16xf32>) kernel {
      %i = gpu.thread_id x
      %v = memref.load %a[%i] : memref<16xf32>
      memref.store %v, %a[%i] : memref<16xf32>
      gpu.return
    }
  }
  func.func @step3(%a: memref<16xf32>) {
    %c1 = arith.constant 1 : index
    %c16 = arith.constant 16 : index
    gpu.launch_func @a_kernel::@a_kernel blocks in (%c1, %c1, %c1) threads in (%c16, %c1, %c1) args(%a : memref<16xf32>)
    gpu.launch_func @a_kernel::@a_kernel_0 blocks in (%c1, %c1, %c1) threads in (%c16, %c1, %c1) args(%a : memref<16xf32>)
    gpu.launch_func @b_kernel::@b_kernel blocks in (%c1, %c1, %c1) threads in (%c16, %c1, %c1) args(%a : memref<16xf32>)
    gpu.launch_func @b_kernel::@b_kernel_0 blocks in (%c1, %c1, %c1) threads in (%c16, %c1, %c1) args(%a : memref<16xf32>)
    return
  }
}
