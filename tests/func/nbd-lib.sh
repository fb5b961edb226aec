# Helpers for the NBD functional tests (tests/func/test-nbd-*.sh), sourced by them on top
# of lib.sh (fail, skip, need, FUNC_TMP, at_exit): start `ioplane serve` in the background,
# wait (bounded) until its sockets listen, stop it with SIGTERM and check it exits 0; kill
# whatever is left when the test exits. Plain bash, one test process; the servers are its
# background children.
#
# Exit codes follow the runner (scripts/test.sh): 0 pass, 77 skip (say why), else fail.
# Environment (set by the runner): IOPLANE (binary), IOPLANE_BUILD, IOPLANE_SRC.
# NBD_TEST_PEER=qsd runs the same tests against qemu-storage-daemon instead, by
# translating the `ioplane serve` arguments; that only checks the tests themselves.
# FUNC_KEEP_TMP=1 keeps the temporary directory.

NBD_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$NBD_LIB_DIR/lib.sh"
NBD_TEST_PEER=${NBD_TEST_PEER:-}
NBD_WAIT_SECS=${NBD_WAIT_SECS:-30}

NBD_TMP=$FUNC_TMP
NBD_PID=
NBD_LOG=
nbd_pids=()
nbd_logs=()
nbd_nserve=0

# Exit hook (lib.sh runs it before removing FUNC_TMP): stop the servers still running and,
# when the test failed, show their logs. $rc is lib.sh's exit status, seen here because
# the hook runs inside its cleanup function.
nbd_cleanup() {
	stop_servers "${rc:-0}" nbd_pids nbd_logs
}
at_exit nbd_cleanup
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND" >&2' ERR

# nbd_at_exit CMD: run CMD (a string) when the test exits, after the servers are stopped.
nbd_at_exit() {
	at_exit "$1"
}

# nbd_need CMD...: skip the test unless every CMD is installed (lib.sh's need).
nbd_need() {
	need "$@"
}

# nbd_need_ioplane: the server under test (lib.sh has checked $IOPLANE already).
nbd_need_ioplane() {
	[ -z "$NBD_TEST_PEER" ] || need qemu-storage-daemon
}

# nbd_uri NAME SOCK: the NBD URI of export NAME on unix socket SOCK.
nbd_uri() {
	echo "nbd+unix:///$1?socket=$2"
}

# nbd_tcp_uri NAME PORT: the NBD URI of export NAME on 127.0.0.1:PORT.
nbd_tcp_uri() {
	echo "nbd://127.0.0.1:$2/$1"
}

# nbd_free_port: a TCP port on 127.0.0.1 that was free a moment ago.
nbd_free_port() {
	python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# nbd_unix_listening PATH: true if a unix socket is listening at PATH (no connection made,
# so the server sees no stray client).
nbd_unix_listening() {
	# /proc/net/unix flag 00010000 is __SO_ACCEPTCON, i.e. listen() was called.
	awk -v p="$1" '$NF == p && $4 == "00010000" { found = 1 } END { exit !found }' \
		/proc/net/unix
}

# nbd_tcp_listening PORT: true if something listens on TCP PORT (v4 or v6).
nbd_tcp_listening() {
	local hex
	hex=$(printf '%04X' "$1")
	cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
		awk -v h="$hex" '{ split($2, a, ":") } a[2] == h && $4 == "0A" { f = 1 }
			END { exit !f }'
}

# nbd_addrs ARGS...: print "unix PATH" / "tcp PORT" for each listener in serve ARGS.
nbd_addrs() {
	local want=0 a kv
	for a in "$@"; do
		if [ $want = 1 ]; then
			IFS=, read -r -a kv <<<"$a"
			for a in "${kv[@]}"; do
				case "$a" in
				unix=*) echo "unix ${a#unix=}" ;;
				tcp=*) echo "tcp ${a##*:}" ;;
				esac
			done
			want=0
		fi
		[ "$a" = --nbd ] && want=1
	done
	return 0
}

# nbd_wait_ready PID LOG ARGS...: wait until every listener of ARGS listens, or fail if the
# server exits or NBD_WAIT_SECS pass.
nbd_wait_ready() {
	local pid=$1 log=$2 i kind addr ok
	shift 2
	for ((i = 0; i < NBD_WAIT_SECS * 20; i++)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			cat "$log" >&2
			fail "server exited during start-up: $*"
		fi
		ok=1
		while read -r kind addr; do
			case $kind in
			unix) nbd_unix_listening "$addr" || ok=0 ;;
			tcp) nbd_tcp_listening "$addr" || ok=0 ;;
			esac
		done < <(nbd_addrs "$@")
		[ $ok = 1 ] && return 0
		sleep 0.05
	done
	fail "server not listening after ${NBD_WAIT_SECS}s: $*"
}

# nbd_serve ARGS...: start `$IOPLANE serve ARGS` in the background (stderr to a log), wait
# until it listens on every --nbd address. Sets NBD_PID and NBD_LOG.
nbd_serve() {
	local -a cmd
	nbd_nserve=$((nbd_nserve + 1))
	NBD_LOG=$NBD_TMP/serve-$nbd_nserve.log
	if [ -n "$NBD_TEST_PEER" ]; then
		nbd_peer_args "$@"
		cmd=(qemu-storage-daemon "${nbd_peer[@]}")
	else
		cmd=("$IOPLANE" serve "$@")
	fi
	echo "+ ${cmd[*]}" >"$NBD_LOG"
	"${cmd[@]}" </dev/null >>"$NBD_LOG" 2>&1 &
	NBD_PID=$!
	nbd_pids+=("$NBD_PID")
	nbd_logs+=("$NBD_LOG")
	nbd_wait_ready "$NBD_PID" "$NBD_LOG" "$@"
}

