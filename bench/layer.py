"""An MoE layer (by default Qwen3-30B-A3B's: hidden 2048, expert FFN 768,
128 experts, top-8), forward + backward, ours beside the peers, in one GPU
run:

    python3 bench/layer.py ARTIFACT_DIR [--dims H,FFN,EXPERTS,TOPK] [TOKENS ...]
                                                           (bench/run-layer.sh)

Ours: the train step of the layer's loss sum(layer(x) * dy) that
`bench/run-layer.sh prepare` compiled for sm_90a with
-moe-train-pipeline{autodiff=true recipe=none|bf16|mxfp8} (f32 master
weights; bf16: bf16 expert GEMMs forward and backward;
mxfp8: MXFP8 expert GEMMs forward and backward, each expert's rows padded
to 32; `pairs always`: the same compiled with --pair-round-trips=always,
which reads each tensor once for both MX blockings however long the
second is held, where the default splits pairs that raise the peak;
`8-bit activations`: compiled with --mx-activations=always, every SwiGLU
epilogue writing its activation's MX elements and scales for the GEMM after
it, where the default does so only where that lowers the peak). Peers,
bf16: transformers'
Qwen3MoeSparseMoeBlock with its default experts and with grouped_mm, a
hand-written torch._grouped_mm layer, and the same layer with FP8 rowwise
GEMMs (torch._scaled_grouped_mm forward and for the data gradients, weight
gradients in bf16). Routing balanced (random router) and
skewed (a quarter of the experts favoured). Per row: tokens/s (median of
runs after a warm-up), TFLOP/s of the expert GEMMs (6 x tokens x top-k x
3 x hidden x ffn, forward + backward), peak GPU memory (inputs, weights and
gradients included: ours, libmoert's peak plus the input tensors; the peers,
torch's peak with only their own tensors alive), and activation memory: the
peak minus what is held before and after a step (inputs, weights, their
gradients; ours: the train step's results).
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

H, FF, E, K = 2048, 768, 128, 8


def inputs(T, skew, dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(T + skew)
    x = torch.randn(T, H, device="cuda", generator=g)
    rw = torch.randn(H, E, device="cuda", generator=g) * 0.02
    if skew:
        u = torch.randn(H, device="cuda", generator=g)
        u /= u.norm()
        x += 3.0 * u
        rw[:, : E // 4] += 0.5 * u[:, None]
    w1 = torch.randn(E, H, 2 * FF, device="cuda", generator=g) * 0.02
    w2 = torch.randn(E, FF, H, device="cuda", generator=g) * 0.02
    dy = torch.randn(T, H, device="cuda", generator=g)
    return [t.to(dtype) for t in (x, rw, w1, w2, dy)]


def timed(fn, repeat):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fp8_rowwise(t):
    """t (last dim the contraction) as E4M3 with one f32 scale per row:
    amax / 448 (torch's rowwise FP8 recipe)."""
    scale = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (t.float() / scale).to(torch.float8_e4m3fn), scale.squeeze(-1)


def _scaled_grouped_mm(a, b, offs):
    """a [M, K] @ b[e] [K, N] per group, both quantized rowwise along K."""
    qa, sa = _fp8_rowwise(a.contiguous())
    # [E, N, K] contiguous, scales [E, N]: its transpose is the column-major
    # [E, K, N] operand torch._scaled_grouped_mm takes.
    qb, sb = _fp8_rowwise(b.transpose(-2, -1).contiguous())
    return torch._scaled_grouped_mm(qa, qb.transpose(-2, -1), sa, sb, offs=offs,
                                    out_dtype=torch.bfloat16)


class ScaledGroupedMM(torch.autograd.Function):
    """A grouped GEMM on torch._scaled_grouped_mm (FP8 rowwise) forward and
    for the data gradient; the weight gradient in bf16 (torch._grouped_mm)."""

    @staticmethod
    def forward(ctx, a, b, offs):
        ctx.save_for_backward(a, b, offs)
        return _scaled_grouped_mm(a, b, offs)

    @staticmethod
    def backward(ctx, dy):
        a, b, offs = ctx.saved_tensors
        da = _scaled_grouped_mm(dy, b.transpose(-2, -1), offs)
        # a^T [K, R] column-major: the groups split its outer dimension.
        db = torch._grouped_mm(a.t(), dy, offs=offs)
        return da, db, None


def grouped_mm_layer(x, rw, w1, w2, mm=torch._grouped_mm):
    """Router softmax + top-k (renormalized), tokens sorted by expert,
    `mm` (torch._grouped_mm, or the FP8 ScaledGroupedMM) for both GEMMs,
    SwiGLU, weighted combine."""
    T = x.shape[0]
    probs = F.softmax(x.float() @ rw.float(), dim=-1)
    w, idx = probs.topk(K, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
    flat = idx.flatten()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=E)
    offs = counts.cumsum(0).to(torch.int32)
    xs = x.repeat_interleave(K, dim=0)[order]
    h = mm(xs, w1, offs=offs)
    a = F.silu(h[:, :FF]) * h[:, FF:]
    y = mm(a, w2, offs=offs)
    out = torch.zeros(T * K, H, device=x.device, dtype=y.dtype)
    out[order] = y
    return (out.view(T, K, H) * w[..., None]).sum(1)


def main(art_dir, token_counts):
    rows = []
    print(f"# MoE layer forward + backward, hidden {H}, expert FFN {FF}, {E} experts, top-{K}")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for T in token_counts:
        flops = 6.0 * T * K * 3 * H * FF
        repeat = 5 if T <= 8192 else 3
        for skew in (0, 1):
            routing = "skewed" if skew else "balanced"
            # --- ours ---
            from moe_mlir import load, runtime
            names = {"none": "moe-mlir f32", "bf16": "moe-mlir bf16 experts",
                     "mxfp8": "moe-mlir MXFP8 experts",
                     "fp8-blockwise": "moe-mlir blockwise FP8 experts",
                     "mxfp8-paired": "moe-mlir MXFP8, pairs always",
                     "mxfp8-mx": "moe-mlir MXFP8, 8-bit activations"}
            for recipe in names:
                path = os.path.join(art_dir, f"layer_{T}_{recipe}.sm_90a.so")
                if not os.path.exists(path):
                    continue
                art = load(path)
                args = inputs(T, skew)
                lib = runtime.moert()
                lib.moert_gpu_empty_cache()
                lib.moert_gpu_reset_peak_memory()
                t = timed(lambda: art.loss_grad(*args), repeat)
                stats = runtime.gpu_memory_stats()
                results = sum(nbytes(r) for r in art.loss_grad(*args))
                # libmoert's peak plus the inputs (torch's allocations: the
                # f32 master weights among them), as the peers count theirs.
                held = sum(nbytes(a) for a in args)
                rows.append((T, routing, names[recipe], T / t, flops / t / 1e12,
                             (stats.peak + held) / 2**20, (stats.peak - results) / 2**20))
                art = args = None  # not counted in the peers' peaks
            # --- peers ---
            try:
                from transformers import Qwen3MoeConfig
                from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
                for experts in ("eager", "grouped_mm"):
                    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=FF, num_experts=E,
                                         num_experts_per_tok=K, norm_topk_prob=True)
                    if experts != "eager":
                        cfg._experts_implementation = experts
                    block = Qwen3MoeSparseMoeBlock(cfg).cuda().bfloat16()
                    x, rw, w1, w2, dy = inputs(T, skew, torch.bfloat16)
                    with torch.no_grad():
                        block.gate.weight.copy_(rw.t())
                        block.experts.gate_up_proj.copy_(w1.transpose(1, 2))
                        block.experts.down_proj.copy_(w2.transpose(1, 2))
                    xx = x[None].requires_grad_(True)
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()

                    def step():
                        out = block(xx)
                        out = out[0] if isinstance(out, tuple) else out
                        out.backward(dy[None])
                    t = timed(step, repeat)
                    rows.append((T, routing, f"transformers {experts} bf16", T / t, flops / t / 1e12,
                                 *peak_and_activations()))
                    del block
            except Exception as err:
                print(f"transformers peer unavailable: {str(err).splitlines()[0][:80]}")
            # The transformers peer's tensors go first (they would count in
            # the next peer's peak memory).
            x = rw = w1 = w2 = dy = xx = block = None
            t, mem = time_grouped_mm_layer(T, skew, torch._grouped_mm, repeat)
            rows.append((T, routing, "torch._grouped_mm layer bf16", T / t, flops / t / 1e12,
                         *mem))
    print_rows(rows, header=True)
    # The FP8 layer last, row by row: a failing CUDA kernel (a device-side
    # assert) ends the process, and the rows above are printed already.
    fp8 = lambda a, b, offs: ScaledGroupedMM.apply(a, b, offs)  # noqa: E731
    for T in token_counts:
        flops = 6.0 * T * K * 3 * H * FF
        for skew in (0, 1):
            try:
                t, mem = time_grouped_mm_layer(T, skew, fp8, 5 if T <= 8192 else 3)
            except Exception as err:  # report, do not hide
                print(f"torch._scaled_grouped_mm layer unavailable: "
                      f"{str(err).splitlines()[0][:100]}")
                return
            print_rows([(T, "skewed" if skew else "balanced",
                         "torch._scaled_grouped_mm layer fp8", T / t, flops / t / 1e12, *mem)])


