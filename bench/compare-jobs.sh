#!/bin/bash
# Block jobs, ioplane vs qemu-storage-daemon side by side, in one run:
#   1. blockdev-mirror of a --size image: time to `ready`, and the IOPS of fio (4 KiB
#      randwrite, depth 16, on the source's NBD export) during the mirror.
#      Targets: ready <= 0.7x qsd, fio IOPS >= 1.2x qsd.            [row1_mirror]
#   2. blockdev-backup sync=full to a qcow2 target: throughput.
#      Target: >= 1.3x qsd.                                          [row2_backup]
#   3. block-stream (the whole chain into the top) and block-commit (the middle layer
#      into the base) of a --size chain (base and middle layer full, top 1%), without
#      load and with fio 4 KiB randwrite at depth 16 on the top's NBD export: the time
#      from the command to BLOCK_JOB_COMPLETED, best of --runs, and fio's IOPS during
#      the job and the daemon's CPU seconds. Target: time <= 0.7x qsd.  [row3_stream_commit]
#      Also the time until the data is durable: an fsync of the image the job wrote
#      (top for stream, base for commit) right after BLOCK_JOB_COMPLETED, added to it.
#      ioplane flushes before it completes a job; qemu-storage-daemon 7.2 sends no flush,
#      so its job time may leave part of the copy's write-back to the page cache.
#
#   bench/compare-jobs.sh [--size SIZE] [--runs N] [--rows LIST] [--quick]
#     --size 2G (default), --runs 3, --rows 1,2,3 (which rows), --quick: 128M, 1 run
#
# A benchmark, not a test: exit 0 whether targets are met or not; 1 when a tool fails;
# 2 on bad usage. Needs qemu-img, qemu-io, qemu-storage-daemon, fio (nbd engine),
# python3. Timed figures need a quiet machine; --quick only proves the script.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
size=2G
runs=3
rows=1,2,3

while [ $# -gt 0 ]; do
	case "$1" in
	--size) size=$2; shift 2 ;;
	--runs) runs=$2; shift 2 ;;
	--rows) rows=$2; shift 2 ;;
	--quick) size=128M; runs=1; shift ;;
	-h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
	*) echo "unknown option $1 (try --help)" >&2; exit 2 ;;
	esac
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "compare-jobs: --runs wants a count" >&2; exit 2; }
[[ $rows =~ ^[123](,[123])*$ ]] || { echo "compare-jobs: --rows wants e.g. 1,3" >&2; exit 2; }
for c in qemu-img qemu-io qemu-storage-daemon fio python3; do
	command -v "$c" >/dev/null || { echo "compare-jobs: $c is not installed" >&2; exit 1; }
done
[ -x "$IOPLANE" ] || { echo "compare-jobs: no $IOPLANE (ninja -C build)" >&2; exit 1; }
bytes=$(qemu-img create -q -f qcow2 /dev/null "$size" 2>/dev/null; python3 -c '
import re, sys
m = re.fullmatch(r"(\d+)([KMGT]?)", sys.argv[1].upper())
print(int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2)] if m else 0)
' "$size")
[ "$bytes" -gt 0 ] || { echo "compare-jobs: --size wants e.g. 2G, 512M" >&2; exit 2; }

tmp=$(mktemp -d /var/tmp/ioplane-compare-jobs.XXXXXX)
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT

# One timed job: the daemon (ioplane or qsd) serves the top of the chain in $tmp/run
# over NBD, fio optionally writes to it, the job runs to its end. Prints "SECONDS IOPS
# CPU": the job's time, fio's IOPS during it (0 without load), the daemon's CPU seconds
# (all threads, /proc) meanwhile. ioplane's export is
# on an iothread; qsd's stays in its main loop: qsd 7.2 aborts (blockdev-nbd.c:62,
# nbd_blockdev_client_closed) when an NBD client of an iothread export goes.
cat >"$tmp/jobd.py" <<'PY'
"""What the job scripts share: a daemon (ioplane serve or qemu-storage-daemon) on
qcow2 nodes, one of them exported over NBD, its QMP monitor, its CPU time, and fio
writing to the export."""
import json, os, signal, socket, subprocess, time


