# Helpers for the tests of the nbd protocol driver (tests/func/test-nbdc-*.sh), sourced on
# top of nbd-lib.sh: start NBD servers for ioplane to be a client of (nbdkit, qemu-nbd,
# ioplane itself) in the background, wait until they listen, and have the exit hook stop
# them. Plain bash, one test process.

NBDC_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=nbd-lib.sh
. "$NBDC_LIB_DIR/nbd-lib.sh"

NBDC_PID=

# nbdc_wait_unix PID SOCK: until SOCK listens (fail if PID exits or 30 s pass).
nbdc_wait_unix() {
	local i
	for ((i = 0; i < 600; i++)); do
		kill -0 "$1" 2>/dev/null || fail "server for $2 exited during start-up"
		nbd_unix_listening "$2" && return 0
		sleep 0.05
	done
	fail "nothing listens on $2 after 30 s"
}

# nbdc_bg SOCK CMD...: run a server in the background (log in $NBD_TMP), wait for SOCK.
# Sets NBDC_PID; the exit hook stops it.
nbdc_bg() {
	local sock=$1 log
	shift
	rm -f "$sock"
	log=$NBD_TMP/peer-$((${#nbd_pids[@]} + 1)).log
	echo "+ $*" >"$log"
	"$@" </dev/null >>"$log" 2>&1 &
	NBDC_PID=$!
	nbd_pids+=("$NBDC_PID")
	nbd_logs+=("$log")
	nbdc_wait_unix "$NBDC_PID" "$sock"
}

# nbdc_nbdkit SOCK ARGS...: nbdkit in the foreground of a background job, on SOCK.
nbdc_nbdkit() {
	local sock=$1
	shift
	nbdc_bg "$sock" nbdkit -f -U "$sock" "$@"
}

# nbdc_qemu_nbd SOCK FILE [ARGS...]: qemu-nbd serving raw FILE on SOCK, any number of
# clients one after the other.
nbdc_qemu_nbd() {
	local sock=$1 file=$2
	shift 2
	nbdc_bg "$sock" qemu-nbd -f raw -t -k "$sock" --cache=writeback "$@" "$file"
}

# nbdc_kill PID: SIGKILL a server started here (a crash, not a shutdown).
nbdc_kill() {
	kill -KILL "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
	nbd_forget "$1"
}

# nbdc_need_memory: nbdkit with its memory plugin.
nbdc_need_memory() {
	nbd_need nbdkit
	nbdkit --dump-plugin memory >/dev/null 2>&1 || skip "nbdkit has no memory plugin"
}
