#!/usr/bin/env bash
# accel estimate-memory against values computed by hand: GPT-2 124M from its config.json
# (124,439,808 parameters, tied embeddings, vocabulary 50257) and from flags (the same, and
# llm.c's layout with the vocabulary padded to 50304: 124,475,904), a small Llama config, a
# safetensors file and a sharded index written here, in Accelerate's units and with --bytes,
# ZeRO stages 0-3 on 4 processes; then bad input: each error names the file and the field.
set -u

B=${ACCEL_BUILD_DIR:-build}
ACCEL=$B/accel
T=$(mktemp -d "${TMPDIR:-/tmp}/accel-estimate.XXXXXX")
trap 'rm -rf "$T"' EXIT

fail() {
    echo "FAIL: $*" >&2
    cut -c1-300 "$T/out" "$T/err" 2>/dev/null | tail -n 30 >&2
    exit 1
}
[ -x "$ACCEL" ] || fail "$ACCEL is missing: build first (ACCEL_BUILD_DIR=$B)"

est() { # EXPECTED_RC ARGS...
    local want=$1
    shift
    timeout 60 "$ACCEL" estimate-memory "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    [ $rc -eq "$want" ] || fail "estimate-memory $* exited $rc, expected $want"
}
# The rows of DTYPE in the output, cells separated by one space: the first line is
# Accelerate's table (dtype largest total training), the second the ZeRO table (stages 0-3).
rows() { grep "^│ *$1 *│" "$T/out" | sed 's/│/ /g' | tr -s ' ' | sed 's/^ //; s/ $//'; }
expect_row() { # DTYPE LINE EXPECTED
    local got
    got=$(rows "$1" | sed -n "${2}p")
    [ "$got" = "$3" ] || fail "row $1 (table $2): got '$got', expected '$3'"
}
expect_err() { # TEXT
    grep -qF -- "$1" "$T/err" || fail "the error does not say '$1': $(cat "$T/err")"
}

# ---- GPT-2 124M: P = 124,439,808; wte = 50257 x 768 = 38,597,376 (the largest layer; a
# block is 7,087,872). Accelerate: fp32 4P; float16 P x 2; training fp32 = 4 x 4P, float16 =
# its largest term, the optimizer's 2 x 4P; int8/int4 N/A.
cat >"$T/config.json" <<'EOF'
{
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_inner": null,
  "n_layer": 12,
  "n_positions": 1024,
  "vocab_size": 50257
}
EOF
est 0 "$T/config.json"
grep -q "^124,439,808 parameters; largest layer transformer.wte (38,597,376 parameters)$" \
    "$T/out" || fail "GPT-2 parameter count"
grep -q "Memory Usage for loading \`$T/config.json\`" "$T/out" || fail "Accelerate's title"
expect_row float32 1 "float32 147.24 MB 474.7 MB 1.85 GB"
expect_row float16 1 "float16 73.62 MB 237.35 MB 949.4 MB"
expect_row bfloat16 1 "bfloat16 73.62 MB 237.35 MB 949.4 MB"
expect_row int8 1 "int8 36.81 MB 118.68 MB N/A"
expect_row int4 1 "int4 18.4 MB 59.34 MB N/A"
expect_row int8 2 "int8 N/A N/A N/A N/A"

# Exact bytes on 4 processes (accel's layout: src/train/zero.c, zero3.c). float32 (16 B per
# parameter): stage 0 16P = 1,991,036,928; stage 1 weights 4P + gradients 4P + moments 8P/4 =
# 10P = 1,244,398,080; stage 2 4P + 4P/4 + 8P/4 = 7P = 871,078,656; stage 3 16P/4 = 4P =
# 497,759,232 plus the weights of three adjacent units ([wte, wpe] 39,383,808 + h.0 + h.1
# 2 x 7,087,872 = 53,559,552) x 4 B = 214,238,208: 711,997,440. bfloat16 (18 B per
# parameter): stage 0 18P = 2,239,916,544; stage 1 master 4P/4 + compute 2P + gradients 4P +
# moments 8P/4 = 9P = 1,119,958,272; stage 2 4P/4 + 2P + 4P/4 + 8P/4 = 6P = 746,638,848;
# stage 3 4P + 53,559,552 x 6 B (fp32 and bf16) = 497,759,232 + 321,357,312 = 819,116,544.
est 0 --bytes --num_processes 4 "$T/config.json" --dtypes float32 bfloat16
expect_row float32 1 "float32 154389504 497759232 1991036928"
expect_row bfloat16 1 "bfloat16 77194752 248879616 995518464"
expect_row float32 2 "float32 1991036928 1244398080 871078656 711997440"
expect_row bfloat16 2 "bfloat16 2239916544 1119958272 746638848 819116544"
[ -z "$(rows float16)" ] || fail "--dtypes float32 bfloat16 printed float16"
grep -q "Training memory per process, 4 processes" "$T/out" || fail "ZeRO table title"
# One process: nothing is divided; stage 3 still gathers units into its pages.
est 0 --bytes --dtypes=float32,int4 "$T/config.json"
expect_row float32 2 "float32 1991036928 1991036928 1991036928 2205275136"
expect_row int4 1 "int4 19298688 62219904 N/A"

