// Checkpoints: every write is a compare-and-swap on the revision.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Client, errors } from '../src/index.js';
import { startDaemon } from '../src/testing.js';

let daemon;
let client;

before(async () => {
  daemon = await startDaemon();
  client = new Client({ target: daemon.target, namespace: 'cp-tests' });
});

after(async () => {
  client?.close();
  await daemon?.stop();
});

test('put without a revision creates the key only when it is absent', async () => {
  assert.equal(await client.getCheckpoint('run/1'), null);
  const rev = await client.putCheckpoint('run/1', { step: 1 });
  assert.ok(rev > 0);
  const got = await client.getCheckpoint('run/1');
  assert.deepEqual(JSON.parse(got.value.toString('utf8')), { step: 1 });
  assert.equal(got.revision, rev);
  assert.ok(got.updatedAt instanceof Date);
  await assert.rejects(client.putCheckpoint('run/1', { step: 'again' }), errors.REVISION_CONFLICT);
});

test('of two writers at the same revision only the first wins; the loser learns the current revision', async () => {
  const rev = await client.putCheckpoint('cas', Buffer.from('v0'));
  const winner = await client.putCheckpoint('cas', Buffer.from('v1'), { expectedRevision: rev });
  await assert.rejects(client.putCheckpoint('cas', Buffer.from('v2'), { expectedRevision: rev }), (error) => {
    assert.ok(error instanceof errors.REVISION_CONFLICT);
    assert.equal(error.currentRevision, winner);
    return true;
  });
  assert.equal((await client.getCheckpoint('cas')).value.toString(), 'v1');
  await assert.rejects(client.deleteCheckpoint('cas', rev), errors.REVISION_CONFLICT);
  await client.deleteCheckpoint('cas', winner);
  assert.equal(await client.getCheckpoint('cas'), null);
  // Revisions come from one counter: a re-created key never reuses one (no ABA).
  assert.ok((await client.putCheckpoint('cas', 'v3')) > winner);
});

test('a txn applies all its ops or none', async () => {
  const a = await client.putCheckpoint('txn/a', 'a0');
  const rev = await client.checkpointTxn({
    compares: [
      { key: 'txn/a', revision: a },
      { key: 'txn/b', absent: true },
    ],
    ops: [{ delete: { key: 'txn/a' } }, { put: { key: 'txn/b', value: 'b1' } }],
  });
  assert.ok(rev > a);
  assert.equal(await client.getCheckpoint('txn/a'), null);
  assert.equal((await client.getCheckpoint('txn/b')).revision, rev);

  await assert.rejects(
    client.checkpointTxn({
      compares: [
        { key: 'txn/b', revision: rev },
        { key: 'txn/c', revision: 1 },
      ],
      ops: [{ put: { key: 'txn/b', value: 'b2' } }, { put: { key: 'txn/c', value: 'c' } }],
    }),
    errors.REVISION_CONFLICT,
  );
  assert.equal((await client.getCheckpoint('txn/b')).value.toString(), 'b1');
  assert.equal(await client.getCheckpoint('txn/c'), null);
});

test('list returns every key under the prefix in key order across pages', async () => {
  const keys = ['ls/c', 'ls/a', 'ls/b', 'ls/d', 'ls/e'];
  for (const key of keys) await client.putCheckpoint(key, key);
  await client.putCheckpoint('other', 'x');
  const seen = [];
  for await (const cp of client.listCheckpoints({ prefix: 'ls/', pageSize: 2 })) seen.push(cp);
  assert.deepEqual(seen.map((cp) => cp.key), [...keys].sort());
  assert.equal(seen[0].value.toString(), 'ls/a');
  const bare = [];
  for await (const cp of client.listCheckpoints({ prefix: 'ls/', keysOnly: true })) bare.push(cp);
  assert.equal(bare.length, 5);
  assert.equal(bare[0].value.length, 0);
});

test('namespaces are isolated', async () => {
  await client.putCheckpoint('ns-key', 'mine');
  const other = new Client({ target: daemon.target, namespace: 'someone-else' });
  try {
    assert.equal(await other.getCheckpoint('ns-key'), null);
  } finally {
    other.close();
  }
});
