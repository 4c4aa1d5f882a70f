#!/usr/bin/env python3
"""Upload and download through the real `kagent` CLI, beside `cat FILE | cat > OUT` and `cp` of
the same file in the same run (the peers: what the machine's own pipes and page cache do), and
beside the sandbox's own file system: SIZE_MIB written in 1 MiB pwrites and read back by a
python3 in the sandbox (`sbx_write`, `sbx_read`, timed inside it: no exec round trip), the
most an upload or download can do, since the guest writes and reads that file the same way.

  xferbench.py KAGENT API_URL SANDBOX_ID WORKDIR SIZE_MIB RUNS NODE_PID

Each run times, spawn to exit (posix_spawn, no shell): `kagent sandbox upload`, `kagent sandbox
download` (whose fsync of the local file is part of what the user waits for), the cat pipe and
cp; runs alternate between them. The downloaded file is compared with the source after each run
(untimed). Prints a table, the CPU time a transfer costs (the CLI's, kagentd's and the guest's
together: the figure load on the machine does not inflate), the guest's peak and current RSS,
and BENCH lines (MB/s = 10^6 bytes/s, p50 over RUNS).
"""
import filecmp
import os
import subprocess
import sys
import time

# Run in the sandbox: the seconds a SIZE_MIB write (1 MiB pwrites, as the guest's upload
# chunks) of peer.bin and a read of xfer.bin take there.
SANDBOX_PEER = r"""
import os, sys, time
n, d = int(sys.argv[1]), os.urandom(1 << 20)
t0 = time.perf_counter()
fd = os.open("peer.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(n):
    os.pwrite(fd, d, i << 20)
os.close(fd)
t1 = time.perf_counter()
fd = os.open("xfer.bin", os.O_RDONLY)
while os.read(fd, 256 << 10):
    pass
os.close(fd)
print("sbx_peer", t1 - t0, time.perf_counter() - t1)
"""


def spawn(argv, stdin=None, stdout=None):
    null = os.open(os.devnull, os.O_RDWR)
    acts = [(os.POSIX_SPAWN_DUP2, stdin if stdin is not None else null, 0),
            (os.POSIX_SPAWN_DUP2, stdout if stdout is not None else null, 1),
            (os.POSIX_SPAWN_DUP2, null, 2)]
    pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=acts)
    os.close(null)
    return pid


CLK = os.sysconf("SC_CLK_TCK")


def reap(pid, what):
    """Waits for pid; its CPU seconds (user + system)."""
    _, status, ru = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"xferbench: {what} failed")
    return ru.ru_utime + ru.ru_stime


def proc_cpu(pids):
    """CPU seconds (user + system) the processes have used so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        fields = st[st.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK


def timed(argv, server=(), cpu=None):
    """Runs argv; its wall seconds. With cpu (a list), appends the CPU seconds of argv and of
    the server processes meanwhile."""
    s0 = proc_cpu(server)
    t0 = time.monotonic_ns()
    c = reap(spawn(argv), " ".join(argv))
    wall = (time.monotonic_ns() - t0) / 1e9
    if cpu is not None:
        cpu.append(c + proc_cpu(server) - s0)
    return wall


def cat_pipe(src, out):
    """`cat src | cat > out`: two processes and a pipe, as the shell would make them."""
    t0 = time.monotonic_ns()
    r, w = os.pipe()
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    a = spawn(["cat", src], stdout=w)
    b = spawn(["cat"], stdin=r, stdout=fd)
    for x in (r, w, fd):
        os.close(x)
    reap(a, "cat")
    reap(b, "cat")
    return (time.monotonic_ns() - t0) / 1e9


def status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    sys.exit(f"xferbench: no {key} for {pid}")


def guest_pid(node_pid, marker):
    """The host pid of the sandbox's guest: the child of kagentd running the guest binary whose
    workspace holds marker (a warm pool keeps other guests beside it)."""
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            exe = os.readlink(f"/proc/{d}/exe")
        except OSError:
            continue
        if int(st[st.rindex(")") + 2:].split()[1]) == node_pid and "guest" in exe and \
                os.path.exists(f"/proc/{d}/root/data/workspace/{marker}"):
            found.append(int(d))
    if len(found) != 1:
        sys.exit(f"xferbench: expected one guest with {marker} under kagentd {node_pid}, "
                 f"found {found}")
    return found[0]


def sandbox_peer(k, sid, size_mib):
    """The sandbox's own write and read seconds (SANDBOX_PEER through `kagent sandbox exec`)."""
    r = subprocess.run(k + ["exec", sid, "--", "python3", "-c", SANDBOX_PEER, str(size_mib)],
                       capture_output=True, text=True, check=True)
    for line in r.stdout.splitlines():
        if line.startswith("sbx_peer "):
            return [float(x) for x in line.split()[1:3]]
    sys.exit(f"xferbench: no sbx_peer line from the sandbox: {r.stdout!r}")


