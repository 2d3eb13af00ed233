# Sourced by the launch tests (test_launch_machines.sh, test_launch_netns.sh,
# test_launch_mpirun.sh, test_launch_shared_cpus.sh, test_launch_rdzv.sh, test_launch_stop.sh):
# helpers they share.
#
#   has FILE WORDS...   grep -q in FILE for the words joined by a space (a long pattern split
#                       over lines); its status is grep's
#   scratch             T: a new directory; at exit every process in $pids (the test adds its
#                       background launchers) is killed and T removed
#   fail MSG...         prints "FAIL: MSG" and every non-empty $T/*.out and $T/*.err; exits 1
#   bg NAME CMD...      runs CMD in the background, output in $T/NAME.{out,err}; its pid in
#                       pid_NAME and $pids
#   finish NAME         waits for bg NAME; its exit status in rc_NAME
#   now, elapsed T0     the time in seconds, and the seconds since T0 (a `now`)
#   await FILE PATTERN [S]
#                       waits (at most S seconds, default 20) until FILE has a line matching
#                       PATTERN; 1 if none came
has() { local f=$1; shift; grep -q -- "$*" "$f"; }
scratch() {
    T=$(mktemp -d)
    pids=
    trap 'for p in $pids; do kill -9 "$p" 2>/dev/null; done; rm -rf "$T"' EXIT
}
fail() {
    echo "FAIL: $*"
    for f in "$T"/*.out "$T"/*.err; do
        [ -s "$f" ] && { echo "---- $f"; cat "$f"; }
    done
    exit 1
}
bg() {
    local name=$1
    shift
    "$@" >"$T/$name.out" 2>"$T/$name.err" &
    eval "pid_$name=$!"
    pids="$pids $!"
}
finish() {
    local p
    eval "p=\$pid_$1"
    wait "$p"
    eval "rc_$1=$?"
}
now() { date +%s.%N; }
elapsed() { echo "$(now) - $1" | bc; }
await() {
    for _ in $(seq 1 $((${3:-20} * 20))); do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}
