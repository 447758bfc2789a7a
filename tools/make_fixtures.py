#!/usr/bin/env python3
"""make_fixtures.py — tiny random Qwen3.5 checkpoints + fp32 reference logits for deltaserve's tests.

Builds two tiny models with Hugging Face transformers' own classes (Qwen3_5MoeForConditionalGeneration
and Qwen3_5ForConditionalGeneration), fills every text weight with seeded random values (no term is
left at its zero/identity init), saves them in bf16, reloads the saved files in fp32 and records
teacher-forced logits and greedy continuations computed by transformers in fp32.

Outputs (under --out, default tests/data of this repo):
  models/tiny-moe          MoE, expert layout as transformers' save_pretrained writes it
  models/tiny-moe-fused    same weights, the other expert layout (fused 3-D or per-expert)
  models/tiny-moe-sharded  same as tiny-moe, saved in several shards + model.safetensors.index.json
  models/tiny-dense        dense SwiGLU MLP, tied embeddings
  ref/<model>.len<N>.logits.f32     little-endian f32 [N, vocab], teacher-forced, no cache
  ref/<model>.greedy<k>.logits.f32  little-endian f32 [48, vocab], teacher-forced logits that
                                    predict each generated token of greedy prompt k
  ref/<model>.json                  tokens, shapes, argmax / logsumexp / top-2 margin per position,
                                    greedy prompts and continuations, consistency numbers
Refs are written for tiny-moe and tiny-dense only; tiny-moe-fused and tiny-moe-sharded are asserted
here to give the same logits as tiny-moe and are listed in ref/tiny-moe.json "shared_by".

Needs torch + transformers (5.17 was used; see tests/data/models/README.md). Deterministic: all
randomness comes from torch.Generator objects seeded from --seed and the parameter name, and the
reference forward passes run in fp32 on the CPU (no TF32, no GPU kernel selection effects).
"""

import argparse
import hashlib
import inspect
import json
import math
import os
import re
import shutil
import struct
import sys
import tarfile
import zlib

SEQ_LENGTHS = [1, 2, 7, 63, 64, 65, 130, 300]
GREEDY_PROMPT_LENGTHS = [1, 9, 40]
GREEDY_NEW_TOKENS = 48

VOCAB = 512
HIDDEN = 64
LAYER_TYPES = ["linear_attention", "linear_attention", "full_attention",
               "linear_attention", "linear_attention", "full_attention"]
EOS_IDS = [511, 510]  # generation_config eos ids (two, like the released models)

TEXT_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=len(LAYER_TYPES),
    layer_types=LAYER_TYPES,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    hidden_act="silu",
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,  # rot_dim = 8
        "mrope_section": [2, 1, 1],     # sums to rot_dim / 2; text-only positions make it moot
        "mrope_interleaved": True,
    },
    attention_bias=False,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    eos_token_id=EOS_IDS[1],
)
TEXT_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=32)
TEXT_DENSE = dict(intermediate_size=96)
# Tiny vision tower: only there so the files carry model.visual.* tensors the engine must skip.
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
              patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
              out_hidden_size=HIDDEN, num_position_embeddings=16)

PER_EXPERT_RE = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
FUSED_RE = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


FAILURES = []


def log(*a):
    print(*a, flush=True)


def check(cond, msg):
    """A failed check is logged and makes the script exit non-zero at the end, after every other
    step has still run (one run on the GPU machine then reports all problems at once)."""
    if not cond:
        FAILURES.append(msg)
        log(f"[CHECK FAILED] {msg}")
    return bool(cond)


