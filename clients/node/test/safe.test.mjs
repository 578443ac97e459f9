// safeToolCall: the tool runs at most as often as ADR-010 allows.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  Client,
  safeToolCall,
  OutcomeUnknown,
  ReconciliationNeeded,
  ApprovalPending,
  CallRejected,
  CallInProgress,
  ToolFailed,
  ToolCallStopped,
  RetryRequired,
  errors,
} from '../src/index.js';
import { startDaemon } from '../src/testing.js';

let daemon;
const clients = [];

/** A new client object: what an agent process has after a crash and restart. */
function newAgent() {
  const client = new Client({ target: daemon.target });
  clients.push(client);
  return client;
}

before(async () => {
  daemon = await startDaemon();
});

after(async () => {
  for (const client of clients) client.close();
  await daemon?.stop();
});

describe('safeToolCall', () => {
  /** Runs a tool through `helper`, "crashes" the agent, and asks again; returns how often it ran. */
  async function crashAndRetry(helper, callId) {
    const call = { runId: 'crash', callId, tool: 'send_email', input: { to: 'a@b.c' } };
    let runs = 0;
    const tool = async () => {
      runs += 1;
      return { messageId: 'm-1', at: '2026-12-02' };
    };
    const first = await helper(newAgent(), call, tool);
    // The agent "crashes" here, before it used the result; a new process asks again.
    const second = await helper(newAgent(), call, tool);
    return { runs, first, second };
  }

  test('a tool that ran and committed is not run again after an agent crash: the stored result is returned', async () => {
    const { runs, first, second } = await crashAndRetry(safeToolCall, 'c1');
    assert.equal(runs, 1);
    assert.deepEqual(second, first);
    assert.deepEqual(second, { messageId: 'm-1', at: '2026-12-02' });
  });

  test('negative control: a helper that ignores the decision runs the tool twice, and the check above sees it', async () => {
    const broken = async (client, call, fn) => {
      await client.prepareTool({ ...call, start: true }); // the decision is ignored
      return fn({});
    };
    const { runs } = await crashAndRetry(broken, 'c-broken');
    assert.equal(runs, 2);
  });

  test('heartbeats keep the lease of a long tool call; without them another agent finds the outcome unknown', async () => {
    const slow = () => new Promise((resolve) => setTimeout(() => resolve('done'), 900));
    const decisions = [];
    for (const heartbeatMs of [undefined, 0]) {
      const call = { runId: 'lease', callId: `h${heartbeatMs}`, tool: 't', input: 1, leaseMs: 300, heartbeatMs };
      const running = safeToolCall(newAgent(), call, slow);
      await new Promise((resolve) => setTimeout(resolve, 650));
      decisions.push((await newAgent().prepareTool({ ...call, start: true })).decision);
      await running;
    }
    assert.deepEqual(decisions, ['IN_PROGRESS', 'RECONCILE']);
  });

  test('an IDEMPOTENT_WRITE tool gets the same key run:call on both attempts', async () => {
    const call = { runId: 'idem', callId: 'w1', tool: 'put_row', input: { id: 7 }, effect: 'IDEMPOTENT_WRITE' };
    const keys = [];
    await assert.rejects(
      safeToolCall(newAgent(), call, async ({ idempotencyKey }) => {
        keys.push(idempotencyKey);
        throw new OutcomeUnknown('connection reset after the request was sent');
      }),
      OutcomeUnknown,
    );
    // ADR-010 D3: an unknown outcome is never retried unless asked for.
    await assert.rejects(
      safeToolCall(newAgent(), call, () => assert.fail('retried without being asked')),
      (error) => error instanceof RetryRequired && error.call.state === 'UNKNOWN',
    );
    const result = await safeToolCall(newAgent(), { ...call, retryUnknown: true }, async ({ idempotencyKey, attempt }) => {
      keys.push(idempotencyKey);
      return { written: true, attempt };
    });
    assert.deepEqual(keys, ['idem:w1', 'idem:w1']);
    assert.deepEqual(result, { written: true, attempt: 2 });
  });

  test('connection errors and TimeoutErrors count as unknown outcomes; other errors as definite', async () => {
    const cases = [
      [Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' }), 'UNKNOWN'],
      [new TypeError('fetch failed', { cause: Object.assign(new Error('other side closed'), { code: 'UND_ERR_SOCKET' }) }), 'UNKNOWN'],
      [new DOMException('The operation timed out.', 'TimeoutError'), 'UNKNOWN'],
      [Object.assign(new Error('unknown user'), { code: 'E_NO_USER' }), 'COMMITTED'],
      [new RangeError('bad page'), 'COMMITTED'],
    ];
    const states = [];
    for (const [i, [thrown]] of cases.entries()) {
      const call = { runId: 'kinds', callId: `k${i}`, tool: 't', input: i };
      await assert.rejects(safeToolCall(newAgent(), call, () => Promise.reject(thrown)), (error) => error === thrown);
      states.push((await newAgent().getToolCall(call)).state);
    }
    assert.deepEqual(states, cases.map(([, state]) => state));
    const definite = await newAgent().getToolCall({ runId: 'kinds', callId: 'k4' });
    assert.equal(definite.result.errorCode, 'RangeError');
  });

  test('a SIDE_EFFECT interrupted mid-call is reported unknown; the next attempt throws instead of running', async () => {
    const call = { runId: 'side', callId: 's1', tool: 'charge_card', input: { eur: 10 } };
    let runs = 0;
    await assert.rejects(
      safeToolCall(newAgent(), call, async () => {
        runs += 1;
        throw new OutcomeUnknown('the payment API did not answer');
      }),
      OutcomeUnknown,
    );
    const agent = newAgent();
    const record = await agent.getToolCall(call);
    assert.equal(record.state, 'UNKNOWN');
    await assert.rejects(
      safeToolCall(agent, call, async () => {
        runs += 1;
      }),
      (error) => {
        assert.ok(error instanceof ReconciliationNeeded);
        assert.ok(error instanceof ToolCallStopped);
        assert.equal(error.call.state, 'UNKNOWN');
        assert.match(error.message, /reconcile/);
        return true;
      },
    );
    assert.equal(runs, 1);
  });

  test('a tool that runs past timeoutMs is reported unknown and its signal aborted', async () => {
    const call = { runId: 'slow', callId: 't1', tool: 'slow', input: 1, timeoutMs: 100 };
    let aborted = false;
    await assert.rejects(
      safeToolCall(newAgent(), call, ({ signal }) =>
        new Promise((resolve) => {
          signal.addEventListener('abort', () => {
            aborted = true;
            resolve('too late');
          });
        }),
      ),
      (error) => error instanceof OutcomeUnknown && /timed out/.test(error.message),
    );
    assert.equal(aborted, true);
    const record = await newAgent().getToolCall(call);
    assert.equal(record.state, 'UNKNOWN');
    assert.match(record.history.at(-1).reason, /timed out after 100 ms/);
  });

  test('a definite error is committed as an error result and rethrown; a repeat throws ToolFailed without running', async () => {
    const call = { runId: 'fail', callId: 'f1', tool: 'lookup', input: 'x', effect: 'READ' };
    let runs = 0;
    const boom = Object.assign(new Error('no such user'), { code: 'E_NO_USER' });
    await assert.rejects(
      safeToolCall(newAgent(), call, () => {
        runs += 1;
        throw boom;
      }),
      (error) => error === boom,
    );
    const record = await newAgent().getToolCall(call);
    assert.equal(record.state, 'COMMITTED');
    assert.equal(record.result.errorCode, 'E_NO_USER');
    await assert.rejects(
      safeToolCall(newAgent(), call, () => {
        runs += 1;
      }),
      (error) => error instanceof ToolFailed && error.errorCode === 'E_NO_USER',
    );
    assert.equal(runs, 1);
  });

  test('a call that needs approval throws ApprovalPending; once rejected, CallRejected', async () => {
    const call = { runId: 'gate', callId: 'g1', tool: 'wire', input: { eur: 1e6 }, requireApproval: true };
    const agent = newAgent();
    const never = () => assert.fail('the tool must not run');
    await assert.rejects(safeToolCall(agent, call, never), ApprovalPending);
    const record = await agent.getToolCall(call);
    await agent.decideApproval({
      ...call,
      approve: false,
      approver: 'cfo',
      reason: 'no',
      expectedRevision: record.revision,
      inputFingerprint: record.inputFingerprint,
    });
    await assert.rejects(
      safeToolCall(agent, call, never),
      (error) => error instanceof CallRejected && error.result.errorCode === 'APPROVAL_REJECTED',
    );
  });

  test('a call held by another live attempt throws CallInProgress', async () => {
    const call = { runId: 'busy', callId: 'b1', tool: 't', input: 1 };
    const agent = newAgent();
    let release;
    const first = safeToolCall(agent, call, () => new Promise((resolve) => (release = resolve)));
    await new Promise((resolve) => setTimeout(resolve, 100));
    await assert.rejects(safeToolCall(newAgent(), call, () => assert.fail('ran twice')), CallInProgress);
    release({ done: true });
    assert.deepEqual(await first, { done: true });
  });

  test('a result JSON cannot say is committed as a success with the fallback encoding, never lost (issue 10 item B4)', async () => {
    // Fails before the fix: the call was reported UNKNOWN although the tool had succeeded.
    const call = { runId: 'bad', callId: 'big', tool: 't', input: 1 };
    const cyclic = { n: 10n, big: 2 ** 64, when: new Date(0), tags: new Set(['a']) };
    cyclic.self = cyclic;
    const value = await safeToolCall(newAgent(), call, () => cyclic);
    const expected = { n: 10, big: '18446744073709552000', when: '1970-01-01T00:00:00.000Z', tags: ['a'], self: '<cycle>' };
    assert.deepEqual(value, expected);
    const record = await newAgent().getToolCall(call);
    assert.equal(record.state, 'COMMITTED');
    assert.deepEqual(record.result.value, expected);
  });

  test('serialize decides what is committed and returned', async () => {
    const call = { runId: 'ser', callId: 's1', tool: 't', input: 1, serialize: (r) => ({ id: r.id }) };
    assert.deepEqual(await safeToolCall(newAgent(), call, () => ({ id: 7, socket: {} })), { id: 7 });
  });

  test('a repeat with another input is refused with INPUT_MISMATCH', async () => {
    const call = { runId: 'mm', callId: 'm1', tool: 't', input: { a: 1 } };
    await safeToolCall(newAgent(), call, () => 'ok');
    await assert.rejects(
      safeToolCall(newAgent(), { ...call, input: { a: 2 } }, () => 'ok'),
      errors.INPUT_MISMATCH,
    );
  });
});
