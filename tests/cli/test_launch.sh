#!/usr/bin/env bash
# accel launch and the accel command line: flags and usage errors, the environment given to
# each process, rank prefixes (no line lost, cut or mixed), --tee files, exit-status
# propagation and failure summary, signal forwarding and teardown (no process survives),
# removal of a job's leftover /dev/shm segments, and, once the shm backend and
# tests/progs/allreduce_loop exist, a rank SIGKILLed in the middle of an all-reduce.
# Every launch runs under `timeout` so a broken launcher fails the test instead of hanging it.
# ACCEL_TEST_LABELS: waits
set -u

B=${ACCEL_BUILD_DIR:-build}
ACCEL=$B/accel
P=$B/tests/progs
T=$(mktemp -d "${TMPDIR:-/tmp}/accel-test-launch.XXXXXX")
MARK="accel-test-launch-marker-$$-$RANDOM"
trap 'pkill -KILL -f "$MARK" 2>/dev/null; rm -rf "$T"' EXIT
# The user's own Accelerate config file must not change the launches below.
export HF_HOME=$T/hf
unset ACCELERATE_CONFIG_FILE

fail() {
    echo "FAIL: $*" >&2
    for f in "$T"/out "$T"/err; do
        echo "---- last lines of $f:" >&2
        tail -n 8 "$f" | cut -c1-200 >&2
    done
    exit 1
}
ok() { echo "ok: $*"; }

for f in "$ACCEL" "$P/rank_info" "$P/print_lines" "$P/sleeper" "$P/self_signal"; do
    [ -x "$f" ] || fail "$f is missing: build first (ACCEL_BUILD_DIR=$B)"
done

# run EXPECTED_RC ARGS...: runs accel with a 20 s limit, stdout/stderr to $T/out, $T/err.
run() {
    local want=$1
    shift
    timeout -k 5 20 "$ACCEL" "$@" >"$T/out" 2>"$T/err"
    RC=$?
    [ "$RC" -eq "$want" ] || fail "accel $* exited $RC, expected $want"
}
# expect_err / expect_out PATTERN...: the pattern is the arguments joined by a space (a long one
# may be split over lines).
expect_err() { grep -q -- "$*" "$T/err" || fail "stderr lacks '$*'"; }
expect_out() { grep -q -- "$*" "$T/out" || fail "stdout lacks '$*'"; }
no_survivors() {
    local left
    left=$(pgrep -f "$MARK")
    [ -z "$left" ] || { ps -o pid,pgid,stat,args -p $left >&2; fail "$1: processes survived"; }
}

# ---- top-level flags and usage errors ----
run 0 --version
[ "$(cat "$T/out")" = "accel 0.1.0" ] || fail "--version printed '$(cat "$T/out")'"
run 0 --help
expect_out "launch"
expect_out "env"
run 0 launch --help
for flag in --num_processes --main_process_port --tee --log_dir --grace_period; do
    expect_out "$flag"
done
run 2
expect_err "usage: accel"
run 2 no-such-verb
expect_err "unknown command 'no-such-verb'"
expect_err "usage: accel"
run 2 launch --bogus "$P/rank_info"
expect_err "unknown option '--bogus'"
expect_err "usage: accel launch"
run 2 launch -n
expect_err "needs a value"
run 2 launch --help=yes
expect_err "option '--help' takes no value"
run 2 launch -n 0 "$P/rank_info"
expect_err "num_processes"
run 2 launch --tee 3 "$P/rank_info"
expect_err "log_dir"
run 2 launch -n 2
expect_err "no program given"
expect_err "usage: accel launch"
run 2 launch -n 2 "$T/does-not-exist"
expect_err "$T/does-not-exist' not found"
run 2 launch no-such-program-$MARK
expect_err "no-such-program-$MARK' not found in PATH"
touch "$T/not-exec"
run 2 launch "$T/not-exec"
expect_err "not-exec' is not an executable"
# A script whose '#!' interpreter is missing is named before anything starts (execv's ENOENT
# read as if the script itself were missing); a file the kernel cannot run gets a hint; a
# missing program leaves no new --log_dir behind.
printf '#!/nonexistent-%s/interp\necho hi\n' "$MARK" >"$T/bad-shebang"
printf '#!\n' >"$T/empty-shebang"
printf 'echo no shebang\n' >"$T/no-shebang"
chmod +x "$T/bad-shebang" "$T/empty-shebang" "$T/no-shebang"
run 2 launch --log_dir "$T/never-made" "$T/bad-shebang"
expect_err "bad-shebang':" \
    "its interpreter '/nonexistent-$MARK/interp' (its '#!' line) does not exist"
