#!/bin/bash
# The listening unix sockets of `ioplane serve`, for NBD and vhost-user-blk exports alike:
# a second daemon on the path of a live socket is refused (exit 1, one message) and the
# first keeps serving; a stale socket file is replaced; a regular file, a directory or a
# symbolic link at the path is refused and left alone; a missing directory gets the same
# message and exit status for both kinds; mode= is honoured (default 0600); a daemon
# removes at exit only the socket file it created, not one that replaced it.
. "$(dirname "${BASH_SOURCE[0]}")/vhost-lib.sh"
need nbdinfo python3

IMG=d,driver=null,size=64M,read-zeroes=on

# export_arg KIND SOCK [OPTS]: the export option for KIND (nbd or vhost) on SOCK.
export_arg() {
	case $1 in
	nbd) echo "--nbd unix=$2,image=d${3:+,$3}" ;;
	vhost) echo "--vhost-user-blk unix=$2,image=d,num-queues=1${3:+,$3}" ;;
	esac
}

# listening SOCK: a socket listens at SOCK (no connection made).
listening() {
	awk -v p="$1" '$NF == p && $4 == "00010000" { found = 1 } END { exit !found }' \
		/proc/net/unix
}

# start KIND SOCK [OPTS]: a daemon with one export of KIND on SOCK, left as it finds SOCK
# (vhost_serve would remove it first); waits until something listens there. Sets PID.
start() {
	local log=$FUNC_TMP/serve.$((${#vhost_logs[@]} + 1)).log i
	# shellcheck disable=SC2046
	"$IOPLANE" serve --image "$IMG" $(export_arg "$@") >"$log" 2>&1 &
	PID=$!
	vhost_pids+=("$PID")
	vhost_logs+=("$log")
	for ((i = 0; i < 300; i++)); do
		listening "$2" && [ -S "$2" ] && return 0
		kill -0 "$PID" 2>/dev/null || fail "serve $*: exited: $(cat "$log")"
		sleep 0.1
	done
	fail "serve $*: not listening on $2 after 30 s"
}

# serves KIND SOCK: a client of KIND gets an answer on SOCK.
serves() {
	case $1 in
	nbd) [ "$(timeout 30 nbdinfo --size "nbd+unix:///d?socket=$2")" = 67108864 ] ;;
	vhost) vhost_bench --vhost-user "$2" --num-queues 1 -c 200 -q ;;
	esac || fail "the $1 export on $2 does not answer"
}

# refused KIND SOCK WORD: `serve` on SOCK fails with exit 1 and one line on stderr that
# names SOCK and matches WORD (an ERE); prints that line.
refused() {
	local rc=0
	# shellcheck disable=SC2046
	timeout 30 "$IOPLANE" serve --image "$IMG" $(export_arg "$1" "$2") \
		>"$FUNC_TMP/out" 2>"$FUNC_TMP/err" </dev/null || rc=$?
	[ $rc -eq 1 ] || fail "serve $1 on $2: exit $rc, expected 1: $(cat "$FUNC_TMP/err")"
	[ "$(grep -c . "$FUNC_TMP/err")" -eq 1 ] ||
		fail "serve $1 on $2: not one line on stderr: $(cat "$FUNC_TMP/err")"
	grep -qF "cannot listen on $2" "$FUNC_TMP/err" || fail "message: $(cat "$FUNC_TMP/err")"
	grep -qE "$3" "$FUNC_TMP/err" || fail "message does not say /$3/: $(cat "$FUNC_TMP/err")"
	cat "$FUNC_TMP/err"
}

# stop PID: SIGTERM, exit 0 (vhost_stop).
stop() {
	vhost_stop "$1"
}

# stale SOCK: a socket file nobody listens on (its server died without removing it).
stale() {
	python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.close()' "$1"
}

for kind in nbd vhost; do
	sock=$FUNC_TMP/$kind.sock

	# A live socket is not taken over; the first daemon keeps its socket and serves.
	start $kind "$sock"
	first=$PID
	refused $kind "$sock" "already listening"
	[ -S "$sock" ] && listening "$sock" || fail "$kind: the refused daemon removed the socket"
	serves $kind "$sock"
	mode=$(stat -c %a "$sock")
	[ "$mode" = 600 ] || fail "$kind: socket mode $mode, expected 600"

	# The first daemon removes at exit only the socket it created: a second one that
	# took the path after the first's file was removed keeps its socket.
	rm "$sock"
	start $kind "$sock"
	second=$PID
	stop "$first"
	[ -S "$sock" ] || fail "$kind: a daemon removed at exit the socket of another"
	serves $kind "$sock"
	stop "$second"
	[ ! -e "$sock" ] || fail "$kind: the socket file is left after exit"

	# A stale socket file is replaced.
	stale "$sock"
	start $kind "$sock"
	serves $kind "$sock"
	stop "$PID"

	# Not a socket: refused, and the file is left alone.
	echo precious >"$sock"
	refused $kind "$sock" "not a socket"
	[ "$(cat "$sock")" = precious ] || fail "$kind: the regular file at the path was changed"
	rm "$sock"
	mkdir "$sock"
	refused $kind "$sock" "not a socket"
	rmdir "$sock"
	ln -s "$FUNC_TMP/nowhere" "$sock"
	refused $kind "$sock" "not a socket"
	[ -L "$sock" ] || fail "$kind: the symbolic link at the path was removed"
	rm "$sock"

	# mode=
	start $kind "$sock" mode=0640
	mode=$(stat -c %a "$sock")
	[ "$mode" = 640 ] || fail "$kind: mode=0640 gave $mode"
	serves $kind "$sock"
	stop "$PID"
	echo "$kind: ok"
done

# A missing directory: the same message and exit status for both kinds.
refused nbd "$FUNC_TMP/nodir/s.sock" "No such file or directory" >"$FUNC_TMP/nbd.msg"
refused vhost "$FUNC_TMP/nodir/s.sock" "No such file or directory" >"$FUNC_TMP/vhost.msg"
cmp "$FUNC_TMP/nbd.msg" "$FUNC_TMP/vhost.msg" ||
	fail "different messages: $(cat "$FUNC_TMP/nbd.msg") / $(cat "$FUNC_TMP/vhost.msg")"
echo "missing directory: ok"
echo PASS