# ----------------------------------------------------------------------------- safetensors header
def st_header(path):
    """Parses a safetensors header without torch: {name: {dtype, shape, data_offsets}}."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    return hdr


def st_files(model_dir):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def dir_tensors(model_dir):
    out = {}
    for fn in st_files(model_dir):
        for k, v in st_header(os.path.join(model_dir, fn)).items():
            out[k] = (v["dtype"], v["shape"], fn)
    return out


def dir_size(d):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


# ----------------------------------------------------------------------------- transformers side
def dump_sources(path, tfm):
    """Writes the Qwen3.5 modeling/config sources and the weight-conversion code to `path`."""
    import importlib
    parts = []
    for mod in ["transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
                "transformers.models.qwen3_5_moe.configuration_qwen3_5_moe",
                "transformers.models.qwen3_5.modeling_qwen3_5",
                "transformers.models.qwen3_5.configuration_qwen3_5",
                "transformers.conversion_mapping"]:
        try:
            m = importlib.import_module(mod)
            parts.append(f"\n\n######## {mod} ({m.__file__})\n" + inspect.getsource(m))
        except Exception as e:  # keep going: the source dump is informational
            parts.append(f"\n\n######## {mod}: could not read: {e!r}\n")
    with open(path, "w") as f:
        f.write(f"transformers {tfm.__version__}\n" + "".join(parts))
    log(f"[source] wrote {path} ({os.path.getsize(path)} bytes)")


def make_config(kind):
    import transformers as tfm
    text = dict(TEXT_COMMON)
    if kind == "moe":
        text.update(TEXT_MOE)
        text["tie_word_embeddings"] = False
        cfg = tfm.Qwen3_5MoeConfig(text_config=text, vision_config=dict(VISION),
                                   tie_word_embeddings=False)
        cls = tfm.Qwen3_5MoeForConditionalGeneration
    else:
        text.update(TEXT_DENSE)
        text["tie_word_embeddings"] = True
        cfg = tfm.Qwen3_5Config(text_config=text, vision_config=dict(VISION),
                                tie_word_embeddings=True)
        cls = tfm.Qwen3_5ForConditionalGeneration
    return cls, cfg


def build_model(kind, seed):
    import torch
    cls, cfg = make_config(kind)
    torch.manual_seed(seed)
    try:
        model = cls._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    except TypeError:
        cfg._attn_implementation = "eager"
        model = cls(cfg)
    return model.float().eval()


def name_seed(seed, name):
    return (seed * 1000003 + zlib.crc32(name.encode())) & 0x7FFFFFFF


def randomise_text_weights(model, seed):
    """Gives every text parameter a seeded random value so no term is zero or identity.

    Matrices ~ N(0, 1/sqrt(fan_in)) keep activations O(1); zero-centred RMSNorm weights (stored w,
    applied as 1+w) ~ U(-0.5, 0.5); the GDN gated norm (plain w) ~ U(0.5, 1.5); A_log, dt_bias ~
    U(-1, 1). Vision parameters keep transformers' init. Returns {name: rule} for the log."""
    import torch
    rules = {}
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            g = torch.Generator().manual_seed(name_seed(seed, name))
            shape = p.shape
            if "visual" in name:
                # Not used by the engine (skipped), but seeded so the files are reproducible.
                p.copy_(torch.randn(shape, generator=g) * 0.02)
                continue

            def normal(std):
                return torch.randn(shape, generator=g, dtype=torch.float32) * std

            def uniform(lo, hi):
                return torch.rand(shape, generator=g, dtype=torch.float32) * (hi - lo) + lo

            leaf = name.split(".")[-2:] if name.endswith(".weight") else name.split(".")[-1:]
            if name.endswith("A_log"):
                v, rule = uniform(-1, 1), "U(-1,1)"
            elif name.endswith("dt_bias"):
                v, rule = uniform(-1, 1), "U(-1,1)"
            elif name.endswith("linear_attn.norm.weight"):
                v, rule = uniform(0.5, 1.5), "U(0.5,1.5) plain gated-norm w"
            elif p.dim() == 1 and ("norm" in name):
                v, rule = uniform(-0.5, 0.5), "U(-0.5,0.5) zero-centred norm w"
            elif name.endswith("conv1d.weight"):
                v, rule = normal(1.0 / math.sqrt(shape[-1])), f"N(0,1/sqrt({shape[-1]}))"
            elif name.endswith("embed_tokens.weight"):
                # tied: the same matrix is the lm_head; σ 0.5 keeps the logits' spread moderate.
                std = 0.5 if tied else 1.0
                v, rule = normal(std), f"N(0,{std})"
            elif name.endswith("lm_head.weight"):
                v, rule = normal(2.0 / math.sqrt(shape[-1])), f"N(0,2/sqrt({shape[-1]}))"
            elif p.dim() in (2, 3):
                fan_in = shape[-1]
                v, rule = normal(1.0 / math.sqrt(fan_in)), f"N(0,1/sqrt({fan_in}))"
            else:
                raise RuntimeError(f"no randomisation rule for text parameter {name} {tuple(shape)}")
            p.copy_(v.to(p.dtype))
            rules[name] = (tuple(shape), rule, leaf)
        if tied:
            out_emb = model.get_output_embeddings().weight
            in_emb = model.get_input_embeddings().weight
            check(out_emb.data_ptr() == in_emb.data_ptr(), "tied lm_head is not the embedding")
    return rules


