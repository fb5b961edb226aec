#!/bin/bash
# Incremental backup, ioplane vs qemu-storage-daemon, three rows:
#   1. write cost of dirty tracking: callgrind instructions per 4 KiB write, null data
#      node, depth 64, with one enabled bitmap against none: in the block layer (ioplane
#      bench --x-dirty-bitmaps), and in each daemon (the whole daemon under callgrind,
#      NBD writes from ioplane bench, the bitmap added over QMP); marginal count between
#      -c LO and -c HI, start-up cancels out. Target: <= 1.05x.
#   2. incremental backup read: a --size qcow2 image (default 4 GiB) with --percent (5%)
#      of it dirtied in scattered 64 KiB extents, tracked by a bitmap made with qemu-img;
#      each daemon exports it with that bitmap, and the same client (nbdsh: one
#      block-status walk of qemu:dirty-bitmap:b0 over the disk, then a read of every
#      dirty extent, --depth (16) reads in flight) times finding and reading every
#      dirty byte. Best of --runs.
#      Target: ioplane <= 0.7x qsd.
#   3. the longest fio stall during blockdev-snapshot-sync: bench/compare-snapshot-stall.sh,
#      run last (with --quick when this run is).
#
#   bench/compare-backup.sh [--size SIZE] [--percent P] [--runs N] [--depth N] [--quick]
#
# A benchmark, not a test: exit 0 whether targets are met or not; 1 when a tool fails;
# 2 on bad usage. Needs valgrind, qemu-img, qemu-io, qemu-storage-daemon, nbdsh
# (python3-libnbd). Timed figures need a quiet machine; --quick only proves the script.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
size=4G
percent=5
runs=3
depth=16
cg_lo=20000
cg_hi=120000

while [ $# -gt 0 ]; do
	case "$1" in
	--size) size=$2; shift 2 ;;
	--percent) percent=$2; shift 2 ;;
	--runs) runs=$2; shift 2 ;;
	--depth) depth=$2; shift 2 ;;
	--quick) size=256M; runs=1; cg_lo=2000; cg_hi=12000; shift ;;
	-h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
	*) echo "unknown option $1 (try --help)" >&2; exit 2 ;;
	esac
done
for c in valgrind qemu-img qemu-io qemu-storage-daemon python3; do
	command -v "$c" >/dev/null || { echo "compare-backup: $c is not installed" >&2; exit 1; }
done
[ -x "$IOPLANE" ] || { echo "compare-backup: no $IOPLANE (ninja -C build)" >&2; exit 1; }
# nbdsh is python3 -m nbd; the system's python3 has the module.
py=
for p in /usr/bin/python3 python3; do
	if "$p" -c 'import nbd' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "compare-backup: nbdsh (python3-libnbd) is not installed" >&2; exit 1; }

tmp=$(mktemp -d /var/tmp/ioplane-compare-backup.XXXXXX)
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT

# ---- row 1: instructions per write ----

callgrind_ir() {
	valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" >"$tmp/cg.log" 2>&1 ||
		{ cat "$tmp/cg.log" >&2; return 1; }
	awk '/Collected :/ { print $NF }' "$tmp/cg.log"
}

per_write() {
	local lo hi
	lo=$(callgrind_ir "$IOPLANE" bench -q -w -d 64 -c $cg_lo "$@" null:size=1G)
	hi=$(callgrind_ir "$IOPLANE" bench -q -w -d 64 -c $cg_hi "$@" null:size=1G)
	awk -v a="$lo" -v b="$hi" -v n=$((cg_hi - cg_lo)) 'BEGIN { printf "%.1f\n", (b - a) / n }'
}

ir_none=$(per_write)
ir_one=$(per_write --x-dirty-bitmaps=1)

# The same in the daemon: instructions of the whole daemon (every thread) per 4 KiB
# NBD write from ioplane bench at depth 64 to a null-co node, with a bitmap added over
# QMP or none; marginal between two request counts.
qmp_do() { # SOCKET COMMAND [ARGS-JSON]
	python3 - "$src" "$@" <<'PY' >&2
import json, sys
sys.path.insert(0, sys.argv[1] + '/tests/func')
from _qmp import Client
c = Client(sys.argv[2]).negotiate()
r = c.cmd(sys.argv[3], json.loads(sys.argv[4]) if len(sys.argv) > 4 else None)
if 'error' in r:
    sys.exit('%s: %s' % (sys.argv[3], r['error']['desc']))
PY
}

