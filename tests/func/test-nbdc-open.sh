#!/bin/bash
# Connecting at open is bounded: a server that accepts and never answers fails the open
# with "connection timed out" after open-timeout (QEMU's option) and the daemon goes on
# answering its monitor; nothing listening fails at once without open-timeout; with
# open-timeout a server that comes up meanwhile is connected to (QEMU's retry).
. "$(dirname "$0")/nbdc-lib.sh"

nbd_need_ioplane
nbd_need nbdkit python3
nbdkit memory --version >/dev/null 2>&1 || skip "nbdkit has no memory plugin"

T=$NBD_TMP
mon=$T/mon.sock
mute=$T/mute.sock
Q=(timeout 60 "$IOPLANE" qmp -t 50 "$mon")

# A server that accepts and never says a word (bounded: 120 s at most).
python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); s.listen(4)
c = s.accept()[0]
time.sleep(120)' "$mute" </dev/null >/dev/null 2>&1 &
nbd_pids+=($!)
nbdc_wait_unix $! "$mute"

nbd_serve --monitor unix="$mon" --image z,driver=null,size=1M --nbd unix="$T/z.sock",image=z
for ((i = 0; i < 200; i++)); do [ -S "$mon" ] && break; sleep 0.05; done

run_status 1 "${Q[@]}" blockdev-add driver=nbd node-name=m server.type=unix \
	server.path="$mute" open-timeout=2
expect_grep "$ERR" "nbd: unix:$mute: connection timed out"
run_ok "${Q[@]}" query-version
nbd_alive

run_status 1 "${Q[@]}" blockdev-add driver=nbd node-name=n server.type=unix \
	server.path="$T/none.sock"
expect_grep "$ERR" "nbd: cannot connect to unix:$T/none.sock"
run_status 1 "${Q[@]}" blockdev-add driver=nbd node-name=n server.type=unix \
	server.path="$T/none.sock" open-timeout=100000
expect_grep "$ERR" "open-timeout must be 0 to 86400 seconds"

# The server comes up a second after the open started: open-timeout=30 waits for it.
(sleep 1 && exec nbdkit -f -U "$T/late.sock" memory 4M) </dev/null >"$T/late.log" 2>&1 &
nbd_pids+=($!)
run_ok "${Q[@]}" blockdev-add driver=nbd node-name=l server.type=unix \
	server.path="$T/late.sock" open-timeout=30
run_ok "${Q[@]}" query-named-block-nodes
expect_grep "$OUT" '"node-name": "l"'
nbd_stop
