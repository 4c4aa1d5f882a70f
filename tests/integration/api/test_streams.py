#!/usr/bin/python3
"""Flow control and stream ends against a real node, with a real gRPC client.

Usage: test_streams.py API_HOST:PORT STUB_DIR TEMPLATE_NAME KAGENTD_PID

1. Eight 60 MiB downloads that are opened and never read: kagentd's RSS grows by less than
   RSS_BOUND_MB, and the node still serves other calls meanwhile; then one of them is read
   fully and its content checked.
2. Streams whose sandbox is deleted mid-stream (a followed output, an unread download) end
   with an error instead of hanging.
3. BENCH lines: 64 MiB upload and download throughput on loopback, the guest's RSS after.
4. The guest's memory through 1 and 3 (a 64 MiB upload and download, then the eight 60 MiB
   downloads): its peak RSS stays within GUEST_PEAK_MB of its idle RSS, and once the channel
   is quiet its RSS and PSS come back to within GUEST_AFTER_MB of idle.
"""
import hashlib
import os
import sys
import time
import urllib.request

sys.path.insert(0, sys.argv[2])
import grpc  # noqa: E402
from ateenv.v1alpha import guest_pb2, guest_pb2_grpc  # noqa: E402
from kagent.api.v1 import common_pb2, sandboxes_pb2, sandboxes_pb2_grpc  # noqa: E402

target, template, node_pid = sys.argv[1], sys.argv[3], int(sys.argv[4])
RSS_BOUND_MB = 64  # growth allowed for eight unread 60 MiB downloads (each ~60 MiB unbounded)
GUEST_PEAK_MB = 12  # the guest's channel buffers: a 4 MiB write frame, ~2 MiB of queued reads
GUEST_AFTER_MB = 1  # what a quiet guest may keep of them
MIB = 1 << 20
chan = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 8 * MIB)])
ALICE = (("x-user-id", "alice@example.com"),)
sbx = sandboxes_pb2_grpc.SandboxServiceStub(chan)
proc = guest_pb2_grpc.ProcessServiceStub(chan)
fs = guest_pb2_grpc.FileSystemServiceStub(chan)
# A channel whose receive window never grows (no BDP probes: HTTP/2's 64 KiB): a download nobody
# reads stays unread on it. On `chan` gRPC's window follows its bandwidth estimate and, on a fast
# moment of the host, took a whole 16 MiB file within half a second: the download then ended
# complete instead of cut by the delete (CI, 2026-12-07 16:04 UTC).
still = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 8 * MIB),
                                               ("grpc.http2.bdp_probe", 0)])
still_fs = guest_pb2_grpc.FileSystemServiceStub(still)


def status_kb(pid, key, name="status"):
    with open(f"/proc/{pid}/{name}") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {key} for {pid}")


def rss_kb(pid):
    return status_kb(pid, "VmRSS")


def pss_kb(pid):
    return status_kb(pid, "Pss", "smaps_rollup")


def guest_idle(g):
    """The guest's RSS and PSS, and its peak reset (clear_refs 5) for what follows."""
    rss, pss = rss_kb(g), pss_kb(g)
    with open(f"/proc/{g}/clear_refs", "w") as f:
        f.write("5")
    return rss, pss


def check_guest_memory(g, idle):
    """Peak within GUEST_PEAK_MB of idle; back within GUEST_AFTER_MB of idle once quiet."""
    peak = status_kb(g, "VmHWM")
    print(f"BENCH name=guest_peak_rss_over_idle value={(peak - idle[0]) / 1024:.1f} unit=MB")
    assert peak - idle[0] <= GUEST_PEAK_MB * 1024, f"guest peak RSS {peak} KB, idle {idle[0]} KB"
    deadline = time.monotonic() + 10
    while True:
        rss, pss = rss_kb(g), pss_kb(g)
        if rss - idle[0] <= GUEST_AFTER_MB * 1024 and pss - idle[1] <= GUEST_AFTER_MB * 1024:
            break
        assert time.monotonic() < deadline, \
            f"the guest kept its buffers: RSS {rss} KB / PSS {pss} KB, idle {idle[0]} / {idle[1]} KB"
        time.sleep(0.1)
    print(f"BENCH name=guest_rss_after_over_idle value={(rss - idle[0]) / 1024:.1f} unit=MB")