daemon_ir() { # KIND N BITMAP(0|1)
	local kind=$1 n=$2 bm=$3 p i
	local -a cmd=(qemu-storage-daemon)
	[ "$kind" = qsd ] || cmd=("$IOPLANE" serve -q)
	rm -f "$tmp/cg.sock" "$tmp/cg.qmp"
	IOPLANE_LOOP_BACKEND=epoll valgrind --tool=callgrind --callgrind-out-file=/dev/null \
		"${cmd[@]}" --chardev "socket,id=m0,path=$tmp/cg.qmp,server=on,wait=off" \
		--monitor chardev=m0 --blockdev driver=null-co,size=1073741824,node-name=n \
		--nbd-server "addr.type=unix,addr.path=$tmp/cg.sock" \
		--export type=nbd,id=e,node-name=n,writable=on </dev/null >"$tmp/dcg.log" 2>&1 &
	p=$!
	pids+=("$p")
	for ((i = 0; i < 1200; i++)); do
		[ -S "$tmp/cg.sock" ] && [ -S "$tmp/cg.qmp" ] && break
		sleep 0.05
	done
	[ "$bm" = 0 ] || qmp_do "$tmp/cg.qmp" block-dirty-bitmap-add '{"node": "n", "name": "b"}'
	"$IOPLANE" bench -q -w -d 64 -f raw -c "$n" "nbd+unix:///n?socket=$tmp/cg.sock" >/dev/null
	qmp_do "$tmp/cg.qmp" quit
	wait "$p" || true
	awk '/Collected :/ { print $NF }' "$tmp/dcg.log"
}

daemon_per_write() { # KIND BITMAP
	local lo hi
	lo=$(daemon_ir "$1" $cg_lo "$2")
	hi=$(daemon_ir "$1" $cg_hi "$2")
	awk -v a="$lo" -v b="$hi" -v n=$((cg_hi - cg_lo)) 'BEGIN { printf "%.1f\n", (b - a) / n }'
}

declare -A dir
for kind in ioplane qsd; do
	for bm in 0 1; do
		dir[$kind$bm]=$(daemon_per_write $kind $bm)
	done
done

# ---- row 2: incremental backup read ----

