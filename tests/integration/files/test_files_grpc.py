#!/usr/bin/python3
"""The Files API (kagent.files.v1.FilesService) with Debian's python3-grpcio against a real node.

Usage: test_files_grpc.py API_HOST:PORT STUB_DIR TEMPLATE_NAME
Every method and error code, paging over 1,500 entries, paths escaping the sandbox (.., absolute
paths, symlinks to / and /etc, a symlinked last component), the watch (a tree, a directory created
later, moves, the OVERFLOW event of a watch that is not read, cancel, the 8-watch limit) and
ownership. Prints the sandbox id on its last line (the shell test goes on with it).
"""
import sys
import threading
import time

sys.path.insert(0, sys.argv[2])
import grpc  # noqa: E402
from ateenv.v1alpha import guest_pb2, guest_pb2_grpc  # noqa: E402
from kagent.api.v1 import common_pb2, sandboxes_pb2, sandboxes_pb2_grpc  # noqa: E402
from kagent.files.v1 import files_pb2 as F, files_pb2_grpc  # noqa: E402

target, template = sys.argv[1], sys.argv[3]
chan = grpc.insecure_channel(target)
ALICE = (("x-user-id", "alice@example.com"),)
BOB = (("x-user-id", "bob@example.com"),)
sbx = sandboxes_pb2_grpc.SandboxServiceStub(chan)
proc = guest_pb2_grpc.ProcessServiceStub(chan)
files = files_pb2_grpc.FilesServiceStub(chan)
C = grpc.StatusCode


def md(sid, who=ALICE):
    return who + (("kagent-sandbox-id", sid),)


def expect_code(code, fn, req, sid, who=ALICE):
    try:
        fn(req, metadata=md(sid, who))
    except grpc.RpcError as e:
        assert e.code() == code, f"{req}: got {e.code()} {e.details()}, want {code}"
        return e.details()
    raise AssertionError(f"{type(req).__name__} {req}: succeeded, want {code}")


def sh(sid, script):
    p = proc.StartProcess(guest_pb2.StartProcessRequest(command=["sh", "-c", script]),
                          metadata=md(sid)).process
    out, code = b"", None
    for o in proc.StreamProcessOutput(guest_pb2.StreamProcessOutputRequest(
            process_id=p.process_id, follow=True), metadata=md(sid)):
        if o.WhichOneof("output") == "stdout":
            out += o.stdout
        elif o.WhichOneof("output") == "exit":
            code = o.exit.exit_code
    assert code == 0, f"{script}: exit {code}"
    return out.decode()


def ls(sid, path="", page_size=0, token=""):
    return files.ListFiles(F.ListFilesRequest(path=path, page_size=page_size, page_token=token),
                           metadata=md(sid))