[ ! -e "$T/never-made" ] || fail "a launch that started nothing created its --log_dir"
run 2 launch "$T/empty-shebang"
expect_err "starts with '#!' but names no interpreter"
run 127 launch "$T/no-shebang"
expect_err "no-shebang': Exec format error (neither a binary for this machine nor a script"
run 2 launch --log_dir "$T/never-made" no-such-program-$MARK
[ ! -e "$T/never-made" ] || fail "a missing program left a new --log_dir behind"
# merge-weights: flags after the folders as before them, a flag missing its value, empty
# paths, and a file given as the checkpoint folder ("does not exist" used to send the user
# looking for it).
mkdir -p "$T/ck"
run 2 merge-weights "$T/ck" "$T/merged" --max_shard_size
expect_err "option '--max_shard_size' needs a value"
run 1 merge-weights "$T/ck" "$T/merged" --max-shard-size 5GB
expect_err "not a complete checkpoint"
run 2 merge-weights "$T/ck" "$T/merged" --remove-checkpoint-dir=yes
expect_err "option '--remove_checkpoint_dir' takes no value"
run 2 merge-weights "" "$T/merged"
expect_err "CHECKPOINT_DIR is empty"
run 0 merge-weights "$T/ck" "$T/merged" --help
expect_out "usage: accel merge-weights"
run 1 merge-weights "$T/not-exec" "$T/merged"
expect_err "checkpoint folder $T/not-exec is a regular file, not a folder"
[ ! -e "$T/merged" ] || fail "a refused merge-weights created its output"
run 2 env --bogus
expect_err "unknown option '--bogus'"
run 0 env
expect_out "accel version: 0.1.0"
expect_out "Communication backends: self"
expect_out "ACCEL_TIMEOUT"
expect_out "WORLD_SIZE"
# The argument wins over this variable (tests/unit/test_core.c), and env must say so.
expect_out "^ *ACCELERATE_GRADIENT_ACCUMULATION_STEPS .*the option, when set, wins"
# A value the library will refuse is marked (it used to be listed as if fine).
ACCEL_TIMEOUT=soon run 0 env
expect_out "^    ^ invalid: environment variable ACCEL_TIMEOUT=\"soon\" is not a number$"
ACCEL_LOG_LEVEL=loud run 0 env
expect_out "^    ^ invalid: environment variable ACCEL_LOG_LEVEL=\"loud\" is not one of debug"
# A report that cannot be written (a full disk: /dev/full) fails naming why; it used to exit 0
# with nothing written. A launched job's status is its own.
if [ -w /dev/full ]; then
    for cmd in "env" "--version" "launch --help"; do
        # shellcheck disable=SC2086 # cmd is split on purpose
        timeout -k 5 20 "$ACCEL" $cmd >/dev/full 2>"$T/err"
        RC=$?
        [ "$RC" -eq 1 ] || fail "accel $cmd >/dev/full exited $RC, expected 1"
        expect_err "error: cannot write the output: No space left on device"
    done
    timeout -k 5 20 "$ACCEL" launch -n 1 true >/dev/full 2>"$T/err" ||
        fail "launch true >/dev/full failed"
fi
ok "flags, --help, --version, env, usage errors"

# ---- option spellings, PATH search, "--" ----
run 0 launch --num_processes=2 "$P/rank_info"
expect_out "^\[rank1\]: rank 1 WORLD_SIZE=2$"
run 0 launch --num-processes 2 "$P/rank_info"
expect_out "^\[rank1\]: rank 1 WORLD_SIZE=2$"
run 0 launch -n2 true
run 4 launch -n 1 -- "$P/rank_info" --fail-rank 0 --code 4
# The program's own flags are not the launcher's (options stop at the program).
run 0 launch -n 1 "$P/rank_info" --num_processes 7
expect_out "^rank 0 WORLD_SIZE=1$"
ok "option spellings, PATH search, --"

