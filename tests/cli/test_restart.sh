#!/usr/bin/env bash
# accel launch --max_restarts N: a failed job is torn down, reported and started again with
# ACCEL_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT counting the restarts and a fresh
# ACCEL_JOB_ID; a job failing every time stops after N restarts with its last failure
# summarised and that failure's exit status; a signal to the launcher is never restarted.
# (tests/cli/test_elastic.sh restarts a real training job and checks it resumes exactly.)
set -u

B=${ACCEL_BUILD_DIR:-build}
ACCEL=$B/accel
P=$B/tests/progs
T=$(mktemp -d "${TMPDIR:-/tmp}/accel-test-restart.XXXXXX")
MARK="accel-test-restart-marker-$$-$RANDOM"
trap 'pkill -KILL -f "$MARK" 2>/dev/null; rm -rf "$T"' EXIT
export HF_HOME=$T/hf
unset ACCELERATE_CONFIG_FILE

fail() {
    echo "FAIL: $*" >&2
    tail -n 20 "$T/err" | cut -c1-300 >&2
    exit 1
}
run() { # EXPECTED_RC ARGS...
    local want=$1
    shift
    timeout -k 5 30 "$ACCEL" "$@" >"$T/out" 2>"$T/err"
    RC=$?
    [ "$RC" -eq "$want" ] || fail "accel $* exited $RC, expected $want"
}
expect_err() { grep -q -- "$1" "$T/err" || fail "stderr lacks '$1'"; }
count_err() { grep -c -- "$1" "$T/err"; }

# Failing every time: 1 + 2 attempts, then the last failure and its status.
run 3 launch -n 2 --max_restarts 2 --monitor_interval 0 "$P/rank_info" --fail-rank 1 --code 3
[ "$(count_err "accel launch: rank 1 failed: exit code 3")" -eq 3 ] || fail "expected 3 failures"
expect_err "restarting all 2 processes (restart 1 of 2)"
expect_err "restarting all 2 processes (restart 2 of 2)"
expect_err "accel launch: giving up: the job failed 3 times (--max_restarts 2)"
# The summary printed last is the last attempt's (its stderr says restart count 2).
tail -n 4 "$T/err" | grep -q "^    (restart count 2)$" ||
    fail "the last summary is not the last attempt's"
tail -n 1 "$T/err" | grep -q "giving up" || fail "giving up is not the last line"
# (Rank 1 prints before it fails; rank 0 may be stopped before it prints.)
jobs=$(sed -n 's/^\[rank1\]: rank 1 ACCEL_JOB_ID=//p' "$T/out" | sort -u | wc -l)
[ "$jobs" -eq 3 ] || fail "expected a fresh ACCEL_JOB_ID per attempt, saw $jobs"
for n in 0 1 2; do
    grep -q "^\[rank1\]: rank 1 ACCEL_RESTART_COUNT=$n$" "$T/out" || fail "no attempt $n"
    grep -q "^\[rank1\]: rank 1 TORCHELASTIC_RESTART_COUNT=$n$" "$T/out" ||
        fail "no torchelastic $n"
done
echo "ok: failing every time: 3 attempts, the last failure summarised, its exit status"

# Failing once: the restart succeeds, the launcher exits 0.
run 0 launch -n 2 --max_restarts 2 --monitor_interval 0.05 "$P/rank_info" --fail-rank 0 \
    --code 4 --fail-until 1
[ "$(count_err "restarting")" -eq 1 ] || fail "expected exactly one restart"
expect_err "accel launch: rank 0 failed: exit code 4"
echo "ok: failing once: one restart, then success"

# --log_dir keeps every attempt: a restart appends (it used to empty the files, losing the
# output of the attempt whose failure caused it).
run 4 launch -n 1 --max_restarts 2 --monitor_interval 0 --log_dir "$T/logs" /bin/sh -c \
    'echo "attempt $ACCEL_RESTART_COUNT"; echo "failing $ACCEL_RESTART_COUNT" >&2; exit 4'
[ "$(cat "$T/logs/rank0.stdout")" = "$(printf 'attempt 0\nattempt 1\nattempt 2')" ] ||
    fail "the log of stdout does not hold every attempt: $(cat "$T/logs/rank0.stdout")"
[ "$(grep -c '^failing [012]$' "$T/logs/rank0.stderr")" -eq 3 ] ||
    fail "the log of stderr lost an attempt"
run 0 launch -n 1 --log_dir "$T/logs" /bin/echo fresh
[ "$(cat "$T/logs/rank0.stdout")" = fresh ] || fail "a new launch did not empty the old log"
echo "ok: --log_dir keeps every attempt's output; a new launch starts the files afresh"

# Without --max_restarts nothing is restarted; bad values are usage errors.
run 4 launch -n 2 "$P/rank_info" --fail-rank 0 --code 4
[ "$(count_err "restarting")" -eq 0 ] || fail "restarted without --max_restarts"
run 2 launch --max_restarts -1 "$P/rank_info"
expect_err "\-\-max_restarts -1: expected an integer"
run 2 launch --monitor_interval soon "$P/rank_info"
expect_err "\-\-monitor_interval soon: expected seconds"
echo "ok: no restart by default; bad --max_restarts / --monitor_interval refused"

# A signal to the launcher stops the job for good.
: >"$T/out"
set -m
"$ACCEL" launch -n 2 --max_restarts 3 "$P/sleeper" 60 "$MARK" >>"$T/out" 2>"$T/err" &
LPID=$!
set +m
for _ in $(seq 100); do
    [ "$(grep -c ready "$T/out")" -ge 2 ] && break
    sleep 0.05
done
kill -TERM "$LPID"
wait "$LPID"
rc=$?
[ $rc -eq 143 ] || fail "SIGTERM: launcher exited $rc, expected 143"
[ "$(count_err "restarting")" -eq 0 ] || fail "restarted after SIGTERM"
pgrep -f "$MARK" >/dev/null && fail "processes survived"
echo "ok: SIGTERM to the launcher is not restarted"
echo "PASS"
