#!/usr/bin/env python3
"""train_demo.py — trains deltaserve's demo model (models/qwen35-demo): a small Qwen3.5-MoE.

One run does everything, seeded, on one GPU (PyTorch + transformers 5.17 + tokenizers):
  1. reads the King James Bible (tools/extract_corpus.sh: "<Book> <c>:<v>\\t<text>" per line),
     splits it by chapter (held out: chapters whose canonical index i has i % 50 == 25, 24 of 1189),
     makes plain-text chapter documents plus ChatML drill documents from training verses;
  2. trains a byte-level BPE tokenizer (Hugging Face `tokenizers`, Qwen3.5 split regex, NFC);
  3. builds Qwen3_5MoeForConditionalGeneration (GDN + gated attention, MoE with shared expert, tiny
     untrained vision tower) and an MTP head (module below; drafts token t+2 from the final-normed
     hidden state h_t and token t+1), trains both jointly in bf16 autocast until --train-seconds;
  4. writes a Hugging Face model directory: model.safetensors (bf16; experts in the fused 3-D layout
     of released Qwen3.5 checkpoints; linear_attn.A_log in F32; mtp.* tensors), config.json
     (text_config.mtp_num_hidden_layers = 1), generation_config.json, tokenizer.json,
     tokenizer_config.json (ChatML chat_template);
  5. reloads the files with transformers (fp32), checks every tensor, reports held-out perplexity,
     the MTP head's t+2 accuracy, samples, and writes reference_greedy.json (transformers fp32 on
     the CPU, eager attention: prompt ids -> 32 greedy ids, plus teacher-forced MTP drafts).

Before the real training a self-test runs the whole pipeline for a few steps into a scratch
directory, so a bug in saving or evaluation costs seconds, not the training run.

Usage (as run through the device tool; see models/qwen35-demo/README.md for the exact command):
    tools/extract_corpus.sh                      # here: .carry/demo/kjv.txt
    python3 tools/train_demo.py --corpus .carry/demo/kjv.txt --out /tmp/qwen35-demo \\
        --train-seconds 240 --tar $OUT/qwen35-demo.tgz --summary $OUT/summary.json
    cat qwen35-demo.tgz.part* | tar xz      # the archive comes back in <= 15 MB parts
"""

import argparse
import copy
import json
import math
import os
import random
import re
import shutil
import struct
import sys
import tarfile
import time
import traceback

T_START = time.time()

# Qwen3.5's pre-tokenizer split regex (tokenizer.json of the released models).
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Added tokens after the BPE vocabulary, as in Qwen (special=False for <think>: decoded as text).
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
         ("<think>", False), ("</think>", False)]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

HELDOUT_MOD, HELDOUT_REM = 50, 25
FUSED_RE = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
PER_EXPERT_RE = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
REF_NEW_TOKENS = 32

FAILURES = []


def log(*a):
    print(f"[{time.time() - T_START:7.1f}s]", *a, flush=True)


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        log(f"[CHECK FAILED] {msg}")
    return bool(cond)


