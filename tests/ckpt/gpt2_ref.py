#!/usr/bin/env python3
"""Checks a folder written by `examples/gpt --save_dir DIR` against Hugging Face GPT-2.

    gpt2_ref.py DIR IDS.npy LOGITS.npy [--mutate act|scale|tie]
    gpt2_ref.py probe DIR NEWDIR

DIR holds config.json and model.safetensors; IDS.npy (int32 [B, T]) and LOGITS.npy (float32
[B, T, V]) are what tests/progs/gpt_logits computed with accel's nn GPT on those weights.

1. An independent numpy (float64) implementation of transformers' GPT2LMHeadModel forward pass,
   configured only from config.json: wte + wpe, pre-LN blocks (ln_1, c_attn, causal attention
   with 1/sqrt(head_dim) scaling, c_proj, ln_2, c_fc, activation, c_proj), ln_f, lm_head (tied
   to wte or separate per tie_word_embeddings). Conv1D weights are [in, out] (y = x W + b). The
   activation is config.activation_function: "gelu" the exact erf form, "gelu_new" the tanh
   form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). LayerNorm uses layer_norm_epsilon.
   The file's tensor names must be exactly the ones GPT2LMHeadModel loads (no missing, no
   unexpected; lm_head.weight only when untied).
2. If torch and transformers import, also GPT2LMHeadModel.from_pretrained(DIR) in eval mode.

Tolerance: max |accel - reference| <= 1e-4 * max(1, max |reference|), i.e. 1e-4 relative to
the largest logit. accel computes in float32 (errors ~1e-6 relative at these sizes), the
reference in float64.

--mutate deliberately breaks the reference (swaps the GELU form, leaves attention unscaled, or
flips tie_word_embeddings' meaning for the head); the test runs it to show that the comparison
detects such differences: the script then exits 1 with "MISMATCH". The GELU forms differ too
little on ordinary weights; `probe` writes a copy of a folder on which they do not.
"""
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

TOL = 1e-4


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x, form):
    if form == "gelu":
        erf = np.vectorize(math.erf)
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    if form == "gelu_new":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    raise SystemExit(f"gpt2_ref: activation_function {form!r} is not one GPT-2 uses here")


def expected_names(cfg, tied):
    names = ["transformer.wte.weight", "transformer.wpe.weight",
             "transformer.ln_f.weight", "transformer.ln_f.bias"]
    for i in range(cfg["n_layer"]):
        for m in ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"]:
            names += [f"transformer.h.{i}.{m}.weight", f"transformer.h.{i}.{m}.bias"]
    if not tied:
        names.append("lm_head.weight")
    return set(names)


