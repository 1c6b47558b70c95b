"""Grouped GEMM at the Qwen3-30B-A3B expert shapes, ours beside torch's, in
one GPU run:

    python3 bench/gemm.py emit ROWS > gemm_ROWS.mlir     (here, no GPU)
    python3 bench/gemm.py run ARTIFACT_DIR [TOKENS ...]  (bench/run-gemm.sh)

Two shapes, 128 experts: GEMM1 of the expert MLP (x @ w1, K = 2048 hidden,
N = 1536 gate and up) and GEMM2 (a @ w2, K = 768, N = 2048), at TOKENS x
top-8 rows, routing balanced (every expert the same rows) or skewed (a
quarter of the experts get four times the rows of the others). The offsets
are a run-time argument, so one artifact serves both.

Ours (`emit` writes the functions, `bench/run-gemm.sh prepare` compiles
them for sm_90a: as they are, with --mxfp8-fp8-mma and with
--fp8block-exact):
- bf16: moe.grouped_matmul of bf16 operands, f32 result (the TMA,
  warp-specialized wgmma kernel);
- MXFP8 exact: the same GEMM of MXFP8 operands (E4M3, one E8M0 scale per 32
  along K): the dequantize kernel (exact, to bf16) and the bf16 kernel;
- MXFP8 fp8-mma: FP8 wgmma per 32-wide K slice with both scales applied to
  the f32 partial sums (opt-in: Hopper's FP8 tensor core sums a slice at
  reduced precision, so it is not exact);
- blockwise FP8 (E4M3, power-of-two f32 scales per 1 x 128 of x and per
  128 x 128 of w): on FP8 wgmma promoted every 128 of K (the TMA kernel;
  its time includes the transpose of w's elements to the K-major layout
  FP8 wgmma reads, which training's weight quantize writes instead, and the
  row "w K-major" gives w in that layout already, as the data gradient
  does); "exact": --fp8block-exact, dequantized to bf16 (exact) for the
  bf16 kernel.
Peers: torch._grouped_mm (bf16 result, and f32 where torch offers
out_dtype), torch._scaled_grouped_mm with FP8 rowwise scales (bf16 result).
The FP8 peer's operands are quantized before timing; ours are MX already.

Each row: GPU time of one call (the kernels it launches, by PyTorch's
profiler over 10 calls after a warm-up: the same measure for ours and the
peers, launch gaps and host work excluded), TFLOP/s of 2 x rows x K x N,
and the result's relative difference ||y - ref|| / ||ref|| from each
group's f32 product of the same operands (MXFP8 rows: of the MX operands
dequantized exactly; the FP8 peer's operands are its own rowwise
quantization of those, so its difference includes that).
"""
import sys

E, TOPK = 128, 8
SHAPES = {"gmm1": (2048, 1536), "gmm2": (768, 2048)}  # name: (K, N)


def emit(rows):
    """The benchmark's functions for `rows` rows, as MLIR."""
    out = [f"// Grouped GEMMs at {rows} rows, {E} experts (bench/gemm.py emit {rows})."]
    for name, (k, n) in SHAPES.items():
        x, w, off = f"tensor<{rows}x{k}xbf16>", f"tensor<{E}x{k}x{n}xbf16>", f"tensor<{E + 1}xi32>"
        y = f"tensor<{rows}x{n}xf32>"
        out.append(f"""
func.func @{name}_bf16(%x: {x}, %w: {w}, %off: {off}) -> {y} {{
  %y = moe.grouped_matmul %x, %w, %off : {x}, {w}, {off} -> {y}
  return %y : {y}
}}""")
        xd, xs = f"tensor<{rows}x{k}xf8E4M3FN>", f"tensor<{rows}x{k // 32}xf8E8M0FNU>"
        wd, ws = f"tensor<{E}x{k}x{n}xf8E4M3FN>", f"tensor<{E}x{k // 32}x{n}xf8E8M0FNU>"
        xm, wm = f"!moe.mx<{rows}x{k}xf8E4M3FN, axis = 1>", f"!moe.mx<{E}x{k}x{n}xf8E4M3FN, axis = 1>"
        out.append(f"""
func.func @{name}_mxfp8(%xd: {xd}, %xs: {xs}, %wd: {wd}, %ws: {ws}, %off: {off}) -> {y} {{
  %x = moe.mx_pack %xd, %xs : {xd}, {xs} -> {xm}
  %w = moe.mx_pack %wd, %ws : {wd}, {ws} -> {wm}
  %y = moe.grouped_matmul %x, %w, %off : {xm}, {wm}, {off} -> {y}
  return %y : {y}
}}""")
        bs = f"tensor<{rows}x{-(-k // 128)}xf32>"
        bws = f"tensor<{E}x{k // 128}x{n // 128}xf32>"
        xb = f"!moe.fp8block<{rows}x{k}xf8E4M3FN, block = [1, 128], pow2>"
        wb = f"!moe.fp8block<{E}x{k}x{n}xf8E4M3FN, block = [1, 128, 128], pow2>"
        out.append(f"""
func.func @{name}_fp8block(%xd: {xd}, %xs: {bs}, %wd: {wd}, %ws: {bws}, %off: {off}) -> {y} {{
  %x = moe.mx_pack %xd, %xs : {xd}, {bs} -> {xb}
  %w = moe.mx_pack %wd, %ws : {wd}, {bws} -> {wb}
  %y = moe.grouped_matmul %x, %w, %off : {xb}, {wb}, {off} -> {y}
  return %y : {y}
}}""")
        # The same with the weights K-major ([E, N, K], transpose_rhs), as
        # FP8 wgmma reads them: the GEMM without the forward's transpose.
        wtd, wts = f"tensor<{E}x{n}x{k}xf8E4M3FN>", f"tensor<{E}x{n // 128}x{k // 128}xf32>"
        wtb = f"!moe.fp8block<{E}x{n}x{k}xf8E4M3FN, block = [1, 128, 128], pow2>"
        out.append(f"""
func.func @{name}_fp8block_kmajor(%xd: {xd}, %xs: {bs}, %wd: {wtd}, %ws: {wts}, %off: {off}) -> {y} {{
  %x = moe.mx_pack %xd, %xs : {xd}, {bs} -> {xb}
  %w = moe.mx_pack %wd, %ws : {wtd}, {wts} -> {wtb}
  %y = moe.grouped_matmul %x, %w, %off transpose_rhs : {xb}, {wtb}, {off} -> {y}
  return %y : {y}
}}""")
    return "\n".join(out) + "\n"


