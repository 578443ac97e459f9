// The session's bookkeeping, against a scripted stream (no daemon): answers dispatched by id in any
// order, errors read like the unary call's, a deadline that cancels, what a broken stream fails and
// what it sends again, the fallback to unary, closing and ending an idle stream.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { createRequire } from 'node:module';
import { describe, test } from 'node:test';

const require = createRequire(import.meta.url);
const grpc = require('@grpc/grpc-js');
const { load, statusTypes } = require('../src/proto.js');
const { Session } = require('../src/session.js');
const { fromServiceError, errors, EffectdError } = require('../src/errors.js');

const method = load().services.ledger.service.Session;

/** A stream that takes `capacity` messages before write() says "wait" (gRPC flow control). */
class ScriptedCall extends EventEmitter {
  constructor(capacity) {
    super();
    this.capacity = capacity;
    this.written = [];
    this.ended = false;
    this.cancelled = false;
  }
  write(bytes) {
    this.written.push(method.requestDeserialize(bytes));
    return this.written.length < this.capacity;
  }
  end() {
    this.ended = true;
  }
  cancel() {
    this.cancelled = true;
  }
  answer(id, kind, body) {
    this.emit('data', { id, response: kind, [kind]: body });
  }
  fail(code, details = 'down', metadata = new grpc.Metadata()) {
    this.emit('error', Object.assign(new Error(details), { code, details, metadata }));
    this.emit('status', { code, details, metadata });
  }
  ids() {
    return this.written.filter((m) => m.request !== 'cancel').map((m) => m.id);
  }
}

function session({ capacities = [], idleMs = 60_000, unary } = {}) {
  const calls = [];
  const unaryCalls = [];
  const stub = {
    makeBidiStreamRequest() {
      const call = new ScriptedCall(capacities[calls.length] ?? 1_000);
      calls.push(call);
      return call;
    },
  };
  const s = new Session({
    stub,
    method,
    metadata: () => new grpc.Metadata(),
    maxMessageBytes: 1 << 20,
    idleMs,
    unary:
      unary ??
      (async (name, request, timeoutMs) => {
        unaryCalls.push({ name, request, timeoutMs });
        return { unary: name };
      }),
  });
  return { s, calls, unaryCalls };
}

const ref = (callId) => ({ ref: { namespace: '', runId: 'r', callId } });

/** A status trailer as the daemon sends it: its ErrorInfo naming `reason` (none when ''). */
function trailer(code, reason) {
  const metadata = new grpc.Metadata();
  if (!reason) return metadata;
  const types = statusTypes();
  const info = { type_url: 'type.googleapis.com/google.rpc.ErrorInfo', value: Buffer.from(types.ErrorInfo.encode({ reason, domain: 'effectd' }).finish()) };
  const status = { code, message: reason, details: [info] };
  metadata.set('grpc-status-details-bin', Buffer.from(types.Status.encode(status).finish()));
  return metadata;
}
const settled = (promise) => promise.then((value) => ({ value }), (error) => ({ error }));
const tick = () => new Promise((resolve) => setImmediate(resolve));

