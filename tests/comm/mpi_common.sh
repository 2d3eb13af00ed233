# Shared by tests/comm/test_mpi*.sh (sourced): skips (77) when mpirun is missing or the build
# has no mpi backend; otherwise sets B (the build), tmp (removed at exit), fail, now,
# elapsed_since, le and run.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
command -v mpirun >/dev/null ||
    { echo "SKIP: mpirun not found (apt-get install openmpi-bin)"; exit 77; }
"$B/accel" env 2>/dev/null | grep -q "backends:.*mpi" ||
    { echo "SKIP: this build has no mpi backend (configure with -DACCEL_MPI=ON)"; exit 77; }
# Open MPI refuses root unless told (these containers run tests as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Quiet Open MPI's hints about hardware it does not find here.
export OMPI_MCA_btl_base_warn_component_unused=0
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE ACCEL_JOB_ID ACCEL_BACKEND
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.out; do [ -f "$f" ] && { echo "== $f"; tail -40 "$f"; }; done
    exit 1
}
now() { date +%s.%N; }
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}
# run NAME NP LIMIT [VAR=VALUE...] -- PROG ARGS...: mpirun, output in $tmp/NAME.out, exit status in
# rc (124: still running after LIMIT seconds; mpirun itself exits 128 + signal of a killed rank).
run() {
    local name=$1 np=$2 limit=$3
    shift 3
    local envs=()
    while [ "$1" != "--" ]; do envs+=(-x "$1"); shift; done
    shift
    timeout -k 5 "$limit" mpirun --oversubscribe -np "$np" "${envs[@]}" "$@" \
        >"$tmp/$name.out" 2>&1
    rc=$?
}