def find_text_model(model):
    for name, m in model.named_modules():
        if hasattr(m, "layers") and hasattr(m, "embed_tokens"):
            return name, m
    raise RuntimeError("no text model (module with .layers and .embed_tokens) found")


def activation_stats(model, ids):
    """Per-layer residual / mixer / FFN output stats for one forward pass (fp32)."""
    import torch
    _, tm = find_text_model(model)
    rec = {}
    hooks = []

    def hook(key):
        def f(_m, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            if torch.is_tensor(t):
                rec[key] = t.detach().float()
        return f

    hooks.append(tm.embed_tokens.register_forward_hook(hook("embed")))
    for i, layer in enumerate(tm.layers):
        hooks.append(layer.register_forward_hook(hook(f"L{i}.out")))
        mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
        hooks.append(mixer.register_forward_hook(hook(f"L{i}.mixer")))
        hooks.append(layer.mlp.register_forward_hook(hook(f"L{i}.ffn")))
        if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts"):
            hooks.append(layer.mlp.gate.register_forward_hook(hook(f"L{i}.router")))
        if hasattr(layer.mlp, "shared_expert_gate"):
            hooks.append(layer.mlp.shared_expert_gate.register_forward_hook(hook(f"L{i}.sh_gate")))
    hooks.append(tm.norm.register_forward_hook(hook("final_norm")))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits.float()
    finally:
        for h in hooks:
            h.remove()
    rec["logits"] = logits[0]
    rows = []
    top_k = getattr(find_text_model(model)[1].config, "num_experts_per_tok", 0)
    for k in [k for k in rec if k.endswith(".router")]:
        # router output: logits [T, E] (first element of the router's tuple)
        r = rec.pop(k)
        r = r.reshape(-1, r.shape[-1])
        use = torch.bincount(torch.topk(r, top_k, -1).indices.flatten(), minlength=r.shape[-1])
        log(f"  {k}: tokens per expert (top-{top_k} of {r.shape[-1]}) {use.tolist()}")
    for k in [k for k in rec if k.endswith(".sh_gate")]:
        sg = torch.sigmoid(rec.pop(k))
        log(f"  {k}: sigmoid(shared_expert_gate) min {float(sg.min()):.3f} mean "
            f"{float(sg.mean()):.3f} max {float(sg.max()):.3f}")
    for k, t in rec.items():
        rows.append(dict(name=k, mean=float(t.mean()), std=float(t.std()),
                         absmax=float(t.abs().max()), rms=float(t.pow(2).mean().sqrt())))
    return rows


def print_stats(title, rows):
    log(f"[stats] {title}")
    log(f"  {'tensor':<12} {'mean':>10} {'std':>10} {'rms':>10} {'absmax':>10}")
    for r in rows:
        log(f"  {r['name']:<12} {r['mean']:>10.4f} {r['std']:>10.4f} {r['rms']:>10.4f} {r['absmax']:>10.4f}")


def save_kwargs(model, **want):
    sig = inspect.signature(model.save_pretrained).parameters
    return {k: v for k, v in want.items() if k in sig}


def write_generation_config(model_dir):
    import transformers as tfm
    gc = tfm.GenerationConfig(eos_token_id=list(EOS_IDS), pad_token_id=EOS_IDS[1], do_sample=False)
    gc.save_pretrained(model_dir)


def save_model(model, model_dir, max_shard_size=None):
    import torch
    if os.path.exists(model_dir):
        shutil.rmtree(model_dir)
    m = model.to(torch.bfloat16)
    # Note: text_config/vision_config keep "dtype": "float32" (the dtype the model was built
    # with); only the top-level "dtype" says bfloat16. Readers must take dtypes from the
    # safetensors headers. Left as is so a rerun reproduces the committed files byte for byte.
    kw = save_kwargs(m, safe_serialization=True)
    if max_shard_size is not None:
        kw["max_shard_size"] = max_shard_size
    m.save_pretrained(model_dir, **kw)
    model.float()
    write_generation_config(model_dir)


def expert_layout(tensors):
    per = any(PER_EXPERT_RE.match(k) for k in tensors)
    fused = any(FUSED_RE.match(k) for k in tensors)
    if per and fused:
        return "mixed"
    return "per-expert" if per else ("fused" if fused else "none")


def load_st(model_dir):
    from safetensors.torch import load_file
    out = {}
    for fn in st_files(model_dir):
        out.update(load_file(os.path.join(model_dir, fn)))
    return out


def rewrite_experts(src_dir, dst_dir):
    """Writes src_dir's weights into dst_dir with the other expert layout. Returns the new layout."""
    import torch
    from safetensors.torch import save_file
    tensors = load_st(src_dir)
    layout = expert_layout(tensors)
    out = {}
    if layout == "per-expert":
        groups = {}
        for k, v in tensors.items():
            m = PER_EXPERT_RE.match(k)
            if m:
                groups.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = v
            else:
                out[k] = v
        for prefix, experts in groups.items():
            n = len(experts)
            assert sorted(experts) == list(range(n)), f"{prefix}: experts not 0..{n - 1}"
            # [E, 2I, H]: per expert, the I gate rows then the I up rows.
            out[f"{prefix}.gate_up_proj"] = torch.stack(
                [torch.cat([experts[e]["gate_proj"], experts[e]["up_proj"]], 0) for e in range(n)]).contiguous()
            out[f"{prefix}.down_proj"] = torch.stack(
                [experts[e]["down_proj"] for e in range(n)]).contiguous()  # [E, H, I]
        new_layout = "fused"
    elif layout == "fused":
        for k, v in tensors.items():
            m = FUSED_RE.match(k)
            if not m:
                out[k] = v
                continue
            prefix, what = m.group(1), m.group(2)
            for e in range(v.shape[0]):
                if what == "gate_up_proj":
                    inter = v.shape[1] // 2
                    out[f"{prefix}.{e}.gate_proj.weight"] = v[e, :inter].contiguous()
                    out[f"{prefix}.{e}.up_proj.weight"] = v[e, inter:].contiguous()
                else:
                    out[f"{prefix}.{e}.down_proj.weight"] = v[e].contiguous()
        new_layout = "per-expert"
    else:
        raise RuntimeError(f"{src_dir}: unexpected expert layout {layout}")
    # Released checkpoints keep some small tensors in f32; store A_log as F32 here (same
    # bf16-representable values, so the reference logits do not change) so the engine's
    # mixed-dtype path is exercised.
    for k in list(out):
        if k.endswith(".A_log"):
            out[k] = out[k].float()
    if os.path.exists(dst_dir):
        shutil.rmtree(dst_dir)
    os.makedirs(dst_dir)
    save_file(dict(sorted(out.items())), os.path.join(dst_dir, "model.safetensors"),
              metadata={"format": "pt"})
    for fn in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(src_dir, fn), os.path.join(dst_dir, fn))
    return new_layout