def test_ops(sid):
    sh(sid, "mkdir -p d/sub && echo hello > d/a.txt && chmod 640 d/a.txt && ln -s a.txt d/link && "
            "mkfifo d/fifo")
    r = ls(sid, "d")
    got = [(e.name, e.type) for e in r.entries]
    assert got == [("a.txt", F.FILE_TYPE_FILE), ("fifo", F.FILE_TYPE_OTHER),
                   ("link", F.FILE_TYPE_SYMLINK), ("sub", F.FILE_TYPE_DIRECTORY)], got
    assert r.next_page_token == "", r
    a = r.entries[0]
    assert a.size == 6 and a.mode == 0o640 and a.modified_at.seconds > 1700000000, a
    # stat does not follow the last component
    st = files.StatFile(F.StatFileRequest(path="d/link"), metadata=md(sid)).info
    assert st.type == F.FILE_TYPE_SYMLINK and st.name == "link" and st.size == 5, st
    root = files.StatFile(F.StatFileRequest(path=""), metadata=md(sid)).info
    assert root.type == F.FILE_TYPE_DIRECTORY and root.name == ".", root
    assert files.StatFile(F.StatFileRequest(path="/data/workspace/d/a.txt"),
                          metadata=md(sid)).info.size == 6
    # mkdir: mode, parents, exists
    files.MakeDirectory(F.MakeDirectoryRequest(path="m", mode=0o700), metadata=md(sid))
    assert files.StatFile(F.StatFileRequest(path="m"), metadata=md(sid)).info.mode == 0o700
    expect_code(C.ALREADY_EXISTS, files.MakeDirectory, F.MakeDirectoryRequest(path="m"), sid)
    expect_code(C.NOT_FOUND, files.MakeDirectory, F.MakeDirectoryRequest(path="x/y/z"), sid)
    files.MakeDirectory(F.MakeDirectoryRequest(path="x/y/z", parents=True), metadata=md(sid))
    files.MakeDirectory(F.MakeDirectoryRequest(path="x/y/z", parents=True), metadata=md(sid))
    expect_code(C.FAILED_PRECONDITION, files.MakeDirectory,
                F.MakeDirectoryRequest(path="d/a.txt/q"), sid)
    # move: rename, overwrite flag, a non-empty directory destination
    files.MoveFile(F.MoveFileRequest(source="d/a.txt", destination="d/b.txt"), metadata=md(sid))
    expect_code(C.NOT_FOUND, files.StatFile, F.StatFileRequest(path="d/a.txt"), sid)
    sh(sid, "echo other > d/c.txt")
    expect_code(C.ALREADY_EXISTS, files.MoveFile,
                F.MoveFileRequest(source="d/b.txt", destination="d/c.txt"), sid)
    files.MoveFile(F.MoveFileRequest(source="d/b.txt", destination="d/c.txt", overwrite=True),
                   metadata=md(sid))
    assert sh(sid, "cat d/c.txt") == "hello\n"
    expect_code(C.FAILED_PRECONDITION, files.MoveFile,
                F.MoveFileRequest(source="m", destination="x", overwrite=True), sid)
    expect_code(C.NOT_FOUND, files.MoveFile,
                F.MoveFileRequest(source="nothing", destination="n2"), sid)
    # remove: a file, a symlink (not its target), non-empty only when recursive, the root never
    files.RemoveFile(F.RemoveFileRequest(path="d/link"), metadata=md(sid))
    assert files.StatFile(F.StatFileRequest(path="d/c.txt"), metadata=md(sid)).info.size == 6
    expect_code(C.FAILED_PRECONDITION, files.RemoveFile, F.RemoveFileRequest(path="x"), sid)
    files.RemoveFile(F.RemoveFileRequest(path="x", recursive=True), metadata=md(sid))
    expect_code(C.NOT_FOUND, files.StatFile, F.StatFileRequest(path="x"), sid)
    expect_code(C.NOT_FOUND, files.RemoveFile, F.RemoveFileRequest(path="x"), sid)
    for root in ("/data/workspace", "/data/workspace/", "."):
        expect_code(C.INVALID_ARGUMENT, files.RemoveFile,
                    F.RemoveFileRequest(path=root, recursive=True), sid)
    expect_code(C.INVALID_ARGUMENT, files.RemoveFile, F.RemoveFileRequest(path=""), sid)
    # list of a file, of a symlink to a directory: not a directory
    expect_code(C.FAILED_PRECONDITION, files.ListFiles, F.ListFilesRequest(path="d/c.txt"), sid)
    sh(sid, "ln -s sub d/sublink")
    expect_code(C.FAILED_PRECONDITION, files.ListFiles, F.ListFilesRequest(path="d/sublink"), sid)
    # bad arguments, checked before the guest
    for req, fn in ((F.ListFilesRequest(page_size=1001), files.ListFiles),
                    (F.ListFilesRequest(page_size=-1), files.ListFiles),
                    (F.ListFilesRequest(page_token="a/b"), files.ListFiles),
                    (F.StatFileRequest(path="x" * 1024), files.StatFile),
                    (F.MakeDirectoryRequest(path="q", mode=0o10000), files.MakeDirectory),
                    (F.MoveFileRequest(source="d/c.txt"), files.MoveFile),
                    (F.StatFileRequest(path="d/" + "n" * 256), files.StatFile)):
        expect_code(C.INVALID_ARGUMENT, fn, req, sid)
    # ownership and routing, as the other guest calls
    expect_code(C.NOT_FOUND, files.StatFile, F.StatFileRequest(path="d"), sid, BOB)
    try:
        files.StatFile(F.StatFileRequest(path="d"), metadata=ALICE)
        raise AssertionError("no kagent-sandbox-id: succeeded")
    except grpc.RpcError as e:
        assert e.code() == C.INVALID_ARGUMENT, e
    expect_code(C.INVALID_ARGUMENT, files.StatFile, F.StatFileRequest(path="d"), "not-a-uuid")


