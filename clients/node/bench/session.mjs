// The Node client's ways to send the ledger's requests, measured in one run against one real daemon
// (a separate process, Unix socket): unary calls, the gRPC session stream, and the session on the
// daemon's framed socket (the default for a daemon on this host).
//
// Two workloads: `get` (GetToolCall of a stored call: a read, little work in the daemon, so mostly
// the transport) and `lifecycle` (PrepareTool with start, then CommitTool: two round trips and two
// writes). Each runs with 1 and 32 calls in flight, the three transports in turn (the order rotated
// every round) for `--rounds` rounds of `--seconds` each; the ratios are of the medians: the stream
// and the frames over unary, and the frames over the stream. The daemon runs with --no-sync unless
// `--sync` (fsync on every commit would hide the transport behind the disk). The machine is shared
// and noisy: read the ratios, not the absolute numbers.
//
//   node clients/node/bench/session.mjs [--seconds 1] [--rounds 5] [--sync]
//   (EFFECTD_PYTHON: the daemon's interpreter, default the repository's .venv)

import os from 'node:os';
import { parseArgs } from 'node:util';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { Client } = require('../src/index.js');
const { startDaemon } = require('../src/testing.js');

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '1' },
    rounds: { type: 'string', default: '5' },
    sync: { type: 'boolean', default: false },
  },
});
const seconds = Number(values.seconds);
const rounds = Number(values.rounds);

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

let serial = 0;
const WORKLOADS = {
  async get(client) {
    await client.getToolCall({ runId: 'bench', callId: 'stored' });
  },
  async lifecycle(client) {
    serial += 1;
    const ref = { runId: 'bench-life', callId: `c${serial}` };
    const p = await client.prepareTool({ ...ref, tool: 't', input: { n: serial }, start: true });
    await client.commitTool({ ...ref, attempt: p.call.attempt, result: { ok: true } });
  },
};

/** Operations per second and the median latency (ms) of `inflight` loops running `op` for `seconds`. */
async function measure(client, op, inflight) {
  const latencies = [];
  const end = performance.now() + seconds * 1000;
  const loop = async () => {
    while (performance.now() < end) {
      const t = performance.now();
      await op(client);
      latencies.push(performance.now() - t);
    }
  };
  const start = performance.now();
  await Promise.all(Array.from({ length: inflight }, loop));
  const elapsed = (performance.now() - start) / 1000;
  return { opsPerSecond: latencies.length / elapsed, p50: median(latencies) };
}

const TRANSPORTS = ['unary', 'stream', 'frames'];
const load = os.loadavg()[0];
const daemon = await startDaemon({ args: values.sync ? ['--sync'] : ['--no-sync'] });
const options = { target: daemon.target, timeoutMs: 30_000 };
const clients = { unary: new Client({ ...options, session: false }) };
// A client reads EFFECTD_TRANSPORT when it is made: 'grpc' keeps the gRPC stream to a daemon on
// this host, which it would otherwise ask on its framed socket.
process.env.EFFECTD_TRANSPORT = 'grpc';
clients.stream = new Client({ ...options, session: true });
delete process.env.EFFECTD_TRANSPORT;
clients.frames = new Client({ ...options, session: true });
const cell = (text, width) => String(text).padStart(width);
try {
  const stored = await clients.unary.prepareTool({ runId: 'bench', callId: 'stored', tool: 't', input: 1, start: true });
  await clients.unary.commitTool({ runId: 'bench', callId: 'stored', attempt: stored.call.attempt, result: { stored: true } });
  for (const client of Object.values(clients)) {
    for (let i = 0; i < 50; i += 1) await WORKLOADS.get(client); // warm: channel, stream, JIT
  }
  for (const [which, transport] of [['stream', 'session'], ['frames', 'frames']]) {
    if (clients[which].transport !== transport) throw new Error(`the ${which} client travels by ${clients[which].transport}`);
  }
  console.log(
    `effectd Node client, unary vs session stream vs framed socket: ${rounds} rounds x ${seconds} s each, daemon ${
      values.sync ? 'durable (--sync)' : '--no-sync'
    }, Unix socket`,
  );
  console.log(
    'workload   in flight   unary ops/s  stream ops/s  frames ops/s  stream/unary  frames/unary  frames/stream   p50 ms unary / stream / frames',
  );
  for (const [name, op] of Object.entries(WORKLOADS)) {
    for (const inflight of [1, 32]) {
      const runs = { unary: [], stream: [], frames: [] };
      for (let r = 0; r < rounds; r += 1) {
        // Rotate which goes first, so that drift on a shared machine falls on all three.
        const order = TRANSPORTS.map((_, i) => TRANSPORTS[(i + r) % TRANSPORTS.length]);
        for (const which of order) runs[which].push(await measure(clients[which], op, inflight));
      }
      const ops = Object.fromEntries(TRANSPORTS.map((t) => [t, median(runs[t].map((x) => x.opsPerSecond))]));
      const p50 = TRANSPORTS.map((t) => median(runs[t].map((x) => x.p50)).toFixed(3));
      console.log(
        [
          name.padEnd(10),
          cell(inflight, 9),
          cell(ops.unary.toFixed(0), 12),
          cell(ops.stream.toFixed(0), 13),
          cell(ops.frames.toFixed(0), 13),
          cell(`${(ops.stream / ops.unary).toFixed(2)}x`, 13),
          cell(`${(ops.frames / ops.unary).toFixed(2)}x`, 13),
          cell(`${(ops.frames / ops.stream).toFixed(2)}x`, 14),
          `   ${p50.join(' / ')}`,
        ].join(' '),
      );
    }
  }
  console.log('ratios of ops/s: above 1, the first named is faster');
  console.log(`load average (1 min) at the start ${load.toFixed(2)}, at the end ${os.loadavg()[0].toFixed(2)}, ${os.cpus().length} CPUs`);
} finally {
  for (const client of Object.values(clients)) client.close();
  await daemon.stop();
}
