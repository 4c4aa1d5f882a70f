// An agent's whole flow through the official MCP TypeScript SDK client against a real kagentd:
// create, write a file, start a process, read its outputs with offsets until it exits, read a
// file, delete; plus the mistakes an agent makes (wrong types, unknown tools and prompts,
// another identity's sandbox) and raw-HTTP abuse (bad JSON, batches, oversized bodies).
// usage: node agent_flow.mjs URL NAMESPACE TEMPLATE        (exits non-zero on the first failure)
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpError } from '@modelcontextprotocol/sdk/types.js';
import assert from 'node:assert/strict';

const [url, ns, tmpl] = process.argv.slice(2);
const t0 = Date.now();
const step = (what) => console.log(`[${((Date.now() - t0) / 1000).toFixed(2)}s] ${what}`);

async function connect(user) {
  const client = new Client({ name: 'kagent-mcp-test', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { 'x-user-id': user } },
  });
  await client.connect(transport);
  return { client, transport };
}

// A tool call that must succeed; returns the parsed JSON text of its result.
async function call(client, name, args, opts) {
  const r = await client.callTool({ name, arguments: args }, undefined, opts);
  if (r.isError) throw new Error(`${name} failed: ${r.content?.[0]?.text}`);
  return r;
}
const json = (r) => JSON.parse(r.content[0].text);

// A tool call that must fail as a tool result (isError) with text matching re.
async function callFails(client, name, args, re) {
  const r = await client.callTool({ name, arguments: args });
  assert.equal(r.isError, true, `${name} should fail: ${JSON.stringify(r)}`);
  assert.match(r.content[0].text, re);
  return r.content[0].text;
}

async function protocolError(promise, code, re) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof McpError, `not an McpError: ${e}`);
    assert.equal(e.code, code);
    if (re) assert.match(e.message, re);
    return;
  }
  assert.fail('expected a JSON-RPC error');
}

const alice = await connect('alice@example.com');
const bob = await connect('bob@example.com');
const c = alice.client;
step(`connected: session ${alice.transport.sessionId}, protocol ${alice.transport.protocolVersion}`);
assert.match(alice.transport.sessionId, /^[0-9a-f]{32}$/);
assert.match(c.getInstructions(), /request_id/);
assert.equal(c.getServerVersion().name, 'kagent');

const tools = (await c.listTools()).tools;
assert.equal(tools.length, 21);
for (const t of tools) assert.equal(t.inputSchema.type, 'object');
const prompts = (await c.listPrompts()).prompts.map((p) => p.name);
assert.deepEqual(prompts, ['sandbox-task', 'sandbox-recovery']);
const p = await c.getPrompt({ name: 'sandbox-task', arguments: { task: 'count words', namespace: ns } });
assert.equal(p.messages.length, 2);
assert.match(p.messages[1].content.text, /^Task parameters:\n/);
await protocolError(c.getPrompt({ name: 'nope', arguments: {} }), -32602, /unknown prompt/);
await protocolError(c.getPrompt({ name: 'sandbox-task', arguments: { task: 'x', template: tmpl } }),
  -32602, /namespace is required when template is supplied/);
await c.ping();
await c.setLoggingLevel('warning');
step('listed 21 tools and 2 prompts');

const templates = json(await call(c, 'list_sandbox_templates', { namespace: ns })).templates;
assert.ok(templates.some((t) => t.name === tmpl && t.namespace === ns), JSON.stringify(templates));