def test_escapes(sid):
    sh(sid, "ln -s / rootlink && ln -s /etc etclink && ln -s ../.. uplink && "
            "ln -s loop1 loop2 && ln -s loop2 loop1 && mkdir -p in sub && ln -s ../in badlink && "
            "ln -s ../in sub/inlink")
    denied = [F.ListFilesRequest(path="rootlink/"), F.ListFilesRequest(path="etclink/"),
              F.ListFilesRequest(path=".."), F.ListFilesRequest(path="../.."),
              F.ListFilesRequest(path="uplink/"), F.ListFilesRequest(path="/etc"),
              F.ListFilesRequest(path="/data"), F.ListFilesRequest(path="loop1/"),
              F.ListFilesRequest(path="badlink/")]
    for req in denied:
        expect_code(C.PERMISSION_DENIED, files.ListFiles, req, sid)
    for p in ("rootlink/etc/passwd", "etclink/passwd", "../x", "/etc/passwd", "uplink/etc"):
        expect_code(C.PERMISSION_DENIED, files.StatFile, F.StatFileRequest(path=p), sid)
        expect_code(C.PERMISSION_DENIED, files.RemoveFile, F.RemoveFileRequest(path=p), sid)
        expect_code(C.PERMISSION_DENIED, files.MakeDirectory,
                    F.MakeDirectoryRequest(path=p + "/new", parents=True), sid)
        expect_code(C.PERMISSION_DENIED, files.MoveFile,
                    F.MoveFileRequest(source="in", destination=p), sid)
    expect_code(C.PERMISSION_DENIED, files.MoveFile,
                F.MoveFileRequest(source="etclink/hostname", destination="stolen"), sid)
    # links themselves are fine: the last component is never followed
    files.RemoveFile(F.RemoveFileRequest(path="rootlink"), metadata=md(sid))
    files.MoveFile(F.MoveFileRequest(source="etclink", destination="etclink2"), metadata=md(sid))
    assert files.StatFile(F.StatFileRequest(path="etclink2"),
                          metadata=md(sid)).info.type == F.FILE_TYPE_SYMLINK
    files.RemoveFile(F.RemoveFileRequest(path="etclink2", recursive=True), metadata=md(sid))
    # a relative symlink that stays inside works as a parent
    assert [e.name for e in ls(sid, "sub/inlink/").entries] == []
    assert sh(sid, "ls / | grep -c etc") == "1\n"  # nothing outside was touched


def test_paging(sid):
    sh(sid, "mkdir many && cd many && i=0; while [ $i -lt 1500 ]; do : > f$i; i=$((i+1)); done")
    want = sorted(f"f{i}" for i in range(1500))
    for size, pages in ((0, 3), (1000, 2), (7, 215)):
        names, token, n = [], "", 0
        while True:
            r = ls(sid, "many", size, token)
            assert len(r.entries) <= (size or 500), len(r.entries)
            names += [e.name for e in r.entries]
            n += 1
            token = r.next_page_token
            if not token:
                break
            assert token == r.entries[-1].name
        assert names == want and n == pages, (size, n, len(names))


