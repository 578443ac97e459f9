// safeToolCall records what really happened: transport failures are unknown outcomes, recording
// requests are retried with the same attempt, and results handed back are acknowledged.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import {
  Client,
  safeToolCall,
  errors,
  CallInProgress,
  OutcomeUnknown,
  ResultNotRecorded,
  ReconciliationNeeded,
} from '../src/index.js';
import { startDaemon } from '../src/testing.js';

const require = createRequire(import.meta.url);
const grpc = require('@grpc/grpc-js');
const { statusTypes } = require('../src/proto.js');
const { isOutcomeUnknown } = require('../src/safe.js');

let daemon;
const closers = [];

function agent(options = {}) {
  const client = new Client({ target: daemon.target, ...options });
  closers.push(() => client.close());
  return client;
}

before(async () => {
  daemon = await startDaemon();
});

after(async () => {
  for (const close of closers.reverse()) await close();
  await daemon?.stop();
});

const identity = (b) => b;
const FORWARDED = [
  '/effectd.v1.ToolLedger/PrepareTool',
  '/effectd.v1.ToolLedger/StartTool',
  '/effectd.v1.ToolLedger/CommitTool',
  '/effectd.v1.ToolLedger/ReportUnknown',
  '/effectd.v1.ToolLedger/Heartbeat',
  '/effectd.v1.ToolLedger/GetToolCall',
  '/effectd.v1.Recovery/AcknowledgeRecovery',
];

/**
 * A gRPC proxy on 127.0.0.1 in front of the daemon that fails on cue: `fail(method, {lost})` makes
 * the next call of that method fail with UNAVAILABLE, before reaching the daemon or (lost) after the
 * daemon applied it; with `maybe` the status says STORAGE_UNAVAILABLE, mayHaveBeenApplied=true (a
 * daemon whose database COMMIT's outcome it could not learn).
 */
/** UNAVAILABLE / STORAGE_UNAVAILABLE with mayHaveBeenApplied=true, as the daemon sends it. */
function storageUnavailable() {
  const types = statusTypes();
  const info = types.ErrorInfo.encode({
    reason: 'STORAGE_UNAVAILABLE',
    domain: 'effectd',
    metadata: { mayHaveBeenApplied: 'true' },
  }).finish();
  const details = 'PostgreSQL did not answer COMMIT; the request may have been applied';
  const status = types.Status.encode({
    code: grpc.status.UNAVAILABLE,
    message: details,
    details: [{ type_url: 'type.googleapis.com/google.rpc.ErrorInfo', value: info }],
  }).finish();
  const metadata = new grpc.Metadata();
  metadata.set('grpc-status-details-bin', Buffer.from(status));
  return { code: grpc.status.UNAVAILABLE, details, metadata };
}

async function flakyProxy() {
  const upstream = new grpc.Client(daemon.target, grpc.credentials.createInsecure());
  const faults = new Map();
  const calls = [];
  const server = new grpc.Server();
  for (const path of FORWARDED) {
    const name = path.split('/').pop();
    const handler = (call, callback) => {
      calls.push(name);
      const fault = faults.get(name)?.shift();
      const unavailable = fault?.maybe ? storageUnavailable() : { code: grpc.status.UNAVAILABLE, details: 'injected' };
      if (fault && !fault.lost) return callback(unavailable);
      upstream.makeUnaryRequest(path, identity, identity, call.request, call.metadata, (error, answer) => {
        if (error) return callback(error);
        if (fault) return callback(unavailable);
        return callback(null, answer);
      });
      return undefined;
    };
    server.register(path, handler, identity, identity, 'unary');
  }
  const port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
  );
  closers.push(
    () =>
      new Promise((resolve) => {
        upstream.close();
        server.tryShutdown(() => resolve());
      }),
  );
  return {
    target: `127.0.0.1:${port}`,
    calls,
    fail(name, ...list) {
      faults.set(name, [...(faults.get(name) ?? []), ...list]);
    },
  };
}

