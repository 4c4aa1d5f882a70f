#!/usr/bin/python3
"""/ui in a real browser: Debian's headless Chromium driven over the DevTools protocol
(python3-websocket). Signs in through the page's form, waits for the actor tree, checks that a
sandbox created by the test appears (table and tree) and disappears after delete, that search
and folding work, and saves screenshots under $KAGENT_BUILD_DIR/test-artifacts/.

Environment: API (http://127.0.0.1:PORT), KAGENT (the CLI), USER_ID, ARTIFACTS, WORK.
"""
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import websocket

API, KAGENT, USER, ARTIFACTS, WORK = (os.environ[k] for k in ("API", "KAGENT", "USER_ID", "ARTIFACTS", "WORK"))


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


class Browser:
    def __init__(self):
        exe = shutil.which("chromium")
        if not exe:
            fail("chromium is missing (deploy/install-deps.sh installs it)")
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-dev-shm-usage", "--disable-extensions",
             "--window-size=1400,1100", "--remote-debugging-port=0",
             "--user-data-dir=" + os.path.join(WORK, "chromium"), "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        url = None
        deadline = time.time() + 60
        while time.time() < deadline and url is None:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                fail("chromium exited %s before listening" % self.proc.returncode)
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                url = m.group(1)
        if not url:
            fail("chromium never said where DevTools listens")
        port = re.search(r"ws://[^:/]+:(\d+)/", url).group(1)
        pages = json.load(urllib.request.urlopen("http://127.0.0.1:%s/json/list" % port, timeout=10))
        page = [p for p in pages if p.get("type") == "page"][0]
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")

    # What DevTools answers an evaluation that a navigation of the page cut short.
    NAVIGATED = ("Inspected target navigated or closed", "Cannot find context with specified id",
                 "Execution context was destroyed")

    def call(self, method, navigating=False, **params):
        """The result of method; navigating: None if a navigation cut it short (a probe while
        the page loads), else that fails the test like any error."""
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    if navigating and any(n in msg["error"].get("message", "")
                                          for n in self.NAVIGATED):
                        return None
                    fail("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
            if msg.get("method") == "Runtime.exceptionThrown":
                fail("the page threw: %s" % json.dumps(msg["params"])[:500])

    def js(self, expr, navigating=False):
        r = self.call("Runtime.evaluate", navigating, expression=expr, returnByValue=True,
                      awaitPromise=True)
        if r is None:
            return None
        if "exceptionDetails" in r:
            fail("js %s: %s" % (expr, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait(self, expr, what, seconds=20):
        """Until expr is true; an expression that throws (the page not there yet), or whose
        evaluation a navigation cut short (the page being replaced), is false."""
        probe = "(() => { try { return !!(%s); } catch (e) { return false; } })()" % expr
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.js(probe, navigating=True):
                return
            time.sleep(0.1)
        self.screenshot("failed")
        fail("timed out waiting for " + what)

    def screenshot(self, name):
        os.makedirs(ARTIFACTS, exist_ok=True)
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path = os.path.join(ARTIFACTS, "ui-%s.png" % name)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def close(self):
        try:
            self.ws.close()
        finally:
            os.killpg(self.proc.pid, signal.SIGKILL)  # chromium and its helpers, ours alone
            self.proc.wait()


def cli(*args):
    return subprocess.run([KAGENT, "--api-url", API, "--user-id", USER] + list(args),
                          check=True, capture_output=True, text=True).stdout


def main():
    b = Browser()
    try:
        b.call("Page.navigate", url=API + "/ui")
        b.wait("location.href.startsWith(%s) && document.readyState === 'complete'"
               % json.dumps(API + "/ui"), "the page to load")
        # user-header mode: the page asks who we are, the form sets the cookie
        b.wait("!document.getElementById('login').hidden", "the sign-in form")
        if b.js("document.getElementById('login-value').name") != "user":
            fail("the form does not ask for a user id in user-header mode")
        # the submit navigates: started after this evaluation has answered, not during it
        b.js("document.getElementById('login-value').value = %s;"
             "setTimeout(() => document.querySelector('#login form').submit(), 0); true"
             % json.dumps(USER))
        b.wait("window.kagentUi && window.kagentUi.ready && "
               "document.querySelectorAll('#tree li').length > 3", "the actor tree")
        who = b.js("document.getElementById('who').textContent")
        if USER not in who or "operator" not in who:
            fail("header shows %r" % who)
        if b.js("document.querySelector('#templates tbody tr[data-template=\"kagent/scratch\"] .badge').textContent") != "True":
            fail("template scratch is not shown Ready")

        sid = json.loads(cli("sandbox", "create", "scratch", "--request-id", "ui-browser", "-o", "json"))["id"]
        row = "document.querySelector('#sandboxes tr[data-sandbox=\"%s\"]')" % sid
        node = "document.querySelector('#tree li[data-sandbox=\"%s\"]')" % sid
        b.wait("!!%s && !!%s" % (row, node), "the new sandbox in the table and the tree")
        state = b.js(row + ".querySelector('.badge').textContent")
        if state != "RUNTIME_STATE_READY":
            fail("sandbox row state %r" % state)
        if b.js(row + ".cells[1].textContent") != USER:
            fail("owner column: %r" % b.js(row + ".cells[1].textContent"))
        cli("sandbox", "exec", sid, "--", "true")
        b.wait("document.getElementById('v-ex').textContent.indexOf('ms') >= 0", "an exec latency")
        shot = b.screenshot("live")

        # search narrows the tree to the match and its ancestors
        search = ("(() => { const s = document.getElementById('search'); s.value = %s;"
                  " s.dispatchEvent(new Event('input')); return true; })()")
        b.js(search % json.dumps(sid[:13]))
        hits = b.js("document.getElementById('hits').textContent")
        kinds = b.js("[...document.querySelectorAll('#tree li')].map(l => l.dataset.kind).join(',')")
        if not hits.startswith("1 match") or kinds != "supervisor,sandboxes,sandbox":
            fail("search: hits=%r kinds=%r" % (hits, kinds))
        b.js(search % '""')
        # folding the sandboxes manager hides its children, unfolding shows them again
        mgr = "document.querySelector('#tree li[data-kind=\"sandboxes\"]')"
        b.js(mgr + ".querySelector('.tog').click(); true")
        b.wait(mgr + ".classList.contains('collapsed') && " + node + ".offsetParent === null",
               "the folded sandboxes manager")
        b.js(mgr + ".querySelector('.tog').click(); true")
        b.wait("!%s.classList.contains('collapsed') && %s.offsetParent !== null" % (mgr, node),
               "the unfolded sandboxes manager")

        cli("sandbox", "delete", sid)
        b.wait("!%s && !%s" % (row, node), "the deleted sandbox to disappear")
        b.screenshot("after-delete")
        print("screenshot: " + shot)
    finally:
        b.close()
    print("PASS ui_browser")


main()
