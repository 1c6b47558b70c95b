//===- Passes.td - moe-mlir conversion passes --------------*- tablegen -*-===//
#ifndef MOE_CONVERSION_PASSES_TD
#define MOE_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertMoEToLinalg : Pass<"convert-moe-to-linalg", "ModuleOp"> {
  let summary = "Lower every moe op to linalg, tensor, scf, arith and math";
  let description = [{
    The reference semantics of the `moe` dialect, as upstream tensor-level
    ops that every MLIR backend can compile (the CPU pipeline runs them).

    - `!moe.mx` values become two tensors, the data and the E8M0 scales,
      across function signatures, calls and returns too;
    - `moe.quantize` / `moe.dequantize` become `linalg.generic`s built from
      the shared MX arithmetic (bit-exact, see `moe.quantize`);
    - `moe.grouped_matmul`(`_wgrad`) and `moe.experts` become an `scf.for`
      over experts around a matmul / the body on that expert's rows;
    - `moe.grouped_mlp` is first expanded (see `-moe-expand-grouped-mlp`);
    - `moe.router`, `moe.dispatch` become loops over tokens;
      `moe.combine` a gather-and-reduce `linalg.generic`;
    - `moe.all_to_all` over a group of one rank is a copy; larger groups
      need the communication runtime (`-convert-moe-to-runtime`, which the
      CPU pipeline runs first) and are reported as errors here.

    With `parallel`, router, dispatch and the grouped matmuls are lowered
    to data-parallel `linalg.generic`s instead (each output element computed
    on its own, loops only inside generic bodies), with identical results:
    the form GPU pipelines map to threads. `moe.experts` has no such form:
    run `-moe-group-experts` first.

    Live rows (`live-rows`, on by default): a dispatch sizes its rows for the
    worst case and ends the real ones at `offsets[E]`; the expert
    computation after it reads rows only through groups and positions. Where
    every reader of a value is such an op (a grouped GEMM or MLP with that
    dispatch's offsets, a combine with its positions, a generated kernel's
    `moe.group_rows` argument, or a row-local op whose result is bounded
    too), the dispatch's gather, SwiGLU (and its gradient), quantize and
    dequantize compute rows [0, offsets[E]) only, in statically sized
    storage; the other rows of their results are unspecified. Rows an
    exchange sends (`moe.rows_counted_by` on the runtime's entry point) are
    bounded by the sum of its counts: the combine producing them computes
    those only. An expert-parallel rank receives about half of its worst
    case at 2 ranks.
  }];
  let options = [
    Option<"parallel", "parallel", "bool", /*default=*/"false",
           "Lower router, dispatch and grouped matmuls to data-parallel "
           "linalg (for GPUs) instead of host loops">,
    Option<"liveRows", "live-rows", "bool", /*default=*/"true",
           "Compute the row-wise ops of an expert computation (dispatch's "
           "gather, SwiGLU, quantize, dequantize; a combine whose rows an "
           "exchange sends) only on the rows that are read: before their "
           "dispatch's offsets[E], or the exchange's sum of counts">
  ];
  let dependentDialects = [
    "::mlir::bufferization::BufferizationDialect",
    "::mlir::linalg::LinalgDialect",
    "::mlir::tensor::TensorDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::arith::ArithDialect",
    "::mlir::math::MathDialect",
    "::mlir::func::FuncDialect"
  ];
}

