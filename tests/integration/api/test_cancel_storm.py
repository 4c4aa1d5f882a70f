#!/usr/bin/python3
"""Streams cancelled at every moment of their life against a real node, with a real gRPC client.

Usage: test_cancel_storm.py API_HOST:PORT STUB_DIR TEMPLATE_NAME KAGENTD_PID

Each round opens, in one sandbox, every kind of stream the guest bridges serve (ReadFile,
StreamProcessOutput followed, Exec, WatchFiles, WriteFile, WriteProcessInput, a terminal
Session) and cancels each at a random moment: for a call that ends by itself, within twice its
uncancelled length measured first (so before it opens, while a send is in flight, beside its
final frame, after it); for one that does not, within 40 ms. A cancel that raced the call's
own end used the call's state after it was freed (the "completed twice" abort of the ASan
suite, 2026-12-07; this test reproduced it in 4 of 5 runs under ASan before the fix).
Afterwards:
  - kagentd still runs, and every kind of call still works (contents checked);
  - no call is left open (kagent_grpc_calls_live drops to 0): none waits forever;
  - under ASan (the `make asan` suite) a use after free aborts the node, and a leaked call
    state fails its exit (LeakSanitizer), which the shell part checks.
"""
import collections
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
from kagent.api.v1 import common_pb2, process_pb2_grpc, terminal_pb2  # noqa: E402
from kagent.api.v1 import terminal_pb2_grpc  # noqa: E402
from kagent.api.v1 import sandboxes_pb2, sandboxes_pb2_grpc  # noqa: E402
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
term = terminal_pb2_grpc.TerminalServiceStub(chan)
SEED = int(os.environ.get("STORM_SEED", time.time_ns()))  # printed: STORM_SEED=... replays
rng = random.Random(SEED)
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


def chunks(path, n, pause):
    """A WriteFile request stream that writes for a while (unless the call is cancelled)."""
    for i in range(n):
        yield guest_pb2.WriteFileRequest(path=path if i == 0 else "", chunk=os.urandom(256 << 10))
        time.sleep(pause)


def terminal_requests():
    """A pipe session's requests: a short program, a line of input, its end."""
    T = terminal_pb2
    yield T.TerminalRequest(start=T.TerminalStart(process=guest_pb2.StartProcessRequest(
        command=["sh", "-c", "read a; echo got $a; seq 1 2000"])))
    yield T.TerminalRequest(stdin=b"line\n")
    yield T.TerminalRequest(stdin_eof=True)


def inputs(pid):
    for _ in range(50):
        yield guest_pb2.WriteProcessInputRequest(process_id=pid, data=b"x" * 4096)
        time.sleep(0.002)


# Every kind of guest stream: opened by open(metadata, processes, round); ends: it ends by
# itself; unary_reply: a client stream (a future with one reply) rather than a server stream.
Kind = collections.namedtuple("Kind", "name open ends unary_reply")
KINDS = [
    Kind("read_blob", lambda m, ps, r: fs.ReadFile(
        guest_pb2.ReadFileRequest(path="blob"), metadata=m, timeout=60), True, False),
    Kind("read_small", lambda m, ps, r: fs.ReadFile(
        guest_pb2.ReadFileRequest(path="small"), metadata=m, timeout=60), True, False),
    Kind("follow_output", lambda m, ps, r: proc.StreamProcessOutput(
        guest_pb2.StreamProcessOutputRequest(process_id=ps["ticker"], follow=True), metadata=m,
        timeout=60), False, False),
    Kind("exec_seq", lambda m, ps, r: kproc.Exec(guest_pb2.StartProcessRequest(
        command=["sh", "-c", "seq 1 20000"]), metadata=m, timeout=60), True, False),
    Kind("exec_true", lambda m, ps, r: kproc.Exec(guest_pb2.StartProcessRequest(
        command=["true"]), metadata=m, timeout=60), True, False),
    Kind("watch", lambda m, ps, r: files.WatchFiles(
        files_pb2.WatchFilesRequest(path=""), metadata=m, timeout=60), False, False),
    Kind("write_file", lambda m, ps, r: fs.WriteFile.future(
        chunks(f"up{r % 4}", 20, 0.001), metadata=m, timeout=60), True, True),
    Kind("write_input", lambda m, ps, r: proc.WriteProcessInput.future(
        inputs(ps["sink"]), metadata=m, timeout=60), True, True),
    Kind("terminal", lambda m, ps, r: term.Session(
        terminal_requests(), metadata=m, timeout=60), True, False),
]


