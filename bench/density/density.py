#!/usr/bin/env python3
"""Idle sandboxes on one node, created and deleted through the real `kagent` CLI.

  density.py KAGENT API_URL NODE_PID STATE_DIR N

Creates N sandboxes (`kagent sandbox create scratch ... -o json`, which returns once the sandbox
is READY) with DENSITY_PARALLEL CLI processes at a time (default 8), printing progress, and
measures them idle at each checkpoint (DENSITY_CHECKPOINTS, default "1000", and N) without
deleting in between; then deletes them all (as many CLI processes at a time) and checks that they
are gone. Creation stops early, and the figures are taken at the count reached, when a create
fails (its error is printed), when the host's MemAvailable would go under DENSITY_MEM_FLOOR_MB
(default 3072), when the host's tasks come within DENSITY_PID_HEADROOM (default 2000) of
kernel.pid_max (the machine is shared: neither the OOM killer nor a fork failure may hit it), or
on SIGUSR1 (a time limit: `kill -USR1 <density.py pid>`).
Figures per sandbox (deltas over the count, divided by it):
  - node RSS growth (kagentd's VmRSS), guest PSS (each guest's smaps_rollup Pss);
  - host memory: the MemAvailable drop, and where it goes (/proc/meminfo: Slab, PageTables,
    KernelStack, Percpu, Buffers, Shmem, AnonPages, Cached; the largest /proc/slabinfo caches);
  - the creation rate (sandboxes/s) and create p50/p99;
  - what each holds that a count limit applies to: kagentd's fds and threads, processes, kernel
    threads (each volume's jbd2 and ext4 rescuer), the host's tasks (pid_max counts them all),
    mounts, loop devices, cgroups, host disk.
Prints a table and BENCH lines per checkpoint, then the limits that stop 1,000 and 10,000 idle
sandboxes. Exits 1 if fewer than N were reached (after deleting what was).
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

KB = 1024


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v.split()[0])
    return out


def slabinfo():
    """Bytes per slab cache (active objects x object size)."""
    out = {}
    with open("/proc/slabinfo") as f:
        for line in f.readlines()[2:]:
            p = line.split()
            out[p[0]] = int(p[1]) * int(p[3])
    return out


def status_kb(pid, key, name="status"):
    with open(f"/proc/{pid}/{name}") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    sys.exit(f"density: no {key} for {pid}")


def descendants(pid):
    kids = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        kids.setdefault(int(st[st.rindex(")") + 2:].split()[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def guests(node):
    out = []
    for p in descendants(node):
        try:
            if "guest" in os.readlink(f"/proc/{p}/exe"):
                out.append(p)
        except OSError:
            pass
    return out


def count_lines(path, word):
    with open(path) as f:
        return sum(word in line for line in f)


def loops(state):
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    return sum(state in line for line in out.splitlines())


def cgroups():
    n = 0
    for _root, dirs, _files in os.walk("/sys/fs/cgroup"):
        n += len(dirs)
    return n


def du_kb(path):
    """Host disk under path: -x, so the volumes' images count and their mounted contents not."""
    r = subprocess.run(["du", "-skx", path], capture_output=True, text=True)
    # du exits 1 also when a file it listed went away before its stat: the node empties and
    # recycles volumes while it walks; its total is still printed then
    if r.returncode not in (0, 1) or not r.stdout.split():
        sys.exit("du -skx %s failed: %s" % (path, r.stderr.strip()))
    return int(r.stdout.split()[0])


