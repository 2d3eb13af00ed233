#!/usr/bin/env bash
# Many machines on one host, over an emulated network (issue 16's benchmark, not a test).
#
# Each "machine" is a network namespace with one interface into a switch (a bridge in a namespace
# of its own). Every link is shaped with tc's token bucket at RATE in each direction, so what
# crosses between machines is as slow as a real network's link (1 Gbit/s by default) while the
# processes of one machine still talk through memory. Then, for each layout, two or more
# launchers (one per machine) run bench/collectives' allreduce with Gloo's own ring (what
# PyTorch's gloo process group runs) measured in the same run:
#   gloo 2x1, gloo 4x1   flat gloo, one process per machine (vs_raw: accel / Gloo's own)
#   hier 2x2, gloo 2x2   2 machines x 2 processes: hier against flat gloo on the same processes
#
#   bench/machines_netns.sh BUILD_DIR [RATE [MIN_KIB [MAX_MIB [LAYOUTS...]]]]
#   bench/machines_netns.sh build 1gbit 1024 64 hier:2x2 gloo:2x2
#   COLL=allgather QUEUE=50ms bench/machines_netns.sh build   (another collective, deeper queues)
#   MAX_ITERS=16 bench/machines_netns.sh build ...   (at most 16 calls per batch: shorter runs)
#   BASELINE=0 ...    accel alone (no Gloo ring in the run)
#   PEER=torch PYTHON=python3 ...   PyTorch's gloo process group as the baseline instead of
#                     Gloo's own: bench/peers/torch_gloo.py in the same processes (needs torch);
#                     PER_CALL=1 adds its "# per call" lines (single calls' times; CPU, TCP a call)
#                     IN_PLACE=1 times accel's allreduce in place too (torch's only form)
#   ROUNDS=5 ...      every layout 5 times, then the median [min-max] of each row
#   bench/machines_netns.sh build,/tmp/old/build ...   two builds (comma-separated), alternated
#                     in each round, on the same namespaces; the summary names each build
#   MTU=1500 ...      the links' MTU (default 9000, jumbo frames). At 1500, shaping and bridging six
#                     times the packets kept this 2-CPU host 77-90% busy at 1 Gbit/s, so the run
#                     measured the host's packet work more than the link (docs/performance.md,
#                     seventeenth pass); the passes before it ran at 1500
#   CC=cubic ...      the machines' TCP congestion control (default: the host's, bbr here); the
#                     host's allowed list gains it for the run and is restored after
# After each layout a "#" line counts the packets the links' queues dropped and the TCP segments
# every machine retransmitted during it, and how busy the host's CPUs were: shaping and bridging
# the packets is kernel work on the same CPUs (on 2 of them at 1 Gbit/s, 17-46% busy at MTU 9000,
# 77-90% at 1500: docs/performance.md, seventeenth pass), so read a layout's ratio with that share
# in mind.
#
# Needs root, iproute2 (ip, tc) and a build with Gloo. The CPUs are still shared by every
# process: on a 2-core host, 4 processes oversubscribe it.
set -u
BUILDS=${1:?usage: bench/machines_netns.sh BUILD_DIR[,BUILD_DIR...] [RATE [MIN_KIB [MAX_MIB [LAYOUTS...]]]]}
IFS=, read -r -a BUILD_DIRS <<<"$BUILDS"
ROUNDS=${ROUNDS:-1}
RATE=${2:-1gbit}
QUEUE=${QUEUE:-5ms}
COLL=${COLL:-allreduce}
MTU=${MTU:-9000}
MAX_ITERS=${MAX_ITERS:-2000}
BASELINE=${BASELINE:-1}
MIN_KIB=${3:-1024}
MAX_MIB=${4:-64}
shift $(($# < 4 ? $# : 4))
LAYOUTS=("$@")
[ ${#LAYOUTS[@]} -gt 0 ] || LAYOUTS=(gloo:2x1 gloo:4x1 hier:2x2 gloo:2x2)
if [ "$(id -u)" -ne 0 ] || ! command -v tc >/dev/null; then
    echo "machines_netns: needs root and iproute2 (ip, tc)" >&2
    exit 1
fi
PEER=${PEER:-gloo}
case $PEER in
gloo) base_name="Gloo's own" ;;
torch) base_name="torch gloo"
    torch_gloo=$(dirname "$0")/peers/torch_gloo.py
    "${PYTHON:-python3}" -c "import torch" 2>/dev/null ||
        { echo "machines_netns: PEER=torch: no torch in ${PYTHON:-python3}" >&2; exit 1; } ;;
*) echo "machines_netns: PEER is gloo or torch" >&2; exit 1 ;;
esac
for B in "${BUILD_DIRS[@]}"; do
    [ -x "$B/bench/collectives" ] || { echo "machines_netns: no $B/bench/collectives" >&2; exit 1; }
done

id=$$
sw=accel-sw-$id
out=$(mktemp -d)
made=()
allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
cleanup() {
    for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$allowed"
    rm -rf "$out"
}
trap cleanup EXIT
if [ -n "${CC:-}" ]; then # a namespace may only choose from the host's allowed list
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$allowed $CC"
fi

# machine M's namespace: accel-bm<id>-M, address 10.80.0.(M+1), link shaped at RATE both ways.
machine_ns() { echo "accel-bm$id-$1"; }
add_machine() {
    local m=$1 ns
    ns=$(machine_ns "$m")
    ip netns add "$ns" && made+=("$ns")
    ip link add "bm${id}m$m" type veth peer name "bm${id}s$m"
    ip link set "bm${id}m$m" netns "$ns"
    ip link set "bm${id}s$m" netns "$sw"
    ip -n "$ns" addr add "10.80.0.$((m + 1))/24" dev "bm${id}m$m"
    ip -n "$ns" link set lo up
    if [ -n "${CC:-}" ]; then
        ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_congestion_control="$CC"
    fi
    ip -n "$ns" link set "bm${id}m$m" mtu "$MTU"
    ip -n "$sw" link set "bm${id}s$m" mtu "$MTU"
    ip -n "$ns" link set "bm${id}m$m" up
    ip -n "$sw" link set "bm${id}s$m" master br0 up
    # The queue holds QUEUE (5 ms) at RATE, as a switch port would; beyond it packets drop and TCP
    # backs off.
    local shape=(root tbf rate "$RATE" burst 64kb latency "$QUEUE")
    ip netns exec "$ns" tc qdisc add dev "bm${id}m$m" "${shape[@]}"
    ip netns exec "$sw" tc qdisc add dev "bm${id}s$m" "${shape[@]}"
}

# "DROPPED RETRANS": packets dropped by every shaped queue, TCP segments retransmitted by every
# machine, so far.
counters() {
    local d=0 r=0 ns x
    for ns in "${made[@]}"; do
        x=$(ip netns exec "$ns" tc -s qdisc show 2>/dev/null | awk '/dropped/ {
            for (i = 1; i < NF; i++) if ($i ~ /dropped/) { v = $(i + 1); sub(",", "", v); s += v } }
            END { print s + 0 }')
        d=$((d + x))
        x=$(ip netns exec "$ns" awk '$1 == "Tcp:" && !h { h = 1; for (i = 1; i <= NF; i++) c[$i] = i;
            next } $1 == "Tcp:" { print $c["RetransSegs"] }' /proc/net/snmp)
        r=$((r + x))
    done
    echo "$d $r"
}
counters_since() { # the counters' growth since $1
    local now
    now=$(counters)
    echo "$1 $now" | awk '{ printf "queues dropped %d packets, TCP retransmitted %d segments\n",
        $3 - $1, $4 - $2 }'
}
# "BUSY KERNEL TOTAL": the host's CPU ticks so far, busy (not idle or waiting for I/O), in the
# kernel (system, interrupts, softirqs: the emulated network's work), and in all.
cpu_ticks() {
    awk '$1 == "cpu" { kernel = $4 + $7 + $8; busy = $2 + $3 + kernel + $9
        print busy, kernel, busy + $5 + $6 }' /proc/stat
}
cpu_since() { # the share of the CPUs busy, and in the kernel, since cpu_ticks said $1
    echo "$1 $(cpu_ticks)" | awk '{ t = $6 - $3; if (t <= 0) t = 1
        printf "CPUs %d%% busy, %d%% in the kernel", 100 * ($4 - $1) / t, 100 * ($5 - $2) / t }'
}

