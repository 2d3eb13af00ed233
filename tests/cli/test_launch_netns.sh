#!/usr/bin/env bash
# accel launch on two "machines" with their own network (issue 16): two network namespaces
# joined by a veth pair, 10.233.<n>.1 and 10.233.<n>.2, no loopback between them. Machine 0's
# launcher serves the rendezvous on its veth address; machine 1 reaches it across the link.
#  1. --preflight and a 2 x 2 job: both launchers agree (summary, job id, every rank once), the
#     preflight reaches both launchers across the link, and the ranks' collectives work across
#     it (or, in a build without a backend across machines, every rank reports the refusal).
#  2. Machine 1 given an address where nobody is (10.233.<n>.3): it fails after the rendezvous
#     timeout naming that address, and machine 0 fails naming machine rank 1 as missing.
# Skips (77) where network namespaces cannot be made (not root, no `ip`, a container without
# CAP_NET_ADMIN).
# ACCEL_TEST_LABELS: waits
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
CHECK=$B/tests/progs/machine_check
[ -x "$ACCEL" ] && [ -x "$CHECK" ] || { echo "missing build outputs"; exit 1; }
command -v ip >/dev/null || { echo "SKIP: no ip command (iproute2)"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }
tag=$$
ns0=accel-mn0-$tag
ns1=accel-mn1-$tag
net=10.233.$((tag % 250))
T=$(mktemp -d)
pids=
cleanup() {
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    ip netns del "$ns0" 2>/dev/null
    ip netns del "$ns1" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
ip netns add "$ns0" 2>/dev/null && ip netns add "$ns1" 2>/dev/null ||
    { echo "SKIP: cannot create network namespaces here"; exit 77; }
ip link add "va$tag" type veth peer name "vb$tag" &&
    ip link set "va$tag" netns "$ns0" && ip link set "vb$tag" netns "$ns1" &&
    ip -n "$ns0" addr add "$net.1/24" dev "va$tag" &&
        ip -n "$ns1" addr add "$net.2/24" dev "vb$tag" &&
    ip -n "$ns0" link set "va$tag" up && ip -n "$ns1" link set "vb$tag" up &&
    ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up ||
    { echo "SKIP: cannot set up a veth pair between the namespaces"; exit 77; }
source "$(dirname "$0")/launch_common.sh" # has, fail, bg, finish
# start NAME NAMESPACE MACHINE ARGS...
start() {
    local name=$1 ns=$2 m=$3
    shift 3
    bg "$name" ip netns exec "$ns" "$ACCEL" launch --num_machines 2 --machine_rank "$m" "$@"
}

# ---- 1. a job across the link, with --preflight ----
start m0 "$ns0" 0 --main_process_ip "$net.1" --preflight -n 4 "$CHECK"
start m1 "$ns1" 1 --main_process_ip "$net.1" --preflight -n 4 "$CHECK"
finish m0
finish m1
[ "$rc_m0" = 0 ] && [ "$rc_m1" = 0 ] || fail "launchers exited $rc_m0, $rc_m1"
for m in m0 m1; do
    grep -q "master $net.1:29500" "$T/$m.err" || fail "$m: no summary naming the master $net.1"
    has "$T/$m.err" "preflight: all 4 ranks reached the rendezvous" \
        "at $net.1:29500 and the launchers of all 2 machines" ||
        fail "$m: preflight did not pass"
done
[ "$(cat "$T/m0.out" "$T/m1.out" | sed -n 's/.*JOB=\([0-9a-f]*\) .*/\1/p' | sort -u |
    wc -l)" = 1 ] ||
    fail "job ids differ"
for r in 0 1 2 3; do
    grep -q "^\[rank$r\]: JOB=" "$T/m0.out" "$T/m1.out" || fail "rank $r did not run"
done
grep -q "^\[rank[01]\]: JOB=" "$T/m0.out" && grep -q "^\[rank[23]\]: JOB=" "$T/m1.out" ||
    fail "ranks not on their machines"
ok=$(cat "$T"/m0.out "$T"/m1.out | grep -c "COLLECTIVES-OK")
refused=$(cat "$T"/m0.out "$T"/m1.out | grep -c "NO-CROSS-MACHINE-BACKEND")
if [ "$ok" = 4 ]; then
    echo "ok: two namespaces joined by a veth pair: rendezvous on $net.1, preflight, 2 x 2 job," \
        "collectives ($(grep -ho 'backend=.*' "$T/m0.out" | head -1))"
elif [ "$refused" = 4 ]; then
    echo "ok: two namespaces joined by a veth pair: rendezvous on $net.1, preflight, 2 x 2 job;" \
        "collectives NOT RUN (no backend across machines in this build)"
else
    fail "$ok ranks did the collectives, $refused were refused, of 4"
fi

# ---- 2. machine 1 given a master address where nobody is ----
start m0 "$ns0" 0 --main_process_ip "$net.1" --rdzv_conf timeout=3 -n 2 "$CHECK"
start m1 "$ns1" 1 --main_process_ip "$net.3" --rdzv_conf timeout=2 -n 2 "$CHECK"
finish m0
finish m1
[ "$rc_m0" != 0 ] && [ "$rc_m1" != 0 ] || fail "wrong master address: exited $rc_m0, $rc_m1"
has "$T/m1.err" "machine 1: no rendezvous with the main" \
    "process (machine 0's launcher) at $net.3:29500" ||
    fail "machine 1 did not name the unreachable address"
grep -q "machine rank(s) 1 of 2 did not arrive" "$T/m0.err" ||
    fail "machine 0 did not name machine 1"
echo "ok: a wrong master address across the link: machine 1 names it, machine 0 names machine 1"
