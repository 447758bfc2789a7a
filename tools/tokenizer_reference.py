#!/usr/bin/env python3
"""Reference token ids for tests/test_tokenizer.c, produced by Hugging Face `tokenizers` itself.

Runs where `tokenizers` is installed (the GPU machine; there is no npm there). Usage:

    python3 tools/tokenizer_reference.py --texts tests/tokenizer/texts.json \
        --tok qwen3=.carry/tok/qwen3.json --tok llama3=.carry/tok/llama3.json \
        --tok deepseek_v3=.carry/tok/deepseek_v3.json \
        --tok tiny=tests/data/tokenizer/tiny/tokenizer.json --out "$OUT"

For every family it writes <out>/<family>.ref.json:
    {"family", "tokenizers_version", "source_sha256",
     "items": [{"text", "ids", "ids_no_special", "decoded", "decoded_skip_special"}]}
where ids = encode(text, add_special_tokens=False).ids with special tokens parsed inline,
ids_no_special the same with encode_special_tokens=True (special added tokens are not matched),
decoded = decode(ids, skip_special_tokens=False), decoded_skip_special with skip=True.
"""
import argparse
import hashlib
import json
import os
import time

import tokenizers
from tokenizers import Tokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", required=True)
    ap.add_argument("--tok", action="append", required=True, help="family=path/to/tokenizer.json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    with open(args.texts, encoding="utf-8") as f:
        texts = json.load(f)
    os.makedirs(args.out, exist_ok=True)

    for spec in args.tok:
        family, path = spec.split("=", 1)
        with open(path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        tok = Tokenizer.from_file(path)
        items = []
        t0 = time.perf_counter()
        n_tok = 0
        for text in texts:
            tok.encode_special_tokens = False
            ids = tok.encode(text, add_special_tokens=False).ids
            tok.encode_special_tokens = True
            ids_ns = tok.encode(text, add_special_tokens=False).ids
            tok.encode_special_tokens = False
            n_tok += len(ids)
            items.append({
                "text": text,
                "ids": ids,
                "ids_no_special": ids_ns,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            })
        dt = time.perf_counter() - t0
        out = {
            "family": family,
            "tokenizers_version": tokenizers.__version__,
            "source_sha256": sha,
            "items": items,
        }
        with open(os.path.join(args.out, f"{family}.ref.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=0)
        print(f"{family}: {len(items)} texts, {n_tok} tokens, {dt:.3f}s")


if __name__ == "__main__":
    main()