set -e
ip netns add "$sw" && made+=("$sw")
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
n_machines=0
for layout in "${LAYOUTS[@]}"; do
    m=${layout#*:}
    m=${m%x*}
    [ "$m" -gt "$n_machines" ] && n_machines=$m
done
for m in $(seq 0 $((n_machines - 1))); do add_machine "$m"; done
set +e

echo "# machines_netns: links shaped at $RATE each way (tc tbf), MTU $MTU, $(nproc) CPUs, sizes" \
    "$MIN_KIB KiB - $MAX_MIB MiB, $COLL f32 out of place"
echo "# layout      size(B)   accel(us)  $base_name(us)  vs_raw   (build, round)"
port=29600
for round in $(seq 1 "$ROUNDS"); do
for B in "${BUILD_DIRS[@]}"; do
for layout in "${LAYOUTS[@]}"; do
    be=${layout%%:*} shape=${layout#*:}
    nm=${shape%x*} per=${shape#*x}
    port=$((port + 10)) # torch_gloo.py takes port + 7 too
    counters_before=$(counters) cpu_before=$(cpu_ticks)
    pids=()
    for m in $(seq $((nm - 1)) -1 0); do
        if [ "$PEER" = torch ]; then # torch's gloo needs the machine's interface named
            prog=(env ACCEL_BACKEND="$be" GLOO_SOCKET_IFNAME="bm${id}m$m" "${PYTHON:-python3}"
                "$torch_gloo" --lib "$B/libaccel.so" --per-call "${PER_CALL:-0}"
                --in-place "${IN_PLACE:-0}")
        else
            prog=("$B/bench/collectives" --backend "$be" --oop-only 1 --baseline "$BASELINE")
        fi
        ip netns exec "$(machine_ns "$m")" env OMP_NUM_THREADS=1 "$B/accel" launch \
            --num_machines "$nm" --machine_rank "$m" --main_process_ip 10.80.0.1 \
            --main_process_port "$port" --num_processes $((nm * per)) \
            "${prog[@]}" --coll "$COLL" --min-kib "$MIN_KIB" --max-mib "$MAX_MIB" \
            --max-iters "$MAX_ITERS" >"$out/$layout.$m" 2>&1 &
        pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    if [ $rc -ne 0 ] || ! grep -q "^\[rank0\]: $COLL " "$out/$layout.0"; then
        echo "machines_netns: $layout failed:" >&2
        tail -n 5 "$out/$layout".* >&2
        continue
    fi
    # rank 0's rows: name size count | time algbw busbw ratio | ... | memcpy | raw_time vs_raw
    awk -v l="$layout" -v c="$COLL" -v b="$B" -v r="$round" '$1 == "[rank0]:" && $2 == c {
        printf "%-10s %10s %11s %15s %7s   (%s, %d)\n", l, $3, $6, $(NF - 1), $NF, b, r }' \
        "$out/$layout.0" | tee -a "$out/rows"
    sed -n 's/^\[rank0\]: \(# per call\)/\1/p' "$out/$layout.0"
    echo "# $layout: $(counters_since "$counters_before"); $(cpu_since "$cpu_before")"
done
done
done

# Several rounds or builds: per build, layout and size, the median [min-max] of accel's time and
# of vs_raw over the rounds (a row without Gloo's own has "-" there).
if [ "$ROUNDS" -gt 1 ] || [ ${#BUILD_DIRS[@]} -gt 1 ]; then
    echo "# summary over $ROUNDS round(s): median [min-max]"
    echo "# build  layout  size(B)  accel(us)  vs_raw"
    sort -k6,6 -k1,1 -k2,2n "$out/rows" | awk '
        function stats(v, n, f,    i, j, t) { # sorts v[1..n]; "median [min-max]", format f
            for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) {
                t = v[j]; v[j] = v[j - 1]; v[j - 1] = t
            }
            return sprintf(f " [" f "-" f "]", n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2,
                           v[1], v[n])
        }
        function flush() {
            r = m > 0 ? stats(ra, m, "%.2f") : "-"
            if (n > 0) printf "%s %s %s  %s  %s\n", build, lay, size, stats(ta, n, "%.0f"), r
            n = 0; m = 0
        }
        { b = $6; sub(/^\(/, "", b); sub(/,$/, "", b)
          if (b != build || $1 != lay || $2 != size) { flush(); build = b; lay = $1; size = $2 }
          ta[++n] = $3 + 0; if ($5 != "-") ra[++m] = $5 + 0 }
        END { flush() }'
fi
