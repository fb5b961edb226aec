#!/bin/bash
# `ioplane qmp` against ioplane serve's monitor and against qemu-storage-daemon's: the
# result on stdout and exit 0; a command's error (class: description) on stderr and
# exit 1; exit 1 when nothing listens; 2 on usage. KEY=VALUE arguments get the types of
# the server's schema (qsd's block_resize size, query-named-block-nodes flat, dotted keys
# for blockdev-add) or are refused with the server's own keyval message; a JSON object
# goes as it is; -e prints SHUTDOWN after quit.
. "$(dirname "$0")/lib.sh"
need qemu-storage-daemon truncate

io=$FUNC_TMP/io.qmp
qsd=$FUNC_TMP/qsd.qmp
pids=()
logs=()
at_exit 'stop_servers $? pids logs'

"$IOPLANE" serve -q --monitor "unix=$io" >"$FUNC_TMP/io.log" 2>&1 &
pids+=($!)
logs+=("$FUNC_TMP/io.log")
truncate -s 1M "$FUNC_TMP/a.raw"
qemu-storage-daemon --chardev "socket,id=m0,path=$qsd,server=on,wait=off" \
	--monitor chardev=m0 --blockdev "driver=file,node-name=n0,filename=$FUNC_TMP/a.raw" \
	>"$FUNC_TMP/qsd.log" 2>&1 &
pids+=($!)
logs+=("$FUNC_TMP/qsd.log")
for s in "$io" "$qsd"; do
	for ((i = 0; i < 500; i++)); do
		[ -S "$s" ] && break
		sleep 0.02
	done
	[ -S "$s" ] || fail "no monitor socket at $s"
done

Q=("$IOPLANE" qmp -t 20)

for s in "$io" "$qsd"; do
	run_ok "${Q[@]}" -c -S "$s" query-version
	expect_grep "$OUT" '^\{"package":"[^"]+","qemu":\{"major":7,"micro":[0-9]+,"minor":2\}\}$'
	run_ok "${Q[@]}" "$s" query-commands
	expect_grep "$OUT" '"name": "query-qmp-schema"'
	run_status 1 "${Q[@]}" "$s" no-such-command
	expect_line "$ERR" "ioplane qmp: CommandNotFound: The command no-such-command has not been found"
	run_status 1 "${Q[@]}" "$s" query-version '{"a": 1}'
	expect_line "$ERR" "ioplane qmp: GenericError: Parameter 'a' is unexpected"
	# Checked against the server's schema before it is sent.
	run_status 1 "${Q[@]}" "$s" query-version a=1
	expect_line "$ERR" "ioplane qmp: query-version: Parameter 'a' is unexpected"
	run_status 1 "${Q[@]}" "$s" qmp_capabilities enable.0=foo
	expect_line "$ERR" "ioplane qmp: qmp_capabilities: Parameter 'null' does not accept value 'foo'"
	run_status 1 "${Q[@]}" "$s" qmp_capabilities
	expect_line "$ERR" "ioplane qmp: CommandNotFound: Capabilities negotiation is already complete, command ignored"
done

# Typed from qsd's schema: an int, a bool, nested objects from dotted keys.
run_ok "${Q[@]}" "$qsd" block_resize node-name=n0 size=0x200000
run_ok "${Q[@]}" -c "$qsd" query-named-block-nodes flat=on
expect_grep "$OUT" '"virtual-size":2097152'
run_status 1 "${Q[@]}" "$qsd" query-named-block-nodes flat=maybe
expect_line "$ERR" "ioplane qmp: query-named-block-nodes: Parameter 'flat' expects 'on' or 'off'"
run_ok "${Q[@]}" "$qsd" blockdev-add driver=raw node-name=r0 file.driver=null-co file.size=4096 \
	file.node-name=f0 read-only=on
run_ok "${Q[@]}" -c "$qsd" query-named-block-nodes
expect_grep "$OUT" '"node-name":"r0"'
run_ok "${Q[@]}" "$qsd" blockdev-add '{"driver": "null-co", "node-name": "j0"}'

# Usage and reachability.
run_status 2 "${Q[@]}"
run_status 2 "${Q[@]}" "$io"
run_status 2 "${Q[@]}" -t 0 "$io" query-version
run_status 2 "${Q[@]}" "$io" query-version not-a-pair
run_status 1 "${Q[@]}" "$FUNC_TMP/nothing.qmp" query-version
expect_grep "$ERR" "cannot connect to $FUNC_TMP/nothing.qmp"
run_ok "$IOPLANE" qmp --help
expect_grep "$OUT" '^Usage: ioplane qmp'

# quit with -e: the reply, then ioplane's SHUTDOWN event; the daemon exits 0.
run_ok "${Q[@]}" -e -c "$io" quit
expect_line "$OUT" '{}'
expect_grep "$OUT" '^\{"timestamp":\{"seconds":[0-9]+,"microseconds":[0-9]+\},"event":"SHUTDOWN","data":\{"guest":false,"reason":"host-qmp-quit"\}\}$'
rc=0
timeout 20 tail --pid="${pids[0]}" -f /dev/null || fail "ioplane still running after quit"
wait "${pids[0]}" || rc=$?
[ "$rc" -eq 0 ] || fail "ioplane serve exited $rc after quit"
run_ok "${Q[@]}" "$qsd" quit
echo "ok: ioplane qmp against ioplane and qemu-storage-daemon"
