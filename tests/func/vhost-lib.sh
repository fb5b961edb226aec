# Helpers for the vhost-user-blk functional tests (tests/func/test-vhost-*.sh), sourced
# on top of lib.sh: start `ioplane serve` (or qemu-storage-daemon) in the background and
# wait (bounded) for its socket, stop it with SIGTERM and check it exits 0, check the
# offset-derived data `ioplane bench --verify` writes, straight in an image file.
# Environment as lib.sh (IOPLANE, IOPLANE_BUILD, IOPLANE_SRC).

VHOST_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$VHOST_LIB_DIR/lib.sh"

vhost_pids=()
vhost_logs=()

vhost_cleanup() {
	stop_servers "${rc:-0}" vhost_pids vhost_logs
}
at_exit vhost_cleanup
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND" >&2' ERR

# vhost_wait_socket PID SOCK: wait up to 30 s for SOCK while PID lives.
vhost_wait_socket() {
	local i
	for ((i = 0; i < 300; i++)); do
		[ -S "$2" ] && return 0
		kill -0 "$1" 2>/dev/null || fail "server exited before listening on $2"
		sleep 0.1
	done
	fail "no socket $2 after 30 s"
}

# vhost_serve SOCK ARGS...: start `ioplane serve ARGS` (which must create SOCK); sets
# VHOST_PID.
vhost_serve() {
	local sock=$1 log
	shift
	log=$FUNC_TMP/serve.$((${#vhost_logs[@]} + 1)).log
	rm -f "$sock"
	"$IOPLANE" serve "$@" >"$log" 2>&1 &
	VHOST_PID=$!
	vhost_pids+=("$VHOST_PID")
	vhost_logs+=("$log")
	vhost_wait_socket "$VHOST_PID" "$sock"
}

# vhost_qsd SOCK ARGS...: start qemu-storage-daemon ARGS; sets VHOST_PID.
vhost_qsd() {
	local sock=$1 log
	shift
	log=$FUNC_TMP/qsd.$((${#vhost_logs[@]} + 1)).log
	rm -f "$sock"
	qemu-storage-daemon "$@" >"$log" 2>&1 &
	VHOST_PID=$!
	vhost_pids+=("$VHOST_PID")
	vhost_logs+=("$log")
	vhost_wait_socket "$VHOST_PID" "$sock"
}

# vhost_stop PID: SIGTERM, wait (bounded), the server must exit 0.
vhost_stop() {
	local pid=$1 i rc=0
	kill -TERM "$pid"
	for ((i = 0; i < 300; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -0 "$pid" 2>/dev/null && fail "server $pid still running 30 s after SIGTERM"
	wait "$pid" || rc=$?
	[ "$rc" -eq 0 ] || fail "server $pid exited $rc"
}

# vhost_bench ARGS...: `ioplane bench` with a time limit.
vhost_bench() {
	timeout -k 5 120 "$IOPLANE" bench "$@"
}

# vhost_check_file IMG PATTERN BLOCKS BUFSIZE [OFFSET]: the first BLOCKS blocks from
# OFFSET hold what `bench -w --verify --pattern PATTERN -s BUFSIZE` writes.
vhost_check_file() {
	python3 - "$@" <<'PY'
import struct, sys
img, pat, blocks, bs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
base = int(sys.argv[5]) if len(sys.argv) > 5 else 0
p = pat * 0x0101010101010101
with open(img, 'rb') as f:
    f.seek(base)
    data = f.read(blocks * bs)
if len(data) != blocks * bs:
    sys.exit("short image")
for off in range(0, len(data), 8):
    w = struct.unpack_from('<Q', data, off)[0]
    if w != (base + off) ^ p:
        sys.exit("mismatch at byte %d: %#x" % (base + off, w))
PY
}