const FAST = { attempts: 5, deadlineMs: 20_000, initialBackoffMs: 10 };

describe('unknown outcomes (issue 10 item B3)', () => {
  test('a real gRPC UNAVAILABLE thrown by a tool is an unknown outcome, never an error result', async () => {
    // Fails before the fix: committed as an error result ("ERROR": the code was a number).
    const call = { runId: 'grpc', callId: 'g1', tool: 'create_order', input: 1 };
    const orders = new grpc.Client('127.0.0.1:1', grpc.credentials.createInsecure());
    closers.push(() => orders.close());
    const request = () =>
      new Promise((resolve, reject) =>
        orders.makeUnaryRequest('/shop.Orders/Create', identity, identity, Buffer.alloc(0), new grpc.Metadata(), { deadline: Date.now() + 5_000 }, (e, r) =>
          e ? reject(e) : resolve(r),
        ),
      );
    await assert.rejects(safeToolCall(agent(), call, request), (error) => error.code === grpc.status.UNAVAILABLE);
    assert.equal((await agent().getToolCall(call)).state, 'UNKNOWN');
    await assert.rejects(safeToolCall(agent(), call, () => 'again'), ReconciliationNeeded);
  });

  test('an error whose cause is a connection failure is unknown; definiteOn and unknownOn decide first', async () => {
    const reset = Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' });
    class Declined extends Error {}
    class Ambiguous extends Error {}
    const cases = [
      [{}, new Error('payment failed', { cause: reset }), 'UNKNOWN'],
      [{ definiteOn: [Declined] }, new Declined('declined', { cause: reset }), 'COMMITTED'],
      [{ unknownOn: [Ambiguous] }, new Ambiguous('502 from the gateway'), 'UNKNOWN'],
      [{ unknownOn: [(e) => /504/.test(e.message)] }, new Error('504'), 'UNKNOWN'],
      [{}, new RangeError('bad page'), 'COMMITTED'],
    ];
    const states = [];
    for (const [i, [options, thrown]] of cases.entries()) {
      const call = { runId: 'declared', callId: `d${i}`, tool: 't', input: i, ...options };
      await assert.rejects(safeToolCall(agent(), call, () => Promise.reject(thrown)), (error) => error === thrown);
      states.push((await agent().getToolCall(call)).state);
    }
    assert.deepEqual(
      states,
      cases.map(([, , state]) => state),
    );
  });
});

