// A daemon without room for another session (its per-caller limit reached by another client's
// stream or connection): the refused session served nothing, so its messages are asked by unary
// calls for a pause, never failed as unknown outcomes. Runs on whichever transport the suite's run
// uses (the framed socket, the gRPC stream); unary calls need no room for a session.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { createRequire } from 'node:module';
import { Client } from '../src/index.js';
import { startDaemon } from '../src/testing.js';

const require = createRequire(import.meta.url);
const { NO_ROOM } = require('../src/session.js');

let daemon;

before(async () => {
  daemon = await startDaemon({ args: ['--max-concurrent-rpcs-per-caller', '1'] });
});

after(async () => {
  await daemon?.stop();
});

let runs = 0;

/** With room for one session per caller, a second client's prepare while the first holds its session. */
async function secondClientsPrepare() {
  const runId = `room-${process.pid}-${(runs += 1)}`;
  const first = new Client({ target: daemon.target, reconnectWaitMs: 0 });
  const second = new Client({ target: daemon.target, reconnectWaitMs: 0 });
  try {
    await first.prepareTool({ runId, callId: 'a', tool: 't', input: {} });
    return await second.prepareTool({ runId, callId: 'b', tool: 't', input: {} });
  } finally {
    first.close();
    second.close();
  }
}

test('a daemon without room for another session: the second client is answered, by a unary call', async () => {
  const answer = await secondClientsPrepare();
  assert.equal(answer.call.callId, 'b');
});

test('negative control: a refusal for lack of room taken for a broken session is caught', async () => {
  const reasons = [...NO_ROOM];
  NO_ROOM.clear();
  try {
    if (process.env.EFFECTD_SESSION === '0') return; // unary alone: no session to refuse
    await assert.rejects(secondClientsPrepare(), (e) => e.code === 'UNAVAILABLE' && e.metadata.mayHaveBeenApplied === 'true');
  } finally {
    for (const reason of reasons) NO_ROOM.add(reason);
  }
});
