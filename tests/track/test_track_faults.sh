#!/usr/bin/env bash
# Each built-in tracker's files after a run through faults (tests/progs/track_faults.c): names
# and texts that are not UTF-8 or hold newlines, keys naming folders ("a/", "."), NaN / inf /
# 1e300, and a disk full in the middle of a record for five steps. Read back by the real tools:
# Python's json, csv and yaml, TensorBoard's readers and MLflow's FileStore must read every file
# whole, with every step logged outside the full-disk window and none inside it.
# Skips (77) when tensorboard, mlflow-skinny or PyYAML cannot be imported or installed.
set -euo pipefail
BUILD=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
. "$(dirname "$0")/../pyenv.sh"
accel_need_python 'import tensorboard, mlflow, yaml' tensorboard mlflow-skinny pyyaml || exit 77
DIR=$(mktemp -d /tmp/accel_track_faults_XXXXXX)
trap 'rm -rf "$DIR"' EXIT
unset MLFLOW_TRACKING_URI MLFLOW_EXPERIMENT_NAME MLFLOW_RUN_ID
export MLFLOW_ALLOW_FILE_STORE=true
for t in jsonl csv tensorboard mlflow; do
    "$BUILD/tests/progs/track_faults" "$DIR/$t" $t 2>"$DIR/$t.err" || { cat "$DIR/$t.err"; exit 1; }
    # The lost steps are reported: a warning, not an error, and training went on.
    grep -q "tracker $t: logging step 10 failed" "$DIR/$t.err" || { cat "$DIR/$t.err"; exit 1; }
done
python3 - "$DIR" <<'PYEOF'
import sys, os, json, csv, math, glob, warnings
warnings.simplefilter("ignore")
import yaml
d = sys.argv[1]
want = list(range(10)) + list(range(15, 20))

rows = [json.loads(l) for l in open(f"{d}/jsonl/faults/metrics.jsonl", encoding="utf-8")]
assert [r["step"] for r in rows] == want, rows
assert rows[-1]["odd\u00fe/key"] == 19 and rows[-1]["a/"] == 19 and rows[-1]["."] == 19, rows[-1]
cfg = json.load(open(f"{d}/jsonl/faults/config.json", encoding="utf-8"))
assert cfg["model\u00ff"] == "mo\ndel\u00ff" and cfg["nan"] is None and cfg["big"] == 1e300, cfg

table = list(csv.reader(open(f"{d}/csv/faults/metrics.csv", encoding="utf-8", newline="")))
assert table[0] == ["step", "time", "loss", "odd\u00fe/key", "a/", "."], table[0]
assert all(len(r) == len(table[0]) for r in table), table
assert [int(r[0]) for r in table[1:]] == want, table

from tensorboard.backend.event_processing import event_accumulator as legacy
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.plugins.hparams import plugin_data_pb2
run = f"{d}/tensorboard/faults"
acc = legacy.EventAccumulator(run, size_guidance={legacy.SCALARS: 0})
acc.Reload()
for tag in ["loss", "odd\u00fe/key", "a/", "."]:
    assert [e.step for e in acc.Scalars(tag)] == want, (tag, acc.Scalars(tag))
pacc = pea.EventAccumulator(run, size_guidance={pea.TENSORS: 0})
pacc.Reload()
assert [e.step for e in pacc.Tensors("loss")] == want
content = pacc.PluginTagToContent("hparams")
hp = plugin_data_pb2.HParamsPluginData.FromString(
    content["_hparams_/session_start_info"]).session_start_info.hparams
assert hp["model\u00ff"].string_value == "mo\ndel\u00ff", hp
hy = yaml.safe_load(open(f"{run}/hparams.yml", encoding="utf-8"))
assert hy["model\u00ff"] == "mo\ndel\u00ff" and hy["lr"] == 3e-4, hy
assert math.isnan(hy["nan"]) and hy["inf"] == math.inf and hy["big"] == 1e300, hy

from mlflow.store.tracking.file_store import FileStore
from mlflow.entities import ViewType
store = FileStore(f"{d}/mlflow/mlruns")
exp = store.get_experiment_by_name("faults")
(r,) = store.search_runs([exp.experiment_id], None, ViewType.ALL)
assert r.info.status == "FINISHED", r.info
for key in ["loss", "odd_/key", "a_", "_"]:
    got = [m.step for m in store.get_metric_history(r.info.run_id, key)]
    assert got == want, (key, got)
assert r.data.params["lr"] == "0.0003", r.data.params
assert math.isnan(float(r.data.params["nan"])), r.data.params
print("tracker files after faults: ok")
PYEOF
