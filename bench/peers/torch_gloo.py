#!/usr/bin/env python3
"""accel's collectives against PyTorch's gloo process group, in the same processes.

Issue 16 names PyTorch's gloo as the gloo backend's baseline. Each process loads libaccel
(ctypes) and torch, joins accel's job (the backend accel picks, or ACCEL_BACKEND) and a torch
gloo process group of its own (TCPStore on MASTER_ADDR, MASTER_PORT + TORCH_PORT_OFFSET), then
times accel's call (out of place) and torch's (in place: its only form, and the cheaper one)
at each size, their batches alternating as in bench/collectives: warm-up, the best of 5 batches,
the slowest rank's time. Rows on process 0, in bench/collectives' column order where
bench/machines_netns.sh reads them (size $3, accel's time $6, the baseline's time and
vs_raw = torch's time / accel's last):

    allreduce SIZE COUNT f32 ACCEL_US | TORCH_US VS_RAW

Run under accel launch, one launcher per machine (docs/comm.md):
    accel launch --num_machines 2 --machine_rank R --main_process_ip 127.0.0.1 \
        --num_processes 2 python3 bench/peers/torch_gloo.py --lib build/libaccel.so
Flags: --coll allreduce|allgather|broadcast, --min-kib K (4), --max-mib M (64), --max-iters N
(2000); --per-call 1 adds, after each row, process 0's distribution of single calls over the
timed batches and, per call, its CPU time (user, system), the host's (busy, all CPUs), its page
faults and context switches, and its network namespace's TCP counters (segments sent and
retransmitted, timeouts, loss probes, retransmits of segments still queued on the host), for each
library ("# per call" lines); --in-place 1 times accel's allreduce in place (torch's only form).
Python calls cost both sides a few microseconds a call (torch's more): read sizes below 64 KiB
with that in mind. Needs torch; exits 77 without it.
"""
import argparse
import ctypes
import os
import resource
import sys
import time

TRIALS = 5
F32, SUM = 0, 0  # accel_dtype ACCEL_F32, accel_reduce_op ACCEL_SUM
TORCH_PORT_OFFSET = 7  # the launcher's store serves MASTER_PORT itself


def load_accel(path):
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        sys.exit("torch_gloo: --lib %s: %s (give a build's libaccel.so)" % (path, e))
    p, sz = ctypes.c_void_p, ctypes.c_size_t
    sigs = {
        "accel_init": [ctypes.POINTER(p), p],
        "accel_allreduce": [p, p, p, sz, ctypes.c_int, ctypes.c_int, p],
        "accel_allgather": [p, p, p, sz, ctypes.c_int, p],
        "accel_broadcast": [p, p, p, sz, ctypes.c_int, ctypes.c_int, p],
        "accel_barrier": [p, p],
        "accel_num_processes": [p],
        "accel_process_index": [p],
        "accel_backend_name": [p],
        "accel_last_error": [p],
        "accel_status_name": [ctypes.c_int],
        "accel_free": [p],
    }
    for name, args in sigs.items():
        getattr(lib, name).argtypes = args
    for name in ("accel_backend_name", "accel_last_error", "accel_status_name"):
        getattr(lib, name).restype = ctypes.c_char_p
    lib.accel_free.restype = None
    return lib


class Accel:
    def __init__(self, path):
        self.lib = load_accel(path)
        self.h = ctypes.c_void_p()
        self.check(self.lib.accel_init(ctypes.byref(self.h), None), "accel_init")

    def check(self, st, what):
        if st != 0:  # a failed accel_init leaves h NULL: the thread's last error
            sys.exit("%s: %s: %s" % (what, self.lib.accel_status_name(st).decode(),
                                      self.lib.accel_last_error(self.h).decode()))


# --per-call: this network namespace's TCP counters around each timed batch (the machine's
# whole traffic: on a machine of its own, as under bench/machines_netns.sh, the one library's).
TCP_SNMP = ("OutSegs", "RetransSegs")
TCP_EXT = ("TCPTimeouts", "TCPLossProbes", "TCPSpuriousRtxHostQueues")


def tcp_counters():
    out = {}
    for path, prefix, names in (("/proc/net/snmp", "Tcp:", TCP_SNMP),
                                ("/proc/net/netstat", "TcpExt:", TCP_EXT)):
        try:
            with open(path) as f:
                rows = [line.split() for line in f if line.startswith(prefix)]
        except OSError:
            rows = []
        if len(rows) >= 2:
            table = dict(zip(rows[0][1:], rows[1][1:]))
            for name in names:
                out[name] = int(table.get(name, 0))
    return out


