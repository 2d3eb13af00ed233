#!/usr/bin/env bash
# scripts/await.sh FILE: returns 0 once FILE exists, which a step of scripts/overlap.sh's
# background command makes when it is done; 1 as soon as that command (OVERLAP_BG_PID) ended
# without making it (a build failed: overlap.sh then prints its log). Without OVERLAP_BG_PID it
# only checks that FILE exists.
#
# make test: the sanitizer build's unit tests wait for that build, the emulator's tests for
# theirs, while the builds after them go on compiling in the background.
set -u
[ $# -eq 1 ] || { echo "usage: $0 FILE" >&2; exit 2; }
ended() { # the background command exited (gone, or a zombie its parent has not reaped yet)
    local state
    state=$(awk '{ print $3 }' "/proc/$OVERLAP_BG_PID/stat" 2>/dev/null)
    [ -z "$state" ] || [ "$state" = Z ]
}
while [ ! -e "$1" ]; do
    if [ -z "${OVERLAP_BG_PID:-}" ] || ended; then
        [ -e "$1" ] && exit 0
        echo "await: the background builds ended without making $1"
        exit 1
    fi
    sleep 1
done
