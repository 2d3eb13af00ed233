# Sourced by the launch tests (test_launch_machines.sh, test_launch_netns.sh,
# test_launch_mpirun.sh): helpers they share.
#
#   has FILE WORDS...   grep -q in FILE for the words joined by a space (a long pattern split
#                       over lines); its status is grep's
has() { local f=$1; shift; grep -q -- "$*" "$f"; }
