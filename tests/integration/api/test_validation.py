#!/usr/bin/python3
"""A TABLE of invalid inputs through both bridges: the gRPC API (Debian's python3-grpcio) and MCP
(JSON-RPC over HTTP) must refuse it with the same message (actors/control/checks.c).

Usage: test_validation.py API_HOST:PORT STUB_DIR TEMPLATE_NAME
"""
import json
import sys
import urllib.request

sys.path.insert(0, sys.argv[2])
import grpc  # noqa: E402
from ateenv.v1alpha import guest_pb2, guest_pb2_grpc  # noqa: E402
from kagent.api.v1 import common_pb2, sandboxes_pb2, sandboxes_pb2_grpc  # noqa: E402

target, template = sys.argv[1], sys.argv[3]
USER = "alice@example.com"
chan = grpc.insecure_channel(target)
sbx = sandboxes_pb2_grpc.SandboxServiceStub(chan)
proc = guest_pb2_grpc.ProcessServiceStub(chan)
fs = guest_pb2_grpc.FileSystemServiceStub(chan)
MD = (("x-user-id", USER),)


class Mcp:
    def __init__(self, url):
        self.url, self.session, self.id = url, None, 0
        r = self.rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "test_validation", "version": "1"}})
        assert "result" in r, r
        self.rpc("notifications/initialized", None, notify=True)

    def rpc(self, method, params, notify=False):
        body = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            body["params"] = params
        if not notify:
            self.id += 1
            body["id"] = self.id
        headers = {"content-type": "application/json", "x-user-id": USER,
                   "accept": "application/json, text/event-stream",
                   "mcp-protocol-version": "2025-11-25"}
        if self.session:
            headers["mcp-session-id"] = self.session
        req = urllib.request.Request(self.url, json.dumps(body).encode(), headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
            self.session = resp.headers.get("mcp-session-id") or self.session
            text = resp.read().decode()
        if notify:
            return None
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            msgs = [json.loads(l[5:]) for l in text.splitlines() if l.startswith("data:")]
            return [m for m in msgs if m.get("id") == self.id][0]
        return json.loads(text)

    def tool_error(self, name, args):
        r = self.rpc("tools/call", {"name": name, "arguments": args})
        res = r["result"]
        assert res.get("isError"), f"{name} {args}: not refused: {res}"
        return res["content"][0]["text"]

    def tool_refusal(self, name, args):
        """(code name, message) of a refused tool call: its text is "<CODE>: <message>"."""
        r = self.rpc("tools/call", {"name": name, "arguments": args})
        res = r["result"]
        assert res.get("isError"), f"{name} {args}: not refused: {res}"
        code, _, msg = res["content"][0]["text"].partition(": ")
        assert res["_meta"]["kagent.dev/error-code"] == code, res
        return code, msg


def grpc_error(fn, req, md):
    try:
        fn(req, metadata=md)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
        return e.details()
    raise AssertionError(f"{req}: accepted over gRPC")


def grpc_refusal(fn, req, md, stream=False):
    """(code name, message) of a refused gRPC call (a server stream refuses on iteration)."""
    try:
        out = fn(req, metadata=md)
        if stream:
            list(out)
    except grpc.RpcError as e:
        return e.code().name, e.details()
    raise AssertionError(f"{req}: accepted over gRPC")


def table(ok_id, template):
    """Rows: (what, gRPC thunk, MCP tool, MCP args, message). Every row must be refused
    INVALID_ARGUMENT with exactly that message by both bridges."""
    gmd = MD + (("kagent-sandbox-id", ok_id),)
    ref = lambda ns, name: common_pb2.ResourceReference(namespace=ns, name=name)  # noqa: E731
    uuid = "Sandbox ID must be a UUID"
    pid = "process_id must be the decimal id a process start returned"
    page = "page_token is not valid"
    rows = []
    for rid, why in (("", "empty"), ("r" * 129, "129 characters")):
        rows.append((f"create request_id {why}",
                     lambda rid=rid: grpc_refusal(sbx.CreateSandbox, sandboxes_pb2.CreateSandboxRequest(
                         sandbox_template=ref("kagent", template), request_id=rid), MD),
                     "create_sandbox", {"namespace": "kagent", "template": template, "request_id": rid},
                     "request_id must be between 1 and 128 characters"))
    for ns, name, want in (
            ("kagent", "Bad_Name", "sandbox_template.name: must be a DNS subdomain of 1-253 characters"),
            ("kagent", "-bad", "sandbox_template.name: must be a DNS subdomain of 1-253 characters"),
            ("kagent", "a..b", "sandbox_template.name: must be a DNS subdomain of 1-253 characters"),
            ("NS!", template, "sandbox_template.namespace: must be a DNS label of 1-63 characters"),
            ("-ns", template, "sandbox_template.namespace: must be a DNS label of 1-63 characters")):
        rows.append((f"create template {ns}/{name}",
                     lambda ns=ns, name=name: grpc_refusal(sbx.CreateSandbox, sandboxes_pb2.CreateSandboxRequest(
                         sandbox_template=ref(ns, name), request_id="v"), MD),
                     "create_sandbox", {"namespace": ns, "template": name, "request_id": "v"}, want))
    rows.append(("create long name",
                 lambda: grpc_refusal(sbx.CreateSandbox, sandboxes_pb2.CreateSandboxRequest(
                     sandbox_template=ref("kagent", template), request_id="n", name="n" * 201), MD),
                 "create_sandbox", {"namespace": "kagent", "template": template, "request_id": "n",
                                    "name": "n" * 201}, "name must be at most 200 characters"))
    bad_ids = ["", "nope", "1234", "0198c0de-0000-7000-8000-00000000000",
               "g198c0de-0000-7000-8000-000000000001"]
    by_id = [("get", sbx.GetSandbox, sandboxes_pb2.GetSandboxRequest, "get_sandbox"),
             ("suspend", sbx.SuspendSandbox, sandboxes_pb2.SuspendSandboxRequest, "suspend_sandbox"),
             ("resume", sbx.ResumeSandbox, sandboxes_pb2.ResumeSandboxRequest, "resume_sandbox"),
             ("delete", sbx.DeleteSandbox, sandboxes_pb2.DeleteSandboxRequest, "delete_sandbox")]
    for op, fn, msg, tool in by_id:
        for bad in bad_ids:
            rows.append((f"{op} sandbox_id {bad!r}",
                         lambda fn=fn, msg=msg, bad=bad: grpc_refusal(fn, msg(sandbox_id=bad), MD),
                         tool, {"sandbox_id": bad}, uuid))
    for token in ("abc", "-1", "1x", "99999999999"):
        rows.append((f"list page_token {token!r}",
                     lambda token=token: grpc_refusal(sbx.ListSandboxes, sandboxes_pb2.ListSandboxesRequest(
                         page=common_pb2.PageRequest(page_token=token)), MD),
                     "list_sandboxes", {"page_token": token}, page))
    for bad in ("x1", "0", "-1", "1.5", "99999999999999999999999", ""):
        rows.append((f"get process_id {bad!r}",
                     lambda bad=bad: grpc_refusal(proc.GetProcess, guest_pb2.GetProcessRequest(
                         process_id=bad), gmd),
                     "get_sandbox_process", {"sandbox_id": ok_id, "process_id": bad}, pid))
        rows.append((f"kill process_id {bad!r}",
                     lambda bad=bad: grpc_refusal(proc.SignalProcess, guest_pb2.SignalProcessRequest(
                         process_id=bad, signal=9), gmd),
                     "kill_sandbox_process", {"sandbox_id": ok_id, "process_id": bad}, pid))
        rows.append((f"output process_id {bad!r}",
                     lambda bad=bad: grpc_refusal(proc.StreamProcessOutput,
                                                  guest_pb2.StreamProcessOutputRequest(process_id=bad),
                                                  gmd, stream=True),
                     "read_sandbox_outputs", {"sandbox_id": ok_id, "process_id": bad}, pid))
    for n in (1024, 4000):
        long_path = "/" + "p" * (n - 1)
        rows.append((f"read path of {n} bytes",
                     lambda p=long_path: grpc_refusal(fs.ReadFile, guest_pb2.ReadFileRequest(path=p),
                                                      gmd, stream=True),
                     "read_sandbox_file", {"sandbox_id": ok_id, "path": long_path},
                     "path must be 1-1023 bytes"))
        rows.append((f"write path of {n} bytes",
                     lambda p=long_path: grpc_refusal(fs.WriteFile, iter([guest_pb2.WriteFileRequest(
                         path=p, chunk=b"x")]), gmd),
                     "write_sandbox_file", {"sandbox_id": ok_id, "path": long_path, "data_base64": "eA=="},
                     "path must be 1-1023 bytes"))
    return rows


def main():
    mcp = Mcp(f"http://{target}/mcp")
    ref = common_pb2.ResourceReference(namespace="kagent", name=template)
    ok = sbx.CreateSandbox(sandboxes_pb2.CreateSandboxRequest(sandbox_template=ref,
                                                              request_id="validation"),
                           metadata=MD).sandbox
    gmd = MD + (("kagent-sandbox-id", ok.id),)
    big = "x" * ((1 << 20) + 1)
    creates = [
        ("empty request_id", {"request_id": ""}, "request_id must be between 1 and 128 characters"),
        ("long request_id", {"request_id": "r" * 129},
         "request_id must be between 1 and 128 characters"),
        ("long name", {"request_id": "n", "name": "n" * 201}, "name must be at most 200 characters"),
    ]
    starts = [
        ("empty command", {"command": []}, "command must not be empty"),
        ("empty argv0", {"command": [""]}, "command must not be empty"),
        ("env key with =", {"command": ["true"], "env": {"A=B": "1"}},
         "env keys must be non-empty and must not contain '='"),
        ("long cwd", {"command": ["true"], "cwd": "/" + "c" * 1023}, "cwd must be at most 1023 bytes"),
        ("huge argv", {"command": ["echo", big]}, "command and env are too large (1 MiB at most)"),
        ("huge env", {"command": ["true"], "env": {"BIG": big}},
         "command and env are too large (1 MiB at most)"),
    ]
    n = 0
    for what, a, want in creates:
        g = grpc_error(sbx.CreateSandbox, sandboxes_pb2.CreateSandboxRequest(
            sandbox_template=ref, request_id=a["request_id"], name=a.get("name", "")), MD)
        m = mcp.tool_error("create_sandbox", {"namespace": "kagent", "template": template, **a})
        assert want in g, f"{what}: gRPC said {g!r}, want {want!r}"
        assert want in m, f"{what}: MCP said {m!r}, want {want!r}"
        n += 1
    for what, a, want in starts:
        g = grpc_error(proc.StartProcess, guest_pb2.StartProcessRequest(
            command=a["command"], env=a.get("env", {}), cwd=a.get("cwd", "")), gmd)
        m = mcp.tool_error("start_sandbox_process", {"sandbox_id": ok.id, **a})
        assert want in g, f"{what}: gRPC said {g!r}, want {want!r}"
        assert want in m, f"{what}: MCP said {m!r}, want {want!r}"
        n += 1
    for what, grpc_call, tool, args, want in table(ok.id, template):
        g = grpc_call()
        m = mcp.tool_refusal(tool, args)
        assert g == ("INVALID_ARGUMENT", want), f"{what}: gRPC said {g!r}, want {want!r}"
        assert m == g, f"{what}: MCP said {m!r}, gRPC {g!r}"
        n += 1
    assert n >= 50, n
    sbx.DeleteSandbox(sandboxes_pb2.DeleteSandboxRequest(sandbox_id=ok.id), metadata=MD)
    print(f"PASS test_validation: {n} invalid inputs refused alike by gRPC and MCP")


main()