# ---- environment of each process ----
run 0 launch -n 3 --main_process_port 12345 "$P/rank_info"
for r in 0 1 2; do
    for kv in "RANK=$r" WORLD_SIZE=3 "LOCAL_RANK=$r" LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=12345; do
        expect_out "^\[rank$r\]: rank $r $kv$"
    done
done
jobs=$(sed -n 's/^\[rank[0-9]\]: rank [0-9] ACCEL_JOB_ID=//p' "$T/out" | sort -u)
[ "$(echo "$jobs" | wc -l)" -eq 1 ] && [ -n "$jobs" ] && [ "$jobs" != "(unset)" ] ||
    fail "ACCEL_JOB_ID differs between ranks or is unset: $jobs"
run 0 launch -n 1 "$P/rank_info"
expect_out "^rank 0 RANK=0$"
job2=$(sed -n 's/^rank 0 ACCEL_JOB_ID=//p' "$T/out")
[ "$job2" != "$jobs" ] || fail "two launches got the same ACCEL_JOB_ID $jobs"
expect_out "^rank 0 MASTER_PORT=29500$"
run 0 launch -n 2 --main_process_port 0 "$P/rank_info"
grep -q '^\[rank0\]: rank 0 MASTER_PORT=[1-9][0-9]*$' "$T/out" || fail "port 0 not replaced"
ok "environment: RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT ACCEL_JOB_ID"

# ---- --cpu_affinity: each process on its own share of the CPUs, or left alone ----
# cpus_of R: the CPU list process R reported (from /proc/self/status), run under launch $ARGS.
allowed=$(grep Cpus_allowed_list /proc/self/status | cut -f2)
ncpu=$(nproc)
run 0 launch -n 2 sh -c 'grep Cpus_allowed_list /proc/self/status'
c0=$(sed -n 's/^\[rank0\]: Cpus_allowed_list:\t//p' "$T/out")
c1=$(sed -n 's/^\[rank1\]: Cpus_allowed_list:\t//p' "$T/out")
if [ "$ncpu" -ge 2 ]; then
    [ -n "$c0" ] && [ -n "$c1" ] && [ "$c0" != "$c1" ] && [ "$c0" != "$allowed" ] ||
        fail "--cpu_affinity auto: ranks got CPUs '$c0' and '$c1' (allowed '$allowed')"
fi
run 0 launch -n 2 --cpu_affinity none sh -c 'grep Cpus_allowed_list /proc/self/status'
[ "$(grep -c "Cpus_allowed_list:.$allowed\$" "$T/out")" -eq 2 ] ||
    fail "--cpu_affinity none: a rank was bound: $(cat "$T/out")"
run 0 launch -n $((ncpu + 1)) sh -c 'grep Cpus_allowed_list /proc/self/status'
[ "$(grep -c "Cpus_allowed_list:.$allowed\$" "$T/out")" -eq $((ncpu + 1)) ] ||
    fail "more processes than CPUs must not be bound: $(cat "$T/out")"
run 2 launch --cpu_affinity sometimes /bin/true
expect_err "--cpu_affinity expects auto or none"
ok "cpu affinity: own CPUs when processes <= CPUs, untouched with none or more processes"

# ---- rank prefixes: every line whole, prefixed with its own rank, exactly once ----
check_lines() { # FILE KIND N_PROCS N_LINES LEN
    local file=$1 kind=$2 np=$3 n=$4 len=$5
    awk -v kind="$kind" -v np="$np" -v n="$n" -v len="$len" '
        {
            if (match($0, /^\[rank[0-9]+\]: /) == 0) { print "unprefixed: " $0; bad = 1; next }
            pr = substr($0, 6, RLENGTH - 8); body = substr($0, RLENGTH + 1)
            split(body, f, " ")
            if (f[1] != kind || f[2] != "r" pr || length(body) != len || body !~ /x+$/) {
                print "mangled: " $0; bad = 1; next
            }
            seen[pr, f[3]]++
        }
        END {
            for (r = 0; r < np; r++) for (i = 0; i < n; i++)
                if (seen[r, "i" i] != 1) {
                    print "rank " r " line " i " seen " seen[r, "i" i] + 0; bad = 1
                }
            exit bad
        }' "$file" >"$T/awk" || { head -5 "$T/awk" >&2; fail "$kind lines in $file"; }
}
for np in 2 3; do
    run 0 launch -n "$np" "$P/print_lines" 300 200
    check_lines "$T/out" out "$np" 300 200
    check_lines "$T/err" err "$np" 300 200
