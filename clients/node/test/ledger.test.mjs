// The ToolLedger, Recovery and RetryPolicy methods against a real daemon.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Client, errors } from '../src/index.js';
import { startDaemon } from '../src/testing.js';

let daemon;
let client;

before(async () => {
  daemon = await startDaemon();
  client = new Client({ target: daemon.target });
});

after(async () => {
  client?.close();
  await daemon?.stop();
});

describe('lifecycle', () => {
  test('prepare -> start -> commit, then a repeat returns the stored result byte for byte', async () => {
    const ref = { runId: 'life', callId: 'c1' };
    const prepared = await client.prepareTool({ ...ref, tool: 'search', input: { q: 'x', n: 2 }, effect: 'READ' });
    assert.equal(prepared.decision, 'EXECUTE');
    assert.equal(prepared.attemptHeld, false);
    assert.equal(prepared.call.state, 'PREPARED');
    assert.equal(prepared.call.effect, 'READ');

    const started = await client.startTool(ref);
    assert.equal(started.decision, 'EXECUTE');
    assert.equal(started.call.state, 'STARTED');
    assert.equal(started.call.attempt, 1);

    const text = '{"hits":[1,2],"note":"é ✓"}';
    const committed = await client.commitTool({ ...ref, attempt: 1, result: JSON.parse(text) });
    assert.equal(committed.state, 'COMMITTED');
    assert.equal(committed.result.outcome, 'OK');

    const again = await client.prepareTool({ ...ref, tool: 'search', input: { n: 2, q: 'x' }, effect: 'READ' });
    assert.equal(again.decision, 'RETURN_RESULT');
    assert.equal(again.call.result.json, text);
    assert.equal(again.call.result.json, committed.result.json);
    assert.equal(again.call.result.digest, committed.result.digest);
    assert.deepEqual(again.call.result.value, { hits: [1, 2], note: "é ✓" });
    assert.deepEqual(
      again.call.history.map((t) => t.event),
      ['prepare', 'start', 'commit'],
    );
  });

  test('a raw Buffer result comes back as the same bytes', async () => {
    const ref = { runId: 'life', callId: 'raw' };
    const p = await client.prepareTool({ ...ref, tool: 'blob', input: Buffer.from([0, 1, 2]), start: true });
    assert.equal(p.attemptHeld, true);
    const bytes = Buffer.from([0xff, 0x00, 0x7f]);
    await client.commitTool({ ...ref, attempt: p.call.attempt, result: bytes });
    const got = await client.getToolCall(ref);
    assert.ok(Buffer.isBuffer(got.result.raw));
    assert.deepEqual(got.result.raw, bytes);
    assert.equal(got.result.json, null);
  });

  test('an error result is stored with its code and message', async () => {
    const ref = { runId: 'life', callId: 'err' };
    const p = await client.prepareTool({ ...ref, tool: 't', input: null, start: true });
    const c = await client.commitTool({ ...ref, attempt: p.call.attempt, errorCode: 'E_TIMEOUT', errorMessage: 'no' });
    assert.equal(c.result.outcome, 'ERROR');
    assert.equal(c.result.ok, false);
    assert.equal(c.result.errorCode, 'E_TIMEOUT');
  });

  test('prepareTools prepares a batch in request order', async () => {
    const results = await client.prepareTools([
      { runId: 'batch', callId: 'b', tool: 't', input: 1, effect: 'IDEMPOTENT_WRITE', start: true },
      { runId: 'batch', callId: 'a', tool: 't', input: 2, start: true },
    ]);
    assert.deepEqual(results.map((r) => r.call.callId), ['b', 'a']);
    assert.ok(results.every((r) => r.decision === 'EXECUTE' && r.attemptHeld));
    assert.equal(results[0].idempotencyKey, 'batch:b');
  });

  test('heartbeat extends the lease of the attempt that holds the call', async () => {
    const ref = { runId: 'life', callId: 'hb' };
    const p = await client.prepareTool({ ...ref, tool: 't', input: 1, start: true, leaseMs: 1000 });
    const beat = await client.heartbeat({ ...ref, attempt: p.call.attempt, leaseMs: 60_000 });
    assert.ok(beat.leaseExpiresAt > p.call.leaseExpiresAt);
  });

  test('a second start of a started call is IN_PROGRESS', async () => {
    const ref = { runId: 'life', callId: 'race' };
    await client.prepareTool({ ...ref, tool: 't', input: 1, start: true });
    const second = await client.startTool(ref);
    assert.equal(second.decision, 'IN_PROGRESS');
    assert.equal(second.attemptHeld, false);
  });

  test('listToolCalls follows page tokens across every page', async () => {
    const calls = Array.from({ length: 7 }, (_, i) => ({ runId: 'list', callId: `c${i}`, tool: 't', input: i }));
    await client.prepareTools(calls);
    const seen = [];
    for await (const call of client.listToolCalls({ runId: 'list', pageSize: 2 })) seen.push(call.callId);
    assert.deepEqual(seen.sort(), calls.map((c) => c.callId).sort());
    const none = [];
    for await (const call of client.listToolCalls({ runId: 'list', states: ['COMMITTED'] })) none.push(call);
    assert.deepEqual(none, []);
  });

  test('listToolCalls with allNamespaces lists every namespace, the client\'s own included', async () => {
    const other = new Client({ target: daemon.target, namespace: 'node-other' });
    try {
      await other.prepareTool({ runId: 'all-ns', callId: 'o1', tool: 't', input: 1 });
      await client.prepareTool({ runId: 'all-ns', callId: 'd1', tool: 't', input: 1 });
      const seen = [];
      for await (const call of client.listToolCalls({ runId: 'all-ns', allNamespaces: true, pageSize: 1 })) {
        seen.push(`${call.namespace}/${call.callId}`);
      }
      assert.deepEqual(seen, ['default/d1', 'node-other/o1']);
      const own = [];
      for await (const call of client.listToolCalls({ runId: 'all-ns' })) own.push(call.callId);
      assert.deepEqual(own, ['d1']);
    } finally {
      other.close();
    }
  });

  test('an unknown enum name is refused before anything is sent', async () => {
    await assert.rejects(
      client.prepareTool({ runId: 'life', callId: 'e', tool: 't', input: 1, effect: 'WRITE' }),
      TypeError,
    );
  });
});

