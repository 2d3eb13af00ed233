#!/usr/bin/env bash
# Event files written by the tensorboard tracker, read back by TensorBoard's own reader
# (EventAccumulator, which checks the TFRecord CRCs): scalars, steps, text and hparams. Then a
# run interrupted after step 9 and resumed at step 6 (accel_trackers_resume): both of
# TensorBoard's readers show each step once, the resumed run's values from step 6 on.
# Skips (77) when the tensorboard Python package is not installed and cannot be installed.
set -euo pipefail
BUILD=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
. "$(dirname "$0")/../pyenv.sh"
accel_need_python 'import tensorboard' tensorboard || exit 77
DIR=$(mktemp -d /tmp/accel_tb_XXXXXX)
trap 'rm -rf "$DIR"' EXIT
"$BUILD/tests/progs/track_write" "$DIR" tensorboard demo
python3 - "$DIR/demo" <<'EOF'
import sys, glob, math
from tensorboard.backend.event_processing import event_accumulator as ea_mod
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

run = sys.argv[1]
files = glob.glob(run + "/events.out.tfevents.*")
assert len(files) == 1, files
acc = ea_mod.EventAccumulator(run, size_guidance={ea_mod.TENSORS: 0, ea_mod.SCALARS: 0})
acc.Reload()
tags = acc.Tags()
assert "train/loss" in tags["scalars"] and "lr" in tags["scalars"], tags
loss = acc.Scalars("train/loss")
assert [e.step for e in loss] == [0, 1, 2, 3, 4], loss
for e in loss:
    assert abs(e.value - (2.0 - 0.25 * e.step)) < 1e-6, e
lr = acc.Scalars("lr")
for e in lr:
    assert abs(e.value - 0.001 * (e.step + 1)) < 1e-9, e
# Text: the text plugin's string tensor.
assert "note" in tags["tensors"], tags
t = acc.Tensors("note")
assert len(t) == 1 and t[0].step == 2, t
val = tensor_util.make_ndarray(t[0].tensor_proto)
assert val.reshape(-1)[0] == b"hello world", val
assert acc.SummaryMetadata("note").plugin_data.plugin_name == "text"
# hparams: the session start info carries the configuration.
content = acc.PluginTagToContent("hparams")
assert "_hparams_/session_start_info" in content, content.keys()
data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
hp = data.session_start_info.hparams
assert abs(hp["lr"].number_value - 3e-4) < 1e-12, hp
assert hp["model"].string_value == "gpt2", hp
assert hp["batch_size"].number_value == 8, hp
exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
assert sorted(i.name for i in exp.hparam_infos) == ["batch_size", "lr", "model"], exp
end = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_end_info"])
assert end.session_end_info.status == 1, end
# The accumulator TensorBoard's server uses (data classes drive the dashboards).
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.compat.proto import summary_pb2
pacc = pea.EventAccumulator(run)
pacc.Reload()
md = pacc.SummaryMetadata("train/loss")
assert md.plugin_data.plugin_name == "scalars" and md.data_class == summary_pb2.DATA_CLASS_SCALAR
vals = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in pacc.Tensors("train/loss")]
assert vals == [2.0, 1.75, 1.5, 1.25, 1.0], vals
assert pacc.SummaryMetadata("note").data_class == summary_pb2.DATA_CLASS_TENSOR
assert set(pacc.PluginTagToContent("hparams")) == {
    "_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"}
print("tensorboard reader: ok")
EOF

# The interrupted run logs 0..9; the resumed one (a second later: event files sort by their
# start second) logs 6..11 with values 100 higher.
"$BUILD/tests/progs/track_write" "$DIR" tensorboard resumed 0 10 0
sleep 1.1
"$BUILD/tests/progs/track_write" "$DIR" tensorboard resumed 6 12 100 6
python3 - "$DIR/resumed" <<'EOF'
import sys, glob
from tensorboard.backend.event_processing import event_accumulator as legacy
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.util import tensor_util

run = sys.argv[1]
assert len(glob.glob(run + "/events.out.tfevents.*")) == 2
want = [(s, (100.0 if s >= 6 else 0.0) + 2.0 - 0.25 * s) for s in range(12)]
acc = legacy.EventAccumulator(run, size_guidance={legacy.SCALARS: 0})
acc.Reload()
got = [(e.step, e.value) for e in acc.Scalars("train/loss")]
assert got == want, got
pacc = pea.EventAccumulator(run, size_guidance={pea.TENSORS: 0})
pacc.Reload()
got = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
       for e in pacc.Tensors("train/loss")]
assert got == want, got
print("tensorboard resume: ok")
EOF
