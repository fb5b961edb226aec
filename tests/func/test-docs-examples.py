#!/usr/bin/env python3
"""The examples of README.md, docs/service.md, docs/metrics.md and of the man page's
EXAMPLES run as written.

Each shell example is taken from the document, its system paths (/run/ioplane,
/var/lib/images) moved into a scratch directory and build/ioplane (or ioplane) replaced
by the binary under test, then run in order: the commands before `# in another shell`
one after the other, an `ioplane serve` among them in the background until the sockets it
names listen; the commands after it as its clients, each of which must succeed; then the
daemon must exit 0 on SIGTERM (or by itself after a QMP quit). The QEMU line is not run
(no guest here), but its -m must equal its memory backend's size; a cloud-hypervisor
line must share its memory and name a vhost-user socket the daemon serves; an
nbd-client line (the kernel's client) must name a socket and an export the daemon
serves; an XML block (libvirt) must parse and name such a socket. Lines that build or
test the tree (scripts/, meson, ninja, build/tests/) are left out; port 10809 becomes a free one.
"""

import atexit
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

SRC = os.environ.get('IOPLANE_SRC', os.path.join(os.path.dirname(__file__), '..', '..'))
IOPLANE = os.environ.get('IOPLANE') or os.path.join(
    os.environ.get('IOPLANE_BUILD', os.path.join(SRC, 'build')), 'ioplane')
CLIENTS = ('qemu-img', 'qemu-io', 'nbdinfo', 'nbdcopy')
SERVERS = []  # every daemon started, killed at exit whatever happened


@atexit.register
def kill_servers():
    for p in SERVERS:
        if p.poll() is None:
            p.kill()
            p.wait()


def fail(msg):
    print('FAIL: ' + msg, file=sys.stderr)
    sys.exit(1)


def skip(msg):
    print('SKIP: ' + msg)
    sys.exit(77)


def md_blocks(doc, lang='sh'):
    text = open(os.path.join(SRC, doc)).read()
    return re.findall(r'```%s\n(.*?)```' % lang, text, re.S)


def man_blocks():
    out = subprocess.run(['man', '-l', '-P', 'cat', os.path.join(SRC, 'docs/ioplane.1')],
                         env=dict(os.environ, MANWIDTH='200', MAN_KEEP_FORMATTING=''),
                         capture_output=True, text=True, check=True).stdout
    out = re.sub('.\b', '', out)
    ex = out.split('\nEXAMPLES\n', 1)[1].split('\nFILES\n', 1)[0]
    blocks, cur = [], []
    for line in ex.splitlines():
        if line.startswith(' ' * 14):
            cur.append(line[14:])
        elif cur:
            blocks.append('\n'.join(cur) + '\n')
            cur = []
    return blocks + (['\n'.join(cur) + '\n'] if cur else [])


def commands(block):
    """The block's commands, continuation lines joined, as (command, is_client)."""
    joined = block.replace('\\\n', ' ')
    client = False
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith('# in another shell'):
            client = True
        line = re.sub(r'\s+#.*', '', line) if not line.startswith('#') else ''
        if line:
            yield line, client


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return str(s.getsockname()[1])


PORT = free_port()


def localise(cmd, tmp):
    cmd = cmd.replace('/run/ioplane', tmp + '/run').replace('/var/lib/images', tmp + '/img')
    cmd = cmd.replace('127.0.0.1:10809', '127.0.0.1:' + PORT)
    return re.sub(r'^(build/)?ioplane\b', shlex.quote(IOPLANE), cmd)


def check_qemu(cmd):
    m = re.search(r'\s-m\s+(\S+)', cmd)
    size = re.search(r'memory-backend-[a-z]+,[^ ]*size=(\w+)', cmd)
    if not size:
        fail('a QEMU line without a memory backend: ' + cmd)
    if not m or m.group(1) != size.group(1):
        fail('a QEMU line whose -m is not its memory backend size: ' + cmd)


def check_cloud_hypervisor(cmd, tmp):
    if not re.search(r'--memory\s+\S*shared=on', cmd):
        fail('a cloud-hypervisor line without shared memory: ' + cmd)
    m = re.search(r'--disk\s+\S*vhost_user=true,socket=([^,\s]+)', cmd)
    if not m or not os.path.exists(localise(m.group(1), tmp)):
        fail('a cloud-hypervisor line without a served vhost-user socket: ' + cmd)