def p50(xs):
    xs = sorted(xs)
    return xs[(len(xs) - 1) // 2]


def main():
    kagent, api, sid, work, size_mib, runs, node_pid = sys.argv[1:8]
    size, runs = int(size_mib) << 20, int(runs)
    src, dl, out = (os.path.join(work, n) for n in ("src", "download", "out"))
    with open(src, "wb") as f:
        f.write(os.urandom(size))
    k = [kagent, "--api-url", api, "sandbox"]
    times = {n: [] for n in ("upload", "download", "cat_pipe", "cp", "sbx_write", "sbx_read")}
    cpu = {"upload": [], "download": []}
    timed(k + ["upload", sid, src, "warmup"])  # the guest's first allocations, untimed
    g = guest_pid(int(node_pid), "warmup")
    server = (int(node_pid), g)
    for _ in range(runs):
        times["upload"].append(timed(k + ["upload", sid, src, "xfer.bin"], server, cpu["upload"]))
        if os.path.exists(dl):
            os.unlink(dl)
        times["download"].append(
            timed(k + ["download", sid, "xfer.bin", dl], server, cpu["download"]))
        if not filecmp.cmp(src, dl, shallow=False):
            sys.exit("xferbench: the downloaded file differs from the uploaded one")
        for n, fn in (("cat_pipe", lambda: cat_pipe(src, out)),
                      ("cp", lambda: timed(["cp", src, out]))):
            if os.path.exists(out):
                os.unlink(out)
            times[n].append(fn())
        w, r = sandbox_peer(k, sid, size_mib)
        times["sbx_write"].append(w)
        times["sbx_read"].append(r)
    mbs = {n: size / 1e6 / p50(t) for n, t in times.items()}
    print(f"{'figure':<12} {'p50 MB/s':>10} {'p50 ms':>10}  ({runs} runs of {size_mib} MiB)")
    for n, t in times.items():
        print(f"{n:<12} {mbs[n]:>10.1f} {p50(t) * 1e3:>10.1f}")
    for op, c in cpu.items():
        print(f"{op} CPU (CLI + kagentd + guest) p50 {p50(c) * 1e3:.0f} ms")
    peak, now = status_kb(g, "VmHWM"), status_kb(g, "VmRSS")
    print(f"guest RSS: peak {peak} KB, after {now} KB")
    name = f"{size_mib}mib"
    for op, own in (("upload", "sbx_write"), ("download", "sbx_read")):
        for peer in ("cat_pipe", "cp", own):
            tail = "" if peer == "cat_pipe" else "_vs_cp" if peer == "cp" else "_vs_sandbox"
            print(f"BENCH name=transfer_{op}_{name}{tail} "
                  f"value={mbs[op]:.1f} unit=MB/s peer={peer} peer_value={mbs[peer]:.1f} "
                  f"ratio={mbs[op] / mbs[peer]:.3f}")
    for op, c in cpu.items():
        print(f"BENCH name=transfer_{op}_{name}_cpu value={p50(c) * 1e3:.0f} unit=ms")
    print(f"BENCH name=transfer_guest_peak_rss value={peak} unit=KB")
    print(f"BENCH name=transfer_guest_rss_after value={now} unit=KB")


main()
