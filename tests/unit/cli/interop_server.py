# A SandboxService / ProcessService / FileSystemService written with Debian's python3-grpcio,
# for interop_python.sh: the kagent CLI against a gRPC server we did not write.
# usage: /usr/bin/python3 interop_server.py STUB_DIR PORT_FILE
import sys, time
from concurrent import futures
sys.path.insert(0, sys.argv[1])
import grpc
from kagent.api.v1 import sandboxes_pb2 as sb, sandboxes_pb2_grpc as sbg
from ateenv.v1alpha import guest_pb2 as g, guest_pb2_grpc as gg

SID = "0198c3f1-2a44-7c90-b5e1-9d8f3a7b2c04"
def md(ctx):
    return [(k, v) for k, v in ctx.invocation_metadata()]
class S(sbg.SandboxServiceServicer):
    def CreateSandbox(self, req, ctx):
        s = sb.Sandbox(id=SID, state=2, name=req.name, creator=dict(md(ctx)).get('x-user-id',''),
                       node="node-1")
        s.sandbox_template.namespace = req.sandbox_template.namespace
        s.sandbox_template.name = req.sandbox_template.name
        s.expires_at.seconds = 1790872200 + req.ttl.seconds
        return sb.CreateSandboxResponse(sandbox=s)
    def GetSandbox(self, req, ctx):
        ctx.abort(grpc.StatusCode.NOT_FOUND, "sandbox %s not found" % req.sandbox_id)
class P(gg.ProcessServiceServicer):
    def StartProcess(self, req, ctx):
        ids = [v for k, v in md(ctx) if k == 'kagent-sandbox-id']
        if len(ids) != 1:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "exactly one kagent-sandbox-id metadata value is required")
        return g.StartProcessResponse(process=g.Process(process_id="p-" + "-".join(req.command), state=1))
    def StreamProcessOutput(self, req, ctx):
        yield g.ProcessOutput(stdout=b"Python 3.11.2\n")
        time.sleep(0.05)
        yield g.ProcessOutput(stderr=b"warn\n")
        yield g.ProcessOutput(exit=g.Process(process_id=req.process_id, state=2, exit_code=7))
class F(gg.FileSystemServiceServicer):
    def WriteFile(self, it, ctx):
        n = 0
        for m in it:
            n += len(m.chunk)
        return g.WriteFileResponse(bytes_written=n)

    def ReadFile(self, req, ctx):
        if req.path == "broken":
            yield g.ReadFileResponse(chunk=b"partial")
            ctx.abort(grpc.StatusCode.UNAVAILABLE, "guest went away")
        for i in range(3):
            yield g.ReadFileResponse(chunk=bytes([65 + i]) * 70000)
srv = grpc.server(futures.ThreadPoolExecutor(4))
sbg.add_SandboxServiceServicer_to_server(S(), srv)
gg.add_ProcessServiceServicer_to_server(P(), srv)
gg.add_FileSystemServiceServicer_to_server(F(), srv)
port = srv.add_insecure_port('127.0.0.1:0')
srv.start()
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(port))
import os
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
srv.wait_for_termination()
