// An agent's flow on MCP 2026-07-28 (stateless: no initialize, no session) through the official
// TypeScript SDK v2 client (@modelcontextprotocol/client) against a real kagentd: discovery,
// lists, a prompt, create, progress, write, run, read outputs to the exit, read a file and a
// large image (re-encoded as JPEG for the model), delete; the mistakes an agent makes; raw HTTP
// breaking the 2026-07-28 rules; and the same client in auto and legacy mode on the same /mcp.
// usage: node agent_flow_2026.mjs URL NAMESPACE TEMPLATE      (exits non-zero on the first failure)
import { Client, ProtocolError, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import assert from 'node:assert/strict';
import zlib from 'node:zlib';

const [url, ns, tmpl] = process.argv.slice(2);
const t0 = Date.now();
const step = (what) => console.log(`[${((Date.now() - t0) / 1000).toFixed(2)}s] ${what}`);

async function connect(user, mode = { pin: '2026-07-28' }) {
  const client = new Client({ name: 'kagent-mcp-test-v2', version: '1.0.0' }, { versionNegotiation: { mode } });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { 'x-user-id': user } },
  });
  await client.connect(transport);
  return { client, transport };
}

async function call(client, name, args, opts) {
  const r = await client.callTool({ name, arguments: args }, opts);
  if (r.isError) throw new Error(`${name} failed: ${r.content?.[0]?.text}`);
  return r;
}
const json = (r) => JSON.parse(r.content[0].text);

async function callFails(client, name, args, re) {
  const r = await client.callTool({ name, arguments: args });
  assert.equal(r.isError, true, `${name} should fail: ${JSON.stringify(r)}`);
  assert.match(r.content[0].text, re);
}

async function protocolError(promise, code, re) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof ProtocolError, `not a ProtocolError: ${e}`);
    assert.equal(e.code, code);
    if (re) assert.match(e.message, re);
    return;
  }
  assert.fail('expected a JSON-RPC error');
}

// A w x h RGB PNG of noise (incompressible, so large in bytes too), built with zlib alone.
function noisePng(w, h) {
  const crcTable = Array.from({ length: 256 }, (_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  const crc = (buf) => {
    let c = 0xffffffff;
    for (const b of buf) c = crcTable[(c ^ b) & 0xff] ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
  };
  const chunk = (type, data) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(data.length);
    const td = Buffer.concat([Buffer.from(type), data]);
    const c = Buffer.alloc(4);
    c.writeUInt32BE(crc(td));
    return Buffer.concat([len, td, c]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8; // bit depth
  ihdr[9] = 2; // RGB
  const raw = Buffer.alloc((w * 3 + 1) * h);
  let seed = 12345;
  for (let y = 0; y < h; y++) {
    raw[y * (w * 3 + 1)] = 0;
    for (let x = 1; x <= w * 3; x++) {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      raw[y * (w * 3 + 1) + x] = seed >>> 24;
    }
  }
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr),
    chunk('IDAT', zlib.deflateSync(raw, { level: 1 })),
    chunk('IEND', Buffer.alloc(0)),
  ]);
}

// --- stateless: no session, every request carries its revision
const alice = await connect('alice@example.com');
const bob = await connect('bob@example.com');
const c = alice.client;
assert.equal(c.getNegotiatedProtocolVersion(), '2026-07-28');
assert.equal(alice.transport.sessionId, undefined, 'no session on 2026-07-28');
assert.match(c.getInstructions() ?? '', /request_id/);
assert.equal(c.getServerVersion()?.name, 'kagent');
assert.ok(c.getServerCapabilities()?.tools, 'tools capability');
step(`connected: protocol ${c.getNegotiatedProtocolVersion()}, no session`);

const tools = (await c.listTools()).tools;
assert.equal(tools.length, 21);
const prompts = (await c.listPrompts()).prompts.map((p) => p.name);
assert.deepEqual(prompts, ['sandbox-task', 'sandbox-recovery']);
const p = await c.getPrompt({ name: 'sandbox-task', arguments: { task: 'count words', namespace: ns } });
assert.equal(p.messages.length, 2);
await protocolError(c.getPrompt({ name: 'nope', arguments: {} }), -32602, /unknown prompt/);
await protocolError(c.callTool({ name: 'rm_rf', arguments: {} }), -32602, /Unknown tool/);
step('listed 21 tools and 2 prompts');

