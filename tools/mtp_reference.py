#!/usr/bin/env python3
"""mtp_reference.py — seeded random MTP heads for the tiny fixtures + PyTorch reference logits.

transformers has no MTP head, so this script builds one from vLLM's qwen3_5_mtp.py semantics
(shared/docs/qwen35.md, "MTP head") out of transformers' own Qwen3.5 modules:

    e = RMSNorm_emb(embed(token[t+1]))       zero-centred RMSNorm: x·rsqrt(mean x²+eps)·(1+w)
    h = RMSNorm_hid(h_t)                     h_t: the main model's hidden state AFTER its final norm
    x = fc([e ; h])                          Linear 2H → H, embedding first
    x = decoder_layer(x)                     the model's own full-attention decoder-layer class
                                             (gated attention + MoE / dense MLP), causal over the
                                             MTP's own sequence, RoPE position t
    logits = lm_head(mtp.norm(x))            shared lm_head; row t predicts token[t+2]

For every fixture (tiny-moe, tiny-dense) it
  1. loads the committed checkpoint in fp32 (eager attention) and checks that driving the decoder
     layers by hand (our causal mask + rotary cos/sin) reproduces the model's own forward — the
     calling convention the MTP layer then uses;
  2. draws seeded random mtp.* weights (the fixtures' rules: matrices N(0, 1/sqrt(fan_in)),
     zero-centred norm weights U(-0.5, 0.5)), rounds them to bf16 and computes everything from the
     rounded values in fp32 on the CPU;
  3. writes <model>-mtp.safetensors (bf16 mtp.* tensors, fused 3-D expert layout for MoE) and
     reference logits: teacher-forced rows t = 0..n-2 (h_t and token t+1) for three sequences of
     ref/<model>.json, plus a 3-step draft chain after the len65 and len7 sequences (step j ≥ 2
     feeds the MTP's own post-norm output and the previous step's argmax draft);
  4. cross-checks the reference on CUDA (TF32 off) when a GPU is present.

Outputs (--out): <model>-mtp.safetensors, <model>.mtp.logits.f32 (little-endian f32 rows [*, V]),
mtp_ref.json (tokens, row offsets, argmax, top-2 margins, chain drafts, checks), log lines on
stdout. Exit status non-zero if any check failed.

    python3 tools/mtp_reference.py --data tests/data --out $OUT
"""

import argparse
import copy
import hashlib
import json
import math
import os
import sys
import traceback
import zlib

MODELS = ["tiny-moe", "tiny-dense"]
SEQS = ["len7", "len65", "len130"]
CHAIN_SEQS = ["len65", "len7"]
CHAIN_STEPS = 3
FAILURES = []


def log(*a):
    print(*a, flush=True)


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        log(f"[CHECK FAILED] {msg}")
    return bool(cond)


def name_seed(seed, name):
    return (seed * 1000003 + zlib.crc32(name.encode())) & 0x7FFFFFFF


def load_fp32(model_dir):
    import torch
    import transformers as tfm
    with open(os.path.join(model_dir, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    model = getattr(tfm, arch).from_pretrained(model_dir, dtype=torch.float32,
                                               attn_implementation="eager")
    return model.eval()


def causal_mask(n, device):
    import torch
    return torch.full((n, n), float("-inf"), device=device).triu(1)[None, None]


def rope(lm, like, n):
    """cos/sin for text-only positions 0..n-1 (mrope reduces to 1-D positions)."""
    import torch
    pos = torch.arange(n, device=like.device)
    pos3 = pos.view(1, 1, -1).expand(3, like.shape[0], -1)
    return lm.rotary_emb(like, pos3)


def manual_rope_check(lm, cos, sin, n):
    """Independent NeoX cos/sin over the rotary dims: inv_freq[i] = theta^(-2i/rot)."""
    import torch
    cfg = lm.config
    rp = getattr(cfg, "rope_parameters", None) or {}
    if not isinstance(rp, dict):
        rp = dict(rp) if hasattr(rp, "keys") else {}
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    pf = rp.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0))
    rot = int(cfg.head_dim * pf)
    inv = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    fr = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([fr, fr], -1)
    c, s = cos[0].float().cpu(), sin[0].float().cpu()
    d = max(float((c[:, :rot] - emb.cos()).abs().max()), float((s[:, :rot] - emb.sin()).abs().max()))
    log(f"  rope: rot {rot} theta {theta}; rotary_emb vs manual NeoX max|diff| {d:.2e} "
        f"(cos shape {tuple(cos.shape)})")
    check(c.shape[-1] == rot and d < 1e-5, f"rotary_emb cos/sin do not match plain NeoX RoPE ({d})")


