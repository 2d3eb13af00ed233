#!/usr/bin/env bash
# Three "machines" in three network namespaces (issue 16), where the test may create them (root,
# `ip netns`, veth and bridge links); otherwise it skips, saying why. Two networks join them,
# each a bridge in a fourth namespace (the switch): a, 10.77.0.<m+1>, and b, 10.78.0.<m+1>, for
# machine m; b is dual-stack (also fd78::<m+1>), a is IPv4 (and link-local fe80:: addresses).
# MASTER_ADDR is 10.77.0.1 (machine 0, which listens on the interface of the route to it);
# machine 1 listens on its interface on b (ACCEL_SOCKET_IFNAME), so the others reach it over the
# second network. Jobs:
#  - gloo 2 x 1 and hier 2 x 2 on machines 0 and 1, each checking every allreduce result
#    (tests/progs/allreduce_loop), then a process of machine 1 killed mid-loop: machine 0's
#    processes fail naming it;
#  - gloo 3 x 1 with ACCEL_GLOO_RING unset: a peer on another host turns gloo's ring on (the
#    info line says so) and tests/dist/test_comm_backends holds every result to the ring-order
#    reference (ACCEL_TEST_RING=1), bit for bit: every collective x dtype x op at 1 element;
#    f32 and f64 SUM, MIN and AVG at 32767 (f64 one under 256 KiB: rank order), 32768 (f64 256
#    KiB), 65535 (f32 one under: rank order), 65536 and 1310723 (chunks of several segments,
#    with remainders); the other sampled dtypes and the wire dtypes (rank order) alike;
#  - the same with ACCEL_GLOO_RING=0: no ring, every result in rank order (ACCEL_TEST_RING=0);
#  - hier 3 x 2 (allreduce_loop): every local rank's gloo across the machines rings;
#  - IPv6, gloo 2 x 1 with MASTER_ADDR=fd78::1: machine 1's interface on b is dual-stack, and
#    it listens on its IPv6 address, the family of the route to MASTER_ADDR (allreduce_loop);
#    given its interface on a instead (IPv4 and link-local only), it listens in IPv4, saying
#    why, and both processes fail at once naming the two families (machine 1 its interface);
#    both machines given their interface on a: both listen in IPv4, and the job runs;
#  - an IPv6 link-local MASTER_ADDR (machine 0's on a, with each machine's scope id): every
#    process refuses it at once, naming it and what to use instead.
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
sw=accel-sw-$id
ns=(accel-m0-$id accel-m1-$id accel-m2-$id)
tmp=$(mktemp -d)
pids=()
watchdog= current=
cleanup() {
    for p in "${pids[@]}" $watchdog; do kill -9 "$p" 2>/dev/null; done
    # Each veth has an end in a namespace, so deleting the namespaces deletes every link.
    for n in "${ns[@]}" "$sw"; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# Machine m's interface on network x (a or b) is av<id><x><m>; its switch port as<id><x><m>.
# Every link is made inside the namespaces: nothing is left in this one if a step fails.
network() {
    ip netns add "$sw" || return 1
    for x in a b; do
        ip -n "$sw" link add "br$x" type bridge && ip -n "$sw" link set "br$x" up || return 1
    done
    for m in 0 1 2; do
        ip netns add "${ns[$m]}" && ip -n "${ns[$m]}" link set lo up || return 1
        for x in a b; do
            local dev=av$id$x$m port=as$id$x$m net=10.77.0
            [ "$x" = b ] && net=10.78.0
            ip -n "${ns[$m]}" link add "$dev" type veth peer name "$port" netns "$sw" &&
                ip -n "$sw" link set "$port" master "br$x" up &&
                ip -n "${ns[$m]}" addr add "$net.$((m + 1))/24" dev "$dev" &&
                ip -n "${ns[$m]}" link set "$dev" up || return 1
            # (nodad: usable at once, not tentative while duplicate detection runs)
            if [ "$x" = b ]; then
                ip -n "${ns[$m]}" addr add "fd78::$((m + 1))/64" dev "$dev" nodad || return 1
            fi
        done
    done
}
if ! network 2>"$tmp/err"; then
    echo "skip: cannot make the machines' networks here: $(head -n 1 "$tmp/err")"
    exit 77
fi

# job NAME M L [ENV=VALUE...] -- PROG ARGS...: machine g (of M) runs in namespace g, machine 1
# listening on interface $ifname1 (network b's), machine 0 on $ifname0 when set (else the
# route's); rank r's output in $tmp/NAME.r.out and .err.
ifname0= ifname1=av${id}b1
job() {
    local name=$1 n_machines=$2 l=$3
    shift 3
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    current=$name
    pids=()
    for g in $(seq 0 $((n_machines - 1))); do
        local ifname=()
        [ "$g" = 0 ] && [ -n "$ifname0" ] && ifname=(ACCEL_SOCKET_IFNAME="$ifname0")
        [ "$g" = 1 ] && ifname=(ACCEL_SOCKET_IFNAME="$ifname1")
        for lr in $(seq 0 $((l - 1))); do
            local r=$((g * l + lr))
            ip netns exec "${ns[$g]}" env RANK=$r WORLD_SIZE=$((n_machines * l)) \
                LOCAL_RANK=$lr LOCAL_WORLD_SIZE=$l GROUP_RANK=$g ACCEL_NUM_MACHINES=$n_machines \
                MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 ACCEL_TIMEOUT=30 ACCEL_LOG_LEVEL=info \
                "${ifname[@]}" "${envs[@]}" "$@" >"$tmp/$name.$r.out" 2>"$tmp/$name.$r.err" &
            pids+=($!)
        done
    done
    (sleep 60; kill -9 "${pids[@]}" 2>/dev/null) >/dev/null 2>&1 &
    watchdog=$!
}

# fail MESSAGE: says it, with the last lines of the job's processes' stderr.
fail() {
    echo "FAIL: $*"
    for f in "$tmp/$current".*.err; do echo "== $f"; tail -n 5 "$f"; done
    exit 1
}

# finish NAME: every process of the job exited 0.
finish() {
    for p in "${pids[@]}"; do wait "$p" || fail "$1: a process failed"; done
    kill "$watchdog" 2>/dev/null
}

for l in 1 2; do
    name=ok-$l
    job "$name" 2 "$l" -- "$B/tests/progs/allreduce_loop" --iters 20 --count 300000
    finish "$name"
    grep -q "listening on av${id}b1 (10.78.0.2)" "$tmp/$name.$l.err" ||
        fail "$name: machine 1 did not listen on its second interface's IPv4 address"
    grep -q "listening on 10.77.0.1" "$tmp/$name.0.err" ||
        fail "$name: machine 0 did not listen on the route to MASTER_ADDR"
    echo "$name: 2 machines x $l in two namespaces: every allreduce correct"

    name=kill-$l
    dead=$((2 * l - 1))
    job "$name" 2 "$l" -- "$B/tests/progs/allreduce_loop" --iters 100000 --count 300000 \
        --die-rank "$dead" --die-after 5
    for r in $(seq 0 $((l - 1))); do
        # (2>/dev/null: not bash's notice of the rank that killed itself)
        wait "${pids[$r]}" 2>/dev/null && fail "$name: process $r exited 0 after process $dead died"
        grep -q "EPEER.*process $dead " "$tmp/$name.$r.err" ||
            fail "$name: process $r did not name process $dead"
    done
    kill -9 "${pids[@]}" 2>/dev/null
    wait "${pids[@]}" 2>/dev/null
    kill "$watchdog" 2>/dev/null
    echo "$name: machine 0 named the dead process $dead"
done

# gloo 3 x 1: the ring when ACCEL_GLOO_RING is unset (auto: peers on other hosts), none with 0.
counts="1 32767 32768 65535 65536 1310723"
ring_line="f32/f64 reductions from 256 KiB in ring order"
for setting in auto 0; do
    name=ring-$setting start=$SECONDS
    # auto: ACCEL_GLOO_RING unset, the reference in ring order (ACCEL_TEST_RING=1).
    gloo_ring=() order=1 order_name=ring
    [ "$setting" = 0 ] && gloo_ring=(ACCEL_GLOO_RING=0) order=0 order_name=rank
    job "$name" 3 1 "${gloo_ring[@]}" ACCEL_TEST_RING=$order ACCEL_TEST_BACKEND=gloo \
        ACCEL_TEST_COUNTS="$counts" -- "$B/tests/test_comm_backends"
    finish "$name"
    for r in 0 1 2; do
        grep -q "gloo: 3 processes connected" "$tmp/$name.$r.err" ||
            fail "$name: process $r logged no connection line"
        if [ "$setting" = auto ]; then
            grep -q "$ring_line" "$tmp/$name.$r.err" ||
                fail "$name: process $r's connection line does not say the ring is on"
        elif grep -q "ring order" "$tmp/$name.$r.err"; then
            fail "$name: process $r's connection line says the ring is on"
        fi
    done
    grep -q "listening on av${id}b1" "$tmp/$name.1.err" ||
        fail "$name: machine 1 did not listen on its second interface"
    echo "$name ($((SECONDS - start)) s): 3 machines x 1, ACCEL_GLOO_RING=$setting:" \
        "$(cat "$tmp/$name.0.out") ($order_name order)"
done
# hier 3 x 2: each local rank's allreduce of its shard across the machines (150000 f32 here) is
# a gloo call on 3 processes over the network, so it rings too.
name=ring-hier
job "$name" 3 2 -- "$B/tests/progs/allreduce_loop" --iters 20 --count 300000
finish "$name"
for r in 0 1 2 3 4 5; do
    grep -q "$ring_line" "$tmp/$name.$r.err" ||
        fail "$name: process $r's gloo connection line does not say the ring is on"
done
echo "$name: hier 3 machines x 2, ACCEL_GLOO_RING unset: both local ranks' gloo across the" \
    "machines rings, every allreduce correct"

# IPv6 (the ENV arguments come after job's own, so MASTER_ADDR=fd78::1 wins): machine 0 listens
# on the route to fd78::1, machine 1 on its dual-stack interface, in IPv6 as the route's family.
name=ipv6 start=$SECONDS
job "$name" 2 1 MASTER_ADDR=fd78::1 -- "$B/tests/progs/allreduce_loop" --iters 20 --count 300000
finish "$name"
grep -q "listening on av${id}b1 (fd78::2)" "$tmp/$name.1.err" ||
    fail "$name: machine 1 did not listen on its interface's IPv6 address"
grep -q "listening on fd78::1" "$tmp/$name.0.err" ||
    fail "$name: machine 0 did not listen on the route to MASTER_ADDR"
echo "$name ($((SECONDS - start)) s): 2 machines x 1, MASTER_ADDR=fd78::1, machine 1's" \
    "interface dual-stack: listening in IPv6, every allreduce correct"
# Machine 1's interface on a has no IPv6 address but its link-local one, which no other machine
# can reach: it listens in IPv4, and both processes fail at once (not at the deadline), naming
# the families (machine 1 also its interface, and why it listens in IPv4).
name=ipv6-v4 start=$SECONDS ifname1=av${id}a1
job "$name" 2 1 MASTER_ADDR=fd78::1 -- "$B/tests/progs/allreduce_loop" --iters 20
for r in 0 1; do
    wait "${pids[$r]}" && fail "$name: process $r succeeded"
done
kill "$watchdog" 2>/dev/null
grep -q "interface $ifname1 has no IPv6 address other than link-local.*listening in IPv4" \
    "$tmp/$name.1.err" || fail "$name: machine 1 did not say why it listens in IPv4"
grep -q "a peer listens in IPv6 at \[fd78::1\]" "$tmp/$name.1.err" ||
    fail "$name: machine 1 did not name machine 0's family"
grep -q -e "a peer listens in IPv4 at \[10.77.0.2\]" -e "interface $ifname1 has no IPv6" \
    "$tmp/$name.0.err" || fail "$name: machine 0 did not name machine 1's family"
echo "$name ($((SECONDS - start)) s): machine 1's interface without IPv6: both processes" \
    "failed naming the families"
# Both machines name their interface on a: both listen in IPv4, as before the route's family
# counted (every allreduce checked).
name=ipv6-allv4 start=$SECONDS ifname0=av${id}a0
job "$name" 2 1 MASTER_ADDR=fd78::1 -- "$B/tests/progs/allreduce_loop" --iters 20 --count 300000
finish "$name"
for r in 0 1; do
    grep -q "listening on av${id}a$r (10.77.0.$((r + 1)))" "$tmp/$name.$r.err" ||
        fail "$name: machine $r did not listen on its interface's IPv4 address"
done
echo "$name ($((SECONDS - start)) s): MASTER_ADDR=fd78::1, both machines naming an interface" \
    "without IPv6: listening in IPv4, every allreduce correct"
# An IPv6 link-local MASTER_ADDR, machine 0's own on network a, each machine giving the scope
# id of its interface there: refused at once by every process, naming the address and what to
# use instead (before, the store worked over it and Gloo failed to bind, "Invalid argument").
name=link-local start=$SECONDS
ll=$(ip -n "${ns[0]}" -6 -o addr show dev "av${id}a0" scope link | awk '{ print $4 }' |
    cut -d/ -f1 | head -n 1)
if [ -z "$ll" ]; then
    echo "$name: skip: interface av${id}a0 has no IPv6 link-local address here"
else
    current=$name pids=()
    for m in 0 1; do
        ip netns exec "${ns[$m]}" env RANK=$m WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
            GROUP_RANK=$m ACCEL_NUM_MACHINES=2 MASTER_ADDR="$ll%av${id}a$m" MASTER_PORT=29500 \
            ACCEL_TIMEOUT=30 "$B/tests/progs/allreduce_loop" --iters 20 \
            >"$tmp/$name.$m.out" 2>"$tmp/$name.$m.err" &
        pids+=($!)
    done
    (sleep 60; kill -9 "${pids[@]}" 2>/dev/null) >/dev/null 2>&1 &
    watchdog=$!
    for m in 0 1; do
        wait "${pids[$m]}" && fail "$name: process $m succeeded"
        grep -q "EINVAL.*MASTER_ADDR=$ll%av${id}a$m is an IPv6 link-local address" \
            "$tmp/$name.$m.err" || fail "$name: process $m did not refuse the address"
        grep -q "global or unique-local (fd00::/8) IPv6 address, or an IPv4 one" \
            "$tmp/$name.$m.err" || fail "$name: process $m did not say what to use instead"
    done
    kill "$watchdog" 2>/dev/null
    echo "$name ($((SECONDS - start)) s): MASTER_ADDR=$ll%<interface>: both processes refused it"
fi
echo "test_gloo_netns: ok"
