#!/usr/bin/env bash
# accel launch and the Accelerate config file: every key accel understands reaches the
# processes through Accelerate's variables (flags given on the command line win, the file fills
# the rest), the file is found by --config_file, ACCELERATE_CONFIG_FILE or the default location,
# unknown keys warn once, malformed files name the line, several machines' keys are checked naming
# the flag or key, and `accel launch --config_file F ./prog` resolves the same options as
# `ACCELERATE_CONFIG_FILE=F ./prog`. Also Accelerate's flag spellings and the grouped --help.
set -u

B=${ACCEL_BUILD_DIR:-build}
ACCEL=$B/accel
P=$B/tests/progs
T=$(mktemp -d "${TMPDIR:-/tmp}/accel-test-launch-config.XXXXXX")
trap 'rm -rf "$T"' EXIT
# No config of the machine's user may leak in: the default location is under $T.
export HF_HOME=$T/hf
unset ACCELERATE_CONFIG_FILE ACCELERATE_MIXED_PRECISION ACCELERATE_USE_CPU ACCELERATE_DEBUG_MODE \
    ACCELERATE_GRADIENT_ACCUMULATION_STEPS ACCEL_ZERO_STAGE CUDA_VISIBLE_DEVICES OMP_NUM_THREADS \
    ACCEL_CONFIG_CHECKED XDG_CACHE_HOME

fail() {
    echo "FAIL: $*" >&2
    for f in "$T"/out "$T"/err; do
        echo "---- $f:" >&2
        tail -n 15 "$f" | cut -c1-300 >&2
    done
    exit 1
}
ok() { echo "ok: $*"; }
for f in "$ACCEL" "$P/rank_info" "$P/show_options"; do
    [ -x "$f" ] || fail "$f is missing: build first (ACCEL_BUILD_DIR=$B)"
done

run() { # EXPECTED_RC ARGS...
    local want=$1
    shift
    timeout -k 5 30 "$ACCEL" "$@" >"$T/out" 2>"$T/err"
    RC=$?
    [ "$RC" -eq "$want" ] || fail "accel $* exited $RC, expected $want"
}
# expect_err / expect_out PATTERN...: the pattern is the arguments joined by a space (a long one
# may be split over lines).
expect_err() { grep -q -- "$*" "$T/err" || fail "stderr lacks '$*'"; }
expect_out() { grep -q -- "$*" "$T/out" || fail "stdout lacks '$*'"; }
no_out() { ! grep -q -- "$1" "$T/out" || fail "stdout has '$1'"; }
# env_of RANK VAR: the value rank_info printed (prefixed or not).
env_of() { sed -n "s/^\(\[rank$1\]: \)\{0,1\}rank $1 $2=//p" "$T/out"; }
want_env() { # RANK VAR VALUE
    local got
    got=$(env_of "$1" "$2")
    [ "$got" = "$3" ] || fail "rank $1: $2=$got, expected $3"
}

# ---- no config file anywhere: Accelerate's defaults ----
run 0 launch "$P/rank_info"
want_env 0 WORLD_SIZE 1
want_env 0 ACCELERATE_MIXED_PRECISION no
want_env 0 ACCELERATE_CONFIG_FILE "(unset)"
want_env 0 ACCEL_ZERO_STAGE "(unset)"
want_env 0 OMP_NUM_THREADS "$(nproc)"
want_env 0 ROLE_NAME default
# torchrun's other variables, over inherited values: one role, one machine, no --rdzv-id.
ROLE_RANK=7 ROLE_WORLD_SIZE=9 GROUP_WORLD_SIZE=9 TORCHELASTIC_RUN_ID=old \
    run 0 launch -n 2 --role trainer "$P/rank_info"
want_env 1 ROLE_NAME trainer
for r in 0 1; do
    want_env $r ROLE_RANK $r
    want_env $r ROLE_WORLD_SIZE 2
    want_env $r GROUP_WORLD_SIZE 1
    want_env $r TORCHELASTIC_RUN_ID none
