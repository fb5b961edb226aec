#!/usr/bin/env python3
"""A QMP command that drains a node opened on the command line answers: block_resize
and block-dirty-bitmap-add on a qcow2 node of --blockdev and of --image (whose opens
read the image, so the thread that opened them has submitted to them) reply, and the
node then serves NBD reads of its new size. (Drains used to wait for the main loop,
which was running the command.)

Exit 0 pass, 77 skip, 1 fail."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import Daemon, fail  # noqa: E402

MiB = 1 << 20


def main():
    with tempfile.TemporaryDirectory(prefix='ioplane-drain.') as tmp:
        a, b = os.path.join(tmp, 'a.qcow2'), os.path.join(tmp, 'b.qcow2')
        for img in (a, b):
            subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', img, '8M'], check=True)
        sock = os.path.join(tmp, 'nbd.sock')
        d = Daemon('ioplane', tmp, [
            '--blockdev', 'driver=file,filename=%s,node-name=fa' % a,
            '--blockdev', 'driver=qcow2,file=fa,node-name=qa',
            '--image', 'qb,file=%s,format=qcow2' % b,
            '--nbd-server', 'addr.type=unix,addr.path=' + sock,
            '--export', 'type=nbd,id=e,node-name=qa,name=a'])
        ok = False
        try:
            c = d.client().negotiate()
            for node in ('qa', 'qb'):
                for cmd, args in (('block_resize', {'node-name': node, 'size': 16 * MiB}),
                                  ('block-dirty-bitmap-add', {'node': node, 'name': 'x'})):
                    try:
                        r = c.cmd(cmd, args)
                    except TimeoutError:
                        fail('%s on %s: no reply' % (cmd, node))
                    if r != {'return': {}}:
                        fail('%s on %s: %r' % (cmd, node, r))
            r = subprocess.run(['qemu-io', '-r', '-f', 'raw', '-c', 'read 15M 1M',
                                'nbd+unix:///a?socket=' + sock], capture_output=True,
                               text=True, timeout=30)
            if r.returncode or 'read 1048576/1048576' not in r.stdout:
                fail('read past the old size: %s%s' % (r.stdout, r.stderr))
            # Again, now that an NBD client has submitted to the node.
            if c.cmd('block-dirty-bitmap-clear', {'node': 'qa', 'name': 'x'}) != {'return': {}}:
                fail('block-dirty-bitmap-clear after NBD I/O')
            c.cmd('quit')
            d.wait()
            ok = True
        finally:
            d.cleanup(ok)
    print('drains from QMP on command-line nodes: 5 commands answered')


if __name__ == '__main__':
    main()
