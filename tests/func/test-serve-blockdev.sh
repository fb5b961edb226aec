#!/bin/bash
# qemu-storage-daemon's --blockdev, --nbd-server and --export, given to ioplane serve and to
# qemu-storage-daemon alike: a qcow2 node on a file node by reference, the same in the JSON
# form, and one with an inline child (file.driver=...). A client writes through each
# export; the image holds the data afterwards; query-named-block-nodes lists the same
# node-names in both daemons.
. "$(dirname "$0")/lib.sh"
need qemu-storage-daemon qemu-img qemu-io python3

T=$FUNC_TMP
cd "$T"

# run_one DAEMON TAG ARGS...: start DAEMON with ARGS and a monitor, write a pattern through
# the export "disk", list the node-names, stop it.
run_one() {
	local daemon=$1 tag=$2 pid i
	shift 2
	rm -f "$T/s" "$T/m"
	if [ "$daemon" = qsd ]; then
		qemu-storage-daemon "$@" --chardev socket,id=m0,path="$T/m",server=on,wait=off \
			--monitor chardev=m0 </dev/null >"$tag.log" 2>&1 &
	else
		"$IOPLANE" serve "$@" --monitor unix="$T/m" </dev/null >"$tag.log" 2>&1 &
	fi
	pid=$!
	at_exit "kill $pid 2>/dev/null"
	for i in $(seq 100); do [ -S "$T/s" ] && [ -S "$T/m" ] && break; sleep 0.1; done
	[ -S "$T/s" ] || { cat "$tag.log" >&2; fail "$daemon $tag: no NBD socket"; }
	timeout 20 qemu-io -f raw -c "write -P 0x5a 1M 64k" "nbd+unix:///disk?socket=$T/s" \
		>/dev/null || fail "$daemon $tag: write through the export failed"
	timeout 10 "$IOPLANE" qmp -S "$T/m" query-named-block-nodes >"$tag.nodes" ||
		fail "$daemon $tag: query-named-block-nodes"
	python3 -c 'import json,sys; print(" ".join(sorted(n["node-name"] for n in json.load(sys.stdin)
		if not n["node-name"].startswith("#"))))' <"$tag.nodes" >"$tag.names"
	kill "$pid"
	wait "$pid" 2>/dev/null || true
}

NBD=(--nbd-server addr.type=unix,addr.path="$T/s")
EXP=(--export type=nbd,id=e0,node-name=disk,name=disk,writable=on)
for daemon in qsd ioplane; do
	for form in ref json inline; do
		img=$daemon-$form.qcow2
		qemu-img create -q -f qcow2 "$img" 16M
		case $form in
		ref) BD=(--blockdev "driver=file,node-name=f0,filename=$img"
			--blockdev driver=qcow2,node-name=disk,file=f0) ;;
		json) BD=(--blockdev "{\"driver\":\"file\",\"node-name\":\"f0\",\"filename\":\"$img\"}"
			--blockdev '{"driver":"qcow2","node-name":"disk","file":"f0"}') ;;
		inline) BD=(--blockdev "driver=qcow2,node-name=disk,file.driver=file,file.filename=$img") ;;
		esac
		run_one "$daemon" "$daemon-$form" "${BD[@]}" "${NBD[@]}" "${EXP[@]}"
		qemu-io -f qcow2 -r -c "read -P 0x5a 1M 64k" "$img" >/dev/null ||
			fail "$daemon $form: the image does not hold what was written"
		qemu-img check -q "$img" || fail "$daemon $form: qemu-img check"
	done
done
for form in ref json inline; do
	diff -u "qsd-$form.names" "ioplane-$form.names" || fail "$form: node-names differ from qsd's"
done
echo "ok: --blockdev as qemu-storage-daemon takes it, three forms"