done
want_env 1 OMP_NUM_THREADS $(($(nproc) / 2 > 1 ? $(nproc) / 2 : 1))
OMP_NUM_THREADS=3 run 0 launch -n 2 "$P/rank_info"
want_env 1 OMP_NUM_THREADS 3
ok "no config file: defaults, OMP_NUM_THREADS = max(1, CPUs / processes) unless set," \
    "torchrun's ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE, GROUP_WORLD_SIZE, TORCHELASTIC_RUN_ID"

# ---- a file with every key accel launch understands ----
cat >"$T/all.yaml" <<'EOF'
compute_environment: LOCAL_MACHINE
debug: true
distributed_type: MULTI_CPU
downcast_bf16: 'no'
dynamo_config:
  dynamo_backend: INDUCTOR
enable_cpu_affinity: false
gpu_ids: 0,1
machine_rank: 0
main_process_ip: 127.0.0.2
main_process_port: 12345
main_training_function: main
mixed_precision: bf16
mpirun_config: {}
num_machines: 1
num_processes: 3
rdzv_backend: static
same_network: true
tpu_env: []
use_cpu: true
EOF
run 0 launch --config_file "$T/all.yaml" "$P/rank_info"
for r in 0 1 2; do
    want_env $r WORLD_SIZE 3
    want_env $r ACCELERATE_MIXED_PRECISION bf16
    want_env $r ACCELERATE_USE_CPU true
    want_env $r ACCELERATE_DEBUG_MODE true
    want_env $r MASTER_ADDR 127.0.0.2
    want_env $r MASTER_PORT 12345
    want_env $r CUDA_VISIBLE_DEVICES 0,1
    want_env $r ACCELERATE_CONFIG_FILE "$T/all.yaml"
    want_env $r ACCEL_CONFIG_CHECKED "$T/all.yaml"
done
expect_err "accel launch: warning: config file $T/all.yaml, line 6: ignoring dynamo_config:" \
    "{dynamo_backend: INDUCTOR} (torch.compile (dynamo) has no counterpart in C"
if "$ACCEL" env | grep -q '^- CUDA: not built in'; then # and a note on gpu_ids
    expect_err "line 8: ignoring gpu_ids:" \
        "0,1 (this build of accel has no CUDA (configure with -DACCEL_CUDA=ON), it runs on the CPU)"
    [ "$(grep -c warning "$T/err")" -eq 2 ] || fail "expected exactly two warnings"
else
    [ "$(grep -c warning "$T/err")" -eq 1 ] || fail "expected exactly one warning"
fi
ok "config file: num_processes, mixed_precision, use_cpu, debug, main_process_ip/port, gpu_ids," \
    "dynamo note"

# Flags given on the command line win; the file fills the rest (dashes, '=' and -n forms).
run 0 launch --config_file "$T/all.yaml" -n 2 --mixed-precision=fp16 --main_process_port 23456 \
    --gpu_ids all "$P/rank_info"
want_env 1 WORLD_SIZE 2
want_env 1 ACCELERATE_MIXED_PRECISION fp16
want_env 1 MASTER_PORT 23456
want_env 1 MASTER_ADDR 127.0.0.2
want_env 1 CUDA_VISIBLE_DEVICES "(unset)"
want_env 1 ACCELERATE_USE_CPU true
for form in "-n=2" "-n2" "--num-processes=2" "--num_processes=2"; do
    run 0 launch --config-file="$T/all.yaml" "$form" "$P/rank_info"
    want_env 1 WORLD_SIZE 2
done
ok "flags win over the file (-n 2, -n=2, -n2, --num-processes=2, --mixed-precision=fp16)"

# ACCELERATE_CONFIG_FILE, then the default location.
ACCELERATE_CONFIG_FILE=$T/all.yaml run 0 launch "$P/rank_info"
want_env 2 ACCELERATE_MIXED_PRECISION bf16
mkdir -p "$HF_HOME/accelerate"
printf 'distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: fp16\n' \
    >"$HF_HOME/accelerate/default_config.yaml"
