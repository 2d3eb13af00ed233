#!/usr/bin/env bash
# A segment planted by another user under a job's name is refused (issue 11, item 1): another
# uid creates /dev/shm/accel-<our uid>-<job>, mode 0666, holding a valid header of this very
# job (copied from a real one), before the job starts. Both processes of the job refuse it at
# once with a message naming the file and its owner (no wait for the timeout, no computing in
# someone else's memory), and leave it in place. Needs root to act as another user (a system
# user "accel-test-other" is created with useradd if missing, and kept): otherwise skipped.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
PROG=$B/tests/progs/allreduce_loop
[ -x "$PROG" ] || { echo "missing $PROG"; exit 1; }
OTHER=accel-test-other
if [ "$(id -u)" -ne 0 ] || ! command -v runuser >/dev/null; then
    echo "skipped: needs root and runuser to plant a segment as another user"
    exit 77
fi
if ! id "$OTHER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$OTHER" 2>/dev/null ||
        id "$OTHER" >/dev/null 2>&1 || { echo "skipped: useradd $OTHER failed"; exit 77; }
fi
other_uid=$(id -u "$OTHER")
tmp=$(mktemp -d)
uid=$(id -u)
job=foreign$$
seg=/dev/shm/accel-$uid-$job
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$tmp"
    rm -f "$seg"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.err; do echo "== $f"; cat "$f"; done
    exit 1
}

# A genuine segment of this job: process 0 alone creates it and waits for process 1.
ACCEL_JOB_ID=$job RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 ACCEL_TIMEOUT=60 \
    "$PROG" --iters 10 >"$tmp/g.out" 2>"$tmp/g.err" &
g=$!
for _ in $(seq 1 1000); do [ -e "$seg" ] && break; sleep 0.01; done
[ -e "$seg" ] || fail "process 0 never created $seg"
cp "$seg" "$tmp/copy"
kill -9 "$g"
wait "$g" 2>/dev/null
rm -f "$seg"

# The other user plants the copy under the job's name, readable and writable by all.
chmod 0644 "$tmp/copy"
chmod 0755 "$tmp"
runuser -u "$OTHER" -- sh -c "cat '$tmp/copy' > '$seg' && chmod 0666 '$seg'" ||
    fail "could not plant $seg as $OTHER"
[ "$(stat -c %u "$seg")" = "$other_uid" ] || fail "the planted file is not owned by $OTHER"

for r in 0 1; do
    ACCEL_JOB_ID=$job RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 ACCEL_TIMEOUT=60 \
        timeout -s KILL 30 "$PROG" --iters 10 >"$tmp/$r.out" 2>"$tmp/$r.err" &
    pids+=($!)
done
for r in 0 1; do
    wait "${pids[$r]}"
    rc=$?
    [ "$rc" -eq 1 ] ||
        fail "rank $r exited $rc, expected 1 (0: it used the planted segment; 137: it waited)"
    want="segment $seg belongs to uid $other_uid with mode 0666"
    grep -q "$want, not to this process's uid $uid" "$tmp/$r.err" ||
        fail "rank $r did not refuse $seg naming its owner"
done
[ -e "$seg" ] || fail "the planted segment was removed"
[ "$(stat -c %u "$seg")" = "$other_uid" ] || fail "the planted segment changed owner"
echo "PASS: both processes refused the segment planted by uid $other_uid"