class Daemon:
    def __init__(self, kind, d, nodes, export):
        """nodes: (file name in d, node name) of each qcow2 image, export: the node
        exported writable (on an iothread in ioplane, qsd's main loop: see above)."""
        self.kind, self.d = kind, d
        self.qmp, self.nbd = os.path.join(d, 'qmp.sock'), os.path.join(d, 'nbd.sock')
        self.export = export
        argv = ([os.environ['IOPLANE'], 'serve', '-q'] if kind == 'ioplane'
                else ['qemu-storage-daemon'])
        argv += ['--chardev', 'socket,id=m0,path=%s,server=on,wait=off' % self.qmp,
                 '--monitor', 'chardev=m0']
        for name, node in nodes:
            argv += ['--blockdev', 'driver=file,filename=%s/%s,node-name=%s-f' % (d, name, node),
                     '--blockdev', 'driver=qcow2,file=%s-f,node-name=%s' % (node, node)]
        argv += ['--object', 'iothread,id=io0', '--nbd-server', 'addr.type=unix,addr.path=' + self.nbd,
                 '--export', 'type=nbd,id=e,node-name=%s,writable=on' % export +
                 (',iothread=io0' if kind == 'ioplane' else '')]
        log = open(os.path.join(d, kind + '.log'), 'w')
        self.p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        self.fio = None
        for _ in range(1000):
            if os.path.exists(self.qmp):
                break
            time.sleep(0.01)
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(self.qmp)
        self.f = self.s.makefile('rwb')
        self.recv()
        self.cmd('qmp_capabilities')

    def recv(self):
        return json.loads(self.f.readline())

    def cmd(self, name, args=None):
        self.f.write(json.dumps({'execute': name, 'arguments': args or {}}).encode() + b'\n')
        self.f.flush()
        while True:
            m = self.recv()
            if 'event' not in m:
                return m

    def cpu(self):
        """The daemon's utime + stime, every thread, in seconds."""
        with open('/proc/%d/stat' % self.p.pid) as st:
            v = st.read().rsplit(')', 1)[1].split()
        return (int(v[11]) + int(v[12])) / os.sysconf('SC_CLK_TCK')

    def start_fio(self):
        """fio 4 KiB randwrite at depth 16 on the export, connected and writing
        (0.2 s past its first write, as fio itself counts: the daemons' node
        statistics differ - qsd counts nothing per node) when this returns."""
        self.fio = subprocess.Popen(
            ['fio', '--name=load', '--ioengine=nbd',
             '--uri=nbd+unix:///%s?socket=%s' % (self.export, self.nbd), '--rw=randwrite',
             '--bs=4k', '--iodepth=16', '--time_based', '--runtime=3600',
             '--size=%d' % os.path.getsize(self.d + '/size'), '--output-format=json'],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            text=True)
        time.sleep(0.5)  # fio takes SIGUSR1 once its handlers are set
        for _ in range(200):
            if self.fio.poll() is not None or self.fio_mark()[0]:
                break
            time.sleep(0.05)
        if self.fio.poll() is not None:
            raise RuntimeError('fio ended before the job started')
        time.sleep(0.2)

    def fio_status(self, sig):
        """fio's status after sig (SIGUSR1: a dump so far, SIGINT: the last)."""
        self.fio.send_signal(sig)
        buf = []
        for line in self.fio.stdout:
            if buf or line.startswith('{'):
                buf.append(line)
            if buf and line.rstrip('\n') == '}':
                return json.loads(''.join(buf))['jobs'][0]
        raise RuntimeError('fio ended without a status')

    def fio_mark(self):
        """(write I/Os, ms of run time) fio counted so far; (0, 0) without fio."""
        if not self.fio or self.fio.poll() is not None:
            return (0, 0)
        j = self.fio_status(signal.SIGUSR1)
        return (j['write']['total_ios'], j['job_runtime'])

    def fio_iops_since(self, mark):
        """fio's write IOPS from mark (fio_mark) to now, by fio's own clock:
        the job's window only, not fio's start-up before it."""
        now = self.fio_mark()
        return (now[0] - mark[0]) * 1000.0 / (now[1] - mark[1]) if now[1] > mark[1] else 0

    def stop_fio(self):
        """End fio (it must still be running)."""
        if self.fio:
            self.fio_status(signal.SIGINT)
            self.fio.wait(timeout=60)

    def quit(self, timeout=60):
        self.cmd('quit')
        self.p.wait(timeout=timeout)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
