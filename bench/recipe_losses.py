"""Loss curves of the precision recipes side by side: the protein model
(examples/protein-moe) trained by moe-train under each recipe on the same
data, seed and steps, and a table of where each ends against bf16.

    python3 bench/recipe_losses.py [--target cpu|sm_90a] [--steps N]
        [--recipes "none bf16 mxfp8 fp8-blockwise"] [--seeds "0 1 2"]
        [--out DIR]

Needs moe-train on PATH (a build with MLIR); with --target sm_90a, a GPU.
Each line: the mean training loss of the last 20 steps, the held-out loss at
the middle and at the end (evaluated every steps/10), and the relative
difference of each from bf16's. The protein model's 176 training rows are
seen many times in 500 steps, so the held-out loss rises after its minimum
(overfitting): the training loss says how well a recipe fits, the held-out
minimum how well it generalizes. With several seeds (initialization and data
order), one table per seed and one of the means: the spread between seeds
of one recipe is the noise a recipe's difference is to be read against.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUTORIAL = "/usr/share/doc/hmmer/examples/tutorial"
DATA = ["Pkinase.sto", "fn3.sto", "globins45.fa"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="cpu")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--recipes", default="none bf16 mxfp8 fp8-blockwise")
    p.add_argument("--seeds", default="0")
    p.add_argument("--out", default="/tmp/moe-recipe-losses")
    a = p.parse_args()
    if a.steps < 20:
        sys.exit("recipe_losses: --steps must be at least 20")
    recipes = a.recipes.split()
    if "bf16" not in recipes:
        sys.exit("recipe_losses: --recipes must include bf16 (the reference)")
    try:
        seeds = [int(s) for s in a.seeds.split()]
    except ValueError:
        sys.exit(f"recipe_losses: --seeds must be integers, got '{a.seeds}'")
    if not seeds:
        sys.exit("recipe_losses: --seeds is empty")
    every = a.steps // 10
    data = [arg for f in DATA for arg in ("--data", os.path.join(TUTORIAL, f))]
    by_seed = {}
    for seed in seeds:
        rows = {}
        for r in recipes:
            out = os.path.join(a.out, f"{r}-seed{seed}")
            cmd = ["moe-train", "--config",
                   os.path.join(ROOT, "examples/protein-moe/config.json"),
                   *data, "--target", a.target, "--recipe", r, "--steps", str(a.steps),
                   "--seed", str(seed), "--eval-every", str(every),
                   "--checkpoint-every", str(a.steps), "--progress", "none", "--out", out]
            subprocess.run(["rm", "-rf", out], check=True)
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"recipe_losses: {r} (seed {seed}) failed:\n{done.stderr[-2000:]}")
            with open(os.path.join(out, "metrics.jsonl")) as f:
                lines = [json.loads(line) for line in f]
            train = [m["loss"] for m in lines if "loss" in m]
            held = {m["step"]: m["held_out_loss"] for m in lines if "held_out_loss" in m}
            middle = min(held, key=lambda s: abs(s - a.steps // 2))
            rows[r] = (statistics.mean(train[-20:]), held[middle], held[a.steps],
                       min(held.values()))
        by_seed[seed] = rows
        table(f"# Protein model, {a.steps} steps on {a.target}, seed {seed}, the same "
              "data for every recipe", rows)
    if len(seeds) > 1:
        means = {r: tuple(statistics.mean(by_seed[s][r][i] for s in seeds) for i in range(4))
                 for r in recipes}
        table(f"# Means over seeds {' '.join(map(str, seeds))}", means)
        print("\n# Training loss (last 20) by seed, and its spread (max - min) / mean")
        for r in recipes:
            v = [by_seed[s][r][0] for s in seeds]
            print(f"{r:14} " + " ".join(f"{x:8.4f}" for x in v)
                  + f"   spread {(max(v) - min(v)) / statistics.mean(v) * 100:.2f}%")


def table(title, rows):
    ref = rows["bf16"]
    print(title)
    print(f"{'recipe':14} {'train (last 20)':>16} {'held-out mid':>13} {'held-out end':>13} "
          f"{'held-out min':>13}   vs bf16: train, held-out min")
    for r, v in rows.items():
        rel = [f"{(x / y - 1) * 100:+.2f}%" for x, y in ((v[0], ref[0]), (v[3], ref[3]))]
        print(f"{r:14} {v[0]:16.4f} {v[1]:13.4f} {v[2]:13.4f} {v[3]:13.4f}   {rel[0]:>8} {rel[1]:>8}")
    print()


if __name__ == "__main__":
    main()
