#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_safetensors (fuzz/corpus_safetensors/).

Independent of the C code under test: plain struct + json, following the safetensors spec
(u64 LE header length, JSON header, data section). Run from the repository root:
    python3 fuzz/make_corpus.py
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_safetensors")
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1,
         "BOOL": 1, "F8_E4M3": 1}


def image(tensors, metadata=None, align=8, raw_extra=b""):
    """tensors: list of (name, dtype, shape, bytes or None). Returns the file bytes."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape, payload in tensors:
        n = 1
        for d in shape:
            n *= d
        if payload is None:
            size = n * SIZES.get(dtype, 1)
            payload = bytes((i * 37 + len(name)) & 0xFF for i in range(size))
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    h = json.dumps(header, separators=(",", ":")).encode()
    if align:
        h += b" " * ((-(8 + len(h))) % align)
    return struct.pack("<Q", len(h)) + h + data + raw_extra


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


SEEDS = {
    "basic.safetensors": image(
        [("a.weight", "F32", [2, 3], f32([0.5, -1.0, 2.0, 3.25, -0.125, 8.0])),
         ("b.weight", "BF16", [4], None),
         ("c.weight", "F16", [2, 2], None)],
        metadata={"format": "pt"}),
    "unused_dtypes.safetensors": image(
        [("model.visual.patch_embed.proj.weight", "BF16", [2, 1, 1, 2, 2], None),
         ("position_ids", "I64", [3], None),
         ("scalar", "F32", [], f32([1.5])),
         ("empty", "F32", [0, 4], b""),
         ("fp8", "F8_E4M3", [4], None),
         ("mask", "BOOL", [3], None)]),
    "empty_header.safetensors": image([]),
    "qwen_like.safetensors": image(
        [("model.language_model.layers.0.linear_attn.A_log", "F32", [4], None),
         ("model.language_model.layers.0.linear_attn.conv1d.weight", "BF16", [8, 1, 4], None),
         ("model.language_model.layers.0.mlp.experts.gate_up_proj", "BF16", [2, 4, 2], None),
         ("model.language_model.norm.weight", "BF16", [2], None),
         ("lm_head.weight", "BF16", [3, 2], None)],
        metadata={"format": "pt", "note": "synthetic"}),
    "unaligned_header.safetensors": image(
        [("x", "F32", [1], f32([3.0])), ("y", "BF16", [3], None)], align=0),
    "trailing_bytes.safetensors": image([("t", "U8", [5], None)], raw_extra=b"\x00" * 7),
}

os.makedirs(OUT, exist_ok=True)
for name, blob in SEEDS.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(blob)
    print(name, len(blob))
