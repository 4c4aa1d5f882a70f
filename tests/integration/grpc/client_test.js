// Real-client checks of the gRPC bridge with npm's @grpc/grpc-js (+ @grpc/proto-loader).
// usage: node client_test.js PORT PROTO_DIR   (node_modules found through NODE_PATH)
'use strict';
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');
const zlib = require('zlib');
const path = require('path');

const port = process.argv[2];
const def = loader.loadSync(path.join(process.argv[3], 'kbtest.proto'), {
  keepCase: true, longs: Number, defaults: true,
});
const kbtest = grpc.loadPackageDefinition(def).kbtest;
const MIB = 1 << 20;
const opts = { 'grpc.max_receive_message_length': 64 * MIB,
  'grpc.max_send_message_length': 64 * MIB };
const client = new kbtest.TestService(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), opts);
const missing = new kbtest.Missing(`127.0.0.1:${port}`, grpc.credentials.createInsecure());

function check(name, cond, detail) {
  if (!cond) throw new Error(`${name}: ${detail === undefined ? '' : detail}`);
  console.log(`ok   ${name}`);
}
const deadline = (ms) => new Date(Date.now() + ms);
function unary(c, method, req, md, options) {
  return new Promise((resolve, reject) => {
    c[method](req, md || new grpc.Metadata(), options || { deadline: deadline(10000) },
      (err, res) => (err ? reject(err) : resolve(res)));
  });
}
async function expectError(name, p, code, needle) {
  try {
    await p;
  } catch (e) {
    check(name, e.code === code && (!needle || (e.details || '').includes(needle)),
      `got ${e.code} ${e.details}`);
    return;
  }
  throw new Error(`${name}: succeeded, want code ${code}`);
}
async function stats() {
  return unary(client, 'Stats', {});
}
async function waitFor(pred, ms = 5000) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await pred()) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return pred();
}

async function main() {
  check('unary echo', (await unary(client, 'Echo', { text: 'hej' })).text === 'hej');
  check('unary echo from another thread',
    (await unary(client, 'Echo', { text: 'x', delay_ms: 10 })).text === 'x');

  // server streaming, 1000 messages
  const seqs = await new Promise((resolve, reject) => {
    const out = [];
    const call = client.Count({ n: 1000, pad_bytes: 10 });
    call.on('data', (m) => out.push(m.seq));
    call.on('error', reject);
    call.on('end', () => resolve(out));
  });
  check('server streaming 1000 messages in order',
    seqs.length === 1000 && seqs.every((s, i) => s === i), seqs.length);

  // client streaming, 64 MiB in 1 MiB chunks
  let crc = 0;
  const up = await new Promise((resolve, reject) => {
    const call = client.Upload({ deadline: deadline(60000) }, (err, res) => (err ? reject(err) : resolve(res)));
    let i = 0;
    const pump = () => {
      while (i < 64) {
        const buf = Buffer.alloc(MIB, (i * 13) & 0xff);
        buf[7] = i;
        crc = zlib.crc32(buf, crc);
        i++;
        if (!call.write({ data: buf })) {
          call.once('drain', pump);
          return;
        }
      }
      call.end();
    };
    pump();
  });
  check('client streaming 64 MiB in 1 MiB chunks',
    up.total_bytes === 64 * MIB && up.chunks === 64 && up.crc32 === crc,
    `${up.total_bytes} ${up.chunks} ${up.crc32} want ${crc}`);

  // metadata
  const md = new grpc.Metadata();
  md.add('x-user-id', 'carol');
  md.add('kagent-sandbox-id', 'a');
  md.add('kagent-sandbox-id', 'b');
  let m = await unary(client, 'Meta', { key: 'x-user-id' }, md);
  check('metadata exactly one', m.one === 'carol' && m.one_error === 0 && m.timeout_ms > 0);
  m = await unary(client, 'Meta', { key: 'kagent-sandbox-id' }, md);
  check('metadata all values, duplicate refused',
    JSON.stringify(m.values) === '["a","b"]' && m.one_error === -31, JSON.stringify(m));

  // errors
  await expectError('unknown method -> UNIMPLEMENTED', unary(missing, 'Nope', {}),
    grpc.status.UNIMPLEMENTED, '/kbtest.Missing/Nope');
  let base = (await stats()).handler_cancels;
  await expectError('deadline exceeded',
    unary(client, 'Sleep', { ms: 5000 }, new grpc.Metadata(), { deadline: deadline(300) }),
    grpc.status.DEADLINE_EXCEEDED);
  check('handler saw the deadline',
    await waitFor(async () => (await stats()).handler_cancels >= base + 1));

  // cancellation mid-stream
  base = (await stats()).handler_cancels;
  const got = await new Promise((resolve, reject) => {
    const out = [];
    const call = client.Count({ n: 1000000, pad_bytes: 1000 });
    call.on('data', (msg) => {
      out.push(msg.seq);
      if (out.length === 5) call.cancel();
    });
    call.on('error', (e) => (e.code === grpc.status.CANCELLED ? resolve(out) : reject(e)));
    call.on('end', () => reject(new Error('stream ended instead of being cancelled')));
  });
  check('stream cancelled after 5 messages', got.slice(0, 5).join() === '0,1,2,3,4');
  check('server stopped streaming after cancel',
    await waitFor(async () => (await stats()).handler_cancels >= base + 1));

  client.close();
  missing.close();
  console.log('node client: all checks passed');
}

main().catch((e) => {
  console.error(`FAIL ${e.stack || e}`);
  process.exit(1);
});
