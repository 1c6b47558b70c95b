#!/usr/bin/env bash
# Trains the small protein MoE language model of examples/protein-moe on
# the protein families Debian's hmmer-examples ships (Pfam alignments and
# sequence sets: protein kinases, fibronectin type III, globins, SMC, RRM,
# Patched, LuxC, ...; about 140k residues), on the CPU: 500 steps of
# 16 x 128 tokens, about three minutes on two cores. Prints the held-out
# loss against the unigram baseline as it goes; writes the checkpoint,
# metrics.jsonl and loss.png to protein-run/ (or the directory given); run
# again, it continues the checkpoint (--resume). Extra arguments go to moe-train (see moe-train --help),
# e.g. --target sm_90a on a machine with a GPU and MLIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/protein-run}
shift || true
"$root/scripts/build.sh"
ex=/usr/share/doc/hmmer/examples
data=()
for f in tutorial/Pkinase.sto tutorial/fn3.sto tutorial/globins45.fa \
         testsuite/SMC_N.sto.gz testsuite/RRM_1.sto.gz testsuite/Patched.sto.gz \
         testsuite/LuxC.sto.gz testsuite/Caudal_act.sto.gz \
         easel/demotic/examples/example.sto.gz easel/demotic/examples/example-single.fa.gz; do
  data+=(--data "$ex/$f")
done
[ -f "$out/checkpoint.safetensors" ] && resume=(--resume) || resume=()
"$root/build/bin/moe-train" --config "$root/examples/protein-moe/config.json" \
  "${data[@]}" --steps 500 --batch 16 --seq 128 --eval-every 50 --out "$out" "${resume[@]}" "$@"
