// The Node client's round trips over the ledger session stream against its unary calls, measured
// in one run against one real daemon (a separate process, Unix socket).
//
// Two workloads: `get` (GetToolCall of a stored call: a read, little work in the daemon, so mostly
// the transport) and `lifecycle` (PrepareTool with start, then CommitTool: two round trips and two
// writes). Each runs with 1 and 32 calls in flight, unary and session alternating for `--rounds`
// rounds of `--seconds` each; the ratios are of the medians. The daemon runs with --no-sync unless
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

// The gRPC session stream, even to this daemon on the same host (which a client would otherwise ask
// on its framed socket).
process.env.EFFECTD_TRANSPORT = 'grpc';
const load = os.loadavg()[0];
const daemon = await startDaemon({ args: values.sync ? ['--sync'] : ['--no-sync'] });
const unary = new Client({ target: daemon.target, session: false, timeoutMs: 30_000 });
const session = new Client({ target: daemon.target, session: true, timeoutMs: 30_000 });
try {
  const stored = await unary.prepareTool({ runId: 'bench', callId: 'stored', tool: 't', input: 1, start: true });
  await unary.commitTool({ runId: 'bench', callId: 'stored', attempt: stored.call.attempt, result: { stored: true } });
  for (const client of [unary, session]) {
    for (let i = 0; i < 50; i += 1) await WORKLOADS.get(client); // warm: channel, stream, JIT
  }
  if (session.transport !== 'session') throw new Error('the daemon does not serve the session stream');
  console.log(
    `effectd Node client, unary vs session stream: ${rounds} rounds x ${seconds} s each, daemon ${
      values.sync ? 'durable (--sync)' : '--no-sync'
    }, Unix socket`,
  );
  console.log('workload   in flight   unary ops/s   session ops/s   ratio   unary p50 ms   session p50 ms   p50 ratio');
  for (const [name, op] of Object.entries(WORKLOADS)) {
    for (const inflight of [1, 32]) {
      const runs = { unary: [], session: [] };
      for (let r = 0; r < rounds; r += 1) {
        // Alternate which goes first, so that drift on a shared machine falls on both.
        const order = r % 2 === 0 ? ['unary', 'session'] : ['session', 'unary'];
        for (const which of order) runs[which].push(await measure(which === 'unary' ? unary : session, op, inflight));
      }
      const u = median(runs.unary.map((x) => x.opsPerSecond));
      const s = median(runs.session.map((x) => x.opsPerSecond));
      const up50 = median(runs.unary.map((x) => x.p50));
      const sp50 = median(runs.session.map((x) => x.p50));
      console.log(
        [
          name.padEnd(10),
          String(inflight).padStart(9),
          u.toFixed(0).padStart(13),
          s.toFixed(0).padStart(15),
          `${(s / u).toFixed(2)}x`.padStart(7),
          up50.toFixed(3).padStart(14),
          sp50.toFixed(3).padStart(16),
          `${(sp50 / up50).toFixed(2)}x`.padStart(11),
        ].join(' '),
      );
    }
  }
  console.log('ratio: session ops/s over unary ops/s (above 1: the stream is faster); p50 ratio: session over unary latency');
  console.log(`load average (1 min) at the start ${load.toFixed(2)}, at the end ${os.loadavg()[0].toFixed(2)}, ${os.cpus().length} CPUs`);
} finally {
  unary.close();
  session.close();
  await daemon.stop();
}