def load_fp32(model_dir, device):
    import torch
    import transformers as tfm
    with open(os.path.join(model_dir, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    cls = getattr(tfm, arch)
    model = cls.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    return model.to(device).eval()


def check_loaded_matches_files(model, model_dir):
    """The fp32 model must hold exactly the saved (bf16) values upcast; no key may be dropped."""
    import torch
    files = load_st(model_dir)
    sd = model.state_dict()
    layout = expert_layout(files)
    checked = 0
    covered = set()
    for k, v in files.items():
        if layout == "per-expert" and PER_EXPERT_RE.match(k):
            m = PER_EXPERT_RE.match(k)
            e, what = int(m.group(2)), m.group(3)
            if f"{m.group(1)}.gate_up_proj" in sd:
                gu = sd[f"{m.group(1)}.gate_up_proj"]
                inter = gu.shape[1] // 2
                mine = {"gate_proj": gu[e, :inter], "up_proj": gu[e, inter:],
                        "down_proj": sd[f"{m.group(1)}.down_proj"][e]}[what]
            else:
                mine = sd[k]
        elif k in sd:
            mine = sd[k]
        else:
            check(False, f"{model_dir}: file tensor {k} not in the loaded model "
                         f"(model keys e.g. {sorted(sd)[:4]})")
            continue
        check(mine.dtype == torch.float32, f"{model_dir}: {k} loaded as {mine.dtype}")
        check(torch.equal(mine.cpu().float(), v.float()), f"{model_dir}: {k} differs from the file")
        checked += 1
        m = PER_EXPERT_RE.match(k)
        covered.add(f"{m.group(1)}.{'down_proj' if m.group(3) == 'down_proj' else 'gate_up_proj'}"
                    if m and f"{m.group(1)}.gate_up_proj" in sd else k)
    # Every model parameter must come from the files: transformers would otherwise initialise
    # a missing one at random (with only a warning) and the reference would be meaningless.
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    missing = [k for k in sd if k not in covered and not (tied and k == "lm_head.weight")]
    check(not missing, f"{model_dir}: model parameters not in the files: {missing[:8]}")
    return checked


def forward_logits(model, ids):
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=model.device), use_cache=False)
    return out.logits[0].float()


