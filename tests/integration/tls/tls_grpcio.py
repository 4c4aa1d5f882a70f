#!/usr/bin/python3
"""gRPC over TLS with a real client (Debian's python3-grpcio) against a real kagentd.

Usage: tls_grpcio.py HOST:PORT STUB_DIR TLS_DIR TEMPLATE
TLS_DIR holds ca.pem (the node's CA), alice.pem/key (a client certificate of that CA, CN
alice@example.com), mallory.pem/key (signed by other-ca), other-ca.pem. Tokens: tok-alice maps to
alice@example.com, tok-bob to bob@example.com.
"""
import sys

sys.path.insert(0, sys.argv[2])
import grpc  # noqa: E402
from kagent.api.v1 import common_pb2, sandboxes_pb2, sandboxes_pb2_grpc  # noqa: E402
from kagent.api.v1 import sandbox_templates_pb2 as tpl_pb2  # noqa: E402
from kagent.api.v1 import sandbox_templates_pb2_grpc as tpl_grpc  # noqa: E402

target, tls, template = sys.argv[1], sys.argv[3], sys.argv[4]


def read(name):
    with open(f"{tls}/{name}", "rb") as f:
        return f.read()


def channel(roots="ca.pem", client=None, name=None):
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(roots),
        private_key=read(f"{client}.key") if client else None,
        certificate_chain=read(f"{client}.pem") if client else None)
    opts = [("grpc.ssl_target_name_override", name)] if name else []
    return grpc.secure_channel(target, creds, options=opts)


def token(who):
    return (("authorization", f"Bearer tok-{who}"),)


def expect_code(code, fn, *args, **kw):
    try:
        fn(*args, timeout=10, **kw)
    except grpc.RpcError as e:
        assert e.code() == code, f"got {e.code()} {e.details()}, want {code}"
        return e.details()
    raise AssertionError(f"succeeded, want {code}")


def templates(chan, md):
    r = tpl_grpc.SandboxTemplateServiceStub(chan).ListSandboxTemplates(
        tpl_pb2.ListSandboxTemplatesRequest(namespace="kagent"), metadata=md, timeout=10)
    return [t.ref.name for t in r.sandbox_templates]


def ids(chan, md=()):
    r = sandboxes_pb2_grpc.SandboxServiceStub(chan).ListSandboxes(
        sandboxes_pb2.ListSandboxesRequest(), metadata=md, timeout=10)
    return [s.id for s in r.sandboxes]


# 1. server authentication with the test CA, bearer tokens over TLS
plain = channel()
assert template in templates(plain, token("bob")), "template not listed over TLS"
expect_code(grpc.StatusCode.UNAUTHENTICATED, tpl_grpc.SandboxTemplateServiceStub(plain)
            .ListSandboxTemplates, tpl_pb2.ListSandboxTemplatesRequest(namespace="kagent"))
print("PASS grpcio: TLS with ssl_channel_credentials and the test CA")

# 2. the server name override: a name the certificate carries works, another one does not
assert template in templates(channel(name="kagent.test"), token("bob"))
expect_code(grpc.StatusCode.UNAVAILABLE, sandboxes_pb2_grpc.SandboxServiceStub(
    channel(name="wrong.test")).ListSandboxes, sandboxes_pb2.ListSandboxesRequest(),
    metadata=token("bob"))
print("PASS grpcio: grpc.ssl_target_name_override")

# 3. a CA that did not sign the server's certificate: refused
expect_code(grpc.StatusCode.UNAVAILABLE, sandboxes_pb2_grpc.SandboxServiceStub(
    channel(roots="other-ca.pem")).ListSandboxes, sandboxes_pb2.ListSandboxesRequest(),
    metadata=token("bob"))
print("PASS grpcio: wrong CA refused")

# 4. mTLS: the certificate's CN is the caller, in place of (and over) any bearer token
alice = channel(client="alice")
ref = common_pb2.ResourceReference(namespace="kagent", name=template)
sid = sandboxes_pb2_grpc.SandboxServiceStub(alice).CreateSandbox(
    sandboxes_pb2.CreateSandboxRequest(sandbox_template=ref, request_id="tls-grpcio"),
    timeout=60).sandbox.id
assert sid in ids(alice), "alice's certificate does not see its sandbox"
assert sid in ids(alice, token("bob")), "a bearer token overrode the client certificate"
assert sid in ids(plain, token("alice")), "the certificate's identity is not alice@example.com"
assert sid not in ids(plain, token("bob")), "bob sees alice's sandbox"
print("PASS grpcio: client certificate CN alice@example.com is the caller")

# 5. a client certificate from another CA: refused at the handshake
expect_code(grpc.StatusCode.UNAVAILABLE, sandboxes_pb2_grpc.SandboxServiceStub(
    channel(client="mallory")).ListSandboxes, sandboxes_pb2.ListSandboxesRequest(),
    metadata=token("bob"))
print("PASS grpcio: unverified client certificate refused")

sandboxes_pb2_grpc.SandboxServiceStub(alice).DeleteSandbox(
    sandboxes_pb2.DeleteSandboxRequest(sandbox_id=sid), timeout=30)