img=$tmp/disk.qcow2
qemu-img create -q -f qcow2 "$img" "$size"
bytes=$(qemu-img info --output=json "$img" | awk -F'[:,]' '/"virtual-size"/ { printf "%d\n", $2 }')
# Some data before the backup point, so that clean ranges are not all holes.
qemu-io -f qcow2 -c "write -P 0x11 0 $((bytes / 8))" "$img" >/dev/null
qemu-img bitmap --add "$img" b0
extents=$((bytes / 100 * percent / 65536))
python3 - "$bytes" "$extents" >"$tmp/writes" <<'EOF'
import random, sys
size, n = int(sys.argv[1]), int(sys.argv[2])
slots = random.Random(42).sample(range(size // 65536), n)
for s in sorted(slots):
    print('write -P 0x5a %d 65536' % (s * 65536))
EOF
qemu-io -f qcow2 "$img" <"$tmp/writes" >/dev/null
qemu-img bitmap --disable "$img" b0 # exported read-only

# The client keeps up to --depth reads in flight (libnbd aio_pread, one buffer per
# slot), as backup tools do (nbdcopy keeps 64 requests in flight, virtnbdbackup several
# workers): a client that waits for each reply before sending the next one measures its
# own round trips, not the server. --depth 1 is that synchronous client.
read_dirty() {
	BK_URI=$1 BK_DEPTH=$depth "$py" -m nbd -c '
import os, time
h.add_meta_context("qemu:dirty-bitmap:b0")
h.connect_uri(os.environ["BK_URI"])
depth = int(os.environ["BK_DEPTH"])
size = h.get_size()
t0 = time.monotonic()
ext = []
pos = 0
while pos < size:
    end = [pos]
    def cb(meta, off, ents, err):
        p = off
        for i in range(0, len(ents), 2):
            if ents[i + 1] & 1:
                ext.append((p, min(ents[i], size - p)))
            p += ents[i]
        end[0] = p
        return 0
    h.block_status(min(size - pos, 1 << 30), pos, cb)
    if end[0] <= pos:
        raise SystemExit("block status made no progress")
    pos = end[0]
chunk = 4 << 20
reqs = [(o + k, min(n - k, chunk)) for o, n in ext for k in range(0, n, chunk)]
pool = {}  # free buffers by size: the extents are mostly of one size
busy = [0]
failed = []
def done(buf, n, err):
    if err.value:
        failed.append(err.value)
    pool.setdefault(n, []).append(buf)
    busy[0] -= 1
    return 1
dirty = 0
for off, n in reqs:
    while busy[0] >= depth:
        h.poll(-1)
    free = pool.get(n)
    buf = free.pop() if free else nbd.Buffer(n)
    busy[0] += 1
    h.aio_pread(buf, off, completion=lambda err, b=buf, n=n: done(b, n, err))
    dirty += n
while h.aio_in_flight():
    h.poll(-1)
if failed:
    raise SystemExit("a read failed: errno %d" % failed[0])
print("%.6f %d" % (time.monotonic() - t0, dirty))
'
}

# run_daemon KIND: serve $img with the bitmap exported; sets dpid, sock.
run_daemon() {
	local kind=$1 i
	sock=$tmp/$kind.sock
	rm -f "$sock"
	local -a cmd=(qemu-storage-daemon)
	[ "$kind" = qsd ] || cmd=("$IOPLANE" serve -q)
	"${cmd[@]}" --blockdev "driver=file,filename=$img,node-name=f,read-only=on" \
		--blockdev driver=qcow2,file=f,node-name=q,read-only=on \
		--nbd-server "addr.type=unix,addr.path=$sock" \
		--export type=nbd,id=e,node-name=q,name=d,bitmaps.0=b0 </dev/null >"$tmp/$kind.log" 2>&1 &
	dpid=$!
	pids+=("$dpid")
	for ((i = 0; i < 400; i++)); do
		[ -S "$sock" ] && return 0
		kill -0 "$dpid" 2>/dev/null || break
		sleep 0.05
	done
	cat "$tmp/$kind.log" >&2
	return 1
}

declare -A best dirty
for kind in qsd ioplane; do
	run_daemon $kind
	for ((r = 0; r < runs; r++)); do
		read -r t d < <(read_dirty "nbd+unix:///d?socket=$sock")
		dirty[$kind]=$d
		if [ -z "${best[$kind]:-}" ] || awk -v a="$t" -v b="${best[$kind]}" 'BEGIN { exit !(a < b) }'; then
			best[$kind]=$t
		fi
	done
	kill "$dpid"
	wait "$dpid" 2>/dev/null || true
done
[ "${dirty[qsd]}" = "${dirty[ioplane]}" ] ||
	{ echo "compare-backup: the daemons found ${dirty[qsd]} and ${dirty[ioplane]} dirty bytes" >&2; exit 1; }

# ---- the table ----

printf '%-58s %12s %12s %8s %s\n' metric baseline measured ratio target
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
printf '%-58s %12s %12s %8s %s\n' "1. instr/4k write, null, qd64: no bitmap vs one enabled" \
	"" "" "" ""
printf '%-58s %12s %12s %8s %s\n' "   block layer (ioplane bench)" \
	"$ir_none" "$ir_one" "$(ratio "$ir_one" "$ir_none")" "<= 1.05"
for kind in ioplane qsd; do
	printf '%-58s %12s %12s %8s %s\n' "   $kind daemon, NBD writes" \
		"${dir[${kind}0]}" "${dir[${kind}1]}" "$(ratio "${dir[${kind}1]}" "${dir[${kind}0]}")" \
		"$([ $kind = ioplane ] && echo '<= 1.05')"
done
printf '%-58s %12s %12s %8s %s\n' \
	"2. find+read ${dirty[ioplane]} dirty bytes of $size over NBD (s): qsd vs ioplane" \
	"${best[qsd]}" "${best[ioplane]}" \
	"$(awk -v a="${best[ioplane]}" -v b="${best[qsd]}" 'BEGIN { printf "%.3f", a / b }')" "<= 0.7"
# Row 3: the longest request stall seen by fio (4 KiB randwrite, depth 16) during
# blockdev-snapshot-sync, ioplane vs qsd, target ioplane <= qsd.
echo
echo "3. fio stall during blockdev-snapshot-sync (bench/compare-snapshot-stall.sh):"
IOPLANE=$IOPLANE bash "$src/bench/compare-snapshot-stall.sh" $([ "$size" = 256M ] && echo --quick)