def tasks():
    """Every task (thread) on the host: what kernel.pid_max and threads-max apply to."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[1])


def snapshot(node, state):
    g = guests(node)
    return {
        "mem": meminfo(), "slab": slabinfo(),
        "node_rss": status_kb(node, "VmRSS"),
        "guest_pss": sum(status_kb(p, "Pss", "smaps_rollup") for p in g), "guests": len(g),
        "fds": len(os.listdir(f"/proc/{node}/fd")), "threads": status_kb(node, "Threads"),
        "procs": len(descendants(node)), "kthreads": len(descendants(2)), "tasks": tasks(),
        "mounts": count_lines("/proc/mounts", state),
        "loops": loops(state), "cgroups": cgroups(), "disk": du_kb(state),
    }


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int((len(xs) - 1) * p / 100))]


def sysctl(path):
    with open(path) as f:
        return int(f.read().split()[0])


def capacity(state):
    """The node config's pool capacities (the bench's copy of deploy/kagentd.example.yaml)."""
    with open(os.path.join(state, "kagentd.yaml")) as f:
        return sum(int(m.group(1)) for m in re.finditer(r"^\s+capacity:\s*(\d+)", f.read(), re.M))


def limits(node, state, per, n):
    """What would stop 1,000 and 10,000 idle sandboxes, from the per-sandbox figures."""
    with open(f"/proc/{node}/limits") as f:
        nofile = int(re.search(r"Max open files\s+(\d+)", f.read()).group(1))
    mem = meminfo()
    caps = [
        ("host memory (MemTotal; the larger of drop and attributable)", mem["MemTotal"] * KB,
         per["host_bytes"]),
        ("kagentd fds (RLIMIT_NOFILE)", nofile, per["fds"]),
        ("kernel pid_max (host tasks: guests, kernel threads)",
         sysctl("/proc/sys/kernel/pid_max"), per["tasks"]),
        ("threads-max", sysctl("/proc/sys/kernel/threads-max"), per["tasks"]),
        ("user namespaces (user.max_user_namespaces)",
         sysctl("/proc/sys/user/max_user_namespaces"), 1),
        ("mount namespaces (user.max_mnt_namespaces)",
         sysctl("/proc/sys/user/max_mnt_namespaces"), 1),
        ("mounts (fs.mount-max, per namespace)", sysctl("/proc/sys/fs/mount-max"),
         per["mounts"]),
        ("fs.file-max", sysctl("/proc/sys/fs/file-max"), per["fds"]),
        ("pools[].capacity (node config)", capacity(state), 1),
    ]
    print("\nlimits (per sandbox measured here at N=%d; max sandboxes = limit / per sandbox):" % n)
    for name, limit, each in caps:
        m = limit / each if each > 0 else float("inf")
        verdict = "ok" if m >= 10000 else ("stops 10,000" if m >= 1000 else "stops 1,000")
        print(f"  {name:<60} limit {limit:>14,} per {each:>12,.1f}  max {m:>14,.0f}  {verdict}")


def report(before, after, n, create_s, took):
    """The table and BENCH lines for n idle sandboxes (BENCH names end in _n<count>); returns
    the per-sandbox figures limits() needs."""
    d = {key: (after[key] - before[key]) / n for key in
         ("node_rss", "guest_pss", "fds", "threads", "procs", "kthreads", "tasks", "mounts",
          "loops", "cgroups", "disk")}
    mem = {key: (after["mem"][key] - before["mem"][key]) / n for key in after["mem"]}
    host = -mem["MemAvailable"]
    # What is surely the sandboxes' (their processes and the kernel's unreclaimable share): on a
    # shared machine the MemAvailable delta also carries everything else that ran meanwhile.
    owned = d["node_rss"] + d["guest_pss"] + mem["Slab"] + mem["PageTables"] + \
        mem["KernelStack"] + mem.get("Percpu", 0)
    print(f"\n{n} idle sandboxes through the CLI; per sandbox:")
    rows = [("node RSS growth", d["node_rss"], "KB"), ("guest PSS", d["guest_pss"], "KB"),
            ("host MemAvailable drop", host, "KB"),
            ("host attributable (node + guest + slab + page tables + stacks + percpu)", owned,
             "KB")]
    rows += [(f"  meminfo {key}", mem.get(key, 0), "KB") for key in
             ("AnonPages", "Shmem", "Cached", "Buffers", "Slab", "SUnreclaim", "SReclaimable",
              "PageTables", "KernelStack", "Percpu")]
    slab = sorted(((after["slab"].get(c, 0) - before["slab"].get(c, 0)) / n / KB, c)
                  for c in after["slab"])
    rows += [(f"  slab {c}", v, "KB") for v, c in reversed(slab[-8:])]
    rows += [("kagentd fds", d["fds"], ""), ("kagentd threads", d["threads"], ""),
             ("processes (the node's descendants)", d["procs"], ""),
             ("kernel threads", d["kthreads"], ""), ("host tasks (pid_max)", d["tasks"], ""),
             ("mounts", d["mounts"], ""), ("loop devices", d["loops"], ""),
             ("cgroups", d["cgroups"], ""), ("host disk (du -x of the state dir)", d["disk"], "KB")]
    for name, v, unit in rows:
        print(f"  {name:<44} {v:>10.1f} {unit}")
    print(f"  totals: node RSS {after['node_rss'] / KB:.0f} MB, MemAvailable "
          f"{after['mem']['MemAvailable'] / KB / KB:.1f} GiB (before {before['mem']['MemAvailable'] / KB / KB:.1f}), "
          f"host tasks {after['tasks']}, mounts {after['mounts']}, kagentd fds {after['fds']}")
    rate = n / create_s
    print(f"create: {rate:.1f} sandboxes/s, p50 {pct(took, 50) * 1e3:.1f} ms, "
          f"p99 {pct(took, 99) * 1e3:.1f} ms")
    for name, v, unit in (("node_rss_per_sandbox", d["node_rss"], "KB"),
                          ("guest_pss_per_sandbox", d["guest_pss"], "KB"),
                          ("host_mem_per_sandbox", host, "KB"),
                          ("host_attributable_per_sandbox", owned, "KB"),
                          ("slab_per_sandbox", mem["Slab"], "KB"),
                          ("pagetables_per_sandbox", mem["PageTables"], "KB"),
                          ("tasks_per_sandbox", d["tasks"], "tasks"),
                          ("create_rate", rate, "sandboxes/s"),
                          ("create_p50", pct(took, 50) * 1e3, "ms")):
        print(f"BENCH name=density_{name}_n{n} value={v:.2f} unit={unit}")
    return {"host_bytes": max(host, owned) * KB, "fds": d["fds"], "tasks": d["tasks"],
            "mounts": d["mounts"]}


class Creator:
    """Creates sandboxes par at a time until a count, a failure or a host floor stops it."""

    def __init__(self, cli, node, par):
        self.cli, self.node, self.par = cli, node, par
        self.floor_kb = int(os.environ.get("DENSITY_MEM_FLOOR_MB", "3072")) * KB
        self.pid_room = int(os.environ.get("DENSITY_PID_HEADROOM", "2000"))
        self.pid_max = sysctl("/proc/sys/kernel/pid_max")
        self.ids, self.took, self.stop, self.lock = [], [], None, threading.Lock()
        self.submitted, self.busy_s, self.last = 0, 0.0, time.monotonic()
        signal.signal(signal.SIGUSR1, self._usr1)

    def _usr1(self, _sig, _frame):
        """SIGUSR1: stop creating (a time limit); the count reached is measured and deleted."""
        self.stop = self.stop or "SIGUSR1 (stopped by the operator)"

    def _one(self, i):
        with self.lock:
            if self.stop:
                return
            avail = meminfo()["MemAvailable"]
            if avail < self.floor_kb:
                self.stop = (f"host MemAvailable {avail / KB:.0f} MB under the floor "
                             f"{self.floor_kb / KB:.0f} MB")
                return
            if tasks() > self.pid_max - self.pid_room:
                self.stop = f"host tasks {tasks()} within {self.pid_room} of pid_max {self.pid_max}"
                return
        t = time.monotonic()
        try:
            out = subprocess.run(self.cli + ["create", "scratch", "--request-id",
                                             f"density-{os.getpid()}-{i}", "--ttl", "24h", "-o",
                                             "json"], capture_output=True, text=True)
        except OSError as e:  # the CLI could not run: stop, and measure what was reached
            with self.lock:
                self.stop = self.stop or f"create {i}: {e}"
            return
        with self.lock:
            self.took.append(time.monotonic() - t)
            if out.returncode != 0:
                self.stop = self.stop or f"create {i} failed: {out.stderr.strip()}"
                return
            self.ids.append(json.loads(out.stdout)["id"])
            now = time.monotonic()
            if len(self.ids) % 500 == 0 or now - self.last > 30:
                self.last = now
                print(f"  {time.strftime('%H:%M:%S', time.gmtime())} {len(self.ids)} created, "
                      f"MemAvailable {meminfo()['MemAvailable'] / KB / KB:.1f} GiB, kagentd RSS "
                      f"{status_kb(self.node, 'VmRSS') / KB:.0f} MB, fds "
                      f"{len(os.listdir(f'/proc/{self.node}/fd'))}, host tasks {tasks()}, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)

    def until(self, count):
        """Creates up to count in all; returns the reason it stopped short, or None."""
        t0 = time.monotonic()
        with ThreadPoolExecutor(self.par) as pool:
            list(pool.map(self._one, range(self.submitted, count)))
        self.submitted = max(self.submitted, count)
        self.busy_s += time.monotonic() - t0
        return self.stop


def delete_all(cli, ids, par):
    """Deletes ids par at a time; returns the failures' messages."""
    def one(sid):
        out = subprocess.run(cli + ["delete", sid], capture_output=True, text=True)
        return None if out.returncode == 0 else f"delete {sid}: {out.stderr.strip()}"
    with ThreadPoolExecutor(par) as pool:
        return [e for e in pool.map(one, ids) if e]


