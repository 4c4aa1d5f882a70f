// MCP over https through the official TypeScript SDK client against a real kagentd with TLS.
// The node's test CA comes from NODE_EXTRA_CA_CERTS (no code here trusts it), the identity from a
// bearer token. usage: node tls_mcp.mjs URL TOKEN TEMPLATE        (non-zero exit on failure)
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import assert from 'node:assert/strict';

const [url, token, tmpl] = process.argv.slice(2);
assert.ok(url.startsWith('https://'), `not an https URL: ${url}`);
assert.ok(process.env.NODE_EXTRA_CA_CERTS, 'NODE_EXTRA_CA_CERTS must name the test CA');

const client = new Client({ name: 'kagent-tls-test', version: '1.0.0' });
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { authorization: `Bearer ${token}` } },
});
await client.connect(transport);
const tools = await client.listTools();
assert.equal(tools.tools.length, 21, `tools: ${tools.tools.map((t) => t.name)}`);
const r = await client.callTool({ name: 'list_sandbox_templates', arguments: { namespace: 'kagent' } });
assert.notEqual(r.isError, true, JSON.stringify(r));
assert.match(r.content[0].text, new RegExp(`"name":"${tmpl}"`));
await transport.terminateSession();
await client.close();
console.log('PASS mcp sdk: initialize, tools/list, tools/call over https');
