#!/usr/bin/env python3
"""Idle sandboxes on one node, created and deleted through the real `kagent` CLI.

  density.py KAGENT API_URL NODE_PID STATE_DIR N

Creates N sandboxes one after another (`kagent sandbox create scratch ... -o json`, which
returns once the sandbox is READY), lets them sit idle, measures, then deletes them all and
checks that they are gone. Figures per sandbox (deltas over the N, divided by N):
  - node RSS growth (kagentd's VmRSS), guest PSS (each guest's smaps_rollup Pss);
  - host memory: the MemAvailable drop, and where it goes (/proc/meminfo: Slab, PageTables,
    KernelStack, Buffers, Shmem, AnonPages, Cached; the largest /proc/slabinfo caches);
  - the creation rate (sandboxes/s) and create p50/p99;
  - what each holds that a count limit applies to: kagentd's fds and threads, mounts, loop
    devices, processes, cgroups, disk.
Prints a table and BENCH lines; then the limits that stop 1,000 and 10,000 idle sandboxes.
"""
import json
import os
import re
import subprocess
import sys
import time

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
    out = subprocess.run(["du", "-sk", path], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def snapshot(node, state):
    g = guests(node)
    return {
        "mem": meminfo(), "slab": slabinfo(),
        "node_rss": status_kb(node, "VmRSS"),
        "guest_pss": sum(status_kb(p, "Pss", "smaps_rollup") for p in g), "guests": len(g),
        "fds": len(os.listdir(f"/proc/{node}/fd")), "threads": status_kb(node, "Threads"),
        "procs": len(descendants(node)), "mounts": count_lines("/proc/mounts", state),
        "loops": loops(state), "cgroups": cgroups(), "disk": du_kb(state),
    }


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int((len(xs) - 1) * p / 100))]


def limits(node, per, n):
    """What would stop 1,000 and 10,000 idle sandboxes, from the per-sandbox figures."""
    with open(f"/proc/{node}/limits") as f:
        nofile = int(re.search(r"Max open files\s+(\d+)", f.read()).group(1))

    def sysctl(path):
        with open(path) as f:
            return int(f.read().split()[0])
    mem = meminfo()
    caps = [
        ("host memory (MemTotal; the larger of drop and attributable)", mem["MemTotal"] * KB,
         per["host_bytes"]),
        ("kagentd fds (RLIMIT_NOFILE)", nofile, per["fds"]),
        ("kernel pid_max", sysctl("/proc/sys/kernel/pid_max"), per["procs"]),
        ("threads-max", sysctl("/proc/sys/kernel/threads-max"), per["procs"]),
        ("user namespaces (user.max_user_namespaces)",
         sysctl("/proc/sys/user/max_user_namespaces"), 1),
        ("mount namespaces (user.max_mnt_namespaces)",
         sysctl("/proc/sys/user/max_mnt_namespaces"), 1),
        ("mounts (fs.mount-max, per namespace)", sysctl("/proc/sys/fs/mount-max"),
         per["mounts"]),
        ("fs.file-max", sysctl("/proc/sys/fs/file-max"), per["fds"]),
    ]
    print("\nlimits (per sandbox measured here at N=%d; max sandboxes = limit / per sandbox):" % n)
    for name, limit, each in caps:
        m = limit / each if each > 0 else float("inf")
        verdict = "ok" if m >= 10000 else ("stops 10,000" if m >= 1000 else "stops 1,000")
        print(f"  {name:<60} limit {limit:>14,} per {each:>12,.1f}  max {m:>14,.0f}  {verdict}")
    print("  pools[].capacity (node config, kagent-default): 1000 by default -> stops 10,000"
          " until raised")