describe('dispatch', () => {
  test('answers go to their callers by id, in whatever order they come', async () => {
    const { s, calls } = session();
    const seed = Date.now() % 100_000;
    console.log(`seed ${seed}`);
    const n = 16;
    const promises = Array.from({ length: n }, (_, i) => s.call('GetToolCall', ref(`c${i}`), 5_000));
    const [call] = calls;
    const ids = call.ids();
    assert.equal(ids.length, n);
    assert.equal(new Set(ids).size, n);
    // A seeded shuffle of the answers.
    const order = [...ids.keys()];
    let x = seed;
    for (let i = order.length - 1; i > 0; i -= 1) {
      x = (x * 1103515245 + 12345) % 2 ** 31;
      const j = x % (i + 1);
      [order[i], order[j]] = [order[j], order[i]];
    }
    for (const k of order) call.answer(ids[k], 'getToolCall', { call: { callId: `c${k}` } });
    const answers = await Promise.all(promises);
    assert.deepEqual(
      answers.map((a) => a.call.callId),
      Array.from({ length: n }, (_, i) => `c${i}`),
    );
    // Each message carried its request under its RPC's field, with the call's timeout.
    assert.deepEqual(call.written[3].getToolCall.ref.callId, 'c3');
    assert.equal(call.written[3].timeoutMs, 5_000);
    assert.equal(calls.length, 1);
  });

  test("an error answer reads as the unary call's trailer would: reason, metadata, violations", async () => {
    const { s, calls } = session();
    const types = statusTypes();
    const pack = (type, value) => ({
      type_url: `type.googleapis.com/google.rpc.${type}`,
      value: Buffer.from(types[type].encode(value).finish()),
    });
    const status = {
      code: grpc.status.INVALID_ARGUMENT,
      message: 'bad',
      details: [
        pack('ErrorInfo', { reason: 'INVALID_REQUEST', domain: 'effectd', metadata: { k: 'v' } }),
        pack('BadRequest', { fieldViolations: [{ field: 'ref.run_id', description: 'is required' }] }),
      ],
    };
    const pending = s.call('PrepareTool', ref('c1'), 5_000).catch((e) => e);
    // The SessionResponse as the daemon sends it, through the real decoder.
    calls[0].emit('data', method.responseDeserialize(method.responseSerialize({ id: calls[0].ids()[0], error: status })));
    const viaStream = fromServiceError(await pending);
    const trailer = new grpc.Metadata();
    trailer.set('grpc-status-details-bin', Buffer.from(types.Status.encode(status).finish()));
    const viaUnary = fromServiceError(Object.assign(new Error('3 INVALID_ARGUMENT: bad'), { code: 3, details: 'bad', metadata: trailer }));
    assert.ok(viaStream instanceof errors.INVALID_REQUEST);
    for (const key of ['code', 'reason', 'details', 'metadata', 'violations', 'retryDelayMs']) {
      assert.deepEqual(viaStream[key], viaUnary[key], key);
    }
  });

  test('an answer of another kind is INTERNAL; an answer to an id nobody waits for is ignored', async () => {
    const { s, calls } = session();
    const pending = settled(s.call('CommitTool', ref('c1'), 5_000));
    calls[0].answer(999, 'commitTool', { call: null });
    calls[0].answer(calls[0].ids()[0], 'heartbeat', { call: null });
    const { error } = await pending;
    assert.equal(fromServiceError(error).code, 'INTERNAL');
  });
});

describe('deadline', () => {
  test('past its deadline a sent message is cancelled and fails DEADLINE_EXCEEDED; a late answer is dropped', async () => {
    const { s, calls } = session();
    const { error } = await settled(s.call('PrepareTool', ref('c1'), 20));
    const e = fromServiceError(error);
    assert.equal(e.constructor, EffectdError);
    assert.equal(e.code, 'DEADLINE_EXCEEDED');
    const [call] = calls;
    const [sent] = call.ids();
    assert.deepEqual(
      call.written.map((m) => [m.id, m.request]),
      [
        [sent, 'prepareTool'],
        [sent, 'cancel'],
      ],
    );
    call.answer(sent, 'prepareTool', { decision: 'DECISION_EXECUTE' });
    assert.equal(call.cancelled, false);
    assert.equal(calls.length, 1);
  });

  test('a message still queued (not sent) is dropped at its deadline: no cancel is sent', async () => {
    const { s, calls } = session({ capacities: [1] });
    const first = s.call('PrepareTool', ref('c1'), 5_000);
    const { error } = await settled(s.call('PrepareTool', ref('c2'), 20));
    assert.equal(fromServiceError(error).code, 'DEADLINE_EXCEEDED');
    calls[0].emit('drain');
    assert.deepEqual(calls[0].written.map((m) => m.request), ['prepareTool']);
    calls[0].answer(calls[0].ids()[0], 'prepareTool', {});
    await first;
  });
});

