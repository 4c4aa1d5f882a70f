#!/usr/bin/env python3
"""Writes the starting corpora of tests/fuzz (run once; `make fuzz` grows and -merge=1 trims them).

    tests/fuzz/make_seeds.py OUT_DIR     (OUT_DIR/<name>/seed-*; tests/fuzz/corpus is the default)

The inputs are the test suite's: templates and configs as the unit tests and deploy/ write them,
JSON-RPC requests as the MCP tests send them, protobuf requests encoded by protoc from text,
guest frames as kagent-sandbox-guest emits them (4-byte length + msgpack map), and image
archives as `docker save` and OCI layout tarballs hold them. Needs python3 and protoc.
"""
import gzip
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import tarfile

SRC = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(SRC))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SRC, "corpus")
DIGEST = "sha256:" + "ab" * 32


def put(name, i, data):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-%03d" % i), "wb") as f:
        f.write(data)


# ---- template -------------------------------------------------------------------------------
TPL = """apiVersion: api.kagent.dev/v1alpha3
kind: SandboxTemplate
metadata:
  name: python
  namespace: kagent
spec:
  workload:
    image: tools@%s
  env:
  - name: LANG
    value: C.UTF-8
  - name: "EMPTY"
    value: ""
  substrate:
    workerPoolRef:
      name: kagent-default
    snapshotPolicy:
      location: file:///var/lib/kagent/snapshots
""" % DIGEST
templates = [
    TPL,
    TPL.replace("  namespace: kagent\n", ""),
    TPL + "  egressPolicyRefs:\n  - name: open\n",
    '{"apiVersion":"api.kagent.dev/v1alpha3","kind":"SandboxTemplate","metadata":{"name":"j"},'
    '"spec":{"workload":{"image":"r@%s"},"env":[{"name":"A","value":"b"}]}}' % DIGEST,
    "apiVersion: api.kagent.dev/v1alpha3\nkind: SandboxTemplate\nmetadata: {name: Bad_Name}\n"
    "spec: {workload: {image: 'tools:1'}}\n",
    "a: &x [1, 2]\nb: *x\n",
    "apiVersion: [\n",
    "---\nkind: SandboxTemplate\n---\nkind: Other\n",
]
for i, t in enumerate(templates):
    put("template", i, t)

# ---- config ---------------------------------------------------------------------------------
with open(os.path.join(ROOT, "deploy", "kagentd.example.yaml")) as f:
    example = f.read()
configs = [
    example,
    "node:\n  name: n1\n  id: 2\nlisten:\n  address: 127.0.0.1\n  port: 9000\n",
    "sandbox:\n  guestImageDigest: %s\n  cpu: 500m\n  memory: 1Gi\n  defaultTtl: 1h30m\n"
    "  maxTtl: 24h\n" % DIGEST,
    "pools:\n- name: p\n  class: namespaces\n  capacity: 4\nimages:\n  registries:\n"
    "  - host: r.example\n    endpoint: http://127.0.0.1:5000\n    insecure: true\n",
    "mesh:\n  bind: tcp://0.0.0.0:7000\n  advertise: tcp://h:7000\n",
    "auth:\n  mode: tokens\n  tokensFile: /etc/kagent/tokens\nlog:\n  level: debug\n  json: true\n",
    "listen:\n  prot: 1\n",
]
for i, c in enumerate(configs):
    put("config", i, c)

# ---- mcp: selector byte (Accept, protocol) + one JSON-RPC body --------------------------------
SBX = "0b8c6a1e-58b4-4c5e-9d3e-3d3f4c0e9a11"


def rpc(method, params=None, id_=1):
    m = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        m["params"] = params
    return json.dumps(m)


def call(name, args):
    return rpc("tools/call", {"name": name, "arguments": args})