let sbx;
for (let i = 0; ; i++) {
  const r = await c.callTool({ name: 'create_sandbox', arguments: { namespace: ns, template: tmpl, request_id: 'agent-flow-2026', ttl_seconds: 600 } });
  if (!r.isError) { sbx = json(r); break; }
  if (i > 100 || !/UNAVAILABLE|FAILED_PRECONDITION|NOT_FOUND/.test(r.content[0].text)) throw new Error(r.content[0].text);
  await new Promise((res) => setTimeout(res, 200));
}
assert.equal(sbx.state, 'RUNTIME_STATE_READY');
assert.equal(sbx.node, 'node-1');
const id = sbx.id;
const gotStructured = (await call(c, 'get_sandbox', { sandbox_id: id })).structuredContent;
assert.deepEqual(gotStructured.id, id);
assert.equal(gotStructured.node, 'node-1');
step(`created ${id}`);

const progress = [];
const got = json(await call(c, 'get_sandbox', { sandbox_id: id }, { onprogress: (e) => progress.push(e) }));
assert.equal(got.id, id);
assert.ok(progress.length >= 1, 'no progress notification on 2026-07-28');

const input = 'hello\nworld\n';
await call(c, 'write_sandbox_file', { sandbox_id: id, path: 'in.txt', data_base64: Buffer.from(input).toString('base64') });
const proc = json(await call(c, 'start_sandbox_process', { sandbox_id: id, command: ['sh', '-c', 'cat in.txt; echo oops >&2; exit 2'] }));
let so = 0, se = 0, out = '', err = '', last;
for (let i = 0; ; i++) {
  last = json(await call(c, 'read_sandbox_outputs', { sandbox_id: id, process_id: proc.process_id, stdout_offset: so, stderr_offset: se }));
  out += Buffer.from(last.stdout_base64, 'base64').toString();
  err += Buffer.from(last.stderr_base64, 'base64').toString();
  so = last.stdout_offset; se = last.stderr_offset;
  if (last.exited && !last.truncated) break;
  assert.ok(i < 300, 'process never finished');
  await new Promise((res) => setTimeout(res, 100));
}
assert.equal(out, input);
assert.equal(err, 'oops\n');
assert.equal(last.exit_code, 2);
const file = await call(c, 'read_sandbox_file', { sandbox_id: id, path: 'in.txt' });
assert.equal(file.content[0].text, '1: hello\n2: world\n');
step('wrote, ran, read outputs and the file');

// --- a large image comes back re-encoded as JPEG within the budget, captioned with both sizes
const png = noisePng(2400, 1000);
assert.ok(png.length > (1 << 20), `test PNG is ${png.length} bytes`);
const chunkSize = 768 << 10; // write in parts below the 1 MiB MCP limit, then join in the sandbox
const parts = [];
for (let off = 0, n = 0; off < png.length; off += chunkSize, n++) {
  parts.push(`p${n}`);
  await call(c, 'write_sandbox_file', { sandbox_id: id, path: `p${n}`, data_base64: png.subarray(off, off + chunkSize).toString('base64') });
}
const join = json(await call(c, 'start_sandbox_process', { sandbox_id: id, command: ['sh', '-c', `cat ${parts.join(' ')} > big.png`] }));
for (let i = 0; ; i++) {
  const st = json(await call(c, 'get_sandbox_process', { sandbox_id: id, process_id: join.process_id }));
  if (st.status !== 'PROCESS_STATUS_RUNNING') { assert.equal(st.exit_code, 0); break; }
  assert.ok(i < 300, 'join never finished');
  await new Promise((res) => setTimeout(res, 100));
}
const img = await call(c, 'read_sandbox_file', { sandbox_id: id, path: 'big.png' });
const cap = img.content[0].text;
assert.match(cap, /^image\/png, 2400×1000 px, shown at (\d+)×(\d+) \(image\/jpeg, \d+ bytes\)$/, cap);
const [, sw, sh] = cap.match(/shown at (\d+)×(\d+)/).map(Number);
assert.ok(Math.max(sw, sh) <= 2000, cap);
assert.equal(img.content[1].type, 'image');
assert.equal(img.content[1].mimeType, 'image/jpeg');
const jpeg = Buffer.from(img.content[1].data, 'base64');
assert.ok(jpeg.length <= 500000, `re-encoded image is ${jpeg.length} bytes`);
assert.deepEqual([...jpeg.subarray(0, 3)], [0xff, 0xd8, 0xff]);
step(`read a ${png.length}-byte 2400×1000 PNG as a ${jpeg.length}-byte ${sw}×${sh} JPEG`);

