#!/bin/bash
# --daemonize and --pidfile as qemu-storage-daemon has them: the command returns 0 once
# the daemon listens (the socket answers at once, the pidfile names the daemon, which
# has left the caller's session), returns 1 with the error on its stderr when start-up
# fails; a FIFO or a device at the pidfile path is refused quickly and left in place
# (it used to be truncated and then removed). A second daemonized instance on the same
# pidfile is refused; with --log-file the daemon logs there.
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need nbdinfo

img=$NBD_TMP/disk.img
sock=$NBD_TMP/nbd.sock
pid=$NBD_TMP/serve.pid
truncate -s 8M "$img"

# 1. Ready when the parent returns.
run_ok "$IOPLANE" serve --daemonize --pidfile "$pid" --image d0,file="$img" \
	--nbd unix="$sock",image=d0
dpid=$(tr -d ' \n' <"$pid")
[ -n "$dpid" ] && kill -0 "$dpid" 2>/dev/null || fail "no daemon with the pid in $pid ($dpid)"
nbd_at_exit "kill $dpid 2>/dev/null"
size=$(timeout 30 nbdinfo --size "nbd+unix:///d0?socket=$sock") || fail "the export does not answer"
[ "$size" = 8388608 ] || fail "size $size"
[ "$(ps -o sid= -p "$dpid" | tr -d ' ')" = "$dpid" ] || fail "the daemon leads no session of its own"
# A second daemonized instance on the same pidfile: the caller gets 1 and the error, the
# first daemon goes on serving.
run_status 1 "$IOPLANE" serve --daemonize --pidfile "$pid" --image d1,file="$img" \
	--nbd unix="$NBD_TMP/second.sock",image=d1
expect_grep "$ERR" "locked by another running instance \\(process $dpid\\)"
[ -e "$NBD_TMP/second.sock" ] && fail "the refused instance created its socket"
[ "$(tr -d ' \n' <"$pid")" = "$dpid" ] || fail "the pidfile changed"
timeout 30 nbdinfo --size "nbd+unix:///d0?socket=$sock" >/dev/null || fail "the first daemon stopped serving"
kill -TERM "$dpid"
for _ in $(seq 100); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$dpid" 2>/dev/null && fail "the daemon is still running after SIGTERM"
[ -e "$pid" ] && fail "the pidfile is left after exit"

# 1b. With --log-file the daemon's log goes there, not to /dev/null.
run_ok "$IOPLANE" serve --daemonize --pidfile "$pid" --log-file "$NBD_TMP/d.log" \
	--image d0,file="$img" --nbd unix="$sock",image=d0
dpid=$(tr -d ' \n' <"$pid")
nbd_at_exit "kill $dpid 2>/dev/null"
kill -USR1 "$dpid"
for _ in $(seq 100); do grep -q "stats: node d0" "$NBD_TMP/d.log" && break; sleep 0.1; done
expect_grep "$NBD_TMP/d.log" "serving 1 export"
expect_grep "$NBD_TMP/d.log" "stats: node d0"
kill -TERM "$dpid"
for _ in $(seq 100); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$dpid" 2>/dev/null && fail "the daemon is still running after SIGTERM"

# 2. Start-up fails: the caller sees the error and exit status 1.
run_status 1 "$IOPLANE" serve --daemonize --image d0,file="$NBD_TMP/none.img" \
	--nbd unix="$sock",image=d0
expect_grep "$ERR" "none.img"
[ -e "$sock" ] && fail "a socket was left by the failed daemon"
# With --log-file too: start-up errors reach the caller, not only the file.
run_status 1 "$IOPLANE" serve --daemonize --log-file "$NBD_TMP/fail.log" \
	--image d0,file="$NBD_TMP/none.img" --nbd unix="$sock",image=d0
expect_grep "$ERR" "none.img"

# 3. A FIFO and a device at the pidfile path: refused, left alone, no hang.
mkfifo "$NBD_TMP/fifo"
run_status 1 "$IOPLANE" serve --pidfile "$NBD_TMP/fifo" --image d0,file="$img" \
	--nbd unix="$sock",image=d0
expect_grep "$ERR" "not a regular file"
[ -p "$NBD_TMP/fifo" ] || fail "the FIFO at the pidfile path was removed"
if mknod "$NBD_TMP/null" c 1 3 2>/dev/null; then
	run_status 1 "$IOPLANE" serve --pidfile "$NBD_TMP/null" --image d0,file="$img" \
		--nbd unix="$sock",image=d0
	expect_grep "$ERR" "not a regular file"
	[ -c "$NBD_TMP/null" ] || fail "the device at the pidfile path was removed"
fi
echo PASS