mcp = [
    rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "fuzz", "version": "1"}}),
    rpc("ping"), rpc("tools/list"), rpc("prompts/list"),
    rpc("logging/setLevel", {"level": "warning"}),
    rpc("prompts/get", {"name": "sandbox-task", "arguments": {"task": "run tests"}}),
    rpc("prompts/get", {"name": "sandbox-recovery", "arguments": {"sandbox_id": SBX}}),
    call("list_sandbox_templates", {"namespace": "kagent"}),
    call("create_sandbox", {"namespace": "kagent", "template": "python", "name": "s",
                            "ttl_seconds": 600, "request_id": "r1"}),
    call("list_sandboxes", {"page_size": 10, "page_token": "10"}),
    call("get_sandbox", {"sandbox_id": SBX}),
    call("suspend_sandbox", {"sandbox_id": SBX}),
    call("resume_sandbox", {"sandbox_id": SBX}),
    call("delete_sandbox", {"sandbox_id": SBX}),
    call("start_sandbox_process", {"sandbox_id": SBX, "command": ["python", "-c", "print(1)"],
                                   "cwd": "/data/workspace", "env": {"A": "b"}}),
    call("get_sandbox_process", {"sandbox_id": SBX, "process_id": "7"}),
    call("kill_sandbox_process", {"sandbox_id": SBX, "process_id": "7"}),
    call("read_sandbox_outputs", {"sandbox_id": SBX, "process_id": "7", "stdout_offset": 0,
                                  "stderr_offset": 4}),
    call("write_sandbox_file", {"sandbox_id": SBX, "path": "a.txt", "data_base64": "aGVsbG8K",
                                "mode": 420}),
    call("read_sandbox_file", {"sandbox_id": SBX, "path": "a.txt", "offset": 2, "limit": 10}),
    call("read_sandbox_file", {"sandbox_id": SBX, "path": "a.bin", "byte_offset": 10}),
    json.dumps({"jsonrpc": "2.0", "id": "p", "method": "tools/call",
                "params": {"name": "get_sandbox", "arguments": {"sandbox_id": SBX},
                           "_meta": {"progressToken": 5}}}),
    json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]),
    json.dumps({"jsonrpc": "2.0", "id": 3, "result": {}}),
    '{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}',
]
for i, body in enumerate(mcp):
    put("mcp", i, bytes([i % 16]) + body.encode())

# ---- proto (selector byte = method, then the request) and pbjson (selector, then JSON) --------
# Methods in fuzz_messages.h order: SandboxService (6), SandboxTemplateService (4),
# ProcessService (5), FileSystemService (2), RuntimeService (7).
TEMPLATE_STRUCT = ('resource { api_version: "api.kagent.dev/v1alpha3" kind: "SandboxTemplate" '
                   'value { fields { key: "spec" value { struct_value { fields { key: "env" '
                   'value { list_value { values { number_value: 1.5 } values { bool_value: true }'
                   ' values { null_value: NULL_VALUE } } } } } } } '
                   'fields { key: "metadata" value { struct_value { fields { key: "name" value '
                   '{ string_value: "x" } } } } } } }')
REF = 'sandbox_template { namespace: "kagent" name: "python" }'
requests = [  # (method index, proto message, text format, JSON)
    (0, "kagent.api.v1.CreateSandboxRequest",
     REF + ' request_id: "r1" name: "s" ttl { seconds: 600 nanos: 5 }',
     '{"sandboxTemplate":{"namespace":"kagent","name":"python"},"requestId":"r1",'
     '"ttl":"600.000000005s"}'),
    (1, "kagent.api.v1.GetSandboxRequest", 'sandbox_id: "%s"' % SBX,
     '{"sandboxId":"%s"}' % SBX),
    (2, "kagent.api.v1.ListSandboxesRequest", "", '{}'),
    (5, "kagent.api.v1.DeleteSandboxRequest", 'sandbox_id: "%s"' % SBX,
     '{"sandbox_id":"%s"}' % SBX),
    (7, "kagent.api.v1.CreateSandboxTemplateRequest", TEMPLATE_STRUCT, None),
    (7, "kagent.api.v1.CreateSandboxTemplateRequest", 'yaml: %s' % json.dumps(TPL),
     json.dumps({"yaml": TPL})),
    (8, "kagent.api.v1.GetSandboxTemplateRequest", 'ref { namespace: "kagent" name: "python" }',
     '{"ref":{"namespace":"kagent","name":"python"}}'),
    (10, "ateenv.v1alpha.StartProcessRequest",
     'command: "sh" command: "-c" command: "echo hi" cwd: "/data" env { key: "A" value: "b" } '
     'stdin: true timeout { seconds: 5 }',
     '{"command":["sh","-c","echo hi"],"cwd":"/data","env":{"A":"b"},"stdin":true,'
     '"timeout":"5s"}'),
    (12, "ateenv.v1alpha.StreamProcessOutputRequest",
     'process_id: "7" stdout_offset: 10 stderr_offset: -1 follow: true',
     '{"processId":"7","stdoutOffset":"10","stderrOffset":"-1","follow":true}'),
    (14, "ateenv.v1alpha.WriteProcessInputRequest", 'process_id: "7" data: "hi\\n" close: true',
     '{"processId":"7","data":"aGkK","close":true}'),
    (15, "ateenv.v1alpha.ReadFileRequest", 'path: "a.txt" mode: 420',
     '{"path":"a.txt","mode":420}'),
    (16, "ateenv.v1alpha.WriteFileRequest", 'path: "a" mode: 420 seek_offset: 3 chunk: "xyz"',
     '{"path":"a","mode":420,"seekOffset":"3","chunk":"eHl6"}'),
    (17, "kagent.runtime.v1.GetActorTreeRequest", "", "{}"),
]


