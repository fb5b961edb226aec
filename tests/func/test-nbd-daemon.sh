#!/bin/bash
# `ioplane serve` as a daemon: --pidfile, unix socket mode 0600, SIGTERM with a client
# connected (exit 0, acknowledged data in the file), SIGTERM under fio load (exit 0),
# SIGINT, and --max-connections (a client over the limit is not served; served after).
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need qemu-io nbdinfo

img=$NBD_TMP/disk.img
sock=$NBD_TMP/nbd.sock
pidfile=$NBD_TMP/serve.pid
truncate -s 64M "$img"
uri=$(nbd_uri d0 "$sock")

# qio_start: an interactive qemu-io on $uri, kept connected (coprocess QIO). Its pid and
# fds are copied: bash unsets QIO and QIO_PID as soon as the coprocess ends.
qio_start() {
	coproc QIO { exec qemu-io -f raw "$uri" 2>&1; }
	qio_pid=$QIO_PID
	qio_in=${QIO[1]}
	qio_out=${QIO[0]}
	nbd_at_exit "kill $qio_pid 2>/dev/null"
}

# qio_cmd CMD WORD: send CMD to the coprocess and wait (bounded) for a line with WORD.
qio_cmd() {
	local line
	echo "$1" >&"$qio_in"
	while IFS= read -r -t 30 line <&"$qio_out"; do
		echo "qemu-io: $line"
		case "$line" in
		*"$2"*) return 0 ;;
		*fail* | *error*) fail "qemu-io '$1': $line" ;;
		esac
	done
	fail "qemu-io '$1': no '$2' within 30s"
}

# 1. pidfile and socket mode.
nbd_serve --pidfile "$pidfile" --image d0,file="$img",cache=writeback \
	--nbd unix="$sock",image=d0,writable=on
[ -f "$pidfile" ] || fail "no pidfile"
[ "$(tr -d ' \n' <"$pidfile")" = "$NBD_PID" ] || fail "pidfile has $(cat "$pidfile"), not $NBD_PID"
mode=$(stat -c %a "$sock")
[ "$mode" = 600 ] || [ -n "$NBD_TEST_PEER" ] || fail "socket mode $mode, expected 600"

# 2. SIGTERM while a client is connected, right after its (acknowledged) writes.
qio_start
qio_cmd 'write -P 0x42 0 1M' wrote
qio_cmd 'write -P 0x43 32M 4k' wrote
nbd_stop
kill "$qio_pid" 2>/dev/null || true
wait "$qio_pid" 2>/dev/null || true
nbd_file_check "$img" 'read -P 0x42 0 1M' 'read -P 0x43 32M 4k' 'read -P 0 1M 31M'

# 3. SIGTERM under load: 4 fio connections writing at depth 32.
if fio --enghelp 2>/dev/null | grep -qw nbd; then
	nbd_serve --image d0,file="$img" --nbd unix="$sock",image=d0,writable=on
	timeout 120 fio --name=load --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k \
		--size=64M --numjobs=4 --iodepth=32 --time_based --runtime=60 \
		>"$NBD_TMP/fio.log" 2>&1 &
	fio_pid=$!
	nbd_at_exit "kill $fio_pid 2>/dev/null"
	sleep 2
	kill -0 $fio_pid || fail "fio ended early: $(tail -5 "$NBD_TMP/fio.log")"
	nbd_stop
	wait $fio_pid || true
else
	echo "fio has no nbd engine: SIGTERM under load not tested"
fi

# 4. SIGINT: also a clean stop, data kept.
nbd_serve --image d0,file="$img" --nbd unix="$sock",image=d0,writable=on
nbd_qemu_io "$uri" 'write -P 0x44 2M 64k' >/dev/null
nbd_stop "$NBD_PID" INT
nbd_file_check "$img" 'read -P 0x44 2M 64k'

# 5. --max-connections 1: a second client is not served while the first is connected.
nbd_serve --max-connections 1 --image d0,file="$img" --nbd unix="$sock",image=d0,writable=on
qio_start
qio_cmd 'read -P 0x44 2M 4k' read
if timeout 10 nbdinfo --size "$uri" >/dev/null 2>&1; then
	fail "second client served despite --max-connections 1"
fi
qio_cmd 'write -P 0x45 4M 4k' wrote
echo quit >&"$qio_in"
wait "$qio_pid" || true
ok=0
for ((i = 0; i < 50; i++)); do
	if [ "$(timeout 10 nbdinfo --size "$uri" 2>/dev/null)" = 67108864 ]; then
		ok=1
		break
	fi
	sleep 0.1
done
[ $ok = 1 ] || fail "no client served after the first one left"
nbd_alive
nbd_stop
nbd_file_check "$img" 'read -P 0x45 4M 4k'
echo PASS
