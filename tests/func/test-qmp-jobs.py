#!/usr/bin/env python3
"""Block jobs (block-stream, block-commit of an intermediate top) and the job commands,
the same script against ioplane and qemu-storage-daemon:

1. API: a scripted session - argument errors, a manual-finalize stream paused, resumed,
   sped up and finalized, a commit, a cancelled stream - gives the same replies (errors
   word for word, returns by shape) and the same per-job event sequences in both.
2. Data: stream and commit each run (rate-limited, so that they overlap) while qemu-io
   writes FUA patterns through the NBD export of the top; afterwards the top names the
   new backing file, qemu-img check passes and the chain equals the expected image
   (the old chain plus the writes) byte for byte (qemu-img compare).
3. Cancel at random points leaves every image valid and the chain's content intact.
4. ioplane only: kill -9 in the middle of a stream and of a commit leaves images that
   qemu-img check accepts (leaks allowed, no corruption), with every acknowledged write
   readable through the chain the top's header names.
5. ioplane only: a stream of an exported node runs on the export's iothread even before
   any client has connected (its loop counts the job's rounds), as qsd runs a job in the
   node's AioContext.

Exit 0 pass, 77 skip, 1 fail."""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, Closed, Daemon, fail, skip  # noqa: E402

MiB = 1 << 20
SIZE = 32 * MiB
PROGRESS = {'offset', 'len', 'current-progress', 'total-progress'}


def run(argv, ok=(0,), **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop('timeout', 120),
                       stdin=subprocess.DEVNULL, **kw)
    if r.returncode not in ok:
        fail('%s: rc %d %s%s' % (' '.join(argv), r.returncode, r.stdout[-2000:],
                                 r.stderr[-2000:]))
    return r


def qemu_io(path, cmds, fmt='qcow2'):
    argv = ['qemu-io', '-f', fmt]
    for c in cmds:
        argv += ['-c', c]
    out = run(argv + [path]).stdout
    if 'fail' in out.lower() or 'error' in out.lower():
        fail('qemu-io %s %r: %s' % (path, cmds, out[-2000:]))
    return out


def make_chain(tmp, tag):
    """base <- mid <- top, 32 MiB, each layer with its own pattern."""
    p = {n: os.path.join(tmp, '%s-%s.qcow2' % (tag, n)) for n in ('base', 'mid', 'top')}
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', p['base'], str(SIZE)])
    qemu_io(p['base'], ['write -P 0x11 0 20M', 'write -P 0x12 24M 4M'])
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b', p['base'], '-F', 'qcow2', p['mid'],
         str(SIZE)])
    qemu_io(p['mid'], ['write -P 0x21 2M 6M', 'write -z 9M 1M', 'write -P 0x22 16M 10M'])
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b', p['mid'], '-F', 'qcow2', p['top'],
         str(SIZE)])
    qemu_io(p['top'], ['write -P 0x31 5M 1M', 'write -P 0x32 30M 64k'])
    return p


def named_chain_args(p, tag):
    """--blockdev options naming every node: base and mid read-only, as a management
    layer opens a chain."""
    a = []
    for n in ('base', 'mid', 'top'):
        a += ['--blockdev', 'driver=file,filename=%s,node-name=%s-%sf' % (p[n], tag, n)]
    a += ['--blockdev', 'driver=qcow2,file=%s-basef,node-name=%s-base,read-only=on' % (tag, tag),
          '--blockdev', 'driver=qcow2,file=%s-midf,backing=%s-base,node-name=%s-mid,'
          'read-only=on' % (tag, tag, tag),
          '--blockdev', 'driver=qcow2,file=%s-topf,backing=%s-mid,node-name=%s-top' % (tag, tag,
                                                                                   tag)]
    return a


def wait_job_gone(c, jid, timeout=60):
    for _ in range(timeout * 20):
        if not any(j['id'] == jid for j in c.cmd('query-jobs')['return']):
            return
        time.sleep(0.05)
    fail('job %s still there after %d s: %r' % (jid, timeout, c.cmd('query-jobs')))