def protoc_encode(msg, text):
    protos = ["kagent/api/v1/sandboxes.proto", "kagent/api/v1/sandbox_templates.proto",
              "ateenv/v1alpha/guest.proto", "kagent/runtime/v1/runtime.proto"]
    return subprocess.run(["protoc", "-I" + os.path.join(ROOT, "proto"), "-I/usr/include",
                           "--encode=" + msg] + protos, input=text.encode(),
                          capture_output=True, check=True).stdout


for i, (method, msg, text, js) in enumerate(requests):
    put("proto", i, bytes([method]) + protoc_encode(msg, text))
    if js is not None:
        put("pbjson", i, bytes([method << 1]) + js.encode())
pbjson_more = [
    (0 << 1, '{"requestId":"r","ttl":"3600s","labels":{"a":"b"},"unknown":1}'),
    (2 << 1 | 1, '{"sandboxes":[{"id":"x","state":"SANDBOX_STATE_READY","expiresAt":'
                 '"2026-10-01T16:30:00.120Z","createdAt":"1970-01-01T00:00:00+01:00"}],'
                 '"nextPageToken":"10"}'),
    (11 << 1 | 1, '{"process":{"processId":"7","command":["a"],"pid":"12","exitCode":-1,'
                  '"startedAt":"2026-01-01T00:00:00Z","state":1}}'),
    (18 << 1 | 1, '{"tree":{"children":[{"children":[{}]}]}}'),
    (7 << 1, '{"resource":{"apiVersion":"v","kind":"k","value":{"a":[1,2.5e300,"x",null,'
             'true,{"b":{}}]}}}'),
]
for i, (sel, js) in enumerate(pbjson_more):
    put("pbjson", 100 + i, bytes([sel]) + js.encode())


# ---- guest: frames as kagent-sandbox-guest writes them ----------------------------------------
def mp(v):
    """A minimal msgpack encoder (maps, arrays, str, bin, ints, bools, nil)."""
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if v >= 0:
            return b"\xcf" + struct.pack(">Q", v)
        if v >= -32:
            return struct.pack(">b", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xa0 | len(b)]) if len(b) < 32 else b"\xdb" + struct.pack(">I", len(b))) + b
    if isinstance(v, bytes):
        return b"\xc6" + struct.pack(">I", len(v)) + v
    if isinstance(v, list):
        return b"\xdd" + struct.pack(">I", len(v)) + b"".join(mp(x) for x in v)
    if isinstance(v, dict):
        return b"\xdf" + struct.pack(">I", len(v)) + b"".join(mp(k) + mp(x) for k, x in v.items())
    raise TypeError(v)


def frame(m):
    b = mp(m)
    return struct.pack(">I", len(b)) + b


P = {"proc": 7, "argv": ["python", "-c", "print(1)"], "pid": 42, "state": 2, "exit_code": 0,
     "started_ms": 1767225600000, "finished_ms": 1767225600120}
