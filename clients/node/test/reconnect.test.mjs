// Waiting for the daemon (reconnect.js), without one: which failures mean the request was not sent,
// one warning per outage, and a wait that ends at reconnectWaitMs or the call's deadline with
// UNAVAILABLE "did not come back" (session stream and unary). test/restart.test.mjs restarts a real
// daemon under running agents.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { Client, EffectdError, errors } from '../src/index.js';
import { Outage, WARNING_CODE, notSent } from '../src/reconnect.js';

const NO_CONNECTION = 'No connection established. Last error: Error: connect ECONNREFUSED /x.sock';
const unavailable = (fields) => new EffectdError({ code: 'UNAVAILABLE', ...fields });

test('only a request known not sent is sent again', () => {
  const table = [
    // The session stream: broken before the message was sent, or not.
    [unavailable({ metadata: { mayHaveBeenApplied: 'false' } }), true],
    [unavailable({ metadata: { mayHaveBeenApplied: 'true' } }), false],
    // A unary call that found no connection; one whose connection broke.
    [unavailable({ message: NO_CONNECTION }), true],
    [unavailable({ message: 'read ECONNRESET' }), false],
    // The daemon: stopping before it served it; its store's commit.
    [new errors.SHUTTING_DOWN({ code: 'UNAVAILABLE', reason: 'SHUTTING_DOWN' }), true],
    [new errors.STORAGE_UNAVAILABLE({ code: 'UNAVAILABLE', reason: 'STORAGE_UNAVAILABLE', metadata: { mayHaveBeenApplied: 'false' } }), false],
    // A deadline: it may have been applied.
    [new EffectdError({ code: 'DEADLINE_EXCEEDED', message: NO_CONNECTION }), false],
  ];
  assert.deepEqual(
    table.map(([error]) => notSent(error)),
    table.map(([, expected]) => expected),
  );
});

test('a try cut by its deadline while it waited for a connection was not sent; one that had a stream may have been', async () => {
  // The unary flake this fixes: the last try, started a few ms before the call's deadline, ended
  // DEADLINE_EXCEEDED while grpc-js still waited for a connection, and was thrown as it was.
  const away = unavailable({ message: NO_CONNECTION });
  const unpicked = new EffectdError({
    code: 'DEADLINE_EXCEEDED',
    message: 'Deadline exceeded after 0.012s,Waiting for LB pick',
  });
  const error = await new Outage('unix:/x.sock', 60_000)
    .again(away, () => Promise.reject(unpicked), Date.now() + 150)
    .catch((e) => e);
  assert.equal(error.code, 'UNAVAILABLE');
  assert.match(error.message, /did not come back within/);
  assert.deepEqual(error.metadata, { mayHaveBeenApplied: 'false' });
  // The control: a try that had a stream on a connection may have been sent.
  const sent = new EffectdError({
    code: 'DEADLINE_EXCEEDED',
    message: 'Deadline exceeded after 0.012s,LB pick: 0.001s,remote_addr=unix:/x.sock',
  });
  await assert.rejects(
    new Outage('unix:/x.sock', 60_000).again(away, () => Promise.reject(sent), Date.now() + 150),
    (e) => e === sent,
  );
});

async function warningsDuring(fn) {
  const seen = [];
  const listen = (warning) => {
    if (warning.code === WARNING_CODE) seen.push(warning.message);
  };
  process.on('warning', listen);
  try {
    await fn();
    await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
  } finally {
    process.off('warning', listen);
  }
  return seen;
}

test('an outage warns once until a request gets through; the last one giving up ends it too', async () => {
  const outage = new Outage('unix:/x.sock', 10_000);
  const away = unavailable({ message: NO_CONNECTION });
  const seen = await warningsDuring(async () => {
    let tries = 0;
    const down = () => Promise.reject(away);
    const upOnThird = () => (++tries >= 3 ? Promise.resolve('ok') : Promise.reject(away));
    // Three wait at once: one warning; one gets through, and the others with it.
    const three = [upOnThird, upOnThird, upOnThird].map((send) => outage.again(away, send, Date.now() + 10_000));
    assert.deepEqual(await Promise.all(three), ['ok', 'ok', 'ok']);
    // A new outage, whose only request gives up (its deadline); then another.
    await assert.rejects(outage.again(away, down, Date.now() + 200), /did not come back within/);
    await assert.rejects(outage.again(away, down, Date.now() + 200), /did not come back within/);
  });
  assert.equal(seen.length, 3);
});

test('a request that may have been sent is not sent again', async () => {
  const lost = unavailable({ metadata: { mayHaveBeenApplied: 'true' } });
  let sent = 0;
  const send = async () => {
    sent += 1;
  };
  await assert.rejects(new Outage('unix:/x.sock', 10_000).again(lost, send, Date.now() + 10_000), (e) => e === lost);
  assert.equal(sent, 0);
  assert.throws(() => new Outage('unix:/x.sock', -1), /reconnectWaitMs/);
});

for (const session of [true, false]) {
  for (const [bound, options] of [
    ['reconnectWaitMs', { timeoutMs: 60_000, reconnectWaitMs: 300 }],
    // The deadline leaves the first try time to find no socket on a loaded machine: a try cut by
    // its deadline while grpc-js still resolved the target keeps DEADLINE_EXCEEDED (a call's first
    // deadline stays what it is, reconnect.js).
    ['the deadline', { timeoutMs: 2_000, reconnectWaitMs: 60_000 }],
  ]) {
    test(`no daemon (${session ? 'session' : 'unary'}): the wait ends at ${bound}, UNAVAILABLE, not sent`, async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'efd-away-'));
      const target = `unix:${path.join(dir, 'effectd.sock')}`;
      const client = new Client({ target, session, ...options });
      try {
        const error = await client.getToolCall({ runId: 'gone', callId: 'c' }).catch((e) => e);
        assert.ok(error instanceof EffectdError, String(error));
        assert.equal(error.code, 'UNAVAILABLE');
        assert.match(error.message, new RegExp(`the daemon at ${target} did not come back within`));
        assert.deepEqual(error.metadata, { mayHaveBeenApplied: 'false' });
        assert.ok(notSent(error.cause), String(error.cause));
      } finally {
        client.close();
        fs.rmSync(dir, { recursive: true, force: true });
      }
    });
  }
}

test('negative control: a client that does not wait fails at once, not sent', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'efd-away-'));
  const client = new Client({ target: `unix:${path.join(dir, 'effectd.sock')}`, reconnectWaitMs: 0 });
  try {
    const error = await client.getToolCall({ runId: 'gone', callId: 'c' }).catch((e) => e);
    assert.equal(error.code, 'UNAVAILABLE');
    assert.doesNotMatch(error.message, /did not come back/);
    assert.ok(notSent(error));
  } finally {
    client.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