def guest_pids():
    """Host pids of the sandbox guests (children of kagentd running the guest binary)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            exe = os.readlink(f"/proc/{d}/exe")
        except OSError:
            continue
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        if ppid == node_pid and "guest" in os.path.basename(exe):
            out.append(int(d))
    return out


def create(request_id):
    ref = common_pb2.ResourceReference(namespace="kagent", name=template)
    return sbx.CreateSandbox(sandboxes_pb2.CreateSandboxRequest(
        sandbox_template=ref, request_id=request_id), metadata=ALICE).sandbox.id


def md(sid):
    return ALICE + (("kagent-sandbox-id", sid),)


def upload(sid, path, data):
    step = 4 * MIB - 1024
    msgs = (guest_pb2.WriteFileRequest(path=path if i == 0 else "", chunk=data[i:i + step])
            for i in range(0, len(data), step))
    n = fs.WriteFile(msgs, metadata=md(sid), timeout=120).bytes_written
    assert n == len(data), n


def download(sid, path):
    return b"".join(c.chunk for c in fs.ReadFile(guest_pb2.ReadFileRequest(path=path),
                                                  metadata=md(sid), timeout=120))


def echo(sid, text):
    p = proc.StartProcess(guest_pb2.StartProcessRequest(command=["echo", text]),
                          metadata=md(sid), timeout=30).process
    out = b"".join(o.stdout for o in proc.StreamProcessOutput(
        guest_pb2.StreamProcessOutputRequest(process_id=p.process_id, follow=True),
        metadata=md(sid), timeout=30) if o.WhichOneof("output") == "stdout")
    assert out == text.encode() + b"\n", out


def bench(sid):
    data = os.urandom(64 * MIB)
    t = time.monotonic()
    upload(sid, "bench64", data)
    up = 64 / (time.monotonic() - t)
    t = time.monotonic()
    got = download(sid, "bench64")
    down = 64 / (time.monotonic() - t)
    assert got == data, "64 MiB round trip differs"
    print(f"BENCH upload_64mib_mb_s {up:.1f}")
    print(f"BENCH download_64mib_mb_s {down:.1f}")


def test_unread_downloads(sid):
    data = os.urandom(60 * MIB)
    upload(sid, "big60", data)
    want = hashlib.sha256(data).hexdigest()
    del data
    time.sleep(1)
    before = rss_kb(node_pid)
    calls = [fs.ReadFile(guest_pb2.ReadFileRequest(path="big60"), metadata=md(sid), timeout=300)
             for _ in range(8)]
    time.sleep(4)  # long enough for 8 x 60 MiB to pile up if nothing held them back
    echo(sid, "still serving")  # the sandbox and the node answer while they are open
    sbx.GetSandbox(sandboxes_pb2.GetSandboxRequest(sandbox_id=sid), metadata=ALICE, timeout=30)
    during = rss_kb(node_pid)
    grown_mb = (during - before) / 1024
    print(f"BENCH unread_8x60mib_rss_growth_mb {grown_mb:.1f}")
    assert grown_mb < RSS_BOUND_MB, f"kagentd grew {grown_mb:.1f} MB with 8 unread downloads"
    h = hashlib.sha256()
    n = 0
    for c in calls[0]:
        h.update(c.chunk)
        n += len(c.chunk)
    assert n == 60 * MIB and h.hexdigest() == want, (n, "content differs")
    for c in calls[1:]:
        c.cancel()
    for g in guest_pids():
        print(f"BENCH guest_rss_after_60mib_kb {rss_kb(g)}")


def expect_error(it, what):
    try:
        for _ in it:
            pass
    except grpc.RpcError as e:
        assert e.code() not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED), \
            f"{what}: {e.code()} {e.details()}"
        return e
    raise AssertionError(f"{what}: ended without an error")


def test_delete_mid_stream():
    sid = create("streams-del")
    p = proc.StartProcess(guest_pb2.StartProcessRequest(
        command=["sh", "-c", "while true; do echo tick; sleep 0.05; done"]),
        metadata=md(sid), timeout=30).process
    follow = proc.StreamProcessOutput(guest_pb2.StreamProcessOutputRequest(
        process_id=p.process_id, follow=True), metadata=md(sid), timeout=60)
    assert next(follow).WhichOneof("output") == "stdout"
    upload(sid, "big", os.urandom(16 * MIB))
    unread = still_fs.ReadFile(guest_pb2.ReadFileRequest(path="big"), metadata=md(sid),
                               timeout=60)
    time.sleep(0.5)
    t = time.monotonic()
    sbx.DeleteSandbox(sandboxes_pb2.DeleteSandboxRequest(sandbox_id=sid), metadata=ALICE,
                      timeout=60)
    e1 = expect_error(follow, "followed output of a deleted sandbox")
    e2 = expect_error(unread, "unread download of a deleted sandbox")
    took = time.monotonic() - t
    print(f"deleted mid-stream: {e1.code()} {e1.details()!r}; {e2.code()} {e2.details()!r}"
          f" within {took:.2f} s")
    assert took < 30, took


def test_metrics():
    text = urllib.request.urlopen(f"http://{target}/metrics", timeout=10).read().decode()
    vals = {ln.split()[0]: int(ln.split()[1]) for ln in text.splitlines()
            if ln.startswith(("kagent_guest_frames", "kagent_guest_protocol"))}
    assert vals["kagent_guest_frames_total"] > 0, vals
    assert vals["kagent_guest_protocol_violations_total"] == 0, vals  # a well-behaved guest


def main():
    sid = create("streams-1")
    (g,) = guest_pids()
    echo(sid, "warm")  # the guest's first call, before its idle figures
    idle = guest_idle(g)
    bench(sid)
    test_unread_downloads(sid)
    check_guest_memory(g, idle)
    test_delete_mid_stream()
    test_metrics()
    sbx.DeleteSandbox(sandboxes_pb2.DeleteSandboxRequest(sandbox_id=sid), metadata=ALICE)
    print("test_streams: ok")


main()
