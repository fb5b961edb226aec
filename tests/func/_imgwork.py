"""Workloads for the `ioplane img` / qcow2 functional tests (stdlib only).

  _imgwork.py qemu-io SEED SIZE CLUSTER [--compress] [--no-discard] [--aio] [--count N]
      print random qemu-io commands, one a line: pattern writes at aligned and unaligned
      places, write-zeroes with and without unmap, cluster-aligned discards, compressed
      cluster writes (first, into unallocated clusters), batches of non-overlapping aio
      writes, flushes. Applied to a raw file and to an image, both must end up with the
      same guest content.

  _imgwork.py crash SOCKET EXPORT SIZE SEED PID KILL_AFTER_S STATE [BASE]
      an NBD client doing random writes, write-zeroes, trims and flushes (several in
      flight, never overlapping) until KILL_AFTER_S, when it kills PID with SIGKILL. It
      keeps the content the image must have as of the last flush the server completed, and
      which sectors later requests (or trims) may have changed, in STATE (JSON + .bin).
      BASE: a raw file with the image's content at the start (default: zeroes).

  _imgwork.py verify STATE RAW
      RAW (the image read back after the crash) must equal STATE's durable content on every
      sector no later request touched. Exit 1 with the first mismatch otherwise.

The leading underscore keeps the test runner from running this file as a test.
"""

import json
import os
import random
import signal
import sys
import time

SECTOR = 512


