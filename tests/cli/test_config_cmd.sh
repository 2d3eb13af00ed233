#!/usr/bin/env bash
# accel config: the questionnaire driven through a pseudo-terminal with arrow and number keys
# (tests/progs/pty_drive) and through stdin without a terminal, `accel config default` and
# `accel config update`; every file written is read back by the library (tests/progs/
# show_options, accel launch) and, when Python is available, by Python's yaml with the same
# values.
set -u

B=${ACCEL_BUILD_DIR:-build}
SRC=${ACCEL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
ACCEL=$B/accel
P=$B/tests/progs
T=$(mktemp -d "${TMPDIR:-/tmp}/accel-test-config-cmd.XXXXXX")
trap 'rm -rf "$T"' EXIT
export HF_HOME=$T/hf
unset ACCELERATE_CONFIG_FILE ACCELERATE_MIXED_PRECISION ACCELERATE_USE_CPU ACCELERATE_DEBUG_MODE \
    ACCELERATE_GRADIENT_ACCUMULATION_STEPS ACCEL_ZERO_STAGE XDG_CACHE_HOME

fail() {
    echo "FAIL: $*" >&2
    for f in "$T"/out "$T"/err; do
        [ -f "$f" ] && { echo "---- $f:" >&2; tail -n 15 "$f" | cut -c1-300 >&2; }
    done
    exit 1
}
ok() { echo "ok: $*"; }
for f in "$ACCEL" "$P/pty_drive" "$P/show_options"; do
    [ -x "$f" ] || fail "$f is missing: build first (ACCEL_BUILD_DIR=$B)"
done

# What the library resolves from FILE, and the process count accel launch starts.
# options MIXED_PRECISION CPU DEBUG ACCUMULATION ZERO_STAGE: show_options' line for those.
options() { echo "options: mixed_precision=$1 cpu=$2 debug=$3 accumulation=$4 zero_stage=$5"; }
library_sees() { # FILE EXPECTED_OPTIONS_LINE EXPECTED_PROCESSES
    ACCELERATE_CONFIG_FILE=$1 timeout 20 "$P/show_options" >"$T/out" 2>"$T/err" ||
        fail "accel_init refused $1"
    grep -qx "$2" "$T/out" || fail "$1: library resolved $(grep options "$T/out"), expected $2"
    timeout 30 "$ACCEL" launch --config_file "$1" "$P/show_options" >"$T/out" 2>"$T/err" ||
        fail "accel launch --config_file $1 failed"
    [ "$(grep -c 'layout: rank' "$T/out")" -eq "$3" ] || fail "$1: expected $3 processes"
}
# The file as Python's yaml (or json) reads it: sorted key=value lines, sections flattened.
PYTHON_OK=0
. "$SRC/tests/pyenv.sh"
if accel_need_python 'import yaml' pyyaml; then PYTHON_OK=1; fi
python_sees() { # FILE EXPECTED (one "key=value" per line)
    [ $PYTHON_OK -eq 1 ] || return 0
    python3 - "$1" >"$T/py" <<'PY' || fail "Python could not read $1"
import json, sys, yaml
path = sys.argv[1]
with open(path) as f:
    d = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
def walk(prefix, v):
    if isinstance(v, dict):
        for k in sorted(v):
            walk(prefix + k + ".", v[k])
    else:
        print(f"{prefix[:-1]}={v!r}")
walk("", d)
PY
    printf '%s\n' "$2" | diff - "$T/py" >&2 || fail "Python read $1 differently"
}

# ---- the questionnaire in a terminal: arrow keys, number keys, Enter ----
cat >"$T/script" <<'EOF2'
expect In which compute environment are you running?
expect selecting with enter
send <enter>
expect Which type of machine are you using?
send <down><down><up><enter>
expect How many different machines
send <enter>
expect Should distributed operations be checked
send yes<enter>
expect Do you want accel to launch mpirun?
send no<enter>
expect Do you want to use DeepSpeed
send yes<enter>
expect ZeRO optimization stage?
send <up><down><up><up><up><enter>
expect How many gradient accumulation steps
send 4<enter>
expect How many processes should be used
send two<enter>
expect Please enter an integer
send 2<enter>
expect Do you wish to use mixed precision?
send 2<enter>
expect accel configuration saved at
EOF2
timeout 60 "$P/pty_drive" "$T/script" -- "$ACCEL" config --config_file "$T/pty.yaml" \
    >"$T/out" 2>"$T/err" ||
    fail "the terminal questionnaire failed"
grep -q $'\xe2\x9e\x94 \033\[32mmulti-CPU' "$T/out" || fail "no arrow-key menu was drawn"
library_sees "$T/pty.yaml" "$(options bf16 1 1 4 0)" 2
expected_ds="compute_environment='LOCAL_MACHINE'
debug=True
deepspeed_config.gradient_accumulation_steps=4
deepspeed_config.zero_stage=0
distributed_type='DEEPSPEED'
downcast_bf16='no'
enable_cpu_affinity=False
machine_rank=0
main_training_function='main'
mixed_precision='bf16'
num_machines=1
num_processes=2
rdzv_backend='static'
same_network=True
tpu_env=[]
tpu_use_cluster=False
tpu_use_sudo=False
use_cpu=True"
python_sees "$T/pty.yaml" "$expected_ds"
ok "terminal questionnaire (arrow and number keys):" \
    "the file reads back the same in accel and Python"

# Ctrl-C in a menu: exit 130, nothing written.
printf '%s\n' 'expect In which compute environment' 'send <enter>' \
    'expect Which type of machine' 'send <ctrl-c>' >"$T/script"
timeout 60 "$P/pty_drive" "$T/script" -- "$ACCEL" config --config_file "$T/int.yaml" \
    >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 130 ] || fail "Ctrl-C: exit $rc, expected 130"