def main():
    kagent, api, node, state, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], \
        int(sys.argv[5])
    k = [kagent, "--api-url", api, "sandbox"]
    subprocess.run(["sync"], check=True)
    before = snapshot(node, state)
    ids, took = [], []
    t0 = time.monotonic()
    for i in range(n):
        t = time.monotonic()
        out = subprocess.run(k + ["create", "scratch", "--request-id", f"density-{os.getpid()}-{i}",
                                  "-o", "json"], capture_output=True, text=True)
        took.append(time.monotonic() - t)
        if out.returncode != 0:
            sys.exit(f"density: create {i} failed: {out.stderr.strip()}")
        ids.append(json.loads(out.stdout)["id"])
    create_s = time.monotonic() - t0
    subprocess.run(["sync"], check=True)
    time.sleep(2)  # idle: the guests' and the node's startup work has settled
    after = snapshot(node, state)
    if after["guests"] - before["guests"] != n:
        sys.exit(f"density: {after['guests'] - before['guests']} guests for {n} sandboxes")
    t0 = time.monotonic()
    for sid in ids:
        subprocess.run(k + ["delete", sid], check=True, capture_output=True)
    delete_s = time.monotonic() - t0
    left = snapshot(node, state)

    d = {key: (after[key] - before[key]) / n for key in
         ("node_rss", "guest_pss", "fds", "threads", "procs", "mounts", "loops", "cgroups",
          "disk")}
    mem = {key: (after["mem"][key] - before["mem"][key]) / n for key in after["mem"]}
    host = -mem["MemAvailable"]
    # What is surely the sandboxes' (their processes and the kernel's unreclaimable share): on a
    # shared machine the MemAvailable delta also carries everything else that ran meanwhile.
    owned = d["node_rss"] + d["guest_pss"] + mem["Slab"] + mem["PageTables"] + mem["KernelStack"]
    print(f"{n} idle sandboxes through the CLI; per sandbox:")
    rows = [("node RSS growth", d["node_rss"], "KB"), ("guest PSS", d["guest_pss"], "KB"),
            ("host MemAvailable drop", host, "KB"),
            ("host attributable (node + guest + slab + page tables + stacks)", owned, "KB")]
    rows += [(f"  meminfo {key}", mem[key], "KB") for key in
             ("AnonPages", "Shmem", "Cached", "Buffers", "Slab", "SUnreclaim", "SReclaimable",
              "PageTables", "KernelStack")]
    slab = sorted(((after["slab"].get(c, 0) - before["slab"].get(c, 0)) / n / KB, c)
                  for c in after["slab"])
    rows += [(f"  slab {c}", v, "KB") for v, c in reversed(slab[-8:])]
    rows += [("kagentd fds", d["fds"], ""), ("kagentd threads", d["threads"], ""),
             ("processes", d["procs"], ""), ("mounts", d["mounts"], ""),
             ("loop devices", d["loops"], ""), ("cgroups", d["cgroups"], ""),
             ("disk (du of the state dir)", d["disk"], "KB")]
    for name, v, unit in rows:
        print(f"  {name:<44} {v:>10.1f} {unit}")
    rate = n / create_s
    print(f"create: {rate:.1f} sandboxes/s sequential, p50 {pct(took, 50) * 1e3:.1f} ms, "
          f"p99 {pct(took, 99) * 1e3:.1f} ms; delete: {n / delete_s:.1f} sandboxes/s")
    for key in ("guests", "procs"):
        if left[key] > before[key]:
            sys.exit(f"density: after deleting all, {key} {left[key]} > {before[key]} before")
    print(f"after deleting all: {left['mounts'] - before['mounts']} mounts and "
          f"{left['loops'] - before['loops']} loop devices more than before (emptied volumes kept "
          f"for reuse; makerun_stop checks that the node's stop leaves none)")
    per = {"host_bytes": max(host, owned) * KB, "fds": d["fds"], "procs": d["procs"],
           "mounts": d["mounts"]}
    print(f"BENCH name=density_node_rss_per_sandbox value={d['node_rss']:.1f} unit=KB")
    print(f"BENCH name=density_guest_pss_per_sandbox value={d['guest_pss']:.1f} unit=KB")
    print(f"BENCH name=density_host_mem_per_sandbox value={host:.1f} unit=KB")
    print(f"BENCH name=density_host_attributable_per_sandbox value={owned:.1f} unit=KB")
    print(f"BENCH name=density_slab_per_sandbox value={mem['Slab']:.1f} unit=KB")
    print(f"BENCH name=density_pagetables_per_sandbox value={mem['PageTables']:.1f} unit=KB")
    print(f"BENCH name=density_create_rate value={rate:.2f} unit=sandboxes/s")
    print(f"BENCH name=density_create_p50 value={pct(took, 50) * 1e3:.1f} unit=ms")
    limits(node, per, n)


main()
