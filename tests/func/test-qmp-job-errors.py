#!/usr/bin/env python3
"""Block job error actions against a target that fails, the same script against ioplane
and qemu-storage-daemon. The target is an nbdkit memory disk behind nbdkit's error
filter, which fails every write while a control file exists:

1. blockdev-mirror, on-target-error=stop: BLOCK_JOB_ERROR (write, stop), the job pauses;
   once the target heals, job-resume takes it to READY and the target equals the source.
2. blockdev-mirror, on-target-error=report: BLOCK_JOB_ERROR (write, report), then
   BLOCK_JOB_COMPLETED with an error; the source is untouched.
3. blockdev-backup sync=full, on-target-error=stop: pauses, resumes, completes, and the
   target equals the source.
4. block-stream, on-error=stop, from a backing disk whose reads fail (the error filter on
   reads): BLOCK_JOB_ERROR (read, stop), then the same, and the top holds the data.

Event sequences (consecutive repeats folded: how many requests in flight fail first is
each daemon's own) and replies are compared between the two. Exit 0 pass, 77 skip,
1 fail."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, Closed, Daemon, fail, skip  # noqa: E402

MiB = 1 << 20
SIZE = 8 * MiB


def run(argv, ok=(0,)):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    if r.returncode not in ok:
        fail('%s: rc %d %s%s' % (' '.join(argv), r.returncode, r.stdout[-2000:],
                                 r.stderr[-2000:]))
    return r


class Target:
    """nbdkit memory SIZE behind the error filter, failing writes while `errors` exists."""

    def __init__(self, tmp, tag, reads=False):
        self.sock = os.path.join(tmp, tag + '-nbdkit.sock')
        self.errors = os.path.join(tmp, tag + '-errors')
        rates = ['error-pread-rate=1'] if reads else [
            'error-pwrite-rate=1', 'error-zero-rate=1', 'error-trim-rate=1']
        self.proc = subprocess.Popen(
            ['nbdkit', '-f', '-U', self.sock, '--filter=error', 'memory', str(SIZE),
             'error=EIO'] + rates + ['error-file=' + self.errors],
            stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        for _ in range(200):
            if os.path.exists(self.sock):
                return
            time.sleep(0.05)
        fail('nbdkit did not start')

    def break_(self):
        open(self.errors, 'w').close()

    def heal(self):
        os.unlink(self.errors)

    def uri(self):
        return 'nbd+unix:///?socket=' + self.sock

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def make_source(tmp, tag):
    path = os.path.join(tmp, tag + '-src.raw')
    run(['qemu-img', 'create', '-q', '-f', 'raw', path, str(SIZE)])
    out = run(['qemu-io', '-f', 'raw', '-c', 'write -P 0x5a 0 3M', '-c', 'write -P 0xa5 5M 2M',
               path]).stdout
    if 'error' in out.lower():
        fail('qemu-io: ' + out)
    return path


def fold(events):
    """Event names and the data that matters, consecutive repeats folded."""
    out = []
    for e in events:
        d = e.get('data', {})
        if e['event'] == 'JOB_STATUS_CHANGE':
            item = ('JOB_STATUS_CHANGE', d.get('status'))
        elif e['event'] == 'BLOCK_JOB_ERROR':
            item = ('BLOCK_JOB_ERROR', d.get('operation'), d.get('action'))
        elif e['event'] == 'BLOCK_JOB_COMPLETED':
            item = ('BLOCK_JOB_COMPLETED', d.get('type'), 'error' in d)
        else:
            item = (e['event'], d.get('type'))
        if not out or out[-1] != item:
            out.append(item)
    # A pause and resume before the first error is the drained section of a
    # job's start (qsd has one for backup, ioplane does not): not compared.
    first = next((i for i, x in enumerate(out) if x[0] == 'BLOCK_JOB_ERROR'), len(out))
    head = out[:first]
    for i in range(len(head) - 1):
        if head[i] == ('JOB_STATUS_CHANGE', 'paused') and \
                head[i + 1] == ('JOB_STATUS_CHANGE', 'running'):
            head[i:i + 2] = [None, None]
    return [x for x in head if x] + out[first:]


def wait_for(c, name, timeout=60):
    e = c.wait_event(name, timeout=timeout)
    if not e:
        fail('no %s within %d s: %r' % (name, timeout, c.cmd('query-jobs')))
    return e


def job_status(c):
    js = c.cmd('query-jobs')['return']
    return js[0]['status'] if js else None


def daemon_args(name, src, t, top):
    if name == 'stream':  # top: qcow2 over the failing disk as its backing node
        return ['--blockdev', 'driver=nbd,server.type=unix,server.path=%s,node-name=base'
                % t.sock,
                '--blockdev', 'driver=file,filename=%s,node-name=topf' % top,
                '--blockdev', 'driver=qcow2,file=topf,backing=base,node-name=src']
    return ['--blockdev', 'driver=file,filename=%s,node-name=srcf' % src,
            '--blockdev', 'driver=raw,file=srcf,node-name=src',
            '--blockdev', 'driver=nbd,server.type=unix,server.path=%s,node-name=tgt' % t.sock]


def case(kind, tmp, name):
    tag = '%s-%s' % (kind, name)
    src = make_source(tmp, tag)
    t = Target(tmp, tag, reads=name == 'stream')
    top = os.path.join(tmp, tag + '-top.qcow2')
    if name == 'stream':  # the data goes to the disk the top streams from
        run(['qemu-img', 'convert', '-n', '-f', 'raw', '-O', 'raw', src, t.uri()])
        run(['qemu-img', 'create', '-q', '-f', 'qcow2', top, str(SIZE)])
    t.break_()
    d = Daemon(kind, tmp, daemon_args(name, src, t, top))
    log, ok, seen = [], False, []
    try:
        c = d.client().negotiate()
        recv = c.recv

        def recording_recv(timeout=30):
            m = recv(timeout)
            if 'event' in m:
                seen.append(m)
            return m
        c.recv = recording_recv
        if name == 'stream':
            r = c.cmd('block-stream', {'job-id': 'j', 'device': 'src', 'on-error': 'stop'})
        elif name == 'backup':
            r = c.cmd('blockdev-backup', {'job-id': 'j', 'device': 'src', 'target': 'tgt',
                                          'sync': 'full', 'on-target-error': 'stop'})
        else:
            r = c.cmd('blockdev-mirror', {'job-id': 'j', 'device': 'src', 'target': 'tgt',
                                          'sync': 'full', 'on-target-error': name})
        log.append(r)
        e = wait_for(c, 'BLOCK_JOB_ERROR')
        log.append(('error', e['data']['operation'], e['data']['action']))
        if name == 'report':
            e = wait_for(c, 'BLOCK_JOB_COMPLETED')
            if 'error' not in e['data']:
                fail('%s: the failed mirror completed without an error: %r' % (kind, e))
        else:
            for _ in range(200):  # the job pauses once its requests in flight are back
                if job_status(c) == 'paused':
                    break
                time.sleep(0.05)
            log.append(('status', job_status(c)))
            t.heal()
            log.append(c.cmd('job-resume', {'id': 'j'}))
            if name in ('backup', 'stream'):
                e = wait_for(c, 'BLOCK_JOB_COMPLETED')
            else:
                wait_for(c, 'BLOCK_JOB_READY')
                # A ready mirror's soft cancel: completes without the switch-over.
                log.append(c.cmd('block-job-cancel', {'device': 'j'}))
                e = wait_for(c, 'BLOCK_JOB_COMPLETED')
            if 'error' in e['data']:
                fail('%s %s: %r' % (kind, name, e))
            if name != 'stream':  # the stream's top once the daemon has closed it
                run(['qemu-img', 'compare', '-q', '-f', 'raw', '-F', 'raw', src, t.uri()])
        time.sleep(0.2)  # the last status changes
        c.cmd('query-jobs')
        log.append(fold([e for e in seen if e['event'] != 'BLOCK_JOB_PENDING']))
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
        t.stop()
    if name == 'stream':  # the top holds it all now
        run(['qemu-img', 'check', '-q', top])
        run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'raw', top, src])
    # The source is never written by a job.
    out = run(['qemu-io', '-f', 'raw', '-c', 'read -P 0x5a 0 3M', '-c', 'read -P 0 3M 2M',
               '-c', 'read -P 0xa5 5M 2M', src]).stdout
    if 'fail' in out.lower() or 'error' in out.lower():
        fail('%s %s: the source changed: %s' % (kind, name, out))
    return log


def main():
    for tool in ('qemu-img', 'qemu-io', 'nbdkit'):
        if not shutil.which(tool):
            skip('%s is not installed' % tool)
    if run(['nbdkit', '--filter=error', 'memory', '1M', '--run', 'true'],
           ok=(0, 1)).returncode:
        skip("nbdkit's memory plugin or error filter is missing")
    names = ('stop', 'report', 'backup', 'stream')
    with tempfile.TemporaryDirectory() as tmp:
        mine = {n: case('ioplane', tmp, n) for n in names}
        if not QSD:
            skip('qemu-storage-daemon is not installed: the error actions ran against '
                 'ioplane only')
        theirs = {n: case('qsd', tmp, n) for n in names}
    for n in names:
        if mine[n] != theirs[n]:
            fail('%s: ioplane %r\n  qsd %r' % (n, mine[n], theirs[n]))
    print('PASS: stop and report error actions of mirror, backup and stream as qsd has them')


if __name__ == '__main__':
    try:
        main()
    except (Closed, TimeoutError, ConnectionError) as e:
        fail('%s: %s' % (type(e).__name__, e))
