#!/usr/bin/env python3
"""Create -> READY through the real kagent CLI, warm against cold, and a burst of 100, beside
bubblewrap in the same run (see run.sh).

  warmbench.py KAGENT URL CONFIG

CONFIG is the node's config path: its kagentd is found by it, so each burst starts from a quiet
node (no refills or teardowns of an earlier step running) and its CPU per create is printed.

Templates: `scratch` (pool kagent-default, warm: 2), `scratch-cold` (pool bench-cold,
warm: 0) and `scratch-deep` (pool bench-deep, warm: 100: the burst's depth), the same spec. Each round waits (untimed) until a warm sandbox is ready, then times a
warm create, a cold create and `bwrap ... true`; the sandboxes are deleted after (untimed). The
warm figure counts only if every one of its creates was a hit (kagent_warm_pool_hits_total).
The burst starts 100 CLI processes at once (spawned first, each held by a shell reading a pipe,
then released together by closing it); each one's latency runs from the release to its exit
(what a leaderboard's burst measures), all must answer READY. The bursts run
first, each once the node is quiet; the peer's burst is 100 `bwrap ... true` at once.
Then sustained creates: BENCH_SUSTAINED_WORKERS (8) CLI processes at a time, each creating one
sandbox after another for BENCH_SUSTAINED_SECONDS (10), cold and from the deep pool (its 100 warm
sandboxes, then cold creates as it runs dry), beside as many `bwrap ... true` for as long; then
a cold burst again (burst100_cold_after_sustained), on a node that has just made and deleted
every sandbox of the sustained steps.
BENCH_WARM_RUNS (default 100) sets the rounds.
"""
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

BWRAP = ["/usr/bin/bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
         "--unshare-all", "--die-with-parent", "true"]
BURST = 100


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int((len(xs) - 1) * p / 100))]


def metrics(url):
    return urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def depth(text, template):
    for line in text.splitlines():
        if line.startswith("kagent_warm_pool_depth{") and 'template="%s"' % template in line:
            return int(line.split()[-1])
    return 0


def kagentd_pid(config):
    for d in os.listdir("/proc"):
        try:
            argv = open("/proc/%s/cmdline" % d, "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        if argv[0].endswith(b"/kagentd") and config.encode() in argv:
            return int(d)
    sys.exit("no kagentd runs with --config %s" % config)


def cpu_ms(pid):
    """The process's user + system CPU so far, in ms (all its threads)."""
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


def host_cpu():
    """(busy, all) jiffies of every CPU so far (/proc/stat's first line; idle and iowait are
    not busy)."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)


def wait_quiet(pid, timeout=300):
    """Until kagentd used under 2% of a core over a second: the refills and teardowns of the
    step before are done, so a burst measures creates, not what is left of the last one."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        c0 = cpu_ms(pid)
        time.sleep(1)
        if cpu_ms(pid) - c0 < 20:
            return
    sys.exit("the node did not go quiet in %d s" % timeout)


def wait_depth(url, n, timeout=60, template="kagent/scratch"):
    until = time.monotonic() + timeout
    while depth(metrics(url), template) < n:
        if time.monotonic() > until:
            sys.exit("the warm pool did not reach %d in %d s" % (n, timeout))
        time.sleep(0.01)


def create(kagent, url, template, key):
    argv = [kagent, "--api-url", url, "sandbox", "create", template, "--request-id",
            "warmbench-%d-%s" % (os.getpid(), key), "-o", "json"]
    t0 = time.monotonic_ns()
    out = subprocess.run(argv, capture_output=True, check=True).stdout
    ms = (time.monotonic_ns() - t0) / 1e6
    s = json.loads(out)
    if s["state"] != "RUNTIME_STATE_READY":
        sys.exit("create answered %s" % s["state"])
    return ms, s["id"]


def delete(kagent, url, ids):
    for sid in ids:
        subprocess.run([kagent, "--api-url", url, "sandbox", "delete", sid], capture_output=True,
                       check=True)


def spawn(argv, out_fd, gate):
    """Starts argv behind a gate: a shell that execs it once gate's write end is closed, so
    every process of a burst starts at once, not at the pace of one parent's spawning."""
    null = os.open(os.devnull, os.O_RDWR)
    acts = [(os.POSIX_SPAWN_DUP2, gate, 0), (os.POSIX_SPAWN_DUP2, out_fd, 1),
            (os.POSIX_SPAWN_DUP2, null, 2)]
    sh = ["/bin/sh", "-c", 'read _ || true; exec "$0" "$@" </dev/null'] + argv
    pid = os.posix_spawn(sh[0], sh, os.environ, file_actions=acts)
    os.close(null)
    return pid


def bwrap_ms():
    err = os.memfd_create("bwrap-err")
    t0 = time.monotonic_ns()
    pid = os.posix_spawn(BWRAP[0], BWRAP, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, err, 2)])
    _, st = os.waitpid(pid, 0)
    ms = (time.monotonic_ns() - t0) / 1e6
    os.lseek(err, 0, 0)
    why = os.read(err, 4096).decode(errors="replace")
    os.close(err)
    if os.waitstatus_to_exitcode(st) != 0:
        sys.exit("bwrap failed (%d): %s" % (os.waitstatus_to_exitcode(st), why))
    return ms