PY
cat >"$tmp/job.py" <<'PY'
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jobd import Daemon
kind, job, load, d = sys.argv[1], sys.argv[2], sys.argv[3] == 'fio', sys.argv[4]
dm = Daemon(kind, d, [('top.qcow2', 'top')], 'top')
try:
    mid = [n['node-name'] for n in dm.cmd('query-named-block-nodes')['return']
           if n['file'].endswith('/mid.qcow2') and n['drv'] == 'qcow2'][0]
    if load:
        dm.start_fio()
    mark = dm.fio_mark()
    c0 = dm.cpu()
    t0 = time.monotonic()
    if job == 'stream':
        r = dm.cmd('block-stream', {'job-id': 'j', 'device': 'top'})
    else:
        r = dm.cmd('block-commit', {'job-id': 'j', 'device': 'top', 'top-node': mid})
    if 'error' in r:
        sys.exit('%s %s: %s' % (kind, job, r['error']['desc']))
    while True:
        m = dm.recv()
        if m.get('event') == 'BLOCK_JOB_COMPLETED':
            break
    t = time.monotonic() - t0
    used = dm.cpu() - c0
    iops = dm.fio_iops_since(mark) if load else 0
    dm.stop_fio()
    if 'error' in m['data']:
        sys.exit('%s %s: %s' % (kind, job, m['data']['error']))
    # Until what the job wrote is on disk: fsync of the image it wrote, from here
    # (what the daemon already flushed costs this nothing).
    fd = os.open(os.path.join(d, 'top.qcow2' if job == 'stream' else 'base.qcow2'), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    durable = time.monotonic() - t0
    print('%.3f %.0f %.2f %.3f' % (t, iops, used, durable))
    dm.quit()
finally:
    dm.kill()
PY

# fill IMAGE PATTERN: IMAGE's whole $bytes written with PATTERN, in writes of at most
# 1 GiB (qemu-io refuses a single request of 2 GiB or more).
fill() {
	local off=0 n cmds=()
	while [ "$off" -lt "$bytes" ]; do
		n=$((bytes - off))
		[ "$n" -le 1073741824 ] || n=1073741824
		cmds+=(-c "write -P $2 $off $n")
		off=$((off + n))
	done
	qemu-io "${cmds[@]}" "$1" >/dev/null
}

# The chain, made once: base and mid full (two patterns), top 1%.
make_chain() {
	local c=$tmp/chain
	mkdir -p "$c"
	qemu-img create -q -f qcow2 "$c/base.qcow2" "$bytes"
	fill "$c/base.qcow2" 0x11
	qemu-img create -q -f qcow2 -b "$c/base.qcow2" -F qcow2 "$c/mid.qcow2"
	fill "$c/mid.qcow2" 0x22
	qemu-img create -q -f qcow2 -b "$c/mid.qcow2" -F qcow2 "$c/top.qcow2"
	qemu-io -c "write -P 0x33 0 $((bytes / 100 / 65536 * 65536 + 65536))" "$c/top.qcow2" >/dev/null
}

# A fresh copy of the chain (the backing names are absolute: rebased to the copy).
fresh_chain() {
	local r=$tmp/run
	rm -rf "$r"
	mkdir -p "$r"
	cp --sparse=always "$tmp/chain/"*.qcow2 "$r/"
	qemu-img rebase -q -u -f qcow2 -b "$r/base.qcow2" -F qcow2 "$r/mid.qcow2"
	qemu-img rebase -q -u -f qcow2 -b "$r/mid.qcow2" -F qcow2 "$r/top.qcow2"
	truncate -s "$bytes" "$r/size"
	sync # the copies written back before the job, not while it runs
}

# Best (lowest) time of --runs for KIND JOB LOAD: "SECONDS IOPS CPU".
best_of() {
	local best= line
	for _ in $(seq "$runs"); do
		fresh_chain
		line=$(IOPLANE=$IOPLANE python3 "$tmp/job.py" "$1" "$2" "$3" "$tmp/run") || {
			echo "compare-jobs: $1 $2 (load $3) failed; its log:" >&2
			tail -20 "$tmp/run/$1.log" >&2
			return 1
		}
		if [ -z "$best" ] || awk -v a="${line%% *}" -v b="${best%% *}" 'BEGIN { exit !(a < b) }'
		then best=$line; fi
	done
	echo "$best"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

# ---- rows 1 and 2: mirror and backup of a full --size image ----
# One timed copy job: the daemon serves src.qcow2 in $tmp/crun over NBD (ioplane's
# export on an iothread, qsd's in its main loop as for row 3), fio optionally writes to
# it; blockdev-mirror runs to BLOCK_JOB_READY (then is cancelled), blockdev-backup
# sync=full to BLOCK_JOB_COMPLETED, each into a fresh qcow2 target.
# Prints "SECONDS IOPS" (IOPS 0 without load): the time from the command to the event,
# fio's IOPS over that time (fio_iops_since: its own count, the job's window only).
copy_job_py() {
	cat >"$tmp/copyjob.py" <<'PY'
import os, socket, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jobd import Daemon
kind, job, load, d = sys.argv[1], sys.argv[2], sys.argv[3] == 'fio', sys.argv[4]
dm = Daemon(kind, d, [('src.qcow2', 'src'), ('tgt.qcow2', 'tgt')], 'src')
try:
    if load:
        dm.start_fio()
    mark = dm.fio_mark()
    t0 = time.monotonic()
    if job == 'mirror':
        r = dm.cmd('blockdev-mirror', {'job-id': 'j', 'device': 'src', 'target': 'tgt',
                                       'sync': 'full'})
        want = 'BLOCK_JOB_READY'
    else:
        r = dm.cmd('blockdev-backup', {'job-id': 'j', 'device': 'src', 'target': 'tgt',
                                       'sync': 'full'})
        want = 'BLOCK_JOB_COMPLETED'
    if 'error' in r:
        sys.exit('%s %s: %s' % (kind, job, r['error']['desc']))
    dm.s.settimeout(float(os.environ.get('COPY_TIMEOUT', '600')))
    try:
        while True:
            m = dm.recv()
            if m.get('event') in (want, 'BLOCK_JOB_COMPLETED', 'BLOCK_JOB_CANCELLED'):
                break
    except (socket.timeout, TimeoutError):
        m = {'event': 'timeout'}
    dm.s.settimeout(None)
    t = time.monotonic() - t0
    iops = dm.fio_iops_since(mark) if load else 0
    dm.stop_fio()
    if m['event'] == 'timeout':  # never converged under the load: say so, go on
        print('timeout %.0f' % iops)
    elif m['event'] != want or 'error' in m.get('data', {}):
        sys.exit('%s %s: %r' % (kind, job, m))
    else:
        print('%.3f %.0f' % (t, iops))
    if job == 'mirror':
        dm.cmd('job-cancel', {'id': 'j'})
    dm.quit(timeout=120)
finally:
    dm.kill()
PY
}

# The source, made once: full of data.
make_source() {
	[ -f "$tmp/src/src.qcow2" ] && return 0
	mkdir -p "$tmp/src"
	qemu-img create -q -f qcow2 "$tmp/src/src.qcow2" "$bytes"
	fill "$tmp/src/src.qcow2" 0x5a
}

# Best (lowest) time of --runs for KIND JOB LOAD, each with a fresh source and target.
best_copy() {
	local best= line r=$tmp/crun
	for _ in $(seq "$runs"); do
		rm -rf "$r"
		mkdir -p "$r"
		cp --sparse=always "$tmp/src/src.qcow2" "$r/"
		qemu-img create -q -f qcow2 "$r/tgt.qcow2" "$bytes"
		truncate -s "$bytes" "$r/size"
		sync # the copies written back before the job, not while it runs
		line=$(IOPLANE=$IOPLANE python3 "$tmp/copyjob.py" "$1" "$2" "$3" "$r") || {
			echo "compare-jobs: $1 $2 (load $3) failed; its log:" >&2
			tail -20 "$r/$1.log" >&2
			return 1
		}
		case $line in timeout*) [ -n "$best" ] || best=$line; continue ;; esac
		case $best in timeout*) best= ;; esac
		if [ -z "$best" ] || awk -v a="${line%% *}" -v b="${best%% *}" 'BEGIN { exit !(a < b) }'
		then best=$line; fi
	done
	echo "$best"
}

