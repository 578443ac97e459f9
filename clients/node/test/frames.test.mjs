// The ledger session on the daemon's framed socket (frames.js): chosen for a `unix:` target whose
// daemon serves it, unless EFFECTD_TRANSPORT=grpc; many answers in flight reach their own callers;
// a refused token is the unary call's refusal; a message the connection took is never sent again
// when it breaks (its outcome unknown), one not sent waits for the daemon; a daemon serving gRPC
// without the framed socket is asked by unary calls; a deadline cancels; close() fails what is in
// flight CANCELLED; and nothing keeps the process alive. Each guard has its negative control: the
// broken variant it must catch.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { Client, EffectdError } from '../src/index.js';
import { startDaemon } from '../src/testing.js';

const require = createRequire(import.meta.url);
const { load } = require('../src/proto.js');
const { FramesSession, FrameReader, framesPath, TRANSPORT_ENV } = require('../src/frames.js');
const { Session } = require('../src/session.js');
const { isOutcomeUnknown } = require('../src/safe.js');

const here = path.dirname(fileURLToPath(import.meta.url));
const method = load().services.ledger.service.Session;
// This file is about the framed transport, whichever way the suite's run sends the others' calls.
delete process.env[TRANSPORT_ENV];

let daemon;
const closers = [];

function agent(options = {}) {
  const client = new Client({ target: daemon.target, session: true, ...options });
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

/** Whether process `pid` is stopped (by SIGSTOP): Linux's /proc/PID/stat state 'T'. */
function stopped(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2).startsWith('T');
}

const settled = (promise) => promise.then((value) => ({ value }), (error) => ({ error }));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Until `check()` holds, bounded: the wire may trail a promise by a moment. */
async function until(check, what) {
  for (let i = 0; i < 1_000; i += 1) {
    if (check()) return;
    await sleep(10);
  }
  assert.fail(`never: ${what}`);
}

function framed(bytes) {
  const frame = Buffer.alloc(4 + bytes.length);
  frame.writeUInt32BE(bytes.length, 0);
  Buffer.from(bytes).copy(frame, 4);
  return frame;
}

/**
 * A proxy of a daemon's framed socket, in a directory of its own: the gRPC socket there is a link
 * to the daemon's (unary calls, and the probe of a framed socket that refuses), and each connection
 * to the framed socket is forwarded frame by frame to the daemon's, with faults on cue:
 *   stall(kind)   the next message of that kind is never forwarded (never answered)
 *   cut(kind)     once the daemon answered the next message of that kind, the connection is cut
 *                 (applied, the answer lost)
 *   reverse(n)    the next n answers are held and sent in the reverse order
 * It records the connections, the messages (kind, id), the cancels and the ids answered.
 */
