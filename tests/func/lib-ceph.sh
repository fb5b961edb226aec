# A throwaway single-node Ceph cluster for the rbd tests, sourced on top of lib.sh: one
# monitor and one memstore OSD, no manager, 127.0.0.1 only (msgr v2), everything under
# $CEPH_DIR in the test's scratch directory, stopped by the exit hook. Packages:
# ceph-mon ceph-osd ceph-common (scripts/deps.sh test).
#
#   ceph_need                 skip unless the Ceph daemons and python3-rados are there
#   ceph_start                start it; sets CEPH_CONF, CEPH_ARGS (exported), CEPH_POOL
#   ceph_osd_freeze / _thaw   SIGSTOP / SIGCONT the OSD: I/O stalls, then comes back
#   ceph_stop                 stop the daemons (the exit hook does it too)
#
# Clients: rbd create --size 64M rbd/img; qemu-img ... rbd:rbd/img (CEPH_CONF from the
# environment). Every wait is bounded (CEPH_TIMEOUT seconds, default 60).

CEPH_TIMEOUT=${CEPH_TIMEOUT:-60}
CEPH_DIR=
CEPH_POOL=rbd
ceph_pids=()

ceph_need() {
	need ceph-mon ceph-osd rbd monmaptool
	/usr/bin/python3 -c "import rados" 2>/dev/null || skip "python3-rados is not installed"
}

# ceph_run CMD...: run a setup command, bounded, its output in the cluster's log.
ceph_run() {
	echo "+ $*" >>"$CEPH_DIR/log/cmd.log"
	timeout "$CEPH_TIMEOUT" "$@" >>"$CEPH_DIR/log/cmd.log" 2>&1
}

