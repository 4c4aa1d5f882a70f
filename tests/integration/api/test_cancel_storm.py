#!/usr/bin/python3
"""Streams cancelled at every moment of their life against a real node, with a real gRPC client.

Usage: test_cancel_storm.py API_HOST:PORT STUB_DIR TEMPLATE_NAME KAGENTD_PID

Each round opens, in one sandbox, every kind of stream the guest bridges serve (ReadFile,
StreamProcessOutput followed, Exec, WatchFiles, WriteFile, WriteProcessInput) and cancels each
after a random delay of 0-40 ms: before the stream opens, while a send is in flight, beside
the final frame, after it. A cancel that races the call's own end used the call's state after
it was freed (the "completed twice" abort of the ASan suite, 2026-12-07). Afterwards:
  - kagentd still runs, and every kind of call still works (contents checked);
  - no call is left open (kagent_grpc_calls_live drops to 0): none waits forever;
  - under ASan (the `make asan` suite) a use after free aborts the node, and a leaked call
    state fails its exit (LeakSanitizer), which the shell part checks.
"""
import hashlib
import os
import random
import sys
import threading
import time
import urllib.request

sys.path.insert(0, sys.argv[2])
import grpc  # noqa: E402
from ateenv.v1alpha import guest_pb2, guest_pb2_grpc  # noqa: E402
from kagent.api.v1 import common_pb2, process_pb2_grpc, sandboxes_pb2, sandboxes_pb2_grpc  # noqa: E402
from kagent.files.v1 import files_pb2, files_pb2_grpc  # noqa: E402

target, template, node_pid = sys.argv[1], sys.argv[3], int(sys.argv[4])
ROUNDS = 60
MIB = 1 << 20
ALICE = (("x-user-id", "alice@example.com"),)
chan = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 8 * MIB)])
sbx = sandboxes_pb2_grpc.SandboxServiceStub(chan)
proc = guest_pb2_grpc.ProcessServiceStub(chan)
fs = guest_pb2_grpc.FileSystemServiceStub(chan)
kproc = process_pb2_grpc.ProcessServiceStub(chan)
files = files_pb2_grpc.FilesServiceStub(chan)
rng = random.Random(int(os.environ.get("STORM_SEED", time.time_ns())))
outcomes = {}  # "OK" / "CANCELLED" / ...: how the streams ended (the storm must hit both)
tally = threading.Lock()


def note(code):
    with tally:
        outcomes[code] = outcomes.get(code, 0) + 1


def md(sid):
    return ALICE + (("kagent-sandbox-id", sid),)


def alive():
    try:
        os.kill(node_pid, 0)
    except ProcessLookupError:
        raise AssertionError("kagentd died during the storm (see its log)")


def consume(it):
    """Reads a stream until it ends; a cancelled or failed stream is what the storm expects."""
    try:
        for _ in it:
            pass
        note("OK")
    except grpc.RpcError as e:
        assert e.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "a stream hung until its deadline"
        note(e.code().name)


def cancel_later(call):
    time.sleep(rng.random() * 0.04)
    call.cancel()


def chunks(path, n, pause):
    """A WriteFile request stream that keeps writing (until the call is cancelled)."""
    for i in range(n):
        yield guest_pb2.WriteFileRequest(path=path if i == 0 else "", chunk=os.urandom(256 << 10))
        time.sleep(pause)


def inputs(pid):
    for _ in range(50):
        yield guest_pb2.WriteProcessInputRequest(process_id=pid, data=b"x" * 4096)
        time.sleep(0.002)


