#!/bin/bash
# librbd/librados and libnbd are loaded only when an rbd or nbd node is first opened, and
# GnuTLS when the first TLS credentials are made: an idle daemon maps none of them (nor
# libstdc++, which they pull in); TLS credentials, and nodes of both drivers, still come
# up at runtime over QMP, serve data, and load only their own library.
. "$(dirname "$0")/nbdc-lib.sh"
. "$(dirname "$0")/lib-ceph.sh"

nbd_need_ioplane
ceph_need
nbd_need nbdkit qemu-io
nbdkit memory --version >/dev/null 2>&1 || skip "nbdkit has no memory plugin"

T=$NBD_TMP
mon=$T/mon.sock
sock=$T/nbd.sock
Q=(timeout 120 "$IOPLANE" qmp -t 100 "$mon")

# maps_has PATTERN: whether the daemon maps a file matching PATTERN.
maps_has() {
	grep -Eq "$1" "/proc/$NBD_PID/maps"
}

nbd_serve --monitor unix="$mon" --image z,driver=null,size=1M --nbd unix="$T/z.sock",image=z
for ((i = 0; i < 200; i++)); do [ -S "$mon" ] && break; sleep 0.05; done
libs=(librbd librados libceph-common libnbd libgnutls libxml2)
# The sanitizers' runtime brings libstdc++ along; librbd does otherwise.
is_sanitized || libs+=('libstdc\+\+')
for lib in "${libs[@]}"; do
	! maps_has "/$lib\\.so" || fail "an idle daemon maps $lib"
done

# TLS credentials: GnuTLS comes in (src/util/gnutls-dl.c), and nothing else.
mkdir -p "$T/psk"
echo "alice:0123456789abcdef0123456789abcdef" >"$T/psk/keys.psk"
"${Q[@]}" object-add qom-type=tls-creds-psk id=tls0 dir="$T/psk" endpoint=server >/dev/null ||
	fail "object-add tls-creds-psk"
maps_has '/libgnutls\.so' || fail "libgnutls is not mapped after TLS credentials were made"
! maps_has '/libnbd\.so' || fail "TLS credentials mapped libnbd"

# An nbd node: libnbd comes in, librbd stays out.
nbdc_nbdkit "$T/kit.sock" memory 8M
"${Q[@]}" blockdev-add driver=nbd node-name=n server.type=unix server.path="$T/kit.sock" \
	>/dev/null || fail "blockdev-add nbd"
maps_has '/libnbd\.so' || fail "libnbd is not mapped after an nbd node opened"
! maps_has '/librbd\.so' || fail "an nbd node mapped librbd"

# An rbd node (the daemon started before the cluster: conf= says where it is): librbd
# comes in, and the node serves data QEMU's rbd driver reads back.
ceph_start
timeout 120 rbd create --size 8M rbd/lazy || fail "rbd create"
"${Q[@]}" blockdev-add driver=rbd node-name=r pool=rbd image=lazy conf="$CEPH_CONF" >/dev/null ||
	fail "blockdev-add rbd"
maps_has '/librbd\.so' || fail "librbd is not mapped after an rbd node opened"
"${Q[@]}" nbd-server-start addr.type=unix addr.data.path="$sock" >/dev/null || fail "nbd-server-start"
"${Q[@]}" block-export-add type=nbd id=e node-name=r writable=true >/dev/null ||
	fail "block-export-add"
"${Q[@]}" block-export-add type=nbd id=en node-name=n writable=true >/dev/null ||
	fail "block-export-add nbd"
nbd_qemu_io "$(nbd_uri r "$sock")" 'write -P 0x5a 1M 64k' 'flush' >/dev/null
nbd_qemu_io "$(nbd_uri n "$sock")" 'write -P 0x5b 0 64k' 'read -P 0x5b 0 64k' >/dev/null
timeout 120 qemu-io -f raw -r -U rbd:rbd/lazy -c 'read -P 0x5a 1M 64k' | grep -q "read 65536" ||
	fail "QEMU does not read what ioplane wrote to rbd:rbd/lazy"
nbd_stop
