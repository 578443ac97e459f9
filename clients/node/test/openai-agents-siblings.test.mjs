// @effectd/client/openai-agents: the parallel calls of a step killed together are named by one
// interruption, though their leases run out at different times (each was last renewed at its own
// heartbeat); a sibling whose attempt is alive is not named. The adapters share the interruption
// (adapter.js), so this holds for @effectd/client/ai too.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Agent, run, setTracingDisabled, tool } from '@openai/agents';
import { ScriptedModel, assistantMessage, functionCall } from '@openai/agents/testing';
import { Client } from '../src/index.js';
import { leaseLeftMs } from '../src/adapter.js';
import { AgentLedger, interruptionOf } from '../src/openai-agents.js';
import { startDaemon } from '../src/testing.js';

setTracingDisabled(true);
// The lease of the sibling still STARTED: it runs out after the first's.
const LATER_MS = 1500;
// A live attempt's lease and its heartbeats (bounded in count).
const LIVE_MS = 600;
const BEATS = 60;
const BEAT_MS = 100;

let daemon;
let effectd;
let runs = 0;

before(async () => {
  daemon = await startDaemon();
  effectd = new Client({ target: daemon.target });
});

after(async () => {
  effectd?.close();
  await daemon?.stop();
});

const TO = { type: 'object', properties: { to: { type: 'string' } }, required: ['to'], additionalProperties: false };

/** Sends to Ann and to Bo in one model response (p-1, p-2); `sent` holds what it sent. */
function parallelAgent(ledger, sent) {
  const send = tool({
    name: 'send',
    description: 'Sends a message.',
    parameters: TO,
    errorFunction: null,
    execute: async ({ to }) => {
      sent.push(to);
      return `sent to ${to}`;
    },
  });
  const model = new ScriptedModel([
    ['ann', 'bo'].map((to, i) => functionCall('send', { to }, { callId: `p-${i + 1}` })),
    [assistantMessage('done')],
  ]);
  return new Agent({ name: 'trip', model, tools: [ledger.tool(send)] });
}

/** p-1 UNKNOWN (its process died), p-2 STARTED with a lease still running; returns p-2's attempt. */
async function crashedStep(runId, secondLeaseMs) {
  const held = await effectd.prepareTool({ runId, callId: 'p-1', tool: 'send', input: { to: 'ann' }, start: true });
  await effectd.reportUnknown({ runId, callId: 'p-1', attempt: held.call.attempt, reason: 'the process died' });
  const second = await effectd.prepareTool({ runId, callId: 'p-2', tool: 'send', input: { to: 'bo' }, start: true, leaseMs: secondLeaseMs });
  return second.call.attempt;
}

/** The run resumed in a new client: the interruption it ended with. */
async function restart(runId, sent) {
  const client = new Client({ target: daemon.target });
  try {
    const ledger = new AgentLedger(client);
    const error = await ledger.run(runId, () => run(parallelAgent(ledger, sent), 'send')).then(() => null, (e) => e);
    const stop = interruptionOf(error);
    assert.ok(stop, `the run did not end with an interruption: ${error}`);
    return stop;
  } finally {
    client.close();
  }
}

const newRun = () => `sib-${process.pid}-${(runs += 1)}`;

test('a sibling whose lease runs out later is named at once', async () => {
  const runId = newRun();
  await crashedStep(runId, LATER_MS);
  const sent = [];
  const stop = await restart(runId, sent);
  // Before: p-1 alone, and p-2 took another reconcile-and-resume round.
  assert.deepEqual(Object.fromEntries(stop.calls.map((c) => [c.callId, c.state])), { 'p-1': 'UNKNOWN', 'p-2': 'UNKNOWN' });
  assert.deepEqual(sent, []);
});

test('a sibling whose attempt is alive (it heartbeats) is not waited for past one lease, and not named', async () => {
  const runId = newRun();
  const attempt = await crashedStep(runId, LIVE_MS);
  let beating = true;
  const beats = (async () => {
    for (let i = 0; i < BEATS && beating; i += 1) {
      await effectd.heartbeat({ runId, callId: 'p-2', attempt, leaseMs: LIVE_MS });
      await new Promise((r) => setTimeout(r, BEAT_MS));
    }
  })();
  let stop;
  try {
    stop = await restart(runId, []);
  } finally {
    beating = false;
    await beats;
  }
  assert.deepEqual(stop.calls.map((c) => c.callId), ['p-1']);
  assert.equal((await effectd.getToolCall({ runId, callId: 'p-2' })).state, 'STARTED');
});

test('the wait: the last STARTED lease, each bounded by its own lease; none without one', () => {
  const now = Date.parse('2026-01-01T00:00:00Z');
  const call = (state, endIn, leaseMs) => ({
    call: { state, leaseExpiresAt: endIn === null ? null : new Date(now + endIn), updatedAt: new Date(now + endIn - leaseMs) },
  });
  assert.equal(leaseLeftMs({ items: [] }, now), 0);
  assert.equal(leaseLeftMs({ items: [call('UNKNOWN', 900, 1000)] }, now), 0);
  assert.equal(leaseLeftMs({ items: [call('STARTED', 300, 1000), call('STARTED', 900, 1000)] }, now), 950);
  // A daemon's clock a minute ahead of ours: its lease of 1 s is waited for 1 s, not a minute.
  assert.equal(leaseLeftMs({ items: [call('STARTED', 60_000, 1000)] }, now), 1050);
});
