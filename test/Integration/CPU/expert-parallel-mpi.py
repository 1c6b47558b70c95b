# REQUIRES: mpi
# RUN: %python %s %t | FileCheck %s
#
# Expert parallelism across processes: each layer is compiled twice with
# moe-compile --target=cpu, as written (one rank holds every expert) and
# after -moe-expert-parallel=ep-size=N, whose moe.all_to_all ops
# -convert-moe-to-runtime turns into libmoert calls (MPI). moert-ep-check
# then runs both under `mpirun -np N`: every rank draws the same inputs, takes
# its slice of the tokens and its shard of the stacked expert weights
# (rows [r*E/N, (r+1)*E/N)), and compares the expert-parallel result with the
# single-rank program's on the same tokens. Backward too: a sharded loss
# differentiated by -moe-autodiff against the single-rank train step.
#
# The comparison is exact (an exact zero may differ in sign): a token's rows
# meet the same expert weights in both programs, every output element of a
# grouped GEMM accumulates over K in the same order whichever rows share its
# group, MX blocks run along K inside a row or an expert, and moe.combine
# sums each token's top_k terms in slot order in both. Only the sum over
# tokens of a parameter's gradient differs in order; the data-parallel
# gradient here is summed by the program's shard.all_reduce
# (MPI_Iallreduce) and by the checker with the same call on the same
# per-rank values, so it is exact too.
import os
import re
import subprocess
import sys

from moe_mlir.layers import as_loss

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
MPIRUN = os.environ["MOE_MPIRUN"].split()  # from lit.cfg.py


