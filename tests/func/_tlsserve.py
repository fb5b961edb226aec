"""The scaffolding of the Python NBD-over-TLS tests: the tools they need, certificates
made with tls-lib.sh (certtool), and an `ioplane serve` with TLS on 127.0.0.1 that a
test body runs against, its log shown when the body fails.
The leading underscore keeps the test runner (scripts/test.sh) from running it as a test.
"""

import os
import shutil
import socket
import subprocess
import sys
import time

from _qmp import free_port, skip  # noqa: F401 (free_port: for the tests)

HERE = os.path.dirname(os.path.abspath(__file__))


def recv_exact(sock, n):
    """n bytes from sock (a plain socket or an ssl one); EOFError when it closes first."""
    b = b""
    while len(b) < n:
        c = sock.recv(n - len(b))
        if not c:
            raise EOFError("closed")
        b += c
    return b


def need():
    """The ioplane binary ($IOPLANE), or skip when it or gnutls-bin is missing."""
    ioplane = os.environ.get("IOPLANE")
    if not ioplane:
        skip("IOPLANE is not set")
    for tool in ("certtool", "psktool"):
        if not shutil.which(tool):
            skip(f"{tool} is not installed (gnutls-bin)")
    return ioplane


def make_pki(pki):
    """tls-lib.sh's tls_make: its directories below pki."""
    subprocess.run(["bash", "-c", f'. "{HERE}/nbd-lib.sh"; . "{HERE}/tls-lib.sh"; '
                    f'tls_make "{pki}"'], check=True)


def wait_listening(port, srv):
    for _ in range(600):
        assert srv.poll() is None, "server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("server does not listen")


def serve(ioplane, pki, port, args, logpath, body):
    """`ioplane serve` with tls-creds-x509 tls0 (pki/srv) on --nbd-server 127.0.0.1:port
    and args; body() once it listens. The server's exit status and log. With ioplane
    "qemu-storage-daemon", that daemon with the same command line instead."""
    log = open(logpath, "w+")
    cmd = [ioplane] if os.path.basename(ioplane) == "qemu-storage-daemon" else [ioplane, "serve"]
    srv = subprocess.Popen(cmd + [
                            "--object", f"tls-creds-x509,id=tls0,dir={pki}/srv,endpoint=server",
                            "--nbd-server", f"addr.type=inet,addr.host=127.0.0.1,"
                            f"addr.port={port},tls-creds=tls0"] + args,
                           stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        wait_listening(port, srv)
        body(srv)
    except BaseException:
        log.seek(0)
        sys.stderr.write(log.read()[-4000:])
        raise
    finally:
        srv.terminate()
        rc = srv.wait(timeout=30)
        log.seek(0)
        text = log.read()
        log.close()
    return rc, text