def row_stats(logits):
    import torch
    l64 = logits.double()
    top2 = torch.topk(logits, 2, dim=-1).values
    return dict(argmax=[int(x) for x in logits.argmax(-1)],
                logsumexp=[float(x) for x in torch.logsumexp(l64, -1)],
                top2_margin=[float(x) for x in (top2[:, 0] - top2[:, 1])])


def write_f32(path, t):
    import numpy as np
    a = t.detach().cpu().float().contiguous().numpy().astype("<f4")
    a.tofile(path)
    return hashlib.sha256(a.tobytes()).hexdigest()


def token_seq(seed, n, tag):
    import torch
    g = torch.Generator().manual_seed(name_seed(seed, f"{tag}{n}"))
    return [int(x) for x in torch.randint(0, VOCAB, (n,), generator=g)]


def greedy(model, prompt):
    """transformers' cached greedy decode; returns generated ids and raw per-step logits [n, V]."""
    import torch
    import transformers as tfm
    # Model-level defaults fill unset fields of a passed GenerationConfig, so the eos ids are
    # removed from the model's own config as well: all GREEDY_NEW_TOKENS tokens are produced.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    gc = tfm.GenerationConfig(do_sample=False, max_new_tokens=GREEDY_NEW_TOKENS,
                              min_new_tokens=0, eos_token_id=None, pad_token_id=None,
                              use_cache=True, num_beams=1)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt], device=model.device),
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long,
                                                       device=model.device),
                             generation_config=gc, return_dict_in_generate=True,
                             output_scores=True, output_logits=True)
    gen = [int(x) for x in out.sequences[0, len(prompt):]]
    logits = torch.stack([s[0].float() for s in out.logits])
    check(len(gen) == GREEDY_NEW_TOKENS, f"generate stopped after {len(gen)} tokens")
    return gen, logits


def rel_err(a, b):
    d = (a - b).abs()
    return float(d.max()), float((d.max(-1).values / b.abs().max(-1).values).max())


