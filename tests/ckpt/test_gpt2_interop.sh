#!/usr/bin/env bash
# The GPT example's --save_dir folder is a Hugging Face GPT-2 checkpoint: config.json plus
# model.safetensors load as GPT2LMHeadModel and give the logits accel's nn GPT gives.
#
# For a tied head with the tanh GELU (gelu_new, 1 process) and an untied head with the exact
# GELU (gelu, 2 processes under accel launch): train the example a few steps, compute the
# logits of a fixed byte sequence with tests/progs/gpt_logits (nn, weights loaded with
# accel_load_model in strict mode), and compare them with tests/ckpt/gpt2_ref.py, an
# independent numpy GPT-2 forward pass configured only from config.json (and with
# transformers.GPT2LMHeadModel.from_pretrained when torch and transformers are installed; they
# are not installed here, being several GB). Tolerance: 1e-4 relative to the largest logit.
# The reference is then deliberately broken (attention left unscaled, the head tied the other
# way) and must disagree. The two GELU forms differ too little on these weights to be told
# apart, so a "probe" copy of each folder, written by Python's safetensors with the MLPs moved
# to where the forms differ by ~3%, must match too, and must not match the other GELU form.
# Skips (77) without numpy/safetensors.
set -euo pipefail
BUILD=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
SRC=${ACCEL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
GPT=$BUILD/examples/gpt
LOGITS=$BUILD/tests/progs/gpt_logits
REF=$SRC/tests/ckpt/gpt2_ref.py

. "$(dirname "$0")/../pyenv.sh"
accel_need_python 'import numpy, safetensors' numpy safetensors || exit 77
for p in "$GPT" "$LOGITS" "$BUILD/accel"; do
    [ -x "$p" ] || { echo "test_gpt2_interop: $p not built" >&2; exit 1; }
done

TMP=$(mktemp -d /tmp/accel_gpt2_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1
fail() {
    echo "FAIL: $*"
    exit 1
}
cat "$SRC"/docs/*.md >"$TMP/corpus.txt" # a fixed corpus and the token source

MODEL="--layers 2 --width 64 --heads 4 --context 32"
TRAIN="$MODEL --batch 4 --steps 20 --lr 3e-3 --log_every 20 --sample 0"

# check NAME NPROCS TIED ACTIVATION MUTATIONS...
check() {
    local name=$1 n=$2 tied=$3 act=$4 dir=$TMP/$1
    shift 4
    echo "== $name: tied $tied, $act, $n process(es)"
    local launch=()
    [ "$n" = 1 ] || launch=("$BUILD/accel" launch --main_process_port 0 --num_processes "$n")
    # shellcheck disable=SC2086
    "${launch[@]}" "$GPT" $TRAIN --data "$TMP/corpus.txt" --tied "$tied" --activation "$act" \
        --save_dir "$dir" >"$TMP/train.txt" 2>&1 || { cat "$TMP/train.txt"; fail "training"; }
    [ -s "$dir/model.safetensors" ] && [ -s "$dir/config.json" ] || fail "$dir incomplete"
    python3 - "$dir/config.json" "$tied" "$act" <<'EOF' || fail "config.json fields"
import json, sys
c = json.load(open(sys.argv[1]))
want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 256,
        "n_positions": 32, "n_ctx": 32, "n_embd": 64, "n_layer": 2, "n_head": 4,
        "n_inner": None, "activation_function": sys.argv[3], "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": sys.argv[2] == "1", "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0, "scale_attn_weights": True}
bad = {k: (c.get(k, "<absent>"), v) for k, v in want.items() if c.get(k, "<absent>") != v}
if bad:
    sys.exit(f"config.json: (found, expected): {bad}")
EOF
    # shellcheck disable=SC2086
    "$LOGITS" --dir "$dir" $MODEL --tied "$tied" --activation "$act" --tokens "$TMP/corpus.txt" \
        --batch 2 --out "$TMP/$name.logits.npy" --ids_out "$TMP/$name.ids.npy"
    python3 "$REF" "$dir" "$TMP/$name.ids.npy" "$TMP/$name.logits.npy" ||
        fail "$name: accel's logits differ from GPT-2's"
    for m in "$@"; do
        if python3 "$REF" "$dir" "$TMP/$name.ids.npy" "$TMP/$name.logits.npy" --mutate "$m"; then
            fail "$name: the comparison did not detect the '$m' mutation"
        fi
    done
    # The GELU probe, a folder written by Python: loads here (strict names) and matches, and
    # the comparison tells the GELU forms apart on it.
    python3 "$REF" probe "$dir" "$dir.probe"
    # shellcheck disable=SC2086
    "$LOGITS" --dir "$dir.probe" $MODEL --tied "$tied" --activation "$act" \
        --tokens "$TMP/corpus.txt" --batch 2 --out "$TMP/$name.probe.npy" --ids_out "$TMP/ids.npy"
    python3 "$REF" "$dir.probe" "$TMP/ids.npy" "$TMP/$name.probe.npy" ||
        fail "$name: the probe copy written by Python gives other logits"
    if python3 "$REF" "$dir.probe" "$TMP/ids.npy" "$TMP/$name.probe.npy" --mutate act; then
        fail "$name: the comparison did not tell the GELU forms apart on the probe"
    fi
}

check tied 1 1 gelu_new scale
check untied 2 0 gelu scale tie
echo "test_gpt2_interop: ok"