// --- another identity sees nothing of alice's
await callFails(bob.client, 'get_sandbox', { sandbox_id: id }, /^NOT_FOUND: sandbox not found/);
await callFails(bob.client, 'read_sandbox_file', { sandbox_id: id, path: 'in.txt' }, /^NOT_FOUND/);
step('bob refused');

// --- raw HTTP breaking the 2026-07-28 rules: clear errors, nothing changes
const meta = { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {} };
const hdrs = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'x-user-id': 'alice@example.com', 'mcp-protocol-version': '2026-07-28' };
const post = async (h, body) => {
  const r = await fetch(url, { method: 'POST', headers: { ...hdrs, ...h }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json(), session: r.headers.get('mcp-session-id') };
};
const req = (method, params = {}) => ({ jsonrpc: '2.0', id: 9, method, params: { ...params, _meta: meta } });
let r = await post({ 'mcp-method': 'server/discover' }, req('server/discover'));
assert.equal(r.status, 200);
assert.equal(r.body.result.resultType, 'complete');
assert.deepEqual(r.body.result.supportedVersions.slice(0, 2), ['2026-07-28', '2025-11-25']);
assert.equal(r.session, null, 'no Mcp-Session-Id is minted');
r = await post({}, req('tools/list'));
assert.equal(r.status, 400);
assert.equal(r.body.error.code, -32020, 'Mcp-Method is required');
r = await post({ 'mcp-method': 'tools/call', 'mcp-name': 'list_sandboxes' }, req('tools/call', { name: 'delete_sandbox', arguments: { sandbox_id: id } }));
assert.equal(r.status, 400);
assert.equal(r.body.error.code, -32020, 'Mcp-Name must match params.name');
r = await post({ 'mcp-method': 'tools/list', 'mcp-protocol-version': '2099-01-01' }, { ...req('tools/list'), params: { _meta: { ...meta, 'io.modelcontextprotocol/protocolVersion': '2099-01-01' } } });
assert.equal(r.status, 400);
assert.equal(r.body.error.code, -32022);
assert.equal(r.body.error.data.requested, '2099-01-01');
r = await post({ 'mcp-method': 'ping' }, req('ping'));
assert.equal(r.status, 404);
assert.equal(r.body.error.code, -32601);
r = await post({ 'mcp-method': 'tools/list' }, { jsonrpc: '2.0', id: 9, method: 'tools/list', params: {} });
assert.equal(r.status, 400);
assert.equal(r.body.error.code, -32602, '_meta is required');
assert.equal(json(await call(c, 'get_sandbox', { sandbox_id: id })).state, 'RUNTIME_STATE_READY', 'the refused delete changed nothing');
step('raw HTTP checks');

// --- the same client negotiating by itself picks 2026-07-28; in legacy mode it initializes
const auto = await connect('alice@example.com', 'auto');
assert.equal(auto.client.getNegotiatedProtocolVersion(), '2026-07-28');
assert.equal((await auto.client.listTools()).tools.length, 21);
await auto.client.close();
const legacy = await connect('alice@example.com', 'legacy');
assert.equal(legacy.client.getNegotiatedProtocolVersion(), '2025-11-25');
assert.match(legacy.transport.sessionId ?? '', /^[0-9a-f]{32}$/);
assert.equal((await legacy.client.listTools()).tools.length, 21);
await legacy.transport.terminateSession();
await legacy.client.close();
step('auto mode chose 2026-07-28, legacy mode 2025-11-25 with a session');

const del = json(await call(c, 'delete_sandbox', { sandbox_id: id }));
assert.ok(['RUNTIME_STATE_DELETED', 'RUNTIME_STATE_DELETING'].includes(del.state), del.state);
await alice.client.close();
await bob.client.close();
console.log('PASS agent_flow_2026');