// create: the template may still be preparing; retry with the SAME request_id as the
// instructions say (a retry never creates a second sandbox)
let sbx;
for (let i = 0; ; i++) {
  const r = await c.callTool({ name: 'create_sandbox', arguments: { namespace: ns, template: tmpl, request_id: 'agent-flow-1', ttl_seconds: 600 } });
  if (!r.isError) { sbx = json(r); break; }
  if (i > 100 || !/UNAVAILABLE|FAILED_PRECONDITION|NOT_FOUND/.test(r.content[0].text)) throw new Error(r.content[0].text);
  await new Promise((res) => setTimeout(res, 200));
}
assert.equal(sbx.state, 'RUNTIME_STATE_READY');
assert.equal(sbx.operation, 'RUNTIME_OPERATION_NONE');
assert.equal(sbx.node, 'node-1'); // the node serving it (test_mcp.sh names it)
assert.match(sbx.expires_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
const again = json(await call(c, 'create_sandbox', { namespace: ns, template: tmpl, request_id: 'agent-flow-1' }));
assert.equal(again.id, sbx.id);
const id = sbx.id;
step(`created ${id}`);

// progress: a call with onprogress gets notifications/progress over SSE
const progress = [];
const got = json(await call(c, 'get_sandbox', { sandbox_id: id }, { onprogress: (e) => progress.push(e) }));
assert.equal(got.id, id);
assert.ok(progress.length >= 1, 'no progress notification');
const listed = json(await call(c, 'list_sandboxes', { page_size: 100 })).sandboxes;
assert.ok(listed.some((s) => s.id === id && s.node === 'node-1'), JSON.stringify(listed));

const input = 'hello\nworld\n';
const w = json(await call(c, 'write_sandbox_file', { sandbox_id: id, path: 'in/input.txt', data_base64: Buffer.from(input).toString('base64'), mode: 420 }));
assert.equal(w.bytes_written, input.length);
step('wrote in/input.txt');

// a process with 1.5 MB of stdout (more than one 1 MiB read) and a little stderr, exit 3
const script = 'cat in/input.txt; sleep 0.3; head -c 1500000 /dev/zero | tr "\\0" x; echo; echo err >&2; cat in/input.txt > out.txt; exit 3';
const proc = json(await call(c, 'start_sandbox_process', { sandbox_id: id, command: ['sh', '-c', script], env: { LANG: 'C' } }));
assert.match(proc.process_id, /^\d+$/);
// Let it finish first, so the reads below see all 1.5 MB at once and must hit the 1 MiB cap
// (reading while it writes may get less than 1 MiB per read on a loaded machine).
for (let i = 0; ; i++) {
  const st = json(await call(c, 'get_sandbox_process', { sandbox_id: id, process_id: proc.process_id }));
  if (st.status !== 'PROCESS_STATUS_RUNNING') break;
  assert.ok(i < 600, 'process never finished');
  await new Promise((res) => setTimeout(res, 100));
}
let so = 0, se = 0, out = '', err = '', reads = 0, sawTruncated = false, last;
for (;;) {
  last = json(await call(c, 'read_sandbox_outputs', { sandbox_id: id, process_id: proc.process_id, stdout_offset: so, stderr_offset: se }));
  reads++;
  const o = Buffer.from(last.stdout_base64, 'base64').toString(), e = Buffer.from(last.stderr_base64, 'base64').toString();
  assert.equal(last.stdout_offset, so + Buffer.byteLength(o));
  assert.equal(last.stderr_offset, se + Buffer.byteLength(e));
  assert.ok(Buffer.byteLength(o) + Buffer.byteLength(e) <= 1 << 20);
  out += o; err += e; so = last.stdout_offset; se = last.stderr_offset;
  sawTruncated ||= last.truncated;
  if (last.exited && !last.truncated) break;
  if (!last.truncated) await new Promise((res) => setTimeout(res, 100));
  assert.ok(reads < 300, 'process never finished');
}
assert.equal(last.exit_code, 3);
assert.ok(sawTruncated, 'the 1 MiB cap never truncated');
assert.equal(out, input + 'x'.repeat(1500000) + '\n');
assert.equal(err, 'err\n');
const gp = json(await call(c, 'get_sandbox_process', { sandbox_id: id, process_id: proc.process_id }));
assert.equal(gp.status, 'PROCESS_STATUS_FAILED');
assert.equal(gp.exit_code, 3);
step(`read ${out.length + err.length} bytes of output in ${reads} reads`);

// kill a long process
const sleeper = json(await call(c, 'start_sandbox_process', { sandbox_id: id, command: ['sleep', '60'] }));
const killed = json(await call(c, 'kill_sandbox_process', { sandbox_id: id, process_id: sleeper.process_id }));
assert.equal(killed.exit_code, 137);
const gk = json(await call(c, 'get_sandbox_process', { sandbox_id: id, process_id: sleeper.process_id }));
assert.equal(gk.status, 'PROCESS_STATUS_TERMINATED');

const file = await call(c, 'read_sandbox_file', { sandbox_id: id, path: 'out.txt' });
assert.equal(file.content[0].text, '1: hello\n2: world\n');
const page = await call(c, 'read_sandbox_file', { sandbox_id: id, path: 'out.txt', offset: 2, limit: 1 });
assert.equal(page.content[0].text, '2: world\n');
await callFails(c, 'read_sandbox_file', { sandbox_id: id, path: 'missing.txt' }, /^NOT_FOUND/);
step('read out.txt');

// mistakes: wrong types, missing arguments, unknown tools, bad base64, oversized files
await callFails(c, 'start_sandbox_process', { sandbox_id: id, command: 'ls -l' }, /command must be an array of strings/);
await callFails(c, 'create_sandbox', { namespace: ns, template: tmpl }, /request_id is required/);
await callFails(c, 'get_sandbox', { sandbox_id: 'not-a-uuid' }, /Sandbox ID must be a UUID/);
await callFails(c, 'write_sandbox_file', { sandbox_id: id, path: 'x', data_base64: '!!' }, /invalid base64/);
await callFails(c, 'write_sandbox_file', { sandbox_id: id, path: 'big', data_base64: Buffer.alloc((1 << 20) + 1).toString('base64') }, /file exceeds MCP 1 MiB limit/);
const exact = json(await call(c, 'write_sandbox_file', { sandbox_id: id, path: 'big', data_base64: Buffer.alloc(1 << 20, 7).toString('base64') }));
assert.equal(exact.bytes_written, 1 << 20);
await protocolError(c.callTool({ name: 'rm_rf', arguments: {} }), -32602, /Unknown tool/);
step('mistakes answered');

// another identity sees nothing of alice's sandbox
await callFails(bob.client, 'get_sandbox', { sandbox_id: id }, /^NOT_FOUND: sandbox not found/);
await callFails(bob.client, 'read_sandbox_file', { sandbox_id: id, path: 'out.txt' }, /^NOT_FOUND/);
await callFails(bob.client, 'start_sandbox_process', { sandbox_id: id, command: ['true'] }, /^NOT_FOUND/);
await callFails(bob.client, 'delete_sandbox', { sandbox_id: id }, /^NOT_FOUND/);
const bobs = json(await call(bob.client, 'list_sandboxes', {})).sandboxes;
assert.ok(!bobs.some((s) => s.id === id));
step('bob refused');

// raw HTTP: bad JSON, batch, wrong session, oversized body, wrong Accept, rebinding
const hdrs = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'x-user-id': 'alice@example.com' };
let r = await fetch(url, { method: 'POST', headers: hdrs, body: '{"jsonrpc":"2.0",' });
assert.equal(r.status, 400);
assert.equal((await r.json()).error.code, -32700);
r = await fetch(url, { method: 'POST', headers: hdrs, body: '[{"jsonrpc":"2.0","id":1,"method":"ping"}]' });
assert.equal(r.status, 400);
assert.equal((await r.json()).error.code, -32600);
r = await fetch(url, { method: 'POST', headers: { ...hdrs, 'mcp-session-id': 'f'.repeat(32) }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' });
assert.equal(r.status, 404);
r = await fetch(url, { method: 'POST', headers: { ...hdrs, 'mcp-session-id': alice.transport.sessionId, 'x-user-id': 'bob@example.com' }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' });
assert.equal(r.status, 404, 'a session is its owner\'s only');
r = await fetch(url, { method: 'POST', headers: hdrs, body: '{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"' + 'x'.repeat(5 << 20) + '"}}' });
assert.equal(r.status, 413);
r = await fetch(url, { method: 'POST', headers: { ...hdrs, accept: 'text/html' }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' });
assert.equal(r.status, 406);
r = await fetch(url, { method: 'POST', headers: { ...hdrs, 'mcp-protocol-version': '1999-01-01' }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' });
assert.equal(r.status, 400);
r = await fetch(url, { method: 'POST', headers: { ...hdrs, origin: 'http://evil.example.com' }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' });
assert.equal(r.status, 403);
r = await fetch(url, { method: 'GET', headers: { accept: 'text/event-stream', 'x-user-id': 'alice@example.com' } });
assert.equal(r.status, 405);
step('raw HTTP checks');

const del = json(await call(c, 'delete_sandbox', { sandbox_id: id }));
assert.ok(['RUNTIME_STATE_DELETED', 'RUNTIME_STATE_DELETING'].includes(del.state), del.state);
await callFails(c, 'start_sandbox_process', { sandbox_id: id, command: ['true'] }, /Sandbox is not ready or has expired/);
await alice.transport.terminateSession();
await alice.client.close();
await bob.transport.terminateSession();
await bob.client.close();
step('deleted; sessions ended');
console.log('PASS agent_flow');
