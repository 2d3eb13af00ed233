#!/usr/bin/env bash
# The GPT example trains to bit-identical weights on the shm backend (accel launch, 1 machine x
# 2 processes) and on the mpi backend (mpirun -np 2), in fp32 and in bf16 mixed precision: the
# same log lines (loss, grad norm) and the same model.safetensors, byte for byte.
#
# Order-sensitive reductions: the f32 / bf16 sums of the gradient all-reduce, the loss and the
# clipping norm (and MAX/MIN ties at +0 / -0), whose bits depend on how operands are grouped.
# On two processes every grouping is the same single combine, and IEEE addition commutes
# exactly, so MPI's own MPI_Allreduce gives shm's bits; on three or more (and for small messages
# on any count) the mpi backend gathers the operands and reduces them in rank order itself, with
# accel's kernel (src/comm/mpi/mpi_coll.c), which the 3-process run checks too. The only
# other difference between runs, the tok/s field, is left out of the comparison.
# Skips (77) when mpirun is missing or the build has no mpi backend.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
command -v mpirun >/dev/null ||
    { echo "SKIP: mpirun not found (apt-get install openmpi-bin)"; exit 77; }
"$B/accel" env 2>/dev/null | grep -q "backends:.*mpi" ||
    { echo "SKIP: this build has no mpi backend (configure with -DACCEL_MPI=ON)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_base_warn_component_unused=0
export OMP_NUM_THREADS=1 # the machine is shared: one thread per process
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE ACCEL_JOB_ID ACCEL_BACKEND
DIR=$(mktemp -d /tmp/accel_gpt_mpi_XXXXXX)
trap 'rm -rf "$DIR"' EXIT
SRC=${ACCEL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cat "$SRC"/docs/*.md >"$DIR/corpus.txt"

fail() {
    echo "FAIL: $*"
    exit 1
}

# The log lines that must agree (tok/s differs from run to run; accel launch prefixes the rank).
summary() {
    grep -v "%|" "$1" | sed 's/^\[rank[0-9]*\]: //; s/ | [0-9]* tok\/s//' |
        grep -E "step +[0-9]+/[0-9]+ \||fingerprint"
}

for mp in no bf16; do
    for np in 2 3; do
        g="--layers 2 --width 64 --heads 4 --context 32 --batch 4 --steps 12 --lr 3e-3
           --log_every 3 --sample 0 --dropout 0.1 --accum 2 --mixed_precision $mp
           --data $DIR/corpus.txt"
        # shellcheck disable=SC2086
        timeout -k 5 280 "$B/accel" launch --main_process_port 0 --num_processes "$np" \
            "$B/examples/gpt" $g --save_dir "$DIR/shm" >"$DIR/shm.out" 2>&1 ||
            { cat "$DIR/shm.out"; fail "gpt on shm ($mp, $np processes)"; }
        # shellcheck disable=SC2086
        timeout -k 5 280 mpirun --oversubscribe -np "$np" -x OMP_NUM_THREADS \
            -x ACCEL_LOG_LEVEL=info "$B/examples/gpt" $g --save_dir "$DIR/mpi" \
            >"$DIR/mpi.out" 2>&1 ||
            { cat "$DIR/mpi.out"; fail "gpt on mpi ($mp, $np processes)"; }
        # mpirun's variables alone choose the backend.
        grep -q "initialised: $np processes, backend mpi" "$DIR/mpi.out" ||
            { cat "$DIR/mpi.out"; fail "gpt under mpirun did not run on the mpi backend"; }
        summary "$DIR/shm.out" >"$DIR/shm.txt"
        summary "$DIR/mpi.out" >"$DIR/mpi.txt"
        [ "$(wc -l <"$DIR/shm.txt")" -ge 4 ] || { cat "$DIR/shm.out"; fail "gpt: too few lines"; }
        diff "$DIR/shm.txt" "$DIR/mpi.txt" || fail "gpt ($mp, $np processes): mpi's log differs"
        cmp "$DIR/shm/model.safetensors" "$DIR/mpi/model.safetensors" ||
            fail "gpt ($mp, $np processes): model.safetensors differs between shm and mpi"
        echo "gpt $mp, $np processes: shm and mpi bit-identical: $(grep fingerprint "$DIR/mpi.txt")"
    done
done