# The same model from flags (nn_gpt's layout, GPT-2 small by default), and llm.c's layout
# with the vocabulary padded to 50304: wte 50304 x 768 = 38,633,472, P = 124,475,904.
est 0 --bytes --dtypes float32 --n_layer 12
expect_row float32 1 "float32 154389504 497759232 1991036928"
est 0 --bytes --dtypes float32 --vocab_size 50304
grep -q "^124,475,904 parameters; largest layer transformer.wte (38,633,472 parameters)$" \
    "$T/out" || fail "llm.c layout parameter count"
expect_row float32 1 "float32 154533888 497903616 1991614464"
# Untied: lm_head counts once more (+38,597,376).
est 0 --bytes --dtypes float32 --tied 0
grep -q "^163,037,184 parameters" "$T/out" || fail "untied GPT-2 parameter count"
echo "ok: GPT-2 124M from config.json and flags"

# ---- A small Llama: hidden 64, 2 layers, intermediate 160, 4 heads of 16, 2 key/value
# heads, vocabulary 100, untied. Layer: q 64x64 + k, v 64x32 each + o 64x64 = 12,288; MLP
# 3 x 64 x 160 = 30,720; 2 norms 128: 43,136. Total 6,400 + 2 x 43,136 + 64 + 6,400 =
# 99,136; largest unit model.layers.0.
cat >"$T/llama.json" <<'EOF'
{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 160,
 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
 "tie_word_embeddings": false, "rms_norm_eps": 1e-6}
EOF
est 0 --bytes --dtypes float32 --num_processes 2 "$T/llama.json"
grep -q "^99,136 parameters; largest layer model.layers.0 (43,136 parameters)$" "$T/out" ||
    fail "Llama parameter count"
# 2 processes: stage 1 12P = 1,189,632; stage 2 10P = 991,360; stage 3 8P = 793,088 + three
# adjacent units (the two layers 86,272 + [norm, lm_head] 6,464 = 92,736) x 4 B = 370,944:
# 1,164,032.
expect_row float32 1 "float32 172544 396544 1586176"
expect_row float32 2 "float32 1586176 1189632 991360 1164032"
echo "ok: a small Llama config"

