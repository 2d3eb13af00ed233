# Waiting for what another process does, sourced by the tests that start processes by hand
# (tests/comm/test_shm_jobs.sh, test_shm_jobid.sh):
#
#   poll LIMIT_S COMMAND [ARGS...]   runs COMMAND every 10 ms until it succeeds (status 0), or
#                                    until about LIMIT_S seconds (a whole number) of tries have
#                                    passed (status 1)
#   n_files_at_least DIR N           DIR holds N entries or more (a --sync-dir's arrivals)
#
# The limits are generous: a loaded CI machine may take long, and the caller names what did not
# happen.
poll() {
    local limit=$1 i
    shift
    for ((i = 0; i < limit * 100; i++)); do
        "$@" && return 0
        sleep 0.01
    done
    "$@"
}

n_files_at_least() {
    [ "$(ls "$1" | wc -l)" -ge "$2" ]
}
