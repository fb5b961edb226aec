#!/usr/bin/env python3
"""The host side of a migration run of run-vm-test.sh (--migrate): once the guest prints
"VMTEST: migrate now" (it then writes and verifies from every vCPU), migrate it from the
source QEMU ($VMTEST_QEMU_QMP) to the destination waiting with -incoming
($VMTEST_QEMU2_QMP), wait (bounded) until query-migrate says completed and the
destination runs, print the migration's total time and downtime, write "migrated" into
the disk image at $VMTEST_FLAG_OFFSET (the guest stops its loop when it reads it) and
quit the source. With $VMTEST_SERVER_PID, also the CPU time the server (all its
threads) and the source QEMU ($VMTEST_QEMU_PID_FILE) used from the migrate command to completion: on a small
machine a back-end's CPU is taken from the guest's vCPUs and the migration thread.
Usage: vm-migrate.py URI"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vmhost import Client, fail, ok, wait_console  # noqa: E402


def poll(c, name, done, secs, what):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        r = ok(c, name)
        if done(r):
            return r
        time.sleep(0.2)
    fail('%s: not within %d s (last: %r)' % (what, secs, r))


def cpu_ms(pid):
    """user + system CPU time of process pid (all threads), ms; None if gone."""
    try:
        with open('/proc/%s/stat' % pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 // os.sysconf('SC_CLK_TCK')


def main():
    uri = sys.argv[1]
    wait_console('VMTEST: migrate now', 900)
    src = Client(os.environ['VMTEST_QEMU_QMP']).negotiate()
    dst = Client(os.environ['VMTEST_QEMU2_QMP']).negotiate()
    pids = {'server': os.environ.get('VMTEST_SERVER_PID', ''), 'qemu': ''}
    try:
        with open(os.environ.get('VMTEST_QEMU_PID_FILE', '')) as f:
            pids['qemu'] = f.read().strip()
    except OSError:
        pass
    cpu0 = {k: cpu_ms(v) if v else None for k, v in pids.items()}
    ok(src, 'migrate', {'uri': uri})
    print('migrate %s: started' % uri, flush=True)
    r = poll(src, 'query-migrate',
             lambda r: r.get('status') in ('completed', 'failed', 'cancelled'), 600,
             'migration')
    cpu1 = {k: cpu_ms(v) if v else None for k, v in pids.items()}
    if r['status'] != 'completed':
        fail('migration %s: %r' % (r['status'], r))
    cpu = ''.join(' %s_cpu_ms=%d' % (k, cpu1[k] - cpu0[k]) for k in pids
                  if cpu0[k] is not None and cpu1[k] is not None)
    poll(dst, 'query-status', lambda r: r.get('status') == 'running', 60,
         'the destination running')
    print('migration: completed total_ms=%s downtime_ms=%s setup_ms=%s ram_mb=%d%s' % (
        r.get('total-time'), r.get('downtime'), r.get('setup-time'),
        r.get('ram', {}).get('transferred', 0) >> 20, cpu), flush=True)
    fd = os.open(os.environ['VMTEST_IMG'], os.O_WRONLY)
    try:
        os.pwrite(fd, b'migrated'.ljust(4096, b'\0'), int(os.environ['VMTEST_FLAG_OFFSET']))
        os.fsync(fd)
    finally:
        os.close(fd)
    src.cmd('quit')
    print('source: quit', flush=True)


if __name__ == '__main__':
    main()
