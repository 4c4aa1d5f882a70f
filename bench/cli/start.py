#!/usr/bin/env python3
"""How fast the kagent process starts, as a user pays it (no node needed).

first_byte: a loopback listener timestamps the first byte the CLI writes on the wire, from just
before posix_spawn of `kagent sandbox list` (the listener then closes the connection).
help: wall time of `kagent --help` (spawn to exit).
Usage: start.py KAGENT [RUNS]; prints one BENCH line per figure (p50 and p99, ms).
"""
import os
import socket
import sys
import time


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int((len(xs) - 1) * p / 100))]


def spawn(argv):
    null = os.open(os.devnull, os.O_RDWR)
    acts = [(os.POSIX_SPAWN_DUP2, null, 1), (os.POSIX_SPAWN_DUP2, null, 2)]
    pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=acts)
    os.close(null)
    return pid


def first_byte_ms(kagent, runs):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    url = "http://127.0.0.1:%d" % ls.getsockname()[1]
    out = []
    for _ in range(runs):
        t0 = time.monotonic_ns()
        pid = spawn([kagent, "--api-url", url, "--timeout", "5s", "sandbox", "list"])
        c, _ = ls.accept()
        if not c.recv(1):
            sys.exit("kagent closed the connection without writing")
        out.append((time.monotonic_ns() - t0) / 1e6)
        c.close()
        os.waitpid(pid, 0)
    return out


def help_ms(kagent, runs):
    out = []
    for _ in range(runs):
        t0 = time.monotonic_ns()
        _, status = os.waitpid(spawn([kagent, "--help"]), 0)
        out.append((time.monotonic_ns() - t0) / 1e6)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit("kagent --help failed")
    return out


def main():
    kagent = os.path.abspath(sys.argv[1])
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    for name, f in (("cli_first_byte", first_byte_ms), ("cli_help", help_ms)):
        xs = f(kagent, runs)
        for p in (50, 99):
            print("BENCH name=%s_p%d value=%.2f unit=ms" % (name, p, pct(xs, p)))


main()
