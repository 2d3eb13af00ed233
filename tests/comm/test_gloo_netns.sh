#!/usr/bin/env bash
# Two "machines" in two network namespaces (issue 16), where the test may create them (root,
# `ip netns`); otherwise it skips, saying why. The namespaces are joined by two veth pairs:
# 10.77.0.1 <-> 10.77.0.2 and 10.78.0.1 <-> 10.78.0.2. MASTER_ADDR is 10.77.0.1 (machine 0,
# which listens on the interface of the route to it); machine 1 listens on its other interface
# (ACCEL_SOCKET_IFNAME), so machine 0 reaches it over the second link. Jobs: gloo 2 x 1 and
# hier 2 x 2, each checking every allreduce result (tests/progs/allreduce_loop), then a process
# of machine 1 killed mid-loop: machine 0's processes fail naming it.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/machines.sh"
gloo_built || exit 77
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null 2>&1; then
    echo "skip: network namespaces need root and iproute2's ip"
    exit 77
fi
id=$$
ns0=accel-m0-$id ns1=accel-m1-$id
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    ip netns del "$ns0" 2>/dev/null
    ip netns del "$ns1" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
if ! ip netns add "$ns0" 2>"$tmp/err" || ! ip netns add "$ns1" 2>>"$tmp/err"; then
    echo "skip: cannot create network namespaces here: $(head -n 1 "$tmp/err")"
    exit 77
fi
set -e
for link in a b; do
    ip link add "av${id}${link}0" type veth peer name "av${id}${link}1"
    ip link set "av${id}${link}0" netns "$ns0"
    ip link set "av${id}${link}1" netns "$ns1"
done
ip -n "$ns0" addr add 10.77.0.1/24 dev "av${id}a0"
ip -n "$ns1" addr add 10.77.0.2/24 dev "av${id}a1"
ip -n "$ns0" addr add 10.78.0.1/24 dev "av${id}b0"
ip -n "$ns1" addr add 10.78.0.2/24 dev "av${id}b1"
for ns in "$ns0" "$ns1"; do
    ip -n "$ns" link set lo up
    for dev in $(ip -n "$ns" -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^av"); do
        ip -n "$ns" link set "$dev" up
    done
done
set +e

# job NAME L [ARGS...]: machine g runs in namespace g; rank r's output in $tmp/NAME.r.
job() {
    local name=$1 l=$2
    shift 2
    pids=()
    for g in 0 1; do
        local ns=$ns0 ifname=()
        if [ "$g" = 1 ]; then
            ns=$ns1
            ifname=(ACCEL_SOCKET_IFNAME="av${id}b1")
        fi
        for lr in $(seq 0 $((l - 1))); do
            local r=$((g * l + lr))
            ip netns exec "$ns" env RANK=$r WORLD_SIZE=$((2 * l)) LOCAL_RANK=$lr \
                LOCAL_WORLD_SIZE=$l GROUP_RANK=$g ACCEL_NUM_MACHINES=2 MASTER_ADDR=10.77.0.1 \
                MASTER_PORT=29500 ACCEL_TIMEOUT=30 ACCEL_LOG_LEVEL=info "${ifname[@]}" \
                "$B/tests/progs/allreduce_loop" "$@" >"$tmp/$name.$r.out" 2>"$tmp/$name.$r.err" &
            pids+=($!)
        done
    done
    (sleep 60; kill -9 "${pids[@]}" 2>/dev/null) >/dev/null 2>&1 &
    watchdog=$!
}

fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.err; do echo "== $f"; tail -n 5 "$f"; done
    exit 1
}

for l in 1 2; do
    name=ok-$l
    job "$name" "$l" --iters 20 --count 300000
    for p in "${pids[@]}"; do wait "$p" || fail "$name: a process failed"; done
    kill "$watchdog" 2>/dev/null
    grep -q "listening on av${id}b1" "$tmp/$name.$l.err" ||
        fail "$name: machine 1 did not listen on its second interface"
    grep -q "listening on 10.77.0.1" "$tmp/$name.0.err" ||
        fail "$name: machine 0 did not listen on the route to MASTER_ADDR"
    echo "$name: 2 machines x $l in two namespaces: every allreduce correct"

    name=kill-$l
    dead=$((2 * l - 1))
    job "$name" "$l" --iters 100000 --count 300000 --die-rank "$dead" --die-after 5
    for r in $(seq 0 $((l - 1))); do
        wait "${pids[$r]}" && fail "$name: process $r exited 0 after process $dead died"
        grep -q "EPEER.*process $dead " "$tmp/$name.$r.err" ||
            fail "$name: process $r did not name process $dead"
    done
    kill -9 "${pids[@]}" 2>/dev/null
    kill "$watchdog" 2>/dev/null
    echo "$name: machine 0 named the dead process $dead"
done
echo "test_gloo_netns: ok"