def burst(argvs, peer=False):
    """Starts every argv at once (each behind the same gate, released together): (latency ms
    from the release to each exit, outputs). A peer's failed processes are counted and said
    (bwrap can hit the host's namespace limits at 100 at once), not timed; any failure of ours
    ends the run."""
    files, pids = [], {}
    gate_r, gate_w = os.pipe()
    os.set_inheritable(gate_w, False)
    for i, argv in enumerate(argvs):
        f = os.memfd_create("out%d" % i)
        files.append(f)
        pids[spawn(argv, f, gate_r)] = i
    os.close(gate_r)
    time.sleep(0.5)  # every shell is waiting on the gate
    h0 = host_cpu()
    t0 = time.monotonic_ns()
    os.close(gate_w)
    lat, failed, cpu = [0.0] * len(argvs), [], 0.0
    while pids:
        pid, st, ru = os.wait4(-1, 0)
        i = pids.pop(pid)
        lat[i] = (time.monotonic_ns() - t0) / 1e6
        cpu += (ru.ru_utime + ru.ru_stime) * 1000
        if os.waitstatus_to_exitcode(st) != 0 and not peer:
            sys.exit("a burst process failed: %s" % " ".join(argvs[i][:6]))
        if os.waitstatus_to_exitcode(st) != 0:
            failed.append(i)
    h1 = host_cpu()
    if failed:
        print("# peer burst: %d of %d failed, timed over the rest" % (len(failed), len(argvs)),
              flush=True)
        lat = [x for i, x in enumerate(lat) if i not in failed]
    print("# burst: process CPU %.2f ms each (with its gate's shell); the host's CPUs %.0f%% busy"
          % (cpu / len(argvs), 100.0 * (h1[0] - h0[0]) / max(1, h1[1] - h0[1])), flush=True)
    outs = []
    for f in files:
        os.lseek(f, 0, 0)
        outs.append(os.read(f, 1 << 20))
        os.close(f)
    return lat, outs


def line(name, ours, peer_name, peer):
    r = "BENCH name=%s value=%.2f unit=ms" % (name, ours)
    if peer is not None:
        r += " peer=%s peer_value=%.2f ratio=%.2f" % (peer_name, peer, peer / ours)
    print(r, flush=True)


def burst_creates(url, node, template, plat, tag=None):
    """One burst of creates of template from a quiet node, its BENCH lines (burst100_<tag>_p50,
    _p99; the tag defaults to the pool's kind), then its deletes."""
    tag = tag or {"scratch": "warm", "scratch-cold": "cold", "scratch-deep": "deep"}[template]
    wait_depth(url, 2)
    if template == "scratch-deep":
        wait_depth(url, BURST, 600, "kagent/scratch-deep")
    wait_quiet(node)
    hits0 = metric(metrics(url), "kagent_warm_pool_hits_total")
    argvs = [[KAGENT, "--api-url", url, "sandbox", "create", template, "--request-id",
              "warmbench-%d-burst-%s-%s-%d" % (os.getpid(), template, tag, i), "-o", "json"]
             for i in range(BURST)]
    c0 = cpu_ms(node)
    lat, outs = burst(argvs)
    print("# burst %s: kagentd CPU %.2f ms per create" % (template, (cpu_ms(node) - c0) / BURST),
          flush=True)
    recs = [json.loads(o) for o in outs]
    if any(r["state"] != "RUNTIME_STATE_READY" for r in recs):
        sys.exit("a burst create did not answer READY")
    hits = metric(metrics(url), "kagent_warm_pool_hits_total") - hits0
    if template == "scratch-deep" and hits != BURST:
        sys.exit("only %d of the deep pool's %d burst creates were served warm" % (hits, BURST))
    print("# burst %s: %d of %d creates served warm" % (template, hits, BURST), flush=True)
    for p in (50, 99):
        line("burst%d_%s_p%d" % (BURST, tag, p), pct(lat, p), "bwrap_burst%d" % BURST,
             pct(plat, p))
    delete(KAGENT, url, [r["id"] for r in recs])


