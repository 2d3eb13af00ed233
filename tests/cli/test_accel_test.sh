#!/usr/bin/env bash
# accel test: the built-in end-to-end check under the configured launch ends with Accelerate's
# success line (1 process without a config file; 2 and 3 processes from config files in each
# precision, with DeepSpeed's accumulation), and a check made to fail on purpose
# (ACCEL_TEST_FAIL_CHECK) ends the run with a last line naming it and a failing status.
set -u

B=${ACCEL_BUILD_DIR:-build}
ACCEL=$B/accel
T=$(mktemp -d "${TMPDIR:-/tmp}/accel-test-test.XXXXXX")
trap 'rm -rf "$T"' EXIT
export HF_HOME=$T/hf OMP_NUM_THREADS=1
unset ACCELERATE_CONFIG_FILE ACCEL_TEST_FAIL_CHECK ACCELERATE_MIXED_PRECISION

fail() {
    echo "FAIL: $*" >&2
    tail -n 15 "$T/out" "$T/err" | cut -c1-300 >&2
    exit 1
}
[ -x "$ACCEL" ] || fail "$ACCEL is missing: build first (ACCEL_BUILD_DIR=$B)"
SUCCESS="Test is a success! You are ready for your distributed training!"

run_test() { # EXPECTED_RC ARGS...
    local want=$1
    shift
    timeout -k 5 120 "$ACCEL" test "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    [ $rc -eq "$want" ] || fail "accel test $* exited $rc, expected $want"
}

run_test 0
[ "$(tail -n 1 "$T/out")" = "$SUCCESS" ] || fail "no success line"
for check in init collectives rng gather_for_metrics training checkpoint; do
    grep -q "^check $check .* ok" "$T/out" || fail "check $check did not report ok"
done
echo "ok: one process, no config file"

cases="no:2:MULTI_CPU bf16:3:MULTI_CPU fp16:2:MULTI_CPU no:2:DEEPSPEED"
for c in $cases; do
    IFS=: read -r mp np type <<<"$c"
    printf 'distributed_type: %s\nmixed_precision: %s\nnum_processes: %s\nuse_cpu: true\n' \
        "$type" "$mp" "$np" >"$T/cfg.yaml"
    [ "$type" = DEEPSPEED ] &&
        printf '%s\n' 'deepspeed_config:' '  zero_stage: 0' '  gradient_accumulation_steps: 3' \
            >>"$T/cfg.yaml"
    run_test 0 --config_file "$T/cfg.yaml"
    [ "$(tail -n 1 "$T/out")" = "$SUCCESS" ] || fail "$c: no success line"
    grep -q "^\[rank0\]: every check passed on $np processes$" "$T/out" ||
        fail "$c: not $np processes"
    grep -q "^\[rank0\]: Mixed precision type: $mp$" "$T/out" || fail "$c: precision not $mp"
    want_k=2
    [ "$type" = DEEPSPEED ] && want_k=3
    grep -q "accumulation $want_k, precision $mp: weights match the reference" "$T/out" ||
        fail "$c: the training check did not run with accumulation $want_k in $mp"
    echo "ok: $np processes, $type, precision $mp"
done

printf 'distributed_type: MULTI_CPU\nnum_processes: 2\n' >"$T/cfg.yaml"
for check in collectives training checkpoint; do
    ACCEL_TEST_FAIL_CHECK=$check run_test 1 --config_file "$T/cfg.yaml"
    want="^accel test: FAILED: check '$check' (.*) failed on process 1: failing on purpose"
    tail -n 1 "$T/err" | grep -q "$want (ACCEL_TEST_FAIL_CHECK=$check)$" ||
        fail "the last line does not name check $check: $(tail -n 1 "$T/err")"
    grep -q "$SUCCESS" "$T/out" && fail "success line after a failure"
done
echo "ok: a check failing on purpose is named on the last line, exit status 1"

run_test 2 --config_file "$T/nothere.yaml"
grep -q "config file $T/nothere.yaml" "$T/err" || fail "a missing config file was not named"
echo "PASS"
