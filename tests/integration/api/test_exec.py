#!/usr/bin/python3
"""kagent.api.v1.ProcessService/Exec with a real gRPC client (python3-grpcio) against a real node.

Usage: test_exec.py API_HOST:PORT STUB_DIR TEMPLATE_NAME KAGENTD_PID

Exec is StartProcess and a followed StreamProcessOutput in one call: Started, then stdout and
stderr, then Exit. Checked here: the message order and contents (stdout and stderr apart, each
in the order written), exit codes (a code, a signal, the request's process timeout), refusals
with StartProcess's very codes and messages (bad commands, cwd, env, sandbox ids, another
identity's sandbox, no identity, missing or duplicated kagent-sandbox-id), stdin through
WriteProcessInput, clients that cancel mid-stream or hit their deadline (the process runs on,
as after a cancelled output stream, and its output can be continued; 24 such calls in a row
leave no guest stream behind: a sandbox allows 16), and ten 6.6 MB outputs opened at once and
not read (kagentd's RSS grows by less than RSS_BOUND_MB: the streams' credit holds the rest
in the guest), then read fully and checked. Reflection lists the service.
"""
import sys
import time

sys.path.insert(0, sys.argv[2])
import grpc  # noqa: E402
from ateenv.v1alpha import guest_pb2, guest_pb2_grpc  # noqa: E402
from google.protobuf import duration_pb2  # noqa: E402
from kagent.api.v1 import common_pb2, process_pb2_grpc, sandboxes_pb2, sandboxes_pb2_grpc  # noqa: E402

target, template, node_pid = sys.argv[1], sys.argv[3], int(sys.argv[4])
MIB = 1 << 20
RSS_BOUND_MB = 40  # ten unread ~6.6 MB outputs: ~66 MB if the node took them unbounded
chan = grpc.insecure_channel(target)
ALICE = (("x-user-id", "alice@example.com"),)
BOB = (("x-user-id", "bob@example.com"),)
sbx = sandboxes_pb2_grpc.SandboxServiceStub(chan)
proc = guest_pb2_grpc.ProcessServiceStub(chan)
kproc = process_pb2_grpc.ProcessServiceStub(chan)
G = guest_pb2
EXITED = G.PROCESS_STATE_EXITED


def md(sid, who=ALICE):
    return who + (("kagent-sandbox-id", sid),)


def create(request_id):
    ref = common_pb2.ResourceReference(namespace="kagent", name=template)
    return sbx.CreateSandbox(sandboxes_pb2.CreateSandboxRequest(
        sandbox_template=ref, request_id=request_id), metadata=ALICE).sandbox.id


def exec_all(sid, req, metadata=None, timeout=60):
    """The messages of one Exec: (kinds in order, stdout, stderr, started, exit)."""
    kinds, out, err, started, exit_p = [], b"", b"", None, None
    for r in kproc.Exec(req, metadata=metadata or md(sid), timeout=timeout):
        k = r.WhichOneof("msg")
        kinds.append(k)
        if k == "started":
            started = r.started
        elif k == "stdout":
            out += r.stdout
        elif k == "stderr":
            err += r.stderr
        else:
            exit_p = r.exit
    return kinds, out, err, started, exit_p


def error_of(fn):
    """(code, details) of the call's failure, or None when it succeeds."""
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return None


def exec_error(req, metadata):
    return error_of(lambda: list(kproc.Exec(req, metadata=metadata, timeout=30)))


def start_error(req, metadata):
    return error_of(lambda: proc.StartProcess(req, metadata=metadata, timeout=30))