def storm_round(sid, cat_pid, r):
    m = md(sid)
    calls = [
        fs.ReadFile(guest_pb2.ReadFileRequest(path="blob"), metadata=m, timeout=60),
        fs.ReadFile(guest_pb2.ReadFileRequest(path="small"), metadata=m, timeout=60),
        proc.StreamProcessOutput(guest_pb2.StreamProcessOutputRequest(
            process_id=cat_pid, follow=True), metadata=m, timeout=60),
        kproc.Exec(guest_pb2.StartProcessRequest(command=["sh", "-c", "seq 1 20000"]),
                   metadata=m, timeout=60),
        kproc.Exec(guest_pb2.StartProcessRequest(command=["true"]), metadata=m, timeout=60),
        files.WatchFiles(files_pb2.WatchFilesRequest(path=""), metadata=m, timeout=60),
        fs.WriteFile.future(chunks(f"up{r % 4}", 40, 0.001), metadata=m, timeout=60),
        proc.WriteProcessInput.future(inputs(cat_pid), metadata=m, timeout=60),
    ]
    threads = [threading.Thread(target=cancel_later, args=(c,)) for c in calls]
    threads += [threading.Thread(target=consume, args=(c,)) for c in calls[:6]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a storm thread did not end within 60 s"
    for f in calls[6:]:  # the uploads: cancelled, or done before the cancel came
        try:
            f.result()
            note("OK")
        except grpc.RpcError as e:
            assert e.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "an upload hung"
            note(e.code().name)
        except grpc.FutureCancelledError:
            note("CANCELLED")


def upload(sid, path, data):
    step = 4 * MIB - 1024
    msgs = (guest_pb2.WriteFileRequest(path=path if i == 0 else "", chunk=data[i:i + step])
            for i in range(0, len(data), step))
    assert fs.WriteFile(msgs, metadata=md(sid), timeout=60).bytes_written == len(data)


def download(sid, path):
    return b"".join(c.chunk for c in fs.ReadFile(guest_pb2.ReadFileRequest(path=path),
                                                  metadata=md(sid), timeout=60))


def calls_live():
    text = urllib.request.urlopen(f"http://{target}/metrics", timeout=10).read().decode()
    (v,) = [ln.split()[1] for ln in text.splitlines() if ln.startswith("kagent_grpc_calls_live ")]
    return int(v)


def main():
    ref = common_pb2.ResourceReference(namespace="kagent", name=template)
    sid = sbx.CreateSandbox(sandboxes_pb2.CreateSandboxRequest(
        sandbox_template=ref, request_id="storm"), metadata=ALICE, timeout=60).sandbox.id
    blob = os.urandom(3 * MIB)
    upload(sid, "blob", blob)
    upload(sid, "small", b"tiny\n")
    cat = proc.StartProcess(guest_pb2.StartProcessRequest(command=["cat"]), metadata=md(sid),
                            timeout=30).process.process_id
    t = time.monotonic()
    for r in range(ROUNDS):
        storm_round(sid, cat, r)
        alive()
    took = time.monotonic() - t
    print(f"storm: {ROUNDS} rounds of 8 cancelled streams in {took:.1f} s, ended: {outcomes}")
    assert outcomes.get("OK", 0) >= ROUNDS and outcomes.get("CANCELLED", 0) >= ROUNDS, \
        "the cancels did not land both before and after the streams' ends"

    # every kind of call still works, with the right contents
    assert hashlib.sha256(download(sid, "blob")).digest() == hashlib.sha256(blob).digest()
    data = os.urandom(5 * MIB)
    upload(sid, "after", data)
    assert download(sid, "after") == data, "an upload after the storm differs"
    out = b"".join(x.stdout for x in kproc.Exec(
        guest_pb2.StartProcessRequest(command=["echo", "after the storm"]), metadata=md(sid),
        timeout=30) if x.WhichOneof("msg") == "stdout")
    assert out == b"after the storm\n", out
    deadline = time.monotonic() + 10
    while (n := calls_live()) != 0:
        assert time.monotonic() < deadline, f"{n} gRPC calls still open 10 s after the storm"
        time.sleep(0.1)
    sbx.DeleteSandbox(sandboxes_pb2.DeleteSandboxRequest(sandbox_id=sid), metadata=ALICE,
                      timeout=60)
    print("test_cancel_storm: ok")


main()