done
# A last line without newline is still relayed (completed with one).
run 0 launch -n 2 "$P/print_lines" 3 50 --partial
check_lines "$T/out" out 2 3 50
# Lines longer than the launcher's 32 KiB line buffer arrive in prefixed pieces, no byte lost.
run 0 launch -n 2 "$P/print_lines" 2 70000
bad=$(grep -vc '^\[rank[01]\]: ' "$T/out")
[ "$bad" -eq 0 ] || fail "$bad unprefixed pieces of long lines"
nx=$(sed 's/^\[rank[01]\]: //' "$T/out" | tr -cd x | wc -c)
want=$((2 * 2 * (70000 - 10))) # "out rR iI " is 10 characters before the padding
[ "$nx" -eq "$want" ] || fail "long lines: $nx padding bytes, expected $want"
# One process: no prefix.
run 0 launch -n 1 "$P/print_lines" 2 20
[ "$(head -c 6 "$T/out")" = "out r0" ] || fail "-n 1 output is prefixed: $(head -1 "$T/out")"
ok "rank prefixes with 2 and 3 processes (stdout and stderr), partial and long lines"

# ---- --tee / --log_dir ----
run 0 launch -n 2 --tee 3 --log_dir "$T/logs" "$P/print_lines" 4 30
for r in 0 1; do
    [ "$(grep -c "^out r$r i[0-3] x*$" "$T/logs/rank$r.stdout")" -eq 4 ] || fail "rank$r.stdout"
    [ "$(grep -c "^err r$r i[0-3] x*$" "$T/logs/rank$r.stderr")" -eq 4 ] || fail "rank$r.stderr"
done
check_lines "$T/out" out 2 4 30
run 0 launch -n 2 --log_dir "$T/logs2/sub" "$P/print_lines" 1 20
[ -s "$T/logs2/sub/rank1.stdout" ] && [ -s "$T/logs2/sub/rank1.stderr" ] ||
    fail "--log_dir alone should write both streams"
run 0 launch -n 2 --tee 1 --log_dir "$T/logs3" "$P/print_lines" 1 20
[ -s "$T/logs3/rank0.stdout" ] && [ ! -e "$T/logs3/rank0.stderr" ] || fail "--tee 1 files"
run 0 launch -n 1 --tee 2 --log_dir "$T/logs4" "$P/print_lines" 2 20
[ "$(wc -l <"$T/logs4/rank0.stderr")" -eq 2 ] || fail "-n 1 --tee 2 file"
[ "$(wc -l <"$T/err")" -eq 2 ] || fail "-n 1 --tee 2 console"
touch "$T/file"
run 2 launch --log_dir "$T/file/sub" "$P/rank_info"
expect_err "not writable"
run 2 launch --log_dir "$T/file" "$P/rank_info"
expect_err "log directory '$T/file' is not a directory"
run 2 launch --log_dir "" "$P/rank_info"
expect_err "\-\-log_dir is empty"
# Log files are 0600; an old log of ours is emptied (and made 0600); a planted symbolic link,
# FIFO or hard link is refused and its target left alone (issue 11, item 7).
[ "$(stat -c %a "$T/logs/rank0.stdout")" = 600 ] ||
    fail "log mode $(stat -c %a "$T/logs/rank0.stdout")"
chmod 644 "$T/logs/rank1.stderr"
run 0 launch -n 2 --tee 3 --log_dir "$T/logs" "$P/print_lines" 1 20
[ "$(wc -l <"$T/logs/rank1.stderr")" -eq 1 ] && [ "$(stat -c %a "$T/logs/rank1.stderr")" = 600 ] ||
    fail "an old log was not emptied and made 0600"
