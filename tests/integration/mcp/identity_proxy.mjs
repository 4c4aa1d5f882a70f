// A client-side stand-in for tools that cannot send headers (the Inspector CLI, the conformance
// suite): forwards every request to kagentd unchanged, adding `x-user-id` when it is absent, as
// the kagent CLI does. The node itself refuses a request without an identity.
// usage: node identity_proxy.mjs <target-port> <identity>; prints the port it listens on.
import http from 'node:http';

const [target, identity] = [Number(process.argv[2]), process.argv[3]];
const server = http.createServer((req, res) => {
  const headers = { ...req.headers };
  if (!headers['x-user-id']) headers['x-user-id'] = identity;
  const up = http.request({ host: '127.0.0.1', port: target, method: req.method, path: req.url, headers }, (r) => {
    res.writeHead(r.statusCode, r.headers);
    r.pipe(res);
  });
  up.on('error', (e) => { res.writeHead(502); res.end(String(e)); });
  req.pipe(up);
});
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
