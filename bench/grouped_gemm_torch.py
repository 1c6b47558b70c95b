"""Peers for bench_grouped_gemm.mlir: torch._grouped_mm (bf16) and
torch._scaled_grouped_mm (FP8 rowwise scales) at the same shapes, plus the
full Qwen3-30B-A3B layer shape (16384 tokens x top-8). Median of CUDA-event
timings; prints one line per case: name, rows, ms, TFLOP/s."""
import statistics
import sys

import torch


def timed(fn, repeat=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def case(rows, hidden=2048, n=1536, experts=128):
    dev = "cuda"
    x = torch.randn(rows, hidden, device=dev, dtype=torch.bfloat16)
    w = torch.randn(experts, n, hidden, device=dev, dtype=torch.bfloat16).transpose(-2, -1)
    offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * (rows // experts)
    flops = 2.0 * rows * hidden * n
    out = []
    ms = timed(lambda: torch._grouped_mm(x, w, offs=offs))
    out.append(("torch._grouped_mm bf16", rows, ms, flops / ms / 1e9))
    try:
        xf = x.to(torch.float8_e4m3fn)
        wf = w.to(torch.float8_e4m3fn)
        sa = torch.ones(rows, device=dev, dtype=torch.float32)
        sb = torch.ones(experts, n, device=dev, dtype=torch.float32)
        ms = timed(lambda: torch._scaled_grouped_mm(xf, wf, sa, sb, offs=offs,
                                                    out_dtype=torch.bfloat16))
        out.append(("torch._scaled_grouped_mm fp8 rowwise", rows, ms, flops / ms / 1e9))
    except Exception as err:  # report, do not hide
        out.append((f"torch._scaled_grouped_mm unavailable: {err}".replace("\n", " ")[:100],
                    rows, float("nan"), float("nan")))
    return out


if __name__ == "__main__":
    rows = [int(a) for a in sys.argv[1:]] or [32768, 131072]
    for r in rows:
        for name, m, ms, tflops in case(r):
            print(f"{name:40s} rows={m:7d} {ms:9.3f} ms {tflops:8.1f} TFLOP/s")