describe('a broken stream', () => {
  test('sent messages fail mayHaveBeenApplied=true; queued ones go on a new stream, once', async () => {
    const { s, calls } = session({ capacities: [2, 1] });
    const p = [1, 2, 3, 4].map((i) => settled(s.call('PrepareTool', ref(`c${i}`), 5_000)));
    assert.equal(calls[0].ids().length, 2); // the stream said "wait" after two
    calls[0].fail(grpc.status.UNAVAILABLE);
    await tick();
    assert.equal(calls.length, 2);
    assert.equal(calls[1].ids().length, 1); // the third; the fourth waits again
    calls[1].fail(grpc.status.UNAVAILABLE);
    const results = (await Promise.all(p)).map(({ error }) => fromServiceError(error));
    assert.deepEqual(
      results.map((e) => [e.code, e.metadata.mayHaveBeenApplied]),
      [
        ['UNAVAILABLE', 'true'],
        ['UNAVAILABLE', 'true'],
        ['UNAVAILABLE', 'true'],
        ['UNAVAILABLE', 'false'],
      ],
    );
    assert.ok(results.every((e) => e.constructor === EffectdError && e.reason === ''));
    // The next call opens a third stream.
    const next = s.call('GetToolCall', ref('c5'), 5_000);
    calls[2].answer(calls[2].ids()[0], 'getToolCall', { call: { callId: 'c5' } });
    assert.equal((await next).call.callId, 'c5');
  });

  test('a stream that found no connection sent nothing: all fail not sent, none on a new stream', async () => {
    const { s, calls } = session({ capacities: [2] });
    const p = [1, 2, 3].map((i) => settled(s.call('PrepareTool', ref(`c${i}`), 5_000)));
    assert.equal(calls[0].ids().length, 2); // handed to the stream, never on a connection
    calls[0].fail(grpc.status.UNAVAILABLE, 'No connection established. Last error: connect ECONNREFUSED');
    const results = (await Promise.all(p)).map(({ error }) => fromServiceError(error));
    assert.deepEqual(
      results.map((e) => [e.code, e.metadata.mayHaveBeenApplied]),
      Array(3).fill(['UNAVAILABLE', 'false']),
    );
    assert.equal(calls.length, 1); // the client waits for the daemon instead
  });

  test('a stream the daemon ended as it stopped: a message sent and unanswered was not read, not sent', async () => {
    for (const [reason, applied] of [
      ['SHUTTING_DOWN', 'false'],
      ['', 'true'], // negative control: any other UNAVAILABLE leaves it unknown
    ]) {
      const { s, calls } = session();
      const pending = settled(s.call('CommitTool', ref('c1'), 5_000));
      calls[0].fail(grpc.status.UNAVAILABLE, 'the daemon is stopping', trailer(grpc.status.UNAVAILABLE, reason));
      const e = fromServiceError((await pending).error);
      assert.deepEqual([e.code, e.metadata.mayHaveBeenApplied], ['UNAVAILABLE', applied], reason);
    }
  });

  test('a stream that ends OK with messages in flight broke all the same', async () => {
    const { s, calls } = session();
    const pending = settled(s.call('CommitTool', ref('c1'), 5_000));
    calls[0].emit('status', { code: grpc.status.OK, details: '', metadata: new grpc.Metadata() });
    const e = fromServiceError((await pending).error);
    assert.deepEqual([e.code, e.metadata.mayHaveBeenApplied], ['UNAVAILABLE', 'true']);
  });

  test('UNAUTHENTICATED refuses each message as its unary call would; the next call tries a stream again', async () => {
    const { s, calls, unaryCalls } = session();
    const pending = settled(s.call('PrepareTool', ref('c1'), 5_000));
    calls[0].fail(grpc.status.UNAUTHENTICATED, 'no token');
    const e = fromServiceError((await pending).error);
    assert.ok(e instanceof errors.UNAUTHENTICATED);
    assert.equal(s.unserved, false);
    s.call('PrepareTool', ref('c2'), 5_000).catch(() => {});
    assert.equal(calls.length, 2);
    assert.equal(unaryCalls.length, 0);
  });
});