def make_refs(name, model_dir, ref_dir, seed, device, shared_by, tfm_version, torch_version,
              cross_device=None):
    import torch
    model = load_fp32(model_dir, device)
    n_checked = check_loaded_matches_files(model, model_dir)
    log(f"[ref] {name}: fp32 reload holds exactly the file values ({n_checked} tensors checked)")
    doc = dict(model=name, shared_by=shared_by, vocab=VOCAB,
               format="little-endian float32, row-major [n_tokens, vocab]",
               computed_with=dict(transformers=tfm_version, torch=torch_version, device=str(device),
                                  dtype="float32", attn_implementation="eager",
                                  weights="bf16 files upcast to float32", seed=seed,
                                  script="tools/make_fixtures.py"),
               sequences=[], greedy=[])
    cross = None
    if cross_device is not None:
        try:
            cross = load_fp32(model_dir, cross_device)
        except Exception as e:
            log(f"[ref] {name}: no cross-check on {cross_device}: {e!r}")
    for n in SEQ_LENGTHS:
        ids = token_seq(seed, n, "seq")
        logits = forward_logits(model, ids)
        assert logits.shape == (n, VOCAB), logits.shape
        assert torch.isfinite(logits).all()
        fn = f"{name}.len{n}.logits.f32"
        sha = write_f32(os.path.join(ref_dir, fn), logits)
        ent = dict(name=f"len{n}", file=fn, sha256=sha, tokens=ids, shape=[n, VOCAB],
                   max_abs_logit=float(logits.abs().max()))
        ent.update(row_stats(logits))
        if cross is not None:
            lc = forward_logits(cross, ids).to(logits.device)
            ent["cross_device_max_abs_diff"] = float((lc - logits).abs().max())
        doc["sequences"].append(ent)
        mm = min(ent["top2_margin"])
        log(f"[ref] {name} len{n}: max|logit| {ent['max_abs_logit']:.3f}  min top-2 margin {mm:.2e}"
            + (f"  {cross_device} vs {device} max|diff| {ent['cross_device_max_abs_diff']:.2e}"
               if cross is not None else ""))
    for k, plen in enumerate(GREEDY_PROMPT_LENGTHS):
        prompt = token_seq(seed, plen, "prompt")
        gen, gen_logits = greedy(model, prompt)
        full = forward_logits(model, prompt + gen)
        tf = full[plen - 1: plen - 1 + GREEDY_NEW_TOKENS]  # row i predicts gen[i]
        abs_e, rel_e = rel_err(gen_logits.to(tf.device), tf)
        tf_argmax = [int(x) for x in tf.argmax(-1)]
        st = row_stats(gen_logits)
        check(st["argmax"] == gen, f"{name} greedy{k}: a token is not the argmax of its step logits")
        fn = f"{name}.greedy{k}.logits.f32"
        sha = write_f32(os.path.join(ref_dir, fn), tf)
        doc["greedy"].append(dict(
            name=f"greedy{k}", prompt=prompt, generated=gen,
            top2_margin=st["top2_margin"],
            logits_file=fn, logits_sha256=sha, logits_shape=[GREEDY_NEW_TOKENS, VOCAB],
            logits_note="teacher-forced no-cache logits of prompt+generated at positions "
                        "len(prompt)-1 .. len(prompt)+46: row i predicts generated[i]",
            teacher_forced_argmax_equals_generated=(tf_argmax == gen),
            cached_vs_uncached_max_abs=abs_e, cached_vs_uncached_max_rel=rel_e))
        log(f"[greedy] {name} prompt{k} (len {plen}): cached-decode vs no-cache forward "
            f"max|diff| {abs_e:.3e}, max rel (per row, / max|logit|) {rel_e:.3e}; "
            f"argmax equal: {tf_argmax == gen}; min margin {min(st['top2_margin']):.2e}")
        log(f"         generated: {gen}")
    with open(os.path.join(ref_dir, f"{name}.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return model


def same_weights(dir_a, dir_b):
    """Tensor-level check that two directories hold the same weights in either expert layout."""
    import torch

    def canonical(d):
        out = {}
        for k, v in load_st(d).items():
            m = FUSED_RE.match(k)
            if m and m.group(2) == "gate_up_proj":
                inter = v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[f"{m.group(1)}.{e}.gate_proj.weight"] = v[e, :inter]
                    out[f"{m.group(1)}.{e}.up_proj.weight"] = v[e, inter:]
            elif m:
                for e in range(v.shape[0]):
                    out[f"{m.group(1)}.{e}.down_proj.weight"] = v[e]
            else:
                out[k] = v
        return out
    a, b = canonical(dir_a), canonical(dir_b)
    if not check(sorted(a) == sorted(b), f"{dir_a} vs {dir_b}: tensor names differ: "
                 f"{sorted(set(a) ^ set(b))[:6]}"):
        return 0
    for k in a:
        check(torch.equal(a[k].float(), b[k].float()), f"{dir_a} vs {dir_b}: {k} differs")
    return len(a)


def assert_same_logits(name, model_dir, base_model, base_dir, seed, device):
    n_same = same_weights(base_dir, model_dir)
    log(f"[share] {name}: {n_same} tensors equal tiny-moe's (canonical per-expert view)")
    try:
        other = load_fp32(model_dir, device)
        n_checked = check_loaded_matches_files(other, model_dir)
    except Exception as e:
        # The files are verified tensor by tensor above; transformers just cannot read this layout.
        log(f"[share] {name}: transformers cannot load it faithfully ({e!r}); weights verified only")
        return None
    worst = 0.0
    for n in SEQ_LENGTHS:
        ids = token_seq(seed, n, "seq")
        a = forward_logits(base_model, ids)
        b = forward_logits(other, ids)
        worst = max(worst, float((a - b).abs().max()))
    log(f"[share] {name}: {n_checked} tensors equal the files; max|logit diff| vs tiny-moe {worst:.3e}")
    check(worst <= 1e-5, f"{name} does not reproduce tiny-moe's logits ({worst})")
    return worst


def describe_dir(name, d):
    t = dir_tensors(d)
    log(f"[layout] {name}: files {sorted(os.listdir(d))}, {len(t)} tensors, "
        f"{dir_size(d)} bytes, experts: {expert_layout(t)}")
    return t


def print_tensor_groups(t):
    def show(title, pred):
        log(f"  -- {title}")
        for k in sorted(k for k in t if pred(k)):
            dt, shape, fn = t[k]
            log(f"     {k:<70} {dt:<5} {shape}  ({fn})")
    show("top level / non-layer text tensors", lambda k: ".layers." not in k and "visual" not in k)
    show("layer 0 (GDN)", lambda k: ".layers.0." in k)
    show("layer 2 (attention)", lambda k: ".layers.2." in k)
    vis = sorted(k for k in t if "visual" in k)
    log(f"  -- {len(vis)} vision tensors, e.g. {vis[:3]}")


def stage(title, fn, *a, **kw):
    """Runs one step; an exception is logged as a failure and the remaining steps still run."""
    import traceback
    try:
        return fn(*a, **kw)
    except Exception as e:
        FAILURES.append(f"{title}: {e!r}")
        log(f"[STAGE FAILED] {title}:\n{traceback.format_exc()}")
        return None


def build_and_save(kind, name, seed, mdir, results):
    import torch
    model = build_model(kind, seed)
    log(f"[build] {name}: {type(model).__name__}, attn "
        f"{getattr(model.config, '_attn_implementation', '?')}")
    rules = randomise_text_weights(model, seed + (0 if kind == "moe" else 1))
    log(f"[build] {name}: randomised {len(rules)} text parameters")
    for k, (shape, rule, _) in rules.items():
        if ".layers." not in k or ".layers.0." in k or ".layers.2." in k:
            log(f"     {k:<66} {str(shape):<16} {rule}")
    n_text = sum(p.numel() for k, p in model.named_parameters() if "visual" not in k)
    n_all = sum(p.numel() for p in model.parameters())
    log(f"[build] {name}: {n_text} text parameters, {n_all - n_text} vision parameters")
    probe = torch.tensor([token_seq(seed, 300, "seq")])
    stage(f"stats {name}", lambda: print_stats(
        f"{name} fp32 random weights (before bf16 rounding), 300 tokens",
        activation_stats(model, probe)))

    d = os.path.join(mdir, name)
    save_model(model, d)
    t = describe_dir(name, d)
    print_tensor_groups(t)
    with open(os.path.join(d, "config.json")) as f:
        log(f"[config] {name}/config.json:\n{f.read()}")
    with open(os.path.join(d, "generation_config.json")) as f:
        log(f"[config] {name}/generation_config.json:\n{f.read()}")
    results[name] = dict(layout=expert_layout(t))
    if kind == "moe":
        sd = os.path.join(mdir, "tiny-moe-sharded")
        save_model(model, sd, max_shard_size="300KB")
        describe_dir("tiny-moe-sharded", sd)
        check(os.path.exists(os.path.join(sd, "model.safetensors.index.json")), "not sharded")
        fd = os.path.join(mdir, "tiny-moe-fused")
        new_layout = rewrite_experts(d, fd)
        ft = describe_dir("tiny-moe-fused", fd)
        log(f"[layout] tiny-moe-fused is the {new_layout} layout; tensors of layer 0 MoE:")
        for k in sorted(k for k in ft if ".layers.0.mlp" in k):
            log(f"     {k:<70} {ft[k][0]:<5} {ft[k][1]}")
        results["tiny-moe-fused"] = dict(layout=new_layout)


def reload_stats(name, d, seed, device):
    import torch
    m = load_fp32(d, device)
    print_stats(f"{name} reloaded (bf16 values in fp32), 300 tokens",
                activation_stats(m, torch.tensor([token_seq(seed, 300, "seq")], device=m.device)))


def compare_trees(new_root, old_root):
    """Byte-for-byte comparison of models/ and ref/ with an earlier run's output."""
    same, differ, absent = 0, [], []
    for sub in ("models", "ref"):
        for r, _, fs in os.walk(os.path.join(new_root, sub)):
            for fn in fs:
                rel = os.path.relpath(os.path.join(r, fn), new_root)
                old = os.path.join(old_root, rel)
                if not os.path.exists(old):
                    absent.append(rel)
                    continue
                with open(os.path.join(new_root, rel), "rb") as a, open(old, "rb") as b:
                    if a.read() == b.read():
                        same += 1
                    else:
                        differ.append(rel)
    log(f"[compare] vs {old_root}: {same} identical, differing: {sorted(differ)}, "
        f"not in the old tree: {sorted(absent)}")
    return differ


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data"),
                    help="root that receives models/ and ref/ (default: tests/data)")
    ap.add_argument("--seed", type=int, default=20250521)
    ap.add_argument("--device", default="cpu", help="device of the reference forward passes")
    ap.add_argument("--cross-device", default="auto",
                    help="second device for a cross-check ('auto': cuda when present, 'none')")
    ap.add_argument("--tar", default=None, help="also pack models/ and ref/ into this .tgz")
    ap.add_argument("--source-out", default=None, help="write transformers' Qwen3.5 source here")
    ap.add_argument("--compare-to", default=None,
                    help="compare every written file byte for byte with this earlier output root "
                         "(determinism check)")
    args = ap.parse_args()

    import torch
    import transformers as tfm
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    log(f"[env] python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
        f"{tfm.__version__}, cuda available {torch.cuda.is_available()}")
    try:
        from transformers.utils import import_utils as iu
        for fn in ("is_flash_linear_attention_available", "is_causal_conv1d_available",
                   "is_kernels_available"):
            if hasattr(iu, fn):
                log(f"[env] {fn}: {getattr(iu, fn)()}")
    except Exception as e:
        log(f"[env] could not query optional kernels: {e!r}")
    if args.source_out:
        dump_sources(args.source_out, tfm)
    log(f"[env] save_pretrained params: {list(inspect.signature(tfm.PreTrainedModel.save_pretrained).parameters)}")

    cross_device = None
    if args.cross_device == "auto":
        cross_device = "cuda" if torch.cuda.is_available() and args.device != "cuda" else None
    elif args.cross_device != "none":
        cross_device = args.cross_device

    out = os.path.abspath(args.out)
    mdir = os.path.join(out, "models")
    rdir = os.path.join(out, "ref")
    os.makedirs(mdir, exist_ok=True)
    if os.path.exists(rdir):
        for fn in os.listdir(rdir):
            if fn.endswith(".f32") or fn.endswith(".json"):
                os.remove(os.path.join(rdir, fn))
    os.makedirs(rdir, exist_ok=True)

    results = {}
    for kind, name in (("moe", "tiny-moe"), ("dense", "tiny-dense")):
        stage(f"build {name}", build_and_save, kind, name, args.seed, mdir, results)
    for name in ("tiny-moe", "tiny-dense"):
        stage(f"reload {name}", reload_stats, name, os.path.join(mdir, name), args.seed, args.device)

    shared = ["tiny-moe", "tiny-moe-fused", "tiny-moe-sharded"]
    base = stage("refs tiny-moe", make_refs, "tiny-moe", os.path.join(mdir, "tiny-moe"), rdir,
                 args.seed, args.device, shared, tfm.__version__, torch.__version__, cross_device)
    if base is not None:
        for other in ("tiny-moe-sharded", "tiny-moe-fused"):
            results.setdefault(other, {})["max_diff"] = stage(
                f"share {other}", assert_same_logits, other, os.path.join(mdir, other), base,
                os.path.join(mdir, "tiny-moe"), args.seed, args.device)
    del base
    stage("refs tiny-dense", make_refs, "tiny-dense", os.path.join(mdir, "tiny-dense"), rdir,
          args.seed, args.device, ["tiny-dense"], tfm.__version__, torch.__version__, cross_device)

    log("[sizes]")
    for sub in ("models", "ref"):
        base_dir = os.path.join(out, sub)
        for r, _, fs in sorted(os.walk(base_dir)):
            for fn in sorted(fs):
                p = os.path.join(r, fn)
                log(f"  {os.path.relpath(p, out):<55} {os.path.getsize(p):>9}")
    log(f"  total models {dir_size(mdir)} bytes, ref {dir_size(rdir)} bytes")
    log(f"[done] {json.dumps(results)}")

    if args.compare_to:
        stage("compare", compare_trees, out, os.path.abspath(args.compare_to))

    if args.tar:
        with tarfile.open(args.tar, "w:gz") as tf:
            tf.add(mdir, arcname="models")
            tf.add(rdir, arcname="ref")
        log(f"[tar] {args.tar} {os.path.getsize(args.tar)} bytes")
    if FAILURES:
        log(f"[FAILED] {len(FAILURES)} checks failed:")
        for f in FAILURES:
            log(f"  - {f}")
        sys.exit(1)
    log("[ok] all checks passed")


if __name__ == "__main__":
    main()