run 0 launch "$P/rank_info"
want_env 1 ACCELERATE_MIXED_PRECISION fp16
want_env 1 ACCELERATE_CONFIG_FILE "$HF_HOME/accelerate/default_config.yaml"
rm "$HF_HOME/accelerate/default_config.yaml"
ok "ACCELERATE_CONFIG_FILE, then \$HF_HOME/accelerate/default_config.yaml"

# A bad file the command line did not name says where its name came from.
ACCELERATE_CONFIG_FILE=$T/gone.yaml run 2 launch "$P/rank_info"
expect_err "config file $T/gone.yaml:" \
    "No such file or directory (the file named by \$ACCELERATE_CONFIG_FILE)"
printf 'distributed_type: MULTI_CPU\nnum_processes: [\n' >"$HF_HOME/accelerate/default_config.yaml"
run 2 launch "$P/rank_info"
expect_err "(the default config file: fix it, rewrite it with accel config," \
    "or name another with --config_file)"
rm "$HF_HOME/accelerate/default_config.yaml"

# ---- DeepSpeed / FSDP sections: accel's ZeRO stage and accumulation ----
cat >"$T/ds.yaml" <<'EOF'
distributed_type: DEEPSPEED
deepspeed_config:
  gradient_accumulation_steps: 4
  offload_optimizer_device: none
  zero_stage: 0
mixed_precision: bf16
num_processes: 2
use_cpu: true
EOF
run 0 launch --config_file "$T/ds.yaml" "$P/rank_info"
want_env 1 ACCEL_ZERO_STAGE 0
want_env 1 ACCELERATE_GRADIENT_ACCUMULATION_STEPS 4
run 0 launch --config_file "$T/ds.yaml" --gradient_accumulation_steps 2 --zero_stage 1 \
    "$P/rank_info"
want_env 1 ACCEL_ZERO_STAGE 1
want_env 1 ACCELERATE_GRADIENT_ACCUMULATION_STEPS 2
printf 'distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n' >"$T/fsdp.yaml"
run 0 launch --config_file "$T/fsdp.yaml" "$P/rank_info"
want_env 0 ACCEL_ZERO_STAGE 0
run 0 launch --use_deepspeed "$P/rank_info"
want_env 0 ACCEL_ZERO_STAGE 2
run 0 launch --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP "$P/rank_info"
want_env 0 ACCEL_ZERO_STAGE 2
want_env 0 ACCEL_ZERO_SHARD_SIZE 0
run 0 launch --use_fsdp --fsdp_sharding_strategy HYBRID_SHARD "$P/rank_info"
want_env 0 ACCEL_ZERO_STAGE 3
want_env 0 ACCEL_ZERO_SHARD_SIZE machine
printf 'distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n' >"$T/ds3.yaml"
run 0 launch --config_file "$T/ds3.yaml" "$P/rank_info"
want_env 0 ACCEL_ZERO_STAGE 3
ok "deepspeed_config.zero_stage / gradient_accumulation_steps, fsdp sharding strategy," \
    "--use_deepspeed"

# ---- `accel launch --config_file F` and `ACCELERATE_CONFIG_FILE=F` agree ----
cat >"$T/same.yaml" <<'EOF'
compute_environment: LOCAL_MACHINE
debug: true
distributed_type: DEEPSPEED
deepspeed_config:
  gradient_accumulation_steps: 3
  zero_stage: 0
mixed_precision: bf16
num_processes: 1
use_cpu: true
future_key: 7
EOF
run 0 launch --config_file "$T/same.yaml" "$P/show_options"
launched=$(grep '^options:' "$T/out")
[ "$(grep -c 'future_key' "$T/err")" -eq 1 ] ||
    fail "the unknown key was not warned about exactly once"
