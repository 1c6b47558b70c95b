"""transformers' own Qwen3MoeForCausalLM trained with torch.optim.AdamW on
the GPU: tokens/s and peak memory, for the table of scripts/gpu-train.sh.

    python3 bench/train_peer.py CONFIG.json BATCH SEQ STEPS [VARIANTS]

One line per variant: the weights' precision (f32; f32 under
torch.autocast(bfloat16), which keeps f32 masters and moments as moe-train's
recipes do; bf16) and the experts' implementation (the default loop and,
where this transformers has it, grouped_mm). VARIANTS, comma-separated,
picks some of f32, autocast, autocast-grouped, bf16, bf16-grouped (default:
all). Each: the median step time over STEPS steps after one warm-up step, on
random token batches of the given shape, torch.optim.AdamW(fused=True,
lr 3e-4, betas (0.9, 0.95), weight decay 0.1) as moe-train's defaults apart
from the schedule, gradients clipped to norm 1.
"""
import json
import statistics
import sys
import time

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

path, batch, seq, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
VARIANTS = {  # name: (weights, autocast, experts)
    "f32": (torch.float32, False, "default"),
    "autocast": (torch.float32, True, "default"),
    "autocast-grouped": (torch.float32, True, "grouped_mm"),
    "bf16": (torch.bfloat16, False, "default"),
    "bf16-grouped": (torch.bfloat16, False, "grouped_mm"),
}
chosen = sys.argv[5].split(",") if len(sys.argv) > 5 else list(VARIANTS)
for v in chosen:
    if v not in VARIANTS:
        sys.exit(f"train_peer.py: unknown variant {v!r} (known: {', '.join(VARIANTS)})")
cfg = json.load(open(path))
cfg = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "torch_dtype")}
torch.manual_seed(0)


def run(dtype, autocast, experts):
    config = Qwen3MoeConfig(**cfg)
    if experts != "default":
        config._experts_implementation = experts
    model = Qwen3MoeForCausalLM(config).to(device="cuda", dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    ids = torch.randint(3, 24, (batch, seq), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**20
    del model, opt
    torch.cuda.empty_cache()
    return t, peak, float(loss)


for v in chosen:
    dtype, autocast, experts = VARIANTS[v]
    name = f"transformers {v}"
    try:
        t, peak, loss = run(dtype, autocast, experts)
    except Exception as err:  # a variant this transformers lacks, or OOM
        print(f"{name:38s} unavailable: {str(err).splitlines()[0][:70]}")
        torch.cuda.empty_cache()
        continue
    print(f"{name:38s} {batch * seq / t:12.0f} tokens/s {t * 1e3:10.1f} ms/step "
          f"{peak:10.0f} MiB peak  (loss {loss:.3f})")