def qemu_io_cmds(seed, size, cluster, compress=False, discard=True, aio=False, count=60):
    r = random.Random(seed)
    out = []

    def rand_range(align, maxlen):
        ln = r.choice([align, align * r.randint(1, 8), r.randint(1, maxlen)])
        ln = max(align, min(ln - ln % align, maxlen))
        off = r.randrange(0, (size - ln) // align + 1) * align
        return off, ln

    # Compressed writes need unallocated clusters: all first, on distinct clusters.
    taken = []
    for _ in range(12 if compress else 0):
        off, ln = rand_range(cluster, 2 * cluster)
        if not any(off < b and a < off + ln for a, b in taken):
            taken.append((off, off + ln))
            out.append("write -c -P %d %d %d" % (r.randrange(1, 256), off, ln))
    for _ in range(count):
        k = r.random()
        if k < 0.35:
            align = r.choice([512, 4096, cluster])
            off, ln = rand_range(align, 3 * cluster + 4096)
            out.append("write -P %d %d %d" % (r.randrange(1, 256), off, ln))
        elif k < 0.45:
            off, ln = rand_range(512, 2 * cluster)
            out.append("write -P %d %d %d" % (r.randrange(1, 256), off + 17 if off + ln + 17
                                               <= size else off, ln))
        elif k < 0.6:
            off, ln = rand_range(512, 4 * cluster)
            out.append("write -z %s%d %d" % ("-u " if r.random() < 0.5 else "", off, ln))
        elif k < 0.7 and discard:
            off, ln = rand_range(cluster, 4 * cluster)
            out.append("discard %d %d" % (off, ln))
        elif aio and k < 0.85:
            taken = []
            for _ in range(r.randint(2, 12)):
                off, ln = rand_range(r.choice([512, cluster]), 2 * cluster)
                if any(off < b and a < off + ln for a, b in taken):
                    continue
                taken.append((off, off + ln))
                out.append("aio_write -P %d %d %d" % (r.randrange(1, 256), off, ln))
            out.append("aio_flush")
        else:
            out.append("flush")
    return out


class Model:
    """What the image holds: `cur` after every acknowledged request; `durable` as of the
    last completed flush, with `touched` = sectors that requests not covered by it may
    have changed."""

    def __init__(self, size):
        self.size = size
        self.cur = bytearray(size)
        self.unknown = bytearray(size // SECTOR)     # 1: content undefined (trimmed)
        self.ops = []                                # [start, end, acked_seq or None]
        self.acked = 0
        self.durable = None
        self.durable_unknown = None
        self.durable_upto = 0                        # ops acked before this seq are in
        self.flushes = 0

    def apply(self, kind, start, end, data):
        """An acknowledged write ("w"), write-zeroes ("z") or trim ("t")."""
        if kind == "t":
            for s in range(start // SECTOR, (end + SECTOR - 1) // SECTOR):
                self.unknown[s] = 1
            return
        self.cur[start:end] = data if kind == "w" else bytes(end - start)
        for s in range(start // SECTOR, end // SECTOR):
            self.unknown[s] = 0


def crash(sock, export, size, seed, pid, kill_after, state, base=None):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _nbdproto as P

    class A:
        pass
    a = A()
    a.socket, a.timeout = sock, 30
    c = P.Conn(a)
    c.handshake()
    c.go(export)
    r = random.Random(seed)
    m = Model(size)
    if base:
        with open(base, "rb") as f:
            m.cur[:] = f.read(size).ljust(size, b"\0")
    inflight = {}   # cookie -> (kind, start, end, data, op index)
    flush_pending = {}  # cookie -> (snapshot cur, snapshot unknown, acked count)
    deadline = time.monotonic() + kill_after
    killed = False
    depth = r.choice([1, 2, 4, 8])
    nreq = 0
    try:
        while True:
            if not killed and time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                killed = True
            while len(inflight) + len(flush_pending) < depth:
                nreq += 1
                if r.random() < 0.08:
                    cookie = c.request(P.CMD_FLUSH)
                    flush_pending[cookie] = (bytes(m.cur), bytes(m.unknown), m.acked)
                    continue
                start, end = pick_range(r, size, inflight)
                if start is None:
                    break
                k = r.random()
                idx = len(m.ops)
                m.ops.append([start, end, None])
                if k < 0.7:
                    data = r.randbytes(end - start)
                    flags = P.CF_PAYLOAD_LEN if c.ext else 0
                    cookie = c.request(P.CMD_WRITE, start, end - start, flags, data)
                    inflight[cookie] = ("w", start, end, data, idx)
                elif k < 0.85:
                    cookie = c.request(P.CMD_WRITE_ZEROES, start, end - start,
                                       P.CF_NO_HOLE if r.random() < 0.5 else 0)
                    inflight[cookie] = ("z", start, end, None, idx)
                else:
                    cookie = c.request(P.CMD_TRIM, start, end - start)
                    inflight[cookie] = ("t", start, end, None, idx)
            cookie, done = c.one_reply()
            if not done:
                continue
            res = c.done.pop(cookie)
            if cookie in flush_pending:
                snap = flush_pending.pop(cookie)
                if res.error == 0:
                    m.durable, m.durable_unknown, m.durable_upto = snap
                    m.flushes += 1
                continue
            kind, start, end, data, idx = inflight.pop(cookie)
            if res.error:
                continue        # not acknowledged: stays "touched"
            m.apply(kind, start, end, data)
            m.ops[idx][2] = m.acked
            m.acked += 1
    except (P.Closed, OSError):
        pass
    if not killed:
        os.kill(pid, signal.SIGKILL)
    save(m, state, nreq)


def pick_range(r, size, inflight):
    """A random range not overlapping any request in flight (None after a few tries)."""
    for _ in range(20):
        align = r.choice([SECTOR, 4096, 65536])
        ln = r.choice([SECTOR, 4096, 65536, 131072, r.randint(1, 64) * SECTOR])
        ln = max(align, ln - ln % align)
        start = r.randrange(0, (size - ln) // align + 1) * align
        end = start + ln
        if all(end <= s or e <= start for _, s, e, _, _ in inflight.values()):
            return start, end
    return None, None


def save(m, state, nreq):
    touched = []
    for start, end, seq in m.ops:
        if seq is None or seq >= m.durable_upto or m.durable is None:
            touched.append((start, end))
    durable = m.durable if m.durable is not None else bytes(m.cur)
    dunk = m.durable_unknown if m.durable_unknown is not None else bytes(m.size // SECTOR)
    with open(state + ".bin", "wb") as f:
        f.write(durable)
    info = {"size": m.size, "flushes": m.flushes, "acked": m.acked, "requests": nreq,
            "durable_upto": m.durable_upto, "touched": touched,
            "unknown": [i for i, u in enumerate(dunk) if u],
            "had_flush": m.durable is not None}
    with open(state, "w") as f:
        json.dump(info, f)
    print("requests %d, acknowledged %d, completed flushes %d, in last flush %d"
          % (nreq, m.acked, m.flushes, m.durable_upto))


def verify(state, raw, base=None):
    info = json.load(open(state))
    want = open(state + ".bin", "rb").read()
    got = open(raw, "rb").read()
    size = info["size"]
    if len(got) < size:
        got += bytes(size - len(got))
    skip = bytearray(size // SECTOR)
    for s in info["unknown"]:
        skip[s] = 1
    for start, end in info["touched"]:
        for s in range(start // SECTOR, (end + SECTOR - 1) // SECTOR):
            skip[s] = 1
    if not info["had_flush"]:
        print("no flush completed: nothing is promised")
        return 0
    bad = 0
    for s in range(size // SECTOR):
        if skip[s]:
            continue
        a, b = s * SECTOR, (s + 1) * SECTOR
        if got[a:b] != want[a:b]:
            if bad == 0:
                print("sector %d (offset %d) differs from the last flushed content" % (s, a))
            bad += 1
    checked = size // SECTOR - sum(skip)
    print("%d sectors checked, %d skipped (touched after the last flush), %d bad"
          % (checked, sum(skip), bad))
    return 1 if bad else 0


def main(argv):
    if argv[1] == "qemu-io":
        seed, size, cluster = int(argv[2]), int(argv[3]), int(argv[4])
        count = int(argv[argv.index("--count") + 1]) if "--count" in argv else 60
        for line in qemu_io_cmds(seed, size, cluster, "--compress" in argv,
                                 "--no-discard" not in argv, "--aio" in argv, count):
            print(line)
        return 0
    if argv[1] == "crash":
        crash(argv[2], argv[3], int(argv[4]), int(argv[5]), int(argv[6]), float(argv[7]),
              argv[8], argv[9] if len(argv) > 9 else None)
        return 0
    if argv[1] == "verify":
        return verify(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