expect_err "accel launch: warning: config file $T/same.yaml, line 10:" \
    "ignoring unknown key \"future_key\""
ACCELERATE_CONFIG_FILE=$T/same.yaml timeout 20 "$P/show_options" >"$T/out" 2>"$T/err" ||
    fail "show_options alone failed"
direct=$(grep '^options:' "$T/out")
[ "$launched" = "$direct" ] || fail "launched '$launched' but directly '$direct'"
[ "$direct" = "options: mixed_precision=bf16 cpu=1 debug=1 accumulation=3 zero_stage=0" ] ||
    fail "resolved '$direct'"
expect_err "future_key"
ok "accel launch --config_file F and ACCELERATE_CONFIG_FILE=F resolve the same options"

# ---- malformed files and bad values: errors naming the line (exit 2, nothing started) ----
printf 'distributed_type: MULTI_CPU\nnum_processes: [2\n' >"$T/bad1.yaml"
run 2 launch --config_file "$T/bad1.yaml" "$P/rank_info"
expect_err "config file $T/bad1.yaml: YAML error at line"
printf 'distributed_type: MULTI_CPU\nmixed_precision: bf16\nnum_processes: many\n' >"$T/bad2.yaml"
run 2 launch --config_file "$T/bad2.yaml" "$P/rank_info"
expect_err "config file $T/bad2.yaml, line 3: num_processes: \"many\""
printf 'distributed_type: MULTI_CPU\nnum_processes: -1\n' >"$T/bad3.yaml"
run 2 launch --config_file "$T/bad3.yaml" "$P/rank_info"
expect_err "config file $T/bad3.yaml, line 2: num_processes: -1:" \
    "give the number of processes with --num_processes"
run 0 launch --config_file "$T/bad3.yaml" -n 2 "$P/rank_info"
printf 'distributed_type: NO\nnum_processes: 99999\n' >"$T/bad4.yaml"
run 2 launch --config_file "$T/bad4.yaml" "$P/rank_info"
expect_err "line 2: num_processes: 99999: expected an integer in \[-1, 4096\]"
run 2 launch --config_file "$T/nothere.yaml" "$P/rank_info"
expect_err "config file $T/nothere.yaml"
# A second YAML document is refused (yaml.safe_load refuses it), not silently dropped; so is
# anything after the first document's end marker.
printf -- '---\ndistributed_type: MULTI_CPU\nnum_processes: 2\n---\nnum_processes: 3\n' \
    >"$T/twodocs.yaml"