def check_nbd_client(cmd, tmp):
    """The kernel client cannot run here: its socket and export must be served."""
    if ' -d ' in cmd:
        return
    sock = re.search(r'-unix\s+(\S+)', cmd)
    name = re.search(r'-N\s+(\S+)', cmd)
    if not sock or not name:
        fail('an nbd-client line without -unix SOCKET and -N NAME: ' + cmd)
    r = subprocess.run(['nbdinfo', '--size', 'nbd+unix:///%s?socket=%s'
                        % (name.group(1), localise(sock.group(1), tmp))], capture_output=True)
    if r.returncode:
        fail('nbd-client names what the daemon does not serve: %s: %s' % (cmd, r.stderr))


def check_xml(doc, vu_paths):
    import xml.etree.ElementTree as ET
    for block in md_blocks(doc, 'xml'):
        root = ET.fromstring(block)
        for disk in root.iter('disk'):
            src = disk.find('source')
            if disk.get('type') == 'vhostuser' and (src is None or src.get('path') not in vu_paths):
                fail('%s: a vhostuser disk on a socket no example serves' % doc)
        if root.find('memoryBacking/access') is None and root.iter('disk'):
            fail('%s: a vhostuser domain without shared memory' % doc)


def wait_listening(proc, cmd, log):
    paths = re.findall(r'(?:unix|path)=([^,\s]+)', cmd)
    tcp = re.findall(r'tcp=([\d.]+):(\d+)', cmd)
    for _ in range(300):
        if proc.poll() is not None:
            fail('serve exited (%d) before listening: %s\n%s' % (proc.returncode, cmd,
                                                               open(log).read()))
        ok = all(os.path.exists(p) for p in paths)
        for host, port in tcp:
            r = subprocess.run(['nbdinfo', '--list', 'nbd://%s:%s' % (host, port)],
                               capture_output=True)
            ok = ok and r.returncode == 0
        if ok:
            return
        time.sleep(0.1)
    fail('serve not listening after 30 s: ' + cmd)


def stop(proc, cmd):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        fail('serve still running 30 s after SIGTERM: ' + cmd)
    if rc != 0:
        fail('serve exited %d: %s' % (rc, cmd))


def run_block(block, tmp, name):
    serve = None
    n = 0
    for cmd, client in commands(block):
        if re.search(r'(^|\s)(\./)?scripts/|^meson |^ninja |build/tests/', cmd):
            continue
        if cmd.startswith('qemu-system'):
            check_qemu(cmd)
            continue
        if cmd.startswith('cloud-hypervisor'):
            check_cloud_hypervisor(cmd, tmp)
            continue
        if cmd.startswith('nbd-client'):
            check_nbd_client(cmd, tmp)
            continue
        local = localise(cmd, tmp)
        if re.match(r'\S+ serve ', local):
            log = os.path.join(tmp, 'serve-%s.log' % name)
            serve = (subprocess.Popen('exec ' + local.rstrip(' &'), shell=True, cwd=tmp,
                                      stdin=subprocess.DEVNULL, stdout=open(log, 'w'),
                                      stderr=subprocess.STDOUT, start_new_session=True), cmd)
            SERVERS.append(serve[0])
            wait_listening(serve[0], local, log)
            continue
        r = subprocess.run(local, shell=True, cwd=tmp, capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            fail('%s: `%s` failed (%d): %s%s' % (name, cmd, r.returncode, r.stdout[-500:],
                                                r.stderr[-500:]))
        n += 1
    if serve:
        stop(*serve)
    return n


def main():
    for tool in CLIENTS + ('man',):
        if subprocess.run(['sh', '-c', 'command -v ' + tool], capture_output=True).returncode:
            skip(tool + ' is not installed')
    base = '/var/tmp' if os.path.isdir('/var/tmp') else None
    total = 0
    docs = [(d, md_blocks(d)) for d in ('README.md', 'docs/service.md', 'docs/metrics.md')]
    for doc, blocks in docs + [('ioplane.1', man_blocks())]:
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            for i, block in enumerate(blocks):
                total += run_block(block, tmp, '%s-%d' % (os.path.basename(doc), i))
        print('%s: %d examples ran' % (doc, len(blocks)))
    check_xml('docs/service.md', {m for b in md_blocks('docs/service.md') for m in
                                  re.findall(r'vhost-user-blk unix=([^,\s]+)', b)})
    if total < 15:
        fail('only %d commands ran: the examples were not found' % total)
    print('PASS: %d commands' % total)


main()
