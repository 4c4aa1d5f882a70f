#!/usr/bin/python3
"""Every invalid input through both bridges: the gRPC API (Debian's python3-grpcio) and MCP
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


def grpc_error(fn, req, md):
    try:
        fn(req, metadata=md)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
        return e.details()
    raise AssertionError(f"{req}: accepted over gRPC")


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
    sbx.DeleteSandbox(sandboxes_pb2.DeleteSandboxRequest(sandbox_id=ok.id), metadata=MD)
    print(f"PASS test_validation: {n} invalid inputs refused alike by gRPC and MCP")


main()