grep -q "accel config: interrupted" "$T/out" || fail "Ctrl-C not reported"
[ ! -e "$T/int.yaml" ] || fail "a file was written after Ctrl-C"
ok "Ctrl-C in a menu: exit 130, no file"

# ---- the same questionnaire from stdin, without a terminal ----
# This machine, multi-GPU (then "multi-CPU" by its text after a bad number), 1 machine, no
# debug, no mpirun, no DeepSpeed, 3 processes, fp16.
printf '0\n7\nmulti-CPU\n\nno\n\n\n3\nfp16\n' |
    timeout 20 "$ACCEL" config --config_file "$T/stdin.yaml" >"$T/out" 2>"$T/err" ||
    fail "the stdin questionnaire failed"
grep -q "Please enter a number from 0 to 2" "$T/out" || fail "a bad answer was not asked again"
grep -q "^  \[1\] multi-CPU$" "$T/out" || fail "choices are not numbered"
library_sees "$T/stdin.yaml" "$(options fp16 1 0 1 0)" 3
python_sees "$T/stdin.yaml" "compute_environment='LOCAL_MACHINE'
debug=False
distributed_type='MULTI_CPU'
downcast_bf16='no'
enable_cpu_affinity=False
machine_rank=0
main_training_function='main'
mixed_precision='fp16'
num_machines=1
num_processes=3
rdzv_backend='static'
same_network=True
tpu_env=[]
tpu_use_cluster=False
tpu_use_sudo=False
use_cpu=True"
# The default location, which accel launch then reads on its own.
printf '\n\nyes\nno\n\n' | timeout 20 "$ACCEL" config >"$T/out" 2>"$T/err" ||
    fail "the questionnaire to the default location failed"
grep -q "accel configuration saved at $HF_HOME/accelerate/default_config.yaml" "$T/out" ||
    fail "not saved at the default location"
ACCELERATE_CONFIG_FILE= library_sees "$HF_HOME/accelerate/default_config.yaml" \
    "options: mixed_precision=no cpu=1 debug=0 accumulation=1 zero_stage=0" 1
rm "$HF_HOME/accelerate/default_config.yaml"
# The input ends early: exit 1 naming the question, nothing written.
printf '0\n1\n' | timeout 20 "$ACCEL" config --config_file "$T/short.yaml" >"$T/out" 2>"$T/err"
[ $? -eq 1 ] || fail "a short input did not fail"
grep -q "the input ended before this question was answered: How many different machines" "$T/err" ||
    fail "the unanswered question was not named"
[ ! -e "$T/short.yaml" ] || fail "a file was written from a short input"
printf '1\n' | timeout 20 "$ACCEL" config --config_file "$T/sm.yaml" >"$T/out" 2>"$T/err"
[ $? -eq 1 ] && grep -q "Amazon SageMaker is not supported" "$T/err" || fail "SageMaker accepted"
# 100 machines: rank 70 can be given (the menu stopped at 63); "host:port" as the address and
# a total that the machines cannot share are asked again (accel launch would refuse them).
printf '0\n1\n100\n70\n10.0.0.1:29500\n10.0.0.1\n29500\n\nno\nno\nno\n150\n200\n0\n' |
    timeout 20 "$ACCEL" config --config_file "$T/many.yaml" >"$T/out" 2>"$T/err" ||
    fail "the questionnaire of 100 machines failed"
grep -q "Please enter a host name or an address: give the address alone" "$T/out" ||
    fail "host:port was not asked again"
grep -q "Please enter a multiple of the number of machines (100)" "$T/out" ||
    fail "150 processes on 100 machines were not asked again"