def main():
    kagent, api, node, state, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], \
        int(sys.argv[5])
    par = int(os.environ.get("DENSITY_PARALLEL", "8"))
    marks = sorted({c for c in (int(x) for x in os.environ.get(
        "DENSITY_CHECKPOINTS", "1000").split(",") if x) if 0 < c < n} | {n})
    cli = [kagent, "--api-url", api, "sandbox"]
    subprocess.run(["sync"], check=True)
    before = snapshot(node, state)
    mk = Creator(cli, node, par)
    print(f"creating {n} sandboxes, {par} CLI processes at a time; measured at "
          f"{', '.join(map(str, marks))}", flush=True)
    per, reached = None, 0
    for mark in marks:
        stop = mk.until(mark)
        reached = len(mk.ids)
        if reached == 0:
            sys.exit(f"density: no sandbox created: {stop}")
        subprocess.run(["sync"], check=True)
        time.sleep(5)  # idle: the guests' and the node's startup work has settled
        after = snapshot(node, state)
        if after["guests"] - before["guests"] != reached:
            sys.exit(f"density: {after['guests'] - before['guests']} guests for {reached} sandboxes")
        per = report(before, after, reached, mk.busy_s, mk.took)
        if stop:
            print(f"\nSTOPPED at {reached} of {n}: {stop}")
            break
    print(f"BENCH name=density_max_sandboxes value={reached} unit=sandboxes")
    limits(node, state, per, reached)

    t0 = time.monotonic()
    failed = delete_all(cli, mk.ids, par)
    delete_s = time.monotonic() - t0
    for e in failed[:5]:
        print(f"density: {e}", file=sys.stderr)
    left = snapshot(node, state)
    print(f"\ndelete: {reached / delete_s:.1f} sandboxes/s ({par} at a time), "
          f"{len(failed)} failed")
    if failed:
        sys.exit(f"density: {len(failed)} deletes failed")
    for key in ("guests", "procs"):
        if left[key] > before[key]:
            sys.exit(f"density: after deleting all, {key} {left[key]} > {before[key]} before")
    print(f"after deleting all: {left['mounts'] - before['mounts']} mounts and "
          f"{left['loops'] - before['loops']} loop devices more than before (emptied volumes kept "
          f"for reuse; makerun_stop checks that the node's stop leaves none)")
    if reached < n:
        sys.exit(f"density: reached {reached} of {n}")


main()