# nbd_stop [PID] [SIGNAL]: stop a server (default: the last one) with SIGTERM and check
# that it exits with status 0 within NBD_WAIT_SECS.
nbd_stop() {
	local pid=${1:-$NBD_PID} sig=${2:-TERM} i rc=0
	kill -"$sig" "$pid" || fail "server $pid is not running"
	for ((i = 0; i < NBD_WAIT_SECS * 20; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid"
		fail "server $pid still running ${NBD_WAIT_SECS}s after SIG$sig"
	fi
	wait "$pid" || rc=$?
	nbd_forget "$pid"
	[ $rc -eq 0 ] || fail "server $pid exited with status $rc after SIG$sig"
}

# nbd_forget PID: the server has been reaped; the cleanup must not touch the PID again.
nbd_forget() {
	local -a keep=()
	local p
	for p in "${nbd_pids[@]}"; do
		[ "$p" = "$1" ] || keep+=("$p")
	done
	nbd_pids=("${keep[@]}")
}

# nbd_alive [PID]: fail unless the server is still running.
nbd_alive() {
	kill -0 "${1:-$NBD_PID}" 2>/dev/null || fail "server ${1:-$NBD_PID} died"
}

# nbd_qemu_io URI CMD...: run qemu-io commands on an NBD URI; fail on any error.
# qemu-io does not always exit non-zero when a command fails, so its output is checked too.
nbd_qemu_io() {
	local uri=$1 out rc=0 c
	local -a args=()
	shift
	for c in "$@"; do
		args+=(-c "$c")
	done
	out=$(timeout 60 qemu-io -f raw "$uri" "${args[@]}" 2>&1) || rc=$?
	echo "$out"
	if [ $rc -ne 0 ] || grep -qiE 'fail|error|mismatch' <<<"$out"; then
		fail "qemu-io $uri $* (exit $rc)"
	fi
}

# nbd_qemu_io_fails URI CMD: the single qemu-io command must fail.
nbd_qemu_io_fails() {
	local out rc=0
	out=$(timeout 60 qemu-io -f raw "$1" -c "$2" 2>&1) || rc=$?
	echo "$out"
	if [ $rc -eq 0 ] && ! grep -qiE 'fail|error|denied|not permitted|read-only' <<<"$out"
	then
		fail "qemu-io '$2' on $1 succeeded but should have failed"
	fi
}

# nbd_file_check FILE CMD...: qemu-io read-only on a local raw FILE (e.g. 'read -P 0xaa 0 1M').
nbd_file_check() {
	local f=$1
	shift
	nbd_qemu_io "$f" "$@" >/dev/null || fail "contents of $f: $*"
}

# nbd_peer_args ARGS...: translate `ioplane serve` ARGS into qemu-storage-daemon's
# (nbd_peer array). Only for checking the tests against a known-good server.
nbd_peer_args() {
	local a opt server= ne=0 id rest kv maxconn=
	nbd_peer=()
	while [ $# -gt 0 ]; do
		opt=$1
		a=${2:-}
		shift
		case "$opt" in
		--iothreads) shift ;;
		--max-connections) maxconn=,max-connections=$a; shift ;;
		--pidfile) nbd_peer+=(--pidfile "$a"); shift ;;
		--image)
			shift
			id=${a%%,*}
			rest=${a#"$id"}
			rest=${rest//,driver=null,/,driver=null-co,}
			rest=${rest/%,driver=null/,driver=null-co}
			rest=${rest//,file=/,filename=}
			rest=${rest//,format=raw/}
			rest=${rest//,cache=none/,cache.direct=on}
			rest=${rest//,cache=writeback/}
			rest=${rest//,aio=threads/,aio=threads}
			[[ "$rest" == *driver=* ]] || rest=",driver=file$rest"
			if [[ "$rest" =~ ,size=([0-9]+[KMGT]) ]]; then
				rest=${rest/size=${BASH_REMATCH[1]}/size=$(numfmt --from=iec \
					"${BASH_REMATCH[1]}")}
			fi
			nbd_peer+=(--blockdev "node-name=$id$rest")
			;;
		--nbd)
			shift
			kv=$a
			local addr=${kv%%,*} name= img= wr=off desc=
			IFS=, read -r -a kv <<<"$kv"
			for a in "${kv[@]}"; do
				case "$a" in
				image=*) img=${a#image=} ;;
				name=*) name=${a#name=} ;;
				writable=on) wr=on ;;
				description=*) desc=,description=${a#description=} ;;
				esac
			done
			case "$addr" in
			unix=*) addr=addr.type=unix,addr.path=${addr#unix=} ;;
			tcp=*) addr=addr.type=inet,addr.host=${addr#tcp=}
				addr=${addr%:*},addr.port=${addr##*:} ;;
			esac
			if [ -z "$server" ]; then
				server=$addr
			elif [ "$server" != "$addr" ]; then
				skip "NBD_TEST_PEER=qsd: one listening address only"
			fi
			ne=$((ne + 1))
			nbd_peer+=(--export "type=nbd,id=e$ne,node-name=$img,name=${name:-$img}")
			nbd_peer[-1]+=",writable=$wr$desc"
			;;
		*) skip "NBD_TEST_PEER=qsd: cannot translate $opt" ;;
		esac
	done
	# qemu-storage-daemon needs its NBD server before the exports.
	nbd_peer=(--nbd-server "$server$maxconn" "${nbd_peer[@]}")
}
