#!/usr/bin/env bash
# The survivors of a training run name the dead or stuck process (issue 11, item 3): 3 ranks of
# examples/gpt (tiny model; without checkpoints, where deaths land in backward or the loss
# all-reduce, then with checkpoints every 4 steps, where they land mostly in save_state) started
# by hand on the shm backend; once rank 0 has logged a step, rank 1 is
#  1. SIGKILLed: both survivors exit 1 with EPEER naming "process 1 (pid P)" as dead;
#  2. SIGSTOPped (ACCEL_TIMEOUT=2): both exit 1 with ETIMEDOUT naming process 1 and its pid.
# Whatever call the kill lands in (backward, the loss all-reduce, save_state), the message is
# one clean line: the failing call, then the communicator's diagnosis once (a message formatted
# from itself repeated its prefix and lost the rank). The delay after the first log line is
# random; it is printed on failure.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
GPT=$B/examples/gpt
[ -x "$GPT" ] || { echo "missing $GPT"; exit 1; }
PD_READY='^step' PD_READY_S=20 PD_WATCHDOG_S=40
. "$(dirname "$0")/../peer_death.sh"

start_job() { # job checkpoint_every env...
    local job=$1 every=$2
    shift 2
    pd_start "$job" 3 "$@" OMP_NUM_THREADS=1 -- "$GPT" --layers 1 --width 32 --heads 2 \
        --context 32 --batch 2 --steps 100000 --log_every 1 --sample 0 --checkpoint_every "$every" \
        --total_limit 2 --project_dir "$tmp/$job.proj"
}

# check_survivor job rank status pattern: exit 1, and the last stderr line is exactly one
# "gpt.c:LINE: CALL: STATUS: [wrapper: ]diagnosis" with the diagnosis naming process 1.
check_survivor() {
    local job=$1 r=$2 status=$3 diag="${*:4}" # the pattern: the remaining words, joined
    pd_survivor "$job" "$r"
    local line
    line=$(tail -1 "$tmp/$job.$r.err")
    echo "$line" |
        grep -Eq ": $status: (accel_backward_end: gradient all-reduce failed: )?$diag\$" ||
        fail "$job: rank $r: unexpected message: $line"
    [ "$(echo "$line" | grep -o "allreduce: " | wc -l)" -eq 1 ] ||
        fail "$job: rank $r: the diagnosis is repeated (garbled): $line"
    echo "$job: rank $r: ${line#*: }"
}

for every in 0 4; do
# 1. SIGKILL.
job=gpd$$-kill$every
start_job "$job" "$every"
pd_signal KILL
wait "${pids[1]}" 2>/dev/null
p1=${pids[1]}
for r in 0 2; do
    check_survivor "$job" $r EPEER "allreduce: process 1 \\(pid $p1\\) died" \
        "\\(killed or exited\\) during a collective; process $r cannot continue"
done
pd_end

# 2. SIGSTOP, 2 s timeout: a survivor either times out itself (naming the processes it waited
#    for) or reads the first one's diagnosis.
job=gpd$$-stop$every
start_job "$job" "$every" ACCEL_TIMEOUT=2
pd_signal STOP
p1=${pids[1]}
for r in 0 2; do
    check_survivor "$job" $r ETIMEDOUT \
        "allreduce: (process $r timed out after 2 s waiting for process 1 \\(pid $p1\\)" \
        "\\(stopped, hung, or calling a different collective\\)|process 1 \\(pid $p1\\) did not" \
        "arrive within the 2 s timeout \\(stopped, hung, or calling a different collective\\);" \
        "process $r gives up)"
done
pd_end
done
echo "PASS"
