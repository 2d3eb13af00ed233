"""Checks a save_state folder's accel_checkpoint.json with the xxhash package alone, from the
format in docs/checkpoint.md: each file's checksum is the XXH3-64 of the little-endian XXH3-64s
of its 16 MiB blocks (floor(n / 16 MiB) + 1 of them: a file that ends on a block boundary has a
last, empty block), and marker_xxh3 is the XXH3-64 of the marker's bytes with its own 16 digits
written as '0'. Prints one line per file; exits 1 on any mismatch.

    python3 checksum.py DIR
"""
import json
import os
import sys

import xxhash

BLOCK = 16 << 20


def file_checksum(path):
    sums = b""
    with open(path, "rb") as f:
        while True:
            blk = f.read(BLOCK)
            sums += xxhash.xxh3_64_intdigest(blk).to_bytes(8, "little")
            if len(blk) < BLOCK:
                return xxhash.xxh3_64_hexdigest(sums), os.path.getsize(path)


def main(folder):
    text = open(os.path.join(folder, "accel_checkpoint.json"), "rb").read()
    marker = json.loads(text)
    assert marker["format"] == "accel-checkpoint" and marker["version"] == 2, marker
    assert marker["checksum"] == "xxh3-64/16MiB", marker["checksum"]
    bad = 0
    listed = sorted(marker["files"])
    on_disk = sorted(n for n in os.listdir(folder) if n != "accel_checkpoint.json")
    if listed != on_disk:
        print(f"listed {listed} but the folder holds {on_disk}")
        bad += 1
    for name in listed:
        entry = marker["files"][name]
        got, nbytes = file_checksum(os.path.join(folder, name))
        ok = got == entry["xxh3"] and nbytes == entry["nbytes"]
        bad += not ok
        print(f"{name}: {nbytes} bytes, xxh3 {got} {'ok' if ok else 'MISMATCH ' + entry['xxh3']}")
    key = b'"marker_xxh3": "'
    at = text.index(key) + len(key)
    want = text[at : at + 16].decode()
    got = xxhash.xxh3_64_hexdigest(text[:at] + b"0" * 16 + text[at + 16 :])
    bad += got != want
    print(f"marker: xxh3 {got} {'ok' if got == want else 'MISMATCH ' + want}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