def layer(name, T, H, E, F, K, pad, capacity=None, mx=False, fused=False,
          router_weight=False, router_grad=True):
    """A MoE layer (router, dispatch, SwiGLU experts, combine) as MLIR. With
    router_weight, the logits come from a router weight matrix and the
    function also returns a data-parallel gradient of it."""
    copies = T * K
    if capacity:
        c = -(-int(capacity * copies * 1000) // (E * 1000))
        rows = min((copies + E * (pad - 1)) // pad * pad, E * ((c + pad - 1) // pad * pad))
    else:
        rows = (copies + E * (pad - 1)) // pad * pad
    rows = (rows + 31) // 32 * 32
    cap = f" capacity_factor({capacity})" if capacity else ""
    if mx:
        w1t = f"!moe.mx<{E}x{H}x{2*F}xf8E4M3FN, axis = 1>"
        w2t = f"!moe.mx<{E}x{F}x{H}xf8E4M3FN, axis = 1>"
        quant = (f"  %q1 = moe.quantize %w1 : tensor<{E}x{H}x{2*F}xf32> -> {w1t}\n"
                 f"  %q2 = moe.quantize %w2 : tensor<{E}x{F}x{H}xf32> -> {w2t}\n")
        a1, a2 = "%q1", "%q2"
    else:
        w1t, w2t = f"tensor<{E}x{H}x{2*F}xf32>", f"tensor<{E}x{F}x{H}xf32>"
        quant, a1, a2 = "", "%w1", "%w2"
    if fused:
        experts = (f"  %y = moe.grouped_mlp %s, {a1}, {a2}, %o : tensor<{rows}x{H}xf32>, {w1t}, "
                   f"{w2t}, tensor<{E+1}xi32> -> tensor<{rows}x{H}xf32>\n")
    else:
        experts = (f"  %h = moe.grouped_matmul %s, {a1}, %o : tensor<{rows}x{H}xf32>, {w1t}, "
                   f"tensor<{E+1}xi32> -> tensor<{rows}x{2*F}xf32>\n"
                   f"  %a = moe.swiglu %h : tensor<{rows}x{2*F}xf32> -> tensor<{rows}x{F}xf32>\n"
                   f"  %y = moe.grouped_matmul %a, {a2}, %o : tensor<{rows}x{F}xf32>, {w2t}, "
                   f"tensor<{E+1}xi32> -> tensor<{rows}x{H}xf32>\n")
    if router_weight:
        args = f"%x: tensor<{T}x{H}xf32>, %wr: tensor<{H}x{E}xf32>"
        results = f"(tensor<{T}x{H}xf32>, tensor<{H}x{E}xf32> {{moe.gradient_of = 1 : i64}})"
        logits = f"""  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<{T}x{E}xf32>
  %z0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<{T}x{E}xf32>) -> tensor<{T}x{E}xf32>
  %logits = linalg.matmul ins(%x, %wr : tensor<{T}x{H}xf32>, tensor<{H}x{E}xf32>) outs(%z0 : tensor<{T}x{E}xf32>) -> tensor<{T}x{E}xf32>
"""
        grad = f"""  %et = tensor.empty() : tensor<{H}x{T}xf32>
  %xt = linalg.transpose ins(%x : tensor<{T}x{H}xf32>) outs(%et : tensor<{H}x{T}xf32>) permutation = [1, 0]
  %eg = tensor.empty() : tensor<{H}x{E}xf32>
  %zg = linalg.fill ins(%zero : f32) outs(%eg : tensor<{H}x{E}xf32>) -> tensor<{H}x{E}xf32>
  %g = linalg.matmul ins(%xt, %logits : tensor<{H}x{T}xf32>, tensor<{T}x{E}xf32>) outs(%zg : tensor<{H}x{E}xf32>) -> tensor<{H}x{E}xf32>
"""
        ret = f"  return %out, %g : tensor<{T}x{H}xf32>, tensor<{H}x{E}xf32>"
        if not router_grad:
            results, grad = f"tensor<{T}x{H}xf32>", ""
            ret = f"  return %out : tensor<{T}x{H}xf32>"
    else:
        args = f"%x: tensor<{T}x{H}xf32>, %logits: tensor<{T}x{E}xf32>"
        results = f"tensor<{T}x{H}xf32>"
        logits = grad = ""
        ret = f"  return %out : tensor<{T}x{H}xf32>"
    return f"""
func.func @{name}({args},
    %w1: tensor<{E}x{H}x{2*F}xf32>, %w2: tensor<{E}x{F}x{H}xf32>) -> {results} {{
{logits}  %idx, %w = moe.router %logits top_k({K}) softmax norm_topk_prob
      : tensor<{T}x{E}xf32> -> tensor<{T}x{K}xi32>, tensor<{T}x{K}xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts({E}){cap} pad_to({pad})
      : tensor<{T}x{H}xf32>, tensor<{T}x{K}xi32> -> tensor<{rows}x{H}xf32>, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>
{quant}{experts}  %out = moe.combine %y, %w, %p : tensor<{rows}x{H}xf32>, tensor<{T}x{K}xf32>, tensor<{T}x{K}xi32> -> tensor<{T}x{H}xf32>
{grad}{ret}
}}
"""


def run(cmd, stdin=None):
    return subprocess.run(cmd, input=stdin, text=True, capture_output=True, timeout=600)


def compile_so(source, path, passes=None):
    if passes:
        opt = run(["moe-opt", *passes], source)
        if opt.returncode:
            sys.exit(f"moe-opt {passes} failed:\n{opt.stderr}")
        source = opt.stdout
    mlir = path + ".mlir"
    with open(mlir, "w") as f:
        f.write(source)
    out = run(["moe-compile", mlir, "-o", path])
    if out.returncode:
        sys.exit(f"moe-compile {mlir} failed:\n{out.stderr}")
    return source


def check(label, single, sharded, ranks, extra=()):
    out = run(MPIRUN + ["-np", str(ranks), "moert-ep-check", single, sharded, "--seed", "7", *extra])
    lines = out.stdout.splitlines()
    oks = sorted(l for l in lines if l.endswith(": ok") and l.startswith("rank "))
    summary = [l for l in lines if l.startswith("expert-parallel check")]
    good = out.returncode == 0 and len(oks) == ranks and summary
    print(f"{label} ep={ranks}: {'ok' if good else 'FAILED'} ({len(oks)} ranks ok)")
    if not good:
        print(out.stdout + out.stderr)


def case(label, source, sizes=(2, 4), single_passes=None, ep_passes=None, extra=(),
         exchanges=()):
    single = os.path.join(out_dir, f"{label}.single.so")
    compile_so(source, single, single_passes)
    for n in sizes:
        sharded = os.path.join(out_dir, f"{label}.ep{n}.so")
        text = compile_so(source, sharded,
                          ep_passes(n) if ep_passes else [f"--moe-expert-parallel=ep-size={n}"])
        lowered = run(["moe-opt", "--convert-moe-to-runtime"], text).stdout
        if not re.search(r"moert_all_to_all_(slots_)?start_", lowered) or \
                "moert_all_to_all_wait" not in lowered:
            print(f"{label} ep={n}: FAILED (no runtime all_to_all start/wait)")
            continue
        missing = [x for x in exchanges
                   if not re.search(rf"call @moert_all_to_all_(slots_)?start_{x}\(", lowered)]
        if missing:
            print(f"{label} ep={n}: FAILED (no {', '.join(missing)} exchange)")
            continue
        check(label, single, sharded, n, extra)


# CHECK: f32-experts ep=2: ok (2 ranks ok)
# CHECK: f32-experts ep=4: ok (4 ranks ok)
case("f32-experts", layer("layer", T=24, H=32, E=8, F=32, K=2, pad=1))
# CHECK: fused-padded ep=2: ok (2 ranks ok)
# CHECK: fused-padded ep=4: ok (4 ranks ok)
case("fused-padded", layer("layer", T=40, H=32, E=4, F=32, K=2, pad=8, fused=True))
# CHECK: capacity ep=2: ok (2 ranks ok)
# CHECK: capacity ep=4: ok (4 ranks ok)
case("capacity", layer("layer", T=48, H=32, E=8, F=32, K=3, pad=4, capacity=0.75))
# CHECK: mxfp8-fused ep=2: ok (2 ranks ok)
# CHECK: mxfp8-fused ep=4: ok (4 ranks ok)
case("mxfp8-fused", layer("layer", T=32, H=64, E=4, F=32, K=2, pad=32, mx=True, fused=True))
# Three ranks, six experts.
# CHECK: three-ranks ep=3: ok (3 ranks ok)
case("three-ranks", layer("layer", T=20, H=32, E=6, F=32, K=2, pad=1), sizes=(3,))

# A data-parallel gradient (of a replicated router weight) summed over the
# ranks by shard.all_reduce -> moert_all_reduce_sum_f32.
# CHECK: router-gradient ep=2: ok (2 ranks ok)
# CHECK: router-gradient ep=4: ok (4 ranks ok)
case("router-gradient", layer("train", T=16, H=32, E=8, F=32, K=2, pad=1, router_weight=True),
     extra=("--replicate", "1"))

# Backward across ranks: a loss (the layer's output against a fixed
# gradient, sum(y * dy)) sharded, differentiated by -moe-autodiff (the
# gradient of each moe.all_to_all is the reverse exchange) and sharded again
# (the router weight's data-parallel gradient summed), against the same loss
# differentiated on one rank: the loss, d x, d router_w and each rank's
# expert weight gradients.
def loss(T, H, E, F, K, fused):
    return as_loss(layer("loss", T=T, H=H, E=E, F=F, K=K, pad=1, fused=fused,
                         router_weight=True, router_grad=False), "loss", T, H)


for label, fused in (("backward", False), ("backward-fused", True)):
    # CHECK: backward ep=2: ok (2 ranks ok)
    # CHECK: backward ep=4: ok (4 ranks ok)
    # CHECK: backward-fused ep=2: ok (2 ranks ok)
    # CHECK: backward-fused ep=4: ok (4 ranks ok)
    case(label, loss(T=16, H=32, E=8, F=32, K=2, fused=fused), extra=("--replicate", "1"),
         single_passes=["--moe-autodiff"],
         ep_passes=lambda n: [f"--moe-expert-parallel=ep-size={n}", "--moe-autodiff",
                              f"--moe-expert-parallel=ep-size={n}"])

# Overlap: the tokens split into chunks whose exchanges run (started, then
# waited for) while other chunks' experts compute. Same results: each
# token's rows meet the same weights whichever chunk carries them.
# CHECK: chunked ep=2: ok (2 ranks ok)
# CHECK: chunked ep=4: ok (4 ranks ok)
case("chunked", layer("layer", T=24, H=32, E=8, F=32, K=2, pad=1),
     ep_passes=lambda n: [f"--moe-expert-parallel=ep-size={n} chunks=3"])
# CHECK: chunked-mxfp8-fused ep=2: ok (2 ranks ok)
# CHECK: chunked-mxfp8-fused ep=4: ok (4 ranks ok)
case("chunked-mxfp8-fused", layer("layer", T=32, H=64, E=4, F=32, K=2, pad=32, mx=True, fused=True),
     ep_passes=lambda n: [f"--moe-expert-parallel=ep-size={n} chunks=4"])
# The same chunked exchanges with MOERT_COMM_OVERLAP=0 (each start completes
# its exchange): the switch for measuring what the overlap gains.
# CHECK: chunked-blocking ep=2: ok (2 ranks ok)
os.environ["MOERT_COMM_OVERLAP"] = "0"
case("chunked-blocking", layer("layer", T=24, H=32, E=8, F=32, K=2, pad=1), sizes=(2,),
     ep_passes=lambda n: [f"--moe-expert-parallel=ep-size={n} chunks=2"])
del os.environ["MOERT_COMM_OVERLAP"]
# Backward of a chunked layer: the chunks' reverse exchanges overlap too.
# CHECK: backward-chunked ep=2: ok (2 ranks ok)
# CHECK: backward-chunked ep=4: ok (4 ranks ok)
case("backward-chunked", loss(T=16, H=32, E=8, F=32, K=2, fused=False), extra=("--replicate", "1"),
     single_passes=["--moe-autodiff"],
     ep_passes=lambda n: [f"--moe-expert-parallel=ep-size={n} chunks=2", "--moe-autodiff",
                          f"--moe-expert-parallel=ep-size={n}"])

# The whole training pipeline (group the moe.experts region, MXFP8, fuse,
# shard) against the same pipeline without sharding.
# CHECK: train-pipeline ep=2: ok (2 ranks ok)
# CHECK: train-pipeline ep=4: ok (4 ranks ok)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "../../Pipelines/train-pipeline.mlir")) as f:
    train = "\n".join(l for l in f.read().splitlines() if not l.startswith("//"))
case("train-pipeline", train,
     single_passes=["--moe-train-pipeline=ep-size=1 recipe=mxfp8"],
     ep_passes=lambda n: [f"--moe-train-pipeline=ep-size={n} recipe=mxfp8"])
# CHECK: train-pipeline-chunked ep=2: ok (2 ranks ok)
case("train-pipeline-chunked", train, sizes=(2,),
     single_passes=["--moe-train-pipeline=ep-size=1 recipe=mxfp8"],
     ep_passes=lambda n: [f"--moe-train-pipeline=ep-size={n} ep-chunks=2 recipe=mxfp8"])

# CHECK: train-pipeline-fp8-blockwise ep=2: ok (2 ranks ok)
case("train-pipeline-fp8-blockwise", train, sizes=(2,),
     single_passes=["--moe-train-pipeline=ep-size=1 recipe=fp8-blockwise"],
     ep_passes=lambda n: [f"--moe-train-pipeline=ep-size={n} recipe=fp8-blockwise"])

# Tokens quantized before they travel (-moe-hoist-quantize in the train
# pipeline): MX rows are exchanged, E4M3 data and E8M0 scales as bytes,
# against one rank quantizing the dispatched rows (no hoisting): the same
# bits.
mx_single = ["--moe-group-experts", "--moe-quantize", "--moe-fuse-grouped-mlp"]
# CHECK: mxfp8-exchange ep=2: ok (2 ranks ok)
# CHECK: mxfp8-exchange ep=4: ok (4 ranks ok)
case("mxfp8-exchange", layer("layer", T=32, H=64, E=4, F=32, K=2, pad=32),
     single_passes=mx_single, exchanges=("f8e4m3fn", "f8e8m0fnu"),
     ep_passes=lambda n: [f"--moe-train-pipeline=ep-size={n} recipe=mxfp8"])
# CHECK: mxfp8-exchange-chunked ep=2: ok (2 ranks ok)
case("mxfp8-exchange-chunked", layer("layer", T=48, H=64, E=8, F=32, K=3, pad=32), sizes=(2,),
     single_passes=mx_single, exchanges=("f8e4m3fn", "f8e8m0fnu"),
     ep_passes=lambda n: [f"--moe-train-pipeline=ep-size={n} ep-chunks=3 recipe=mxfp8"])

# The checker notices a wrong result: the "sharded" program routes with
# sigmoid scores instead of softmax.
# CHECK: wrong-layer ep=2: mismatch found (exit 1)
# CHECK-SAME: rank 0: MISMATCH @layer result #0
src = layer("layer", T=24, H=32, E=8, F=32, K=2, pad=1)
single = os.path.join(out_dir, "wrong.single.so")
sharded = os.path.join(out_dir, "wrong.ep2.so")
compile_so(src, single)
compile_so(src.replace("softmax norm_topk_prob", "sigmoid norm_topk_prob"), sharded,
           ["--moe-expert-parallel=ep-size=2"])
out = run(MPIRUN + ["-np", "2", "moert-ep-check", single, sharded])
first = next((l for l in out.stdout.splitlines() if l.startswith("rank 0: MISMATCH")), "")
print(f"wrong-layer ep=2: mismatch found (exit {out.returncode}) {first}")