def wait_exit(sid, pid, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        p = proc.GetProcess(G.GetProcessRequest(process_id=pid), metadata=md(sid)).process
        if p.state == EXITED:
            return p
        assert time.monotonic() < deadline, f"process {pid} did not exit"
        time.sleep(0.05)


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_reflection():
    import kreflection_pb2 as R  # noqa
    import kreflection_pb2_grpc as RG  # noqa
    stub = RG.ServerReflectionStub(chan)
    names = {s.name for r in stub.ServerReflectionInfo(iter([R.ServerReflectionRequest(
        list_services="")])) for s in r.list_services_response.service}
    assert "kagent.api.v1.ProcessService" in names, names
    assert "ateenv.v1alpha.ProcessService" in names, names
    r = next(stub.ServerReflectionInfo(iter([R.ServerReflectionRequest(
        file_containing_symbol="kagent.api.v1.ProcessService")])))
    assert r.WhichOneof("message_response") == "file_descriptor_response", r
    assert any(b"kagent/api/v1/process.proto" in f
               for f in r.file_descriptor_response.file_descriptor_proto)
    print("ok: reflection lists kagent.api.v1.ProcessService")


def test_output_and_exit(sid):
    script = "for i in 1 2 3; do echo out$i; echo err$i >&2; done; seq 1 20000; exit 5"
    kinds, out, err, started, exit_p = exec_all(sid, G.StartProcessRequest(
        command=["sh", "-c", script], env={"A": "1"}))
    assert kinds[0] == "started" and kinds.count("started") == 1, kinds[:5]
    assert kinds[-1] == "exit" and kinds.count("exit") == 1, kinds[-5:]
    assert set(kinds[1:-1]) <= {"stdout", "stderr"}, kinds
    assert started.process_id and started.pid > 0, started
    assert started.state == G.PROCESS_STATE_RUNNING, started
    want = b"out1\nout2\nout3\n" + b"".join(b"%d\n" % i for i in range(1, 20001))
    assert out == want, (len(out), out[:40])
    assert err == b"err1\nerr2\nerr3\n", err
    assert exit_p.state == EXITED and exit_p.exit_code == 5, exit_p
    assert exit_p.process_id == started.process_id, (exit_p, started)
    assert list(exit_p.command) == ["sh", "-c", script], exit_p.command
    # the process is the ordinary kind: GetProcess knows it
    p = proc.GetProcess(G.GetProcessRequest(process_id=started.process_id),
                        metadata=md(sid)).process
    assert p.state == EXITED and p.exit_code == 5, p
    # env, cwd
    _, out, _, _, exit_p = exec_all(sid, G.StartProcessRequest(
        command=["sh", "-c", "echo $A; pwd"], env={"A": "x y"}, cwd="/tmp"))
    assert out == b"x y\n/tmp\n" and exit_p.exit_code == 0, (out, exit_p)
    print("ok: started, stdout and stderr apart and in order, exit 5")


def test_signals_and_timeout(sid):
    _, _, _, _, exit_p = exec_all(sid, G.StartProcessRequest(command=["sh", "-c", "kill -TERM $$"]))
    assert exit_p.exit_code == 128 + 15, exit_p
    t = time.monotonic()
    _, _, _, _, exit_p = exec_all(sid, G.StartProcessRequest(
        command=["sleep", "30"], timeout=duration_pb2.Duration(seconds=1)))
    assert exit_p.exit_code == 128 + 9, exit_p  # the process timeout: SIGKILL to its group
    assert time.monotonic() - t < 20
    print("ok: a signal's exit is 128+N; the request's timeout kills the process")


def test_refusals(sid):
    cases = [
        (G.StartProcessRequest(command=[]), md(sid)),
        (G.StartProcessRequest(command=[""]), md(sid)),
        (G.StartProcessRequest(command=["no-such-program-kagent"]), md(sid)),
        (G.StartProcessRequest(command=["true"], cwd="/no/such/dir"), md(sid)),
        (G.StartProcessRequest(command=["true"], cwd="x" * 2000), md(sid)),
        (G.StartProcessRequest(command=["true"], env={"A=B": "1"}), md(sid)),
        (G.StartProcessRequest(command=["true"], env={"": "1"}), md(sid)),
        (G.StartProcessRequest(command=["x" * (2 * MIB)]), md(sid)),
        (G.StartProcessRequest(command=["true"]), md(sid, BOB)),  # another identity's sandbox
        (G.StartProcessRequest(command=["true"]), md("0198c3f1-2a44-7c90-b5e1-9d8f3a7b2c04")),
        (G.StartProcessRequest(command=["true"]), md("not-a-uuid")),
        (G.StartProcessRequest(command=["true"]), ALICE),  # no kagent-sandbox-id
        (G.StartProcessRequest(command=["true"]), md(sid) + (("kagent-sandbox-id", sid),)),
        (G.StartProcessRequest(command=["true"]), (("kagent-sandbox-id", sid),)),  # no identity
    ]
    seen = set()
    for req, meta in cases:
        want = start_error(req, meta)
        got = exec_error(req, meta)
        assert want is not None, (req.command[:1], req.cwd[:20], "StartProcess succeeded")
        assert got == want, (req.command[:1][:20], req.cwd[:20], dict(req.env), meta, got, want)
        seen.add(got[0])
    assert seen >= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.UNAUTHENTICATED}, seen
    code, details = exec_error(G.StartProcessRequest(command=["true"]), ALICE)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, code
    assert details == "exactly one kagent-sandbox-id metadata value is required", details
    code, _ = exec_error(G.StartProcessRequest(command=["true"]), md(sid, BOB))
    assert code == grpc.StatusCode.NOT_FOUND, code
    print(f"ok: {len(cases)} refusals answer as StartProcess does")