# ---- safetensors written here (header + zero data; the data is never read):
# embed_tokens [10,4] 40, layers.0 q [4,4] + up [8,4] 48, layers.1 the same 48, norm [4] 4
# (F32), lm_head [10,4] 40: 180 parameters, largest unit model.layers.0 (48).
write_st() { # FILE HEADER_JSON DATA_NBYTES
    local h=$2
    while [ $(((${#h}) % 8)) -ne 0 ]; do h="$h "; done
    local n=${#h} le=""
    for _ in 1 2 3 4 5 6 7 8; do
        le="$le$(printf '\\x%02x' $((n & 255)))"
        n=$((n >> 8))
    done
    { printf "$le"; printf '%s' "$h"; head -c "$3" /dev/zero; } >"$1"
}
t() { printf '"%s":{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}' "$@"; }
A="$(t model.embed_tokens.weight BF16 '[10,4]' 0 80)"
A+=",$(t model.layers.0.self_attn.q_proj.weight BF16 '[4,4]' 80 112)"
A+=",$(t model.layers.0.mlp.up_proj.weight BF16 '[8,4]' 112 176)"
Bh="$(t model.layers.1.self_attn.q_proj.weight BF16 '[4,4]' 0 32)"
Bh+=",$(t model.layers.1.mlp.up_proj.weight BF16 '[8,4]' 32 96)"
Bh+=",$(t model.norm.weight F32 '[4]' 96 112),$(t lm_head.weight BF16 '[10,4]' 112 192)"
mkdir -p "$T/one" "$T/sharded"
one="{$A,$(t model.layers.1.self_attn.q_proj.weight BF16 '[4,4]' 176 208)"
one+=",$(t model.layers.1.mlp.up_proj.weight BF16 '[8,4]' 208 272)"
one+=",$(t model.norm.weight F32 '[4]' 272 288),$(t lm_head.weight BF16 '[10,4]' 288 368)}"
write_st "$T/one/model.safetensors" "$one" 368
est 0 --bytes --dtypes float32 "$T/one/model.safetensors"
grep -q "^180 parameters; largest layer model.layers.0 (48 parameters)$" "$T/out" ||
    fail "safetensors parameter count"
expect_row float32 1 "float32 192 720 2880"
est 0 --dtypes float32 "$T/one" # a folder: its model.safetensors
expect_row float32 1 "float32 192 bytes 720 bytes 2.81 KB"

write_st "$T/sharded/model-00001-of-00002.safetensors" "{$A}" 176
write_st "$T/sharded/model-00002-of-00002.safetensors" "{$Bh}" 192
{
    printf '{"metadata": {"total_size": 560}, "weight_map": {\n'
    for n in model.embed_tokens.weight model.layers.0.self_attn.q_proj.weight \
        model.layers.0.mlp.up_proj.weight; do
        printf '"%s": "model-00001-of-00002.safetensors",\n' $n
    done
    for n in model.layers.1.self_attn.q_proj.weight model.layers.1.mlp.up_proj.weight \
        model.norm.weight; do
        printf '"%s": "model-00002-of-00002.safetensors",\n' $n
    done
    printf '"lm_head.weight": "model-00002-of-00002.safetensors"}}\n'
} >"$T/sharded/model.safetensors.index.json"
est 0 --bytes --dtypes float32 "$T/sharded"
grep -q "^180 parameters; largest layer model.layers.0 (48 parameters)$" "$T/out" ||
    fail "index parameter count"
# 100,000 tensors of different units: hashed (a scan of every earlier unit: minutes).
many=$(awk 'BEGIN { for (i = 0; i < 100000; i++)
    printf "%s\"t%d.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
        i ? "," : "", i, 4 * i, 4 * i + 4 }')
write_st "$T/many.safetensors" "{$many}" 400000
start=$SECONDS
est 0 --bytes --dtypes float32 "$T/many.safetensors"
[ $((SECONDS - start)) -lt 10 ] || fail "100,000 tensors took $((SECONDS - start)) s"
grep -q "^100,000 parameters; largest layer t0 (1 parameters)$" "$T/out" ||
    fail "100,000 tensors: count"
echo "ok: a safetensors file and a sharded index"

# ---- The estimate against what accel allocates for the GPT example's model (tests/progs/
# gpt_memory counts what goes through accel_replace_allocator and the resident pages of the
# buffers accel maps itself). The state held between backward and the optimizer step
# (weights, gradients, AdamW state, bookkeeping) is at least the estimate without stage 3's
# gathered units and at most 1% + 64 KiB above it (bookkeeping: names, bucket tables; partial
# pages at the edges of gradient shards). Under stage 3 the weights resident after the last
# forward (the units gathered then) are more than nothing and at most the estimate's three
# adjacent units.
measure() { # PROCESSES ZERO_STAGE MIXED_PRECISION DTYPE TIED
    OMP_NUM_THREADS=1 ACCEL_ZERO_STAGE=$2 timeout 120 "$ACCEL" launch --num_processes "$1" \
        --mixed_precision "$3" "$B/tests/progs/gpt_memory" --tied "$5" >"$T/out" 2>"$T/err" ||
        fail "gpt_memory ($*) failed"
    local v got params gathered total units per gather want
    v() { sed -n "s/^.*$1 //p" "$T/out"; }
    got=$(($(v state_bytes) + $(v mapped_grad_bytes)))
    gathered=$(v gathered_bytes)
    params=$(v params | sed ':a; s/\B[0-9]\{3\}\>/,&/; ta') # 842496 -> 842,496
    est 0 --bytes --dtypes "$4" --num_processes "$1" --n_layer 4 --n_embd 128 --n_head 4 \
        --vocab_size 256 --n_positions 128 --tied "$5"
    grep -q "^$params parameters" "$T/out" || fail "parameter counts differ"
    total=$(rows "$4" | sed -n 2p | cut -d' ' -f$(($2 + 2)))
    units=$(sed -n 's/.*three adjacent: \([0-9,]*\) parameters.*/\1/p' "$T/out" | tr -d ,)
    per=4
    [ "$4" = float32 ] || per=6
    gather=0
    [ "$2" = 3 ] && gather=$((units * per))
    want=$((total - gather))
    [ "$got" -ge "$want" ] && [ "$got" -le $((want + want / 100 + 65536)) ] ||
        fail "$*: measured $got bytes between steps, estimated $want (tolerance +1% + 64 KiB)"
    if [ "$2" = 3 ]; then
        [ "$gathered" -gt 0 ] && [ "$gathered" -le "$gather" ] ||
            fail "$*: $gathered bytes of gathered weights, estimated at most $gather"
    fi
    echo "ok: $1 process(es), stage $2, precision $3, tied $5: measured $got bytes, estimated" \
        "$want; gathered $gathered (at most $gather)"
}
measure 1 0 no float32 1
measure 1 0 bf16 bfloat16 0
measure 2 0 no float32 1
measure 2 1 no float32 1
measure 3 1 bf16 bfloat16 1
measure 2 2 bf16 bfloat16 0
measure 1 3 no float32 1
measure 2 3 no float32 1
measure 3 3 bf16 bfloat16 0

# ---- bad input
est 1 "$T/nothere.json"
expect_err "$T/nothere.json: No such file or directory"
sed '/"n_layer"/d' "$T/config.json" >"$T/bad1.json"
est 1 "$T/bad1.json"
expect_err "$T/bad1.json: field 'n_layer' is missing"
sed 's/"n_embd": 768/"n_embd": "768"/' "$T/config.json" >"$T/bad2.json"
est 1 "$T/bad2.json"
expect_err "$T/bad2.json, line 6: field 'n_embd' must be an integer"
printf '{"model_type": "bert", "hidden_size": 768}\n' >"$T/bert.json"
est 1 "$T/bert.json"
expect_err "$T/bert.json, line 1: model_type 'bert' is not one this command counts"
printf '{"n_embd": 768, "n_layer": [12]\n' >"$T/broken.json"
est 1 "$T/broken.json"
expect_err "$T/broken.json"
head -c 100 "$T/one/model.safetensors" >"$T/short.safetensors"
est 1 "$T/short.safetensors"
expect_err "$T/short.safetensors"
rm "$T/sharded/model-00002-of-00002.safetensors"
est 1 "$T/sharded/model.safetensors.index.json"
expect_err "model-00002-of-00002.safetensors"
expect_err "in $T/sharded/model.safetensors.index.json"
est 2 --dtypes float64 "$T/config.json"
expect_err "unknown dtype 'float64'"
est 2
expect_err "give a MODEL"
est 2 --n_layer 2 "$T/config.json"
expect_err "not both"
est 2 --n_head 5 --n_embd 0
expect_err "--n_embd must be an integer"
est 1 --n_head 5
expect_err "--n_embd 768 is not a multiple of --n_head 5"
# Huge dimensions: counts used to wrap into a small, wrong total, and 2^30 layers (one unit
# each, looked up quadratically) ran for minutes and tens of GB. Now named, or counted at once.
est 1 --n_layer 12 --n_embd 1073741824 --n_head 1
expect_err "more than 2^56 parameters, more than this command can count"
est 2 --n_layer 1073741824
expect_err "--n_layer must be an integer in [1, 1048576]"
{
    printf '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1000000000, '
    printf '"intermediate_size": 64, "num_attention_heads": 1, "vocab_size": 1000}\n'
} >"$T/deep.json"
est 1 "$T/deep.json"
expect_err "$T/deep.json: num_hidden_layers 1000000000: more than 1048576"
{
    printf '{"n_embd": 1073741824, "n_layer": 2, "n_head": 1, '
    printf '"vocab_size": 1073741824, "n_positions": 1}\n'
} >"$T/wide.json"
est 1 "$T/wide.json"
expect_err "$T/wide.json: the model would have more than 2^56 parameters"
start=$SECONDS
est 0 --n_layer 1048576 --n_embd 64 --n_head 1
[ $((SECONDS - start)) -lt 20 ] || fail "2^20 layers took $((SECONDS - start)) s"
grep -q "^52,415,304,896 parameters" "$T/out" || fail "2^20 layers: wrong count"
# A value-taking flag at the end took the "--" the reordering adds ("unknown dtype '--'"); a
# file after --dtypes is named as a bad dtype, not as a missing MODEL.
est 2 "$T/config.json" --dtypes
expect_err "option '--dtypes' needs a value"
est 2 --n_layer
expect_err "option '--n_layer' needs a value"
est 2 --dtypes "$T/config.json"
expect_err "unknown dtype '$T/config.json'"
echo "ok: bad input is named"
echo PASS