def nbytes(t):
    return t.numel() * t.element_size()


def peak_and_activations():
    """torch's peak memory since the last reset and the peak minus what is
    held now, after a step (inputs, weights, gradients), in MiB."""
    peak = torch.cuda.max_memory_allocated()
    return peak / 2**20, (peak - torch.cuda.memory_allocated()) / 2**20


def time_grouped_mm_layer(T, skew, mm, repeat):
    """Seconds per forward + backward of grouped_mm_layer with `mm`, and the
    peak and activation memory (MiB) it took."""
    x, rw, w1, w2, dy = inputs(T, skew, torch.bfloat16)
    w1 = w1.requires_grad_(True)
    w2 = w2.requires_grad_(True)
    xx = x.requires_grad_(True)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t = timed(lambda: grouped_mm_layer(xx, rw, w1, w2, mm).backward(dy), repeat)
    return t, peak_and_activations()


def print_rows(rows, header=False):
    if header:
        print(f"{'tokens':>7} {'routing':9} {'':32} {'tokens/s':>12} {'TFLOP/s':>8} "
              f"{'peak MiB':>9} {'act MiB':>8}")
    for T, routing, name, tps, tf, mem, act in rows:
        print(f"{T:7d} {routing:9} {name:32} {tps:12.0f} {tf:8.1f} {mem:9.0f} {act:8.0f}",
              flush=True)


if __name__ == "__main__":
    args = sys.argv[2:]
    if args[:1] == ["--dims"]:
        try:
            H, FF, E, K = (int(d) for d in args[1].split(","))
        except (IndexError, ValueError):
            sys.exit("layer.py: --dims takes HIDDEN,FFN,EXPERTS,TOPK")
        args = args[2:]
    main(sys.argv[1], [int(t) for t in args] or [2048, 8192])
