#!/bin/bash
# `ioplane serve` and the signals a user, a terminal or a service manager may send:
# SIGHUP, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR and SIGPIPE leave the
# daemon serving (the handled ones are logged; SIGUSR1 logs the statistics); SIGTERM then still stops it cleanly: exit
# 0, socket file removed, qcow2 image clean. The pidfile is locked: a second instance on it
# is refused with a clear error and exits non-zero without touching the file or opening
# its images; a stale unlocked pidfile is taken over; at exit only the file the daemon
# wrote is removed, never one put in its place.
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need qemu-img qemu-io nbdinfo

img=$NBD_TMP/disk.qcow2
img2=$NBD_TMP/other.img
sock=$NBD_TMP/nbd.sock
sock2=$NBD_TMP/nbd2.sock
pidfile=$NBD_TMP/serve.pid
qemu-img create -q -f qcow2 "$img" 64M
truncate -s 16M "$img2"
uri=$(nbd_uri d "$sock")

nbd_serve --pidfile "$pidfile" --image d,file="$img",format=qcow2 \
	--nbd unix="$sock",image=d,writable=on
pid=$NBD_PID
[ "$(cat "$pidfile")" = "$pid" ] || fail "pidfile has '$(cat "$pidfile")', not $pid"
nbd_qemu_io "$uri" 'write -P 0x61 0 1M' >/dev/null

# 1. Signals that would kill the daemon by default.
for sig in HUP USR1 USR2 ALRM VTALRM PROF IO PWR PIPE; do
	kill -"$sig" "$pid"
	# A served request after the signal: the daemon is alive and working.
	[ "$(timeout 30 nbdinfo --size "$uri")" = 67108864 ] || fail "not serving after SIG$sig"
	nbd_alive "$pid"
done
for sig in "User defined signal 2" "Alarm clock"; do
	expect_grep "$NBD_LOG" "$sig.*ignored"
done
# Without --log-file SIGHUP has nothing to reopen; SIGUSR1 logs the statistics.
expect_grep "$NBD_LOG" "SIGHUP from process [0-9]*: no --log-file to reopen; ignored"
expect_grep "$NBD_LOG" "stats: node d: read [0-9]* ops .*write [1-9][0-9]* ops 1048576 bytes"

# 2. A second instance on the same pidfile: refused before it opens anything.
ino=$(stat -c %i "$pidfile")
before=$(stat -c %Y.%y "$pidfile")
rc=0
timeout 60 "$IOPLANE" serve --pidfile "$pidfile" --image o,file="$img2" \
	--nbd unix="$sock2",image=o >"$NBD_TMP/second.log" 2>&1 || rc=$?
[ $rc -ne 0 ] || fail "second instance on a locked pidfile exited 0"
[ $rc -ne 124 ] || fail "second instance on a locked pidfile kept running"
expect_grep "$NBD_TMP/second.log" "pidfile.*locked by another running instance \\(process $pid\\)"
[ -e "$sock2" ] && fail "the refused instance created its socket"
[ "$(cat "$pidfile")" = "$pid" ] || fail "pidfile changed to '$(cat "$pidfile")'"
[ "$(stat -c %i "$pidfile")" = "$ino" ] || fail "pidfile replaced"
[ "$(stat -c %Y.%y "$pidfile")" = "$before" ] || fail "pidfile modified"
nbd_alive "$pid"

# 3. SIGTERM after all that: a clean stop.
nbd_stop "$pid"
[ -e "$pidfile" ] && fail "pidfile left behind"
[ -e "$sock" ] && fail "socket file left behind"
qemu-img check -q "$img" || fail "qemu-img check failed after the stop"
if qemu-img info "$img" | grep -q 'corrupt: true'; then fail "image marked corrupt"; fi
out=$(qemu-io -f qcow2 -r "$img" -c 'read -P 0x61 0 1M' 2>&1)
grep -q '^read 1048576' <<<"$out" || fail "data written before the signals: $out"

# 4. A stale pidfile (nobody holds its lock) is taken over.
echo 999999 >"$pidfile"
nbd_serve --pidfile "$pidfile" --image o,file="$img2" --nbd unix="$sock2",image=o
[ "$(cat "$pidfile")" = "$NBD_PID" ] || fail "stale pidfile not rewritten: $(cat "$pidfile")"

# 5. A file put in the pidfile's place is not the daemon's to remove.
mv "$pidfile" "$pidfile.old"
echo 424242 >"$pidfile"
nbd_stop
[ "$(cat "$pidfile" 2>/dev/null)" = 424242 ] || fail "the daemon removed a pidfile it did not write"
echo PASS