def layer_out(y):
    return y[0] if isinstance(y, tuple) else y


def calling_convention_check(model, ids):
    """Drive every decoder layer by hand the way the MTP layer is driven; must equal forward()."""
    import torch
    lm = model.model.language_model
    with torch.no_grad():
        ref = lm(input_ids=ids, use_cache=False).last_hidden_state
        n = ids.shape[1]
        h = lm.embed_tokens(ids)
        cos, sin = rope(lm, h, n)
        manual_rope_check(lm, cos, sin, n)
        mask = causal_mask(n, h.device)
        for i, layer in enumerate(lm.layers):
            full = lm.config.layer_types[i] == "full_attention"
            h = layer_out(layer(h, position_embeddings=(cos, sin),
                                attention_mask=mask if full else None))
        h = lm.norm(h)
    d = float((h - ref).abs().max())
    log(f"  manual layer-by-layer forward vs lm.forward: max|diff| {d:.2e}")
    check(d < 1e-4, f"manual decoder-layer calls do not reproduce the model ({d})")


class MTPHead:
    """The MTP head as plain modules (names as in the checkpoints under mtp.)."""

    def __init__(self, lm):
        from torch import nn
        cfg = copy.deepcopy(lm.config)
        cfg.layer_types = ["full_attention"]
        cfg._attn_implementation = "eager"
        if getattr(cfg, "_experts_implementation", None) is None:
            try:
                cfg._experts_implementation = "eager"
            except Exception:
                pass
        full_idx = lm.config.layer_types.index("full_attention")
        layer_cls = type(lm.layers[full_idx])
        norm_cls = type(lm.norm)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.mods = nn.ModuleDict(dict(
            fc=nn.Linear(2 * h, h, bias=False),
            pre_fc_norm_embedding=norm_cls(h, eps=eps),
            pre_fc_norm_hidden=norm_cls(h, eps=eps),
            layers=nn.ModuleList([layer_cls(cfg, 0)]),
            norm=norm_cls(h, eps=eps),
        )).float().eval()
        self.layer_cls, self.norm_cls = layer_cls.__name__, norm_cls.__name__

    def randomise(self, seed):
        import torch
        rules = {}
        with torch.no_grad():
            for name, p in sorted(self.mods.named_parameters(), key=lambda kv: kv[0]):
                g = torch.Generator().manual_seed(name_seed(seed, "mtp." + name))
                if p.dim() == 1 and "norm" in name:
                    v, rule = torch.rand(p.shape, generator=g) - 0.5, "U(-0.5,0.5) zero-centred w"
                elif p.dim() in (2, 3):
                    fan_in = p.shape[-1]
                    v = torch.randn(p.shape, generator=g) / math.sqrt(fan_in)
                    rule = f"N(0,1/sqrt({fan_in}))"
                else:
                    raise RuntimeError(f"no rule for mtp.{name} {tuple(p.shape)}")
                # bf16 first: the file holds these values and the reference computes with them
                p.copy_(v.to(torch.bfloat16).float())
                rules["mtp." + name] = (tuple(p.shape), rule)
        return rules

    def state_bf16(self):
        import torch
        return {"mtp." + k: v.detach().to(torch.bfloat16).contiguous().cpu()
                for k, v in self.mods.state_dict().items()}

    def to(self, dev):
        self.mods.to(dev)
        return self

    def forward(self, emb_next, hidden, pe, mask):
        """emb_next [B, T, H] = embed(token t+1); hidden [B, T, H]; -> post-norm [B, T, H]."""
        import torch
        m = self.mods
        x = torch.cat([m["pre_fc_norm_embedding"](emb_next),
                            m["pre_fc_norm_hidden"](hidden)], dim=-1)
        x = m["fc"](x)
        x = layer_out(m["layers"][0](x, position_embeddings=pe, attention_mask=mask))
        return m["norm"](x)