describe('approval and reconciliation', () => {
  test('an approved call becomes PREPARED; a rejected one answers REJECTED', async () => {
    const ok = { runId: 'appr', callId: 'yes' };
    const p = await client.prepareTool({ ...ok, tool: 'pay', input: { eur: 5 }, requireApproval: true });
    assert.equal(p.decision, 'AWAIT_APPROVAL');
    const approved = await client.decideApproval({
      ...ok,
      approve: true,
      approver: 'alice',
      reason: 'fine',
      expectedRevision: p.call.revision,
      inputFingerprint: p.call.inputFingerprint,
    });
    assert.equal(approved.state, 'PREPARED');
    assert.equal(approved.approval.approver, 'alice');

    const no = { runId: 'appr', callId: 'no' };
    const q = await client.prepareTool({ ...no, tool: 'pay', input: { eur: 9 }, requireApproval: true });
    await client.decideApproval({
      ...no,
      approve: false,
      approver: 'bob',
      reason: 'too much',
      expectedRevision: q.call.revision,
      inputFingerprint: q.call.inputFingerprint,
    });
    const again = await client.prepareTool({ ...no, tool: 'pay', input: { eur: 9 }, requireApproval: true });
    assert.equal(again.decision, 'REJECTED');
    assert.equal(again.call.result.errorCode, 'APPROVAL_REJECTED');
  });

  test('reconcile with evidence commits an unknown side effect', async () => {
    const ref = { runId: 'rec', callId: 'c' };
    const p = await client.prepareTool({ ...ref, tool: 'send', input: 1, start: true });
    const unknown = await client.reportUnknown({ ...ref, attempt: p.call.attempt, reason: 'socket closed' });
    assert.equal(unknown.state, 'UNKNOWN');
    const done = await client.reconcile({
      ...ref,
      expectedRevision: unknown.revision,
      operator: 'ops',
      reason: 'checked',
      evidence: 'message id 42 in the outbox',
      result: { sent: true },
    });
    assert.equal(done.state, 'COMMITTED');
    assert.equal(done.reconciliations[0].resolution, 'COMMITTED');
    assert.equal(done.reconciliations[0].fromState, 'UNKNOWN');
  });
});