describe('recording retries (issue 10 item B6)', () => {
  test('a commit whose answer was lost is sent again and answered as done', async () => {
    // Fails before the fix: UNAVAILABLE thrown although the tool ran and the commit landed.
    const proxy = await flakyProxy();
    proxy.fail('CommitTool', { lost: true });
    const call = { runId: 'lost', callId: 'c1', tool: 'send', input: 1 };
    let runs = 0;
    const value = await safeToolCall(agent({ target: proxy.target, recordingRetry: FAST }), call, () => {
      runs += 1;
      return { sent: true };
    });
    assert.deepEqual(value, { sent: true });
    assert.equal(runs, 1);
    assert.equal(proxy.calls.filter((m) => m === 'CommitTool').length, 2);
    const record = await agent().getToolCall(call);
    assert.equal(record.state, 'COMMITTED');
    assert.equal(record.history.filter((t) => t.event === 'commit').length, 1);
  });

  test('a result that cannot be recorded throws ResultNotRecorded (unknown), never a tool failure', async () => {
    const proxy = await flakyProxy();
    proxy.fail('CommitTool', ...Array(FAST.attempts).fill({}));
    const call = { runId: 'unrec', callId: 'c1', tool: 'send', input: 1 };
    await assert.rejects(
      safeToolCall(agent({ target: proxy.target, recordingRetry: FAST }), call, () => ({ sent: true })),
      (error) => {
        assert.ok(error instanceof ResultNotRecorded);
        assert.ok(error instanceof OutcomeUnknown);
        assert.deepEqual(error.result, { sent: true });
        assert.equal(error.cause.code, 'UNAVAILABLE');
        return true;
      },
    );
    const record = await agent().getToolCall(call);
    assert.equal(record.state, 'UNKNOWN');
    assert.match(record.history.at(-1).reason, /could not be recorded/);
  });

  test('negative control: with one try a lost answer loses the result', async () => {
    const proxy = await flakyProxy();
    proxy.fail('CommitTool', { lost: true });
    const call = { runId: 'once', callId: 'c1', tool: 'send', input: 1 };
    const once = agent({ target: proxy.target, recordingRetry: { attempts: 1 } });
    await assert.rejects(safeToolCall(once, call, () => 1), ResultNotRecorded);
  });

  test('report unknown, heartbeat and acknowledge are retried with the same attempt', async () => {
    const proxy = await flakyProxy();
    const client = agent({ target: proxy.target, recordingRetry: FAST });
    proxy.fail('ReportUnknown', { lost: true });
    const call = { runId: 'rep', callId: 'r1', tool: 'pay', input: 1 };
    await assert.rejects(safeToolCall(client, call, () => Promise.reject(new OutcomeUnknown('no answer'))), OutcomeUnknown);
    assert.equal((await agent().getToolCall(call)).state, 'UNKNOWN');
    const held = await client.prepareTool({ runId: 'rep', callId: 'h1', tool: 't', input: 1, start: true });
    proxy.fail('Heartbeat', {}, { lost: true });
    await client.heartbeat({ runId: 'rep', callId: 'h1', attempt: held.call.attempt });
    const count = (name) => proxy.calls.filter((m) => m === name).length;
    assert.deepEqual([count('ReportUnknown'), count('Heartbeat')], [2, 3]);
  });

  test('the retry policy honours RetryInfo and stops at its deadline and attempts', async () => {
    const { recordingWait } = require('../src/client.js');
    const policy = { attempts: 5, deadlineMs: 3_000, initialBackoffMs: 200, maxBackoffMs: 500 };
    const down = { code: 'UNAVAILABLE', reason: '', retryDelayMs: null };
    const slow = { code: 'RESOURCE_EXHAUSTED', reason: 'RATE_LIMITED', retryDelayMs: 1_500 };
    const stale = { code: 'FAILED_PRECONDITION', reason: 'STALE_ATTEMPT', retryDelayMs: null };
    assert.deepEqual(
      [1, 2, 3].map((n) => recordingWait(policy, n, down, 0, 1)),
      [200, 400, 500],
    );
    assert.equal(recordingWait(policy, 1, slow, 0, 0), 1_500);
    assert.equal(recordingWait(policy, 1, slow, 2_000, 0), null);
    assert.equal(recordingWait(policy, 5, down, 0, 0), null);
    assert.equal(recordingWait(policy, 1, stale, 0, 0), null);
  });
});

