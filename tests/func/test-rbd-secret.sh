#!/bin/bash
# rbd's key-secret with QEMU's secret objects, against the test cluster (cephx on): with a
# configuration that names no keyring, an rbd node opens only with the client's key
# from a secret object (object-add data=, --object file=, format=base64), serves data
# QEMU reads back, and fails with a clear error without it, with a wrong key or with an
# unknown secret id. The daemon's environment has no CEPH_ARGS/CEPH_CONF to fall back on.
. "$(dirname "$0")/nbd-lib.sh"
. "$(dirname "$0")/lib-ceph.sh"

nbd_need_ioplane
ceph_need
nbd_need qemu-io
ceph_start

T=$NBD_TMP
mon=$T/mon.sock
sock=$T/nbd.sock
Q=(timeout 120 "$IOPLANE" qmp -t 100 "$mon")
grep -v '^keyring = .*client.admin.keyring' "$CEPH_CONF" >"$T/nokey.conf"
key=$(awk '$1 == "key" { print $3; exit }' "$CEPH_DIR/ceph.client.admin.keyring")
[ -n "$key" ] || fail "no admin key in the test cluster's keyring"
printf '%s' "$key" >"$T/key.b64"
timeout 120 rbd create --size 8M rbd/sec || fail "rbd create"
rbd_opts="pool=rbd image=sec conf=$T/nokey.conf user=admin"

# --object secret,file=... on the command line, used by --blockdev.
nbd_forget_env=(env -u CEPH_ARGS -u CEPH_CONF)
"${nbd_forget_env[@]}" "$IOPLANE" serve -q --monitor unix="$mon" \
	--object "secret,id=kf,file=$T/key.b64,format=base64" \
	--blockdev "driver=rbd,node-name=r0,pool=rbd,image=sec,conf=$T/nokey.conf,user=admin,key-secret=kf" \
	--nbd-server "addr.type=unix,addr.path=$sock" --export type=nbd,id=e0,node-name=r0,writable=on \
	</dev/null >"$T/serve.log" 2>&1 &
NBD_PID=$!
nbd_pids+=("$NBD_PID")
nbd_logs+=("$T/serve.log")
for ((i = 0; i < 600; i++)); do [ -S "$mon" ] && nbd_unix_listening "$sock" && break; sleep 0.1; done
nbd_unix_listening "$sock" || fail "--object secret + --blockdev rbd with key-secret did not start"
nbd_qemu_io "$(nbd_uri r0 "$sock")" 'write -P 0x77 2M 64k' 'flush' >/dev/null
timeout 120 qemu-io -f raw -r -U rbd:rbd/sec -c 'read -P 0x77 2M 64k' | grep -q "read 65536" ||
	fail "QEMU does not read what was written through a key-secret node"

# read_r1: the read-only export of node r1 has what was written.
read_r1() {
	timeout 60 qemu-io -r -f raw "$(nbd_uri r1 "$sock")" -c 'read -P 0x77 2M 64k' |
		grep -q "read 65536" || fail "export r1 does not read back the data"
}

# Without a key the cluster refuses the client.
run_status 1 "${Q[@]}" blockdev-add driver=rbd node-name=r1 $rbd_opts
expect_grep "$ERR" "rbd: rbd/sec: cannot connect to the cluster"
# An unknown secret id.
run_status 1 "${Q[@]}" blockdev-add driver=rbd node-name=r1 $rbd_opts key-secret=nope
expect_grep "$ERR" "No secret with id 'nope'"
# A wrong key (base64 of other bytes).
"${Q[@]}" object-add qom-type=secret id=bad data=QUJDREVGR0hJSktMTU5PUFFSU1RVVg== \
	format=base64 >/dev/null || fail "object-add secret"
run_status 1 "${Q[@]}" blockdev-add driver=rbd node-name=r1 $rbd_opts key-secret=bad
expect_grep "$ERR" "cannot connect to the cluster"
# The right key by data=, raw format: the key text's bytes are not the key.
"${Q[@]}" object-add qom-type=secret id=raw data="$key" >/dev/null || fail "object-add raw"
run_status 1 "${Q[@]}" blockdev-add driver=rbd node-name=r1 $rbd_opts key-secret=raw
# The right key by data=, base64: opens and reads.
"${Q[@]}" object-add qom-type=secret id=k data="$key" format=base64 >/dev/null ||
	fail "object-add secret k"
run_status 1 "${Q[@]}" object-add qom-type=secret id=k data=x
expect_grep "$ERR" "attempt to add duplicate property 'k'"
run_status 1 "${Q[@]}" object-add qom-type=secret id=k2 data=x file="$T/key.b64"
expect_grep "$ERR" "'data' and 'file' are mutually exclusive"
run_status 1 "${Q[@]}" object-add qom-type=secret id=k3 data=@@@@ format=base64
expect_grep "$ERR" "not valid base64"
"${Q[@]}" blockdev-add driver=rbd node-name=r1 $rbd_opts key-secret=k read-only=true \
	>/dev/null || fail "blockdev-add with the right key-secret"
"${Q[@]}" block-export-add type=nbd id=e1 node-name=r1 >/dev/null || fail "export r1"
read_r1
# Secrets are objects: object-del removes them; the open node keeps working.
"${Q[@]}" object-del id=k >/dev/null || fail "object-del secret"
run_status 1 "${Q[@]}" object-del id=k
read_r1
# No secret value in the daemon's log.
! grep -qF "$key" "$T/serve.log" || fail "the key appears in the log"
nbd_stop