class Watch:
    """A WatchFiles stream read by a thread into .got; pausable (the thread stops calling the
    iterator, so gRPC stops reading and the node's credit runs out)."""

    def __init__(self, sid, path, stub=None):
        self.call = (stub or files).WatchFiles(F.WatchFilesRequest(path=path), metadata=md(sid))
        self.got, self.err, self.paused = [], None, False
        self.cv = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            for ev in self.call:
                with self.cv:
                    self.got.append(ev)
                    self.cv.notify_all()
                    while self.paused:
                        self.cv.wait()
        except grpc.RpcError as e:
            with self.cv:
                self.err = e
                self.cv.notify_all()

    def wait(self, pred, what, timeout=30):
        with self.cv:
            ok = self.cv.wait_for(lambda: pred(self.got) or self.err is not None, timeout)
            assert ok and pred(self.got), f"{what}: {len(self.got)} events " \
                f"{[(e.type, e.path) for e in self.got[:20]]} err={self.err}"

    def seen(self, want, timeout=30):
        self.wait(lambda got: want <= {(e.type, e.path, e.from_path) for e in got}, want, timeout)

    def failed(self, timeout=30):
        with self.cv:
            assert self.cv.wait_for(lambda: self.err is not None, timeout), self.got
            return self.err

    def ready(self, sid, d):
        """Creates probe files in d until the watch reports one: it is established."""
        for i in range(150):
            sh(sid, f": > {d}/.probe{i}")
            with self.cv:
                if self.cv.wait_for(lambda: any(".probe" in e.path for e in self.got), 0.2):
                    return
                assert self.err is None, self.err
        raise AssertionError("the watch never reported a probe")

    def quiet(self, secs, timeout=120):
        """Waits until no event came for secs (a backlog drained), at most timeout."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                n = len(self.got)
                self.cv.wait_for(lambda: len(self.got) != n or self.err is not None, secs)
                assert self.err is None, self.err
                if len(self.got) == n:
                    return
                assert time.monotonic() < deadline, f"events still coming after {timeout} s"

    def pause(self, on):
        with self.cv:
            self.paused = on
            self.cv.notify_all()


def test_watch(sid):
    sh(sid, "mkdir -p w/old")
    w = Watch(sid, "w")
    w.ready(sid, "w")
    sh(sid, "echo 1 > w/first")
    w.seen({(F.FILE_EVENT_TYPE_CREATE, "first", "")})
    sh(sid, "echo more >> w/old/../first; mkdir -p w/new/deeper; echo x > w/new/deeper/f")
    w.seen({(F.FILE_EVENT_TYPE_MODIFY, "first", ""),
            (F.FILE_EVENT_TYPE_CREATE, "new", ""),
            (F.FILE_EVENT_TYPE_CREATE, "new/deeper/f", "")})
    # new/ is watched once its files are reported (a move into a directory made in the same
    # breath can land before its watch exists: then it is a delete and a create, as inotify
    # gives it; seen under ASan in CI)
    sh(sid, "mv w/first w/new/moved; rm w/old -r")
    w.seen({(F.FILE_EVENT_TYPE_MOVE, "new/moved", "first"),
            (F.FILE_EVENT_TYPE_DELETE, "old", "")})
    assert any(e.path == "new" and e.is_directory for e in w.got), w.got
    # a directory created later is watched: a change deep in it is seen
    sh(sid, "echo y > w/new/deeper/later")
    w.seen({(F.FILE_EVENT_TYPE_CREATE, "new/deeper/later", "")})
    w.call.cancel()
    assert w.failed().code() == C.CANCELLED
    # a watch of a missing directory, of a file, of an escape
    for p, code in (("nothing", C.NOT_FOUND), ("w/new/moved", C.FAILED_PRECONDITION),
                    ("../..", C.PERMISSION_DENIED), ("/etc", C.PERMISSION_DENIED),
                    ("etclink2/", C.NOT_FOUND), ("badlink/", C.PERMISSION_DENIED)):
        e = Watch(sid, p).failed()
        assert e.code() == code, (p, e.code(), e.details())


def test_watch_limit(sid):
    sh(sid, "mkdir -p lim")
    open_ = [Watch(sid, "lim") for _ in range(8)]
    for w in open_:
        w.ready(sid, "lim")
    e = Watch(sid, "lim").failed()
    assert e.code() == C.RESOURCE_EXHAUSTED and "8" in e.details(), e
    for w in open_:
        w.call.cancel()
        assert w.failed().code() == C.CANCELLED
    # the slots come back once the cancels reach the sandbox
    deadline = time.monotonic() + 20
    while True:
        w = Watch(sid, "lim")
        try:
            w.ready(sid, "lim")
            break
        except AssertionError:
            assert w.err is not None and w.err.code() == C.RESOURCE_EXHAUSTED, w.err
            assert time.monotonic() < deadline, "no watch slot came back after the cancels"
    w.call.cancel()


def test_overflow(sid):
    sh(sid, "mkdir flood")
    # a channel whose HTTP/2 window stays at 64 KiB (no BDP probing): what is in flight is
    # bounded by it and the node's credit, far below the events made here
    slow = grpc.insecure_channel(target, options=[("grpc.http2.bdp_probe", 0)])
    w = Watch(sid, "flood", files_pb2_grpc.FilesServiceStub(slow))
    w.ready(sid, "flood")
    w.pause(True)  # not reading: credit runs out, the guest's queue fills and overflows
    sh(sid, "cd flood && i=0; while [ $i -lt 25000 ]; do : > n$i; i=$((i+1)); done")
    w.pause(False)
    w.seen({(F.FILE_EVENT_TYPE_OVERFLOW, "", "")}, 120)  # "end" itself may be lost in it
    kinds = [e.type for e in w.got]
    first = kinds.index(F.FILE_EVENT_TYPE_OVERFLOW)
    assert kinds[first - 1] == F.FILE_EVENT_TYPE_CREATE, "events before the overflow were lost"
    assert len(w.got) < 25000, len(w.got)
    # and the stream goes on after it: once what the guest and the kernel still held has come
    # (it may overflow again on the way: an event made meanwhile may go with it), a new event
    # comes through
    w.quiet(2)
    sh(sid, "echo z > flood/after")
    w.seen({(F.FILE_EVENT_TYPE_CREATE, "after", "")}, 60)
    w.call.cancel()
    slow.close()


def main():
    ref = common_pb2.ResourceReference(namespace="kagent", name=template)
    sid = sbx.CreateSandbox(sandboxes_pb2.CreateSandboxRequest(
        sandbox_template=ref, request_id="files-grpc"), metadata=ALICE).sandbox.id
    test_ops(sid)
    test_escapes(sid)
    test_paging(sid)
    test_watch(sid)
    test_watch_limit(sid)
    test_overflow(sid)
    print(sid)


main()