run 2 launch --config_file "$T/twodocs.yaml" "$P/rank_info"
expect_err "config file $T/twodocs.yaml, line 4: a second YAML document"
printf 'distributed_type: MULTI_CPU\nnum_processes: 2\n...\nnum_processes: 3\n' >"$T/afterend.yaml"
run 2 launch --config_file "$T/afterend.yaml" "$P/rank_info"
expect_err "config file $T/afterend.yaml: YAML error at line 4"
# An empty path, and one too long to be a path (it used to be cut to fit, naming another file).
run 2 launch --config_file "" "$P/rank_info"
expect_err "config file \"\": an empty path names no file"
long=$T/$(printf "$(printf 'd%.0s' $(seq 200))/%.0s" $(seq 25))x.yaml
run 2 launch --config_file "$long" "$P/rank_info"
expect_err "the path is ${#long} bytes long, more than a path can be (4095)"
HF_HOME=$long run 2 launch "$P/rank_info"
expect_err "(the default location, under a long \$HF_HOME"
# 200,000 keys: read in linear time (the duplicate check scanned every earlier key: minutes),
# the notes past the cap counted instead of cut off silently; a duplicate at the end named.
{ echo 'distributed_type: MULTI_CPU'; seq 200000 | sed 's/.*/k&: 1/'; } >"$T/many.yaml"
run 0 launch --config_file "$T/many.yaml" "$P/rank_info"
expect_err "config file $T/many.yaml: 199977 more notes like the ones above, not shown"
echo 'k17: 2' >>"$T/many.yaml"
run 2 launch --config_file "$T/many.yaml" "$P/rank_info"
expect_err "config file $T/many.yaml, line 200002: key \"k17\" appears twice"
printf -- '---\ndistributed_type: MULTI_CPU\nnum_processes: 2\n...\n' >"$T/onedoc.yaml"
run 0 launch --config_file "$T/onedoc.yaml" "$P/rank_info"
want_env 1 WORLD_SIZE 2
run 2 launch --mixed_precision fp12 "$P/rank_info"
expect_err "\-\-mixed_precision fp12: expected no, fp16, bf16 or fp8"
run 2 launch --cpu --multi_gpu -n 2 "$P/rank_info"
expect_err "use only one of --cpu, --multi_gpu"
run 2 launch --multi_gpu -n 1 "$P/rank_info"
expect_err "multi_gpu needs at least 2 processes"
run 2 launch --gpu_ids first "$P/rank_info"
expect_err "\-\-gpu_ids first: expected all or comma-separated device ids"
run 2 launch --gpu_ids 0,,1 "$P/rank_info"
expect_err "\-\-gpu_ids 0,,1: expected all or comma-separated device ids"
printf 'distributed_type: MULTI_CPU\ngpu_ids: 0,1,\n' >"$T/gpus.yaml"
run 2 launch --config_file "$T/gpus.yaml" "$P/rank_info"
expect_err "line 2: gpu_ids: \"0,1,\" is not all or a comma-separated list of device ids"
ok "malformed files and values: errors naming the file and line, or the flag"

# ---- several machines: the flags and keys are read and checked (tests/cli/test_launch_machines.sh
# runs the jobs) ----
run 2 launch --num_machines 2 -n 4 "$P/rank_info"
expect_err "several machines (--num_machines 2) need --main_process_ip"
# -n forgotten (the default's 1 process), from the flag and from the file's num_machines.
run 2 launch --num_machines 2 --main_process_ip 127.0.0.1 "$P/rank_info"
expect_err "\-\-num_processes not given: its default, 1 process, cannot be shared by 2 machines" \
    "(--num_machines 2): give the total over all machines (Accelerate's meaning)," \
    "e.g. --num_processes 2"
printf '%s\n' 'distributed_type: MULTI_CPU' 'num_machines: 3' >"$T/no_n.yaml"
run 2 launch --config_file "$T/no_n.yaml" --main_process_ip 127.0.0.1 "$P/rank_info"
expect_err "1 process, cannot be shared by 3 machines (config file $T/no_n.yaml, line 2:" \
    "num_machines: 3)"
run 2 launch --machine_rank 1 "$P/rank_info"
expect_err "\-\-machine_rank 1: must be below the number of machines (1)"
run 2 launch --mpirun_hostfile "$T/nohosts" "$P/rank_info"
expect_err "\-\-mpirun_hostfile $T/nohosts: cannot read the hostfile"
printf '%s\n' 'distributed_type: MULTI_CPU' 'num_machines: 2' 'num_processes: 4' \
    'main_process_ip: 192.0.2.1' >"$T/nodes.yaml"
run 1 launch --config_file "$T/nodes.yaml" "$P/rank_info"
expect_err "machine 0 cannot serve the rendezvous on 192.0.2.1:29500"
printf '%s\n' 'distributed_type: MULTI_CPU' 'num_machines: 2' 'machine_rank: 1' 'num_processes: 4' \
    'main_process_ip: 127.0.0.1' "main_process_port: $("$P/free_port")" >"$T/node1.yaml"
# Past one try of the store's connect (a slice of the wait, 0.5 s): the store's message names the
# configured timeout, not its last try's part of it (it said "within 0.170802 s").
run 1 launch --config_file "$T/node1.yaml" --rdzv_conf timeout=1.2 "$P/rank_info"
expect_err "machine 1:" \
    "no rendezvous with the main process (machine 0's launcher) at 127.0.0.1:[0-9]* within 1.2 s"