mibps() { awk -v s="$1" -v b="$bytes" 'BEGIN { if (s > 0) printf "%.0f", b / 1048576 / s; else print "-" }'; }

# ---- row 1: mirror (blockdev-mirror) ----
row1_mirror() {
	local load io qs
	make_source
	copy_job_py
	printf '%-30s %10s %10s %8s %10s %10s %8s\n' "row 1 ($size mirror)" "ioplane s" "qsd s" \
		"ratio" "fio io" "fio qsd" "ratio"
	for load in none fio; do
		io=$(best_copy ioplane mirror $load) || return 1
		qs=$(best_copy qsd mirror $load) || return 1
		printf '%-30s %10s %10s %8s %10s %10s %8s\n' "time to ready, load $load" "${io%% *}" \
			"${qs%% *}" "$(ratio "${io%% *}" "${qs%% *}")" "${io##* }" "${qs##* }" \
			"$(ratio "${io##* }" "${qs##* }")"
	done
	echo "row 1 target: time to ready ratio <= 0.70, fio IOPS ratio >= 1.20 (ioplane / qsd)"
}

# ---- row 2: backup (blockdev-backup sync=full to a qcow2 target) ----
row2_backup() {
	local load io qs
	make_source
	copy_job_py
	printf '%-30s %10s %10s %8s %10s %10s\n' "row 2 ($size backup)" "ioplane MiB/s" \
		"qsd MiB/s" "ratio" "fio io" "fio qsd"
	for load in none fio; do
		io=$(best_copy ioplane backup $load) || return 1
		qs=$(best_copy qsd backup $load) || return 1
		printf '%-30s %10s %10s %8s %10s %10s\n' "sync=full, load $load" \
			"$(mibps "${io%% *}")" "$(mibps "${qs%% *}")" \
			"$(ratio "${qs%% *}" "${io%% *}")" "${io##* }" "${qs##* }"
	done
	echo "row 2 target: throughput ratio >= 1.30 (ioplane / qsd)"
}

# ---- row 3: stream and commit of a chain ----
row3_stream_commit() {
	local job load io qs
	make_chain
	local -a a b
	printf '%-22s %9s %9s %6s %9s %9s %7s %7s | %9s %9s %6s\n' "row 3 ($size chain)" \
		"ioplane s" "qsd s" "ratio" "fio io" "fio qsd" "cpu io" "cpu qsd" "io dur s" \
		"qsd dur s" "ratio"
	for load in none fio; do
		for job in stream commit; do
			io=$(best_of ioplane $job $load) || return 1
			qs=$(best_of qsd $job $load) || return 1
			read -ra a <<<"$io"
			read -ra b <<<"$qs"
			printf '%-22s %9s %9s %6s %9s %9s %7s %7s | %9s %9s %6s\n' "$job, load $load" \
				"${a[0]}" "${b[0]}" "$(ratio "${a[0]}" "${b[0]}")" "${a[1]}" "${b[1]}" \
				"${a[2]}" "${b[2]}" "${a[3]}" "${b[3]}" "$(ratio "${a[3]}" "${b[3]}")"
		done
	done
	echo "row 3 target: time ratio <= 0.70 (ioplane / qsd), with and without load"
	echo "  (dur: until the image the job wrote is on disk, an fsync of it after the"
	echo "  job's BLOCK_JOB_COMPLETED; ioplane flushes before it, qsd 7.2 sends no flush)"
}

echo "compare-jobs: $size, best of $runs; $(nproc) CPUs; $("$IOPLANE" --version 2>/dev/null | head -1)"
for r in ${rows//,/ }; do
	case $r in
	1) row1_mirror ;;
	2) row2_backup ;;
	3) row3_stream_commit ;;
	esac
done