def test_stdin(sid):
    it = kproc.Exec(G.StartProcessRequest(command=["sh", "-c", "cat; echo end"], stdin=True),
                    metadata=md(sid), timeout=30)
    first = next(it)
    assert first.WhichOneof("msg") == "started", first
    msgs = [G.WriteProcessInputRequest(process_id=first.started.process_id, data=b"hello\n"),
            G.WriteProcessInputRequest(close=True)]
    assert proc.WriteProcessInput(iter(msgs), metadata=md(sid)).bytes_written == 6
    rest = list(it)
    assert b"".join(r.stdout for r in rest) == b"hello\nend\n", rest
    assert rest[-1].WhichOneof("msg") == "exit" and rest[-1].exit.exit_code == 0, rest[-1]
    print("ok: stdin through WriteProcessInput with Started's process id")


def follow_rest(sid, pid, stdout_offset):
    """The rest of a process's output by StreamProcessOutput(follow), after killing it."""
    it = proc.StreamProcessOutput(G.StreamProcessOutputRequest(
        process_id=pid, stdout_offset=stdout_offset, follow=True), metadata=md(sid), timeout=30)
    out = b""
    for o in it:
        k = o.WhichOneof("output")
        if k == "stdout":
            out += o.stdout
            if out.endswith(b"second\n"):
                proc.SignalProcess(G.SignalProcessRequest(process_id=pid, signal=G.SIGNAL_KILL),
                                   metadata=md(sid))
        elif k == "exit":
            return out, o.exit
    raise AssertionError("the follow stream ended without the exit")


def test_cancel_and_deadline(sid):
    script = "echo first; sleep 2; echo second; exec sleep 1000"
    for i in range(24):  # a sandbox has 16 guest streams: a leaked one would refuse these
        it = kproc.Exec(G.StartProcessRequest(command=["sh", "-c", script]), metadata=md(sid),
                        timeout=60)
        first = next(it)
        assert first.WhichOneof("msg") == "started", first
        out = next(it)
        assert out.WhichOneof("msg") == "stdout" and out.stdout == b"first\n", out
        it.cancel()
        # the process runs on, as after a cancelled output stream, and its output continues
        pid = first.started.process_id
        p = proc.GetProcess(G.GetProcessRequest(process_id=pid), metadata=md(sid)).process
        assert p.state == G.PROCESS_STATE_RUNNING, p
        if i == 0:
            out, exit_p = follow_rest(sid, pid, len(b"first\n"))
            assert out == b"second\n" and exit_p.exit_code == 128 + 9, (out, exit_p)
        else:  # the guest runs 16 processes at most
            proc.SignalProcess(G.SignalProcessRequest(process_id=pid, signal=G.SIGNAL_KILL),
                               metadata=md(sid))
            assert wait_exit(sid, pid).exit_code == 128 + 9
    # the client's deadline ends the call, not the process
    it = kproc.Exec(G.StartProcessRequest(command=["sh", "-c", script]), metadata=md(sid),
                    timeout=1.0)
    first = next(it)
    try:
        for _ in it:
            pass
        raise AssertionError("no deadline")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (e.code(), e.details())
    pid = first.started.process_id
    p = proc.GetProcess(G.GetProcessRequest(process_id=pid), metadata=md(sid)).process
    assert p.state == G.PROCESS_STATE_RUNNING, p
    out, exit_p = follow_rest(sid, pid, len(b"first\n"))
    assert out == b"second\n" and exit_p.exit_code == 128 + 9, (out, exit_p)
    _, out, _, _, exit_p = exec_all(sid, G.StartProcessRequest(command=["echo", "still"]))
    assert out == b"still\n" and exit_p.exit_code == 0
    print("ok: 24 cancelled calls and a deadline: processes run on, output continues, "
          "no stream left")