mkdir -p "$T/planted"
echo "precious" >"$T/victim"
ln -s "$T/victim" "$T/planted/rank1.stdout"
run 1 launch -n 2 --log_dir "$T/planted" "$P/print_lines" 1 20
expect_err "cannot use log file $T/planted/rank1.stdout: it is a symbolic link"
[ "$(cat "$T/victim")" = precious ] || fail "the symlink's target was written"
rm "$T/planted/rank1.stdout"
ln "$T/victim" "$T/planted/rank1.stdout"
run 1 launch -n 2 --log_dir "$T/planted" "$P/print_lines" 1 20
expect_err "rank1.stdout: it has other hard links"
[ "$(cat "$T/victim")" = precious ] || fail "the hard link's target was truncated"
mkdir -p "$T/planted2"
mkfifo "$T/planted2/rank0.stderr"
run 1 launch -n 2 --log_dir "$T/planted2" "$P/print_lines" 1 20
expect_err "rank0.stderr: "
# A log file that cannot grow (a full disk; here the file-size limit, ulimit -f) is named once,
# and every line still reaches the console; the launcher used to die of SIGXFSZ, and on a full
# disk the files stayed short without a word.
bash -c 'ulimit -f 8 && exec "$@"' _ timeout -k 5 20 "$ACCEL" launch -n 2 --log_dir "$T/limited" \
    sh -c 'for i in $(seq 2000); do echo "line $i of a log longer than 8 KiB"; done' \
    2>"$T/err" | wc -l >"$T/out"
RC=${PIPESTATUS[0]}
[ "$RC" -eq 0 ] || fail "a log file at its size limit: launcher exited $RC"
[ "$(cat "$T/out")" -eq 4000 ] ||
    fail "a log file at its size limit: $(cat "$T/out") of 4000 lines relayed"
for r in 0 1; do
    expect_err "warning: cannot write log file $T/limited/rank$r.stdout: File too large;" \
        "it ends here"
done
# Two jobs given the same --log_dir (a job started twice): the second is refused, naming the
# file and the launcher that writes it, and the first one's logs stay whole (the second used
# to empty them and write over them).
timeout -k 5 20 "$ACCEL" launch -n 2 --log_dir "$T/shared" sh -c \
    'echo "first $RANK"; while [ ! -e "$0" ]; do sleep 0.05; done; echo "first end $RANK"' \
    "$T/shared-go" >"$T/first.out" 2>"$T/first.err" &
FIRST=$!
for _ in $(seq 200); do
    [ "$(cat "$T/shared/rank1.stdout" 2>/dev/null)" = "first 1" ] && break
    sleep 0.05
done
run 1 launch -n 2 --log_dir "$T/shared" sh -c 'echo "second $RANK"'
expect_err "cannot use log file $T/shared/rank0.stdout: another job is writing it," \
    "pid [0-9]* (two launches with the same --log_dir)"
touch "$T/shared-go"
wait "$FIRST" || fail "the first job of a shared --log_dir exited $?"
for r in 0 1; do
    [ "$(cat "$T/shared/rank$r.stdout")" = "$(printf 'first %s\nfirst end %s' $r $r)" ] ||
        fail "the first job's rank$r.stdout: $(cat "$T/shared/rank$r.stdout")"
done
run 0 launch -n 2 --log_dir "$T/shared" sh -c 'echo "third $RANK"' # free again
[ "$(cat "$T/shared/rank0.stdout")" = "third 0" ] || fail "a later job did not get the logs"
ok "--tee and --log_dir files (0600, planted links and FIFOs refused, a full file named," \
    "one job at a time)"

# ---- failures: exit status, summary, teardown of the others ----
run 3 launch -n 2 "$P/rank_info" --fail-rank 1 --code 3
expect_err "rank 1 failed: exit code 3"
expect_err "^    rank 1: failing on purpose with exit code 3$"
run 5 launch -n 1 "$P/rank_info" --fail-rank 0 --code 5
expect_err "rank 0 failed: exit code 5"
start=$SECONDS
run 137 launch -n 3 "$P/self_signal" 1 9 60 "$MARK"
expect_err "rank 1 failed: killed by SIGKILL (signal 9)"
expect_err "about to die by signal 9"
[ $((SECONDS - start)) -lt 10 ] || fail "teardown after a SIGKILL took $((SECONDS - start)) s"
no_survivors "after rank 1 was SIGKILLed"
run 139 launch -n 2 "$P/self_signal" 0 11 60 "$MARK"
expect_err "rank 0 failed: killed by SIGSEGV (signal 11)"
no_survivors "after rank 0 died of SIGSEGV"
run 134 launch -n 1 "$P/self_signal" 0 6
expect_err "SIGABRT"
ok "exit status propagation, signal deaths, failure summary"

