#!/bin/bash
# Reconnects of a vhost-user-blk front-end, with the data checked afterwards:
#  1. the front-end drops the connection with requests in flight and reconnects
#     (--reconnect-after: inflight area, bases from the used rings);
#  2. the front-end is killed mid-workload; a new one attaches and works;
#  3. ioplane is killed mid-workload and started again; the front-end (--reconnect)
#     reattaches, the restarted daemon resubmits what was in flight, and every write
#     the front-end saw completed is in the image.
. "$(dirname "${BASH_SOURCE[0]}")/vhost-lib.sh"
need python3

img=$FUNC_TMP/disk.img
sock=$FUNC_TMP/vhost.sock
truncate -s 32M "$img"
blocks=$((32 * 1024 * 1024 / 4096 - 1))
serve_args=(--iothreads 2 --image d,file="$img"
	--vhost-user-blk unix="$sock",image=d,num-queues=4,writable=on)

# wait_first_write IMG PATTERN PID: wait (bounded) until block 0 of IMG holds what
# `bench -w --verify --pattern PATTERN` writes there, while PID runs.
wait_first_write() {
	local i
	for ((i = 0; i < 3000; i++)); do
		python3 - "$1" "$2" <<'PY' && return 0
import struct, sys
with open(sys.argv[1], 'rb') as f:
    w = struct.unpack('<Q', f.read(8))[0]
sys.exit(w != int(sys.argv[2]) * 0x0101010101010101)
PY
		kill -0 "$3" 2>/dev/null || fail "the front-end exited before its first write"
		sleep 0.01
	done
	fail "no write of the front-end in the image after 3000 looks"
}

# proc_state PID: the state letter of PID (R, S, T, Z, ...).
proc_state() {
	sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1
}

vhost_serve "$sock" "${serve_args[@]}"
pid=$VHOST_PID

# 1. Drop and reconnect in the middle.
vhost_bench --vhost-user "$sock" --num-queues 4 -d 32 -c $((blocks * 2)) -w --verify \
	--pattern 41 --reconnect-after 5000 -q
vhost_bench --vhost-user "$sock" --num-queues 2 -d 16 -c $blocks --verify --pattern 41 -q
vhost_check_file "$img" 41 $blocks 4096
echo "front-end reconnect with requests in flight: ok"

# 2. Kill the front-end mid-run: the daemon must take the next one.
"$IOPLANE" bench --vhost-user "$sock" --num-queues 4 -d 64 -c 100000000 -w --pattern 1 -q &
bpid=$!
sleep 0.5
kill -KILL "$bpid"
wait "$bpid" 2>/dev/null || true
vhost_bench --vhost-user "$sock" --num-queues 4 -d 32 -c $blocks -w --verify --pattern 42 -q
vhost_bench --vhost-user "$sock" --num-queues 3 -d 8 -c $blocks --verify --pattern 42 -q
vhost_check_file "$img" 42 $blocks 4096
echo "front-end killed, a new one attached: ok"

# 3. Kill the daemon mid-run and start it again; the front-end rides it out. Once the
# front-end's first write is in the image the daemon is frozen (SIGSTOP), so that the
# front-end cannot finish before the daemon is killed with requests in flight.
"$IOPLANE" bench --vhost-user "$sock" --num-queues 4 -d 32 -c $((blocks * 20)) -w --verify \
	--pattern 43 --reconnect -q &
bpid=$!
wait_first_write "$img" 43 "$bpid"
kill -STOP "$pid"
kill -0 "$bpid" 2>/dev/null && [ "$(proc_state "$bpid")" != Z ] ||
	fail "the front-end finished before the daemon was frozen"
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
vhost_serve "$sock" "${serve_args[@]}"
pid=$VHOST_PID
rc=0
wait "$bpid" || rc=$?
[ $rc -eq 0 ] || fail "the front-end failed across the daemon restart (exit $rc)"
vhost_bench --vhost-user "$sock" --num-queues 2 -d 16 -c $blocks --verify --pattern 43 -q
vhost_check_file "$img" 43 $blocks 4096
grep -q "front-end connected" "${vhost_logs[-1]}" || fail "no connection in the new daemon's log"
echo "daemon killed and restarted mid-run: ok"
vhost_stop "$pid"
echo "PASS"