def test_large_unread(sid):
    # a client without BDP probing keeps its HTTP/2 windows at their 64 KiB start, so what the
    # client does not read stays on the server's side: the node must hold it back in the guest
    lean = grpc.insecure_channel(target, options=[("grpc.http2.bdp_probe", 0)])
    lean_proc = process_pb2_grpc.ProcessServiceStub(lean)
    n = 10
    want = b"".join(b"%d\n" % i for i in range(1, 1000001))  # 6,888,897 bytes
    script = "seq 1 1000000; echo done >&2"
    exec_all(sid, G.StartProcessRequest(command=["true"]))  # the sandbox's first call is done
    before = rss_kb(node_pid)
    calls = [lean_proc.Exec(G.StartProcessRequest(command=["sh", "-c", script]),
                            metadata=md(sid), timeout=240) for _ in range(n)]
    pids = []
    for it in calls:
        first = next(it)
        assert first.WhichOneof("msg") == "started", first
        pids.append(first.started.process_id)
    for pid in pids:  # every output is whole in the guest's spools; nobody reads it
        assert wait_exit(sid, pid, 120).exit_code == 0
    # the peak over 2 s while the streams sit unread (sampling cannot make it fail by chance:
    # a node holding the outputs would hold them for the whole time)
    peak, end = 0, time.monotonic() + 2
    while time.monotonic() < end:
        peak = max(peak, rss_kb(node_pid))
        time.sleep(0.05)
    grown = (peak - before) / 1024
    print(f"BENCH name=exec_unread_rss_growth value={grown:.1f} unit=MB streams={n} "
          f"bytes_each={len(want)}")
    assert grown < RSS_BOUND_MB, f"kagentd grew {grown:.1f} MB with {n} unread exec streams"
    # a call meanwhile is served
    _, out, _, _, _ = exec_all(sid, G.StartProcessRequest(command=["echo", "served"]))
    assert out == b"served\n", out
    t = time.monotonic()
    for it in calls:
        out, err, last = b"", b"", None
        for r in it:
            k = r.WhichOneof("msg")
            if k == "stdout":
                out += r.stdout
            elif k == "stderr":
                err += r.stderr
            last = r
        assert out == want, (len(out), len(want))
        assert err == b"done\n", err
        assert last.WhichOneof("msg") == "exit" and last.exit.exit_code == 0, last
    secs = time.monotonic() - t
    print(f"BENCH name=exec_output_mb_s value={n * len(want) / MIB / secs:.1f} unit=MB/s")
    print(f"ok: {n} x {len(want)} bytes unread kept kagentd within {RSS_BOUND_MB} MB "
          f"(grew {grown:.1f} MB), then read whole")


test_reflection()
sid = create("exec-1")
test_output_and_exit(sid)
test_signals_and_timeout(sid)
test_refusals(sid)
test_stdin(sid)
test_cancel_and_deadline(sid)
test_large_unread(create("exec-2"))
print("PASS test_exec")