describe('kept input', () => {
  test('getToolCall shows the exact input of a call until it is settled, and not after', async () => {
    const ref = { runId: 'kept', callId: 'k1' };
    const sent = Buffer.from([0, 1, 2, 0xff]);
    await client.prepareTool({ ...ref, tool: 'pay', input: sent, requireApproval: true });
    const got = await client.getToolCall(ref);
    assert.deepEqual(got.keptInput.raw, sent);
    assert.equal(got.keptInput.json, null);
    // Kept while the call is unsettled, so that an operator deciding on it
    // sees what was sent; dropped once the agent commits.
    const k2 = { runId: 'kept', callId: 'k2' };
    const p = await client.prepareTool({ ...k2, tool: 'pay', input: { a: 1 }, start: true });
    assert.equal((await client.getToolCall(k2)).keptInput.json, '{"a":1}');
    await client.commitTool({ ...k2, attempt: p.call.attempt, result: { ok: true } });
    assert.equal((await client.getToolCall(k2)).keptInput, null);
  });
});

describe('recovery', () => {
  test('recover returns one item per call with the ADR-010 D3 action, and changes nothing else', async () => {
    const run = 'plan';
    const mk = (callId, extra = {}) => ({ runId: run, callId, tool: 't', input: callId, ...extra });
    // a: committed -> REPLAY_RESULT
    const a = await client.prepareTool(mk('a', { start: true }));
    await client.commitTool({ runId: run, callId: 'a', attempt: a.call.attempt, result: { a: 1 } });
    // b: side effect with unknown outcome -> RECONCILE
    const b = await client.prepareTool(mk('b', { start: true }));
    await client.reportUnknown({ runId: run, callId: 'b', attempt: b.call.attempt, reason: 'crash' });
    // c: idempotent write with unknown outcome -> RETRY_NEEDS_POLICY
    const c = await client.prepareTool(mk('c', { start: true, effect: 'IDEMPOTENT_WRITE' }));
    await client.reportUnknown({ runId: run, callId: 'c', attempt: c.call.attempt, reason: 'crash' });
    // d: waiting for approval -> WAIT_FOR_APPROVAL
    await client.prepareTool(mk('d', { requireApproval: true }));
    // e: prepared, never started -> EXECUTE
    await client.prepareTool(mk('e'));

    const plan = await client.recover({ runId: run });
    assert.deepEqual(
      plan.items.map((i) => [i.call.callId, i.action]),
      [
        ['a', 'REPLAY_RESULT'],
        ['b', 'RECONCILE'],
        ['c', 'RETRY_NEEDS_POLICY'],
        ['d', 'WAIT_FOR_APPROVAL'],
        ['e', 'EXECUTE'],
      ],
    );
    assert.equal(plan.interrupted, true);
    assert.deepEqual(plan.items[0].result.value, { a: 1 });
    assert.equal(plan.items[2].idempotencyKey, 'plan:c');
    assert.equal(plan.items[2].effect, 'IDEMPOTENT_WRITE');

    const [acked] = await client.acknowledgeRecovery({ runId: run, callIds: ['a'] });
    assert.equal(acked.acknowledged, true);
    // Delivered once: the plan no longer hands the result out to append.
    const again = await client.recover({ runId: run });
    assert.equal(again.items[0].action, 'ALREADY_DELIVERED');
    assert.equal(again.items[0].result, null);
    assert.deepEqual(again.items[0].call.result.value, { a: 1 });
    const empty = await client.recover({ runId: 'no-such-run' });
    assert.deepEqual(empty, { items: [], interrupted: false, settled: 0 });
  });

  test('recover joins the pages of a plan; recoverPages yields them in callId order', async () => {
    const run = 'paged';
    const ids = ['c0', 'c1', 'c2', 'c3', 'c4', 'c5', 'c6'];
    for (const callId of ids) await client.prepareTool({ runId: run, callId, tool: 't', input: callId });
    await client.prepareTool({ runId: run, callId: 'z', tool: 't', input: 'z', requireApproval: true });
    const whole = await client.recover({ runId: run, pageSize: 3 });
    assert.deepEqual(whole.items.map((i) => i.call.callId), [...ids, 'z']);
    assert.equal(whole.interrupted, true);
    const pages = [];
    for await (const page of client.recoverPages({ runId: run, pageSize: 3 })) pages.push(page);
    assert.deepEqual(pages.map((p) => p.items.length), [3, 3, 2]);
    assert.deepEqual(pages.map((p) => p.interrupted), [false, false, true]);
    assert.deepEqual(await client.recover({ runId: run }), whole);
    await assert.rejects(client.recover({ runId: run, pageSize: 1001 }), errors.INVALID_REQUEST);
  });
});

