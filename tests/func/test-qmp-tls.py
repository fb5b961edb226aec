#!/usr/bin/env python3
"""TLS objects and nbd-server-start over QMP, the same steps against
qemu-storage-daemon and `ioplane serve`: object-add of tls-creds-x509 (missing
directory, duplicate id, client and server endpoints), authz-simple, nbd-server-start
with unknown credentials, with a client endpoint, then with tls-creds and tls-authz:
every reply has the same class and text; nbdinfo then gets in with the authorised
certificate and not with another name.

ioplane only: x-query-nbd-server counts the TLS connections by record layer (GnuTLS's
or the kernel's). Certificates reload without a restart. object-del of the credentials the
server uses and object-add of new ones under the same id serve the next connections
(here the new credentials trust another CA: its client gets in, the old CA's does not),
while a connection made before goes on. qsd keeps the deleted object.

Exit 0 pass, 77 skip, 1 fail."""
import os
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import IOPLANE, QSD, Daemon, fail, skip  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DN1 = 'C=GB,O=ioplane test,CN=client1'


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    p = s.getsockname()[1]
    s.close()
    return p


def outcome(r):
    if 'error' in r:
        return ('error', r['error']['class'], r['error']['desc'])
    return ('return',)


def nbdinfo(port, pki, cli):
    uri = 'nbds://127.0.0.1:%d/x?tls-certificates=%s/%s' % (port, pki, cli)
    r = subprocess.run(['nbdinfo', uri], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    return r.returncode == 0


def steps(d, tmp, pki, port):
    c = d.client()
    c.negotiate()
    out = []

    def step(label, cmd, **args):
        out.append((label, outcome(c.cmd(cmd, args))))

    x509 = {'qom-type': 'tls-creds-x509'}
    step('no dir', 'object-add', id='bad', dir=tmp + '/nowhere', endpoint='server', **x509)
    step('server creds', 'object-add', id='tls0', dir=pki + '/srv', endpoint='server', **x509)
    step('client creds', 'object-add', id='tlsc', dir=pki + '/cli', endpoint='client', **x509)
    step('duplicate', 'object-add', id='tls0', dir=pki + '/srv', endpoint='server', **x509)
    step('authz', 'object-add', **{'qom-type': 'authz-simple', 'id': 'az', 'identity': DN1})
    addr = {'type': 'inet', 'data': {'host': '127.0.0.1', 'port': str(port)}}
    step('unknown creds', 'nbd-server-start', addr=addr, **{'tls-creds': 'nosuch'})
    step('client endpoint', 'nbd-server-start', addr=addr, **{'tls-creds': 'tlsc'})
    step('start', 'nbd-server-start', addr=addr, **{'tls-creds': 'tls0', 'tls-authz': 'az'})
    step('blockdev', 'blockdev-add', driver='file', filename=tmp + '/img.raw',
         **{'node-name': 'n0'})
    step('export', 'block-export-add', type='nbd', id='e0', name='x', **{'node-name': 'n0'})
    out.append(('client1', nbdinfo(port, pki, 'cli')))
    out.append(('client2', nbdinfo(port, pki, 'cli2')))
    return c, out


def tls_client(port, pki, cli):
    """A connection through STARTTLS and the TLS handshake, left open."""
    s = socket.create_connection(('127.0.0.1', port), timeout=20)
    s.recv(18, socket.MSG_WAITALL)
    s.sendall(struct.pack('>I', 3) + struct.pack('>QII', 0x49484156454F5054, 5, 0))
    if struct.unpack('>QIII', s.recv(20, socket.MSG_WAITALL))[2] != 1:
        fail('STARTTLS refused')
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations('%s/%s/ca-cert.pem' % (pki, cli))
    ctx.load_cert_chain('%s/%s/client-cert.pem' % (pki, cli), '%s/%s/client-key.pem' % (pki, cli))
    t = ctx.wrap_socket(s, server_hostname='localhost')
    t.sendall(struct.pack('>QII', 0x49484156454F5054, 99, 0))  # a round trip: admitted
    t.recv(20)
    return t


def query_steps(c, pki, port):
    """ioplane's x-query-nbd-server: the TLS connection and its record layer."""
    t = tls_client(port, pki, 'cli')
    r = c.cmd('x-query-nbd-server')
    t.close()
    if 'error' in r:
        fail('x-query-nbd-server: %s' % r)
    q = r['return']
    layers = q['tls-record-layer']
    if q['connections'] != 1 or layers['gnutls'] + layers['kernel'] != 1:
        fail('x-query-nbd-server with one TLS client: %s' % q)
    if q.get('tls-creds') != 'tls0' or q.get('tls-authz') != 'az':
        fail('x-query-nbd-server ids: %s' % q)


def reload_steps(c, pki, port):
    """ioplane: replace tls0 under the same id; new connections use the new one."""
    held = socket.create_connection(('127.0.0.1', port), timeout=20)  # a client already there
    new = pki + '/srv-new'
    os.makedirs(new)
    for f in ('server-cert.pem', 'server-key.pem'):
        shutil.copy(pki + '/srv/' + f, new)
    shutil.copy(pki + '/otherca-cert.pem', new + '/ca-cert.pem')
    for cmd, args in (('object-del', {'id': 'tls0'}),
                      ('object-add', {'qom-type': 'tls-creds-x509', 'id': 'tls0', 'dir': new,
                                      'endpoint': 'server'})):
        r = c.cmd(cmd, args)
        if 'error' in r:
            fail('%s: %s' % (cmd, r))
    if not nbdinfo(port, pki, 'cli-otherca'):
        fail('after the reload, the new CA\'s client was refused')
    if nbdinfo(port, pki, 'cli'):
        fail('after the reload, the old CA\'s client got in')
    if len(held.recv(18)) != 18:
        fail('the connection made before the reload lost its greeting')
    held.close()


def main():
    for tool in ('certtool', 'psktool', 'nbdinfo'):
        if not shutil.which(tool):
            skip('%s is not installed' % tool)
    if not QSD:
        skip('qemu-storage-daemon is not installed')
    tmp = tempfile.mkdtemp(prefix='ioplane-qmp-tls-')
    pki = tmp + '/pki'
    subprocess.run(['bash', '-c', '. "%s/nbd-lib.sh"; . "%s/tls-lib.sh"; tls_make "%s"'
                    % (HERE, HERE, pki)], check=True)
    with open(tmp + '/img.raw', 'wb') as f:
        f.truncate(1 << 20)
    results, ok = {}, False
    daemons = []
    try:
        for kind in ('qsd', 'ioplane'):
            d = Daemon(kind, tmp)
            daemons.append(d)
            port = free_port()
            c, results[kind] = steps(d, tmp, pki, port)
            if kind == 'ioplane':
                query_steps(c, pki, port)
                reload_steps(c, pki, port)
            c.close()
            d.cleanup(True)
        for (name, q), (_, i) in zip(results['qsd'], results['ioplane']):
            print('%-16s qsd %s\n%-16s ioplane %s' % (name, q, '', i))
            if q != i:
                fail('%s: qsd %s, ioplane %s' % (name, q, i))
        want = dict(results['ioplane'])
        if want['client1'] is not True or want['client2'] is not False:
            fail('authorisation: %s' % results['ioplane'])
        ok = True
    finally:
        for d in daemons:
            d.cleanup(ok)
        shutil.rmtree(tmp)
    print('ok')


if __name__ == '__main__':
    main()
