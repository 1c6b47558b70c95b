"""Seeds the fuzzers' corpora from the test tree (scripts/fuzz.sh).

    python scripts/fuzz-seeds.py ROOT CORPUS

CORPUS/ir: every `// -----` chunk of the repository's .mlir files, each
behind a byte that picks moe-ir-fuzzer's pass pipeline. CORPUS/readers: the
model configs (byte 0), a small checkpoint (byte 1), protein (byte 2) and DNA
(byte 3) sequence files. Files are named by their content's hash, so seeding
again adds nothing twice; the regression inputs of test/Fuzz/Inputs are
seeds too.
"""
import glob
import hashlib
import json
import os
import shutil
import struct
import sys

root, corpus = sys.argv[1], sys.argv[2]
MAX = 65536  # scripts/fuzz.sh's -max_len


def put(kind, data):
    if len(data) > MAX:
        return 0
    path = os.path.join(corpus, kind, "seed-" + hashlib.sha1(data).hexdigest())
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(data)
    return 1


count = {"ir": 0, "readers": 0}
files = sorted(glob.glob(os.path.join(root, "test", "**", "*.mlir"), recursive=True) +
               glob.glob(os.path.join(root, "examples", "*.mlir")))
i = 0
for path in files:
    with open(path, "rb") as f:
        text = f.read()
    for chunk in text.split(b"\n// -----\n"):
        # Two pipelines a chunk: parse-only (0) and one in turn.
        for selector in (0, 1 + i % 37):
            count["ir"] += put("ir", bytes([selector]) + chunk)
        i += 1

for path in sorted(glob.glob(os.path.join(root, "test", "Models", "Inputs", "*.json")) +
                   glob.glob(os.path.join(root, "examples", "*", "config.json"))):
    with open(path, "rb") as f:
        count["readers"] += put("readers", b"\x00" + f.read())


def safetensors(tensors, metadata):
    header, data = {"__metadata__": metadata}, b""
    for name, shape, values in tensors:
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


count["readers"] += put("readers", b"\x01" + safetensors(
    [("model.embed_tokens.weight", [2, 3], [0.5, -1, 2, 0, 1e-3, 7]),
     ("model.norm.weight", [3], [1, 1, 1])], {"step": "3", "recipe": "bf16"}))
# Model directories' files (the fuzzer's parameters: w, norm and the
# experts of l, fused or one tensor per expert).
count["readers"] += put("readers", b"\x01" + safetensors(
    [("w", [2, 3], [1, 2, 3, 4, 5, 6]), ("norm", [4], [1, 1, 1, 1]),
     ("l.mlp.experts.gate_up_proj", [2, 6, 4], [0.25] * 48),
     ("l.mlp.experts.down_proj", [2, 4, 3], [0.5] * 24)], {"format": "pt"}))
count["readers"] += put("readers", b"\x01" + safetensors(
    [("w", [2, 3], [1, 2, 3, 4, 5, 6]), ("norm", [4], [1, 1, 1, 1])]
    + [(f"l.mlp.experts.{e}.{p}.weight", [3, 4] if p != "down_proj" else [4, 3], [0.5] * 12)
       for e in range(2) for p in ("gate_proj", "up_proj", "down_proj")], {"format": "pt"}))
for text in (b">a desc\nMKVL\nAC\n>b\nWWY\n",
             b"# STOCKHOLM 1.0\n#=GF ID x\ns1 MKV-L\ns2 MK.VL\n//\n"):
    count["readers"] += put("readers", b"\x02" + text)
count["readers"] += put("readers", b"\x03>x\nACGTN\nacgt\n")
examples = "/usr/share/doc/hmmer/examples/tutorial"
for name, selector in (("globins4.sto", 2), ("globins45.fa", 2), ("dna_target.fa", 3)):
    path = os.path.join(examples, name)
    if os.path.exists(path):
        with open(path, "rb") as f:
            count["readers"] += put("readers", bytes([selector]) + f.read()[:MAX - 1])

for kind in ("ir", "readers"):
    for path in glob.glob(os.path.join(root, "test", "Fuzz", "Inputs", kind, "*")):
        shutil.copy(path, os.path.join(corpus, kind))
print(f"seeds: {count['ir']} IR inputs, {count['readers']} reader inputs")
