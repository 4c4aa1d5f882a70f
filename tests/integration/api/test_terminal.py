#!/usr/bin/python3
"""TerminalService/Session with a real gRPC client (python3-grpcio) against a real node.

Usage: test_terminal.py API_HOST:PORT STUB_DIR SANDBOX_ID

Bad first and later messages get INVALID_ARGUMENT with a clear message; stdout and stderr of a
pipe session stay apart and the exit code arrives; clients that vanish (20 sessions cancelled
right after Started) leave their processes hung up (exit 128+SIGHUP) and the node serving.
"""
import queue
import sys
import time

sys.path.insert(0, sys.argv[2])
import grpc  # noqa: E402
from ateenv.v1alpha import guest_pb2, guest_pb2_grpc  # noqa: E402
from kagent.api.v1 import terminal_pb2, terminal_pb2_grpc  # noqa: E402

target, sandbox = sys.argv[1], sys.argv[3]
MD = (("x-user-id", "admin@kagent.dev"), ("kagent-sandbox-id", sandbox))
chan = grpc.insecure_channel(target)
term = terminal_pb2_grpc.TerminalServiceStub(chan)
proc = guest_pb2_grpc.ProcessServiceStub(chan)
T = terminal_pb2


def session(first):
    """Opens a session: returns (queue to send on, response iterator)."""
    q = queue.Queue()
    q.put(first)

    def gen():
        while True:
            m = q.get()
            if m is None:
                return
            yield m

    return q, term.Session(gen(), metadata=MD, timeout=60)


def start(argv, tty=False):
    return T.TerminalRequest(start=T.TerminalStart(
        process=guest_pb2.StartProcessRequest(command=argv), tty=tty))


def expect_invalid(first, later, want):
    q, it = session(first)
    for m in later:
        q.put(m)
    try:
        for _ in it:
            pass
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (want, e.code(), e.details())
        assert want in e.details(), (want, e.details())
        q.put(None)
        return
    raise AssertionError(f"no error for {want!r}")


expect_invalid(T.TerminalRequest(stdin=b"x"), [], "first message must be a start")
expect_invalid(T.TerminalRequest(), [], "first message must be a start")
expect_invalid(start([]), [], "command")
expect_invalid(T.TerminalRequest(attach=T.TerminalAttach(process_id="zero")), [],
               "process_id must be the decimal id a process start returned")
expect_invalid(T.TerminalRequest(attach=T.TerminalAttach(process_id="1", stdout_offset=-1)), [],
               "nonnegative")
bad_later = [
    (T.TerminalRequest(resize=T.TerminalResize(rows=0, cols=80)), "rows and cols must be 1-65535"),
    (T.TerminalRequest(signal=guest_pb2.SIGNAL_UNSPECIFIED), "signal must be one of"),
    (start(["true"]), "starts or attaches once"),
]
for m, want in bad_later:
    expect_invalid(start(["sleep", "30"], tty=True), [m], want)
print("ok: bad messages refused with INVALID_ARGUMENT")

# a pipe session: stdout and stderr apart, stdin to EOF, the exit code
q, it = session(start(["sh", "-c", "read a; echo out:$a; echo err >&2; cat >/dev/null; exit 4"]))
q.put(T.TerminalRequest(stdin=b"hello\n"))
q.put(T.TerminalRequest(stdin_eof=True))
got = {"started": 0, "stdout": b"", "stderr": b"", "exit": None}
for r in it:
    kind = r.WhichOneof("msg")
    if kind == "started":
        got["started"] += 1
        assert r.started.pid > 0 and r.started.process_id
    elif kind in ("stdout", "stderr"):
        got[kind] += getattr(r, kind)
    else:
        got["exit"] = r.exit
q.put(None)
assert got["started"] == 1, got
assert got["stdout"] == b"out:hello\n" and got["stderr"] == b"err\n", got
assert got["exit"] is not None and got["exit"].exit_code == 4, got
print("ok: pipe session: stdout, stderr, exit code 4")

# clients that vanish: each session is cancelled right after Started; its process is hung up
pids = []
for i in range(20):
    q, it = session(start(["sleep", "1000"], tty=bool(i % 2)))
    try:
        first = next(it)
    except grpc.RpcError as e:
        raise AssertionError(f"session {i}: {e.code()} {e.details()}")
    assert first.WhichOneof("msg") == "started", first
    pids.append(first.started.process_id)
    it.cancel()
    q.put(None)
deadline = time.monotonic() + 20
for pid in pids:
    while True:
        p = proc.GetProcess(guest_pb2.GetProcessRequest(process_id=pid), metadata=MD).process
        if p.state == guest_pb2.PROCESS_STATE_EXITED:
            assert p.exit_code == 128 + 1, (pid, p.exit_code)  # SIGHUP
            break
        assert time.monotonic() < deadline, f"process {pid} still runs after its client left"
        time.sleep(0.05)
q, it = session(start(["true"]))
assert [r.WhichOneof("msg") for r in it][-1] == "exit"
q.put(None)
print("ok: 20 vanished clients: every process hung up (exit 129), the node still serves")
