//===- Passes.td - moe dialect passes ----------------------*- tablegen -*-===//
#ifndef MOE_TRANSFORMS_PASSES_TD
#define MOE_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def MoECopyToLinalg : Pass<"moe-copy-to-linalg", "func::FuncOp"> {
  let summary = "Turn memref.copy into linalg.copy";
  let description = [{
    Buffer copies then lower like every other linalg op (to loops on the
    CPU, to kernels on the GPU) instead of calling the `memrefCopy` runtime
    function, so compiled artifacts need no MLIR runtime library.
  }];
  let dependentDialects = ["::mlir::linalg::LinalgDialect"];
}

def MoEDecomposeAggregates : Pass<"moe-decompose-aggregates", "func::FuncOp"> {
  let summary = "Decompose aggregate linalg ops (softmax, ...) into generics";
  let description = [{
    Ops such as `linalg.softmax` have no loop lowering of their own; their
    `AggregatedOpInterface` decomposition into `linalg.generic`s and
    reductions is applied on tensors, before bufferization.
  }];
  let dependentDialects = ["::mlir::linalg::LinalgDialect",
                           "::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect"];
}

def MoEReadOnlyArguments : Pass<"moe-read-only-arguments", "::mlir::ModuleOp"> {
  let summary = "Mark every tensor argument of a defined function read-only";
  let description = [{
    Sets `bufferization.writable = false` on every tensor argument of every
    function with a body: one-shot bufferization then copies instead of
    writing into a caller's buffer, so a compiled function never modifies
    its inputs. Run right before bufferization.

    The exception are the arguments a function updates (a result carrying
    `moe.updates = i`, as in the train steps of `-moe-adamw`): they are
    marked `bufferization.writable = true`, so that their new value can be
    written into their own buffer (`-moe-update-arguments-in-place`).
  }];
  let dependentDialects = ["::mlir::bufferization::BufferizationDialect"];
}

def MoEUpdateArgumentsInPlace : Pass<"moe-update-arguments-in-place", "func::FuncOp"> {
  let summary = "Results that update an argument become writes into its buffer";
  let description = [{
    On buffers, right after one-shot bufferization and before deallocation.
    A public function's result carrying `moe.updates = i` is the new value
    of its argument `i` (a parameter or optimizer moment of a train step).
    The result is dropped from the signature; where bufferization did not
    already compute it in the argument's buffer (the usual case, since the
    argument is writable), it is copied there before the return. The caller
    passes the state in and finds it updated: nothing is allocated for it
    and nothing copied back. The function must have no callers.
  }];
  let dependentDialects = ["::mlir::memref::MemRefDialect"];
}

def MoEDenseToGrouped : Pass<"moe-dense-to-grouped", "func::FuncOp"> {
  let summary = "Dense matmuls become grouped GEMMs of one group (the fast kernels)";
  let description = [{
    Every `linalg.matmul` A[M, K] @ B[K, N] (the plain form, static shapes,
    float operands, an f32 result into a zero fill) becomes
    `moe.grouped_matmul` of one group (offsets [0, M]) with the weight
    viewed as [1, K, N]; where B is `linalg.transpose` of W[N, K], W is
    viewed as [1, N, K] with `transpose_rhs`. The op carries `moe.dense`, which
    `-moe-autodiff` passes on to its data and weight gradients
    (`moe.grouped_matmul` with the other transposition and
    `moe.grouped_matmul_wgrad`) and `-moe-quantize` reads (dense GEMMs get
    its `dense` precision). The projections, router, shared experts and LM
    head of a model then run on the grouped GEMM kernels in the forward and
    the backward pass, in the recipe's precision. Results are those of the
    matmul (the grouped op accumulates in f32 too).
  }];
  let dependentDialects = ["::mlir::moe::MoEDialect",
                           "::mlir::arith::ArithDialect",
                           "::mlir::tensor::TensorDialect"];
}