def wait_status(c, jid, status, timeout=30):
    for _ in range(timeout * 20):
        js = [j for j in c.cmd('query-jobs')['return'] if j['id'] == jid]
        if js and js[0]['status'] == status:
            return js[0]
        time.sleep(0.05)
    fail('job %s never %s: %r' % (jid, status, c.cmd('query-jobs')))


# ---- 1. API, both daemons ------------------------------------------------------------

def norm(r):
    if isinstance(r, dict):
        return {k: ('N' if k in PROGRESS or k == 'busy' else norm(v)) for k, v in r.items()}
    if isinstance(r, list):
        return [norm(x) for x in r]
    return r


def api_script(kind, tmp):
    p = make_chain(tmp, kind + '-api')
    p2 = make_chain(tmp, kind + '-api2')
    d = Daemon(kind, tmp, named_chain_args(p, 'a') + named_chain_args(p2, 'b') + [
        '--nbd-server', 'addr.type=unix,addr.path=' + os.path.join(tmp, kind + '-api.sock')])
    out, ok = [], False
    try:
        c = d.client().negotiate()

        def q(name, args=None):
            out.append((name, args, norm(c.cmd(name, args))))
        for args in [{'device': 'a-top'}, {'device': 'nope', 'job-id': 'x'},
                     {'device': 'a-top', 'job-id': 'x', 'base': 'nope'},
                     {'device': 'a-top', 'job-id': 'x', 'base': p['base'], 'base-node': 'a-base'},
                     {'device': 'a-top', 'job-id': 'x', 'backing-file': 'f'},
                     {'device': 'a-top', 'job-id': 'x', 'base-node': 'a-top'},
                     {'device': 'a-top', 'job-id': '1x'},
                     {'device': 'a-top', 'job-id': 'x', 'speed': -1}]:
            q('block-stream', args)
        q('block-stream', {'device': 'a-top', 'job-id': 's0', 'base-node': 'a-base',
                           'speed': 256 * 1024, 'auto-finalize': False, 'auto-dismiss': False})
        q('block-stream', {'device': 'a-top', 'job-id': 's1'})
        q('block-stream', {'device': 'a-top', 'job-id': 's0'})
        q('job-pause', {'id': 's0'})
        q('job-pause', {'id': 's0'})
        wait_status(c, 's0', 'paused')
        q('query-jobs')
        for name in ('job-complete', 'job-finalize', 'job-dismiss'):
            q(name, {'id': 's0'})
        q('block-job-cancel', {'device': 's0'})
        q('job-pause', {'id': 'nope'})
        q('block-job-pause', {'device': 'nope'})
        q('block-job-set-speed', {'device': 's0', 'speed': -5})
        q('block-job-resume', {'device': 's0'})
        q('job-resume', {'id': 's0'})
        q('block-job-set-speed', {'device': 's0', 'speed': 0})
        wait_status(c, 's0', 'pending')
        q('query-block-jobs')
        q('job-dismiss', {'id': 's0'})
        q('job-finalize', {'id': 's0'})
        q('query-jobs')
        q('job-dismiss', {'id': 's0'})
        q('query-jobs')
        # The top now reads from a-base; commit errors, then a commit into base of a
        # fresh intermediate is not possible (mid left): commit needs a chain again.
        for args in [{'device': 'nope'}, {'device': 'a-top', 'top-node': 'a-top',
                                          'backing-file': 'x'},
                     {'device': 'a-top', 'job-id': 'c', 'top-node': 'a-base',
                      'base-node': 'a-base'},
                     {'device': 'a-top', 'job-id': 'c', 'top-node': 'a-top', 'top': 'x'},
                     {'device': 'a-top', 'job-id': 'c', 'top-node': 'a-base'}]:
            q('block-commit', args)
        q('block-stream', {'device': 'a-top', 'job-id': 's2', 'speed': 64 * 1024})
        wait_status(c, 's2', 'running')
        q('block-job-cancel', {'device': 's2'})
        wait_job_gone(c, 's2')
        q('query-jobs')
        # A commit's nodes while it runs: no writer on the base, no reader of the
        # nodes that go, no snapshot, removal or second job.
        q('block-commit', {'device': 'b-top', 'job-id': 'c1', 'top-node': 'b-mid',
                           'speed': 64 * 1024})
        q('block-export-add', {'type': 'nbd', 'id': 'e1', 'node-name': 'b-base',
                               'writable': True})
        q('block-export-add', {'type': 'nbd', 'id': 'e2', 'node-name': 'b-mid'})
        q('blockdev-del', {'node-name': 'b-mid'})
        q('blockdev-del', {'node-name': 'b-top'})
        q('blockdev-snapshot-sync', {'node-name': 'b-top', 'format': 'qcow2',
                                     'snapshot-file': os.path.join(tmp, kind + '-snap.qcow2'),
                                     'snapshot-node-name': 'snap'})
        q('block-stream', {'device': 'b-top', 'job-id': 's3'})
        q('block_resize', {'node-name': 'b-base', 'size': 64 * MiB})
        q('job-cancel', {'id': 'c1'})
        wait_job_gone(c, 'c1')
        q('query-jobs')
        events = {}
        for e in c.events:
            if e['event'] == 'JOB_STATUS_CHANGE':
                events.setdefault(e['data']['id'], []).append(e['data']['status'])
            elif e['event'].startswith('BLOCK_JOB_'):
                jid = e['data'].get('device', e['data'].get('id'))
                events.setdefault(jid, []).append(e['event'] + json.dumps(
                    norm(e['data']), sort_keys=True))
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    return out, events