for kv in "machine_rank: 70" "main_process_ip: 10.0.0.1" "num_processes: 200" \
    "num_machines: 100"; do
    grep -qx "$kv" "$T/many.yaml" || fail "the file lacks '$kv'"
done
ok "stdin questionnaire: numbers, texts, defaults, re-asked answers, short input, default location"

# multi-CPU asks Accelerate's mpirun questions: the hostfile ("~" expanded; a missing one is
# noted) and the oneCCL workers go to mpirun_config, which accel launch reads (here it names
# the missing hostfile: the file reached the launcher). Not on the same network: a rendezvous
# backend accel launch would refuse (etcd) is asked again.
printf '0\n1\n2\n1\n127.0.0.1\n29500\nno\netcd\nC10D\nno\nyes\n~/hosts\n3\nno\n2\n0\n' |
    HOME=$T/home timeout 20 "$ACCEL" config --config_file "$T/mpi.yaml" >"$T/out" 2>"$T/err" ||
    fail "the questionnaire with mpirun failed"
grep -q "Note: cannot read $T/home/hosts yet" "$T/out" || fail "the missing hostfile was not noted"
grep -q "Please enter static or c10d" "$T/out" || fail "rendezvous backend etcd not asked again"
grep -qx "  mpirun_ccl: 3" "$T/mpi.yaml" && grep -qx "rdzv_backend: c10d" "$T/mpi.yaml" ||
    fail "mpirun_ccl or rdzv_backend not written"
python_sees "$T/mpi.yaml" "compute_environment='LOCAL_MACHINE'
debug=False
distributed_type='MULTI_CPU'
downcast_bf16='no'
enable_cpu_affinity=False
machine_rank=1
main_process_ip='127.0.0.1'
main_process_port=29500
main_training_function='main'
mixed_precision='no'
mpirun_config.mpirun_ccl=3
mpirun_config.mpirun_hostfile='$T/home/hosts'
num_machines=2
num_processes=2
rdzv_backend='c10d'
same_network=False
tpu_env=[]
tpu_use_cluster=False
tpu_use_sudo=False
use_cpu=True"
timeout 20 "$ACCEL" launch --config_file "$T/mpi.yaml" true >"$T/out" 2>"$T/err"
[ $? -eq 2 ] && grep -q "mpirun_config.mpirun_hostfile: $T/home/hosts: cannot read" "$T/err" ||
    fail "accel launch did not take the hostfile from the questionnaire's file"
ok "multi-CPU with mpirun: mpirun_config written (hostfile with ~ expanded, oneCCL workers)"

# ---- accel config default ----
timeout 20 "$ACCEL" config default --config_file "$T/def.yaml" --mixed_precision bf16 \
    >"$T/out" 2>"$T/err" || fail "config default failed"
library_sees "$T/def.yaml" "$(options bf16 1 0 1 0)" 1
expected_default="compute_environment='LOCAL_MACHINE'
debug=False
distributed_type='NO'
downcast_bf16='no'
enable_cpu_affinity=False
machine_rank=0
main_training_function='main'
mixed_precision='bf16'
num_machines=1
num_processes=1
rdzv_backend='static'
same_network=False
tpu_env=[]
tpu_use_cluster=False
tpu_use_sudo=False
use_cpu=True"
python_sees "$T/def.yaml" "$expected_default"
cp "$T/def.yaml" "$T/def.before"
timeout 20 "$ACCEL" config default --config_file "$T/def.yaml" >"$T/out" 2>"$T/err" ||
    fail "config default over an existing file failed"
grep -q "Configuration already exists at $T/def.yaml, will not override" "$T/out" ||
    fail "no 'already exists' message"
cmp -s "$T/def.yaml" "$T/def.before" || fail "an existing file was overwritten"
timeout 20 "$ACCEL" config default --config_file "$T/def.json" --mixed_precision BF16 \
    >"$T/out" 2>"$T/err" || fail "config default (json) failed"
head -c 1 "$T/def.json" | grep -q '{' || fail "a .json file is not JSON"
python_sees "$T/def.json" "$expected_default"
library_sees "$T/def.json" "$(options bf16 1 0 1 0)" 1
timeout 20 "$ACCEL" config default --mixed_precision fp8 >"$T/out" 2>"$T/err"
[ $? -eq 2 ] && grep -q "expects no, fp16 or bf16" "$T/err" || fail "fp8 default accepted"
ok "config default: YAML or JSON, read back the same, an existing file kept"

# ---- accel config update: an Accelerate 0.18 file rewritten with current keys ----
cat >"$T/old.yaml" <<'EOF2'
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
dynamo_backend: INDUCTOR
fp16: true
ipex_config:
  ipex: false