def sustained(workers, seconds, argv_of, peer=False):
    """workers threads each run argv_of(i) (i counts across threads), one after another, until
    seconds pass: (completions per second, outputs). Any failure of ours ends the run; a peer's
    are counted and said (bwrap's recursive bind of / fails when a mount under it changes)."""
    outs, lock, n = [], threading.Lock(), [0]
    until = time.monotonic() + seconds
    failed = []

    def loop():
        while time.monotonic() < until and (peer or not failed):
            with lock:
                i = n[0]
                n[0] += 1
            r = subprocess.run(argv_of(i), capture_output=True)
            with lock:
                if r.returncode != 0:
                    failed.append(r.stderr.decode(errors="replace"))
                else:
                    outs.append(r.stdout)

    t0 = time.monotonic()
    threads = [threading.Thread(target=loop) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed and not peer:
        sys.exit("a sustained process failed: %s" % failed[0])
    if failed:
        print("# peer sustained: %d of %d failed (%s), not counted" %
              (len(failed), len(failed) + len(outs), failed[0].strip()), flush=True)
    return len(outs) / (time.monotonic() - t0), outs


def sustained_creates(url, node, template, peer_rate):
    """Creates of template by SUSTAINED_WORKERS CLI processes at a time for SUSTAINED_SECONDS,
    from a quiet node (the deep pool full): creates/s with the warm hits said, then deletes."""
    workers = int(os.environ.get("BENCH_SUSTAINED_WORKERS", "8"))
    seconds = float(os.environ.get("BENCH_SUSTAINED_SECONDS", "10"))
    if template == "scratch-deep":
        wait_depth(url, BURST, 600, "kagent/scratch-deep")
    wait_quiet(node)
    hits0 = metric(metrics(url), "kagent_warm_pool_hits_total")
    c0 = cpu_ms(node)
    rate, outs = sustained(workers, seconds, lambda i: [
        KAGENT, "--api-url", url, "sandbox", "create", template, "--request-id",
        "warmbench-%d-sust-%s-%d" % (os.getpid(), template, i), "-o", "json"])
    recs = [json.loads(o) for o in outs]
    if any(r["state"] != "RUNTIME_STATE_READY" for r in recs):
        sys.exit("a sustained create did not answer READY")
    hits = metric(metrics(url), "kagent_warm_pool_hits_total") - hits0
    tag = {"scratch-cold": "cold", "scratch-deep": "warm100"}[template]
    print("# sustained %s: %d creates by %d processes in %.0f s, %d served warm, kagentd CPU "
          "%.2f ms per create" % (tag, len(recs), workers, seconds, hits,
                                  (cpu_ms(node) - c0) / max(1, len(recs))), flush=True)
    print("BENCH name=sustained_creates_%s value=%.1f unit=creates/s peer=bwrap_true "
          "peer_value=%.1f ratio=%.2f" % (tag, rate, peer_rate, rate / peer_rate), flush=True)
    delete(KAGENT, url, [r["id"] for r in recs])


def main():
    global KAGENT
    KAGENT, url = os.path.abspath(sys.argv[1]), sys.argv[2]
    node = kagentd_pid(os.path.abspath(sys.argv[3]))
    runs = int(os.environ.get("BENCH_WARM_RUNS", "100"))
    warm, cold, peer, ids = [], [], [], []
    wait_depth(url, BURST, 600, "kagent/scratch-deep")  # its boots done before anything is timed
    wait_quiet(node)
    plat, _ = burst([BWRAP] * BURST, peer=True)
    prate, _ = sustained(int(os.environ.get("BENCH_SUSTAINED_WORKERS", "8")),
                         float(os.environ.get("BENCH_SUSTAINED_SECONDS", "10")),
                         lambda i: BWRAP, peer=True)
    print("# sustained bwrap true: %.1f /s" % prate, flush=True)
    for template in ("scratch-deep", "scratch", "scratch-cold"):
        burst_creates(url, node, template, plat)
    for template in ("scratch-cold", "scratch-deep"):
        sustained_creates(url, node, template, prate)
    # a cold burst again, on a node that has just made and deleted the sustained steps' ~2,500
    # sandboxes (what ext4 keeps of them for minutes is what a busy node's creates meet)
    burst_creates(url, node, "scratch-cold", plat, "cold_after_sustained")
    wait_quiet(node)
    t0 = time.monotonic()
    wait_depth(url, 1, 600)  # the pool refills once the sustained steps' sandboxes are gone
    print("# the default pool's first refill after the sustained steps: %.1f s" %
          (time.monotonic() - t0), flush=True)
    hits0 = metric(metrics(url), "kagent_warm_pool_hits_total")
    for i in range(runs):
        wait_depth(url, 1)
        ms, sid = create(KAGENT, url, "scratch", "w%d" % i)
        warm.append(ms)
        ids.append(sid)
        ms, sid = create(KAGENT, url, "scratch-cold", "c%d" % i)
        cold.append(ms)
        ids.append(sid)
        peer.append(bwrap_ms())
        delete(KAGENT, url, ids)
        ids = []
    hits = metric(metrics(url), "kagent_warm_pool_hits_total") - hits0
    if hits != runs:
        sys.exit("only %d of %d warm creates were served warm" % (hits, runs))
    for p in (50, 99):
        line("cli_create_warm_p%d" % p, pct(warm, p), "bwrap", pct(peer, p))
        line("cli_create_cold_p%d" % p, pct(cold, p), "bwrap", pct(peer, p))

main()
