"""Attention forward and backward at Qwen3-30B-A3B's heads (32 query heads,
4 KV heads, head dim 128, causal), ours beside torch's
scaled_dot_product_attention with each of its backends, in one GPU run:

    python3 bench/attention.py emit SEQ > attention_SEQ.mlir    (here, no GPU)
    python3 bench/attention.py run ARTIFACT_DIR [SEQ ...]       (bench/run-attention.sh)
    python3 bench/attention.py stages ARTIFACT_DIR SEQ          (time by kernel)

Every sequence length runs 16384 tokens (batch 16384 / SEQ, at least 1), as
FlashAttention's benchmarks do. Ours: `fwd` (moe.attention of bf16 q, k, v;
the flash forward kernel) and `fwd_bwd` (moe.attention and
moe.attention_grad: the forward, delta = rowsum(dO * O), the dQ and dK/dV
kernels); the backward's time is their difference. Peers: SDPA with the
flash, memory-efficient, cuDNN and math backends (q, k, v as [B, H, S, D]
views of the same [B, S, H, D] tensors; grouped KV heads through
enable_gqa, or the KV heads repeated where a backend refuses it), forward
alone and forward + backward from the same output gradient.

Each row: GPU time per call (PyTorch's profiler over 10 calls after a
warm-up, launch gaps and host work excluded: the same measure for ours and
the peers), TFLOP/s with causal FLOPs counted as half (forward 4 B S^2 H D
/ 2, backward 2.5 times that), the peak memory the call allocates beyond
its inputs (torch's allocator; ours allocates through libmoert, whose
results are counted from their shapes), and the forward's difference
||o - ref|| / ||ref|| from SDPA's math backend in f32 on the same bf16
inputs (at the lengths where it fits). A row of ours with documents
(packed rows of 512-token documents, moe.attention's `documents`): its
TFLOP/s count the masked problem's FLOPs (each document's causal square).
"""
import sys

from gemm import gpu_ms  # bench/gemm.py: GPU time per call by the profiler

HEADS, KV_HEADS, DIM, TOKENS = 32, 4, 128, 16384
DOC = 512  # tokens a document, for the packed-row rows


