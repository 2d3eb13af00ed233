#!/usr/bin/env bash
# The mlruns tree written by the mlflow tracker, listed and read by MLflow's own FileStore API
# (what `mlflow ui` uses for a local store): experiment, run status and times, params, metric
# history with steps, tags. A second run of the same project reuses the experiment. Then a run
# interrupted after step 9 and resumed at step 6 (accel_trackers_resume) continues the same
# run, each step once in its history, and MLFLOW_RUN_ID continues a named run.
# Skips (77) when neither mlflow-skinny nor mlflow can be imported or installed.
set -euo pipefail
BUILD=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
. "$(dirname "$0")/../pyenv.sh"
accel_need_python 'import mlflow' mlflow-skinny || exit 77
DIR=$(mktemp -d /tmp/accel_mlflow_XXXXXX)
trap 'rm -rf "$DIR"' EXIT
unset MLFLOW_TRACKING_URI MLFLOW_EXPERIMENT_NAME
# MLflow 3 keeps the file store in maintenance mode behind this switch (docs/tracking.md).
export MLFLOW_ALLOW_FILE_STORE=true
"$BUILD/tests/progs/track_write" "$DIR" mlflow demo
"$BUILD/tests/progs/track_write" "$DIR" mlflow demo
"$BUILD/tests/progs/track_write" "$DIR" mlflow 123
python3 - "$DIR/mlruns" <<'EOF'
import sys, warnings
warnings.simplefilter("ignore")
from mlflow.store.tracking.file_store import FileStore
from mlflow.entities import ViewType

store = FileStore(sys.argv[1])
exps = {e.name: e for e in store.search_experiments(view_type=ViewType.ALL)}
assert sorted(exps) == ["123", "Default", "demo"], exps.keys()  # "123" stays a string
exp = exps["demo"]
assert exp.lifecycle_stage == "active"
runs = store.search_runs([exp.experiment_id], None, ViewType.ALL)
assert len(runs) == 2, runs  # the second run reused the experiment
for run in runs:
    info, data = run.info, run.data
    assert info.status == "FINISHED", info
    assert info.end_time >= info.start_time > 1.5e12, info
    assert info.run_name == "demo", info
    assert data.params == {"lr": "0.0003", "model": "gpt2", "batch_size": "8"}, data.params
    assert data.tags["mlflow.runName"] == "demo", data.tags
    assert data.tags["note"] == "hello world", data.tags
    hist = store.get_metric_history(info.run_id, "train/loss")
    assert [m.step for m in hist] == [0, 1, 2, 3, 4], hist
    for m in hist:
        assert abs(m.value - (2.0 - 0.25 * m.step)) < 1e-12, m
    assert abs(data.metrics["lr"] - 0.005) < 1e-12, data.metrics  # the latest value
print("mlflow FileStore: ok")
EOF

# Interrupted after step 9, resumed at step 6 with values 100 higher, then continued once more
# by run id (MLFLOW_RUN_ID, as Accelerate passes it to mlflow.start_run) for steps 12..13.
"$BUILD/tests/progs/track_write" "$DIR" mlflow resumed 0 10 0
"$BUILD/tests/progs/track_write" "$DIR" mlflow resumed 6 12 100 6
RUN_ID=$(grep -l "^run_name: 'resumed'$" "$DIR"/mlruns/*/*/meta.yaml | xargs -n1 dirname |
    xargs -n1 basename)
[ "$(echo "$RUN_ID" | wc -w)" = 1 ] ||
    { echo "FAIL: expected one run named resumed: $RUN_ID"; exit 1; }
MLFLOW_RUN_ID=$RUN_ID "$BUILD/tests/progs/track_write" "$DIR" mlflow resumed 12 14 100
MLFLOW_RUN_ID=nosuchrun "$BUILD/tests/progs/track_write" "$DIR" mlflow resumed 2>"$DIR/err" && {
    echo "FAIL: an unknown MLFLOW_RUN_ID was accepted"; exit 1; }
grep -q "MLFLOW_RUN_ID=nosuchrun: no such run" "$DIR/err" || { cat "$DIR/err"; exit 1; }
python3 - "$DIR/mlruns" "$RUN_ID" <<'EOF'
import sys, warnings
warnings.simplefilter("ignore")
from mlflow.store.tracking.file_store import FileStore
from mlflow.entities import ViewType

store = FileStore(sys.argv[1])
exp = store.get_experiment_by_name("resumed")
runs = store.search_runs([exp.experiment_id], None, ViewType.ALL)
assert [r.info.run_id for r in runs] == [sys.argv[2]], runs  # one run, continued
info = runs[0].info
assert info.status == "FINISHED" and info.end_time >= info.start_time, info
hist = store.get_metric_history(info.run_id, "train/loss")
got = [(m.step, m.value) for m in hist]
want = [(s, (100.0 if s >= 6 else 0.0) + 2.0 - 0.25 * s) for s in range(14)]
assert got == want, got
print("mlflow resume: ok")
EOF
