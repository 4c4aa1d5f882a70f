#!/usr/bin/python3
"""The public gRPC API with a real gRPC client (Debian's python3-grpcio) against a real node.

Usage: test_api.py API_HOST:PORT STUB_DIR TEMPLATE_NAME
Covers reflection, the sandbox lifecycle (and pause), processes (start, stream with offsets, signal, stdin),
files (write with seek_offset, read, the 64 MiB cap), routing metadata and ownership errors.
"""
import sys

sys.path.insert(0, sys.argv[2])
import grpc  # noqa: E402
from ateenv.v1alpha import guest_pb2, guest_pb2_grpc  # noqa: E402
from kagent.api.v1 import common_pb2, sandboxes_pb2, sandboxes_pb2_grpc  # noqa: E402
from kagent.api.v1 import sandbox_templates_pb2 as tpl_pb2  # noqa: E402
from kagent.api.v1 import sandbox_templates_pb2_grpc as tpl_grpc  # noqa: E402
from kagent.runtime.v1 import runtime_pb2, runtime_pb2_grpc  # noqa: E402

target, template = sys.argv[1], sys.argv[3]
chan = grpc.insecure_channel(target)
ALICE = (("x-user-id", "alice@example.com"),)
BOB = (("x-user-id", "bob@example.com"),)
sbx = sandboxes_pb2_grpc.SandboxServiceStub(chan)
proc = guest_pb2_grpc.ProcessServiceStub(chan)
fs = guest_pb2_grpc.FileSystemServiceStub(chan)
tpl = tpl_grpc.SandboxTemplateServiceStub(chan)
rt = runtime_pb2_grpc.RuntimeServiceStub(chan)


