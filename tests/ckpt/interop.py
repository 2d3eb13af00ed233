"""Interop between accel's safetensors files and the reference Python package.

  interop.py check-ours ALL NP   verify files written by `st_tool write` with the reference
                                 reader (values, metadata) and the reference writer (byte-exact)
  interop.py write FILE          write a file with the reference writer (numpy dtypes, a scalar,
                                 a zero-sized tensor, metadata) for accel to read
  interop.py dump FILE           print what `st_tool dump` prints, computed in Python
Exits non-zero with a message on the first mismatch.
"""
import json
import struct
import sys

import numpy as np
import safetensors
import safetensors.numpy as stnp

BITS = {"F32": 32, "F64": 64, "F16": 16, "BF16": 16, "F8_E4M3": 8, "F8_E5M2": 8, "I8": 8,
        "U8": 8, "I16": 16, "U16": 16, "I32": 32, "I64": 64, "BOOL": 8, "U32": 32, "U64": 64,
        "C64": 64, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6,
        "F6_E3M2": 6}
# accel_dtype enum order: st_tool's pattern uses the index
ACCEL_ORDER = ["F32", "F64", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I8", "U8", "I16", "U16",
               "I32", "I64", "BOOL", "U32", "U64", "C64", "F8_E8M0", "F8_E4M3FNUZ",
               "F8_E5M2FNUZ", "F4", "F6_E2M3", "F6_E3M2"]
NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
         "I32": np.int32, "I16": np.int16, "U16": np.uint16, "I8": np.int8, "U8": np.uint8,
         "BOOL": np.bool_, "U32": np.uint32, "U64": np.uint64, "C64": np.complex64}


def fail(msg):
    print("interop.py: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def pattern(d, dt):
    nb = BITS[dt] * 4 * (d + 1) // 8
    b = bytes(((31 * i + 7 * d + 1) & 0xFF) for i in range(nb))
    if dt == "BOOL":
        b = bytes(x & 1 for x in b)
    return b


def expected(numpy_only):
    """name -> (dtype, shape, raw bytes) as st_tool writes them."""
    out = {}
    for d, dt in enumerate(ACCEL_ORDER):
        if numpy_only and dt not in NUMPY:
            continue
        out["t." + dt] = (dt, [4, d + 1], pattern(d, dt))
    out["scalar"] = ("I64", [], struct.pack("<q", -1234567890123))
    out["empty"] = ("F32", [4, 0, 2], b"")
    return out


def check_ours(all_path, np_path):
    # 1. The reference (Rust) reader accepts the file with every dtype; bytes match.
    with open(all_path, "rb") as f:
        raw = f.read()
    got = {name: info for name, info in safetensors.deserialize(raw)}
    exp = expected(False)
    if set(got) != set(exp):
        fail("tensor names differ: %s vs %s" % (sorted(got), sorted(exp)))
    for name, (dt, shape, data) in exp.items():
        info = got[name]
        if info["dtype"].upper() != dt and info["dtype"] != dt.lower():
            fail("%s: dtype %s, expected %s" % (name, info["dtype"], dt))
        if list(info["shape"]) != shape:
            fail("%s: shape %s, expected %s" % (name, info["shape"], shape))
        if bytes(info["data"]) != data:
            fail("%s: data differs" % name)
    with safetensors.safe_open(all_path, framework="np") as f:
        meta = f.metadata()
    if meta != {"format": "pt", "writer": "accel"}:
        fail("metadata %r" % (meta,))

    # 2. safetensors.numpy.load_file reads the numpy-only file; values match.
    arrs = stnp.load_file(np_path)
    for name, (dt, shape, data) in expected(True).items():
        a = arrs[name]
        want = np.frombuffer(data, dtype=NUMPY[dt]).reshape(shape)
        if a.dtype != want.dtype or list(a.shape) != shape or a.tobytes() != want.tobytes():
            fail("%s: numpy value differs (%s %s)" % (name, a.dtype, a.shape))

    # 3. Byte-exact: the reference writer produces the very same file.
    ref = stnp.save(arrs, metadata={"format": "pt"})
    with open(np_path, "rb") as f:
        ours = f.read()
    if ref != ours:
        n = struct.unpack("<Q", ours[:8])[0]
        m = struct.unpack("<Q", ref[:8])[0]
        fail("not byte-identical to the reference writer:\n ours %s\n ref  %s"
             % (ours[8:8 + n], ref[8:8 + m]))
    print("interop.py: accel files read by safetensors %s: ok" % safetensors.__version__)


def write(path):
    rng = np.random.default_rng(7)
    tensors = {
        "model.embed.weight": rng.standard_normal((5, 3)).astype(np.float32),
        "model.norm.bias": rng.standard_normal(7).astype(np.float16),
        "h.0.mlp.c_fc.weight": rng.standard_normal((2, 2, 2)).astype(np.float64),
        "counts": np.arange(-6, 6, dtype=np.int64).reshape(3, 4),
        "i32": np.arange(5, dtype=np.int32) * -3,
        "i16": np.array([1, -2, 3], dtype=np.int16),
        "u16": np.array([65535, 1], dtype=np.uint16),
        "bytes": np.arange(9, dtype=np.uint8),
        "sbytes": np.array([-128, 127], dtype=np.int8),
        "mask": np.array([True, False, True]),
        "token_ids": np.array([4000000000, 1, 7], dtype=np.uint32),
        "offsets": np.array([2**64 - 1, 0], dtype=np.uint64),
        "phase": np.array([1 + 2j, -0.5j], dtype=np.complex64),
        "step": np.array(12345, dtype=np.int64),  # shape []
        "nothing": np.zeros((0, 4), dtype=np.float32),
    }
    stnp.save_file(tensors, path, metadata={"format": "np", "source": "python \u00e9"})


def fnv1a(b):
    h = 1469598103934665603
    for x in b:
        h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def dump(path):
    with open(path, "rb") as f:
        raw = f.read()
    items = sorted(safetensors.deserialize(raw), key=lambda t: t[0].encode())
    for name, info in items:
        dt = info["dtype"].upper()
        print("%s %s [%s] %016x" % (name, dt, ",".join(str(d) for d in info["shape"]),
                                    fnv1a(bytes(info["data"]))))
    with safetensors.safe_open(path, framework="np") as f:
        meta = f.metadata() or {}
    for k in sorted(meta, key=lambda s: s.encode()):
        print("meta %s=%s" % (k, meta[k]))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "check-ours":
        check_ours(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