num_processes: 2
my_own_key: kept
EOF2
timeout 20 "$ACCEL" config update --config_file "$T/old.yaml" >"$T/out" 2>"$T/err" ||
    fail "config update failed"
grep -q "Successfully updated the configuration file at $T/old.yaml." "$T/out" ||
    fail "no success line"
grep -q "warning: .*unknown key \"my_own_key\"" "$T/err" ||
    fail "the unknown key was not warned about"
library_sees "$T/old.yaml" "$(options fp16 0 0 1 0)" 2
python_sees "$T/old.yaml" "compute_environment='LOCAL_MACHINE'
debug=False
distributed_type='MULTI_CPU'
downcast_bf16=False
dynamo_config.dynamo_backend='INDUCTOR'
enable_cpu_affinity=False
machine_rank=0
main_training_function='main'
mixed_precision='fp16'
my_own_key='kept'
num_machines=1
num_processes=2
rdzv_backend='static'
same_network=False
tpu_use_cluster=False
tpu_use_sudo=False
use_cpu=False"
grep -q "^fp16\|^ipex_config\|^dynamo_backend" "$T/old.yaml" && fail "old keys survived the update"
timeout 20 "$ACCEL" config update --config_file "$T/none.yaml" >"$T/out" 2>"$T/err"
[ $? -eq 1 ] && grep -q "there is no config file at $T/none.yaml" "$T/err" || fail "missing file"
printf 'distributed_type: MULTI_CPU\nnum_processes: [\n' >"$T/broken.yaml"
timeout 20 "$ACCEL" config update --config_file "$T/broken.yaml" >"$T/out" 2>"$T/err"
[ $? -eq 1 ] && grep -q "YAML error at line" "$T/err" || fail "a broken file was not refused"
# Many keys are written back sorted in linear-logarithmic time (an insertion sort: minutes).
{ echo 'distributed_type: MULTI_CPU'; seq 200000 | sed 's/.*/k&: 1/'; } >"$T/many.yaml"
timeout 30 "$ACCEL" config update --config_file "$T/many.yaml" >"$T/out" 2>"$T/err" ||
    fail "config update of 200,000 keys failed or took over 30 s"
[ "$(grep -c '^k[0-9]*: 1$' "$T/many.yaml")" -eq 200000 ] || fail "keys lost in the update"
[ "$(sed -n 's/^\(k[0-9]*\):.*/\1/p' "$T/many.yaml" | head -3 | tr '\n' ' ')" = "k1 k10 k100 " ] ||
    fail "keys not sorted"
ok "config update: fp16, dynamo_backend, ipex_config converted; defaults added; unknown keys kept"

# ---- bad targets, named before any question is asked or anything written ----
# A closed input names the question (a menu's title, not its "enter a number" line).
timeout 20 "$ACCEL" config --config_file "$T/closed.yaml" <&- >"$T/out" 2>"$T/err"
[ $? -eq 1 ] && grep -q "answered: In which compute environment are you running?$" "$T/err" ||
    fail "closed stdin: the question was not named"
mkdir -p "$T/folder"
for verb in "" default update; do
    # shellcheck disable=SC2086 # the empty verb is no word
    timeout 20 "$ACCEL" config $verb --config_file "$T/folder" </dev/null >"$T/out" 2>"$T/err"
    [ $? -eq 1 ] && grep -q "error: --config_file $T/folder is a directory" "$T/err" ||
        fail "config $verb: a directory as --config_file was not refused"
    grep -q "compute environment" "$T/out" && fail "config $verb: asked questions for a directory"
    timeout 20 "$ACCEL" config $verb --config_file "" </dev/null >"$T/out" 2>"$T/err"
    [ $? -eq 1 ] && grep -q "error: --config_file is empty" "$T/err" ||
        fail "config $verb: an empty --config_file was not refused"
done
[ -z "$(ls -A "$T/folder")" ] || fail "something was written into the folder"
# A path too long to be one used to be cut to fit: the file went to another path.
long=$T/$(printf "$(printf 'd%.0s' $(seq 200))/%.0s" $(seq 25))x.yaml # 5000+ bytes
for verb in default update; do
    timeout 20 "$ACCEL" config $verb --config_file "$long" >"$T/out" 2>"$T/err"
    [ $? -eq 1 ] && grep -q "more than a path can be (4095)" "$T/err" ||
        fail "config $verb: a path longer than PATH_MAX was not refused"
done
[ -z "$(find "$T" -name 'x.yaml*' -o -name '.tmp-*')" ] || fail "a long path left a file behind"
ok "bad targets: a folder, an empty or too long path refused first;" \
    "a closed input names the question"
echo "PASS"