def counts(rows, skew):
    """Rows per expert: equal, or a quarter of the experts with 4x the rest."""
    import torch
    weight = torch.ones(E)
    if skew:
        weight[: E // 4] = 4.0
    c = (weight / weight.sum() * rows).floor().long()
    c[0] += rows - int(c.sum())
    return c


def gpu_ms(fn, calls=10, warmup=2):
    """GPU time per call of the kernels `fn` launches (PyTorch's profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = sum(ev.device_time_total for ev in prof.events()
                if ev.device_type == torch.autograd.DeviceType.CUDA)
    return total / 1e3 / calls


def rel(y, ref):
    return float((y.float() - ref.float()).norm() / ref.float().norm())


def mx_operand(shape, axis, gen):
    """Random MXFP8 data (E4M3) and E8M0 scales (blocks of 32 along `axis`):
    normal values scaled by powers of two around 2^-4, as a quantizer makes
    them, and their exact dequantization as bf16."""
    import torch
    data = (torch.randn(shape, device="cuda", generator=gen) * 64).clamp(-448, 448)
    data = data.to(torch.float8_e4m3fn)
    sshape = list(shape)
    sshape[axis] //= 32
    exps = torch.randint(118, 126, sshape, device="cuda", generator=gen, dtype=torch.uint8)
    scales = exps.view(torch.float8_e8m0fnu)
    factor = torch.exp2(exps.float() - 127).repeat_interleave(32, dim=axis)
    return data, scales, (data.float() * factor).to(torch.bfloat16)


def fp8block_operand(shape, block, gen):
    """Random blockwise FP8 data (E4M3) and power-of-two f32 scales, one per
    tile of `block`, and the exact dequantization as bf16."""
    import torch
    data = (torch.randn(shape, device="cuda", generator=gen) * 64).clamp(-448, 448)
    data = data.to(torch.float8_e4m3fn)
    sshape = [-(-d // b) for d, b in zip(shape, block)]
    exps = torch.randint(-9, -1, sshape, device="cuda", generator=gen)
    scales = torch.exp2(exps.float())
    factor = scales
    for dim, b in enumerate(block):
        factor = factor.repeat_interleave(b, dim=dim).narrow(dim, 0, shape[dim])
    return data, scales, (data.float() * factor).to(torch.bfloat16)


def run(art_dir, token_counts):
    import os

    import torch
    from layer import _fp8_rowwise as fp8_rowwise  # bench/layer.py's FP8 peer recipe
    from moe_mlir import load
    print(f"# Grouped GEMM, {E} experts, Qwen3-30B-A3B expert shapes "
          f"(gmm1: K 2048, N 1536; gmm2: K 768, N 2048)")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"GPU time per call (profiler), relative difference from the reference")
    print(f"{'tokens':>7} {'rows':>7} {'shape':5} {'routing':9} {'':38} {'ms':>8} "
          f"{'TFLOP/s':>8} {'rel diff':>9}")
    missing = set()
    for T in token_counts:
        rows = T * TOPK
        path = os.path.join(art_dir, f"gemm_{rows}.sm_90a.so")
        fp8_path = os.path.join(art_dir, f"gemm_{rows}.fp8-mma.sm_90a.so")
        exact_path = os.path.join(art_dir, f"gemm_{rows}.fp8block-exact.sm_90a.so")
        if not os.path.exists(path):
            print(f"# {path} missing: bench/run-gemm.sh prepare {T}")
            continue
        ours, ours_fp8 = load(path), load(fp8_path) if os.path.exists(fp8_path) else None
        ours_exact = load(exact_path) if os.path.exists(exact_path) else None
        for name, (k, n) in SHAPES.items():
            flops = 2.0 * rows * k * n
            for skew in (0, 1):
                gen = torch.Generator(device="cuda").manual_seed(rows + skew)
                c = counts(rows, skew).cuda()
                offs = torch.cumsum(c, 0).to(torch.int32)          # torch: group ends
                off0 = torch.cat([torch.zeros(1, dtype=torch.int32, device="cuda"), offs])
                x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
                w = (torch.randn(E, k, n, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
                results = []

                def row(label, fn, ref):
                    try:
                        ms = gpu_ms(fn)
                        y = fn()
                    except Exception as err:  # report (once), do not hide
                        if label not in missing:
                            missing.add(label)
                            print(f"# {label} unavailable: {str(err).splitlines()[0][:90]}")
                        return
                    y = y[0] if isinstance(y, tuple) else y
                    results.append((label, ms, flops / ms / 1e9, rel(y, ref)))

                def reference(a, b):
                    # Each group's f32 product of the same operands (exact
                    # products, f32 sums; TF32 off).
                    torch.backends.cuda.matmul.allow_tf32 = False
                    out = torch.empty(rows, b.shape[-1], device="cuda")
                    ends = offs.tolist()
                    for e in range(E):
                        lo, hi = (ends[e - 1] if e else 0), ends[e]
                        if hi > lo:
                            out[lo:hi] = a[lo:hi].float() @ b[e].float()
                    return out

                ref = reference(x, w)
                row("moe-mlir bf16 (f32 result)", lambda: getattr(ours, f"{name}_bf16")(x, w, off0), ref)
                row("torch._grouped_mm bf16 (f32 result)",
                    lambda: torch._grouped_mm(x, w, offs=offs, out_dtype=torch.float32), ref)
                row("torch._grouped_mm bf16 (bf16 result)",
                    lambda: torch._grouped_mm(x, w, offs=offs), ref)
                x = w = ref = None
                xd, xs, xq = mx_operand((rows, k), 1, gen)
                wd, ws, wq = mx_operand((E, k, n), 1, gen)
                ref = reference(xq, wq)
                mx = (xd, xs, wd, ws, off0)
                row("moe-mlir MXFP8 exact", lambda: getattr(ours, f"{name}_mxfp8")(*mx), ref)
                if ours_fp8 is not None:
                    row("moe-mlir MXFP8 fp8-mma (not exact)",
                        lambda: getattr(ours_fp8, f"{name}_mxfp8")(*mx), ref)
                try:
                    # The dequantized MX values as the peer's input, rowwise FP8.
                    qa, sa = fp8_rowwise(xq)
                    qb, sb = fp8_rowwise(wq.transpose(-2, -1).contiguous())
                    qb = qb.transpose(-2, -1)
                    row("torch._scaled_grouped_mm FP8 rowwise",
                        lambda: torch._scaled_grouped_mm(qa, qb, sa, sb, offs=offs,
                                                         out_dtype=torch.bfloat16), ref)
                    qa = qb = None
                except Exception as err:  # report, do not hide
                    print(f"# torch._scaled_grouped_mm unavailable: {str(err).splitlines()[0][:90]}")
                mx = xd = xs = wd = ws = xq = wq = ref = None
                xd, xs, xq = fp8block_operand((rows, k), (1, 128), gen)
                wd, ws, wq = fp8block_operand((E, k, n), (1, 128, 128), gen)
                ref = reference(xq, wq)
                fb = (xd, xs, wd, ws, off0)
                if ours_exact is not None:
                    row("moe-mlir blockwise FP8 exact (bf16 kernel)",
                        lambda: getattr(ours_exact, f"{name}_fp8block")(*fb), ref)
                row("moe-mlir blockwise FP8 (FP8 wgmma)",
                    lambda: getattr(ours, f"{name}_fp8block")(*fb), ref)
                fbt = (xd, xs, wd.transpose(-2, -1).contiguous(),
                       ws.transpose(-2, -1).contiguous(), off0)
                row("moe-mlir blockwise FP8, w K-major",
                    lambda: getattr(ours, f"{name}_fp8block_kmajor")(*fbt), ref)
                fb = fbt = None
                routing = "skewed" if skew else "balanced"
                for label, ms, tf, d in results:
                    print(f"{T:7d} {rows:7d} {name:5} {routing:9} {label:38} {ms:8.3f} {tf:8.1f} {d:9.1e}",
                          flush=True)
                mx = xd = xs = wd = ws = xq = wq = ref = None
                torch.cuda.empty_cache()


def positive(text, what):
    if not text.isdigit() or int(text) < 1:
        sys.exit(f"bench/gemm.py: {what} must be a positive integer, got {text!r}")
    return int(text)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "emit":
        sys.stdout.write(emit(positive(sys.argv[2], "ROWS")))
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2], [positive(t, "TOKENS") for t in sys.argv[3:]] or [2048, 8192, 16384, 65536])
    else:
        sys.exit("usage: bench/gemm.py emit ROWS | run ARTIFACT_DIR [TOKENS ...]")