def ConvertMoEToRuntime : Pass<"convert-moe-to-runtime", "ModuleOp"> {
  let summary = "Lower collectives over several ranks to libmoert calls";
  let description = [{
    Expert-parallel programs (`-moe-expert-parallel`) exchange rows and sum
    gradients over a `shard.grid`. On a grid of more than one rank these
    become calls into the communication runtime (libmoert, `moert/Comm.h`),
    at tensor level, before bufferization:

    - `moe.all_to_all` -> `@moert_all_to_all_start_<f32|bf16|f16>` and
      `@moert_all_to_all_wait_<f32|bf16|f16>`: the input rows and send counts
      as buffers (`bufferization.to_buffer`), the result rows and receive
      counts in new buffers (`memref.alloc`) that become the results
      (`bufferization.to_tensor restrict writable`); i64 counts travel as
      i32. The start goes right after its operands are defined (the counts
      are exchanged there and the rows begin to travel), the wait right
      before the first use of the received rows (in the same block): what
      the program computes in between overlaps the exchange. The wait reads
      the input again (so that nothing is written into its buffer while the
      rows travel) and checks it is the buffer the start was given. With
      `overlap=false`, one blocking call `@moert_all_to_all_<type>` where
      the op was;
    - `shard.all_reduce` (sum) -> `@moert_all_reduce_sum_start_<type>` and
      `@moert_all_reduce_sum_wait_<type>` on the flattened tensor (f32, f64,
      bf16, f16, i32, i64; the input converted to the result's element type
      first), placed as an exchange's start and wait are (the start after
      the input and the collectives started before it, the wait before the
      first reader of the sum, reading the input again); with
      `overlap=false`, one blocking `@moert_all_reduce_sum_<type>`;
    - `shard.process_linear_index` -> `@moert_comm_rank`;
      `shard.process_multi_index` -> each axis' coordinate of it.

    The callees are declared `llvm.emit_c_interface` (they take memref
    descriptors: libmoert defines `_mlir_ciface_moert_*`). Each collective
    also passes its group: the grid axes it runs over, which must be one
    axis or adjacent axes in order, are the ranks `size` apart by `stride`
    (the product of the later axes' sizes; ranks are the grid's row-major
    linear indices), and the grid's size, which the runtime checks against
    the number of ranks launched. A grid that nothing refers to afterwards
    is erased. Groups of one rank stay as they are
    (`-convert-moe-to-linalg` copies; `shard.all_reduce` becomes its input,
    an index 0). Grids of dynamic size are reported as errors.
  }];
  let dependentDialects = [
    "::mlir::func::FuncDialect",
    "::mlir::bufferization::BufferizationDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::arith::ArithDialect",
    "::mlir::tensor::TensorDialect"
  ];
  let options = [
    Option<"overlap", "overlap", "bool", /*default=*/"true",
           "Split each moe.all_to_all and shard.all_reduce into a start "
           "(where its operands are ready) and a wait (before its result is "
           "used), so that the computation in between overlaps the "
           "collective; false: one blocking call">
  ];
}