# ---- signals to the launcher are forwarded; nobody survives ----
# launch_bg ARGS...: starts accel in the background (job control on, so SIGINT is not ignored)
# and waits until every rank printed "ready".
launch_bg() {
    local np=$1
    shift
    # Truncate here, not in the background command: its redirections happen asynchronously,
    # and the loop below must not count the "ready" lines of the previous launch.
    : >"$T/out"
    : >"$T/err"
    set -m
    "$ACCEL" launch -n "$np" "$@" >>"$T/out" 2>>"$T/err" &
    LPID=$!
    set +m
    for _ in $(seq 100); do
        [ "$(grep -c ready "$T/out")" -ge "$np" ] && return 0
        sleep 0.05
    done
    kill -KILL "$LPID"
    fail "processes did not start: $*"
}
wait_launcher() { # EXPECTED_RC WHAT
    local rc
    for _ in $(seq 200); do
        kill -0 "$LPID" 2>/dev/null || break
        sleep 0.05
    done
    kill -0 "$LPID" 2>/dev/null && { kill -KILL "$LPID"; fail "$2: launcher still running"; }
    wait "$LPID"
    rc=$?
    [ "$rc" -eq "$1" ] || fail "$2: launcher exited $rc, expected $1"
}
launch_bg 3 "$P/sleeper" 60 "$MARK"
kill -TERM "$LPID"
wait_launcher 143 "SIGTERM"
expect_err "received SIGTERM"
no_survivors "SIGTERM to the launcher"
launch_bg 2 "$P/sleeper" 60 "$MARK"
kill -INT "$LPID"
wait_launcher 130 "SIGINT"
expect_err "received SIGINT"
no_survivors "SIGINT to the launcher"
# Processes that ignore SIGTERM are killed after the grace period.
launch_bg 2 --grace_period 0.3 "$P/sleeper" 60 --ignore-term "$MARK"
kill -TERM "$LPID"
wait_launcher 143 "SIGTERM with children ignoring it"
no_survivors "SIGKILL escalation"
# A rank's own child that ignores the forwarded SIGINT (a shell's background job does) is
# stopped too once the grace period is over; it used to outlive the launcher.
launch_bg 2 --grace_period 0.5 sh -c '"$0" 60 "$1" & wait' "$P/sleeper" "$MARK"
kill -INT "$LPID"
wait_launcher 130 "SIGINT with a grandchild ignoring it"
no_survivors "SIGINT to the launcher, a rank's child ignoring it"
# SIGQUIT stops the job like SIGTERM (torchrun's set); SIGUSR1 is passed on to every process
# (here they die of it: the job fails naming it). Both used to kill the launcher outright.
ulimit -c 0 2>/dev/null # no core files from SIGQUIT
launch_bg 2 "$P/sleeper" 60 "$MARK"
kill -QUIT "$LPID"
wait_launcher 131 "SIGQUIT"
expect_err "received SIGQUIT, stopping all processes"
no_survivors "SIGQUIT to the launcher"
launch_bg 2 "$P/sleeper" 60 "$MARK"
kill -USR1 "$LPID"
wait_launcher 138 "SIGUSR1"
expect_err "received SIGUSR1, passed on to every process"
expect_err "failed: killed by SIGUSR1"
no_survivors "SIGUSR1 to the launcher"
# Every other signal whose default action ends a process (SIGALRM, SIGVTALRM, SIGPROF,
# SIGXCPU, a real-time one) stops the job like SIGTERM: forwarded, torn down, 128 + signal, a
# message naming it. Each used to kill the launcher outright, without a word.
for sig in ALRM:142 VTALRM:154 PROF:155 XCPU:152 RTMIN+1:163; do
    launch_bg 2 "$P/sleeper" 60 "$MARK"
    kill -s "${sig%:*}" "$LPID"
    wait_launcher "${sig#*:}" "SIG${sig%:*}"
    expect_err "received SIG${sig%:*}, stopping all processes"
    no_survivors "SIG${sig%:*} to the launcher"
