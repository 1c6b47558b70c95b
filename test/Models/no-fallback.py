# RUN: %python %s %t moe-model moe-opt
#
# No op falls back to the generic kernels at public MoE models' layer dims:
# each is built as a Qwen3-MoE model (one decoder layer, 4096 tokens, the
# model's hidden size, expert FFN, experts, top-k, attention heads, head dim
# and vocabulary), its train step (AdamW) derived under --recipe bf16,
# fp8-blockwise and, where the dims are multiples of the MX block (32),
# mxfp8, and the GPU
# pipeline's kernel selection for sm_90a asked for its report
# (kernel-report=true). Any remark saying "generic kernels on" fails, and the
# report's count must say 0; and under mxfp8 every expert GEMM's SwiGLU and
# MX rounding must be in its epilogue (any F a multiple of 32: no remark
# "not in this GEMM's epilogue"); under fp8-blockwise (each expert's rows
# padded to 128, as moe-train pads them) every expert GEMM and weight
# gradient is on the FP8 wgmma kernels where the hidden size and expert FFN
# are multiples of 128, the GEMMs (not the weight gradients) where they are
# multiples of 64, and each one that is not says so, naming the dim. Also
# dims nobody tuned for: multiples of 32 but not of the tiles, and a
# vocabulary that is not even a multiple of 8.
import json
import os
import re
import shutil
import subprocess
import sys

from checks import check, finish

out, model_tool, opt_tool = sys.argv[1:4]
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)

# name: hidden, expert FFN, experts, top-k, heads, KV heads, head dim, vocab
MODELS = {
    "OLMoE-1B-7B": (2048, 1024, 64, 8, 16, 16, 128, 50304),
    "DeepSeek-V2-Lite": (2048, 1408, 64, 6, 16, 16, 128, 102400),
    "Mixtral-8x7B": (4096, 14336, 8, 2, 32, 8, 128, 32000),
    "Qwen3-30B-A3B": (2048, 768, 128, 8, 32, 4, 128, 151936),
    "Qwen3-235B-A22B": (4096, 1536, 128, 8, 64, 4, 128, 151936),
    "gpt-oss-20b": (2880, 2880, 32, 4, 64, 8, 64, 201088),
    "Qwen1.5-MoE-A2.7B": (2048, 1408, 60, 4, 16, 16, 128, 151936),
    # Nobody tuned for these: K and N multiples of 32 only (partial K
    # stages and column tiles), 40 experts, top-5, a vocabulary of 32003.
    "untuned-1056": (1056, 800, 40, 5, 8, 2, 128, 32003),
    "untuned-2080": (2080, 416, 24, 3, 16, 4, 64, 50257),
}

for name, (hidden, ffn, experts, top_k, heads, kv, head_dim, vocab) in MODELS.items():
    config = {"model_type": "qwen3_moe", "hidden_size": hidden,
              "moe_intermediate_size": ffn, "num_experts": experts,
              "num_experts_per_tok": top_k, "num_hidden_layers": 1,
              "num_attention_heads": heads, "num_key_value_heads": kv,
              "head_dim": head_dim, "vocab_size": vocab, "norm_topk_prob": True}
    path = os.path.join(out, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    graphs = {}
    for pad in (1, 128):
        graphs[pad] = subprocess.run(
            [model_tool, path, "--seq", "4096", "--expert-row-padding", str(pad)],
            check=True, capture_output=True, text=True).stdout
    recipes = ["bf16", "fp8-blockwise"] + (
        ["mxfp8"] if hidden % 32 == 0 and ffn % 32 == 0 else [])
    for recipe in recipes:
        step = subprocess.run(
            [opt_tool, f"--moe-train-pipeline=autodiff=true optimizer=adamw recipe={recipe}"],
            input=graphs[128 if recipe == "fp8-blockwise" else 1], check=True,
            capture_output=True, text=True).stdout
        selected = subprocess.run(
            [opt_tool, "--moe-gpu-select-kernels=chip=sm_90a kernel-report=true"],
            input=step, check=True, capture_output=True, text=True)
        report = selected.stderr
        generic = [line for line in report.splitlines() if "generic kernels on" in line]
        summary = re.search(r"kernels for sm_90a: (\d+) calls .*; (\d+) ops on the generic",
                            report)
        print(f"{name} --recipe {recipe}: {summary.group(0) if summary else 'no report'}")
        if not check(summary is not None and not generic and summary.group(2) == "0",
                     f"{name} --recipe {recipe}: no op on the generic kernels"):
            print("\n".join(generic) or report[-2000:])
        unfused = [line for line in report.splitlines()
                   if "not in this GEMM's epilogue" in line]
        if recipe == "mxfp8" and not check(
                not unfused, f"{name} --recipe mxfp8: SwiGLU in the GEMMs' epilogues"):
            print("\n".join(unfused))
        check(summary is not None and int(summary.group(1)) >= 10,
              f"{name} --recipe {recipe}: the GEMMs, attention and loss on kernels")
        if recipe == "fp8-blockwise":
            off_fp8 = [line for line in report.splitlines()
                       if "not the FP8 wgmma kernel" in line]
            calls = selected.stdout
            if hidden % 128 == 0 and ffn % 128 == 0:
                ok = (not off_fp8 and calls.count("call @moe_tma_fp8block_gmm") >= 6
                      and calls.count("call @moe_tma_fp8block_wgrad") >= 2)
                what = "every expert GEMM and weight gradient on FP8 wgmma"
            elif hidden % 64 == 0 and ffn % 64 == 0:
                # The weight gradients (gate and up as one, down) want 128.
                ok = (calls.count("call @moe_tma_fp8block_gmm") >= 6 and len(off_fp8) == 2
                      and all("are not both multiples of 128" in line for line in off_fp8))
                what = "the expert GEMMs on FP8 wgmma, each weight gradient off it says why"
            else:
                # The forward GEMMs, data gradients and weight gradients of
                # the expert MLP: 3 + 3 + 2 (the gate and up projections'
                # weight gradient is one).
                ok = len(off_fp8) == 8 and all(
                    "is not a multiple of 64" in line or
                    "are not both multiples of 128" in line for line in off_fp8)
                what = "each expert GEMM off FP8 wgmma says why (a dim not a multiple of 64)"
            if not check(ok, f"{name} --recipe fp8-blockwise: {what}"):
                print("\n".join(off_fp8) or report[-2000:])

finish()