def finish(kind, call):
    """Waits for a call's end (reading a server stream's messages) and notes how it ended."""
    try:
        if kind.unary_reply:
            call.result()
        else:
            for _ in call:
                pass
        note("OK")
    except grpc.RpcError as e:
        assert e.code() != grpc.StatusCode.DEADLINE_EXCEEDED, f"{kind.name} hung until its deadline"
        note(e.code().name)
        if e.code() != grpc.StatusCode.CANCELLED:
            note(f"{kind.name}: {e.code().name} {e.details()}")
    except grpc.FutureCancelledError:
        note("CANCELLED")


def calibrate(sid, ps):
    """How long each kind takes here uncancelled, all at once as in a round (ASan is far
    slower)."""
    took = {}

    def timed(k, call):
        t = time.monotonic()
        finish(k, call)
        took[k.name] = time.monotonic() - t

    longest = {}
    for _ in range(3):  # the longest of three: one round can be quick by chance
        calls = [(k, k.open(md(sid), ps, 0)) for k in KINDS]
        threads = [threading.Thread(target=timed, args=kc) for kc in calls]
        for t in threads:
            t.start()
        for k, c in calls:
            if not k.ends:
                time.sleep(0.04)
                c.cancel()
        for t in threads:
            t.join(60)
        longest = {n: max(t, longest.get(n, 0)) for n, t in took.items()}
    outcomes.clear()
    return longest


def storm_round(sid, ps, r, took):
    """Opens every kind and cancels each at a random moment: for a kind that ends by itself,
    within twice its own length (so before, around and after its end); else within 40 ms."""
    calls = [(k, k.open(md(sid), ps, r),
              rng.uniform(0, 2 * took[k.name]) if k.ends else rng.uniform(0, 0.04))
             for k in KINDS]
    threads = [threading.Thread(target=lambda c=c, d=d: (time.sleep(d), c.cancel()))
               for _, c, d in calls]
    threads += [threading.Thread(target=finish, args=(k, c)) for k, c, _ in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a storm thread did not end within 60 s"


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
    ps = {}
    for name, cmd in (("ticker", "while :; do echo tick; sleep 0.01; done"),
                      ("sink", "cat >/dev/null")):
        ps[name] = proc.StartProcess(guest_pb2.StartProcessRequest(
            command=["sh", "-c", cmd], stdin=name == "sink"), metadata=md(sid),
            timeout=30).process.process_id
    took = calibrate(sid, ps)
    print(f"STORM_SEED={SEED}; uncancelled: "
          + ", ".join(f"{n} {t * 1000:.0f} ms" for n, t in took.items()))
    t = time.monotonic()
    for r in range(ROUNDS):
        storm_round(sid, ps, r, took)
        alive()
    took = time.monotonic() - t
    print(f"storm: {ROUNDS} rounds of {len(KINDS)} cancelled calls in {took:.1f} s, ended: "
          f"{outcomes}")
    assert min(outcomes.get("OK", 0), outcomes.get("CANCELLED", 0)) >= ROUNDS // 3, \
        "the cancels did not land both before and after the calls' ends"
    odd = [o for o in outcomes if ":" in o]
    assert not odd, f"calls failed otherwise than cancelled: {odd}"

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