def MoEAdamW : Pass<"moe-adamw", "::mlir::ModuleOp"> {
  let summary = "Add the optimizer to a train step: global-norm clipping and AdamW";
  let description = [{
    Each train step `@<f>_grad` of `-moe-autodiff` (the loss, then the
    gradient of argument `i` as a result with `moe.gradient_of = i`) becomes
    `@<f>_step`, which also updates the model. Its arguments: those of
    `@<f>_grad`, then the first moment (`moe.state = "exp_avg"`) and the
    second moment (`moe.state = "exp_avg_sq"`) of every differentiated
    argument (`moe.state_of = i`), then `tensor<8xf32>` (`moe.input =
    "adamw"`) holding the step's scalars:

      [0] lr / (1 - beta1^t)   step size with bias correction (t = step, from 1)
      [1] sqrt(1 - beta2^t)    second-moment bias correction
      [2] 1 - lr * wd          decoupled weight decay (applied to ranks >= 2)
      [3] beta1   [4] beta2   [5] eps
      [6] clip                 max global gradient norm (0: no clipping)
      [7] lr                   (not read by the update; kept for the record)

    Its results: the loss, the global gradient norm before clipping
    (`moe.grad_norm`; squares summed in f64), then the new value of every
    differentiated argument and of both its moments, each with
    `moe.updates = i` (the argument it replaces; the lowering updates them
    in place). With s = clip / (norm + 1e-6) when 0 < clip < norm, else 1,
    and g' = s * g, every element is updated as

      p = p * (1 - lr * wd)                    (matrices only)
      m = beta1 * m + (1 - beta1) * g'
      v = beta2 * v + (1 - beta2) * g' * g'
      p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    as linalg ops, so the CPU and the GPU run one definition. The gradients
    are no longer results: their buffers are freed inside the step.

    Expert-parallel train steps (arguments with `moe.expert_shard = {grid =
    ...}`, -moe-expert-parallel): the sum of squares of an expert shard's
    gradient is summed over the grid's axis the experts are spread over
    (the shard's `axis`, 0 when absent; `shard.all_reduce`) before it joins
    the norm, so every rank clips by the norm of the whole model (the other
    gradients are the same on every rank). The sum over the experts then
    runs in another order than on one rank: the norm can differ from the
    single-rank one in the last bits of its f64 sum.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::linalg::LinalgDialect",
                           "::mlir::math::MathDialect",
                           "::mlir::shard::ShardDialect",
                           "::mlir::tensor::TensorDialect"];
}

def MoEReadInsertedSlices : Pass<"moe-read-inserted-slices", "::mlir::ModuleOp"> {
  let summary = "Read a tensor inserted into a larger one back from that one";
  let description = [{
    A tensor read after `tensor.insert_slice` put it into a larger one is
    read back as a `tensor.extract_slice` of the insertion. Canonicalization
    folds the other way (extract_slice(insert_slice(v)) -> v), and one-shot
    bufferization resolves a read of `v` after `v` was written in place into
    the larger buffer with a copy of `v`: for the live rows of an expert
    computation a copy sized by a count in device memory, which the host
    cannot size. Only reads are redirected (an op writing into `v` as its
    destination keeps `v`). Run last before bufferization.
  }];
  let dependentDialects = ["::mlir::tensor::TensorDialect"];
}

def MoEChunkLoss : Pass<"moe-chunk-loss", "::mlir::func::FuncOp"> {
  let summary = "A train step's LM head and cross-entropy in chunks of tokens";
  let description = [{
    In a train step (after -moe-autodiff), the LM head `logits = h w` (a
    one-group `moe.grouped_matmul` of all N tokens, as -moe-dense-to-grouped
    makes it), its `moe.cross_entropy`, the logits' gradient and the two
    GEMMs that read it (`dh = dlogits w^T`, `dw = h^T dlogits`) become the
    same ops on chunks of `rows` tokens, one chunk after the other: no
    [N, V] tensor is held, only one chunk's logits and their gradient
    ([rows, V] each). The loss is the sum of the chunks' mean losses, each
    times its share of the counted rows (labels in [0, V)), and each
    chunk's logits' gradient is scaled likewise; `dh` is the chunks' rows,
    `dw` the sum of the chunks' weight gradients (in chunk order).

    Results equal the unchunked step's up to f32 rounding: the loss's sum
    is taken in another order, the gradient's scale `g / count` is formed
    as `(g * count_c / count) / count_c`, and `dw` adds the chunks' partial
    sums (the unchunked GEMM accumulates all rows in one). Each chunk costs
    a weight-gradient GEMM's f32 result and one addition of it.

    The chunks are computed where the logits' gradient was; what reads the
    loss before that point (over several ranks, -moe-expert-parallel's
    scaling of the loss by the rank's share of the counted rows) moves
    after them (only ops free of memory effects move). Logits or a logits'
    gradient with other users, or a gradient that depends on the loss, are
    left as they are, with a remark. Run it before -moe-quantize (the
    recipe then rounds each chunk's operands); more than 64 chunks are
    refused.
  }];
  let dependentDialects = ["::mlir::linalg::LinalgDialect",
                           "::mlir::tensor::TensorDialect",
                           "::mlir::arith::ArithDialect"];
  let options = [
    Option<"rows", "rows", "int64_t", /*default=*/"4096",
           "Tokens a chunk (the last may hold fewer)">,
  ];
}

def MoESplitEmptyTensors : Pass<"moe-split-empty-tensors", "::mlir::ModuleOp"> {
  let summary = "Give each use of a tensor.empty its own";
  let description = [{
    CSE merges identical `tensor.empty` ops (the destinations of a forward
    op and of its backward counterpart), and one-shot bufferization then
    writes both results into one buffer, which stays allocated from the
    first write to the last read of the second. Separate empties bufferize
    to separate buffers, each freed after its own last use
    (-moe-buffer-lifetimes). Run right before bufferization.
  }];
}

def MoEExpandGroupedMlp : Pass<"moe-expand-grouped-mlp"> {
  let summary = "Expand moe.grouped_mlp (and its backward) into grouped matmuls, SwiGLU and quantize";
  let description = [{
    The inverse of fusion: every `moe.grouped_mlp` becomes the op sequence
    that defines it (`moe.grouped_matmul` to f32, `moe.swiglu`, a rowwise
    `moe.quantize` when `w2` is block-scaled, `moe.grouped_matmul`); every
    `moe.grouped_mlp_backward` becomes its backward sequence (GEMM1 and
    SwiGLU recomputed, `moe.swiglu_grad`, the data- and weight-gradient
    GEMMs, and the quantizations of its `gemm_type`). Used by lowerings
    without a fused kernel and to check a fused kernel against its
    definition.
  }];
}

def MoEQuantize : Pass<"moe-quantize", "::mlir::ModuleOp"> {
  let summary = "Quantize the operands of expert GEMMs as a training recipe does";
  let description = [{
    Inserts quantization where a low-precision training recipe puts it: on
    the GEMMs `moe.grouped_matmul`, `moe.grouped_matmul_wgrad`,
    `moe.grouped_mlp` and `moe.grouped_mlp_backward`, and on attention
    (below). Dense `linalg.matmul` (shared experts, the router) stays as it
    is (`-moe-dense-to-grouped` makes dense GEMMs grouped ones first, which
    this pass then quantizes with the `dense` precision). Result types never change (accumulation stays f32, rounded once to
    the result type); weights stay f32/bf16 tensors in the function (master
    weights) and are quantized in the graph, on every use.

    `recipe=mxfp8` (default): every float operand becomes
    `moe.quantize ... -> !moe.mx<..xf8E4M3FN, axis = k>` with its blocks along
    the GEMM's contraction dimension: rowwise (along K) for forward and
    data-gradient operands (`lhs` axis 1; `rhs` axis 1, or axis 2 with
    `transpose_rhs`), columnwise (axis 0, the rows) for both operands of
    `moe.grouped_matmul_wgrad`. `moe.grouped_mlp`'s weights and input are
    quantized rowwise; a block-scaled `w2` makes the op quantize its SwiGLU
    activation too (with `scale_mode` set to this pass's `scale`).
    `moe.grouped_mlp_backward` gets `gemm_type(f8E4M3FN)` (its operands feed
    GEMMs along two different axes, so the op quantizes them itself).

    `recipe=bf16`: every f32 operand is rounded to bf16 (a `linalg.generic`
    around `arith.truncf`, round to nearest even); `moe.grouped_mlp_backward`
    gets `gemm_type(bf16)`.

    `recipe=fp8-blockwise` (DeepSeek-V3's recipe, Transformer Engine's
    `Float8BlockScaling`): every float operand becomes `moe.quantize ... ->
    !moe.fp8block<..xf8E4M3FN, block = ...>` with f32 scales, powers of two
    unless `block-scales=f32`. Stacked weights get 128 x 128 tiles (`[1, 128,
    128]`, one expert per tile; the same tiles serve the forward and, read
    transposed, the data gradient); the other operands of forward and
    data-gradient GEMMs 1 x 128 tiles along K (`[1, 128]`); both operands of
    `moe.grouped_matmul_wgrad` 128 x 1 tiles along the rows (`[128, 1]`). Any
    size works (the last tile may be partial). `moe.grouped_mlp` and
    `moe.grouped_mlp_backward` have no such recipe: they are expanded into
    their grouped GEMMs first, which are then quantized.

    Under either recipe, `moe.attention` and `moe.attention_grad` get bf16
    inputs (query, key, value, and the result's gradient: the same
    `linalg.generic` rounding), the precision the flash attention kernels
    read; their results stay f32.

    Operands that are already block-scaled, or not f32 under `bf16`, are left
    as they are. A contraction dimension that is dynamic or not a multiple of
    the MX block size (32) cannot be quantized: that GEMM is left unchanged
    and a warning names the op and the dimension.

    Dense GEMMs (marked `moe.dense` by `-moe-dense-to-grouped`) get the
    precision of `dense` (bf16 by default, under either recipe; mxfp8 on
    request) instead of the recipe's.

    Layers: model builders put a discardable integer attribute `moe.layer`
    on ops. GEMMs of the layers in `keep-layers`, and with `keep-first-last`
    those of the smallest and largest `moe.layer` present in the module, are
    kept in high precision (the first and last layers are the most sensitive
    to quantization).

    Run it before `-moe-fuse-grouped-mlp` (which recognizes the quantized
    sequences) or after it (this pass quantizes the fused ops). The orders
    agree, except where the graph rounds the SwiGLU activation (to bf16)
    before GEMM2: quantizing first quantizes the rounded activation (two
    roundings, so it stays unfused), fusing first quantizes the f32 one.
  }];
  let options = [
    Option<"recipe", "recipe", "std::string", /*default=*/"\"mxfp8\"",
           "the training recipe: mxfp8 (E4M3 elements, one E8M0 scale per 32 "
           "values), bf16 (f32 operands rounded to bf16) or fp8-blockwise "
           "(E4M3 elements, one f32 scale per 1 x 128 or 128 x 128 tile)">,
    ListOption<"keepLayers", "keep-layers", "int64_t",
               "moe.layer indices whose GEMMs stay in high precision">,
    Option<"keepFirstLast", "keep-first-last", "bool", /*default=*/"false",
           "keep the smallest and largest moe.layer of the module in high "
           "precision">,
    Option<"scale", "scale", "std::string", /*default=*/"\"rceil\"",
           "MX scale choice: rceil (NVIDIA recipes, never clips) or floor "
           "(OCP MX spec)">,
    Option<"blockScales", "block-scales", "std::string",
           /*default=*/"\"pow2\"",
           "fp8-blockwise scales: pow2 (powers of two, Transformer Engine's "
           "default) or f32">,
    Option<"dense", "dense", "std::string", /*default=*/"\"bf16\"",
           "precision of dense GEMMs (grouped GEMMs marked moe.dense, from "
           "-moe-dense-to-grouped): bf16, mxfp8 or fp8-blockwise">,
  ];
}

def MoEHoistQuantize : Pass<"moe-hoist-quantize", "func::FuncOp"> {
  let summary = "Quantize or narrow rows before moe.dispatch and moe.all_to_all move them";
  let description = [{
    A rowwise `moe.quantize` (blocks along the row, `axis = 1`) of rows that
    `moe.dispatch` or `moe.all_to_all` produced is moved before that op,
    which then moves the 8-bit rows with their scales:

    ```mlir
    %s, %o, %c, %p = moe.dispatch %x, %idx experts(E) : ... -> tensor<RxHxf32>, ...
    %q = moe.quantize %s : tensor<RxHxf32> -> !moe.mx<RxHxf8E4M3FN, axis = 1>
    // becomes
    %qx = moe.quantize %x : tensor<TxHxf32> -> !moe.mx<TxHxf8E4M3FN, axis = 1>
    %q, %o, %c, %p = moe.dispatch %qx, %idx experts(E) : ... -> !moe.mx<RxHxf8E4M3FN, axis = 1>, ...
    ```

    Exact: a block's scale and elements depend on that block only, the ops
    copy whole rows, and their zero rows are an all-zero block's encoding.
    What it saves: the dispatch quantizes T tokens instead of T * k copies
    and writes a quarter of the bytes; an expert-parallel exchange sends
    H + H/32 bytes a row instead of 4 H (f32). Applied repeatedly, so a
    quantize after the exchange and the local dispatch of an
    expert-parallel layer moves before both and the first dispatch.

    Only when the moved rows have no other use (the row-moving op's result
    is read by this quantize alone); a columnwise quantize (`axis = 0`)
    mixes rows and stays where it is.

    The same for an elementwise narrowing of the moved rows (a
    `linalg.generic` with identity maps whose body is one `arith.truncf`:
    the bf16 recipe's GEMM operands): the narrowed rows are moved instead,
    half the bytes of f32, and the T x H narrowing of the tokens is the one
    the router's GEMM already makes (CSE merges them). Exact: rounding is
    elementwise, and zero rows stay zero.
  }];
  let dependentDialects = ["moe::MoEDialect", "::mlir::arith::ArithDialect",
                           "::mlir::linalg::LinalgDialect",
                           "::mlir::tensor::TensorDialect"];
}

def MoESplitDeallocs : Pass<"moe-split-deallocs", "func::FuncOp"> {
  let summary = "Free each allocation no other dealloc operand can alias on its own";
  let description = [{
    Ownership-based deallocation ends a block with one `bufferization.dealloc`
    of every buffer the block allocated. This pass splits off each operand
    whose buffer (through views) is an allocation that no other operand,
    freed or retained, views: it is freed by a dealloc of its own, under its
    own condition, retaining nothing.

    ```mlir
    %r:1 = bufferization.dealloc (%a, %b, %arg0 : ...) if (%true, %c, %d)
                                 retain (%v : memref<4xf32>)
    // with %a and %b allocations and %v a view of neither:
    bufferization.dealloc (%a : memref<8xf32>) if (%true)
    bufferization.dealloc (%b : memref<8xf32>) if (%c)
    %r:1 = bufferization.dealloc (%arg0 : ...) if (%d) retain (%v : ...)
    ```

    This is what `-buffer-deallocation-simplification` concludes with alias
    analysis over every pair of operands, found without it, in time linear
    in the operands (a train step's dealloc has thousands). A dealloc with
    an operand whose buffer is unknown (a call's result, a loaded memref)
    is left whole to the simplification.
  }];
}

def MoEBufferLifetimes : Pass<"moe-buffer-lifetimes", "func::FuncOp"> {
  let summary = "Allocate each buffer at its first use and free it after its last";
  let description = [{
    Bufferization allocates a buffer where its tensor was created (often
    hoisted to the top of the function) and ownership-based deallocation
    frees it at the end of the allocating block. A train step's buffers
    would then all live from the top of the function to its return, and the
    step's peak memory would be the sum of all of them. This pass moves, in
    the block of each `memref.dealloc`:

    - the `memref.alloc` down to just before the first op that uses it;
    - the `memref.dealloc` up to just after the last op that can reach the
      buffer.

    ```mlir
    %a = memref.alloc() : memref<64xf32>
    ...                                   // no use of %a
    linalg.fill ins(%c : f32) outs(%a : memref<64xf32>)
    linalg.copy ins(%a : memref<64xf32>) outs(%out : memref<64xf32>)
    ...                                   // no use of %a
    memref.dealloc %a : memref<64xf32>
    // becomes
    ...
    %a = memref.alloc() : memref<64xf32>
    linalg.fill ins(%c : f32) outs(%a : memref<64xf32>)
    linalg.copy ins(%a : memref<64xf32>) outs(%out : memref<64xf32>)
    memref.dealloc %a : memref<64xf32>
    ...
    ```

    An op reaches the buffer when it uses the allocation or any value
    computed from it: views (`memref.subview`, reshapes, casts), its
    metadata and aligned pointer, and what is computed from those (a TMA
    descriptor built from the pointer, a kernel launch taking it), at any
    depth of nesting. A use inside a region counts as a use by the op of the
    block that holds it, and that op's results count as computed from the
    buffer, loaded elements included (the GPU lowering moves a load of a
    count into the kernels whose bounds use it, which then read the
    buffer). Reach follows SSA values only: a pointer to the buffer stored
    into memory and loaded back elsewhere is not followed, so the pipelines
    run this pass where no such store exists (pointers are only passed to
    calls and kernel launches). A buffer is left alone when the freed value
    is not a `memref.alloc` (or a view of one) of the dealloc's block, or
    when something reaches it outside that block. On a GPU, allocations and frees are ordered on the
    program's stream, so a later allocation reuses the memory only after the
    kernels that read it.
  }];
  let dependentDialects = ["memref::MemRefDialect"];
}

def MoEPlaceWeightGradients : Pass<"moe-place-weight-gradients", "func::FuncOp"> {
  let summary = "Move each grouped weight-gradient GEMM to where the fewest bytes are live";
  let description = [{
    A train step's backward computes the data gradients first (the next
    layer down waits for them) and the weight gradients after, which nothing
    reads before the step's end. Where a weight gradient runs decides what is
    live around it: its operands (the rounded rows of the activations and of
    the gradients, [rows, K] and [rows, N]) until it runs, its result
    ([E, K, N] f32) from then on, and everything the ops it passes free or
    allocate. This pass moves each `moe.grouped_matmul_wgrad` down, within
    its block, past ops without memory effects (not past a `moe.all_to_all`,
    whose overlap with compute is scheduled), at most to just before the
    first op that reads its result, to the place where the most tensor
    bytes live at once over that stretch is least (ties keep it earliest).
    Tensor bytes are estimated before bufferization (`TensorLiveness.h`):
    each buffer lives from the op that defines it to the last op of the
    block that reads it or a view of it. A weight gradient whose every use
    rounds it to bf16 (the bf16 recipe; its kernel then writes bf16 itself)
    moves with those roundings, which first move up to run right after it,
    and its f32 result counts as never existing.

    In a train step of the layer, the weight gradient of w1 moves past the
    combine of the data gradient, which frees the expert rows' f32 gradient
    ([rows, H]) before w1's f32 gradient is allocated.
  }];
}

def MoEBufferReport : Pass<"moe-buffer-report", "func::FuncOp"> {
  let summary = "Report each function's peak of live buffers (a remark)";
  let description = [{
    Runs on bufferized IR (after `-moe-buffer-lifetimes` in the pipelines,
    with `moe-compile --buffer-report`). Walks each function in program
    order, adding each static-shaped `memref.alloc` and subtracting its
    `memref.dealloc`, and emits a remark at the function: the peak of the
    bytes allocated and not yet freed (buffers still held at the return,
    the function's results among them, count until the end), where it is
    reached, and the largest buffers live there:

    ```
    remark: buffers of @loss_grad: peak 3.16 GiB (31 live) at loc(...); largest: 1.50 GiB memref<128x2048x1536xf32>, ...
    ```

    Loops count once (each allocation in program order), allocations of a
    dynamic size (or an element type without a size) are reported by
    number, not counted, and memory a callee allocates is not seen.
  }];
}

def MoEFuseGroupedMlp : Pass<"moe-fuse-grouped-mlp"> {
  let summary = "Fuse the grouped GEMMs and SwiGLU of expert MLPs, forward and backward";
  let description = [{
    Forward: `moe.grouped_matmul(x, w1, off) -> f32`, `moe.swiglu`, then
    either a rowwise `moe.quantize` to `w2`'s MX type (SwiGLU result f32) or
    a SwiGLU result of `w2`'s element type, then
    `moe.grouped_matmul(·, w2, off)` becomes one `moe.grouped_mlp`, when the
    intermediates have no other uses, both GEMMs read the same offsets value
    and the sequence is exactly `moe.grouped_mlp`'s definition.

    Backward: `moe.swiglu_grad(h, da)` with `h = grouped_matmul(x, w1)` and
    `da = grouped_matmul(dy, w2) transpose_rhs` (both f32), the data-gradient
    GEMM `grouped_matmul(dh, w1) transpose_rhs`, the weight gradients
    `grouped_matmul_wgrad(x, dh)` and `grouped_matmul_wgrad(swiglu(h), dy)`,
    with their operands all used as they are, all rounded to bf16, or all
    quantized to one MX type (what `-moe-quantize` inserts), becomes one
    `moe.grouped_mlp_backward`, which recomputes `h` and the activation from
    `x` instead of keeping them. `da` and `dh` (and their quantized copies)
    must have no other uses; `h` and the activation may (the forward pass
    uses them). Backward sequences are fused first, so that a forward and
    backward in one function both fuse.

    Anything else (different offsets, another layout or scale mode on one
    side, an f32 activation before a bf16 `w2`, a mix of quantized and
    unquantized operands) is left unfused.
  }];
}

def MoEGroupExperts : Pass<"moe-group-experts", "func::FuncOp"> {
  let summary = "Turn per-expert GEMMs into moe.grouped_matmul (all experts in one op)";
  let description = [{
    Rewrites the ways frontends write the experts of an MoE layer into ops
    on all rows at once, bit-identically:

    - A `moe.experts` whose body is a chain of row-wise ops on the group's
      rows becomes the same chain on all rows: `linalg.matmul` of the rows
      by a weight slice (also through `linalg.transpose` or `A @ B^T`
      indexing maps) becomes `moe.grouped_matmul` (`transpose_rhs`),
      `moe.swiglu` and elementwise linalg/arith/math ops apply to the whole
      tensor. The yielded value must be +0 on rows outside every group
      (it comes from a grouped matmul, or from ops f with f(+0) = +0, checked
      by folding, applied to one).
    - An `scf.for` over experts `e = 0..E` that slices rows
      `[offsets[e], offsets[e+1])` of the tokens and slice `e` of stacked
      weights, computes purely, and inserts the rows into a +0 result is
      raised to `moe.experts`, which is then grouped as above (a raised
      loop whose body cannot be grouped stays a `moe.experts`).
    - E >= 2 unrolled `linalg.matmul`s of consecutive static row slices of
      one tensor by per-expert weights (slices `e` of one stacked tensor, or
      separate tensors of one type, then stacked), written to consecutive
      rows of one result (`tensor.concat` or an `insert_slice` chain), become
      one `moe.grouped_matmul` with constant offsets.

    Matmuls are converted only when `moe.grouped_matmul` (f32 accumulation,
    one rounding) gives the same bits: the `linalg.matmul` accumulates in
    f32 from a +0 init, with f32/bf16/f16 operands. Shared experts (a dense
    matmul on all tokens) stay dense. Anything else is left unchanged; with
    `remarks` every such candidate gets a remark saying why.
  }];
  let dependentDialects = [
    "moe::MoEDialect", "arith::ArithDialect", "linalg::LinalgDialect",
    "tensor::TensorDialect"
  ];
  let options = [
    Option<"remarks", "remarks", "bool", /*default=*/"false",
           "Emit a remark on every candidate left unchanged, saying why">
  ];
}

def MoEExpertParallel : Pass<"moe-expert-parallel", "::mlir::ModuleOp"> {
  let summary = "Shard the experts of every MoE layer over a grid axis (expert parallelism)";
  let description = [{
    Rewrites each MoE layer (`moe.dispatch` -> expert computation ->
    `moe.combine`) into the program of one rank of `ep-size`, each holding
    `E / ep-size` experts:

    ```
    dispatch(x, idx, E)                 rows grouped by global expert
    all_to_all(rows, counts)            counts first, then rows to the expert
      slot_major_result pad_to(m)       owners, arriving grouped by local expert
                                        (the original pad_to)
    slot_offsets(received counts)       the local groups
    <expert computation>                local rows, local weight shards
    all_to_all(y, received counts)      rows return to their ranks, read from
      slot_major_input pad_to(m)        the local groups
    combine(y, weights, positions)      the original weighted sum
    ```

    The exchanges place and read the rows (no regrouping dispatch, no
    combine back into the received order); the local groups hold a token's
    rows in the order the single-rank layer's would, so the results are its
    bits.

    Stacked expert weights `[E, ...]` that are function arguments become the
    rank's shard `[E / ep-size, ...]` (argument attribute `moe.expert_shard
    = {grid = "ep", experts = E, local_experts = E / ep-size}`; rank r holds
    experts `[r * E / ep-size, (r + 1) * E / ep-size)`); other expert weights are sliced at the
    rank's offset (`shard.process_linear_index`). The grid is `shard.grid
    @<grid>(shape = <ep-size>)`, created when missing. Capacity factors then
    apply to each rank's own tokens. Results marked `moe.gradient_of = i`
    whose argument `i` is not an expert shard (data-parallel parameters) are
    summed over the grid with `shard.all_reduce`; expert gradients stay with
    their owners. E must be a multiple of `ep-size`. With `ep-size=1` the
    exchanges are identities and the result is that of the original layer.

    Overlap: with `chunks=N` each layer's tokens are split into N equal
    parts, each dispatched, exchanged, computed, returned and combined on
    its own; the ops are emitted stage by stage (all chunks' dispatches and
    exchanges, then all chunks' experts and return exchanges, then the
    combines, whose results fill the layer's output), so that once
    `-convert-moe-to-runtime` has split every exchange into a start and a
    wait, chunk i+1's rows travel while the experts compute chunk i, and
    chunk i's results return while chunk i+1 computes. The results are those
    of `chunks=1` (each token's rows meet the same weights); expert weight
    gradients are summed over the chunks, so in another order. The token
    count must divide by N; capacity factors are refused with N > 1 (they
    would apply per chunk).

    Training: shard the loss function, then `-moe-autodiff` (the gradient
    of a `moe.all_to_all` is the reverse exchange, so gradients travel back
    to where their rows came from), then run this pass again: a function
    that already exchanges rows is not resharded, only its data-parallel
    gradients are summed. The gradients are those of the sum of the ranks'
    losses.

    With `ep-size` > 1 every rank also holds its own slice of the batch, so
    a mean over tokens must be over every rank's: each `moe.cross_entropy`
    (the mean over this rank's counted rows) is scaled by this rank's count
    over the sum of the ranks' counts (a `shard.all_reduce` of the count;
    the op is marked `moe.global_mean` and not scaled twice). The ranks'
    losses then add up to the loss of one rank holding the whole batch, and
    the summed gradients are its gradients. Results marked `moe.output =
    "expert_load"` (tokens routed to each expert) are summed over the grid:
    every rank sees the load of the whole batch.

    Data parallelism: with `dp-size` = D > 1 the grid is `shard.grid
    @<grid>(shape = D x ep-size)`: D copies of the expert-parallel group,
    each of `ep-size` adjacent ranks (rank = d * ep-size + e). Rows are
    exchanged within a group (axis 1, recorded as `axis` in
    `moe.expert_shard`; the shard's offset is the rank's coordinate on it,
    `shard.process_multi_index`); the data-parallel gradients, the token
    counts of the means and the expert load are summed over both axes, and
    the gradients of expert shards over axis 0 (the copies of the same
    experts). With `ep-size=1` and D > 1 the layers stay whole and only the
    sums are added: plain data parallelism.
  }];
  let options = [
    Option<"epSize", "ep-size", "int64_t", /*default=*/"1",
           "Number of ranks the experts are spread over">,
    Option<"dpSize", "dp-size", "int64_t", /*default=*/"1",
           "Number of data-parallel copies of the expert-parallel group "
           "(the grid becomes dp-size x ep-size)">,
    Option<"gridName", "grid", "std::string", /*default=*/"\"ep\"",
           "Name of the shard.grid holding the expert-parallel axis">,
    Option<"remarks", "remarks", "bool", /*default=*/"false",
           "Emit a remark on every MoE layer left unsharded, saying why">,
    Option<"chunks", "chunks", "int64_t", /*default=*/"1",
           "Split each layer's tokens into this many equal chunks, exchanged "
           "and computed stage by stage, so that one chunk's exchange "
           "overlaps another's expert computation">
  ];
  let dependentDialects = ["::mlir::shard::ShardDialect",
                           "::mlir::arith::ArithDialect",
                           "::mlir::linalg::LinalgDialect",
                           "::mlir::tensor::TensorDialect"];
}

def MoEBucketAllReduce : Pass<"moe-bucket-all-reduce", "func::FuncOp"> {
  let summary = "The sums a function returns, summed a bucket at a time";
  let description = [{
    The `shard.all_reduce` sums whose only reader is the block's terminator
    (the data-parallel gradients `-moe-expert-parallel` sums over the ranks)
    are grouped, by grid, axes and element type and in the order their
    inputs are computed, into buckets of at least `bucket-mib` MiB (the last
    one of a kind smaller). Each bucket of several becomes one sum: right
    after the last of its inputs is computed they are flattened and placed
    one after another (`tensor.insert_slice` into a `tensor.empty`), summed
    with one `shard.all_reduce`, and each result is its slice of the sum,
    reshaped. The sums are the same elementwise; there are fewer of them,
    and each starts where its bucket is complete instead of at the end:
    once `-convert-moe-to-runtime` has split it into a start and a wait, a
    bucket of the last layers' gradients travels while the backward of the
    earlier layers computes. `bucket-mib=0` leaves every sum as it is.
  }];
  let options = [
    Option<"bucketMiB", "bucket-mib", "int64_t", /*default=*/"32",
           "Size of a bucket in MiB (0: one sum per tensor)">
  ];
  let dependentDialects = ["::mlir::shard::ShardDialect",
                           "::mlir::tensor::TensorDialect"];
}

def MoEReuseForwardValues : Pass<"moe-reuse-forward-values", "::mlir::ModuleOp"> {
  let summary = "The backward of a called function reads what its forward computed";
  let description = [{
    For each pair `-moe-autodiff` split from a called function
    (`@f_forward`, returning the function's results and then the residuals
    marked `moe.residual = i`; `@f_backward` marked `moe.forward =
    @f_forward`, taking the arguments again, the residuals, then the
    cotangents): an op of the backward that the forward also computes from
    the same arguments and residuals (CSE's equivalence) is read from the
    forward instead, and the residuals are chosen anew as the forward
    values the backward's remaining ops read. Every call of both is
    rewritten to match. This is the CSE one function holding forward and
    backward would get: after `-moe-quantize`, a GEMM operand rounded to
    bf16 in the forward is kept as the residual instead of its f32 source,
    and a weight is rounded once per step. Reshapes, slices and
    `moe.dispatch` stay in the backward (a returned view of an argument
    would be copied; a dispatch's rows are read in place by the kernels
    that take them).
  }];
}

def MoESplitBackward : Pass<"moe-split-backward", "::mlir::ModuleOp"> {
  let summary = "Split a train step into the forward and backward an autograd framework calls";
  let description = [{
    For every function with an argument marked `moe.cotangent` (the train
    step `-moe-autodiff` makes of a loss `sum(out * dy)`, `%dy` the cotangent
    of `out`, which the function also returns as a result marked
    `moe.output`), makes two public functions and erases the step:

    - `@<name>_forward(args)` returns the outputs (the `moe.output` results)
      and then the residuals: the values of the forward that the backward
      reads, each marked `moe.residual`;
    - `@<name>_backward(args, residuals, cotangents)` returns the gradients
      (the `moe.gradient_of` results, in the step's order). `args` are the
      step's arguments other than the cotangents, passed again (an
      autograd framework keeps them, so the forward returns none of them).

    The forward holds exactly the ops its outputs need; the backward holds
    the ops its gradients need that the forward does not compute. Ops
    without operands (constants, empty tensors), and precision changes
    (`arith.extf`, `truncf`, `moe.quantize`) and reshapes of the arguments
    and of recomputed values, are cloned into the backward instead of
    becoming residuals (a widened weight would be kept at twice its size;
    the backward's own quantization of the same tensor is the same op, and
    CSE merges them), and so are dispatches (a gather of the tokens)
    and fused expert MLPs (`moe.grouped_mlp`): their output, [tokens x
    top-k, hidden] in f32, would be the largest residual of an MoE layer,
    and the backward's `moe.grouped_mlp_backward` recomputes the same up
    projection and SwiGLU anyway, so recomputing the MLP costs its down
    projection only. The loss result is dropped: it only seeds the
    gradients. Runs after `-moe-train-pipeline` (the recipe's
    quantizations placed). An output depending on a cotangent, or an op with side effects, is an
    error at that op.
  }];
}

def MoEAutodiff : Pass<"moe-autodiff", "::mlir::ModuleOp"> {
  let summary = "Reverse-mode differentiation: a loss function becomes a train step";
  let description = [{
    For every loss function (one returning a single `tensor<f32>`; or those
    named by `functions`), adds `@<name>_grad` with the same arguments,
    returning the loss and then the gradient of every float tensor argument
    not marked `moe.no_grad` (or `moe.cotangent`), in argument order. Result
    attributes: `moe.loss` on the loss, `moe.gradient_of = i` on the gradient of
    argument `i` (what `-moe-expert-parallel` reads to all-reduce
    data-parallel gradients).

    The forward ops are kept; one vector-Jacobian product per op the loss
    depends on is appended in reverse order, and gradients reaching a value
    along several uses are summed. Rules exist for:
    - moe: `router` (through `moe.router_grad`), `dispatch`, `combine`
      (`moe.combine_grad` and a dispatch of the weighted rows),
      `grouped_matmul`, `swiglu`, `grouped_mlp` (`grouped_mlp_backward`),
      `embedding`, `rms_norm`, `rotary`, `attention`, `cross_entropy`;
    - `moe.all_to_all`: the reverse exchange (counted by what each rank
      received), so an expert-parallel loss differentiates across ranks;
    - upstream: `linalg.matmul`, `linalg.transpose`, `linalg.softmax`,
      `tensor.expand_shape` / `collapse_shape`, `tensor.extract_slice` /
      `insert_slice` (the chunks of `-moe-expert-parallel{chunks}`), and
      `arith.addf`, `subf`,
      `mulf`, `divf`, `negf`, `extf`, `truncf`, `math.exp`, `math.tanh` on
      tensors.
    An op the loss depends on without a rule (a `linalg.generic`, an
    `moe.experts` region, block-scaled operands) is an error at that op:
    differentiate before `-moe-quantize` and after `-moe-group-experts`.

    Calls (`func.call`) of functions with a body are differentiated once per
    callee, whatever the number of calls: `@f` gets two private companions,
    as `-moe-split-backward` makes them,
    - `@f_forward(args) -> (results, residuals)`, and
    - `@f_backward(args, residuals, a cotangent per float result) -> the
      gradient of every float argument not marked moe.no_grad`.
    The train step calls `@f_forward` where the loss called `@f`, and
    `@f_backward` in the backward (zeros as the cotangents of results the
    loss does not read); `no_inline` carries over to both calls. A call of
    an external function, or a recursive one, is refused.

    With `recompute`, the step keeps calling `@f` where the loss did and
    calls `@f_forward` again right before `@f_backward`: the residuals of a
    call live only while its backward runs, and what the step holds across
    its forward is each call's arguments (activation checkpointing: one more
    forward of every called function, a decoder layer's activations not
    held).
  }];
  let options = [
    Option<"recompute", "recompute", "bool", /*default=*/"false",
           "Recompute each call's forward before its backward instead of "
           "keeping its residuals from the forward">,
    ListOption<"functions", "functions", "std::string",
               "Loss functions to differentiate (default: every function "
               "returning one tensor<f32>)">,
    Option<"suffix", "suffix", "std::string", /*default=*/"\"_grad\"",
           "Appended to a loss function's name to name its train step">
  ];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::linalg::LinalgDialect",
                           "::mlir::tensor::TensorDialect"];
}

#endif