done
# ... and the sweep of the ranks' children reaches one that ignores it (it outlived the
# launcher, which the signal killed before it could sweep).
launch_bg 2 --grace_period 0.5 sh -c '(trap "" ALRM; exec "$0" 60 "$1") & wait' "$P/sleeper" "$MARK"
kill -ALRM "$LPID"
wait_launcher 142 "SIGALRM with a grandchild ignoring it"
expect_err "received SIGALRM, stopping all processes"
no_survivors "SIGALRM to the launcher, a rank's child ignoring it"
ok "SIGTERM / SIGINT / SIGQUIT / SIGALRM / SIGVTALRM / SIGPROF / SIGXCPU / SIGRTMIN+1" \
    "forwarding and teardown, SIGKILL after the grace period, SIGUSR1 passed on"

# ---- leftover shared memory of the job is removed ----
run 0 launch -n 2 "$P/rank_info" --leak-shm
leaked=$(sed -n 's/^\[rank[01]\]: leaked //p' "$T/out")
[ "$(echo "$leaked" | wc -l)" -eq 2 ] || fail "the helper did not create its segments"
for f in $leaked; do
    [ ! -e "$f" ] || fail "$f survived the launcher"
done
expect_err "removed leftover shared memory"
ok "/dev/shm segments of the job removed at exit"

# ---- a rank SIGKILLed in the middle of an all-reduce (needs the shm backend) ----
if [ -x "$P/allreduce_loop" ] && "$ACCEL" env | grep -q '^- Communication backends:.*shm'; then
    start=$SECONDS
    timeout -k 5 30 "$ACCEL" launch -n 3 /bin/sh -c \
        'echo "JOB=$ACCEL_JOB_ID"; exec "$0" "$@"' "$P/allreduce_loop" \
        --iters 1000000 --count 4096 --die-rank 1 --die-after 50 >"$T/out" 2>"$T/err"
    RC=$?
    took=$((SECONDS - start))
    [ "$RC" -eq 137 ] || fail "SIGKILL mid-allreduce: launcher exited $RC, expected 137"
    [ "$took" -lt 10 ] || fail "SIGKILL mid-allreduce: the job took $took s to end"
    expect_err "rank 1 failed: killed by SIGKILL"
    job=$(sed -n 's/^\[rank0\]: JOB=//p' "$T/out")
    [ -n "$job" ] || fail "no job id printed"
    ls /dev/shm | grep -q "^accel-$(id -u)-$job" && fail "/dev/shm still holds segments of $job"
    ok "rank SIGKILLed mid-allreduce: job ended in ${took} s, rank named, /dev/shm clean"

    # A stopped (live but stuck) rank: the others time out naming it and fail; the launcher
    # then stops everyone, continuing the stopped process so that its SIGTERM takes effect.
    start=$SECONDS
    ACCEL_TIMEOUT=2 timeout -k 5 30 "$ACCEL" launch -n 3 "$P/allreduce_loop" --iters 1000000 \
        --count 4096 --stop-rank 1 --die-after 20 >"$T/out" 2>"$T/err"
    RC=$?
    took=$((SECONDS - start))
    [ "$RC" -eq 1 ] || fail "stopped rank: launcher exited $RC, expected 1"
    [ "$took" -lt 10 ] || fail "stopped rank: the job took $took s to end"
    grep -Eq '^\[rank[02]\]: .*ETIMEDOUT.*process(\(es\))? 1' "$T/err" ||
        fail "stopped rank: survivors did not name process 1"
    expect_err "rank [02] failed: exit code 1"
    expect_err "rank 1 killed by SIGTERM"
    ok "rank stopped mid-allreduce: survivors time out naming it, job ended in ${took} s"
else
    echo "note: skipped the SIGKILL-mid-allreduce scenario (needs the shm backend and" \
        "tests/progs/allreduce_loop)"
fi
echo "PASS"
