#!/usr/bin/env python3
"""Test helper: a TCP proxy in front of the test's S3 server that dies mid-transfer.

Usage: s3cut.py TARGET_PORT LIMIT_BYTES
Listens on a free loopback port (printed on stdout, one line), forwards every connection to
127.0.0.1:TARGET_PORT and counts the bytes it forwards, both directions, all connections
together. Once LIMIT_BYTES have passed it exits at once (status 0): every connection through it
is cut and a reconnect is refused, as when the storage's process is killed. Any other end is a
failure (status 1), so a caller that sees 0 knows the cut happened after LIMIT_BYTES.
"""
import os
import socket
import sys
import threading

target, limit = int(sys.argv[1]), int(sys.argv[2])
passed = 0
lock = threading.Lock()


def pump(src, dst):
    global passed
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                dst.shutdown(socket.SHUT_WR)
                return
            with lock:
                passed += len(data)
                if passed >= limit:
                    os._exit(0)  # the storage is gone: every socket closes with the process
            dst.sendall(data)
    except OSError:
        src.close()
        dst.close()


def main():
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    print(ls.getsockname()[1], flush=True)
    while True:
        client, _ = ls.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", target))
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


try:
    main()
except BaseException as e:  # anything but the cut is the helper's failure
    print(f"s3cut: {e!r}", file=sys.stderr)
    os._exit(1)