async function framesProxy(upstream = daemon) {
  const dir = fs.mkdtempSync('/tmp/efd-fp-');
  const grpcSocket = path.join(dir, 'effectd.sock');
  fs.symlinkSync(upstream.socket, grpcSocket);
  const seen = { connections: 0, messages: [], cancels: [], answers: [] };
  const faults = [];
  let held = null; // {n, answers: [{id, frame, down}]}
  const sockets = new Set();
  const take = (when, kind) => {
    const i = faults.findIndex((f) => f.when === when && f.kind === kind);
    return i >= 0 && faults.splice(i, 1).length > 0;
  };
  const send = ({ id, frame, down }) => {
    seen.answers.push(id);
    down.write(framed(frame));
  };
  const server = net.createServer({ allowHalfOpen: true }, (down) => {
    seen.connections += 1;
    const up = net.createConnection({ path: framesPath(upstream.socket), allowHalfOpen: true });
    sockets.add(down).add(up);
    const requests = new FrameReader(2 ** 31);
    const answers = new FrameReader(2 ** 31);
    let hello = true;
    const cutAt = new Set();
    const cut = () => {
      down.destroy();
      up.destroy();
    };
    down.on('data', (chunk) => {
      for (const frame of requests.push(chunk)) {
        if (!hello) {
          const { id, request: kind } = method.requestDeserialize(frame);
          if (kind === 'cancel') {
            seen.cancels.push(id);
          } else {
            seen.messages.push({ kind, id });
            if (take('stall', kind)) continue;
            if (take('cut', kind)) cutAt.add(id);
          }
        }
        hello = false;
        up.write(framed(frame));
      }
    });
    up.on('data', (chunk) => {
      for (const frame of answers.push(chunk)) {
        const { id } = method.responseDeserialize(frame);
        if (cutAt.has(id)) return cut();
        if (held && id !== 0) {
          held.answers.push({ id, frame, down });
          if (held.answers.length === held.n) {
            const { answers: back } = held;
            held = null;
            for (const answer of back.reverse()) send(answer);
          }
        } else {
          send({ id, frame, down });
        }
      }
      return undefined;
    });
    down.on('end', () => up.end());
    up.on('end', () => down.end());
    down.on('error', cut);
    up.on('error', cut);
  });
  const framesSocket = path.join(dir, 'effectd.frames.sock');
  await new Promise((resolve) => server.listen(framesSocket, resolve));
  closers.push(async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise((resolve) => server.close(resolve));
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return {
    target: `unix:${grpcSocket}`,
    seen,
    stall(kind) {
      faults.push({ when: 'stall', kind });
    },
    cut(kind) {
      faults.push({ when: 'cut', kind });
    },
    reverse(n) {
      held = { n, answers: [] };
    },
  };
}

/** The broken variant of the at-most-once guards: a session that sends again what a connection took. */
function resendingTaken(client) {
  const session = client._session;
  const ended = session._ended.bind(session);
  session._ended = (stream, error) => {
    for (const entry of session._pending.values()) if (entry.stream === stream) entry.sent = false;
    ended(stream, error);
  };
}

describe('which transport', () => {
  test('a unix: target whose daemon serves the framed socket is asked through it; the other RPCs stay unary', async () => {
    const proxy = await framesProxy();
    const client = agent({ target: proxy.target });
    assert.ok(client._session instanceof FramesSession);
    assert.equal(client.transport, 'frames');
    const ref = { runId: 'which', callId: 'c1' };
    const p = await client.prepareTool({ ...ref, tool: 't', input: 1, start: true });
    await client.commitTool({ ...ref, attempt: p.call.attempt, result: { ok: 1 }, acknowledge: true });
    assert.equal((await client.getToolCall(ref)).state, 'COMMITTED');
    assert.equal((await client.recover({ runId: 'which' })).items[0].action, 'ALREADY_DELIVERED');
    assert.equal(client.transport, 'frames');
    assert.equal(proxy.seen.connections, 1);
    assert.deepEqual(
      proxy.seen.messages.map((m) => m.kind),
      ['prepareTool', 'commitTool', 'getToolCall'],
    );
  });

  test('EFFECTD_TRANSPORT=grpc keeps the gRPC session stream', async () => {
    process.env[TRANSPORT_ENV] = ' GRPC ';
    let client;
    try {
      client = agent();
    } finally {
      delete process.env[TRANSPORT_ENV];
    }
    assert.ok(!(client._session instanceof FramesSession) && client._session instanceof Session);
    assert.equal(client.transport, 'session');
    assert.equal((await client.prepareTool({ runId: 'grpc', callId: 'c1', tool: 't', input: 1 })).decision, 'EXECUTE');
    assert.equal(client.transport, 'session');
    // The control: the same target without it is framed.
    assert.equal(agent().transport, 'frames');
  });

  test('a target that is not unix:, or session: false, is never framed', () => {
    assert.equal(agent({ target: '127.0.0.1:1' }).transport, 'session');
    assert.equal(agent({ session: false }).transport, 'unary');
    assert.equal(agent({ session: false })._session, null);
  });

  test('protos older than the framed transport (no SessionHello) keep the gRPC session stream', () => {
    const dir = fs.mkdtempSync('/tmp/efd-protos-');
    try {
      fs.cpSync(path.resolve(here, '..', '..', '..', 'protos', 'effectd'), path.join(dir, 'effectd'), { recursive: true });
      const ledger = path.join(dir, 'effectd', 'v1', 'ledger.proto');
      const text = fs.readFileSync(ledger, 'utf8');
      const older = text.replace(/message SessionHello \{[^}]*\}/, '');
      assert.notEqual(older, text);
      fs.writeFileSync(ledger, older);
      assert.equal(agent({ protosDir: dir }).transport, 'session');
      // The control: the same protos with it are framed.
      fs.writeFileSync(ledger, text);
      const fresh = fs.mkdtempSync('/tmp/efd-protos-');
      fs.cpSync(dir, fresh, { recursive: true });
      assert.equal(agent({ protosDir: fresh }).transport, 'frames');
      fs.rmSync(fresh, { recursive: true, force: true });
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('the framed socket is beside the gRPC one: stem + .frames + suffix', () => {
    assert.equal(framesPath('/run/x/effectd.sock'), '/run/x/effectd.frames.sock');
    assert.equal(framesPath('.effectd/effectd.sock'), '.effectd/effectd.frames.sock');
    assert.equal(framesPath('/run/a.b.sock'), '/run/a.b.frames.sock');
    assert.equal(framesPath('/run/sock'), '/run/sock.frames');
  });
});

describe('frames', () => {
  test('a byte stream cut anywhere gives back its frames: in pieces, several in one chunk', () => {
    const seed = Date.now() % 100_000;
    console.log(`seed ${seed}`);
    const bodies = [Buffer.alloc(0), Buffer.from('a'), Buffer.alloc(70_000, 7), Buffer.from('three'), Buffer.alloc(3, 1)];
    const bytes = Buffer.concat(bodies.map(framed));
    let x = seed;
    const cuts = [];
    for (let at = 0; at < bytes.length; ) {
      x = (x * 1103515245 + 12345) % 2 ** 31;
      const next = Math.min(bytes.length, at + 1 + (x % 9_000));
      cuts.push(bytes.subarray(at, next));
      at = next;
    }
    for (const chunks of [cuts, [bytes], [...bytes].map((b) => Buffer.from([b]))]) {
      const reader = new FrameReader(1 << 20);
      const got = chunks.flatMap((chunk) => reader.push(chunk));
      assert.deepEqual(got.map((b) => b.toString('hex')), bodies.map((b) => b.toString('hex')));
    }
    // The control: the seeded cuts do cut frames (a reader that takes each chunk whole would not do).
    assert.ok(cuts.some((chunk) => chunk.length < 4 || chunk.readUInt32BE(0) + 4 !== chunk.length));
  });

  test('a frame over the limit is refused from its header', () => {
    const reader = new FrameReader(16);
    assert.deepEqual(reader.push(framed(Buffer.alloc(16))).length, 1);
    assert.throws(() => reader.push(framed(Buffer.alloc(17)).subarray(0, 4)), /larger than max \(17 vs. 16\)/);
  });
});

describe('many in flight', () => {
  // Sends `n` prepares at once, their answers reversed by the proxy: the call id each caller got.
  async function prepareAtOnce(client, proxy, n, runId) {
    await client.getToolCall({ runId, callId: 'warm' }).catch(() => {}); // opens the connection
    proxy.reverse(n);
    const answers = await Promise.all(
      Array.from({ length: n }, (_, i) => client.prepareTool({ runId, callId: `c${i}`, tool: 't', input: { i } })),
    );
    return answers.map((a) => a.call.callId);
  }

  const N = 32;
  const own = Array.from({ length: N }, (_, i) => `c${i}`);

  test('32 calls in flight are answered in reverse, each caller with its own answer', async () => {
    const proxy = await framesProxy();
    const client = agent({ target: proxy.target });
    assert.deepEqual(await prepareAtOnce(client, proxy, N, 'many'), own);
    // The guard saw reordered answers: the ids came back in the reverse of the order sent.
    const sent = proxy.seen.messages.slice(1).map((m) => m.id);
    assert.deepEqual(proxy.seen.answers.slice(1), [...sent].reverse());
    assert.equal(proxy.seen.connections, 1);
  });

  test('negative control: a session that hands each answer to its oldest caller is caught', async () => {
    const proxy = await framesProxy();
    const client = agent({ target: proxy.target });
    const session = client._session;
    const answer = session._answer.bind(session);
    session._answer = (stream, got) => answer(stream, { ...got, id: Math.min(...session._pending.keys()) });
    assert.notDeepEqual(await prepareAtOnce(client, proxy, N, 'many-control'), own);
  });
});

describe('tokens', () => {
  const AGENT = 'agent-token-0123456789abcdef';
  const TOKENS = `
[[token]]
name = "agent-a"
secret = "${AGENT}"
roles = ["agent"]
namespaces = ["team-a"]
`;
  let secured;
  before(async () => {
    secured = await startDaemon({ env: { EFFECTD_TOKENS: TOKENS } });
  });
  after(async () => {
    await secured?.stop();
  });

  const ask = (client) => client.prepareTool({ runId: 'tok', callId: 'c1', tool: 't', input: 1 });

  test('the token rides in the hello: the agent is served in its namespace', async () => {
    const client = agent({ target: secured.target, token: AGENT });
    assert.equal((await ask(client)).call.namespace, 'team-a');
    assert.equal(client.transport, 'frames');
  });

  test('negative control: a hello without the token is refused (the check above can fail)', async () => {
    const client = agent({ target: secured.target, token: AGENT });
    const { channel } = client._session;
    const open = channel.makeBidiStreamRequest.bind(channel);
    channel.makeBidiStreamRequest = (m, s, d, metadata) => {
      metadata.remove('authorization');
      return open(m, s, d, metadata);
    };
    await assert.rejects(ask(client), (error) => error.code === 'UNAUTHENTICATED');
  });

  for (const [name, token] of [
    ['none', ''],
    ['unknown', 'not-a-token-of-this-daemon'],
  ]) {
    test(`a refused hello (${name}) is the unary call's refusal: class, code, reason, details, metadata`, async () => {
      const framedClient = agent({ target: secured.target, token });
      const unary = agent({ target: secured.target, token, session: false });
      const [viaFrames, viaUnary] = [await ask(framedClient).catch((e) => e), await ask(unary).catch((e) => e)];
      assert.ok(viaFrames instanceof EffectdError, String(viaFrames));
      assert.equal(viaFrames.reason, 'UNAUTHENTICATED');
      assert.equal(viaFrames.constructor, viaUnary.constructor);
      for (const key of ['code', 'reason', 'details', 'metadata', 'violations', 'retryDelayMs']) {
        assert.deepEqual(viaFrames[key], viaUnary[key], key);
      }
      // Refused, not broken: the next call asks again on a new connection, as framed as before.
      assert.equal(framedClient.transport, 'frames');
      await assert.rejects(ask(framedClient), (error) => error.reason === 'UNAUTHENTICATED');
      assert.equal(framedClient._session.streamsOpened, 2);
    });
  }
});

describe('a connection that breaks', () => {
  // A prepare with start whose connection is cut once the daemon applied it (the answer lost): what
  // it failed with, and what the daemon holds after.
  async function takenThenCut(callId, variant) {
    const proxy = await framesProxy();
    const client = agent({ target: proxy.target, reconnectWaitMs: 0 });
    variant?.(client);
    const ref = { runId: 'cut', callId };
    proxy.cut('prepareTool');
    const first = await settled(client.prepareTool({ ...ref, tool: 't', input: 1, start: true }));
    const sent = proxy.seen.messages.filter((m) => m.kind === 'prepareTool').length;
    const record = await agent().getToolCall(ref);
    return { first, sent, record, client };
  }

  test('a message the connection took fails UNAVAILABLE, mayHaveBeenApplied: never sent again', async () => {
    const { first, sent, record, client } = await takenThenCut('guard');
    const { error } = first;
    assert.ok(error, 'it failed');
    assert.equal(error.constructor, EffectdError);
    assert.equal(error.code, 'UNAVAILABLE');
    assert.equal(error.reason, '');
    assert.deepEqual(error.metadata, { mayHaveBeenApplied: 'true' });
    assert.equal(isOutcomeUnknown(error), true);
    assert.equal(sent, 1);
    assert.deepEqual(record.history.map((t) => t.event), ['prepare', 'start']);
    // The next call opens a new connection.
    assert.equal((await client.getToolCall(record)).state, 'STARTED');
    assert.equal(client._session.streamsOpened, 2);
  });

  test('negative control: a session that sends again what the connection took is caught', async () => {
    const { first, sent } = await takenThenCut('control', resendingTaken);
    // Sent twice, and answered as if it had not been cut: the guard above fails on both counts.
    assert.equal(sent, 2);
    assert.equal(first.value?.decision, 'IN_PROGRESS');
  });
});

describe('the daemon killed with a message in flight', () => {
  // The daemon stopped (SIGSTOP) with the connection open, a prepare handed to it, then killed; a
  // second prepare once it is gone; then a third, waiting, while it starts again.
  async function killedInFlight(variant) {
    const dataDir = fs.mkdtempSync('/tmp/efd-fk-');
    let own = await startDaemon({ dataDir });
    try {
      const client = agent({ target: own.target, reconnectWaitMs: 0 });
      variant?.(client);
      await client.getToolCall({ runId: 'kill', callId: 'warm' }).catch(() => {}); // opens the connection
      const exited = new Promise((resolve) => own.process.once('exit', resolve));
      own.process.kill('SIGSTOP');
      await until(() => stopped(own.process.pid), 'the daemon stopped');
      const taken = settled(client.prepareTool({ runId: 'kill', callId: 'taken', tool: 't', input: 1, start: true }));
      own.process.kill('SIGKILL');
      await exited;
      const taker = await taken;
      const notSent = await settled(client.prepareTool({ runId: 'kill', callId: 'later', tool: 't', input: 1 }));
      await own.stop();
      const patient = agent({ target: own.target, timeoutMs: 60_000, reconnectWaitMs: 60_000 });
      const waiting = patient.prepareTool({ runId: 'kill', callId: 'later', tool: 't', input: 1 });
      own = await startDaemon({ dataDir });
      const served = await waiting;
      const after = await settled(patient.getToolCall({ runId: 'kill', callId: 'taken' }));
      return { taker, notSent, served, after };
    } finally {
      await own.stop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  }

  test('taken: mayHaveBeenApplied=true; not sent: false, and sent once the daemon is back', async () => {
    const { taker, notSent, served, after: taken } = await killedInFlight();
    assert.equal(taker.error?.code, 'UNAVAILABLE', String(taker.error));
    assert.deepEqual(taker.error.metadata, { mayHaveBeenApplied: 'true' });
    assert.equal(notSent.error?.code, 'UNAVAILABLE', String(notSent.error));
    assert.deepEqual(notSent.error.metadata, { mayHaveBeenApplied: 'false' });
    assert.equal(served.decision, 'EXECUTE');
    // The message the killed daemon never read was never sent again either.
    assert.equal(taken.error?.reason, 'NOT_FOUND');
  });

  test('negative control: a session that sends again what the connection took is caught', async () => {
    const { taker } = await killedInFlight(resendingTaken);
    // Sent again to no daemon: it reads as not sent, which the guard above refuses.
    assert.deepEqual(taker.error?.metadata, { mayHaveBeenApplied: 'false' });
  });
});

describe('a daemon serving gRPC without the framed socket', () => {
  test('started with --no-local-frames: the gRPC session stream', async () => {
    const grpcOnly = await startDaemon({ args: ['--no-sync', '--no-local-frames'] });
    try {
      assert.equal(fs.existsSync(framesPath(grpcOnly.socket)), false);
      const client = agent({ target: grpcOnly.target });
      assert.equal(client.transport, 'session');
      assert.equal((await client.prepareTool({ runId: 'nf', callId: 'c1', tool: 't', input: 1 })).decision, 'EXECUTE');
    } finally {
      await grpcOnly.stop();
    }
  });

  // A client on a daemon serving the framed socket, then on the same socket's daemon restarted with
  // --no-local-frames: what its next prepare gave, and its transport then.
  async function acrossARestartWithoutFrames(variant) {
    const dataDir = fs.mkdtempSync('/tmp/efd-fn-');
    let own = await startDaemon({ dataDir });
    try {
      const client = agent({ target: own.target, reconnectWaitMs: 0 });
      variant?.(client);
      await client.prepareTool({ runId: 'nf', callId: 'before', tool: 't', input: 1 });
      assert.equal(client.transport, 'frames');
      await own.stop();
      own = await startDaemon({ dataDir, args: ['--no-sync', '--no-local-frames'] });
      const next = await settled(client.prepareTool({ runId: 'nf', callId: 'after', tool: 't', input: 1 }));
      const transport = client.transport;
      // Once the pause is over, the framed socket is tried again (and found missing again).
      client._session._unaryUntil = 0;
      const again = await settled(client.getToolCall({ runId: 'nf', callId: 'after' }));
      return { next, transport, again, opened: client._session.streamsOpened };
    } finally {
      await own.stop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  }

  test('restarted with --no-local-frames: unary calls, no error, then the framed socket tried again', async () => {
    const { next, transport, again, opened } = await acrossARestartWithoutFrames();
    assert.equal(next.value?.decision, 'EXECUTE', String(next.error));
    assert.equal(transport, 'unary');
    assert.equal(again.value?.state, 'PREPARED', String(again.error));
    assert.equal(opened, 3);
  });

  test('negative control: a session that takes a daemon serving gRPC alone for one away is caught', async () => {
    const { next } = await acrossARestartWithoutFrames((client) => {
      client._session.channel.probe = async () => false;
    });
    assert.equal(next.error?.code, 'UNAVAILABLE');
  });
});

describe('deadlines and close', () => {
  // A prepare the proxy never forwards, past a 300 ms deadline: its failure, its id and the cancels seen.
  async function pastItsDeadline(variant) {
    const proxy = await framesProxy();
    const client = agent({ target: proxy.target });
    variant?.(client);
    await client.getToolCall({ runId: 'late', callId: 'warm' }).catch(() => {});
    proxy.stall('prepareTool');
    client.timeoutMs = 300; // this call's deadline only
    const late = settled(client.prepareTool({ runId: 'late', callId: `c${Date.now()}`, tool: 't', input: 1 }));
    client.timeoutMs = 10_000;
    const { error } = await late;
    const stalled = proxy.seen.messages.find((m) => m.kind === 'prepareTool');
    const later = await client.prepareTool({ runId: 'late', callId: `d${Date.now()}`, tool: 't', input: 1 });
    return { error, stalled, later, proxy };
  }

  test('a message not answered in time fails DEADLINE_EXCEEDED and is cancelled; the connection goes on', async () => {
    const { error, stalled, later, proxy } = await pastItsDeadline();
    assert.ok(error instanceof EffectdError);
    assert.equal(error.code, 'DEADLINE_EXCEEDED');
    assert.equal(isOutcomeUnknown(error), true);
    await until(() => proxy.seen.cancels.length > 0, 'the cancel');
    assert.deepEqual(proxy.seen.cancels, [stalled.id]);
    assert.equal(later.decision, 'EXECUTE');
    assert.equal(proxy.seen.connections, 1);
  });

  test('negative control: a session that sends no cancel is caught', async () => {
    const { proxy } = await pastItsDeadline((client) => {
      const session = client._session;
      const serialize = session._serialize;
      // What it sends in the cancel's place: another message, seen by the proxy as one.
      session._serialize = (m) =>
        serialize(m.cancel ? { id: 10_000 + m.id, getToolCall: { ref: { runId: 'x', callId: 'x' } } } : m);
    });
    await until(() => proxy.seen.messages.some((m) => m.id > 10_000), 'the stand-in');
    assert.deepEqual(proxy.seen.cancels, []);
  });

  // A prepare held by the proxy, then close(): what it failed with.
  async function closedInFlight(variant) {
    const proxy = await framesProxy();
    const client = agent({ target: proxy.target });
    proxy.stall('prepareTool');
    const pending = settled(client.prepareTool({ runId: 'close', callId: `c${Date.now()}`, tool: 't', input: 1 }));
    await until(() => proxy.seen.messages.length === 1, 'the prepare at the proxy');
    (variant ?? ((c) => c.close()))(client);
    return { ...(await pending), client };
  }

  test('close() fails what is in flight CANCELLED, and every later call', async () => {
    const { error, client } = await closedInFlight();
    assert.ok(error instanceof EffectdError);
    assert.equal(error.code, 'CANCELLED');
    assert.equal(client._session._stream, null);
    await assert.rejects(client.getToolCall({ runId: 'close', callId: 'x' }), (e) => e.code === 'CANCELLED');
  });

  test('negative control: a close that only drops the connection is caught', async () => {
    const { error } = await closedInFlight((client) => client._session._stream.call.cancel());
    assert.equal(error.code, 'UNAVAILABLE');
  });
});

describe('nothing keeps the process alive', () => {
  const script = (closeIt) => `
const { Client } = require(${JSON.stringify(path.resolve(here, '..', 'src', 'index.js'))});
const client = new Client({ target: process.argv[1], session: true });
client.prepareTool({ runId: 'exit', callId: String(process.pid), tool: 't', input: 1 }).then((answer) => {
  const open = client._session._stream !== null && !client._session._stream.call._socket.destroyed;
  ${closeIt ? 'client.close();' : ''}
  console.log(JSON.stringify({ decision: answer.decision, transport: client.transport, open }));
});
`;
  const run = (closeIt) => {
    const env = { ...process.env };
    delete env[TRANSPORT_ENV];
    return promisify(execFile)(process.execPath, ['-e', script(closeIt), daemon.target], { timeout: 60_000, env });
  };

  test('close() ends the connection: the process exits by itself', async () => {
    const out = JSON.parse((await run(true)).stdout);
    assert.deepEqual(out, { decision: 'EXECUTE', transport: 'frames', open: true });
  });

  test('without close() the process exits by itself, the connection still open when the answer came', async () => {
    const out = JSON.parse((await run(false)).stdout);
    // The control: a connection was open, so it is not its absence that let the process go.
    assert.deepEqual(out, { decision: 'EXECUTE', transport: 'frames', open: true });
  });
});