guest = [
    frame({"id": 0, "ev": "ready", "version": 1, "pid": 1}) + frame({"id": 1, "end": True}),
    frame({"id": 1, "process": dict(P, state=1), "end": True}),
    frame({"id": 1, "process": dict(P, state=1)}) +
    frame({"id": 1, "stdout": b"hello\n", "offset": 0}) +
    frame({"id": 1, "stderr": b"warn\n", "offset": 0}) + frame({"id": 1, "exit": P, "end": True}),
    frame({"id": 1, "chunk": b"\x00\x01data"}) + frame({"id": 1, "size": 6, "end": True}),
    frame({"id": 1, "written": 5, "end": True}),
    frame({"id": 1, "err": -2, "msg": "no such file or directory", "end": True}),
    frame({"id": 2, "end": True}) + frame({"id": 1, "err": 5, "end": True}),
    struct.pack(">I", 0x7fffffff) + b"\x80",
    frame({"id": 1}) + b"\x00\x00",
]
for i, g in enumerate(guest):
    put("guest", i, g)


# ---- oci: image archives ------------------------------------------------------------------------
def tar_bytes(entries, gz=False):
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, kind, data in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 0
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                t.addfile(ti)
            elif kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, data
                t.addfile(ti)
            elif kind == "hard":
                ti.type, ti.linkname = tarfile.LNKTYPE, data
                t.addfile(ti)
            else:
                ti.size, ti.mode = len(data), 0o644
                t.addfile(ti, io.BytesIO(data))
    raw = bio.getvalue()
    return gzip.compress(raw, mtime=0) if gz else raw