describe('retry decisions', () => {
  test('a side effect is never retry-safe; a read is, with a backoff', async () => {
    const denied = await client.decideRetry({
      facts: { effect: 'SIDE_EFFECT', state: 'UNKNOWN' },
      context: 'TOOL',
      error: { kind: 'TIMEOUT', retryable: true },
      attemptsUsed: 1,
    });
    assert.equal(denied.allow, false);
    assert.equal(denied.reason, 'SIDE_EFFECT_NOT_RETRY_SAFE');

    const allowed = await client.decideRetry({
      facts: { effect: 'READ', state: 'UNKNOWN' },
      context: 'TOOL',
      error: { kind: 'TRANSPORT' },
      attemptsUsed: 1,
    });
    assert.equal(allowed.allow, true);
    assert.equal(allowed.reason, '');
    assert.equal(allowed.effect, 'READ');
  });

  test('an MCP call of unknown outcome is never started again, by a retry or by prepareTool', async () => {
    const ref = { runId: 'retry', callId: 'mcp' };
    const args = { ...ref, tool: 'lookup', input: 1, start: true, effect: 'READ', channel: 'MCP' };
    const p = await client.prepareTool(args);
    assert.equal(p.call.channel, 'MCP');
    assert.equal(p.call.forcedEffect, null);
    await client.reportUnknown({ ...ref, attempt: p.call.attempt, reason: 'transport' });
    await assert.rejects(client.startTool({ ...ref, retry: true }), errors.MCP_NO_REPLAY);
    await assert.rejects(client.prepareTool({ ...args, retry: true }), errors.MCP_NO_REPLAY);
    await assert.rejects(client.prepareTool({ ...args, channel: 'TOOL' }), errors.INPUT_MISMATCH);
    const plain = await client.prepareTool({ ...ref, tool: 'lookup', input: 1, effect: 'READ', channel: 'MCP' });
    assert.equal(plain.call.channel, 'MCP');
  });

  test('prepareTool with start and retry holds the retry of a READ of unknown outcome', async () => {
    const ref = { runId: 'retry', callId: 'read' };
    const args = { ...ref, tool: 'lookup', input: 1, start: true, effect: 'READ' };
    const p = await client.prepareTool(args);
    assert.equal(p.call.channel, 'TOOL');
    await client.reportUnknown({ ...ref, attempt: p.call.attempt, reason: 'timeout' });
    await assert.rejects(
      client.prepareTool(args),
      (error) => error instanceof errors.INVALID_TRANSITION && error.metadata.retryRequired === 'true',
    );
    const retried = await client.prepareTool({ ...args, retry: true });
    assert.equal(retried.decision, 'EXECUTE');
    assert.equal(retried.attemptHeld, true);
    assert.equal(retried.call.attempt, 2);
  });

  test('a recorded committed call is ALREADY_COMMITTED', async () => {
    const ref = { runId: 'retry', callId: 'done' };
    const p = await client.prepareTool({ ...ref, tool: 't', input: 1, start: true, effect: 'READ' });
    await client.commitTool({ ...ref, attempt: p.call.attempt, result: 1 });
    const answer = await client.decideRetry({ call: ref, context: 'TOOL', attemptsUsed: 1 });
    assert.equal(answer.allow, false);
    assert.equal(answer.reason, 'ALREADY_COMMITTED');
  });
});

test('the calls above went the way this run asks for: framed, the gRPC stream with EFFECTD_TRANSPORT=grpc, or unary with EFFECTD_SESSION=0', () => {
  // `make node-test` runs the suite three times; this guards that no run fell back to another way.
  const off = ['0', 'false', 'off', 'no'].includes((process.env.EFFECTD_SESSION ?? '').trim().toLowerCase());
  const grpcStream = (process.env.EFFECTD_TRANSPORT ?? '').trim().toLowerCase() === 'grpc';
  assert.equal(client.transport, off ? 'unary' : grpcStream ? 'session' : 'frames');
  assert.equal(client._session === null, off);
});
