// crashAndResume (@effectd/client/testing): a real crash in the middle of a user's tool call,
// then the resumed agent; the daemon started the way a user's tests start it.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { Client, ReconciliationNeeded } from '../src/index.js';
import * as testing from '../src/testing.js';
import { crashAndResume, CrashPoint, daemonCommand, DEFAULT_PYTHON, startDaemon } from '../src/testing.js';

const AGENT = fileURLToPath(new URL('../fixtures/crash-agent.mjs', import.meta.url));

let daemon;
let dir;

before(async () => {
  daemon = await startDaemon();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'efd-crash-'));
});

after(async () => {
  await daemon?.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

/** The side effects the counter saw. */
function bookings(name) {
  const file = path.join(dir, name);
  return fs.existsSync(file) ? Number(fs.readFileSync(file, 'utf8')) : 0;
}

/** The property a user's test states: the booking happened at most once. */
function checkAtMostOnce(name) {
  const n = bookings(name);
  if (n > 1) throw new assert.AssertionError({ message: `booked ${n} times` });
}

describe('crashAndResume', () => {
  test('killed after the effect, before the commit: the resumed agent meets ReconciliationNeeded; one booking', async () => {
    const report = await crashAndResume(AGENT, daemon.target, {
      args: [path.join(dir, 'before'), 'trip-before'],
      at: CrashPoint.BEFORE_COMMIT,
    });
    assert.equal(report.crashed, true);
    assert.ok(report.resumedError instanceof ReconciliationNeeded, String(report.resumedError));
    checkAtMostOnce('before');
    assert.equal(bookings('before'), 1);
    const client = new Client({ target: daemon.target });
    try {
      assert.equal((await client.getToolCall({ runId: 'trip-before', callId: 'book-1' })).state, 'UNKNOWN');
    } finally {
      client.close();
    }
  });

  test('killed right after the commit: the resumed agent gets the stored result; one booking', async () => {
    const report = await crashAndResume(AGENT, daemon.target, {
      args: [path.join(dir, 'after'), 'trip-after'],
      at: CrashPoint.AFTER_COMMIT,
    });
    assert.equal(report.crashed, true);
    assert.equal(report.resumedError, undefined);
    assert.equal(report.resumed, 'booking #1');
    assert.equal(bookings('after'), 1);
  });

  test('negative control: an agent with a new call id per process books twice, and the check catches it', async () => {
    const report = await crashAndResume(AGENT, daemon.target, {
      args: [path.join(dir, 'careless'), 'trip-careless'],
      exportName: 'carelessAgent',
    });
    assert.equal(report.crashed, true);
    assert.equal(report.resumed, 'booking #2');
    assert.throws(() => checkAtMostOnce('careless'), /booked 2 times/);
  });

  test('an agent that commits nothing is not crashed, and runs again', async () => {
    const module = path.join(dir, 'idle-agent.mjs');
    fs.writeFileSync(module, 'export async function agent(target, word) { return `${word} from ${target}`; }\n');
    const report = await crashAndResume(module, daemon.target, { args: ['idle'] });
    assert.equal(report.crashed, false);
    assert.equal(report.resumed, `idle from ${daemon.target}`);
  });

  test('a module without an agent function, or an unknown crash point, is refused before anything runs', async () => {
    const module = path.join(dir, 'no-agent.mjs');
    fs.writeFileSync(module, 'export const value = 1;\n');
    await assert.rejects(crashAndResume(module, daemon.target), /exports no agent function/);
    const args = [path.join(dir, 'unknown-point'), 'trip-point'];
    await assert.rejects(crashAndResume(AGENT, daemon.target, { args, at: 'midway' }), RangeError);
    assert.equal(bookings('unknown-point'), 0);
  });
});

test('the testing exports are exactly these, each typed in testing.d.ts', () => {
  const names = Object.keys(testing).filter((name) => name !== 'default').sort();
  assert.deepEqual(names, [
    'CrashPoint',
    'DEFAULT_PYTHON',
    'DeduplicationNotProven',
    'checkDeduplication',
    'crashAndResume',
    'daemonCommand',
    'idempotencyKey',
    'startDaemon',
  ]);
  const types = fs.readFileSync(fileURLToPath(new URL('../src/testing.d.ts', import.meta.url)), 'utf8');
  for (const name of names) assert.match(types, new RegExp(`export (const|function|class) ${name}\\b`), name);
});

describe('startDaemon', () => {
  test('runs the effectd command when given one (as a user with effectd on PATH does)', async () => {
    const effectd = path.join(path.dirname(process.env.EFFECTD_PYTHON || DEFAULT_PYTHON), 'effectd');
    const own = await startDaemon({ command: effectd });
    try {
      const client = new Client({ target: own.target });
      try {
        const prepared = await client.prepareTool({ runId: 'r', callId: 'c', tool: 't', input: {} });
        assert.equal(prepared.decision, 'EXECUTE');
      } finally {
        client.close();
      }
    } finally {
      await own.stop();
    }
    assert.equal(fs.existsSync(own.dataDir), false);
  });

  test('daemonCommand: a command wins, then a python, then the effectd command on PATH', () => {
    assert.deepEqual(daemonCommand({ command: 'effectd' }), ['effectd']);
    assert.deepEqual(daemonCommand({ command: ['/opt/effectd', '--x'] }), ['/opt/effectd', '--x']);
    assert.deepEqual(daemonCommand({ python: '/py' }), ['/py', '-m', 'sidecar']);
  });
});