def batch_of(seq):
    return max(1, TOKENS // seq)


def emit(seq):
    b = batch_of(seq)
    q = f"tensor<{b}x{seq}x{HEADS}x{DIM}xbf16>"
    kv = f"tensor<{b}x{seq}x{KV_HEADS}x{DIM}xbf16>"
    qo = f"tensor<{b}x{seq}x{HEADS}x{DIM}xf32>"
    ko = f"tensor<{b}x{seq}x{KV_HEADS}x{DIM}xf32>"
    d = f"tensor<{b}x{seq}xi32>"
    return f"""// Attention at sequence {seq}, batch {b} (bench/attention.py emit {seq}).
func.func @fwd(%q: {q}, %k: {kv}, %v: {kv}) -> {qo} {{
  %o = moe.attention %q, %k, %v causal : {q}, {kv}, {kv} -> {qo}
  return %o : {qo}
}}

func.func @fwd_bwd(%q: {q}, %k: {kv}, %v: {kv}, %do: {q}) -> ({qo}, {qo}, {ko}, {ko}) {{
  %o = moe.attention %q, %k, %v causal : {q}, {kv}, {kv} -> {qo}
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal
      : {q}, {kv}, {kv}, {q} -> {qo}, {ko}, {ko}
  return %o, %dq, %dk, %dv : {qo}, {qo}, {ko}, {ko}
}}

func.func @fwd_docs(%q: {q}, %k: {kv}, %v: {kv}, %d: {d}) -> {qo} {{
  %o = moe.attention %q, %k, %v causal documents(%d : {d}) : {q}, {kv}, {kv} -> {qo}
  return %o : {qo}
}}

func.func @fwd_bwd_docs(%q: {q}, %k: {kv}, %v: {kv}, %do: {q}, %d: {d})
    -> ({qo}, {qo}, {ko}, {ko}) {{
  %o = moe.attention %q, %k, %v causal documents(%d : {d}) : {q}, {kv}, {kv} -> {qo}
  %dq, %dk, %dv = moe.attention_grad %q, %k, %v, %do causal documents(%d : {d})
      : {q}, {kv}, {kv}, {q} -> {qo}, {ko}, {ko}
  return %o, %dq, %dk, %dv : {qo}, {qo}, {ko}, {ko}
}}
"""


def peak_mb(fn):
    """Peak memory torch's allocator holds during `fn` beyond what it held."""
    import torch
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def rel(y, ref):
    return float((y.float() - ref.float()).norm() / ref.float().norm())


def run(art_dir, seqs):
    import os

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from moe_mlir import load
    print(f"# Attention, {HEADS} query heads, {KV_HEADS} KV heads, head dim {DIM}, causal, "
          f"{TOKENS} tokens a call")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; GPU time per call "
          f"(profiler); TFLOP/s with causal FLOPs halved; peak MiB beyond the inputs")
    print(f"{'seq':>6} {'batch':>5} {'':28} {'fwd ms':>8} {'TFLOP/s':>8} {'bwd ms':>8} "
          f"{'TFLOP/s':>8} {'MiB':>7} {'fwd diff':>9}")
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]
    for seq in seqs:
        b = batch_of(seq)
        path = os.path.join(art_dir, f"attention_{seq}.sm_90a.so")
        fwd_flops = 4.0 * b * seq * seq * HEADS * DIM / 2
        bwd_flops = 2.5 * fwd_flops
        gen = torch.Generator(device="cuda").manual_seed(seq)
        q = torch.randn(b, seq, HEADS, DIM, device="cuda", generator=gen).to(torch.bfloat16)
        k = torch.randn(b, seq, KV_HEADS, DIM, device="cuda", generator=gen).to(torch.bfloat16)
        v = torch.randn(b, seq, KV_HEADS, DIM, device="cuda", generator=gen).to(torch.bfloat16)
        do = torch.randn(b, seq, HEADS, DIM, device="cuda", generator=gen).to(torch.bfloat16)
        ref = None
        if b * HEADS * seq * seq * 4 <= 8 * 2**30:
            with sdpa_kernel(SDPBackend.MATH):
                ref = F.scaled_dot_product_attention(
                    q.float().transpose(1, 2), k.float().transpose(1, 2),
                    v.float().transpose(1, 2), is_causal=True, enable_gqa=True).transpose(1, 2)
        rows = []
        if os.path.exists(path):
            ours = load(path)
            try:
                f_ms = gpu_ms(lambda: ours.fwd(q, k, v))
                fb_ms = gpu_ms(lambda: ours.fwd_bwd(q, k, v, do))
                o = ours.fwd(q, k, v)
                # Results and the logsumexp, delta (f32) allocated by libmoert.
                mib = (4 * (2 * q.numel() + 2 * k.numel()) + 2 * 4 * b * HEADS * seq) / 2**20
                rows.append(("moe-mlir flash (f32 out)", f_ms, fb_ms - f_ms, mib,
                             rel(o, ref) if ref is not None else float("nan")))
                del o
                # Packed rows of DOC-token documents: FLOPs counted are the
                # masked problem's (each document's causal square).
                if seq > DOC:
                    docs = (torch.arange(seq, device="cuda", dtype=torch.int32) // DOC).expand(b, seq).contiguous()
                    f_ms = gpu_ms(lambda: ours.fwd_docs(q, k, v, docs))
                    fb_ms = gpu_ms(lambda: ours.fwd_bwd_docs(q, k, v, do, docs))
                    rows.append((f"moe-mlir flash, documents {DOC}", f_ms, fb_ms - f_ms, mib,
                                 float("nan"), DOC / seq))
            except Exception as err:  # report, do not hide
                print(f"# moe-mlir failed at {seq}: {str(err).splitlines()[0][:100]}")
        else:
            print(f"# {path} missing: bench/run-attention.sh prepare {seq}")
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        for name, backend in backends:
            if name == "math" and b * HEADS * seq * seq * 2 * 3 > 40 * 2**30:
                continue

            def call(kk=kt, vv=vt, backend=backend, grad=False, gqa=True):
                with sdpa_kernel(backend):
                    if grad:
                        qq = qt.detach().requires_grad_()
                        k2 = kk.detach().requires_grad_()
                        v2 = vv.detach().requires_grad_()
                        o = F.scaled_dot_product_attention(qq, k2, v2, is_causal=True, enable_gqa=gqa)
                        o.backward(do.transpose(1, 2))
                        return o
                    return F.scaled_dot_product_attention(qt, kk, vv, is_causal=True, enable_gqa=gqa)
            label = f"torch SDPA {name}"
            try:
                try:
                    call()
                    fn, fng = call, (lambda: call(grad=True))
                except RuntimeError:
                    # No GQA in this backend: the KV heads repeated.
                    ke = kt.repeat_interleave(HEADS // KV_HEADS, dim=1)
                    ve = vt.repeat_interleave(HEADS // KV_HEADS, dim=1)
                    fn = lambda: call(ke, ve, gqa=False)  # noqa: E731
                    fng = lambda: call(ke, ve, grad=True, gqa=False)  # noqa: E731
                    label += " (KV repeated)"
                f_ms = gpu_ms(fn)
                fb_ms = gpu_ms(fng)
                mib = peak_mb(fng)
                o = fn().transpose(1, 2)
                rows.append((label, f_ms, fb_ms - f_ms, mib,
                             rel(o, ref) if ref is not None else float("nan")))
                del o
            except Exception as err:  # report, do not hide
                print(f"# {label} unavailable at {seq}: {str(err).splitlines()[0][:90]}")
            torch.cuda.empty_cache()
        for label, f_ms, b_ms, mib, d, *share in rows:
            part = share[0] if share else 1.0  # of the causal row's FLOPs
            print(f"{seq:6d} {b:5d} {label:28} {f_ms:8.3f} {part * fwd_flops / f_ms / 1e9:8.1f} "
                  f"{b_ms:8.3f} {part * bwd_flops / b_ms / 1e9:8.1f} {mib:7.0f} {d:9.1e}",
                  flush=True)
        q = k = v = do = ref = None
        torch.cuda.empty_cache()


def stages(art_dir, seq):
    """Our forward + backward at `seq`, GPU time by kernel (the stages: the
    forward, delta, dQ, dK/dV), each with the TFLOP/s of the FLOPs it does."""
    import os

    import torch
    from torch.profiler import ProfilerActivity, profile
    from moe_mlir import load
    b = batch_of(seq)
    ours = load(os.path.join(art_dir, f"attention_{seq}.sm_90a.so"))
    q = torch.randn(b, seq, HEADS, DIM, device="cuda").to(torch.bfloat16)
    k = torch.randn(b, seq, KV_HEADS, DIM, device="cuda").to(torch.bfloat16)
    v = torch.randn(b, seq, KV_HEADS, DIM, device="cuda").to(torch.bfloat16)
    do = torch.randn(b, seq, HEADS, DIM, device="cuda").to(torch.bfloat16)
    for _ in range(2):
        ours.fwd_bwd(q, k, v, do)
    torch.cuda.synchronize()
    calls = 10
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            ours.fwd_bwd(q, k, v, do)
        torch.cuda.synchronize()
    fwd = 4.0 * b * seq * seq * HEADS * DIM / 2  # causal: half
    # Matmul FLOPs each kernel does: forward 2 products (S, PV); dQ 3 (S, dP,
    # dQ); dK/dV 4 (S, dP, dV, dK).
    flops = {"moe_flash_fwd": fwd, "moe_flash_dq": 1.5 * fwd, "moe_flash_dkv": 2 * fwd}
    print(f"# stages of forward + backward at sequence {seq}, batch {b}: GPU ms per call")
    for ev in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
        if ev.device_time_total <= 0:
            continue
        ms = ev.device_time_total / 1e3 / calls
        f = next((v for name, v in flops.items() if ev.key.startswith(name)), None)
        tf = f"{f / ms / 1e9:8.1f} TFLOP/s" if f else ""
        print(f"{ms:9.3f} ms  {tf:17} {ev.key[:70]}")


def positive(text, what):
    if not text.isdigit() or int(text) < 1:
        sys.exit(f"bench/attention.py: {what} must be a positive integer, got {text!r}")
    return int(text)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "emit":
        sys.stdout.write(emit(positive(sys.argv[2], "SEQ")))
    elif len(sys.argv) == 4 and sys.argv[1] == "stages":
        stages(sys.argv[2], positive(sys.argv[3], "SEQ"))
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2], [positive(t, "SEQ") for t in sys.argv[3:]] or [1024, 2048, 4096, 8192, 16384])
    else:
        sys.exit("usage: bench/attention.py emit SEQ | run ARTIFACT_DIR [SEQ ...] | "
                 "stages ARTIFACT_DIR SEQ")