expect_err "could not connect within 1.2 s ("
printf 'distributed_type: MULTI_CPU\nnum_machines: 2\nnum_processes: 3\n' >"$T/odd.yaml"
run 2 launch --config_file "$T/odd.yaml" "$P/rank_info"
expect_err "config file $T/odd.yaml, line 3: num_processes: 3:" \
    "3 processes cannot be shared equally by config file $T/odd.yaml, line 2: num_machines: 2"
run 0 launch --config_file "$T/nodes.yaml" --num_machines 1 -n 2 --main_process_ip 127.0.0.1 \
    "$P/rank_info"
want_env 1 WORLD_SIZE 2
# Machine 1's file run alone: its machine_rank means nothing on one machine (it used to be
# refused, "must be below the number of machines (1)", though --num_machines 1 overrides).
run 0 launch --config_file "$T/node1.yaml" --num_machines 1 -n 2 "$P/rank_info"
want_env 1 RANK 1
want_env 1 WORLD_SIZE 2
printf 'distributed_type: MULTI_CPU\nmpirun_config:\n  mpirun_hostfile: %s\n' "$T/nohosts" \
    >"$T/mpi.yaml"
run 2 launch --config_file "$T/mpi.yaml" "$P/rank_info"
expect_err "line 3: mpirun_config.mpirun_hostfile: $T/nohosts: cannot read the hostfile"
# --main_process_ip: an empty one, "host:port", "[v6]" and an IPv6 link-local address (with a
# scope id or without) are named before anything starts.
run 2 launch --main_process_ip "" "$P/rank_info"
expect_err "\-\-main_process_ip : expected a host name or an address"
run 2 launch -n 2 --num_machines 2 --main_process_ip 10.0.0.1:29500 "$P/rank_info"
expect_err "\-\-main_process_ip 10.0.0.1:29500:" \
    "give the address alone and the port with --main_process_port"
run 2 launch --main_process_ip "[::1]" "$P/rank_info"
expect_err "without brackets"
for ip in "fe80::1%lo" FE80::2; do
    run 2 launch -n 2 --num_machines 2 --main_process_ip "$ip" "$P/rank_info"
    expect_err "\-\-main_process_ip $ip: an IPv6 link-local address"
    expect_err "give machine 0's global or unique-local (fd00::/8) IPv6 address, or an IPv4 one"
done
printf 'distributed_type: MULTI_CPU\nmain_process_ip: ""\nnum_machines: 2\nnum_processes: 2\n' \
    >"$T/noip.yaml"
run 2 launch --config_file "$T/noip.yaml" "$P/rank_info"
expect_err "config file $T/noip.yaml, line 2: main_process_ip: : expected a host name"
mkdir -p "$T/hostdir"
run 2 launch --mpirun_hostfile "$T/hostdir" "$P/rank_info"
expect_err "\-\-mpirun_hostfile $T/hostdir: cannot read the hostfile: it is a directory"
run 2 launch --num_machines two "$P/rank_info"
expect_err "\-\-num_machines two: expected an integer"
run 2 launch --rdzv_backend etcd "$P/rank_info"
expect_err "\-\-rdzv_backend etcd: expected static or c10d"
# A long --rdzv_conf is read whole (a 1 KiB buffer cut it: a cut pair was misreported, the
# pairs after it dropped); a host name longer than one can be is named.
long=$(printf 'x%.0s' $(seq 1100))
run 2 launch --rdzv_conf "is_host=1,$long,timeout=5" "$P/rank_info"
expect_err "expected KEY=VALUE pairs, got 'xxxxxxxxxx"
run 2 launch --rdzv_conf "timeout=1,$long=1" "$P/rank_info"
expect_err "unknown key 'x"
run 2 launch --main_process_ip "$long" "$P/rank_info"
expect_err "longer than a host name can be (253 characters)"
ok "several machines: flags and keys read and checked," \
    "naming --num_machines / --machine_rank / --mpirun_hostfile or the key"