# ============================================================================ corpus
def read_corpus(path):
    """-> list of chapters [(book, chapter, [(verse_no, text)])] in canonical order."""
    chapters, key_of = [], {}
    line_re = re.compile(r"^(.+) (\d+):(\d+)\t(.+)$")
    with open(path, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            m = line_re.match(line.rstrip("\n"))
            if not m:
                raise ValueError(f"{path}:{ln}: not '<Book> <c>:<v>\\t<text>': {line[:60]!r}")
            book, c, v, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
            k = (book, c)
            if k not in key_of:
                key_of[k] = len(chapters)
                chapters.append((book, c, []))
            chapters[key_of[k]][2].append((v, text))
    return chapters


def chapter_doc(book, c, verses):
    # A heading line, a blank line, then one verse per line (verse numbers dropped: prose reads
    # better in a demo; the reference drills below keep the numbering).
    return f"{book} {c}\n\n" + "\n".join(t for _, t in verses)


def chat_doc(user, assistant):
    return (f"<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n{assistant}<|im_end|>\n")


def build_documents(chapters, n_chat, seed):
    """Train documents (chapters + ChatML drills from training verses) and held-out chapters."""
    rng = random.Random(seed)
    train_docs, held_docs, train_verses = [], [], []
    for i, (book, c, verses) in enumerate(chapters):
        doc = chapter_doc(book, c, verses)
        if i % HELDOUT_MOD == HELDOUT_REM:
            held_docs.append(doc)
        else:
            train_docs.append(doc)
            train_verses += [(f"{book} {c}:{v}", t) for v, t in verses]
    chats = []
    for ref, text in rng.sample(train_verses, min(n_chat, len(train_verses))):
        words = text.split()
        if rng.random() < 0.5 or len(words) < 6:
            chats.append(chat_doc(f"Recite {ref}.", text))
        else:
            cut = max(2, len(words) // 2 + rng.randint(-2, 2))
            chats.append(chat_doc(f"Complete the verse: {' '.join(words[:cut])}",
                                  " ".join(words[cut:])))
    return train_docs, chats, held_docs


# ============================================================================ tokenizer
def train_tokenizer(texts, vocab_size, out_dir):
    """Byte-level BPE in Qwen's tokenizer.json shape; returns the tokenizers.Tokenizer."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    n_bpe = tok.get_vocab_size()
    for content, special in ADDED:
        at = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False,
                        special=special)
        if special:
            tok.add_special_tokens([at])
        else:
            tok.add_tokens([at])
    # Match the released files' field values exactly (ByteLevel everywhere with no prefix space,
    # no offset trimming, no second regex).
    j = json.loads(tok.to_str())
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    j["pre_tokenizer"]["pretokenizers"][1] = dict(bl)
    j["decoder"] = dict(bl)
    j["post_processor"] = dict(bl)
    tok = Tokenizer.from_str(json.dumps(j))
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    return tok, n_bpe


def write_tokenizer_config(tok, out_dir, max_len):
    added = {}
    for content, special in ADDED:
        added[str(tok.token_to_id(content))] = dict(content=content, lstrip=False, normalized=False,
                                                    rstrip=False, single_word=False,
                                                    special=special)
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": max_len,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


def bytes_per_token(tok, vocab):
    """UTF-8 byte length of each token id (byte-level BPE: exact; added tokens count 0)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    char_ok = set(chr(c) for c in cs)
    out = [0] * vocab
    added = {c for c, _ in ADDED}
    for s, i in tok.get_vocab().items():
        if i < vocab and s not in added and all(ch in char_ok for ch in s):
            out[i] = len(s)
    return out


# ============================================================================ model
def text_config_dict(args, vocab):
    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * (args.layers // 4)
    return dict(
        vocab_size=vocab, hidden_size=args.hidden, num_hidden_layers=len(layer_types),
        layer_types=layer_types, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        hidden_act="silu", max_position_embeddings=args.max_positions, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25,  # rot_dim 16
                         "mrope_section": [3, 3, 2], "mrope_interleaved": True},
        attention_bias=False, attention_dropout=0.0,
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=args.experts, num_experts_per_tok=args.top_k,
        moe_intermediate_size=args.moe_inter, shared_expert_intermediate_size=args.shared_inter,
        router_aux_loss_coef=args.aux_coef, tie_word_embeddings=False, initializer_range=0.02)


VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
              patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
              num_position_embeddings=16)


def build_model(args, vocab, eos_id):
    import torch
    import transformers as tfm
    text = text_config_dict(args, vocab)
    text["eos_token_id"] = eos_id
    cfg = tfm.Qwen3_5MoeConfig(text_config=text,
                               vision_config=dict(VISION, out_hidden_size=args.hidden),
                               tie_word_embeddings=False)
    model = tfm.Qwen3_5MoeForConditionalGeneration._from_config(
        cfg, attn_implementation="sdpa", dtype=torch.float32)
    return model


def make_mtp_class():
    import torch
    from torch import nn
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as mq

    class MTPHead(nn.Module):
        """Qwen3.5 multi-token-prediction head (one layer), parameter names as in the checkpoints:
        x = fc([RMSNorm_emb(embed(t+1)) ; RMSNorm_hid(h_t)]); x = layers.0(x) (a full-attention
        decoder layer of the main model's kind, RoPE position t); out = norm(x) -> shared lm_head.
        The norms are the model's zero-centred RMSNorm (weight w, applied as 1 + w)."""

        def __init__(self, text_config):
            super().__init__()
            cfg = copy.deepcopy(text_config)
            cfg.layer_types = ["full_attention"]
            # The MTP layer always runs with sdpa: with no mask it is causal (is_causal=True).
            cfg._attn_implementation = "sdpa"
            if getattr(cfg, "_experts_implementation", None) is None:
                cfg._experts_implementation = "eager"
            h, eps = cfg.hidden_size, cfg.rms_norm_eps
            self.fc = nn.Linear(2 * h, h, bias=False)
            self.pre_fc_norm_embedding = mq.Qwen3_5MoeRMSNorm(h, eps=eps)
            self.pre_fc_norm_hidden = mq.Qwen3_5MoeRMSNorm(h, eps=eps)
            self.layers = nn.ModuleList([mq.Qwen3_5MoeDecoderLayer(cfg, 0)])
            self.norm = mq.Qwen3_5MoeRMSNorm(h, eps=eps)
            self.config = cfg

        def init_weights(self, std, gen):
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if p.dim() == 1 and "norm" in name and "linear_attn" not in name:
                        p.zero_()  # zero-centred norms: identity
                    elif p.dim() >= 2:
                        p.copy_(torch.randn(p.shape, generator=gen) * std)
                    else:
                        raise RuntimeError(f"MTP: no init rule for {name}")

        def forward(self, emb_next, hidden, position_embeddings, attention_mask=None):
            # emb_next [B, T, H] = embed(token t+1); hidden [B, T, H] = final-normed h_t
            x = torch.cat([self.pre_fc_norm_embedding(emb_next),
                           self.pre_fc_norm_hidden(hidden)], dim=-1)  # [B, T, 2H]
            x = self.fc(x)  # [B, T, H]
            x = self.layers[0](x, position_embeddings=position_embeddings,
                               attention_mask=attention_mask)
            return self.norm(x)  # [B, T, H]

    return MTPHead


def text_positions(lm, like, n, offset=0):
    """cos/sin for text-only positions offset..offset+n-1 (mrope reduces to 1-D positions)."""
    import torch
    pos = torch.arange(offset, offset + n, device=like.device)
    pos3 = pos.view(1, 1, -1).expand(3, like.shape[0], -1)
    return lm.rotary_emb(like, pos3)


def sorted_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Training-speed replacement of transformers' eager expert loop (same math): tokens sorted
    by expert once, one host sync for the counts, autocast-friendly F.linear per expert."""
    import torch
    import torch.nn.functional as F
    n, h = hidden_states.shape
    k = top_k_index.shape[1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tok = order // k
    counts = torch.bincount(flat, minlength=self.num_experts).tolist()
    x = hidden_states[tok]
    w = top_k_weights.reshape(-1)[order]
    outs, start = [], 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        gate, up = F.linear(x[start:start + c], self.gate_up_proj[e]).chunk(2, dim=-1)
        outs.append(F.linear(F.silu(gate) * up, self.down_proj[e]))
        start += c
    y = torch.cat(outs, 0) * w[:, None].to(outs[0].dtype)
    out = torch.zeros(n, h, dtype=hidden_states.dtype, device=hidden_states.device)
    return out.index_add_(0, tok, y.to(hidden_states.dtype))


def expert_modules(model, mtp):
    mods = [l.mlp.experts for l in model.model.language_model.layers]
    if mtp is not None:
        mods.append(mtp.layers[0].mlp.experts)
    return mods


def param_report(model, mtp, args):
    text = sum(p.numel() for n, p in model.named_parameters() if "visual" not in n)
    vis = sum(p.numel() for n, p in model.named_parameters() if "visual" in n)
    m = sum(p.numel() for p in mtp.parameters())
    e_one = 3 * args.moe_inter * args.hidden
    routed = args.layers * args.experts * e_one
    active = text - routed + args.layers * args.top_k * e_one
    return dict(text_params=text, vision_params=vis, mtp_params=m, total_params=text + vis + m,
                routed_expert_params=routed, active_text_params_per_token=active,
                bf16_bytes_estimate=2 * (text + vis + m))


# ============================================================================ data
def encode_stream(tok, docs, eot):
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids += enc.ids
        ids.append(eot)
    return ids


# ============================================================================ training
class RouterTap:
    """Collects (router_logits, top-k indices) of every MoE block during a forward pass."""

    def __init__(self, routers):
        self.rec = []
        self.handles = [r.register_forward_hook(self.hook) for r in routers]

    def hook(self, _m, _inp, out):
        self.rec.append((out[0], out[2]))

    def aux_loss(self, n_experts):
        import torch
        tot = 0.0
        for logits, idx in self.rec:
            p = torch.softmax(logits.float(), dim=-1).mean(0)  # [E]
            f = torch.bincount(idx.reshape(-1), minlength=n_experts).float() / idx.numel()
            tot = tot + n_experts * (f * p).sum()
        return tot / max(1, len(self.rec))

    def usage(self, n_experts):
        import torch
        return [torch.bincount(idx.reshape(-1), minlength=n_experts).float().div(idx.numel())
                for _, idx in self.rec]


def forward_losses(model, mtp, win, want_mtp=True):
    """win [B, T+1] token windows -> (main CE, MTP CE, MTP correct count, MTP count)."""
    import torch.nn.functional as F
    lm = model.model.language_model
    x, y = win[:, :-1], win[:, 1:]
    hid = lm(input_ids=x, use_cache=False).last_hidden_state  # [B, T, H], final-normed
    logits = model.lm_head(hid)  # [B, T, V]
    v = logits.shape[-1]
    main = F.cross_entropy(logits.float().reshape(-1, v), y.reshape(-1))
    if not want_mtp:
        return main, None, None, None
    t = x.shape[1]
    # MTP at position p (0..T-2): h_p and token p+1 -> predicts token p+2.
    pe = text_positions(lm, hid, t - 1)
    m = mtp(lm.embed_tokens(win[:, 1:t]), hid[:, :t - 1], pe)  # [B, T-1, H]
    mlog = model.lm_head(m).float()  # [B, T-1, V]
    tgt = win[:, 2:t + 1]
    mloss = F.cross_entropy(mlog.reshape(-1, v), tgt.reshape(-1))
    correct = (mlog.argmax(-1) == tgt).sum()
    return main, mloss, correct, tgt.numel()


def eval_windows(stream, seq, device):
    import torch
    n = (len(stream) - 1) // seq
    s = torch.tensor(stream[:n * seq + 1], dtype=torch.long)
    return torch.stack([s[i * seq: i * seq + seq + 1] for i in range(n)]).to(device)


def evaluate(model, mtp, wins, bs=64, autocast=True):
    import torch
    tot, tot_m, corr, cnt, ntok = 0.0, 0.0, 0, 0, 0
    was = model.training
    model.eval()
    mtp.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        for i in range(0, wins.shape[0], bs):
            w = wins[i:i + bs]
            main, ml, c, n = forward_losses(model, mtp, w)
            k = w[:, 1:].numel()
            tot += float(main) * k
            ntok += k
            tot_m += float(ml) * n
            corr += int(c)
            cnt += n
    model.train(was)
    mtp.train(was)
    return tot / ntok, tot_m / cnt, corr / cnt


def train(args, model, mtp, train_stream, held_wins, seconds, max_steps, tag):
    import torch
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 parts (GDN chunk maths) in training only
    g = torch.Generator().manual_seed(args.seed + 1)
    stream = torch.tensor(train_stream, dtype=torch.long)
    n_exp = args.experts
    params = [(n, p) for n, p in model.named_parameters() if "visual" not in n] + \
             [("mtp." + n, p) for n, p in mtp.named_parameters()]
    for n, p in model.named_parameters():
        if "visual" in n:
            p.requires_grad_(False)
    decay = [p for n, p in params if p.dim() >= 2 and "conv1d" not in n]
    no_decay = [p for n, p in params if not (p.dim() >= 2 and "conv1d" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    routers = [l.mlp.gate for l in model.model.language_model.layers] + [mtp.layers[0].mlp.gate]
    tap = RouterTap(routers)
    model.train()
    mtp.train()
    t0 = time.time()
    total_steps = max_steps
    best = dict(loss=float("inf"), step=0, state=None)
    ema, ema_m, step, bad_evals, hist = None, None, 0, 0, []
    while True:
        if step >= total_steps or time.time() - t0 > seconds:
            break
        if step == 10:
            t10 = time.time()
        if step == args.warmup:
            # Fix the schedule's length from the measured speed (steps 10..warmup, after CUDA
            # start-up), leaving 5% of the budget for the periodic evaluations.
            per = (time.time() - t10) / (step - 10)
            left = seconds - (time.time() - t0)
            total_steps = min(max_steps, step + int(left * 0.95 / per))
            log(f"[{tag}] {per * 1000:.1f} ms/step -> schedule of {total_steps} steps")
        lr = args.lr * min(1.0, (step + 1) / args.warmup)
        if step >= args.warmup:
            frac = min(1.0, (step - args.warmup) / max(1, total_steps - args.warmup))
            lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        offs = torch.randint(0, len(stream) - args.seq - 1, (args.batch,), generator=g)
        win = torch.stack([stream[o:o + args.seq + 1] for o in offs.tolist()]).to(dev, non_blocking=True)
        tap.rec.clear()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            main, ml, _, _ = forward_losses(model, mtp, win)
            aux = tap.aux_loss(n_exp)
            loss = main + args.mtp_weight * ml + args.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        opt.step()
        step += 1
        if step % 25 == 0 or step == 1:
            mv, mm = float(main), float(ml)
            ema = mv if ema is None else 0.9 * ema + 0.1 * mv
            ema_m = mm if ema_m is None else 0.9 * ema_m + 0.1 * mm
        if step % args.log_every == 0 or step == 1:
            log(f"[{tag}] step {step} lr {lr:.2e} loss {float(main):.4f} (ema {ema:.4f}) "
                f"mtp {float(ml):.4f} aux {float(aux):.4f} |g| {float(gn):.3f} "
                f"{(time.time() - t0):.0f}s")
        if step % args.eval_every == 0 or step >= total_steps or time.time() - t0 > seconds:
            hl, hm, ha = evaluate(model, mtp, held_wins)
            hist.append(dict(step=step, secs=round(time.time() - t0, 1), train_ema=ema,
                             heldout_loss=hl, heldout_mtp_loss=hm, heldout_mtp_acc=ha))
            improved = hl < best["loss"] - 1e-4
            log(f"[{tag}] eval step {step}: held-out loss {hl:.4f} (ppl {math.exp(hl):.2f}) "
                f"mtp loss {hm:.4f} acc {ha:.4f}{'  *best*' if improved else ''}")
            if improved:
                best.update(loss=hl, step=step, train_ema=ema, train_ema_mtp=ema_m,
                            state=({k: v.detach().clone() for k, v in model.state_dict().items()},
                                   {k: v.detach().clone() for k, v in mtp.state_dict().items()}))
                bad_evals = 0
            else:
                bad_evals += 1
                if bad_evals >= args.patience:
                    log(f"[{tag}] held-out loss has not improved for {bad_evals} evals: stop")
                    break
    for h in tap.handles:
        h.remove()
    elapsed = time.time() - t0
    if best["state"] is not None:
        model.load_state_dict(best["state"][0])
        mtp.load_state_dict(best["state"][1])
    # Expert usage on one held-out batch (fraction of routed slots per expert, per layer).
    tap2 = RouterTap(routers)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        model.eval()
        mtp.eval()
        forward_losses(model, mtp, held_wins[:16])
    usage = [[round(float(x), 4) for x in u] for u in tap2.usage(n_exp)]
    for h in tap2.handles:
        h.remove()
    log(f"[{tag}] done: {step} steps in {elapsed:.1f}s; best held-out loss {best['loss']:.4f} "
        f"at step {best['step']}")
    return dict(steps=step, train_seconds=round(elapsed, 1), best_step=best["step"],
                best_heldout_loss=best["loss"], train_loss_ema_at_best=best.get("train_ema"),
                train_mtp_loss_ema_at_best=best.get("train_ema_mtp"),
                tokens_seen=step * args.batch * args.seq, history=hist, expert_usage=usage)


# ============================================================================ saving
def st_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    return hdr


def fuse_experts(tensors):
    """Per-expert names -> fused [E, 2I, H] gate_up_proj / [E, H, I] down_proj (no-op if fused)."""
    import torch
    groups, out = {}, {}
    for k, v in tensors.items():
        m = PER_EXPERT_RE.match(k)
        if m:
            groups.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = v
        else:
            out[k] = v
    for prefix, ex in groups.items():
        n = len(ex)
        assert sorted(ex) == list(range(n)), f"{prefix}: experts not 0..{n - 1}"
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([ex[e]["gate_proj"], ex[e]["up_proj"]], 0) for e in range(n)]).contiguous()
        out[f"{prefix}.down_proj"] = torch.stack([ex[e]["down_proj"] for e in range(n)]).contiguous()
    return out, len(groups)


def save_checkpoint(model, mtp, tok, args, out_dir, eos_ids):
    """save_pretrained (bf16) + rewrite: fused experts, F32 A_log, mtp.* tensors, config fields."""
    import torch
    from safetensors.torch import load_file, save_file
    fp32_state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    m16 = copy.deepcopy(model).to(torch.bfloat16)
    for sub in ("text_config", "vision_config"):
        getattr(m16.config, sub).dtype = torch.bfloat16
    m16.save_pretrained(out_dir)
    del m16
    files = sorted(f for f in os.listdir(out_dir) if f.endswith(".safetensors"))
    tensors = {}
    for f in files:
        tensors.update(load_file(os.path.join(out_dir, f)))
        os.remove(os.path.join(out_dir, f))
    if os.path.exists(os.path.join(out_dir, "model.safetensors.index.json")):
        os.remove(os.path.join(out_dir, "model.safetensors.index.json"))
    saved_layout = "per-expert" if any(PER_EXPERT_RE.match(k) for k in tensors) else "fused"
    tensors, n_fused = fuse_experts(tensors)
    log(f"[save] save_pretrained wrote {files} ({saved_layout} experts); fused {n_fused} blocks")
    # Every main-model tensor must be the bf16 rounding of the trained value.
    for k, v in fp32_state.items():
        check(k in tensors, f"save: {k} missing from save_pretrained's output")
        if k in tensors:
            check(torch.equal(tensors[k].float(), v.to(torch.bfloat16).float()),
                  f"save: {k} differs from the trained value")
    check(len(tensors) == len(fp32_state),
          f"save: {len(tensors)} tensors in the file, {len(fp32_state)} in the model: "
          f"{sorted(set(tensors) ^ set(fp32_state))[:6]}")
    # Released checkpoints keep A_log in F32: store the trained fp32 value.
    for k in list(tensors):
        if k.endswith("linear_attn.A_log"):
            tensors[k] = fp32_state[k].contiguous()
    for k, v in mtp.state_dict().items():
        tensors[f"mtp.{k}"] = v.detach().to(torch.bfloat16).cpu().contiguous()
    save_file(dict(sorted(tensors.items())), os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    cpath = os.path.join(out_dir, "config.json")
    with open(cpath) as f:
        cfg = json.load(f)
    cfg["dtype"] = "bfloat16"
    cfg["text_config"]["dtype"] = "bfloat16"
    cfg["vision_config"]["dtype"] = "bfloat16"
    cfg["text_config"]["mtp_num_hidden_layers"] = 1
    cfg["text_config"]["mtp_use_dedicated_embeddings"] = False
    with open(cpath, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    gen = {"bos_token_id": eos_ids[1], "eos_token_id": list(eos_ids), "pad_token_id": eos_ids[1],
           "do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95,
           "transformers_version": None}
    import transformers as tfm
    gen["transformers_version"] = tfm.__version__
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    log(f"[save] {out_dir}: model.safetensors {size} bytes, {len(tensors)} tensors "
        f"({sum(1 for k in tensors if k.startswith('mtp.'))} mtp.*)")
    return size


def dir_listing(d):
    return {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d))}


# ============================================================================ evaluation
def load_fp32(model_dir, device, attn):
    import torch
    import transformers as tfm
    model, info = tfm.Qwen3_5MoeForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attn, output_loading_info=True)
    return model.to(device).eval(), info


def load_mtp_from_file(model, model_dir, device):
    from safetensors.torch import load_file
    MTPHead = make_mtp_class()
    mtp = MTPHead(model.config.text_config)
    st = load_file(os.path.join(model_dir, "model.safetensors"))
    sd = {k[4:]: v.float() for k, v in st.items() if k.startswith("mtp.")}
    missing, unexpected = mtp.load_state_dict(sd, strict=False)
    check(not missing and not unexpected, f"MTP load: missing {missing}, unexpected {unexpected}")
    return mtp.to(device).eval()


def check_reload(model, info, model_dir):
    import torch
    from safetensors.torch import load_file
    files = load_file(os.path.join(model_dir, "model.safetensors"))
    sd = model.state_dict()
    n = 0
    for k, v in files.items():
        if k.startswith("mtp."):
            continue
        if not check(k in sd, f"reload: file tensor {k} not in the loaded model"):
            continue
        check(torch.equal(sd[k].float().cpu(), v.float()), f"reload: {k} differs from the file")
        n += 1
    missing = [k for k in sd if k not in files]
    check(not missing, f"reload: model parameters not in the file: {missing[:8]}")
    log(f"[reload] {n} tensors equal the file; loading info: missing {info.get('missing_keys')}, "
        f"unexpected {len(info.get('unexpected_keys') or [])} (mtp.* expected), "
        f"mismatched {info.get('mismatched_keys')}")
    return n


def full_eval(model_dir, held_stream, train_stream, seq, tok, bpt, tag):
    import torch
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, info = load_fp32(model_dir, dev, "sdpa")
    check_reload(model, info, model_dir)
    mtp = load_mtp_from_file(model, model_dir, dev)
    wins = eval_windows(held_stream, seq, dev)
    hl, hm, ha = evaluate(model, mtp, wins, bs=32, autocast=False)
    pred = wins[:, 1:].reshape(-1).tolist()
    nbytes = sum(bpt[i] for i in pred)
    bpb = hl * len(pred) / math.log(2) / max(1, nbytes)
    tw = eval_windows(train_stream[:len(held_stream)], seq, dev)
    tl, tm, ta = evaluate(model, mtp, tw, bs=32, autocast=False)
    # Speculative-decoding view: does the MTP draft for t+2 equal the main model's own greedy
    # choice for t+2 (given the true token t+1)? That is what a greedy verifier would accept.
    agree, tot = 0, 0
    lm = model.model.language_model
    with torch.no_grad():
        for i in range(0, wins.shape[0], 32):
            w = wins[i:i + 32]
            x = w[:, :-1]
            hid = lm(input_ids=x, use_cache=False).last_hidden_state
            main_arg = model.lm_head(hid).argmax(-1)  # [B, T]: row p predicts token p+1
            t = x.shape[1]
            m = mtp(lm.embed_tokens(w[:, 1:t]), hid[:, :t - 1], text_positions(lm, hid, t - 1))
            draft = model.lm_head(m).argmax(-1)  # [B, T-1]: row p predicts token p+2
            agree += int((draft == main_arg[:, 1:]).sum())
            tot += draft.numel()
    res = dict(heldout_tokens=len(pred), heldout_bytes=nbytes, heldout_loss=hl,
               heldout_ppl=math.exp(hl), heldout_bits_per_byte=bpb,
               heldout_mtp_loss=hm, heldout_mtp_top1_acc=ha,
               heldout_mtp_agrees_with_main_greedy=agree / tot,
               train_sample_loss=tl, train_sample_ppl=math.exp(tl), train_sample_mtp_acc=ta)
    log(f"[{tag}] fp32 reload: held-out ppl {res['heldout_ppl']:.3f} (loss {hl:.4f}, "
        f"{bpb:.4f} bits/byte over {len(pred)} tokens / {nbytes} bytes); train-sample ppl "
        f"{res['train_sample_ppl']:.3f}; MTP t+2 top-1 acc {ha:.4f} (train sample {ta:.4f}); "
        f"MTP draft == main greedy {agree / tot:.4f}")
    return model, mtp, res


def samples(model, tok, eot, im_end, seed):
    import torch
    out = []
    prompts = ["In the beginning God created", "And Jesus answered and said unto them,",
               "The LORD is my shepherd;", "Blessed are the",
               "<|im_start|>user\nComplete the verse: For God so loved the world,<|im_end|>\n"
               "<|im_start|>assistant\n",
               "<|im_start|>user\nRecite Psalms 23:1.<|im_end|>\n<|im_start|>assistant\n"]
    for p in prompts:
        ids = tok.encode(p, add_special_tokens=False).ids
        x = torch.tensor([ids], device=model.device)
        am = torch.ones_like(x)
        for mode in ("greedy", "t=0.8"):
            torch.manual_seed(seed)
            kw = dict(do_sample=False) if mode == "greedy" else dict(do_sample=True,
                                                                     temperature=0.8, top_k=0,
                                                                     top_p=1.0)
            with torch.no_grad():
                g = model.generate(input_ids=x, attention_mask=am, max_new_tokens=48,
                                   eos_token_id=[im_end, eot], pad_token_id=eot, **kw)
            text = tok.decode(g[0, len(ids):].tolist(), skip_special_tokens=False)
            out.append(dict(prompt=p, mode=mode, text=text))
            log(f"[sample {mode}] {p!r} -> {text!r}")
    return out


def reference_greedy(model_dir, tok, held_stream, eot, args):
    """transformers fp32 on the CPU (eager attention) from the saved bf16 files."""
    import torch
    import transformers as tfm
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    model, _ = load_fp32(model_dir, "cpu", "eager")
    mtp = load_mtp_from_file(model, model_dir, "cpu")
    # Model-level defaults fill unset fields of a passed GenerationConfig: start from a blank one.
    model.generation_config = tfm.GenerationConfig(do_sample=False)
    prompts = [("eot", None), ("genesis", "In the beginning God created"),
               ("jesus", "And Jesus answered and said unto them,"),
               ("psalm", "The LORD is my shepherd;"),
               ("chat", "<|im_start|>user\nComplete the verse: For God so loved the world,"
                        "<|im_end|>\n<|im_start|>assistant\n"),
               ("heldout100", None)]
    doc = dict(model="qwen35-demo",
               computed_with=dict(transformers=tfm.__version__, torch=torch.__version__,
                                  device="cpu", dtype="float32", attn_implementation="eager",
                                  weights="bf16 files upcast to float32 (A_log stored F32)",
                                  script="tools/train_demo.py"),
               note=("greedy: generate(do_sample=False, use_cache=True) with eos disabled, "
                     f"{REF_NEW_TOKENS} new tokens; top2_margin[i] = best minus second logit of "
                     "step i (compare argmax only where it exceeds the test's logit tolerance). "
                     "mtp_teacher_forced: no-cache forward over `tokens`; draft_argmax[p] is the "
                     "MTP head's argmax for token p+2 from h_p (final-normed) and token p+1, "
                     "RoPE position p; main_argmax[p] is the main model's argmax for token p+1."),
               greedy=[])
    gc = tfm.GenerationConfig(do_sample=False, max_new_tokens=REF_NEW_TOKENS, min_new_tokens=0,
                              eos_token_id=None, pad_token_id=None, use_cache=True, num_beams=1)
    for name, text in prompts:
        if name == "eot":
            ids = [eot]
        elif name == "heldout100":
            ids = held_stream[1000:1100]
        else:
            ids = tok.encode(text, add_special_tokens=False).ids
        with torch.no_grad():
            o = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                               dtype=torch.long), generation_config=gc,
                               return_dict_in_generate=True, output_logits=True)
        gen = [int(t) for t in o.sequences[0, len(ids):]]
        lg = torch.stack([s[0].float() for s in o.logits])
        top2 = torch.topk(lg, 2, dim=-1).values
        # teacher-forced check of the cached decode
        with torch.no_grad():
            full = model(input_ids=torch.tensor([ids + gen]), use_cache=False).logits[0].float()
        tf = full[len(ids) - 1: len(ids) - 1 + len(gen)]
        check([int(a) for a in lg.argmax(-1)] == gen, f"ref {name}: greedy token != argmax")
        doc["greedy"].append(dict(
            name=name, prompt_text=tok.decode(ids, skip_special_tokens=False), prompt=ids,
            generated=gen, generated_text=tok.decode(gen, skip_special_tokens=False),
            top2_margin=[round(float(a - b), 5) for a, b in zip(top2[:, 0], top2[:, 1])],
            cached_vs_uncached_max_abs=float((tf - lg).abs().max()),
            teacher_forced_argmax_equals_generated=[int(a) for a in tf.argmax(-1)] == gen))
        log(f"[ref] {name}: {len(ids)} prompt tokens -> {gen[:12]}... "
            f"{tok.decode(gen, skip_special_tokens=False)!r}; min margin "
            f"{float((top2[:, 0] - top2[:, 1]).min()):.3e}; cached vs no-cache max|diff| "
            f"{float((tf - lg).abs().max()):.2e}")
    # MTP drafts, teacher-forced over the genesis prompt + its greedy continuation.
    g0 = doc["greedy"][1]
    seq = g0["prompt"] + g0["generated"]
    lm = model.model.language_model
    with torch.no_grad():
        x = torch.tensor([seq])
        hid = lm(input_ids=x, use_cache=False).last_hidden_state
        main_l = model.lm_head(hid)[0]
        t = len(seq)
        pe = text_positions(lm, hid, t - 1)
        m = mtp(lm.embed_tokens(x[:, 1:]), hid[:, :t - 1], pe)
        dl = model.lm_head(m)[0].float()  # [t-1, V]: row p predicts token p+2
        # Independent masking check: eager attention with an explicit additive causal mask.
        mask = torch.full((t - 1, t - 1), float("-inf")).triu(1)[None, None]
        mtp_e = copy.deepcopy(mtp)
        mtp_e.layers[0].self_attn.config._attn_implementation = "eager"
        m2 = mtp_e(lm.embed_tokens(x[:, 1:]), hid[:, :t - 1], pe, attention_mask=mask)
        d2 = model.lm_head(m2)[0].float()
    diff = float((dl - d2).abs().max())
    check(diff < 1e-3, f"MTP sdpa-causal vs eager+explicit-mask differ by {diff}")
    top2 = torch.topk(dl, 2, dim=-1).values
    doc["mtp_teacher_forced"] = dict(
        tokens=seq, draft_argmax=[int(a) for a in dl.argmax(-1)],
        draft_top2_margin=[round(float(a - b), 5) for a, b in zip(top2[:, 0], top2[:, 1])],
        main_argmax=[int(a) for a in main_l.argmax(-1)],
        sdpa_vs_eager_mask_max_abs=diff)
    hits = sum(1 for p in range(t - 2) if doc["mtp_teacher_forced"]["draft_argmax"][p] == seq[p + 2])
    log(f"[ref] MTP teacher-forced over {t} tokens: drafts equal the actual t+2 token at "
        f"{hits}/{t - 2}; sdpa vs eager-mask max|diff| {diff:.2e}")
    with open(os.path.join(model_dir, "reference_greedy.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return doc


def hf_tokenizer_check(model_dir, tok, texts):
    import transformers as tfm
    try:
        ht = tfm.AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:
        check(False, f"AutoTokenizer cannot load {model_dir}: {e!r}")
        return
    for t in texts:
        a = ht(t, add_special_tokens=False)["input_ids"]
        b = tok.encode(t, add_special_tokens=False).ids
        check(a == b, f"AutoTokenizer and tokenizers differ on {t[:40]!r}: {a[:10]} vs {b[:10]}")
    msgs = [{"role": "user", "content": "Recite John 3:16."}]
    s = ht.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    want = "<|im_start|>user\nRecite John 3:16.<|im_end|>\n<|im_start|>assistant\n"
    check(s == want, f"chat template renders {s!r}, want {want!r}")
    log(f"[tokenizer] AutoTokenizer ({type(ht).__name__}) agrees; chat template -> {s!r}")


# ============================================================================ main
def pipeline(args, tok, streams, eos_ids, out_dir, seconds, max_steps, tag, full):
    import torch
    train_stream, held_stream = streams
    vocab = args.model_vocab
    torch.manual_seed(args.seed)
    model = build_model(args, vocab, eos_ids[1]).cuda()
    MTPHead = make_mtp_class()
    mtp = MTPHead(model.config.text_config)
    mtp.init_weights(0.02, torch.Generator().manual_seed(args.seed + 7))
    mtp = mtp.cuda()
    rep = param_report(model, mtp, args)
    log(f"[{tag}] params: {json.dumps(rep)}")
    # The training expert kernel must equal transformers' own (checked on this model, fp32).
    ex = model.model.language_model.layers[0].mlp.experts
    xs = torch.randn(300, args.hidden, device="cuda")
    idx = torch.stack([torch.randperm(args.experts, device="cuda")[:args.top_k] for _ in range(300)])
    wts = torch.rand(300, args.top_k, device="cuda")
    with torch.no_grad():
        ref = ex(xs, idx, wts)
        mine = sorted_experts_forward(ex, xs, idx, wts)
    d = float((ref - mine).abs().max())
    check(d < 1e-4, f"sorted expert forward differs from transformers' by {d}")
    import types
    for m in expert_modules(model, mtp):
        m.forward = types.MethodType(sorted_experts_forward, m)
    held_wins = eval_windows(held_stream, args.seq, torch.device("cuda"))
    stats = train(args, model, mtp, train_stream, held_wins, seconds, max_steps, tag)
    for m in expert_modules(model, mtp):
        del m.forward  # back to transformers' class forward for saving / reference
    if os.path.exists(out_dir):
        for f in ("model.safetensors", "config.json", "generation_config.json"):
            if os.path.exists(os.path.join(out_dir, f)):
                os.remove(os.path.join(out_dir, f))
    size = save_checkpoint(model, mtp, tok, args, out_dir, eos_ids)
    check(size <= 40_000_000, f"model.safetensors is {size} bytes (> 40 MB)")
    del model, mtp
    torch.cuda.empty_cache()
    if args.tar and full:
        pack(out_dir, args.tar)  # a first copy, before any evaluation can fail
    bpt = bytes_per_token(tok, vocab)
    model, mtp, ev = full_eval(out_dir, held_stream, train_stream, args.seq, tok, bpt, tag)
    sm = samples(model, tok, eos_ids[1], eos_ids[0], args.seed) if full else []
    del model, mtp
    ref = reference_greedy(out_dir, tok, held_stream, eos_ids[1], args)
    hf_tokenizer_check(out_dir, tok, ["In the beginning God created the heaven and the earth.",
                                      "<|im_start|>user\nRecite John 3:16.<|im_end|>\n",
                                      "Ünïcödé café 12345 — naïve\n\n  x"])
    return dict(params=rep, train=stats, eval=ev, samples=sm,
                files=dir_listing(out_dir),
                reference_first=ref["greedy"][1]["generated"][:8])


def pack(d, tar_path, part_bytes=15_000_000):
    """Packs d into tar_path; an archive over part_bytes is split into tar_path.partNN pieces
    (the device tool returns files of at most 16 MiB): cat tar_path.part* > tar_path."""
    for old in [f for f in os.listdir(os.path.dirname(os.path.abspath(tar_path)))
                if f.startswith(os.path.basename(tar_path) + ".part")]:
        os.remove(os.path.join(os.path.dirname(os.path.abspath(tar_path)), old))
    with tarfile.open(tar_path, "w:gz") as tf:
        tf.add(d, arcname=os.path.basename(os.path.normpath(d)))
    size = os.path.getsize(tar_path)
    log(f"[tar] {tar_path} {size} bytes: {dir_listing(d)}")
    if size > part_bytes:
        with open(tar_path, "rb") as f:
            i = 0
            while True:
                chunk = f.read(part_bytes)
                if not chunk:
                    break
                with open(f"{tar_path}.part{i:02d}", "wb") as g:
                    g.write(chunk)
                i += 1
        os.remove(tar_path)
        log(f"[tar] split into {i} parts {tar_path}.part00..{i - 1:02d} (cat them to rejoin)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=".carry/demo/kjv.txt")
    ap.add_argument("--out", default="/tmp/qwen35-demo", help="model directory to write")
    ap.add_argument("--tar", default=None, help="pack the model directory into this .tgz")
    ap.add_argument("--summary", default=None, help="write the numbers as JSON here")
    ap.add_argument("--seed", type=int, default=20250601)
    ap.add_argument("--train-seconds", type=float, default=240.0,
                    help="wall-clock budget of the training loop (the schedule adapts to it)")
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--self-test-steps", type=int, default=6,
                    help="run the whole pipeline this many steps into a scratch dir first (0: no)")
    ap.add_argument("--bpe-vocab", type=int, default=6000, help="BPE vocabulary before added tokens")
    ap.add_argument("--model-vocab", type=int, default=6144,
                    help="embedding rows (ids past the tokenizer are padding, as in Qwen3.5)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--moe-inter", type=int, default=96)
    ap.add_argument("--shared-inter", type=int, default=128)
    ap.add_argument("--max-positions", type=int, default=4096)
    ap.add_argument("--chat-docs", type=int, default=4000)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--patience", type=int, default=4)
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()

    import torch
    import tokenizers
    import transformers as tfm
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    log(f"[env] python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
        f"{tfm.__version__}, tokenizers {tokenizers.__version__}, "
        f"gpu {torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}")
    log(f"[args] {json.dumps(vars(args))}")

    chapters = read_corpus(args.corpus)
    n_verses = sum(len(v) for _, _, v in chapters)
    check(len(chapters) == 1189 and n_verses == 31102,
          f"corpus: {len(chapters)} chapters / {n_verses} verses, want 1189 / 31102")
    train_docs, chats, held_docs = build_documents(chapters, args.chat_docs, args.seed)
    log(f"[data] {len(train_docs)} train chapters + {len(chats)} chat drills, {len(held_docs)} "
        f"held-out chapters (index % {HELDOUT_MOD} == {HELDOUT_REM}): "
        f"{[d.split(chr(10))[0] for d in held_docs]}")
    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.out):
        p = os.path.join(args.out, f)
        if os.path.isfile(p):
            os.remove(p)
    # The tokenizer sees training text only (plain chapters + drills; not the held-out chapters).
    tok, n_bpe = train_tokenizer(train_docs + chats, args.bpe_vocab, args.out)
    n_tok = tok.get_vocab_size()
    check(n_tok <= args.model_vocab, f"tokenizer has {n_tok} ids > model vocab {args.model_vocab}")
    write_tokenizer_config(tok, args.out, args.max_positions)
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    eos_ids = (im_end, eot)
    log(f"[tokenizer] {n_bpe} BPE tokens + {len(ADDED)} added = {n_tok}; ids "
        f"{ {c: tok.token_to_id(c) for c, _ in ADDED} }; model vocab {args.model_vocab}")
    log(f"[tokenizer] 'In the beginning God created the heaven' -> "
        f"{tok.encode('In the beginning God created the heaven').tokens}")
    rng = random.Random(args.seed + 3)
    docs = train_docs + chats
    rng.shuffle(docs)
    train_stream = encode_stream(tok, docs, eot)
    held_stream = encode_stream(tok, held_docs, eot)
    plain_tokens = len(encode_stream(tok, train_docs, eot))
    log(f"[data] train stream {len(train_stream)} tokens ({plain_tokens} plain, "
        f"{len(train_stream) - plain_tokens} chat); held-out {len(held_stream)} tokens; "
        f"{sum(len(d.encode()) for d in train_docs) / plain_tokens:.2f} bytes/token (plain)")
    summary = dict(args=vars(args), versions=dict(torch=torch.__version__,
                                                  transformers=tfm.__version__,
                                                  tokenizers=tokenizers.__version__,
                                                  python=sys.version.split()[0]),
                   data=dict(train_chapters=len(train_docs), chat_drills=len(chats),
                             heldout_chapters=[d.split("\n")[0] for d in held_docs],
                             train_tokens=len(train_stream), train_plain_tokens=plain_tokens,
                             heldout_tokens=len(held_stream)),
                   tokenizer=dict(bpe=n_bpe, total=n_tok, eot=eot, im_start=tok.token_to_id(
                       "<|im_start|>"), im_end=im_end, think=tok.token_to_id("<think>"),
                       think_end=tok.token_to_id("</think>")))

    if args.self_test_steps > 0:
        st_dir = "/tmp/train_demo_selftest"
        shutil.rmtree(st_dir, ignore_errors=True)
        shutil.copytree(args.out, st_dir)
        n_fail = len(FAILURES)
        try:
            pipeline(args, tok, (train_stream, held_stream), eos_ids, st_dir, 1e9,
                     args.self_test_steps, "selftest", full=False)
        except Exception:
            log(f"[selftest] FAILED:\n{traceback.format_exc()}")
            sys.exit(2)
        if len(FAILURES) > n_fail:
            log(f"[selftest] {len(FAILURES) - n_fail} checks failed: {FAILURES[n_fail:]}")
            sys.exit(2)
        log("[selftest] pipeline ok")

    t_left = args.train_seconds
    res = pipeline(args, tok, (train_stream, held_stream), eos_ids, args.out, t_left,
                   args.max_steps, "train", full=True)
    summary.update(res)
    summary["wall_seconds"] = round(time.time() - T_START, 1)
    summary["failures"] = FAILURES
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
    if args.tar:
        pack(args.out, args.tar)
    log(f"[done] {json.dumps({k: summary[k] for k in ('eval', 'files', 'wall_seconds')})}")
    if FAILURES:
        log(f"[FAILED] {len(FAILURES)} checks: {FAILURES}")
        sys.exit(1)
    log("[ok] all checks passed")


if __name__ == "__main__":
    main()
