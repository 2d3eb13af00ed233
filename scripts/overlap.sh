#!/usr/bin/env bash
# scripts/overlap.sh LOG BACKGROUND FOREGROUND: runs the shell command BACKGROUND at the lowest
# CPU priority (nice 19), its output in LOG, while FOREGROUND runs as usual (with
# OVERLAP_BG_PID, BACKGROUND's pid, in its environment: scripts/await.sh); exits 0 when both
# succeeded, else prints the end of LOG (when BACKGROUND failed) and exits 1.
#
# make test uses it to compile the sanitizer, emulator and CUDA builds while the main suite
# runs: many of the suite's tests wait (on peers, deadlines, launchers), and on 2 cores the
# compilers fill those gaps instead of running after the suite. At nice 19 they take the CPU
# only when no test wants it, so the tests' own deadlines see the machine they would see alone.
# Each build's tests start once it is built (scripts/await.sh), while the next one compiles.
set -u
[ $# -eq 3 ] || { echo "usage: $0 LOG BACKGROUND FOREGROUND" >&2; exit 2; }
log=$1
set -m # the background command gets its own process group: an interrupt stops all of it
nice -n 19 bash -c "$2" >"$log" 2>&1 &
bg=$!
set +m
trap 'kill -TERM -- -"$bg" 2>/dev/null; exit 130' INT TERM
echo "overlap: in the background at nice 19, output in $log: $2"
OVERLAP_BG_PID=$bg bash -c "$3"
frc=$?
wait "$bg"
brc=$?
if [ "$brc" != 0 ]; then
    tail -n 60 "$log"
    echo "overlap: the background command exited with $brc (whole output: $log): $2"
fi
[ "$frc" = 0 ] && [ "$brc" = 0 ]