describe('a commit whose outcome the daemon could not learn (issue 14)', () => {
  // UNAVAILABLE / STORAGE_UNAVAILABLE, mayHaveBeenApplied=true: an unknown outcome, never a definite
  // failure after which a repeat would run the tool again.
  const MAYBE_APPLIED = { lost: true, maybe: true };
  const MAYBE = { maybe: true };
  const maybeApplied = (error) => {
    assert.ok(error instanceof errors.STORAGE_UNAVAILABLE);
    assert.equal(error.code, 'UNAVAILABLE');
    assert.equal(error.metadata.mayHaveBeenApplied, 'true');
    assert.ok(isOutcomeUnknown(error));
    return true;
  };

  test('a start that may have been applied is unknown: the tool runs neither now nor on a repeat', async () => {
    const proxy = await flakyProxy();
    proxy.fail('PrepareTool', MAYBE_APPLIED);
    const client = agent({ target: proxy.target, recordingRetry: FAST });
    const call = { runId: 'maybe', callId: 'start', tool: 'send', input: 1, leaseMs: 60_000 };
    let runs = 0;
    const tool = () => {
      runs += 1;
      return 'sent';
    };
    await assert.rejects(safeToolCall(client, call, tool), maybeApplied);
    assert.equal((await agent().getToolCall(call)).state, 'STARTED');
    await assert.rejects(safeToolCall(client, call, tool), CallInProgress);
    assert.equal(runs, 0);
  });

  test('a commit that may have been applied is sent again and answered as done', async () => {
    const proxy = await flakyProxy();
    proxy.fail('CommitTool', MAYBE_APPLIED);
    const call = { runId: 'maybe', callId: 'commit', tool: 'send', input: 1 };
    let runs = 0;
    const value = await safeToolCall(agent({ target: proxy.target, recordingRetry: FAST }), call, () => {
      runs += 1;
      return 'sent';
    });
    assert.equal(value, 'sent');
    assert.equal(runs, 1);
    assert.equal(proxy.calls.filter((m) => m === 'CommitTool').length, 2);
    const record = await agent().getToolCall(call);
    assert.equal(record.state, 'COMMITTED');
    assert.equal(record.history.filter((t) => t.event === 'commit').length, 1);
  });

  test('a commit never known is ResultNotRecorded (unknown); a repeat is RECONCILE, never a second run', async () => {
    const proxy = await flakyProxy();
    proxy.fail('CommitTool', ...Array(FAST.attempts).fill(MAYBE));
    const client = agent({ target: proxy.target, recordingRetry: FAST });
    const call = { runId: 'maybe', callId: 'never', tool: 'send', input: 1 };
    let runs = 0;
    const tool = () => {
      runs += 1;
      return 'sent';
    };
    await assert.rejects(safeToolCall(client, call, tool), (error) => {
      assert.ok(error instanceof ResultNotRecorded);
      assert.ok(error instanceof OutcomeUnknown);
      return maybeApplied(error.cause);
    });
    assert.equal((await agent().getToolCall(call)).state, 'UNKNOWN');
    await assert.rejects(safeToolCall(client, call, tool), ReconciliationNeeded);
    assert.equal(runs, 1);
  });

  test('a tool that meets it (its own ledger request) reports the outcome unknown, not an error result', async () => {
    const call = { runId: 'maybe', callId: 'inner', tool: 'send', input: 1 };
    const thrown = new errors.STORAGE_UNAVAILABLE({
      code: 'UNAVAILABLE',
      reason: 'STORAGE_UNAVAILABLE',
      message: 'PostgreSQL did not answer COMMIT',
      metadata: { mayHaveBeenApplied: 'true' },
    });
    await assert.rejects(safeToolCall(agent(), call, () => Promise.reject(thrown)), (error) => error === thrown);
    assert.equal((await agent().getToolCall(call)).state, 'UNKNOWN');
    await assert.rejects(safeToolCall(agent(), call, () => 'again'), ReconciliationNeeded);
  });
});

describe('acknowledgement (issue 10 item G28)', () => {
  test('a fresh result, its replay and an error result are acknowledged once handed back', async () => {
    // Fails before the fix: nothing was ever acknowledged by safeToolCall.
    const acked = async (call) => (await agent().getToolCall(call)).history.some((t) => t.event === 'acknowledge');
    const fresh = { runId: 'ack', callId: 'a1', tool: 't', input: 1 };
    await safeToolCall(agent(), fresh, () => 1);
    const failed = { runId: 'ack', callId: 'a2', tool: 't', input: 2, effect: 'READ' };
    await assert.rejects(safeToolCall(agent(), failed, () => Promise.reject(new RangeError('no'))), RangeError);
    const quiet = { runId: 'ack', callId: 'a3', tool: 't', input: 3, acknowledge: false };
    await safeToolCall(agent(), quiet, () => 3);
    assert.deepEqual([await acked(fresh), await acked(failed), await acked(quiet)], [true, true, false]);
    await safeToolCall(agent(), { ...quiet, acknowledge: true }, () => assert.fail('replayed, not run'));
    assert.equal(await acked(quiet), true);
  });
});