ceph_fail() {
	tail -n 30 "$CEPH_DIR"/log/cmd.log "$CEPH_DIR"/log/*.out >&2 2>/dev/null
	fail "ceph: $*"
}

# A cephx key: le16 type 1 (AES), le32 sec, le32 nsec, le16 length 16, 16 random bytes.
ceph_key() {
	{ printf '\001\000\000\000\000\000\000\000\000\000\020\000'; head -c16 /dev/urandom; } |
		base64 -w0
}

# A base port with the next 9 free (mon on it, the OSD above it).
ceph_ports() {
	python3 - <<'PY'
import random, socket
for _ in range(200):
    b = random.randrange(20000, 32000, 10)
    try:
        for p in range(b, b + 10):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            s.close()
    except OSError:
        continue
    print(b)
    break
PY
}

ceph_write_conf() {
	local d=$CEPH_DIR port=$1
	cat >"$d/ceph.conf" <<EOF
[global]
fsid = $(cat /proc/sys/kernel/random/uuid)
mon host = [v2:127.0.0.1:$port]
ms bind msgr1 = false
ms bind msgr2 = true
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon mgr mkfs grace = 31536000
run dir = $d/run
crash dir = $d/crash
[mon]
public addr = 127.0.0.1
mon data = $d/mon
keyring = $d/mon/keyring
log file = $d/log/\$name.log
admin socket = $d/run/\$name.asok
mon data avail warn = 1
mon data avail crit = 0
paxos propose interval = 0.01
paxos min wait = 0.001
[osd]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind port min = $((port + 1))
ms bind port max = $((port + 9))
osd data = $d/osd
keyring = $d/osd/keyring
log file = $d/log/\$name.log
admin socket = $d/run/\$name.asok
osd objectstore = memstore
memstore device bytes = 2147483648
memstore page set = true
memstore page size = 4096
osd crush initial weight = 1
osd op num shards = 2
osd op num threads per shard = 2
osd fast shutdown = true
osd min pg log entries = 100
osd max pg log entries = 500
[client]
keyring = $d/ceph.client.admin.keyring
EOF
}

ceph_write_keys() {
	local d=$CEPH_DIR kosd
	kosd=$(ceph_key)
	printf '[client.admin]\n\tkey = %s\n\tcaps mon = "allow *"\n\tcaps osd = "allow *"\n' \
		"$(ceph_key)" >"$d/ceph.client.admin.keyring"
	printf '[osd.0]\n\tkey = %s\n' "$kosd" >"$d/osd/keyring"
	{
		cat "$d/ceph.client.admin.keyring"
		printf '[mon.]\n\tkey = %s\n\tcaps mon = "allow *"\n' "$(ceph_key)"
		printf '[osd.0]\n\tkey = %s\n\tcaps mon = "allow profile osd"\n' "$kosd"
		printf '\tcaps mgr = "allow profile osd"\n\tcaps osd = "allow *"\n'
	} >"$d/mkfs.keyring"
	chmod 600 "$d"/*.keyring "$d/osd/keyring"
}

# ceph_spawn mon|osd ID: a daemon in the foreground of a background job.
ceph_spawn() {
	setsid "ceph-$1" -f --conf "$CEPH_DIR/ceph.conf" -i "$2" </dev/null \
		>"$CEPH_DIR/log/$1.out" 2>&1 &
	ceph_pids+=($!)
	echo $! >"$CEPH_DIR/$1.pid"
}

# Monitor commands through python3-rados (Debian's /usr/bin/python3; each ARG a JSON command; @osd-up waits for
# osd.0), bounded by CEPH_TIMEOUT.
ceph_mon_cmds() {
	ceph_run /usr/bin/python3 -I - "$CEPH_DIR/ceph.conf" "$CEPH_TIMEOUT" "$@" <<'PY'
import json, sys, time, rados
conf, tmo, items = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
c = rados.Rados(conffile=conf, rados_id="admin")
c.connect(timeout=tmo)
end = time.time() + tmo
def cmd(s):
    ret, out, err = c.mon_command(s, b"", timeout=tmo)
    print(s, "->", ret, err)
    if ret:
        sys.exit(1)
    return out
for it in items:
    if it == "@osd-up":
        while not any(o["up"] for o in json.loads(cmd(json.dumps({"prefix": "osd dump", "format": "json"})))["osds"]):
            if time.time() > end:
                sys.exit(1)
            time.sleep(0.02)
    else:
        cmd(it)
c.shutdown()
PY
}

ceph_start() {
	local port uuid i
	CEPH_DIR=$FUNC_TMP/ceph
	mkdir -p "$CEPH_DIR"/{mon,osd,log,run,crash}
	at_exit ceph_stop
	port=$(ceph_ports)
	[ -n "$port" ] || fail "ceph: no free ports"
	ceph_write_conf "$port"
	ceph_write_keys
	uuid=$(cat /proc/sys/kernel/random/uuid)
	ceph_run ceph-osd --conf "$CEPH_DIR/ceph.conf" -i 0 --mkfs --osd-uuid "$uuid" \
		--no-mon-config || ceph_fail "ceph-osd --mkfs"
	ceph_run monmaptool --create --clobber --fsid "$(awk '/^fsid/ {print $3}' \
		"$CEPH_DIR/ceph.conf")" --addv a "[v2:127.0.0.1:$port]" "$CEPH_DIR/monmap" ||
		ceph_fail monmaptool
	ceph_run ceph-mon --conf "$CEPH_DIR/ceph.conf" -i a --mkfs --monmap "$CEPH_DIR/monmap" \
		--keyring "$CEPH_DIR/mkfs.keyring" || ceph_fail "ceph-mon --mkfs"
	ceph_spawn mon a
	ceph_mon_cmds "{\"prefix\": \"osd new\", \"uuid\": \"$uuid\", \"id\": 0}" ||
		ceph_fail "osd new"
	ceph_spawn osd 0
	ceph_mon_cmds @osd-up "{\"prefix\": \"osd pool create\", \"pool\": \"rbd\", \
\"pg_num\": 8, \"pgp_num\": 8, \"pool_type\": \"replicated\"}" || ceph_fail "pool create"
	ceph_run rbd --conf "$CEPH_DIR/ceph.conf" pool init rbd || ceph_fail "rbd pool init"
	export CEPH_CONF=$CEPH_DIR/ceph.conf
	export CEPH_ARGS="--conf=$CEPH_DIR/ceph.conf"
	for ((i = 0; i < 10; i++)); do
		timeout 30 rbd create --size 4M rbd/selftest 2>/dev/null && break
		sleep 0.5
	done
	timeout 30 rbd rm --no-progress rbd/selftest >/dev/null 2>&1 || ceph_fail "rbd self-test"
}

ceph_osd_freeze() {
	kill -STOP "$(cat "$CEPH_DIR/osd.pid")"
}

ceph_osd_thaw() {
	kill -CONT "$(cat "$CEPH_DIR/osd.pid")"
}

ceph_stop() {
	local pid i
	for pid in "${ceph_pids[@]}"; do
		kill -CONT "$pid" 2>/dev/null
		kill -TERM "$pid" 2>/dev/null
	done
	for pid in "${ceph_pids[@]}"; do
		for ((i = 0; i < 100; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	ceph_pids=()
	return 0
}