def mtp_rows(model, mtp, ids):
    """Teacher-forced MTP logits [n-1, V] and post-norm outputs, plus the main model's hidden."""
    import torch
    lm = model.model.language_model
    with torch.no_grad():
        hid = lm(input_ids=ids, use_cache=False).last_hidden_state  # final-normed
        n = ids.shape[1]
        t = n - 1
        pe = rope(lm, hid, t)
        out = mtp.forward(lm.embed_tokens(ids[:, 1:]), hid[:, :t], pe, causal_mask(t, hid.device))
        logits = model.lm_head(out)[0].float()
    return logits, out, hid


def chain(model, mtp, ids, steps):
    """Draft chain after the sequence: step 1 = the teacher-forced last row (h_{n-2}, token n-1);
    step j ≥ 2 at position n+j-3 takes the MTP's post-norm output of the previous row and the
    previous draft. Returns (drafts, logits rows [steps, V], max change of earlier rows)."""
    import torch
    lm = model.model.language_model
    with torch.no_grad():
        hid = lm(input_ids=ids, use_cache=False).last_hidden_state
        n = ids.shape[1]
        t = n - 1
        emb = lm.embed_tokens(ids[:, 1:])  # [1, t, H]
        hin = hid[:, :t]
        pe = rope(lm, hid, t)
        out = mtp.forward(emb, hin, pe, causal_mask(t, hid.device))
        rows = [model.lm_head(out[:, -1])[0].float()]
        drafts = [int(rows[0].argmax())]
        base = out
        drift = 0.0
        for j in range(1, steps):
            e_new = lm.embed_tokens(torch.tensor([[drafts[-1]]], device=ids.device))
            emb = torch.cat([emb, e_new], 1)
            hin = torch.cat([hin, out[:, -1:]], 1)
            tt = emb.shape[1]
            pe = rope(lm, hid, tt)
            out = mtp.forward(emb, hin, pe, causal_mask(tt, hid.device))
            drift = max(drift, float((out[:, :base.shape[1]] - base).abs().max()))
            rows.append(model.lm_head(out[:, -1])[0].float())
            drafts.append(int(rows[-1].argmax()))
    return drafts, torch.stack(rows), drift


def write_f32(path, t):
    import numpy as np
    a = t.detach().cpu().float().contiguous().numpy().astype("<f4")
    with open(path, "ab") as f:
        f.write(a.tobytes())
    return hashlib.sha256(a.tobytes()).hexdigest()


def row_stats(logits):
    import torch
    top2 = torch.topk(logits, 2, dim=-1).values
    return dict(argmax=[int(x) for x in logits.argmax(-1)],
                top2_margin=[round(float(x), 6) for x in (top2[:, 0] - top2[:, 1])])