# ---- accel env shows the config file in use and its content ----
run 0 env
expect_out "^- accel config file: not found (looked at $HF_HOME/accelerate/default_config.yaml," \
    "the default location)$"
run 0 env --config_file "$T/all.yaml"
expect_out "^- accel config file: $T/all.yaml (--config_file):$"
expect_out "^    mixed_precision: bf16$"
expect_out "^    dynamo_config:$"
expect_out "^      dynamo_backend: INDUCTOR$"
expect_out "^  note: config file $T/all.yaml, line 6: ignoring dynamo_config"
ACCELERATE_CONFIG_FILE=$T/ds.yaml run 0 env
expect_out "^- accel config file: $T/ds.yaml (ACCELERATE_CONFIG_FILE):$"
expect_out "^      zero_stage: 0$"
run 0 env --config_file "$T/bad2.yaml"
expect_out "^- accel config file (--config_file): cannot be used: config file $T/bad2.yaml," \
    "line 3: num_processes"
ok "accel env: the config file in use (or why none), its content and notes"

# ---- accepted flags, notes, --help generated from the table, grouped ----
run 0 launch --no_python --enable_cpu_affinity --same_network --rdzv_backend c10d \
    --dynamo_backend inductor "$P/rank_info"
expect_err "note: --dynamo_backend inductor ignored"
run 0 launch --help
for heading in "Hardware Selection Arguments:" "Resource Selection Arguments:" \
    "Training Paradigm Arguments:" "Distributed GPUs:" "DeepSpeed Arguments:" "FSDP Arguments:" \
    "MPI Arguments:"; do
    expect_out "^$heading"
done
for flag in --config_file --cpu --multi_gpu --mixed_precision --num_processes --num_machines \
    --num_cpu_threads_per_process --gpu_ids --same_network --machine_rank --main_process_ip \
    --main_process_port --tee --log_dir --rdzv_backend --max_restarts --monitor_interval \
    --zero_stage --gradient_accumulation_steps --fsdp_sharding_strategy --mpirun_hostfile --debug \
    --use_deepspeed --use_fsdp --cpu_affinity --grace_period --rdzv_conf --mpirun_ccl \
    --preflight --role; do
    grep -q -- "  $flag\b\|-., $flag\b" "$T/out" || fail "--help lacks $flag"
done
ok "accepted flags and notes; --help lists every flag under Accelerate's groups"

# ---- --debug: the main process prints the resolved configuration with every source ----
printf 'distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: fp16\n' >"$T/dbg.yaml"
run 0 launch --debug --config_file "$T/dbg.yaml" --gradient_accumulation_steps 3 "$P/show_options"
expect_err "accel: resolved configuration"
expect_err "mixed_precision *= fp16  \[accel launch: config file $T/dbg.yaml, line 3:" \
    "mixed_precision: fp16 (env ACCELERATE_MIXED_PRECISION)\]"
expect_err "debug *= 1  \[accel launch: --debug (env ACCELERATE_DEBUG_MODE)\]"
expect_err "gradient_accumulation_steps *= 3  \[accel launch:" \
    "--gradient_accumulation_steps 3 (env ACCELERATE_GRADIENT_ACCUMULATION_STEPS)\]"
expect_err "main_process_port *= [0-9]*  \[accel launch:" \
    "default of --main_process_port (env MASTER_PORT)\]"
expect_err "timeout_s *= 1800  \[default\]"
[ "$(grep -c "resolved configuration" "$T/err")" -eq 1 ] ||
    fail "printed by more than the main process"
run 0 launch --config_file "$T/dbg.yaml" --mixed_precision bf16 "$P/show_options"
! grep -q "resolved configuration" "$T/err" || fail "printed without --debug"
ok "accel launch --debug: resolved configuration with the source of each value, main process only"
echo "PASS"
