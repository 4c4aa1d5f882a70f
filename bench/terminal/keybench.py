#!/usr/bin/env python3
"""Keystroke echo round trip through a pseudo terminal: one byte written to the master of a
local pty whose slave runs ARGV, timed until its echo comes back. With ARGV = kagent sandbox
exec -it ID -- cat the echo is the sandbox's terminal's (the byte goes CLI -> node -> guest ->
remote pty and back); with ARGV = cat it is the local kernel's (the floor).
Usage: keybench.py RUNS ARGV...   prints the p50 and p99 in ms."""
import os, pty, select, statistics, subprocess, sys, time

def wait_for(fd, want, timeout):
    buf, end = b"", time.monotonic() + timeout
    while want not in buf:
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise SystemExit(f"keybench: no echo of {want!r} within {timeout} s (got {buf[-200:]!r})")
        buf += os.read(fd, 65536)
    return buf

def main():
    runs, argv = int(sys.argv[1]), sys.argv[2:]
    m, s = pty.openpty()
    p = subprocess.Popen(argv, stdin=s, stdout=s, stderr=s, close_fds=True, start_new_session=True)
    os.close(s)
    try:
        os.write(m, b"r")
        wait_for(m, b"r", 30)  # the session is up
        samples = []
        for i in range(runs):
            if i % 100 == 99:  # keep the line short of the terminal's line limit
                os.write(m, b"\r")
                wait_for(m, b"\n", 10)
            t0 = time.perf_counter()
            os.write(m, b"k")
            wait_for(m, b"k", 10)
            samples.append((time.perf_counter() - t0) * 1000)
        os.write(m, b"\r\x04")
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(m)
    samples.sort()
    print(f"{statistics.median(samples):.3f} {samples[int(len(samples) * 0.99) - 1]:.3f}")

main()