def do_model(name, args, doc):
    import torch
    from safetensors.torch import save_file
    mdir = os.path.join(args.data, "models", name)
    with open(os.path.join(args.data, "ref", f"{name}.json")) as f:
        ref = json.load(f)
    seqs = {s["name"]: s["tokens"] for s in ref["sequences"]}
    model = load_fp32(mdir)
    lm = model.model.language_model
    log(f"[{name}] {type(model).__name__}; text layers {lm.config.layer_types}")
    try:  # informative: a failure is recorded, the MTP reference is still written
        calling_convention_check(model, torch.tensor([seqs["len65"]]))
    except Exception as e:
        check(False, f"{name}: calling-convention check raised {e!r}")
        log(traceback.format_exc())

    mtp = MTPHead(lm)
    rules = mtp.randomise(args.seed + (0 if name == "tiny-moe" else 1))
    log(f"[{name}] MTP head: {mtp.layer_cls} + {mtp.norm_cls}, {len(rules)} tensors")
    for k, (shape, rule) in rules.items():
        log(f"    {k:<58} {str(shape):<16} {rule}")
    st = mtp.state_bf16()
    st_path = os.path.join(args.out, f"{name}-mtp.safetensors")
    save_file(dict(sorted(st.items())), st_path, metadata={"format": "pt"})
    log(f"[{name}] wrote {st_path} ({os.path.getsize(st_path)} bytes)")

    lg_name = f"{name}.mtp.logits.f32"
    lg_path = os.path.join(args.out, lg_name)
    if os.path.exists(lg_path):
        os.remove(lg_path)
    ent = dict(model=name, mtp_file=f"{name}-mtp.safetensors", logits_file=lg_name,
               vocab=int(lm.config.vocab_size), sequences=[], chains=[],
               layer_class=mtp.layer_cls, norm_class=mtp.norm_cls)
    offset = 0
    cuda = torch.cuda.is_available() and args.cross_device
    for sname in SEQS:
        ids = torch.tensor([seqs[sname]])
        logits, out, _ = mtp_rows(model, mtp, ids)
        sha = write_f32(lg_path, logits)
        e = dict(name=sname, tokens=seqs[sname], rows=int(logits.shape[0]), row_offset=offset,
                 sha256=sha, max_abs_logit=float(logits.abs().max()),
                 logit_std=float(logits.std()), out_rms=float(out.pow(2).mean().sqrt()))
        e.update(row_stats(logits))
        offset += int(logits.shape[0])
        if cuda:
            try:
                mg, mc = copy.deepcopy(model).to("cuda"), copy.deepcopy(mtp).to("cuda")
                lc, _, _ = mtp_rows(mg, mc, ids.to("cuda"))
                e["cuda_vs_cpu_max_abs"] = float((lc.cpu() - logits).abs().max())
                mtp.to("cpu")
            except Exception as ex:
                log(f"  cuda cross-check failed: {ex!r}")
        ent["sequences"].append(e)
        log(f"[{name}] {sname}: {e['rows']} MTP rows, max|logit| {e['max_abs_logit']:.3f}, "
            f"logit std {e['logit_std']:.3f}, min top-2 margin {min(e['top2_margin']):.2e}"
            + (f", cuda vs cpu {e['cuda_vs_cpu_max_abs']:.2e}" if "cuda_vs_cpu_max_abs" in e else ""))
    for sname in CHAIN_SEQS:
        ids = torch.tensor([seqs[sname]])
        drafts, rows, drift = chain(model, mtp, ids, CHAIN_STEPS)
        tf, _, _ = mtp_rows(model, mtp, ids)
        d0 = float((rows[0] - tf[-1]).abs().max())
        check(d0 < 1e-5, f"{name} chain step 1 differs from the teacher-forced last row ({d0})")
        check(drift < 1e-5, f"{name} chain: earlier rows changed when rows were appended ({drift})")
        sha = write_f32(lg_path, rows)
        c = dict(seq=sname, n_tokens=len(seqs[sname]), steps=CHAIN_STEPS, drafts=drafts,
                 row_offset=offset, sha256=sha)
        c.update({"top2_margin": row_stats(rows)["top2_margin"]})
        offset += CHAIN_STEPS
        ent["chains"].append(c)
        log(f"[{name}] chain after {sname}: drafts {drafts}, margins {c['top2_margin']}")
    ent["total_rows"] = offset
    doc["models"].append(ent)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--data", default=os.path.join(here, "..", "tests", "data"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20250611)
    ap.add_argument("--no-cross-device", dest="cross_device", action="store_false")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import torch
    import transformers as tfm
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    log(f"[env] python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
        f"{tfm.__version__}, cuda {torch.cuda.is_available()}")
    doc = dict(computed_with=dict(transformers=tfm.__version__, torch=torch.__version__,
                                  device="cpu", dtype="float32", seed=args.seed,
                                  script="tools/mtp_reference.py",
                                  weights="bf16 mtp.* values, computed in fp32"),
               note="row t of a sequence's block: MTP logits at position t from h_t (final-normed "
                    "main hidden) and token t+1 (predicts token t+2), t = 0..n-2. chains: step 1 "
                    "= the last teacher-forced row; step j >= 2 at position n+j-3 feeds the MTP's "
                    "post-norm output of the previous row and the previous step's argmax draft.",
               models=[])
    for name in MODELS:
        try:
            do_model(name, args, doc)
        except Exception as e:
            FAILURES.append(f"{name}: {e!r}")
            log(f"[STAGE FAILED] {name}:\n{traceback.format_exc()}")
    doc["failures"] = FAILURES
    with open(os.path.join(args.out, "mtp_ref.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    log(f"[done] failures: {FAILURES}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