def sha(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


layer = tar_bytes([("etc/", "dir", None), ("etc/hostname", "file", b"fuzz\n"),
                   ("bin/", "dir", None), ("bin/sh", "sym", "busybox"),
                   ("bin/busybox", "file", b"\x7fELF"), ("bin/ls", "hard", "bin/busybox"),
                   ("etc/.wh.old", "file", b"")])
config = json.dumps({"architecture": "amd64", "os": "linux",
                     "rootfs": {"type": "layers", "diff_ids": [sha(layer)]}}).encode()


def docker_archive(layer_bytes, cfg):
    cname = hashlib.sha256(cfg).hexdigest() + ".json"
    man = json.dumps([{"Config": cname, "RepoTags": ["fuzz:1"],
                       "Layers": ["l1/layer.tar"]}]).encode()
    return tar_bytes([("manifest.json", "file", man), (cname, "file", cfg),
                      ("l1/", "dir", None), ("l1/layer.tar", "file", layer_bytes)])


def oci_layout(layer_bytes, cfg, gz):
    lb = gzip.compress(layer_bytes, mtime=0) if gz else layer_bytes
    man = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                 "digest": sha(cfg), "size": len(cfg)},
                      "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar" +
                                  ("+gzip" if gz else ""), "digest": sha(lb), "size": len(lb)}]}
                     ).encode()
    idx = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(man),
         "size": len(man), "annotations": {"org.opencontainers.image.ref.name": "fuzz"},
         "platform": {"architecture": "amd64", "os": "linux"}}]}).encode()
    ents = [("oci-layout", "file", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", "file", idx),
            ("blobs/", "dir", None), ("blobs/sha256/", "dir", None)]
    for b in (man, cfg, lb):
        ents.append(("blobs/sha256/" + hashlib.sha256(b).hexdigest(), "file", b))
    return tar_bytes(ents)


evil = tar_bytes([("../escape", "file", b"x"), ("/abs", "file", b"x"), ("d", "sym", "/etc"),
                  ("d/passwd", "file", b"x"), ("h", "hard", "../../etc/shadow")])
oci = [docker_archive(layer, config), oci_layout(layer, config, False),
       oci_layout(layer, config, True), docker_archive(evil, json.dumps(
           {"rootfs": {"diff_ids": [sha(evil)]}}).encode()), evil,
       tar_bytes([("manifest.json", "file", b'[{"Config":"../../etc/passwd","Layers":[]}]')])]
for i, o in enumerate(oci):
    put("oci", i, o)
# ---- h2: what a gRPC server sends the CLI ----------------------------------------------------
# Input layout (fuzz_h2.c): byte 0 = where stream 1 ends, byte 1 = feed piece size - 1, then
# frames. Header blocks are RFC 7541 Appendix C's (Huffman, indexing, evictions) and literals
# as gRPC core sends them.
def frame(typ, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([typ, flags]) + struct.pack(">I", sid) + payload


def lit(name, value):
    return bytes([0, len(name)]) + name + bytes([len(value)]) + value


H = bytes.fromhex
settings = frame(4, 0, 0, H("000300000064") + H("00040000ffff") + H("0006ffffffff") + H("fe0300000001"))
resp = lit(b":status", b"200") + lit(b"content-type", b"application/grpc")
trail = lit(b"grpc-status", b"0") + lit(b"grpc-message", b"all%20good")
msg = b"\0\0\0\0\x05hello"
rfc_resp = [H("3fe101488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad"
              "171863c78f0b97c8e9ae82ae43d3"), H("4883640effc1c0bf"),
            H("88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7"
              "b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007")]
h2 = [
    settings + frame(4, 1, 0) + frame(8, 0, 0, H("00100000")) + frame(1, 4, 1, resp) +
    frame(0, 0, 1, msg) + frame(6, 0, 0, b"12345678") + frame(1, 5, 1, trail),
    settings + frame(1, 5, 1, resp + lit(b"grpc-status", b"12") + lit(b"grpc-message", b"no")),
    settings + frame(1, 0, 1, resp[:5]) + frame(9, 4, 1, resp[5:]) + frame(0, 8, 1, b"\x03" + msg + b"pad") +
    frame(3, 0, 1, H("00000008")) + frame(1, 5, 3, trail),
    settings + frame(7, 0, 0, H("0000000000000000") + b"bye") + frame(8, 0, 1, H("00000400")),
    settings + b"".join(frame(1, 4 | (1 if i == 2 else 0), 1, b) for i, b in enumerate(rfc_resp)),
    settings + frame(1, 0x24, 1, H("0000000010") + resp) + frame(2, 0, 1, H("0000000010")),
    H("1503030002023200"),  # a TLS alert: not HTTP/2
]
for i, c in enumerate(h2):
    put("h2", i, bytes([128 + 16 * (i % 4), 0xff if i % 2 else 3]) + c)
for j, b in enumerate(rfc_resp):
    put("h2", len(h2) + j, b)



# ---- mesh: frames between nodes (header, then length-prefixed envelopes) ----------------------
def envelope(to, frm, typ, ref=0, kind=0, err=0, body=b""):
    return mp([2, to, frm, typ, ref, kind, err, body])


def mframe(envs, src=5, dst=0):
    return (b"KF\x01\x00" + struct.pack(">QQ", src, dst) +
            b"".join(struct.pack(">I", len(e)) + e for e in envs))


N1, N2 = 1 << 48, 2 << 48
sig = struct.pack("<IQ", 77, N2 | 1)
mesh = [
    mframe([envelope(0, N1, 1)]),                                    # heartbeat
    mframe([envelope(N2 | 1, N1 | 7, 257, body=b"ping")] * 3),      # a batch
    mframe([envelope(N2 | 1, N1 | 7, 257, ref=9, kind=1, body=b"x")]),  # a request
    mframe([envelope(N2, N1, 8, ref=(1 << 63) | 3, kind=1, body=b"svc")]),  # WHEREIS
    mframe([envelope(N2, N1 | 3, 7, ref=(1 << 63) | 3, kind=2, err=3, body=b"gone\0")]),
    mframe([envelope(N2 | 1, N1 | 7, 64 + 6, body=sig)]),          # LINK
    mframe([envelope(N2 | 1, N1 | 7, 64 + 8, ref=4, body=sig)]),   # MONITOR
    mframe([envelope(N2 | 1, N1 | 7, 64 + 10, body=struct.pack("<IQ", 2, 0))]),  # KILL
    mframe([envelope(N2 | 1, 0, 64 + 12, ref=4, body=sig)]),       # DOWN
    mframe([envelope(0, N1, 2), envelope(0, N1, 3)], dst=12345),
    mframe([envelope(N2 | 1, N1 | 7, 257)])[:-2],
]
for i, m in enumerate(mesh):
    put("mesh", i, m)

print("seeds written to", OUT)