def MoEGPUFuseElementwise : Pass<"moe-gpu-fuse-elementwise", "func::FuncOp"> {
  let summary = "Fuse single-use elementwise producers into their consumers (GPU)";
  let description = [{
    On tensors, before bufferization. On GPUs every linalg op is a kernel
    and a pass through memory: a `linalg.generic` producer of static shape
    whose result has one use, read once per element (a permutation map on
    both sides: a broadcasting read would recompute the producer for every
    reader), is fused into its consumer (linalg's elementwise fusion; the
    scalar code is the same, so are the results).
    Quantizing a GEMM operand to MX and dequantizing it to bf16 becomes one
    pass that never writes the 8-bit tensor. Ops of dynamic shape (the live
    rows of an expert computation) and reshapes are left as they are.
    A gather (`tensor.extract` inside a generic, through a `collapse_shape`
    or not) of a cheap all-parallel generic's result used nowhere else
    computes the elements it reads from the producer's inputs instead:
    the combine's gradient re-sorted by the backward dispatch never
    materializes its [T, K, H] tensor. A rounding (`arith.truncf`) of a
    widened tensor (`arith.extf`) back to its own type is that tensor: a
    bf16 weight widened and rounded for a bf16 GEMM is read as it is.
    Fusing moves the producer's reads to the consumer: a fusion that would
    hold its inputs across the ops in between and so raise the most tensor
    bytes the function holds at once (an estimate on tensors, as
    `-moe-place-weight-gradients` makes) is not made. (The combine of a
    backward's expert-row gradients, fused into the rounding of the input
    gradient at the end, would hold those rows, [T x K, H] in f32, across
    the weight-gradient GEMMs.)
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::linalg::LinalgDialect",
                           "::mlir::tensor::TensorDialect"];
}

def MoEGPUSplitReductions : Pass<"moe-gpu-split-reductions", "func::FuncOp"> {
  let summary = "Split long reductions with little parallelism around them (GPU)";
  let description = [{
    On tensors, before bufferization. A linalg op with one reduction loop of
    at least `min-terms` iterations and at most `max-parallel` parallel
    iterations (a dot product, a sum to a scalar, the column sums of a
    norm's weight gradient) would run as a few GPU threads each summing all
    the terms. It is split
    (`linalg::splitReduction`): `ratio` parallel partial reductions (the
    largest divisor of the reduction up to min(1024, `threads` / parallel
    iterations) that leaves each at least 16 terms), then a reduction of
    those. Partial reduction p takes terms p, p + ratio, p + 2 ratio, ...
    Many short reductions along rows in memory (at least 32 terms, a
    multiple of 8, `min-row-terms` terms in all, each input read along its
    innermost dimension: an RMSNorm's sums of squares per head) would give
    each GPU thread a row, adjacent threads 4 x row-length bytes apart; they
    are split 8 ways, so that 8 adjacent threads read 32 adjacent bytes.
    Only the order of the sum changes. Ops whose
    combiner is not a recognized reduction (e.g. one under a select) are
    left as they are.
  }];
  let options = [
    Option<"minTerms", "min-terms", "int64_t", /*default=*/"2048",
           "Split reductions of at least this many terms">,
    Option<"maxParallel", "max-parallel", "int64_t", /*default=*/"32768",
           "... with at most this many parallel iterations around them">,
    Option<"threads", "threads", "int64_t", /*default=*/"131072",
           "About how many parallel iterations (threads) a split aims for">,
    Option<"minRowTerms", "min-row-terms", "int64_t", /*default=*/"4194304",
           "Split many short reductions along rows when they sum at least "
           "this many terms in all">
  ];
  let dependentDialects = ["::mlir::linalg::LinalgDialect",
                           "::mlir::tensor::TensorDialect",
                           "::mlir::arith::ArithDialect"];
}

def MoEGPUMapLoops : Pass<"moe-gpu-map-loops", "func::FuncOp"> {
  let summary = "Turn bufferized linalg ops into parallel loops mapped to GPU blocks and threads";
  let description = [{
    Prepares bufferized programs (after `-moe-copy-to-linalg`) for
    `convert-parallel-loops-to-gpu`: every linalg op becomes an
    `scf.parallel` nest (reductions stay sequential inside), flattened to
    one dimension and run by a grid of blocks of `block-size` threads in
    which every thread strides over the iterations (thread `t` of block `b`
    takes iterations `b * block-size + t`, then every `blocks * block-size`
    after it): at most `max-blocks` blocks, fewer when the trip count's
    static bound needs fewer. A trip count read from device memory (the
    live rows of an expert computation) is read again inside the kernel,
    the launch sized by its static bound; views are folded into the loads
    and stores, so nothing sized on the host reaches a kernel. Where the
    innermost index of the loop body's accesses moves with the iterations
    (elementwise ops, casts, row gathers, updates in place), a thread takes
    a group of consecutive iterations where it took one, with one vector
    load or store of up to `vector-bytes` for each such access (the other
    accesses once a group where they are the same for all of it), when the
    buffers are aligned to the vectors (checked in the kernel; otherwise,
    and for the iterations after the last whole group, the scalar loop
    below runs); two groups at a time, loads before stores, where the
    interleaving below applies. Collapses of buffers of static shape become
    views of the same memory (`memref.reinterpret_cast`), so that accesses
    through them keep their flat index instead of dividing it by every
    dimension. Where a
    thread has several iterations and its loop body is loads, arithmetic
    and stores into an allocation it does not load from (copies, gathers,
    elementwise ops), it runs 4 iterations at a time, their loads before
    their stores: 4 loads in flight a thread instead of one. A reduction
    loop's accumulator (the output element it loads and stores every
    term) stays in a register across the loop, loaded before it and stored
    after it, where nothing else in the loop touches that buffer: the
    terms' loads then no longer wait on the stores before them.
  }];
  let options = [
    Option<"blockSize", "block-size", "int64_t", /*default=*/"128",
           "Threads per block along the innermost parallel dimension">,
    Option<"maxBlocks", "max-blocks", "int64_t", /*default=*/"4096",
           "Most blocks of one kernel; larger loops stride">,
    Option<"vectorBytes", "vector-bytes", "int64_t", /*default=*/"16",
           "Widest vector load or store of a thread, in bytes (a power of "
           "two; below 2: scalar accesses only)">
  ];
  let dependentDialects = ["::mlir::scf::SCFDialect",
                           "::mlir::gpu::GPUDialect",
                           "::mlir::linalg::LinalgDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::vector::VectorDialect"];
}

def MoEGPUDeviceBuffers : Pass<"moe-gpu-device-buffers", "ModuleOp"> {
  let summary = "Place every buffer of host code in GPU memory";
  let description = [{
    After loops became `gpu.launch`es, host code only allocates, copies and
    launches. This pass makes that true for memory too: `memref.alloc` and
    `memref.dealloc` become `gpu.alloc`/`gpu.dealloc`; a `memref.get_global`
    (constants) becomes a device buffer filled by `gpu.memcpy` from the host
    global; host loops still touching buffers (sequential reductions) run as
    one-thread kernels. Function arguments and results are device buffers.
    Host code that would read a device buffer itself (a scalar feeding host
    control flow) is reported as an error with its location.
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect",
                           "::mlir::memref::MemRefDialect"];
}

def MoEGPUNameKernels : Pass<"moe-gpu-name-kernels", "func::FuncOp"> {
  let summary = "Name generic GPU kernels after their ops' name locations";
  let description = [{
    Runs on gpu.launch ops before outlining. Each launch without a kernel
    name that carries a name location (moe-model's `model.layers.3.mlp`,
    `lm_head`, `loss`; -moe-adamw's `optimizer`; the first one, a call
    site's callee before its caller) is named
    `<function>_<name>_kernel`, other characters than letters and digits
    as `_`: a profile then says which part of a model each generic kernel
    belongs to. Named launches (the dedicated kernels) keep their names.
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

def MoEGPUSinkIndexComputations
    : Pass<"moe-gpu-sink-index-computations", "func::FuncOp"> {
  let summary = "Copy constants and index computations into the launches "
                "that read them";
  let description = [{
    Runs before outlining. A value a `gpu.launch` body reads from above
    becomes a kernel parameter; when it is a constant, a `memref.dim`, an
    `arith.select` or an `arith.cmpi` whose own operands are such values
    or are read by the body anyway, the op is cloned at the top of the body
    instead (defs before uses) and the body reads the copy. The kernel then
    keeps its constants (bounds, strides, sizes) as immediates.

    The same rewrite as upstream's `-gpu-launch-sink-index-computations`,
    which finds the uses to replace among every use of each value: a train
    step of many layers has thousands of ops reading each constant, and that
    pass took time quadratic in the step's length (21 s of a 16-layer step's
    compile). This one walks each launch's body once.
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

def MoEGPUMergeKernels : Pass<"moe-gpu-merge-kernels", "ModuleOp"> {
  let summary = "Keep one kernel module of each set that differ only in name";
  let description = [{
    Runs after outlining. Kernel modules that print the same once their
    own name and their functions' names are set aside (the same generic
    kernel of each decoder layer, named for its layer) are merged into the
    first of them: its launches point at that one and the others are
    erased. Inside each module that stays, kernel functions that print the
    same but for their own name (a dedicated kernel's function inlined at
    each of its calls outlines one copy per call) are merged the same way.
    The NVVM lowering, the PTX backend and ptxas then run once per distinct
    kernel, so a model's compile time follows its distinct layer shapes
    rather than its depth.
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

def MoEGPUTrafficReport : Pass<"moe-gpu-traffic-report", "ModuleOp"> {
  let summary = "Remark the bytes each generic kernel reads and writes";
  let description = [{
    Runs after outlining. For every kernel function whose memory accesses
    are memref or vector loads and stores (the generic kernels), a remark
    `generic kernel NAME: reads R bytes, writes W bytes (whole buffers)`:
    the buffers it loads from and those it stores to, each counted whole
    and once (`?` where a size is not static). With a profile's time per
    launch, `bench/kernel_traffic.py` turns these into each kernel's memory
    rate. An upper bound where a kernel touches part of a buffer (the live
    rows of one sized for the worst case), a lower one where it reads
    elements more than once (a gather of rows, each row read once per
    copy). The dedicated kernels (built on LLVM pointers) are not reported.
  }];
}

def MoEGPUKernelBounds : Pass<"moe-gpu-kernel-bounds", "ModuleOp"> {
  let summary = "Give kernels that resize their warpgroups' registers the "
                "launch bounds ptxas needs";
  let description = [{
    Runs after outlining. A warp-specialized kernel hands registers from
    its producer warpgroup to its consumers with `setmaxnreg`
    (`nvvm.setmaxregister`). ptxas honours that only when it can tell the
    register count at the kernel's entry, which it derives from the
    threads per CTA (known from the launch) and the CTAs per SM; without
    the latter it may ignore every `setmaxnreg` ("unable to determine
    register count at entry") and the consumers run on the entry count.
    Each kernel function that contains `nvvm.setmaxregister` gets
    `nvvm.minctasm = 1` (`.minnctapersm 1`), which every launch meets.
    Outlining does not carry a launch's attributes to its kernel, hence
    this step after it.
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

def MoEGPUElideHostSyncs : Pass<"moe-gpu-elide-host-syncs", "func::FuncOp"> {
  let summary = "Keep the stream running across calls of host-only functions";
  let description = [{
    Runs after `-gpu-async-region`, which makes the host wait for the stream
    before any op with side effects, a `func.call` included, and starts a
    new stream after it. A call of a function marked `moe.host_only` (it
    touches no device memory and nothing the stream does, such as libmoert's
    tensor-map encoder) needs neither: this pass removes the `gpu.wait` before
    such calls and continues the stream after them (the next `gpu.wait async`
    without dependencies becomes the token the wait consumed), when nothing
    else with side effects lies in between.
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

def MoEGPUFuseRowGathers : Pass<"moe-gpu-fuse-row-gathers", "ModuleOp"> {
  let summary = "Round-trip pair kernels read a dispatch's rows from the tokens";
  let description = [{
    Runs after `-convert-moe-to-linalg`, before the dedicated kernels'
    functions are inlined. A call of a paired MX round-trip kernel
    (`@moe_mx_round_trip_pair_...` of a 2-d tensor, from
    `-moe-gpu-dedicated-kernels`) whose input is the gather a dispatch
    lowers to (row r of the result is row `source[r]` of the tokens, zeros
    where `source[r]` is -1), read by nothing but such calls (one pair
    kernel, or the two one-result kernels of a split pair), becomes a call of the
    same kernel reading row `source[r]` of the tokens itself
    (`..._gather_<tokens>`): the dispatched rows (tokens x top-k rows of
    f32) are neither written nor read back, and their buffer is never
    allocated. The results are the same values (the kernel's arithmetic is
    unchanged; a padding row is zeros either way).
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

def MoEGPUDedicatedKernels : Pass<"moe-gpu-dedicated-kernels", "ModuleOp"> {
  let summary = "Replace moe ops by hand-scheduled GPU kernels for the chip";
  let description = [{
    Runs on tensors, before `-convert-moe-to-linalg`. Every op this pass has
    a kernel for, for `chip`, becomes a `func.call` of a generated private
    function taking and returning tensors, whose body converts the inputs
    with `bufferization.to_buffer` (MX operands are split with
    `moe.mx_unpack` at the call), allocates the result, runs the kernel as a
    `gpu.launch` (gpu, memref, arith, scf, llvm and nvvm ops) and returns
    `bufferization.to_tensor` of the result. The rest of the GPU pipeline
    lowers it with the generic kernels. Ops without a kernel are left as they
    are; chips without kernels change nothing. With `report`, every op of a
    kind some kernel below computes that stays on the generic kernels gets a
    remark naming why (the first condition it fails: a type, a dim that is
    not a multiple of a tile), and so does every GEMM that takes the cp.async
    kernel instead of the TMA one, or whose SwiGLU (and the rounding after it) its
    epilogue cannot take (`moe-compile --kernel-report`):

    ```
    remark: moe.grouped_matmul (tensor<4096x768xf32>): generic kernels on
      sm_90a: the lhs is f32: the wgmma kernels take bf16 or MX operands (a
      precision recipe, bf16 or mxfp8)
    remark: kernels for sm_90a: 40 ops on dedicated kernels, 1 on the
      generic kernels, 0 on a slower kernel than their family's best
    ```

    Kernels:
    - sm_90a (Hopper, wgmma): `moe.grouped_matmul` with bf16 operands, an
      f32 result, static shapes with K a multiple of 64 and N of 128:
      `@moe_wgmma_gmm_...`, warpgroup MMA (m64n128k16) fed by a 3-buffer
      `cp.async` pipeline; a `transpose_rhs` GEMM (the data gradient,
      weights [E, N, K]) reads its rhs K-major (`..._rhsT_...`). MXFP8
      operands with blocks along K go the same way after `moe.dequantize`
      to bf16, which is exact (at most 4 significant bits times a power of
      two; scales down to 2^-124 for E4M3, 2^-117 for E5M2): the exact MXFP8
      path Hopper has without a block-scaled MMA.
      `moe.grouped_matmul_wgrad` (bf16, or MXFP8 blocked along the rows;
      K and N multiples of 128): `@moe_wgmma_wgrad_...`, one CTA per
      expert and 128x128 output tile reducing that expert's rows.
      With N a multiple of 256 (or above 256), both take the TMA kernel
      instead (`..._tma`), and so does every other shape (partial tiles:
      a last K stage read with zeros past K, through a 3-D tensor map per
      expert for an rhs `[E, K, N]`; a last column tile storing nothing
      past N; a weight gradient's last row tile storing nothing past K,
      through a 3-D map of its result); K or N not a multiple of 8 (rows
      the copy engine cannot read) has its operands padded with zeros
      (`tensor.pad`) and the result's leading part taken. Matrix-vector
      and outer products (K or N under 16) stay generic, which is as fast.
      The TMA kernel: a producer thread's bulk tensor copies into a 4-stage
      mbarrier ring, two consumer warpgroups on m64n256k16, a persistent
      grid over every expert's tiles; the f32 result (but for the SwiGLU
      epilogues below) leaves through the copy engine, from staging boxes
      in shared memory, while the next tile's MMAs run.
      Blockwise FP8 operands (`!moe.fp8block`, 1 x 128 lhs tiles, 128 x 128
      rhs tiles, K and N multiples of 128, f32 result) take the same kernel
      on FP8 wgmma (`@moe_tma_fp8block_gmm_...`): 128 x 128 tiles, stages
      of 128 K values whose four m64n128k32 wgmmas sum into a fresh partial,
      promoted into the f32 accumulators with the row's and the tile's
      scales (DeepSeek-V3's recipe; about 1.3e-4 relative from the exact
      result, since the tensor core sums a partial at reduced precision).
      FP8 wgmma reads K-major operands only: a forward GEMM's rhs elements
      `[E, K, N]` are transposed (`@moe_transpose8_...`), by the rhs's own
      quantize kernel when it is one (`..._and_T`); the data gradient's are
      K-major already. A `moe.grouped_matmul_wgrad` of blockwise FP8
      operands in 128 x 1 tiles whose groups provably start and end at
      multiples of 128 rows (a dispatch's or `moe.slot_offsets`' `pad_to`)
      takes the kernel's weight-gradient form
      (`@moe_tma_fp8block_wgrad_...`): the group rows are the MMAs' K, so
      both operands' quantize kernels write the data transposed
      (`..._T`), and each 128-row stage is promoted with the result row's
      and column's scales. With `fp8block-exact` such operands are instead
      dequantized to bf16 for the bf16 kernels (exact with power-of-two
      scales).
      SwiGLU epilogues: a forward GEMM whose result feeds `moe.swiglu`
      (split layout, f32) and the rowwise MX round trip of the activation
      computes both in its epilogue and returns the next GEMM's bf16 operand
      (`..._swiglu_<f8>_<scale>`); a `transpose_rhs` GEMM read only by
      `moe.swiglu_grad` (h, da) followed by the rowwise round trip of dh
      likewise reads h and returns the rounded dh (`..._swiglu_grad_...`).
      Both take partial tiles (any K; F any multiple of the MX block of 32,
      a last tile storing only its blocks within F). The bf16 recipe's
      forms, where the activation (or dh) is only rounded to bf16 (its
      result type, or `arith.truncf` ops reading it), store that rounding
      instead (`..._swiglu_bf16`, `..._swiglu_grad_bf16`; F a multiple of
      32).
      h, the activation and dh become further results only where other ops
      read them (`_h`, `_a`, `_dh`). When every group starts at a multiple
      of 32 rows (the offsets of a dispatch or `moe.slot_offsets` with such
      a `pad_to`) and the activation (forward) or dh (backward) also has a
      columnwise round trip (blocks of 32 rows, a weight gradient's
      operand), the epilogue can round those blocks too
      (`_col_<f8>_<scale>`; each block's column amaxes are shared by two
      warps through shared memory), so the values are never written in
      f32. The forward epilogue always does; the backward one only with
      `mx-activations=always`, where the f32 dh would raise its block's
      peak of live tensors (estimated before bufferization,
      `TensorLiveness.h`): its columnwise pass slows the epilogue more than
      the round trip it saves takes. Where only TMA GEMMs read the
      rowwise rounding, as their lhs, and it is live at the block's peak
      (or with `mx-activations=always`), the epilogue returns the MX
      encoding instead (`_mx`: 8-bit elements and E8M0 scales, packed with
      `moe.mx_pack`), and those GEMMs read it 8-bit (`..._<f8>_lhs`): the
      producer warpgroup's three spare warps dequantize each stage's A tile
      in shared memory into the bf16 tile the MMAs read (the same exact
      operand). A packed MX lhs argument is read the same way.
      `linalg.matmul` on f32 (static shapes): `@moe_simt_matmul_...`, a
      shared-memory tiled CUDA-core kernel (128x128 tiles, 8x8 outputs per
      thread, each output summed over K in order; with few tiles over a
      long K, K split over the grid and the partial sums added in order by a
      second kernel). With `fp8-mma`, MXFP8 GEMMs instead run FP8 wgmma
      per 32-wide K slice with both scales applied to the f32 partial sums
      (`@moe_wgmma_mx_gmm_...`; not exact, and today slower than the
      exact default: no TMA pipeline).
      `moe.attention` and `moe.attention_grad` with bf16 inputs (query
      `[B, S, N, D]`, key and value `[B, S, M, D]`, the result's gradient),
      f32 results, static shapes, D of 64 or 128: flash attention
      (`@moe_flash_{fwd,dq,dkv}_...`): 64-query (64-key) tiles on m64 wgmma,
      an online softmax in registers, no `[S, S]` matrix in memory; the
      forward saves the logsumexp of every row, which the backward's dQ and
      dK/dV kernels reuse when the gradient's forward is in its block (it is
      recomputed otherwise); dK and dV sum the group's query heads in
      registers. The probabilities and their gradient are rounded to bf16
      before their products (results within bf16 precision of the
      reference).
    - sm_100a (Blackwell, tcgen05): `moe.grouped_matmul` with MXFP8
      operands (`!moe.mx<R x K x f8, axis = 1>`, `!moe.mx<E x K x N x f8,
      axis = 1>`, f8E4M3FN or f8E5M2, blocks of 32), an f32 result, no
      `transpose_rhs`, static shapes with K and N multiples of 128:
      `@moe_bs_gmm_<R>x<K>x<N>_e<E>_...` on the block-scaled MMA
      `tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale` (E8M0 scales,
      one per 32 values along K) with the accumulator in tensor memory; one
      128 x 128 tile per CTA, K in stages of 128, group by group (rows of
      different experts are never accumulated together; rows in no group
      are zero). Layouts and what could not be checked without the hardware
      are documented in `lib/Conversion/MoEToGPU/Kernels/`, one file each.
    - Both: `moe.dequantize` of a `moe.quantize` (blocks of 32, f32 / bf16
      / f16 in and out, static shapes): `@moe_mx_round_trip_...`, one pass
      that reads the input once and writes the rounded values; the 8-bit
      data and scales are not stored. The MX arithmetic is the generic
      lowering's, so the results are bit-identical. With a dispatch's
      offsets bounding the rows that are read (see `LiveRows.h`), only the
      rows before `offsets[E]` are computed (`..._live_...`). The round
      trips of one tensor along its last two dims (a weight for its forward
      and data-gradient GEMMs) run as one kernel that reads it once
      (`@moe_mx_round_trip_pair_...`), unless holding the second result from
      the first round trip to the second would raise the block's peak of
      live tensors: then each runs where it is read, reading the tensor
      again (pairs decided smallest first; a dispatch's rows get two pair
      kernels of one result each, `_k_only` / `_n_only`, which
      `-moe-gpu-fuse-row-gathers` also reads from the tokens); other
      `moe.dequantize`s take a
      dequantize kernel (`@moe_mx_dequantize_...`). Two identical
      grouped GEMMs (a forward and its recomputation) get the same kernel,
      so that CSE merges them.

    The pass also declares the memory effects of the NVVM ops its kernels
    use (upstream declares none), so that the ownership-based buffer
    deallocation accepts the generated functions; they are registered with
    the pass, so deallocate in a pipeline that contains it.
  }];
  let options = [
    Option<"chip", "chip", "::mlir::moe::GPUChip",
           /*default=*/"::mlir::moe::GPUChip::sm_90a",
           "The GPU architecture the kernels are for (sm_90a and sm_100a "
           "have kernels; other chips change nothing)",
           "::mlir::moe::GPUChipValues()">,
    Option<"fp8Mma", "fp8-mma", "bool", /*default=*/"false",
           "Hopper: run MXFP8 grouped GEMMs on FP8 wgmma, promoted every 32 "
           "of K (the tensor core sums each slice at reduced precision: "
           "about 5e-5 relative from the exact result on the H200; and "
           "slower, the kernel has no TMA pipeline); off by default, MX "
           "operands then dequantize exactly to bf16 for the bf16 wgmma "
           "kernel">,
    Option<"fp8blockExact", "fp8block-exact", "bool", /*default=*/"false",
           "Hopper: dequantize blockwise FP8 grouped GEMMs' operands to bf16 "
           "for the bf16 wgmma kernels (exact with power-of-two scales, "
           "about 3.5x slower) instead of running them on FP8 wgmma promoted "
           "every 128 of K (the recipe's own arithmetic, about 1.3e-4 "
           "relative from the exact result)">,
    Option<"flashDkvOverlap", "flash-dkv-overlap", "bool",
           /*default=*/"false",
           "Hopper: the flash dK/dV kernel issues dV += P^T dO as soon as P^T "
           "is stored and computes dS^T while it runs (S^T and dP^T in two "
           "MMA groups, P^T computed while dP^T runs); the same results">,
    Option<"pairRoundTrips", "pair-round-trips",
           "::mlir::moe::RoundTripPairing",
           /*default=*/"::mlir::moe::RoundTripPairing::peak",
           "When the two MX round trips of one tensor share a kernel: peak "
           "(unless holding the second result longer raises the peak of live "
           "tensors of their block; the least memory) or always (every pair; "
           "each tensor read once, the fastest)",
           "::mlir::moe::RoundTripPairingValues()">,
    Option<"mxActivations", "mx-activations",
           "::mlir::moe::MXActivations",
           /*default=*/"::mlir::moe::MXActivations::peak",
           "Where a SwiGLU epilogue writes the MX encoding of its activation "
           "(8-bit elements and E8M0 scales, which the TMA GEMMs reading it "
           "dequantize in shared memory) instead of its bf16 rounding: peak "
           "(where that lowers the peak of live tensors of the block) or "
           "always (the least memory; the GEMMs reading 8-bit run 10-18% "
           "slower, and the backward epilogue also rounds dh columnwise "
           "where that lowers the peak, which more than doubles its time)",
           "::mlir::moe::MXActivationsValues()">,
    Option<"report", "report", "bool", /*default=*/"false",
           "Remark at every op of a kind the chip's kernels compute (grouped "
           "and dense GEMMs, weight gradients, attention, cross-entropy, "
           "dequantize) that stays on the generic kernels, naming why, and at "
           "every GEMM on the cp.async wgmma kernel instead of the TMA one or "
           "whose SwiGLU its epilogue cannot take; then one remark at the "
           "module counting both">
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::bufferization::BufferizationDialect",
    "::mlir::func::FuncDialect",
    "::mlir::gpu::GPUDialect",
    "::mlir::linalg::LinalgDialect",
    "::mlir::LLVM::LLVMDialect",
    "::mlir::math::MathDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::moe::MoEDialect",
    "::mlir::NVVM::NVVMDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect"
  ];
}

#endif
