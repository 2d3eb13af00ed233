#!/usr/bin/env bash
# Lists every #include that breaks the layering of ../shared/DESIGN.md §2 and exits 1 if there is
# one. Run by `make test`; run it by hand from the repository root: scripts/check-layers.sh
#
#   cli -> (public API) -> ckpt, track, data, nn -> train -> core -> comm, device -> base
#
# - base includes only base and the public type headers (status.h, tensor.h).
# - comm and device include only base, their own folder and the public type headers
#   (comm also collectives.h, whose reduce-op and work-handle types it implements).
# - core adds comm and device; train adds core.
# - ckpt, data and track may use core, comm, device and base, never train's private headers
#   (they reach models and optimizers through the state protocol) nor each other's.
# - nn includes only base, its own folder and public headers (it reaches train through
#   nn_param_sink and the public API).
# - cli includes only public headers, base and its own folder, and comm/store.h: the launchers
#   of several machines meet through the job's store (DESIGN.md §3, Comm v2: rendezvous).
# - public headers include only public headers; only accel/cuda.h may include CUDA headers.
# - examples include only public headers (and the examples' own helpers in examples/).
# - settings are resolved once, at accel_init: outside the CLI (launcher, test worker) only the
#   files that resolve them read the environment (getenv, accel__env_*), and outside core only
#   the module views in acc->settings are read, never acc->opt.
set -u
cd "$(dirname "$0")/.." || exit 2

# allowed[folder] = space-separated folders it may include from (besides itself and accel/).
declare -A allowed=(
    [base]=""
    [comm]="base"
    [device]="base"
    [core]="base comm device"
    [train]="base comm device core"
    [ckpt]="base comm device core"
    [data]="base comm device core"
    [track]="base comm device core"
    [nn]="base"
    [cli]="base"
)
# Public headers the low layers may include (the rest of include/accel is API, not types).
declare -A public_ok=(
    [base]="status.h tensor.h"
    [comm]="status.h tensor.h collectives.h"
    [device]="status.h tensor.h"
)

bad=0
report() {
    echo "$1"
    bad=1
}

for f in $(git ls-files 'src/*.c' 'src/*.h' 'src/*.cu' 'src/*.cuh' 2>/dev/null); do
    folder=$(echo "$f" | cut -d/ -f2)
    [ -n "${allowed[$folder]+x}" ] || {
        report "$f: folder src/$folder is not a layer of DESIGN.md §2"
        continue
    }
    while IFS=: read -r line inc; do
        case "$inc" in
        accel/*)
            h=${inc#accel/}
            if [ -n "${public_ok[$folder]+x}" ] && ! [[ " ${public_ok[$folder]} " == *" $h "* ]]; then
                report "$f:$line: $folder may include only the public type headers (${public_ok[$folder]}), not $inc"
            fi
            ;;
        */*)
            target=${inc%%/*}
            [ "$target" = "$folder" ] && continue
            [ "$folder/$inc" = "cli/comm/store.h" ] && continue
            if ! [[ " ${allowed[$folder]} " == *" $target "* ]]; then
                report "$f:$line: $folder may not include $inc (layer $target)"
            fi
            ;;
        *) ;; # same folder
        esac
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
        sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1:\2/')
done

for f in $(git ls-files 'include/accel/*.h' 2>/dev/null); do
    while IFS=: read -r line inc; do
        case "$inc" in
        \"*) [[ "$inc" == \"*/* ]] && report "$f:$line: public header includes private $inc" ;;
        \<cuda* | \<nccl* | \<cublas*)
            [ "$(basename "$f")" = "cuda.h" ] || report "$f:$line: only accel/cuda.h may include $inc"
            ;;
        esac
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include' "$f" |
        sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*([<"][^>"]+[>"]).*/\1:\2/')
done

for f in $(git ls-files 'examples/*.c' 'examples/*.cu' 'examples/*.h' 2>/dev/null); do
    while IFS=: read -r line inc; do
        # The examples' own helpers (examples/args.h) are examples too, checked by this loop.
        case $inc in */*) ;; *) [ -f "examples/$inc" ] && continue ;; esac
        report "$f:$line: examples use the public API only, not \"$inc\""
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
        sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1:\2/')
done

# Who may read the environment: the env table and the config-file locator (base), the log
# level of handle-less code (base/log.c, forced at accel_init), accel_init's resolution (core;
# core/layout.c reads the launcher's layout and rendezvous for it),
# the shm knobs read when accel_init creates the communicator, CUDA_VISIBLE_DEVICES in the
# CUDA report and in a device-open error message, and nn's CUDA attention kernel choice, fused
# head's chunk size, fused MLP's hidden-gradient path, and nn's on/off switches (half shadows,
# bias-gradient epilogue, the GPT blocks' backward rewind: src/nn/switches.c) (an nn ctx needs
# no accel_init, so it has no resolved settings).
env_ok=" src/base/env.c src/base/config.c src/base/log.c src/core/accel.c src/core/layout.c \
src/core/settings.c src/core/config.c src/comm/shm_setup.c src/core/cuda/cuda_api.c src/device/cuda/cuda.c \
src/nn/cuda/ops_gpu.c src/nn/cuda/linear_gpu.c src/nn/ops_lce.c src/nn/switches.c "
while IFS=: read -r f line _; do
    [[ "$env_ok" == *" $f "* ]] && continue
    report "$f:$line: reads the environment after accel_init; take the value from the resolved settings (src/core/settings.h)"
done < <(git grep -n -E '\bgetenv\(|accel__env_(int|real|bool|string)\(' -- 'src/*.c' 'src/*.cu' \
    ':!src/cli/*' 2>/dev/null)

# The options as resolved are core's (acc->opt): the other modules read their view in
# acc->settings (src/core/settings.h), filled once at accel_init.
while IFS=: read -r f line _; do
    report "$f:$line: reads acc->opt; take the value from the module's view in acc->settings (src/core/settings.h)"
done < <(git grep -n -E 'acc->opt\b' -- 'src/*.c' 'src/*.h' 'src/*.cu' ':!src/core/*' ':!src/cli/*' \
    2>/dev/null)

if [ $bad -ne 0 ]; then
    echo "check-layers: the lines above break DESIGN.md §2 (see the rules at the top of $0)" >&2
    exit 1
fi
echo "check-layers: every include follows DESIGN.md §2"