def api_part(tmp):
    io, io_ev = api_script('ioplane', tmp)
    qsd, qsd_ev = api_script('qsd', tmp)
    for (n, a, r_io), (_, _, r_qsd) in zip(io, qsd):
        if n == 'block_resize':  # qsd says "Device '(null)' is in use"
            if r_io.get('error', {}).get('desc') != ("Node 'b-base' is busy: block device is "
                                                     "in use by block job: commit"):
                fail('block_resize of a commit base: %r' % r_io)
            continue
        if r_io != r_qsd:
            fail('%s %r:\n qsd     %r\n ioplane %r' % (n, a, r_qsd, r_io))
    # qsd pauses a job for each drain of its nodes (the refused commands above drain
    # them): internal pause/resume pairs ioplane's jobs do not need.
    for ev in (io_ev, qsd_ev):
        seq, out = ev.get('c1', []), []
        for st in seq:
            if out and out[-1] == 'paused' and st == 'running' and len(out) > 2:
                out.pop()
            else:
                out.append(st)
        ev['c1'] = out
    if io_ev != qsd_ev:
        fail('events differ:\n qsd     %r\n ioplane %r' % (qsd_ev, io_ev))
    if 'concluded' not in io_ev.get('s0', []) or 'aborting' not in io_ev.get('s2', []):
        fail('missing events: %r' % io_ev)


# ---- 2. data under writes, both daemons -------------------------------------------

WRITES = [(i * 1024 * 1024 + 4096 * (i % 7), 65536 + 4096 * (i % 3), 0x40 + i)
          for i in range(0, 32, 3)]


def serve(kind, tmp, p, tag):
    sock = os.path.join(tmp, '%s-%s.sock' % (kind, tag))
    d = Daemon(kind, tmp, ['--blockdev', 'driver=file,filename=%s,node-name=tf' % p['top'],
                           '--blockdev', 'driver=qcow2,file=tf,node-name=top',
                           '--object', 'iothread,id=io0',
                           '--nbd-server', 'addr.type=unix,addr.path=' + sock,
                           '--export', 'type=nbd,id=e,node-name=top,writable=on,iothread=io0'])
    return d, 'nbd+unix:///top?socket=' + sock


def expected_image(tmp, p, tag):
    """The old chain as raw, with the writes on it."""
    raw = os.path.join(tmp, tag + '-expect.raw')
    run(['qemu-img', 'convert', '-O', 'raw', p['top'], raw])
    qemu_io(raw, ['write -P %d %d %d' % (pat, off, ln) for off, ln, pat in WRITES], fmt='raw')
    return raw


