// A daemon killed with SIGKILL and started again (the same data directory and socket) between two
// steps of a running agent: the agent's next request finds no daemon, waits for it, and the agent
// finishes, every side effect run exactly once (counted in a file, or by the MCP server's process);
// for safeToolCall and LedgeredMcpClient, over the session stream or unary calls (EFFECTD_SESSION).
// The negative control is the same agent with a client that does not wait (reconnectWaitMs: 0): it
// dies at the restart with UNAVAILABLE. One daemon for the file, restarted by each test.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, beforeEach, test } from 'node:test';
import { Client, EffectdError, safeToolCall } from '../src/index.js';
import { LedgeredMcpClient } from '../src/mcp.js';
import { WARNING_CODE } from '../src/reconnect.js';
import { startDaemon } from '../src/testing.js';
import { connect, executions, startServer, waitFor } from '../fixtures/mcp-servers.mjs';

const require = createRequire(import.meta.url);
const grpc = require('@grpc/grpc-js');

const CITIES = ['Paris', 'Rome', 'Oslo'];
const BOOKED = CITIES.map((city) => `book ${city}`);
// The step before which the daemon restarts: the second booking's.
const AT = 2;
// As long as a daemon may take to start on a loaded machine (bounded).
const PATIENT = { timeoutMs: 60_000, reconnectWaitMs: 60_000 };

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'efd-restart-'));
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'efd-restart-work-'));
let daemon;
let starting = null;
const waits = [];
const closers = [];

process.on('warning', (warning) => {
  if (warning.code === WARNING_CODE) waits.push(warning.message);
});

before(async () => {
  daemon = await startDaemon({ dataDir });
});

/** The daemon started again by the test before, once it serves. */
beforeEach(async () => {
  if (starting) daemon = await starting;
  starting = null;
  waits.length = 0;
});

afterEach(() => {
  for (const close of closers.splice(0)) close();
});

after(async () => {
  if (starting) daemon = await starting;
  await daemon?.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
  fs.rmSync(work, { recursive: true, force: true });
});

function client(options) {
  const c = new Client({ target: daemon.target, ...options });
  closers.push(() => c.close());
  return c;
}

/**
 * An agent's steps, counted: the `at`-th kills the daemon (SIGKILL) and, once `effectd` has seen its
 * connection go (a request written in the instant before may have been applied, as any request in
 * flight at a crash), starts it again in the background, so that the agent's next request finds it
 * away. `step.kills` counts the restarts.
 */
function steps(effectd, at) {
  let count = 0;
  const step = async () => {
    count += 1;
    if (count !== at) return;
    const exited = new Promise((resolve) => daemon.process.once('exit', resolve));
    daemon.process.kill('SIGKILL');
    await exited;
    await waitFor(() => sawItGo(effectd), 'the client to see the daemon go');
    await daemon.stop(); // its listeners; the data directory stays
    starting = startDaemon({ dataDir });
    step.kills += 1;
  };
  step.kills = 0;
  return step;
}

/** `effectd` saw its connection go: its channel is no longer READY, and its session stream ended. */
function sawItGo(effectd) {
  const state = effectd._ledger.getChannel().getConnectivityState(false);
  return state !== grpc.connectivityState.READY && !effectd._session?._stream;
}

/** The agent: books each city with a safe tool call, a step each; the bookings go to `booked`. */
async function bookEach(effectd, runId, booked, step) {
  const answers = [];
  for (const city of CITIES) {
    await step();
    const call = { runId, callId: `book-${city}`, tool: 'book', input: { city } };
    answers.push(
      await safeToolCall(effectd, call, async () => {
        fs.appendFileSync(booked, `book ${city}\n`);
        return `booked ${city}`;
      }),
    );
  }
  return answers;
}

function lines(file) {
  return fs.existsSync(file) ? fs.readFileSync(file, 'utf8').split('\n').filter(Boolean) : [];
}

test('a safeToolCall agent finishes across a daemon restart, each booking once', async () => {
  const effectd = client(PATIENT);
  const booked = path.join(work, 'safe');
  const step = steps(effectd, AT);
  const answers = await bookEach(effectd, 'trip-safe', booked, step);
  assert.deepEqual(answers, CITIES.map((city) => `booked ${city}`));
  assert.equal(step.kills, 1);
  assert.equal(waits.length, 1);
  assert.deepEqual(lines(booked), BOOKED);
});

test('negative control: an agent whose client does not wait dies at the restart', async () => {
  const effectd = client({ timeoutMs: 60_000, reconnectWaitMs: 0 });
  const booked = path.join(work, 'control');
  const error = await bookEach(effectd, 'trip-control', booked, steps(effectd, AT)).catch((e) => e);
  assert.ok(error instanceof EffectdError, String(error));
  assert.equal(error.code, 'UNAVAILABLE');
  assert.deepEqual(lines(booked), BOOKED.slice(0, AT - 1));
});

test('a LedgeredMcpClient agent finishes across a daemon restart, each send once', async () => {
  const server = await startServer('stdio');
  const mcp = await connect(server);
  closers.push(() => mcp.close());
  const effectd = client(PATIENT);
  const tools = new LedgeredMcpClient(mcp, effectd, { runId: 'trip-mcp', server: 'counter' });
  const step = steps(effectd, AT);
  for (const [i, to] of ['ann', 'bob', 'cyd'].entries()) {
    await step();
    const result = await tools.callTool({ name: 'send', arguments: { to }, callId: `tc-${i}` });
    assert.ok(!result.isError);
  }
  assert.equal(step.kills, 1);
  assert.equal(waits.length, 1);
  assert.equal(executions(server.state, 'send'), 3);
});