def forward(cfg, sd, ids, mutate=None):
    """GPT2LMHeadModel's logits for ids [B, T], in float64."""
    f = {k: v.astype(np.float64) for k, v in sd.items()}
    B, T = ids.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    D = C // H
    eps = cfg["layer_norm_epsilon"]
    act = cfg["activation_function"]
    if mutate == "act":
        act = "gelu" if act == "gelu_new" else "gelu_new"
    scale = 1.0 if mutate == "scale" else 1.0 / math.sqrt(D)
    tied = cfg.get("tie_word_embeddings", True)
    if mutate == "tie":
        tied = not tied
    x = f["transformer.wte.weight"][ids] + f["transformer.wpe.weight"][np.arange(T)][None]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = layer_norm(x, f[p + "ln_1.weight"], f[p + "ln_1.bias"], eps)
        qkv = h @ f[p + "attn.c_attn.weight"] + f[p + "attn.c_attn.bias"]  # Conv1D [in, out]
        q, k, v = np.split(qkv, 3, axis=-1)
        q, k, v = (t.reshape(B, T, H, D).transpose(0, 2, 1, 3) for t in (q, k, v))
        att = (q @ k.transpose(0, 1, 3, 2)) * scale
        att = np.where(causal, att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ f[p + "attn.c_proj.weight"] + f[p + "attn.c_proj.bias"]
        h = layer_norm(x, f[p + "ln_2.weight"], f[p + "ln_2.bias"], eps)
        h = gelu(h @ f[p + "mlp.c_fc.weight"] + f[p + "mlp.c_fc.bias"], act)
        x = x + h @ f[p + "mlp.c_proj.weight"] + f[p + "mlp.c_proj.bias"]
    x = layer_norm(x, f["transformer.ln_f.weight"], f["transformer.ln_f.bias"], eps)
    if tied or "lm_head.weight" not in f:
        head = f["transformer.wte.weight"]
    else:
        head = f["lm_head.weight"]
    return x @ head.T  # nn.Linear: weight [vocab, C]


def compare(what, ours, ref):
    err = float(np.abs(ours.astype(np.float64) - ref).max())
    bound = TOL * max(1.0, float(np.abs(ref).max()))
    ok = err <= bound
    print(f"gpt2_ref: {what}: max |diff| {err:.3e} (bound {bound:.3e}, max |logit| "
          f"{float(np.abs(ref).max()):.3f}) {'ok' if ok else 'MISMATCH'}")
    return ok


def probe(src, dst):
    """Copies the folder src to dst, written by the reference safetensors writer (so accel also
    reads a file Python wrote), with every MLP turned into a probe of the GELU form: c_fc.bias
    = -2.5 puts the pre-activations near -2.5, where the exact and the tanh GELU differ by ~3%
    (elsewhere by at most 4.7e-4 in value, which a briefly trained model shows as ~1e-6 in
    the logits, too little for an fp32 tolerance), and c_proj.weight x 300 makes the MLP outputs
    dominate the residual stream, so the logits depend on the GELU form by ~1e-2 relative.
    (Further left the forms differ more, but fp32's 1 + erf(x/sqrt 2) cancels badly there.)"""
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "config.json")) as fh:
        cfg = fh.read()
    with open(os.path.join(dst, "config.json"), "w") as fh:
        fh.write(cfg)
    sd = load_file(os.path.join(src, "model.safetensors"))
    for k in sd:
        if k.endswith("mlp.c_fc.bias"):
            sd[k] = np.full_like(sd[k], -2.5)
        elif k.endswith("mlp.c_proj.weight"):
            sd[k] = (sd[k] * np.float32(300.0)).astype(np.float32)
    save_file(sd, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def main():
    args = sys.argv[1:]
    if args and args[0] == "probe":
        probe(args[1], args[2])
        return
    mutate = None
    if "--mutate" in args:
        i = args.index("--mutate")
        mutate = args[i + 1]
        del args[i:i + 2]
    if len(args) != 3:
        raise SystemExit(__doc__)
    d, ids_path, logits_path = args
    with open(os.path.join(d, "config.json")) as fh:
        cfg = json.load(fh)
    if cfg.get("model_type") != "gpt2" or cfg.get("architectures") != ["GPT2LMHeadModel"]:
        raise SystemExit(f"gpt2_ref: {d}/config.json is not a GPT2LMHeadModel config")
    if cfg.get("n_inner") not in (None, 4 * cfg["n_embd"]):
        raise SystemExit("gpt2_ref: n_inner must be null (4 n_embd)")
    for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if cfg.get(key, False):
            raise SystemExit(f"gpt2_ref: {key} must be false")
    sd = load_file(os.path.join(d, "model.safetensors"))
    tied = cfg.get("tie_word_embeddings", True)
    want = expected_names(cfg, tied)
    if set(sd) != want:
        raise SystemExit(f"gpt2_ref: tensor names differ from GPT2LMHeadModel's: missing "
                         f"{sorted(want - set(sd))}, unexpected {sorted(set(sd) - want)}")
    V, C, P = cfg["vocab_size"], cfg["n_embd"], cfg["n_positions"]
    shapes = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (P, C),
              "transformer.h.0.attn.c_attn.weight": (C, 3 * C),
              "transformer.h.0.mlp.c_fc.weight": (C, 4 * C),
              "transformer.h.0.mlp.c_proj.weight": (4 * C, C)}
    if not tied:
        shapes["lm_head.weight"] = (V, C)
    for name, shape in shapes.items():
        if sd[name].shape != shape or sd[name].dtype != np.float32:
            raise SystemExit(f"gpt2_ref: {name} is {sd[name].dtype} {sd[name].shape}, "
                             f"expected float32 {shape}")

    ids = np.load(ids_path).astype(np.int64)
    ours = np.load(logits_path)
    ref = forward(cfg, sd, ids, mutate)
    if ours.shape != ref.shape:
        raise SystemExit(f"gpt2_ref: logits shape {ours.shape}, reference {ref.shape}")
    label = "numpy GPT-2" + (f" (mutated: {mutate})" if mutate else "")
    ok = compare(f"accel vs {label}", ours, ref)

    if mutate is None:
        try:
            import torch
            import transformers
        except ImportError:
            print("gpt2_ref: transformers/torch not installed: checked against the numpy GPT-2 "
                  "reference only")
        else:
            model = transformers.GPT2LMHeadModel.from_pretrained(d)
            model.eval()
            with torch.no_grad():
                hf = model(torch.from_numpy(ids)).logits.double().numpy()
            ok = compare(f"accel vs transformers {transformers.__version__} GPT2LMHeadModel",
                         ours, hf) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