def node_by_file(c, path, drv='qcow2'):
    for n in c.cmd('query-named-block-nodes')['return']:
        if n['file'] == path and n['drv'] == drv:
            return n['node-name']
    fail('no %s node for %s' % (drv, path))


def data_job(kind, tmp, job):
    tag = '%s-%s' % (kind, job)
    p = make_chain(tmp, tag)
    expect = expected_image(tmp, p, tag)
    d, uri = serve(kind, tmp, p, tag)
    ok = False
    try:
        c = d.client().negotiate()
        if job == 'stream':
            args = {'job-id': 'j', 'device': 'top', 'base-node': node_by_file(c, p['base']),
                    'speed': 4 * MiB}
            r = c.cmd('block-stream', args)
        else:
            args = {'job-id': 'j', 'device': 'top', 'top-node': node_by_file(c, p['mid']),
                    'speed': 4 * MiB}
            r = c.cmd('block-commit', args)
        if r != {'return': {}}:
            fail('%s %s: %r' % (kind, job, r))
        # Writes through the export while the job copies (FUA: acknowledged = durable).
        qemu_io(uri, ['write -f -P %d %d %d' % (pat, off, ln) for off, ln, pat in WRITES],
                fmt='raw')
        js = c.cmd('query-jobs')['return']
        if not js or js[0]['status'] != 'running':
            fail('%s %s: the job was not running during the writes: %r' % (kind, job, js))
        c.cmd('block-job-set-speed', {'device': 'j', 'speed': 0})
        e = c.wait_event('BLOCK_JOB_COMPLETED', timeout=60)
        if not e or 'error' in e['data']:
            fail('%s %s: %r' % (kind, job, e))
        # The export serves the top again (stream's guard gone), writes included.
        off, ln, pat = WRITES[-1]
        qemu_io(uri, ['read -P %d %d %d' % (pat, off, ln), 'write -P 0x7e %d 4096' % off],
                fmt='raw')
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    info = json.loads(run(['qemu-img', 'info', '--output=json', p['top']]).stdout)
    if info.get('backing-filename') != p['base']:
        fail('%s %s: top names %r, not the base' % (kind, job, info.get('backing-filename')))
    for n in ('top', 'base'):
        run(['qemu-img', 'check', '-q', p[n]])
    qemu_io(expect, ['write -P 0x7e %d 4096' % WRITES[-1][0]], fmt='raw')
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'raw', p['top'], expect])


def loop_part(tmp):
    """The job's loop is the export's iothread io0 before any client connects."""
    p = make_chain(tmp, 'loop')
    d, _ = serve('ioplane', tmp, p, 'loop')
    ok = False
    try:
        c = d.client().negotiate()

        def rounds():
            for t in c.cmd('query-iothreads')['return']:
                if t['id'] == 'io0':
                    return t['x-ioplane']['rounds']
            fail('no iothread io0 in query-iothreads')
        before = rounds()
        r = c.cmd('block-stream', {'job-id': 'j', 'device': 'top'})
        if r != {'return': {}}:
            fail('stream: %r' % r)
        e = c.wait_event('BLOCK_JOB_COMPLETED', timeout=60)
        if not e or 'error' in e['data']:
            fail('stream: %r' % e)
        # At least a round per 1 MiB chunk of the 24 MiB the chain below the top holds.
        if rounds() - before < 24:
            fail('the stream did not run on the export\'s iothread io0: its loop made %d '
                 'rounds meanwhile' % (rounds() - before))
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)


# ---- 3. cancel at random points -----------------------------------------------------