def expect_code(code, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        assert e.code() == code, f"{fn}: got {e.code()} {e.details()}, want {code}"
        return e.details()
    raise AssertionError(f"{fn}: succeeded, want {code}")


def test_reflection():
    import kreflection_pb2 as reflection_pb2  # noqa
    import kreflection_pb2_grpc as reflection_pb2_grpc  # noqa
    stub = reflection_pb2_grpc.ServerReflectionStub(chan)
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    names = {s.name for r in stub.ServerReflectionInfo(iter([req]))
             for s in r.list_services_response.service}
    for want in ("kagent.api.v1.SandboxService", "ateenv.v1alpha.ProcessService",
                 "ateenv.v1alpha.FileSystemService", "kagent.runtime.v1.RuntimeService"):
        assert want in names, names


def create(request_id):
    ref = common_pb2.ResourceReference(namespace="kagent", name=template)
    r = sbx.CreateSandbox(sandboxes_pb2.CreateSandboxRequest(
        sandbox_template=ref, request_id=request_id), metadata=ALICE)
    return r.sandbox


def guest_md(sid, who=ALICE):
    return who + (("kagent-sandbox-id", sid),)


def run(sid, argv, stdin_data=None):
    p = proc.StartProcess(guest_pb2.StartProcessRequest(command=argv, stdin=stdin_data is not None),
                          metadata=guest_md(sid)).process
    if stdin_data is not None:
        msgs = [guest_pb2.WriteProcessInputRequest(process_id=p.process_id, data=stdin_data),
                guest_pb2.WriteProcessInputRequest(close=True)]
        n = proc.WriteProcessInput(iter(msgs), metadata=guest_md(sid)).bytes_written
        assert n == len(stdin_data), n
    out, err, exit_p = b"", b"", None
    for o in proc.StreamProcessOutput(guest_pb2.StreamProcessOutputRequest(
            process_id=p.process_id, follow=True), metadata=guest_md(sid)):
        which = o.WhichOneof("output")
        if which == "stdout":
            out += o.stdout
        elif which == "stderr":
            err += o.stderr
        else:
            exit_p = o.exit
    return p, out, err, exit_p


def main():
    test_reflection()
    sb = create("py-1")
    assert sb.state == 2 and sb.operation == 0, sb  # READY / NONE
    assert sb.node == "node-1", sb  # the node serving it (the default node name)
    assert sb.expires_at.seconds > sb.created_at.seconds
    sid = sb.id

    p, out, err, ex = run(sid, ["sh", "-c", "echo out; echo err >&2; exit 5"])
    assert out == b"out\n" and err == b"err\n", (out, err)
    assert ex.state == guest_pb2.PROCESS_STATE_EXITED and ex.exit_code == 5, ex
    assert list(ex.command) == ["sh", "-c", "echo out; echo err >&2; exit 5"]
    # replay from an offset
    outs = [o.stdout for o in proc.StreamProcessOutput(guest_pb2.StreamProcessOutputRequest(
        process_id=p.process_id, stdout_offset=2), metadata=guest_md(sid))
        if o.WhichOneof("output") == "stdout"]
    assert b"".join(outs) == b"t\n", outs

    _, out, _, ex = run(sid, ["cat"], stdin_data=b"through stdin")
    assert out == b"through stdin" and ex.exit_code == 0, (out, ex)

    long = proc.StartProcess(guest_pb2.StartProcessRequest(command=["sleep", "60"]),
                             metadata=guest_md(sid)).process
    proc.SignalProcess(guest_pb2.SignalProcessRequest(process_id=long.process_id,
                                                      signal=guest_pb2.SIGNAL_KILL),
                       metadata=guest_md(sid))
    ex = None
    for o in proc.StreamProcessOutput(guest_pb2.StreamProcessOutputRequest(
            process_id=long.process_id, follow=True), metadata=guest_md(sid)):
        if o.WhichOneof("output") == "exit":
            ex = o.exit
    assert ex.exit_code == 128 + 9, ex

    # files: write, write at an offset, read back
    w = [guest_pb2.WriteFileRequest(path="f.txt", mode=0o644, chunk=b"hello world")]
    assert fs.WriteFile(iter(w), metadata=guest_md(sid)).bytes_written == 11
    w = [guest_pb2.WriteFileRequest(path="f.txt", seek_offset=6, chunk=b"there")]
    fs.WriteFile(iter(w), metadata=guest_md(sid))
    data = b"".join(c.chunk for c in fs.ReadFile(guest_pb2.ReadFileRequest(path="f.txt"),
                                                 metadata=guest_md(sid)))
    assert data == b"hello there", data
    expect_code(grpc.StatusCode.NOT_FOUND, lambda: list(fs.ReadFile(
        guest_pb2.ReadFileRequest(path="nope"), metadata=guest_md(sid))))
    big = [guest_pb2.WriteFileRequest(path="big", chunk=b"\0" * ((4 << 20) - 1024))] * 17
    details = expect_code(grpc.StatusCode.RESOURCE_EXHAUSTED, fs.WriteFile, iter(big),
                          metadata=guest_md(sid))
    assert details == "File exceeds 64 MiB transfer limit", details

    # routing and ownership
    details = expect_code(grpc.StatusCode.INVALID_ARGUMENT, proc.GetProcess,
                          guest_pb2.GetProcessRequest(process_id="1"), metadata=ALICE)
    assert details == "exactly one kagent-sandbox-id metadata value is required", details
    two = ALICE + (("kagent-sandbox-id", sid), ("kagent-sandbox-id", sid))
    expect_code(grpc.StatusCode.INVALID_ARGUMENT, proc.GetProcess,
                guest_pb2.GetProcessRequest(process_id="1"), metadata=two)
    details = expect_code(grpc.StatusCode.INVALID_ARGUMENT, proc.GetProcess,
                          guest_pb2.GetProcessRequest(process_id="1"),
                          metadata=guest_md("not-a-uuid"))
    assert details == "Sandbox ID must be a UUID", details
    expect_code(grpc.StatusCode.NOT_FOUND, proc.StartProcess,
                guest_pb2.StartProcessRequest(command=["true"]), metadata=guest_md(sid, BOB))
    expect_code(grpc.StatusCode.NOT_FOUND, sbx.GetSandbox,
                sandboxes_pb2.GetSandboxRequest(sandbox_id=sid), metadata=BOB)
    expect_code(grpc.StatusCode.INVALID_ARGUMENT, sbx.CreateSandbox,
                sandboxes_pb2.CreateSandboxRequest(request_id="x"), metadata=ALICE)

    lst = sbx.ListSandboxes(sandboxes_pb2.ListSandboxesRequest(), metadata=ALICE)
    assert sid in [s.id for s in lst.sandboxes]
    d = sbx.DeleteSandbox(sandboxes_pb2.DeleteSandboxRequest(sandbox_id=sid), metadata=ALICE)
    assert d.sandbox.state == 6, d  # DELETED
    details = expect_code(grpc.StatusCode.FAILED_PRECONDITION, proc.StartProcess,
                          guest_pb2.StartProcessRequest(command=["true"]), metadata=guest_md(sid))
    assert details == "Sandbox is not ready or has expired", details
    # templates, suspend/resume, expiry, the runtime service
    ref = common_pb2.ResourceReference(namespace="kagent", name=template)
    t = tpl.GetSandboxTemplate(tpl_pb2.GetSandboxTemplateRequest(ref=ref), metadata=ALICE)
    t = t.sandbox_template
    assert t.conditions[0].reason == "Prepared" and t.workload_image.startswith("test/tools@sha256:")
    assert t.resource.kind == "SandboxTemplate" and t.resource.value.fields["spec"]
    names = [x.ref.name for x in tpl.ListSandboxTemplates(
        tpl_pb2.ListSandboxTemplatesRequest(namespace="kagent"), metadata=ALICE).sandbox_templates]
    assert template in names, names
    expect_code(grpc.StatusCode.INVALID_ARGUMENT, tpl.ListSandboxTemplates,
                tpl_pb2.ListSandboxTemplatesRequest(namespace="Bad_NS"), metadata=ALICE)
    details = expect_code(grpc.StatusCode.INVALID_ARGUMENT, tpl.CreateSandboxTemplate,
                          tpl_pb2.CreateSandboxTemplateRequest(
                              ref=ref, yaml="apiVersion: api.kagent.dev/v1alpha3\n"
                              "kind: SandboxTemplate\nmetadata: {name: %s, namespace: kagent}\n"
                              "spec: {workload: {image: 'tools:1'}}\n" % template),
                          metadata=ALICE)
    assert "spec.workload.image: Invalid value" in details, details

    sb2 = create("py-2")
    s = sbx.SuspendSandbox(sandboxes_pb2.SuspendSandboxRequest(sandbox_id=sb2.id), metadata=ALICE)
    assert s.sandbox.state == 3, s  # SUSPENDED
    expect_code(grpc.StatusCode.FAILED_PRECONDITION, proc.StartProcess,
                guest_pb2.StartProcessRequest(command=["true"]), metadata=guest_md(sb2.id))
    r = sbx.ResumeSandbox(sandboxes_pb2.ResumeSandboxRequest(sandbox_id=sb2.id), metadata=ALICE)
    assert r.sandbox.state == 2, r
    sbx.DeleteSandbox(sandboxes_pb2.DeleteSandboxRequest(sandbox_id=sb2.id), metadata=ALICE)

    # pause / unpause (kagent.runtime.v1, beyond the reference): READY, paused, guest calls off
    sb3 = create("py-pause")
    p = rt.PauseSandbox(runtime_pb2.PauseSandboxRequest(sandbox_id=sb3.id), metadata=ALICE)
    assert p.paused and p.sandbox.state == 2 and not p.sandbox.guest.process_execution, p
    g = sbx.GetSandbox(sandboxes_pb2.GetSandboxRequest(sandbox_id=sb3.id), metadata=ALICE)
    assert g.sandbox.state == 2 and not g.sandbox.guest.process_execution, g
    details = expect_code(grpc.StatusCode.FAILED_PRECONDITION, proc.StartProcess,
                          guest_pb2.StartProcessRequest(command=["true"]),
                          metadata=guest_md(sb3.id))
    assert details == "sandbox is paused; unpause it first", details
    expect_code(grpc.StatusCode.NOT_FOUND, rt.UnpauseSandbox,
                runtime_pb2.UnpauseSandboxRequest(sandbox_id=sb3.id), metadata=BOB)
    u = rt.UnpauseSandbox(runtime_pb2.UnpauseSandboxRequest(sandbox_id=sb3.id), metadata=ALICE)
    assert not u.paused and u.sandbox.guest.process_execution, u
    assert run(sb3.id, ["true"])[3].exit_code == 0
    expect_code(grpc.StatusCode.FAILED_PRECONDITION, rt.UnpauseSandbox,
                runtime_pb2.UnpauseSandboxRequest(sandbox_id=sb3.id), metadata=ALICE)
    sbx.DeleteSandbox(sandboxes_pb2.DeleteSandboxRequest(sandbox_id=sb3.id), metadata=ALICE)

    from google.protobuf import duration_pb2
    short = sbx.CreateSandbox(sandboxes_pb2.CreateSandboxRequest(
        sandbox_template=ref, request_id="py-short", ttl=duration_pb2.Duration(seconds=1)),
        metadata=ALICE).sandbox
    import time
    time.sleep(1.5)
    details = expect_code(grpc.StatusCode.FAILED_PRECONDITION, proc.StartProcess,
                          guest_pb2.StartProcessRequest(command=["true"]),
                          metadata=guest_md(short.id))
    assert details == "Sandbox is not ready or has expired", details

    st = rt.GetStats(runtime_pb2.GetStatsRequest(), metadata=ALICE)
    assert st.actors_live > 0 and st.messages > 0, st
    tree = rt.GetActorTree(runtime_pb2.GetActorTreeRequest(), metadata=ALICE).json
    assert '"sandboxes"' in tree and '"templates"' in tree, tree[:200]
    pools = rt.ListPools(runtime_pb2.ListPoolsRequest(), metadata=ALICE).pools
    assert pools[0].name == "kagent-default" and pools[0].capacity > 0, pools
    assert rt.ListNodes(runtime_pb2.ListNodesRequest(), metadata=ALICE).nodes[0].alive
    imgs = [i.reference for i in rt.ListImages(runtime_pb2.ListImagesRequest(), metadata=ALICE).images]
    assert any(i.startswith("test/tools@") for i in imgs), imgs
    print("PASS api (python3-grpcio)")


main()
