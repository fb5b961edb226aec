"""What the mirror and backup tests share (stdlib only): running tools, qemu-io
write patterns through an NBD export while a job runs, waiting for a job's event.

The leading underscore keeps the test runner from running this file as a test."""
import subprocess

from _qmp import fail

MiB = 1 << 20
SIZE = 32 * MiB


def run(argv, ok=(0,), **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop('timeout', 180),
                       stdin=subprocess.DEVNULL, **kw)
    if r.returncode not in ok:
        fail('%s: rc %d %s%s' % (' '.join(argv), r.returncode, r.stdout[-2000:],
                                 r.stderr[-2000:]))
    return r


def qemu_io(target, cmds, fmt='qcow2'):
    argv = ['qemu-io', '-f', fmt]
    for c in cmds:
        argv += ['-c', c]
    out = run(argv + [target]).stdout
    if 'fail' in out.lower() or 'error' in out.lower():
        fail('qemu-io %s: %s' % (target, out[-2000:]))
    return out


def writes(seed, n=120, sizes=7):
    """n writes of 4 KiB << (0..sizes-1), each with its own pattern, spread over SIZE."""
    cmds = []
    x = seed
    for i in range(n):
        x = (x * 1103515245 + 12345) & 0x7fffffff
        ln = 4096 << (x % sizes)
        off = min((x % (SIZE // 4096)) * 4096, SIZE - ln)
        cmds.append('write -P 0x%02x %d %d' % ((seed + i) % 255 + 1, off, ln))
    return cmds


def uri(sock, name='e0'):
    return 'nbd+unix:///%s?socket=%s' % (name, sock)


def start_writer(sock, cmds, name='e0'):
    """qemu-io running cmds against the NBD export name, in the background."""
    argv = ['qemu-io', '-f', 'raw']
    for cmd in cmds:
        argv += ['-c', cmd]
    return subprocess.Popen(argv + [uri(sock, name)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)


def end_writer(p):
    out, _ = p.communicate(timeout=180)
    if p.returncode or 'fail' in out.lower() or 'error' in out.lower():
        fail('writer: rc %d %s' % (p.returncode, out[-2000:]))


def wait(c, name, what):
    """The event name, within 120 s, or fail with what the jobs are doing."""
    e = c.wait_event(name, timeout=120)
    if e is None:
        fail('%s: no %s (%r, events %r)' % (what, name, c.cmd('query-jobs'), c.events))
    return e
