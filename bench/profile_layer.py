"""Where the time of a compiled train step goes, kernel by kernel.

    python3 bench/profile_layer.py ARTIFACT.so TOKENS [TOP]

ARTIFACT is a layer train step from `bench/run-layer.sh prepare`
(gpu-artifacts/layer/<H>x<FFN>x<EXPERTS>x<TOPK>/layer_<T>_<recipe>.sm_90a.so:
the inputs are made at the dims its directory names). PyTorch's profiler
(CUPTI) records every kernel launched in the process, ours included; the
table lists the TOP (30) kernels by total GPU time over 3 profiled steps,
then the step's wall time against the sum of its kernels' times (the rest
is launch gaps and host work; the profiler, recording the host's events
too, adds to the wall time: bench/layer.py times steps without it), and
the last step's host call against its GPU span. Kernel names are the compiled program's
(`loss_grad_kernel_N`: the N-th outlined loop nest, in program order, see
`moe-opt --moe-gpu-pipeline` on the artifact's .mlir; `moe_wgmma_*`: the
dedicated GEMM kernels).
"""
import os
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function


def kernel_table(step, label, top=30, steps=3, warmup=2):
    """Runs `step` (warmup + steps times) under the profiler and prints its
    kernels by total GPU time, then by launch position in the last step.
    Returns the GPU ms per step of each kernel name and the step's wall ms."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            with record_function("moe_step"):
                step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps
    # The last step's timeline on the profiler's clock (us): the call on the
    # host, and its GPU events from the first start to the last end.
    calls_host = sorted((ev.time_range.start, ev.time_range.end) for ev in prof.events()
                        if ev.name == "moe_step"
                        and ev.device_type == torch.autograd.DeviceType.CPU)
    totals, calls = defaultdict(float), defaultdict(int)
    launches = []  # (start, ms, name) of every kernel and copy, in time order
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.name != "moe_step":
            totals[ev.name] += ev.device_time_total / 1e3 / steps  # ms per step
            calls[ev.name] += 1
            launches.append((ev.time_range.start, ev.device_time_total / 1e3, ev.name))
    launches.sort()
    kernel_ms = sum(totals.values())
    print(f"# {label}: step {wall * 1e3:.2f} ms wall, "
          f"{kernel_ms:.2f} ms in {sum(calls.values()) // steps} kernels and copies")
    print(f"{'ms/step':>9} {'%step':>6} {'calls':>6}  kernel")
    for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{ms:9.3f} {100 * ms / (wall * 1e3):6.1f} {calls[name] // steps:6d}  {name[:110]}")
    # The generic kernels share one name: by launch position instead (the
    # i-th gpu.launch_func of the step's host code), in the last step.
    per_step = len(launches) // steps
    last = launches[-per_step:]
    print(f"{'ms':>9} {'%step':>6} {'launch':>6}  kernel (last step, by launch position)")
    for i, (_, ms, name) in sorted(enumerate(last), key=lambda x: -x[1][1])[:top]:
        print(f"{ms:9.3f} {100 * ms / (wall * 1e3):6.1f} {i:6d}  {name[:110]}")
    # Where the GPU waits in the last step: gaps between one event's end and
    # the next one's start (host work, synchronizations, launch latency).
    gaps = []
    for i in range(1, len(last)):
        end = max(s + ms * 1e3 for s, ms, _ in last[:i])  # us
        gaps.append(((last[i][0] - end) / 1e3, i))
    idle = sum(g for g, _ in gaps if g > 0)
    if calls_host:
        h0, h1 = calls_host[-1]
        g0 = last[0][0]
        g1 = max(st + ms * 1e3 for st, ms, _ in last)
        print(f"# last step: the call takes {(h1 - h0) / 1e3:.3f} ms on the host; its first GPU "
              f"event starts {(g0 - h0) / 1e3:.3f} ms into it, the GPU span is {(g1 - g0) / 1e3:.3f} ms, "
              f"the call returns {(h1 - g1) / 1e3:.3f} ms after the last event ends")
    print(f"# GPU idle between events of the last step: {idle:.3f} ms "
          f"({100 * idle / (wall * 1e3):.1f}% of the step); largest gaps:")
    for g, i in sorted(gaps, reverse=True)[:min(top, 12)]:
        print(f"{g:9.3f} ms before launch {i} ({last[i][2][:60]}), after {last[i - 1][2][:40]}")
    return totals, wall * 1e3


def main():
    import layer as bench_layer  # bench/layer.py, next to this script
    from moe_mlir import load

    path, T = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    dims = os.path.basename(os.path.dirname(os.path.abspath(path))).split("x")
    if len(dims) == 4 and all(d.isdigit() for d in dims):
        bench_layer.H, bench_layer.FF, bench_layer.E, bench_layer.K = map(int, dims)
    art = load(path)
    args = bench_layer.inputs(T, 0)
    kernel_table(lambda: art.loss_grad(*args), f"{path}, {T} tokens", top)


if __name__ == "__main__":
    main()
