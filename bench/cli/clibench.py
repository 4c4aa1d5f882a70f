#!/usr/bin/env python3
"""Timings of the real kagent process, spawned with posix_spawn and timed from here (no shell,
no `date` process inside the interval). Every figure is p50 and p99 in ms, one BENCH line each;
with PEER (another kagent binary, e.g. one built on gRPC core) runs alternate between the two
and the BENCH lines carry the peer's figure.

  clibench.py start KAGENT [PEER]        first byte on the wire; `kagent --help` (no node)
  clibench.py exec  KAGENT URL ID [PEER] `kagent sandbox exec ID -- true`, spawn to exit
  clibench.py create KAGENT URL TEMPLATE [PEER]   create -> READY (delete after, untimed)

first_byte: a loopback listener timestamps the first byte the CLI writes for
`kagent sandbox list`, from just before posix_spawn (then closes the connection);
first_byte_tls: the same with https:// (the first byte is the TLS ClientHello), system roots.
RUNS (default 200) sets the number of runs per binary; PEER_NAME (default kagent-grpc-core)
names the peer in the BENCH lines (e.g. kagent-main for main's CLI).
"""
import json
import os
import socket
import subprocess
import sys
import time


PEER_NAME = os.environ.get("PEER_NAME", "kagent-grpc-core")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int((len(xs) - 1) * p / 100))]


# The system's CA roots as on a machine that does not set SSL_CERT_FILE/SSL_CERT_DIR (then the
# bundle file is parsed whole, ~200 ms, by OpenSSL and gRPC core alike).
TLS_ENV = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}


def spawn(argv, env=None):
    null = os.open(os.devnull, os.O_RDWR)
    acts = [(os.POSIX_SPAWN_DUP2, null, 1), (os.POSIX_SPAWN_DUP2, null, 2)]
    pid = os.posix_spawn(argv[0], argv, env or os.environ, file_actions=acts)
    os.close(null)
    return pid


def timed(argv):
    t0 = time.monotonic_ns()
    _, status = os.waitpid(spawn(argv), 0)
    ms = (time.monotonic_ns() - t0) / 1e6
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("failed: %s" % " ".join(argv))
    return ms


def first_byte(kagent, ls, url):
    t0 = time.monotonic_ns()
    pid = spawn([kagent, "--api-url", url, "--timeout", "5s", "sandbox", "list"],
                TLS_ENV if url.startswith("https:") else None)
    c, _ = ls.accept()
    if not c.recv(1):
        sys.exit("kagent closed the connection without writing")
    ms = (time.monotonic_ns() - t0) / 1e6
    c.close()
    os.waitpid(pid, 0)
    return ms


def create_ms(kagent, url, template, key):
    t0 = time.monotonic_ns()
    out = subprocess.run([kagent, "--api-url", url, "sandbox", "create", template,
                          "--request-id", "clibench-%d-%s" % (os.getpid(), key), "-o", "json"],
                         capture_output=True, check=True).stdout
    ms = (time.monotonic_ns() - t0) / 1e6
    sid = json.loads(out)["id"]
    subprocess.run([kagent, "--api-url", url, "sandbox", "delete", sid], capture_output=True,
                   check=True)
    return ms


def report(name, ours, peer):
    for p in (50, 99):
        line = "BENCH name=%s_p%d value=%.2f unit=ms" % (name, p, pct(ours, p))
        if peer:
            v = pct(peer, p)
            line += " peer=%s peer_value=%.2f ratio=%.2f" % (PEER_NAME, v, v / pct(ours, p))
        print(line)


def main():
    mode, kagent = sys.argv[1], os.path.abspath(sys.argv[2])
    args = sys.argv[3:]
    runs = int(os.environ.get("RUNS", "200"))
    need = {"start": 0, "exec": 2, "create": 2}[mode]
    peer = os.path.abspath(args[need]) if len(args) > need else None
    bins = [kagent] + ([peer] if peer else [])
    res = {b: {} for b in bins}
    if mode == "start":
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(16)
        url = "http://127.0.0.1:%d" % ls.getsockname()[1]
        tls = url.replace("http://", "https://")
        figures = {"cli_first_byte": lambda b, i: first_byte(b, ls, url),
                   "cli_first_byte_tls": lambda b, i: first_byte(b, ls, tls),  # the ClientHello
                   "cli_help": lambda b, i: timed([b, "--help"])}
    elif mode == "exec":
        url, sid = args[0], args[1]
        figures = {"cli_exec_true": lambda b, i: timed(
            [b, "--api-url", url, "sandbox", "exec", sid, "--", "true"])}
    else:
        url, template = args[0], args[1]
        figures = {"cli_create_ready": lambda b, i: create_ms(b, url, template,
                                                              "%d-%d" % (bins.index(b), i))}
    for name, f in figures.items():
        for i in range(runs):
            for b in bins:  # alternate, so both see the same load
                res[b].setdefault(name, []).append(f(b, i))
        report(name, res[kagent][name], res[peer][name] if peer else None)


main()