def cancel_part(kind, tmp, rnd):
    for i, job in enumerate(['stream', 'commit', 'stream', 'commit']):
        tag = '%s-cancel%d' % (kind, i)
        p = make_chain(tmp, tag)
        before = os.path.join(tmp, tag + '-before.raw')
        run(['qemu-img', 'convert', '-O', 'raw', p['top'], before])
        d, _ = serve(kind, tmp, p, tag)
        ok = False
        try:
            c = d.client().negotiate()
            args = {'job-id': 'j', 'device': 'top', 'speed': 16 * MiB}
            if job == 'commit':
                args['top-node'] = node_by_file(c, p['mid'])
            r = c.cmd('block-' + job, args)
            if r != {'return': {}}:
                fail('%s: %r' % (tag, r))
            time.sleep(rnd.uniform(0, 0.5))
            c.cmd('block-job-cancel', {'device': 'j', 'force': True})
            wait_job_gone(c, 'j')
            c.cmd('quit')
            d.wait()
            ok = True
        finally:
            d.cleanup(ok)
        for n in ('base', 'mid', 'top'):
            run(['qemu-img', 'check', '-q', p[n]])
        run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'raw', p['top'], before])


# ---- 4. kill -9, ioplane -----------------------------------------------------------

KILL_ROUNDS = 8  # WRITES repeated, 20 ms apart: about 2 s of writes
KILL_SEQ = [(off, ln, (pat + 16 * r) % 256) for r in range(KILL_ROUNDS)
            for off, ln, pat in WRITES]


def kill_part(tmp, rnd):
    for i, job in enumerate(['stream', 'commit', 'stream', 'commit']):
        tag = 'kill%d' % i
        p = make_chain(tmp, tag)
        d, uri = serve('ioplane', tmp, p, tag)
        try:
            c = d.client().negotiate()
            args = {'job-id': 'j', 'device': 'top', 'speed': 16 * MiB}
            if job == 'commit':
                args['top-node'] = node_by_file(c, p['mid'])
            if c.cmd('block-' + job, args) != {'return': {}}:
                fail('%s: the job did not start' % tag)
            cmds = []
            for off, ln, pat in KILL_SEQ:
                cmds += ['-c', 'write -f -P %d %d %d' % (pat, off, ln), '-c', 'sleep 20']
            w = subprocess.Popen(['qemu-io', '-f', 'raw'] + cmds + [uri], text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
            time.sleep(rnd.uniform(0.1, 2.0))
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait(timeout=10)
            out, _ = w.communicate(timeout=30)
        finally:
            d.cleanup(True)
        r = run(['qemu-img', 'check', p['top']], ok=(0, 3))  # 3: leaked clusters only
        for n in ('base', 'mid'):
            run(['qemu-img', 'check', p[n]], ok=(0, 3))
        # The last acknowledged write to each offset is what the chain reads.
        n_acked = len(re.findall(r'wrote \d+', out))
        last = {off: (ln, pat) for off, ln, pat in KILL_SEQ[:n_acked]}
        if n_acked < len(KILL_SEQ):  # in flight when killed: either pattern may be there
            last.pop(KILL_SEQ[n_acked][0], None)
        qemu_io(p['top'], ['read -P %d %d %d' % (pat, off, ln) for off, (ln, pat) in
                           last.items()] or ['read 0 512'])
        print('kill -9 %s after %d acknowledged writes: chain %s' % (
            job, n_acked, 'relinked' if 'mid' not in run(
                ['qemu-img', 'info', p['top']]).stdout else 'intact'), r.returncode)


def main():
    for t in ('qemu-img', 'qemu-io'):
        if not shutil.which(t):
            skip('%s is not installed' % t)
    rnd = random.Random(int(os.environ.get('TEST_SEED', '1234')))
    with tempfile.TemporaryDirectory() as tmp:
        kinds = ['ioplane'] + (['qsd'] if QSD else [])
        for kind in kinds:
            for job in ('stream', 'commit'):
                data_job(kind, tmp, job)
            cancel_part(kind, tmp, rnd)
        kill_part(tmp, rnd)
        loop_part(tmp)
        if not QSD:
            skip('qemu-storage-daemon is not installed: the data parts ran against ioplane '
                 'only, the API comparison did not run')
        api_part(tmp)
    print('PASS: stream and commit under writes, cancel and kill -9 leave valid chains; '
          'ioplane and qsd agree on the API')


if __name__ == '__main__':
    try:
        main()
    except (Closed, TimeoutError, ConnectionError) as e:
        fail('%s: %s' % (type(e).__name__, e))
