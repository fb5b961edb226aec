#!/bin/bash
# fio's nbd engine against ioplane: 4 jobs (one NBD connection each), queue depth 16,
# random writes with crc32c verification on a unix socket; the same data is then verified
# again over TCP loopback by a second daemon on the same file, and a deliberately
# corrupted block must make that verification fail (so the check is real).
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need fio qemu-io
fio --enghelp 2>/dev/null | grep -qw nbd || skip "this fio has no nbd engine"

img=$NBD_TMP/disk.img
sock=$NBD_TMP/nbd.sock
port=$(nbd_free_port)
truncate -s 32M "$img"

# run_fio URI EXTRA...: 4 jobs x 8 MiB regions, 4k random, depth 16, crc32c verify.
run_fio() {
	local uri=$1
	shift
	# fio leaves verify state files in its working directory.
	(cd "$NBD_TMP" && exec timeout 300 fio --name=nbdverify --ioengine=nbd --uri="$uri" --rw=randwrite \
		--bs=4k --size=8M --numjobs=4 --offset_increment=8M --iodepth=16 \
		--verify=crc32c --verify_fatal=1 --do_verify=1 \
		--randrepeat=1 --group_reporting --output-format=json "$@")
}

nbd_serve --image d0,file="$img" --nbd unix="$sock",image=d0,writable=on \
	--nbd tcp=127.0.0.1:"$port",image=d0,writable=on
# verify_backlog: reads interleaved with the writes (it must not be used with verify_only).
out=$(run_fio "$(nbd_uri d0 "$sock")" --verify_backlog=256) || fail "fio over unix: $out"
# No error (every verify passed) and the whole 32 MiB written and read back.
python3 -c 'import json, sys
j = json.loads(sys.argv[1][sys.argv[1].index("{"):])["jobs"][0]
print("error", j["error"], "written KiB", j["write"]["io_kbytes"],
      "read KiB", j["read"]["io_kbytes"])
assert j["error"] == 0
assert j["write"]["io_kbytes"] >= 32768 and j["read"]["io_kbytes"] >= 32768' "$out" ||
	fail "fio over unix: $out"

# Same jobs, verify only, over TCP on the same daemon.
out=$(run_fio "$(nbd_tcp_uri d0 "$port")" --verify_only=1) || fail "fio verify over tcp: $out"
nbd_stop

# Another daemon on the same file; corrupt one written block behind fio's back.
nbd_serve --image d0,file="$img" --nbd tcp=127.0.0.1:"$port",image=d0,writable=on
out=$(run_fio "$(nbd_tcp_uri d0 "$port")" --verify_only=1) ||
	fail "fio verify on a restarted daemon: $out"
nbd_qemu_io "$(nbd_tcp_uri d0 "$port")" 'write -P 0x55 12M 4k' >/dev/null
if run_fio "$(nbd_tcp_uri d0 "$port")" --verify_only=1 >"$NBD_TMP/bad.out" 2>&1; then
	fail "fio verify did not notice a corrupted block"
fi
nbd_stop
echo PASS
