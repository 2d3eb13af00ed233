# Sourced by the tests that run examples/cuda_mlp (test_cuda_mlp.sh, test_cuda_ckpt.sh): skips
# (exit 77) without the CUDA build, makes $DIR (removed on exit), and defines fail, run and compare.
# The sourcing test sets ARGS, the arguments every run gets.
BUILD=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
EX=$BUILD/examples/cuda_mlp
ACCEL=$BUILD/accel
if [ ! -x "$EX" ]; then
    echo "SKIP: $EX is not built (configure with -DACCEL_CUDA=ON)"
    exit 77
fi
DIR=$(mktemp -d "/tmp/accel_$(basename "$0" .sh)_XXXXXX")
trap 'rm -rf "$DIR"' EXIT
export OMP_NUM_THREADS=1

fail() {
    echo "FAIL: $*"
    exit 1
}

# run NAME NPROCS ARGS...: the losses ("S L" per logged step) in $DIR/NAME, the whole output in
# $DIR/NAME.out; returns the exit code.
run() {
    local name=$1 n=$2 rc=0
    shift 2
    if [ "$n" = 1 ]; then
        "$EX" "${ARGS[@]}" "$@" >"$DIR/$name.out" 2>&1 || rc=$?
    else
        "$ACCEL" launch --main_process_port 0 --num_processes "$n" "$EX" "${ARGS[@]}" "$@" \
            >"$DIR/$name.out" 2>&1 || rc=$?
    fi
    sed -n 's/^\(\[rank0\]: \)\{0,1\}step \([0-9]*\) loss \([0-9.]*\)$/\2 \3/p' "$DIR/$name.out" \
        >"$DIR/$name"
    return $rc
}

# compare A B TOL: same steps, |a - b| <= TOL * max(|a|, 0.1) at each; prints the worst.
compare() {
    paste -d' ' "$DIR/$1" "$DIR/$2" | awk -v tol="$3" -v what="$1 vs $2" '
        { if ($1 != $3) { print "step mismatch: " $0; bad = 1; exit }
          d = $2 - $4; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2; if (m < 0.1) m = 0.1
          if (d / m > worst) worst = d / m
          if (d > tol * m) { print what ": step " $1 ": " $2 " vs " $4; bad = 1 } n++ }
        END { if (n == 0) { print what ": no losses"; bad = 1 }
              printf "%s: %d steps, worst relative difference %.3g\n", what, n, worst
              exit bad }'
}
