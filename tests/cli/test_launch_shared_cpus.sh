#!/usr/bin/env bash
# --cpu_affinity auto with several "machines" on one host (launchers on 127.0.0.1, each under
# `taskset -c`): launchers that share a boot id and an allowed CPU set bind nothing, instead of
# each splitting the same CPUs between its own processes.
#  1. 2 machines x 2 processes, both on CPUs 0,1: nobody bound, and both launchers say why
#     (before: ranks 0 and 2 on CPU 0, 1 and 3 on CPU 1).
#  2. 2 machines x 1 process on 0,1: nobody bound either (as before: one process per launcher
#     gets all its CPUs), and the launchers say so.
#  3. Different CPU sets (machine 0 on 0,1, machine 1 on 0), 2 processes each: not shared, so
#     machine 0 binds as a launcher alone does (ranks 0 and 1 on CPUs 0 and 1); machine 1 has
#     more processes than CPUs (both on 0).
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
source "$(dirname "$0")/launch_common.sh" # scratch, fail
scratch
PROG='echo "RANK=$RANK CPUS=$(sed -n "s/^Cpus_allowed_list:\t//p" /proc/self/status)"'
SAID="machines' launchers on this host share its CPUs: processes not bound"

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

job 2 0,1 0,1
for r in 0 1 2 3; do
    [ "$(cpus_of $r)" = 0-1 ] ||
        fail "2 machines x 2 processes on CPUs 0,1: rank $r bound to '$(cpus_of $r)', not 0-1"
done
for m in 0 1; do
    grep -q "2 $SAID" "$T/m$m.err" || fail "machine $m did not say why nobody is bound"
done
echo "ok: 2 machines x 2 processes on one host's CPUs: nobody bound"

job 1 0,1 0,1
[ "$(cpus_of 0)" = 0-1 ] && [ "$(cpus_of 1)" = 0-1 ] ||
    fail "2 machines x 1 process on CPUs 0,1: ranks got '$(cpus_of 0)' and '$(cpus_of 1)'," \
        "not 0-1 and 0-1"
grep -q "2 $SAID" "$T/m1.err" || fail "machine 1 did not say it shares its CPUs"
echo "ok: 2 machines x 1 process on one host's CPUs: nobody bound"

job 2 0,1 0
[ "$(cpus_of 0)" = 0 ] && [ "$(cpus_of 1)" = 1 ] && [ "$(cpus_of 2)" = 0 ] &&
    [ "$(cpus_of 3)" = 0 ] ||
    fail "machines on CPUs 0,1 and 0: ranks got '$(cpus_of 0)' '$(cpus_of 1)' '$(cpus_of 2)'" \
        "'$(cpus_of 3)', not 0 1 0 0"
grep -q "$SAID" "$T/m0.err" "$T/m1.err" && fail "machines on different CPU sets said they share"
echo "ok: different CPU sets on one host are not shared"