def host_busy_s():
    """The host's busy CPU time so far, all CPUs (/proc/stat, not namespaced: every process and
    the kernel's packet work, which the emulated network puts on the same CPUs)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    busy = sum(v[:8]) - v[3] - v[4]  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def usage():
    """--per-call's counters so far: this process's CPU time (s), page faults and context
    switches, the host's busy CPU time (s), this machine's TCP counters."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    u = {"user": r.ru_utime, "sys": r.ru_stime, "faults": r.ru_minflt,
         "switches": r.ru_nvcsw + r.ru_nivcsw, "host": host_busy_s()}
    u.update(tcp_counters())
    return u


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default="build/libaccel.so")
    ap.add_argument("--coll", default="allreduce", choices=["allreduce", "allgather", "broadcast"])
    ap.add_argument("--min-kib", type=int, default=4)
    ap.add_argument("--max-mib", type=int, default=64)
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--per-call", type=int, default=0)
    ap.add_argument("--in-place", type=int, default=0)
    a = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("torch_gloo: skipped: no torch in %s" % sys.executable)
        sys.exit(77)
    torch.set_num_threads(1)

    acc = Accel(a.lib)
    lib, h = acc.lib, acc.h
    n, rank = lib.accel_num_processes(h), lib.accel_process_index(h)
    store = dist.TCPStore(os.environ["MASTER_ADDR"],
                          int(os.environ["MASTER_PORT"]) + TORCH_PORT_OFFSET, n, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)

    send = torch.arange(a.max_mib << 18, dtype=torch.float32) % 100
    recv = torch.zeros_like(send)
    mine = torch.zeros_like(send)  # torch's buffer: zeros stay zeros through its in-place sums

    def accel_fn(count):
        if a.coll == "allreduce":
            src = recv if a.in_place else send  # in place: zeros stay zeros, as torch's
            st = lib.accel_allreduce(h, src.data_ptr(), recv.data_ptr(), count, F32, SUM, None)
        elif a.coll == "allgather":  # each process's chunk of the count, every chunk into recv
            part = count // n
            st = lib.accel_allgather(h, send.data_ptr() + 4 * rank * part, recv.data_ptr(),
                                     count, F32, None)
        else:
            st = lib.accel_broadcast(h, send.data_ptr(), recv.data_ptr(), count, F32, 0, None)
        acc.check(st, "accel_" + a.coll)

    def torch_call(count):
        t = mine[:count]
        if a.coll == "allreduce":
            dist.all_reduce(t)
        elif a.coll == "allgather":
            dist.all_gather_into_tensor(t, send[:count // n])
        else:
            dist.broadcast(t, 0)

    # --per-call: every timed call's own time and the growth of usage()'s counters, per library,
    # for the "# per call" lines.
    def batch(fn, count, iters, keep=None):
        acc.check(lib.accel_barrier(h, None), "accel_barrier")
        u0 = usage() if keep is not None else None
        t0 = t = time.perf_counter()
        for _ in range(iters):
            fn(count)
            if keep is not None:
                now = time.perf_counter()
                keep["times"].append(now - t)
                t = now
        if keep is not None:
            for name, v in usage().items():
                keep["sums"][name] = keep["sums"].get(name, 0) + v - u0.get(name, v)
        return (time.perf_counter() - t0) / iters

    if rank == 0:
        print("# torch_gloo: %d processes, accel backend %s, torch %s gloo, %s f32; accel %s, "
              "torch in place" % (n, lib.accel_backend_name(h).decode(), torch.__version__, a.coll,
                                  "in place" if a.in_place and a.coll == "allreduce"
                                  else "out of place"))
        print("# %s %10s %10s %4s %10s | %10s %7s" % ("coll", "size(B)", "count", "type",
                                                     "accel(us)", "torch(us)", "vs_raw"))
    nbytes = a.min_kib << 10
    while nbytes <= a.max_mib << 20:
        count = nbytes // 4
        count -= count % n  # allgather's chunks equal, as torch's all_gather_into_tensor needs
        iters = max(2, min(a.max_iters, (128 << 20) // nbytes))
        batch(accel_fn, count, 2 + iters // 10)
        batch(torch_call, count, 2 + iters // 10)
        best = [1e30, 1e30]
        kept = [{"times": [], "sums": {}} if a.per_call else None for _ in range(2)]
        for trial in range(TRIALS):  # which goes first alternates, as in bench/collectives
            for b in ((0, 1) if trial % 2 == 0 else (1, 0)):
                best[b] = min(best[b], batch((accel_fn, torch_call)[b], count, iters, kept[b]))
        worst = torch.tensor(best, dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        ta, tt = worst.tolist()
        if rank == 0:
            print("%s %10d %10d %4s %10.1f | %10.1f %7.2f" % (a.coll, count * 4, count, "f32",
                                                             ta * 1e6, tt * 1e6, tt / ta),
                  flush=True)
        for name, k in zip(("accel", "torch"), kept):
            if k is None or rank != 0:
                continue
            v = sorted(k["times"])
            q = lambda f: v[min(len(v) - 1, int(f * len(v)))] * 1e3
            per = {c: x / len(v) for c, x in k["sums"].items()}  # a call
            print("# per call, %s %d B, %s: ms min %.2f p10 %.2f p50 %.2f p90 %.2f max %.2f mean "
                  "%.2f; CPU ms a call user %.2f system %.2f, the host's %.2f; a call page "
                  "faults %.1f context switches %.1f"
                  % (a.coll, count * 4, name, v[0] * 1e3, q(0.1), q(0.5), q(0.9), v[-1] * 1e3,
                     sum(v) / len(v) * 1e3, per["user"] * 1e3, per["sys"] * 1e3,
                     per["host"] * 1e3, per["faults"], per["switches"]), flush=True)
            tcp = ["%s %.1f" % (c, per[c]) for c in TCP_SNMP + TCP_EXT if c in per]
            if tcp:
                print("# per call, %s %d B, %s: TCP a call (this machine) %s"
                      % (a.coll, count * 4, name, " ".join(tcp)), flush=True)
        nbytes *= 4
    dist.destroy_process_group()
    lib.accel_free(h)


if __name__ == "__main__":
    main()
