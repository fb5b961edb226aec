# Shared helpers for the functional tests (tests/func/*.sh), sourced by them: skip/fail,
# the binary under test, a scratch directory removed on exit, and checks of commands'
# exit status and output. Plain bash, one test process.
#
# Exit codes follow the runner (scripts/test.sh): 0 pass, 77 skip (the reason printed as
# the last line), anything else fail. Environment: IOPLANE (binary under test; default
# $IOPLANE_BUILD/ioplane, then build/ioplane), IOPLANE_BUILD, IOPLANE_SRC.
# FUNC_KEEP_TMP=1 keeps the scratch directory.

set -euo pipefail

FUNC_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
IOPLANE_SRC=${IOPLANE_SRC:-$(cd "$FUNC_LIB_DIR/../.." && pwd)}
IOPLANE_BUILD=${IOPLANE_BUILD:-$IOPLANE_SRC/build}
IOPLANE=${IOPLANE:-$IOPLANE_BUILD/ioplane}

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

skip() {
	echo "SKIP: $*"
	exit 77
}

# need CMD...: skip unless every command is installed.
need() {
	local c
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || skip "$c is not installed"
	done
}

[ -x "$IOPLANE" ] || skip "no ioplane binary at $IOPLANE (set IOPLANE)"

# Scratch space on a real filesystem where one exists: O_DIRECT does not work on tmpfs.
func_mktemp_dir() {
	local d
	for d in /var/tmp /tmp; do
		if [ -d "$d" ] && [ -w "$d" ] && [ "$(stat -f -c %T "$d" 2>/dev/null)" != tmpfs ]; then
			mktemp -d "$d/ioplane-func.XXXXXX"
			return
		fi
	done
	mktemp -d
}

FUNC_TMP=$(func_mktemp_dir)
func_exit_hooks=()

# at_exit CMD: run CMD (a string) when the test exits.
at_exit() {
	func_exit_hooks+=("$1")
}

func_cleanup() {
	local rc=$? hook
	trap - EXIT
	set +e
	for hook in "${func_exit_hooks[@]}"; do
		eval "$hook"
	done
	if [ "${FUNC_KEEP_TMP:-0}" = 1 ]; then
		echo "kept $FUNC_TMP" >&2
	else
		rm -rf "$FUNC_TMP"
	fi
	exit $rc
}
trap func_cleanup EXIT

# True when direct I/O works in the scratch directory.
# stop_servers STATUS PIDS LOGS: for the exit hooks of the server helpers
# (nbd-lib.sh, vhost-lib.sh). PIDS and LOGS name arrays. SIGTERM every server,
# give each 5 s, then SIGKILL; when the test failed (STATUS not 0 or 77), show
# the end of each server log.
stop_servers() {
	local status=$1 pid i
	local -n srv_pids=$2 srv_logs=$3
	for pid in "${srv_pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${srv_pids[@]}"; do
		for ((i = 0; i < 50; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [ "$status" -ne 0 ] && [ "$status" -ne 77 ]; then
		for i in "${srv_logs[@]}"; do
			[ -s "$i" ] || continue
			echo "---- server log $i (last 30 lines)" >&2
			tail -n 30 "$i" >&2
		done
	fi
	return 0
}

have_odirect() {
	dd if=/dev/zero of="$FUNC_TMP/.odirect" bs=4096 count=1 oflag=direct status=none 2>/dev/null
	local rc=$?
	rm -f "$FUNC_TMP/.odirect"
	return $rc
}

# image_locked FILE [SECONDS]: whether a process holds an image lock (QEMU's bytes
# 100-103, 200-203) on FILE, waiting up to SECONDS (default 0) for one. Only looks
# (F_OFD_GETLK): a probe that opened the image itself, as qemu-img info does, would take
# locks of its own and could keep the holder from starting.
image_locked() {
	python3 - "$1" "${2:-0}" <<'PY'
import fcntl, os, struct, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
deadline = time.monotonic() + float(sys.argv[2])
while True:
    if any(struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK,
           struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, b, 1, 0)))[0] != fcntl.F_UNLCK
           for b in list(range(100, 104)) + list(range(200, 204))):
        sys.exit(0)
    if time.monotonic() >= deadline:
        sys.exit(1)
    time.sleep(0.05)
PY
}

# wait_unlocked FILE: until no process holds an image lock (QEMU's bytes 100-103, 200-203)
# on FILE, 10 s at most. A process killed with I/O in flight keeps its locks until that
# I/O ends: its open file lives that long.
wait_unlocked() {
	python3 - "$1" <<'PY' || fail "$1 is still locked after 10 s"
import fcntl, os, struct, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
for _ in range(200):
    if not any(struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK,
               struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, b, 1, 0)))[0] != fcntl.F_UNLCK
               for b in list(range(100, 104)) + list(range(200, 204))):
        sys.exit(0)
    time.sleep(0.05)
sys.exit(1)
PY
}

# True when the binary was built with AddressSanitizer (valgrind cannot run it).
is_sanitized() {
	ldd "$IOPLANE" 2>/dev/null | grep -q libasan
}

# run_status WANT CMD...: run CMD with a time limit, its stdout in $OUT and stderr in $ERR
# (files); fail unless it exits with WANT.
OUT=$FUNC_TMP/out
ERR=$FUNC_TMP/err
run_status() {
	local want=$1 rc=0
	shift
	timeout -k 5 "${FUNC_CMD_TIMEOUT:-120}" "$@" >"$OUT" 2>"$ERR" || rc=$?
	if [ "$rc" -ne "$want" ]; then
		echo "command: $*" >&2
		echo "--- stdout" >&2
		head -n 20 "$OUT" >&2
		echo "--- stderr" >&2
		head -n 20 "$ERR" >&2
		fail "exit status $rc, expected $want"
	fi
}

run_ok() { run_status 0 "$@"; }

# expect_line FILE TEXT: fail unless FILE has a line equal to TEXT.
expect_line() {
	grep -qxF -- "$2" "$1" || { cat "$1" >&2; fail "no line '$2' in ${1##*/}"; }
}

# expect_grep FILE REGEX: fail unless FILE matches the extended regex.
expect_grep() {
	grep -qE -- "$2" "$1" || { cat "$1" >&2; fail "no match for /$2/ in ${1##*/}"; }
}

# strace_start PID OUT: `strace -c -f` every thread of PID into OUT, and wait (bounded)
# until each thread is traced; strace_stop ends it, leaving the summary in OUT.
strace_start() {
	local i
	strace -c -f -o "$2" -p "$1" 2>"$2.err" &
	STRACE_PID=$!
	for ((i = 0; i < 200; i++)); do
		grep -h '^TracerPid:' /proc/"$1"/task/*/status 2>/dev/null |
			awk '$2 == 0 { n++ } END { exit n > 0 }' && return 0
		sleep 0.05
	done
}
strace_stop() {
	kill -INT "$STRACE_PID"
	wait "$STRACE_PID" || true
}

# strace_calls OUT [NAME...]: prints "TOTAL N", the calls in strace's summary OUT, all of
# them and those of the NAMEs.
strace_calls() {
	python3 - "$@" <<'PY'
import sys
total = named = 0
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 5 and f[-1] == "total":
        total = int(f[3])
    elif len(f) >= 5 and f[-1] in sys.argv[2:]:
        named += int(f[3])
print(total, named)
PY
}
