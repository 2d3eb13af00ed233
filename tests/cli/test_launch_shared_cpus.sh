#!/usr/bin/env bash
# --cpu_affinity auto with several "machines" on one host (two launchers on 127.0.0.1, all under
# `taskset -c 0,1`): the launchers that share a boot id and an allowed CPU set split those CPUs
# between them instead of each binding its processes to the same ones.
#  1. 2 machines x 1 process: rank 0 on CPU 0, rank 1 on CPU 1 (before: both on 0-1).
#  2. 2 machines x 2 processes: 4 processes on 2 CPUs, nobody bound (before: 0, 1, 0, 1).
#  3. Different CPU sets (machine 0 on 0-1, machine 1 on 0): not shared, each launcher splits
#     its own CPUs as if alone: rank 0 on 0-1, rank 1 on 0.
#  4. 3 machines x 1 process, machines 0 and 2 on 0-1, machine 1 on 0: machine 2 is the second
#     of the two sharing 0-1 (index 1, not its machine rank): ranks on 0, 0 and 1.
# One launcher alone is checked in test_launch.sh (--cpu_affinity).
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
FREE=$B/tests/progs/free_port
[ -x "$ACCEL" ] && [ -x "$FREE" ] || { echo "missing build outputs"; exit 1; }
command -v taskset >/dev/null || { echo "SKIP: taskset is missing"; exit 77; }
[ "$(taskset -c 0,1 nproc 2>/dev/null)" = 2 ] ||
    { echo "SKIP: CPUs 0 and 1 are not both usable here"; exit 77; }
[ -r /proc/sys/kernel/random/boot_id ] || { echo "SKIP: no boot id (not Linux?)"; exit 77; }
T=$(mktemp -d)
pids=
cleanup() {
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    for f in "$T"/*.out "$T"/*.err; do
        [ -s "$f" ] && { echo "---- $f"; cat "$f"; }
    done
    exit 1
}
PROG='echo "RANK=$RANK CPUS=$(sed -n "s/^Cpus_allowed_list:\t//p" /proc/self/status)"'

# job PER CPUS...: one machine (PER processes) per CPU list, machine m under taskset -c the
# m-th; fails unless every launcher succeeds.
job() {
    local per=$1 port m=0 c p
    shift
    port=$("$FREE")
    rm -f "$T"/m*.out "$T"/m*.err
    local mine=
    for c in "$@"; do
        taskset -c "$c" "$ACCEL" launch --num_machines $# --main_process_ip 127.0.0.1 \
            --main_process_port "$port" --machine_rank $m -n $(($# * per)) \
            --rdzv_conf timeout=60 sh -c "$PROG" >"$T/m$m.out" 2>"$T/m$m.err" &
        mine="$mine $!"
        pids="$pids $!"
        m=$((m + 1))
    done
    m=0
    for p in $mine; do
        wait "$p" || fail "$per per machine on CPUs $*: machine $m's launcher failed"
        m=$((m + 1))
    done
}
# cpus_of R: the CPU list rank R printed.
cpus_of() { sed -n "s/^\[rank[0-9]*\]: RANK=$1 CPUS=//p" "$T"/m*.out; }

job 1 0,1 0,1
[ "$(cpus_of 0)" = 0 ] && [ "$(cpus_of 1)" = 1 ] ||
    fail "2 machines x 1 process on CPUs 0,1: ranks got '$(cpus_of 0)' and '$(cpus_of 1)'," \
        "not 0 and 1"
grep -q "2 machines' launchers on this host share the same 2 CPUs: this machine's processes take" \
    "$T/m1.err" || fail "machine 1 did not say it shares its CPUs"
echo "ok: 2 machines x 1 process on one host: CPUs 0 and 1"

job 2 0,1 0,1
for r in 0 1 2 3; do
    [ "$(cpus_of $r)" = 0-1 ] ||
        fail "2 machines x 2 processes on 2 CPUs: rank $r bound to '$(cpus_of $r)', not 0-1"
done
grep -q "share the same 2 CPUs: 4 processes in all, more than CPUs: none bound" "$T/m0.err" ||
    fail "machine 0 did not say why nobody is bound"
echo "ok: 2 machines x 2 processes on 2 CPUs: nobody bound"

job 1 0,1 0
[ "$(cpus_of 0)" = 0-1 ] && [ "$(cpus_of 1)" = 0 ] ||
    fail "machines on CPUs 0,1 and 0: ranks got '$(cpus_of 0)' and '$(cpus_of 1)', not 0-1 and 0"
echo "ok: different CPU sets on one host are not shared"

job 1 0,1 0 0,1
[ "$(cpus_of 0)" = 0 ] && [ "$(cpus_of 1)" = 0 ] && [ "$(cpus_of 2)" = 1 ] ||
    fail "machines on CPUs 0,1 / 0 / 0,1: ranks got '$(cpus_of 0)', '$(cpus_of 1)' and" \
        "'$(cpus_of 2)', not 0, 0 and 1"
echo "ok: the sharing machines are counted among themselves"
