#!/bin/bash
# Export naming and several exports in one daemon: the name defaults to the image ID,
# name= overrides it (the ID is then not an export name), unknown names are refused, two
# images on one socket are served independently, and one image exported twice (another
# unix socket and TCP) shows the same data under both names.
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need qemu-io nbdinfo python3

a=$NBD_TMP/a.img
b=$NBD_TMP/b.img
sock=$NBD_TMP/nbd.sock
sock2=$NBD_TMP/nbd2.sock
port=$(nbd_free_port)
truncate -s 8M "$a"
truncate -s 12M "$b"

nbd_serve --image a,file="$a" --image b,file="$b" \
	--nbd unix="$sock",image=a,writable=on \
	--nbd unix="$sock",image=b,name=bee,writable=on \
	--nbd unix="$sock2",image=a,name=alias,writable=on \
	--nbd tcp=127.0.0.1:"$port",image=b,writable=on

# The list on each socket holds exactly its exports.
names() {
	nbdinfo --list --json "$1" | python3 -c 'import json, sys
print(" ".join(sorted(e["export-name"] for e in json.load(sys.stdin)["exports"])))'
}
[ "$(names "nbd+unix://?socket=$sock")" = "a bee" ] || fail "exports on $sock"
[ "$(names "nbd+unix://?socket=$sock2")" = "alias" ] || fail "exports on $sock2"
[ "$(names "nbd://127.0.0.1:$port")" = "b" ] || fail "exports on TCP"

# Sizes tell the two images apart.
[ "$(nbdinfo --size "$(nbd_uri a "$sock")")" = 8388608 ] || fail "size of a"
[ "$(nbdinfo --size "$(nbd_uri bee "$sock")")" = 12582912 ] || fail "size of bee"

# Names that are not exports on that socket are refused.
for bad in b nosuch alias; do
	if timeout 30 nbdinfo "$(nbd_uri "$bad" "$sock")" >/dev/null 2>&1; then
		fail "export name '$bad' accepted on $sock"
	fi
done
if timeout 30 nbdinfo "$(nbd_uri a "$sock2")" >/dev/null 2>&1; then
	fail "export 'a' accepted on $sock2"
fi

# Independent data: each export gets its own pattern, interleaved.
nbd_qemu_io "$(nbd_uri a "$sock")" 'write -P 0xaa 0 8M' >/dev/null
nbd_qemu_io "$(nbd_uri bee "$sock")" 'write -P 0xbb 0 12M' >/dev/null
nbd_qemu_io "$(nbd_uri a "$sock")" 'read -P 0xaa 0 8M' >/dev/null
nbd_qemu_io "$(nbd_uri bee "$sock")" 'read -P 0xbb 0 12M' >/dev/null

# The same image under another name and socket, and over TCP, shares the data.
nbd_qemu_io "$(nbd_uri alias "$sock2")" 'read -P 0xaa 0 8M' 'write -P 0xa1 1M 64k' >/dev/null
nbd_qemu_io "$(nbd_uri a "$sock")" 'read -P 0xa1 1M 64k' >/dev/null
nbd_qemu_io "$(nbd_tcp_uri b "$port")" 'read -P 0xbb 0 12M' 'write -P 0xb1 2M 4k' >/dev/null
nbd_qemu_io "$(nbd_uri bee "$sock")" 'read -P 0xb1 2M 4k' 'read -P 0xbb 2052k 4k' >/dev/null

nbd_stop
nbd_file_check "$a" 'read -P 0xaa 0 1M' 'read -P 0xa1 1M 64k' 'read -P 0xaa 1088k 7104k'
nbd_file_check "$b" 'read -P 0xbb 0 2M' 'read -P 0xb1 2M 4k' 'read -P 0xbb 2052k 10236k'
[ "$(stat -c %s "$a")" = 8388608 ] && [ "$(stat -c %s "$b")" = 12582912 ] ||
	fail "image sizes changed"
echo PASS
