#!/usr/bin/env bash
# Hybrid sharding on two "machines" of 2 processes (two launchers on this host; hier: shm
# inside, gloo across; docs/training.md, "Hybrid sharding"; one machine with forced groups:
# tests/ckpt/test_zero_hybrid.sh).
#  - tests/progs/zero_train (a small GPT, AdamW, accumulation 2, clipping) under
#    `accel launch --fsdp_sharding_strategy HYBRID_SHARD` shards inside each machine. hier sums
#    a machine's processes first, then the machines, as the hybrid reduce-scatter and the
#    cross all-reduce do, and both averages divide by powers of two: the weights are
#    bit-identical to an uninterrupted DDP run on the same two machines. Its checkpoint
#    (saved at step 3) resumes there bit-identically.
#  - tests/dist/test_zero and test_zero_join pass with every stage hybrid (stages 1-3 against
#    stage 0 bit for bit: fp32, bf16, fp16 with an overflow, freezing with bf16 compression,
#    accumulation 3, clipping, two groups with a cosine schedule, sync_each_batch within 1e-5,
#    join).
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
here=$(cd "$(dirname "$0")" && pwd)
ACCEL=$B/accel
Z=$B/tests/progs/zero_train
[ -x "$ACCEL" ] && [ -x "$Z" ] || { echo "missing $ACCEL or $Z"; exit 1; }
source "$here/../comm/machines.sh"
T=$(mktemp -d)
trap 'kill -9 "${MACHINE_PIDS[@]}" 2>/dev/null; rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1
fail() {
    echo "FAIL: $*"
    for f in "$T"/*/*.err; do [ -s "$f" ] && { echo "== $f"; tail -n 20 "$f"; }; done
    exit 1
}
same() { "$Z" compare "$1" "$2" "$3" || fail "$1 vs $2 (tolerance $3)"; }

gloo_built || exit 77
mkdir -p "$T/mref" "$T/mhy" "$T/mres"
machines_launch "$T/mref" 2 2 -- "$Z" 0 6 "$T/mref/w"
machines_wait 250 || fail "two machines, DDP"
machines_launch "$T/mhy" 2 2 ACCEL_LOG_LEVEL=info -- --fsdp_sharding_strategy HYBRID_SHARD \
    "$Z" 3 6 "$T/mhy/w" save 6 "$T/mhy/c" "$T/mhy/m"
machines_wait 250 || fail "two machines, HYBRID_SHARD"
grep -q "ZeRO stage 3 sharded over 2 processes (group 1), replicated 2 times" "$T"/mhy/m1.* ||
    fail "HYBRID_SHARD: machine 1 did not shard inside the machine"
same "$T/mhy/w" "$T/mref/w" 0
machines_launch "$T/mres" 2 2 -- --fsdp_sharding_strategy HYBRID_SHARD \
    "$Z" 3 6 "$T/mres/w" load 6 "$T/mhy/c"
machines_wait 250 || fail "two machines, HYBRID_SHARD resumed"
same "$T/mres/w" "$T/mhy/w" 0
for t in test_zero test_zero_join; do
    mkdir -p "$T/$t"
    machines_launch "$T/$t" 2 2 ACCEL_ZERO_SHARD_SIZE=machine ACCEL_LOG_LEVEL=info -- "$B/tests/$t"
    machines_wait 250 || fail "two machines, $t with every stage hybrid"
    grep -q "replicated 2 times" "$T/$t/m1.err" || fail "$t: no hybrid sharding in the log"
done
echo "test_zero_hybrid_machines: ok"
