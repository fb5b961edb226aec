#!/bin/bash
# `ioplane bench --vhost-user` against qemu-storage-daemon's vhost-user-blk export: the
# client must work with the reference back-end too (write, read back and check, 1 and 2
# queues; a null export with 4 queues).
. "$(dirname "${BASH_SOURCE[0]}")/vhost-lib.sh"
need qemu-storage-daemon python3

img=$FUNC_TMP/disk.img
sock=$FUNC_TMP/qsd.sock
nsock=$FUNC_TMP/qsd-null.sock
truncate -s 16M "$img"
vhost_qsd "$sock" --blockdev driver=file,node-name=f0,filename="$img" \
	--blockdev driver=raw,node-name=d0,file=f0 \
	--export type=vhost-user-blk,id=e0,node-name=d0,addr.type=unix,addr.path="$sock",writable=on,num-queues=2 \
	--blockdev driver=null-co,node-name=n0,size=67108864 \
	--export type=vhost-user-blk,id=e1,node-name=n0,addr.type=unix,addr.path="$nsock",num-queues=4
pid=$VHOST_PID
vhost_wait_socket "$pid" "$nsock"
blocks=$((16 * 1024 * 1024 / 4096 - 1))
vhost_bench --vhost-user "$sock" --num-queues 2 -d 16 -c $blocks -w --verify --pattern 11 -q
vhost_bench --vhost-user "$sock" --num-queues 1 -d 4 -c $blocks --verify --pattern 11 -q
vhost_check_file "$img" 11 $blocks 4096
vhost_bench --vhost-user "$nsock" --num-queues 4 -d 32 -c 20000 --random -q
vhost_bench --vhost-user "$nsock" --num-queues 4 -d 32 -c 20000 --random --poll-max-ns 200000 -q
echo "PASS"
