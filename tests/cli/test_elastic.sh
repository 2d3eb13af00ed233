#!/usr/bin/env bash
# Elastic restarts end to end: a 2-process training job (tests/progs/elastic_train: a tiny MLP,
# accumulation 2, AdamW, shuffled loader, a checkpoint every 3 steps) whose process R SIGKILLs
# itself before a random micro-step M, run with `accel launch --max_restarts 2` and
# ACCELERATE_RESUME_FROM_CHECKPOINT=latest, must finish with final weights bit-identical to an
# uninterrupted run: 10 trials, R and M drawn from a seed printed on failure (ACCEL_TEST_SEED=S
# replays one). The assertions are deterministic: only which step is killed varies.
set -u

B=${ACCEL_BUILD_DIR:-build}
ACCEL=$B/accel
PROG=$B/tests/progs/elastic_train
T=$(mktemp -d "${TMPDIR:-/tmp}/accel-test-elastic.XXXXXX")
trap 'rm -rf "$T"' EXIT
export HF_HOME=$T/hf OMP_NUM_THREADS=1 ACCELERATE_RESUME_FROM_CHECKPOINT=latest
unset ACCELERATE_CONFIG_FILE
SEED=${ACCEL_TEST_SEED:-$((RANDOM * 32768 + RANDOM))}
STEPS=12
EVERY=3

fail() {
    echo "FAIL (seed $SEED; replay with ACCEL_TEST_SEED=$SEED): $*" >&2
    tail -n 20 "$T/err" | cut -c1-300 >&2
    exit 1
}
for f in "$ACCEL" "$PROG"; do
    [ -x "$f" ] || fail "$f is missing: build first (ACCEL_BUILD_DIR=$B)"
done
echo "seed $SEED"

timeout -k 5 60 "$ACCEL" launch -n 2 "$PROG" --project_dir "$T/base" --steps $STEPS \
    --checkpoint_every $EVERY >"$T/out" 2>"$T/err" || fail "the uninterrupted run failed"
want=$(sed -n 's/^\[rank0\]: final step //p' "$T/out")
[ -n "$want" ] && [ "${want%% *}" = "$STEPS" ] || fail "uninterrupted run printed '$want'"

s=$SEED
for trial in $(seq 10); do
    s=$(((s * 1103515245 + 12345) % 2147483648))
    rank=$((s % 2))
    micro=$(((s / 2) % (STEPS * 2)))
    rm -rf "$T/run"
    timeout -k 5 120 "$ACCEL" launch -n 2 --max_restarts 2 --monitor_interval 0 --grace_period 1 \
        "$PROG" --project_dir "$T/run" --steps $STEPS --checkpoint_every $EVERY \
        --kill_rank $rank --kill_micro $micro >"$T/out" 2>"$T/err"
    rc=$?
    what="trial $trial (rank $rank killed before micro-step $micro)"
    [ $rc -eq 0 ] || fail "$what: launcher exited $rc"
    # (The summary's first failure may be the peer that saw the death, if it is reaped first;
    # the status line names every process's end.)
    grep -Eq "rank $rank (failed: )?killed by SIGKILL \(signal 9\)" "$T/err" ||
        fail "$what: the failure was not reported"
    grep -q "accel launch: restarting all 2 processes (restart 1 of 2)" "$T/err" ||
        fail "$what: no restart"
    grep -q "restart 2 of 2" "$T/err" && fail "$what: restarted twice"
    # The restarted job resumed from the newest checkpoint written before the kill, if any.
    saved=$((micro / 2 / EVERY))
    if [ $saved -gt 0 ]; then
        ckpt=$T/run/checkpoints/checkpoint_$((saved - 1))
        grep -q "^\[rank0\]: resumed from $ckpt at step $((saved * EVERY))$" "$T/out" ||
            fail "$what: did not resume from checkpoint_$((saved - 1))"
    else
        grep -q "resumed from" "$T/out" && fail "$what: resumed without a checkpoint"
    fi
    got=$(sed -n 's/^\[rank0\]: final step //p' "$T/out")
    [ "$got" = "$want" ] || fail "$what: final '$got', uninterrupted '$want'"
    echo "ok: $what: restarted, resumed, final weights identical ($got)"
done
echo "PASS"