describe('a daemon without the stream', () => {
  for (const code of ['UNIMPLEMENTED', 'PERMISSION_DENIED']) {
    test(`${code} before any answer: what is in flight and every later call go unary`, async () => {
      const { s, calls, unaryCalls } = session({ capacities: [1] });
      const p = [1, 2].map((i) => s.call('PrepareTool', ref(`c${i}`), 5_000));
      calls[0].fail(grpc.status[code]);
      assert.deepEqual(await Promise.all(p), [{ unary: 'PrepareTool' }, { unary: 'PrepareTool' }]);
      assert.equal(s.unserved, true);
      assert.deepEqual(await s.call('Heartbeat', ref('c3'), 5_000), { unary: 'Heartbeat' });
      assert.equal(calls.length, 1);
      assert.deepEqual(
        unaryCalls.map((u) => [u.name, u.request.ref.callId]),
        [
          ['PrepareTool', 'c1'],
          ['PrepareTool', 'c2'],
          ['Heartbeat', 'c3'],
        ],
      );
      assert.ok(unaryCalls.every((u) => u.timeoutMs > 0 && u.timeoutMs <= 5_000));
    });
  }

  test('an end that says unaryForMs before any answer: what is in flight and the calls for that long go unary', async () => {
    const { s, calls, unaryCalls } = session();
    const first = s.call('PrepareTool', ref('c1'), 5_000);
    const failed = Object.assign(new Error('no framed socket'), {
      code: grpc.status.UNAVAILABLE,
      details: 'no framed socket',
      metadata: new grpc.Metadata(),
      unaryForMs: 60_000,
    });
    calls[0].emit('error', failed);
    calls[0].emit('status', { code: failed.code, details: failed.details, metadata: failed.metadata });
    assert.deepEqual(await first, { unary: 'PrepareTool' });
    assert.equal(s.transport, 'unary');
    assert.deepEqual(await s.call('Heartbeat', ref('c2'), 5_000), { unary: 'Heartbeat' });
    assert.equal(s.unserved, false);
    // Once the while is over, a stream again.
    s._unaryUntil = 0;
    assert.equal(s.transport, 'session');
    s.call('GetToolCall', ref('c3'), 5_000).catch(() => {});
    assert.equal(calls.length, 2);
    assert.equal(unaryCalls.length, 2);
    s.close();
  });

  test('negative control: an end that says unaryForMs after an answer is a broken stream', async () => {
    const { s, calls, unaryCalls } = session();
    const first = s.call('GetToolCall', ref('c1'), 5_000);
    const second = settled(s.call('GetToolCall', ref('c2'), 5_000));
    calls[0].answer(calls[0].ids()[0], 'getToolCall', { call: null });
    await first;
    const failed = Object.assign(new Error('down'), {
      code: grpc.status.UNAVAILABLE,
      details: 'down',
      metadata: new grpc.Metadata(),
      unaryForMs: 60_000,
    });
    calls[0].emit('error', failed);
    calls[0].emit('status', { code: failed.code, details: failed.details, metadata: failed.metadata });
    assert.deepEqual(fromServiceError((await second).error).metadata, { mayHaveBeenApplied: 'true' });
    assert.equal(unaryCalls.length, 0);
    assert.equal(s.transport, 'session');
  });

  test('negative control: UNIMPLEMENTED after an answer is a broken stream, not an older daemon', async () => {
    const { s, calls, unaryCalls } = session();
    const first = s.call('GetToolCall', ref('c1'), 5_000);
    const second = settled(s.call('GetToolCall', ref('c2'), 5_000));
    calls[0].answer(calls[0].ids()[0], 'getToolCall', { call: null });
    await first;
    calls[0].fail(grpc.status.UNIMPLEMENTED);
    assert.equal(fromServiceError((await second).error).code, 'UNAVAILABLE');
    assert.equal(s.unserved, false);
    assert.equal(unaryCalls.length, 0);
  });
});

describe('closing and idleness', () => {
  test('close() fails what is in flight CANCELLED, ends the stream, and refuses later calls', async () => {
    const { s, calls } = session();
    const pending = settled(s.call('PrepareTool', ref('c1'), 5_000));
    s.close();
    assert.equal(fromServiceError((await pending).error).code, 'CANCELLED');
    assert.equal(calls[0].ended, true);
    assert.equal(calls[0].cancelled, true);
    assert.equal(fromServiceError((await settled(s.call('PrepareTool', ref('c2'), 5_000))).error).code, 'CANCELLED');
    assert.equal(calls.length, 1);
  });

  test('a stream with nothing in flight for idleMs is ended; the next call opens another', async () => {
    const { s, calls } = session({ idleMs: 10 });
    const first = s.call('GetToolCall', ref('c1'), 5_000);
    calls[0].answer(calls[0].ids()[0], 'getToolCall', { call: null });
    await first;
    for (let i = 0; i < 500 && !calls[0].ended; i += 1) await new Promise((r) => setTimeout(r, 5));
    assert.equal(calls[0].ended, true);
    calls[0].emit('status', { code: grpc.status.OK, details: '', metadata: new grpc.Metadata() });
    const second = s.call('GetToolCall', ref('c2'), 5_000);
    assert.equal(calls.length, 2);
    calls[1].answer(calls[1].ids()[0], 'getToolCall', { call: null });
    await second;
  });

  test('negative control: a stream with a message in flight is not ended, however long', async () => {
    const { s, calls } = session({ idleMs: 10 });
    const pending = settled(s.call('GetToolCall', ref('c1'), 5_000));
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(calls[0].ended, false);
    s.close();
    await pending;
  });
});
