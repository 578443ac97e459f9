// The ledger session stream: many messages in flight on one stream, answered out of order; a
// per-call deadline that cancels; a broken stream whose messages in flight end unknown (never failed,
// never run twice) and a next call that reconnects; the unary RPCs for a daemon without the stream;
// and a closed (or idle) client that leaves nothing keeping the process alive. The gRPC stream is
// pinned (EFFECTD_TRANSPORT=grpc): a client of a local daemon would use its framed socket
// (frames.test.mjs).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import {
  Client,
  EffectdError,
  errors,
  safeToolCall,
  CallInProgress,
  ReconciliationNeeded,
  ResultNotRecorded,
} from '../src/index.js';
import { startDaemon } from '../src/testing.js';

const require = createRequire(import.meta.url);
const grpc = require('@grpc/grpc-js');
const { load } = require('../src/proto.js');
const { isOutcomeUnknown } = require('../src/safe.js');

const here = path.dirname(fileURLToPath(import.meta.url));
// Read by every client this file makes, and by the processes it starts.
process.env.EFFECTD_TRANSPORT = 'grpc';
const SESSION = '/effectd.v1.ToolLedger/Session';
const UNARY = [
  'PrepareTool',
  'PrepareTools',
  'StartTool',
  'CommitTool',
  'ReportUnknown',
  'Heartbeat',
  'GetToolCall',
].map((name) => `/effectd.v1.ToolLedger/${name}`);
const identity = (b) => b;

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

/**
 * A gRPC proxy on a Unix socket in front of `target`, forwarding the unary ledger RPCs and (unless
 * `session` is false: then grpc-js answers it UNIMPLEMENTED, as a daemon older than the stream does)
 * the Session stream, message by message, with faults on cue:
 *   cut(kind, {applied})  the next message of that kind breaks its stream (UNAVAILABLE): before it
 *                         reaches the daemon, or (applied) once the daemon answered it (answer lost)
 *   stall(kind)           the next message of that kind is never forwarded (never answered)
 *   reverse(n)            the next n answers are held and sent in the reverse order
 *   refuse(code)          every Session stream is refused with `code` before it serves anything
 * It records the streams opened, the messages (kind, id) and the cancels seen.
 */
async function sessionProxy({ target = daemon.target, session = true } = {}) {
  const method = load().services.ledger.service.Session;
  const upstream = new grpc.Client(target, grpc.credentials.createInsecure());
  const server = new grpc.Server();
  const faults = [];
  const seen = { streams: 0, messages: [], cancels: [], answers: [] };
  let held = null; // {n, answers: []}
  let refusal = null;
  const take = (when, kind) => {
    const i = faults.findIndex((f) => f.when === when && f.kind === kind);
    return i < 0 ? null : faults.splice(i, 1)[0];
  };
  for (const path of UNARY) {
    server.register(
      path,
      (call, callback) =>
        upstream.makeUnaryRequest(path, identity, identity, call.request, call.metadata, callback),
      identity,
      identity,
      'unary',
    );
  }
  if (session) {
    const decodeRequest = (bytes) => ({ bytes, msg: method.requestDeserialize(bytes) });
    const decodeAnswer = (bytes) => ({ bytes, msg: method.responseDeserialize(bytes) });
    server.register(
      SESSION,
      (down) => {
        seen.streams += 1;
        if (refusal !== null) {
          down.emit('error', { code: refusal, details: 'refused by the proxy' });
          return;
        }
        const up = upstream.makeBidiStreamRequest(SESSION, (m) => m.bytes, decodeAnswer, down.metadata);
        const kinds = new Map(); // id -> kind
        const applied = new Set(); // ids whose answer breaks the stream
        let done = false;
        const breakStream = () => {
          if (done) return;
          done = true;
          up.cancel();
          down.emit('error', { code: grpc.status.UNAVAILABLE, details: 'connection reset by the proxy' });
        };
        const send = (answer) => {
          seen.answers.push(answer.msg.id);
          down.write(answer);
        };
        down.on('data', (request) => {
          if (done) return;
          const { id, request: kind } = request.msg;
          if (kind === 'cancel') {
            seen.cancels.push(id);
          } else {
            seen.messages.push({ kind, id });
            kinds.set(id, kind);
            if (take('request', kind)) return breakStream();
            if (take('stall', kind)) return undefined;
            if (take('answer', kind)) applied.add(id);
          }
          up.write(request);
          return undefined;
        });
        down.on('end', () => up.end());
        down.on('cancelled', () => up.cancel());
        up.on('data', (answer) => {
          if (done) return;
          if (applied.has(answer.msg.id)) return breakStream();
          if (held) {
            held.answers.push(answer);
            if (held.answers.length === held.n) {
              const { answers } = held;
              held = null;
              for (const a of answers.reverse()) send(a);
            }
            return undefined;
          }
          send(answer);
          return undefined;
        });
        up.on('error', () => {});
        up.on('status', (status) => {
          if (done) return;
          done = true;
          if (status.code === grpc.status.OK) down.end();
          else down.emit('error', status);
        });
      },
      (answer) => answer.bytes, // the daemon's bytes, as they came
      decodeRequest,
      'bidi',
    );
  }
  const dir = fs.mkdtempSync('/tmp/efd-px-');
  const socket = `unix:${path.join(dir, 'proxy.sock')}`;
  await new Promise((resolve, reject) =>
    server.bindAsync(socket, grpc.ServerCredentials.createInsecure(), (e) => (e ? reject(e) : resolve())),
  );
  closers.push(async () => {
    upstream.close();
    server.forceShutdown();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return {
    target: socket,
    seen,
    cut(kind, { applied = false } = {}) {
      faults.push({ when: applied ? 'answer' : 'request', kind });
    },
    stall(kind) {
      faults.push({ when: 'stall', kind });
    },
    reverse(n) {
      held = { n, answers: [] };
    },
    refuse(code) {
      refusal = code;
    },
  };
}

const FAST = { attempts: 4, deadlineMs: 20_000, initialBackoffMs: 10 };

describe('one stream, many messages', () => {
  test('the ledger requests go over one stream; the others stay unary', async () => {
    const proxy = await sessionProxy();
    const client = agent({ target: proxy.target });
    assert.equal(client.transport, 'session');
    const ref = { runId: 'one', callId: 'c1' };
    const p = await client.prepareTool({ ...ref, tool: 't', input: 1, start: true });
    await client.heartbeat({ ...ref, attempt: p.call.attempt });
    await client.commitTool({ ...ref, attempt: p.call.attempt, result: { ok: 1 } });
    assert.equal((await client.getToolCall(ref)).state, 'COMMITTED');
    assert.equal(client.transport, 'session');
    assert.equal(proxy.seen.streams, 1);
    assert.deepEqual(
      proxy.seen.messages.map((m) => m.kind),
      ['prepareTool', 'heartbeat', 'commitTool', 'getToolCall'],
    );
  });

  test('32 calls in flight are answered out of order, each with its own answer', async () => {
    const seed = Date.now() % 100_000;
    console.log(`seed ${seed}`);
    const proxy = await sessionProxy();
    const client = agent({ target: proxy.target });
    await client.getToolCall({ runId: 'x', callId: 'warm' }).catch(() => {}); // opens the stream
    const n = 32;
    proxy.reverse(n);
    const answers = await Promise.all(
      Array.from({ length: n }, (_, i) =>
        client.prepareTool({ runId: `many-${seed}`, callId: `c${i}`, tool: 't', input: { i }, start: i % 2 === 0 }),
      ),
    );
    answers.forEach((answer, k) => {
      assert.equal(answer.call.callId, `c${k}`);
      assert.equal(answer.call.state, k % 2 === 0 ? 'STARTED' : 'PREPARED');
    });
    // The guard above saw reordered answers: the ids came back in the reverse of the order sent.
    const sent = proxy.seen.messages.slice(1).map((m) => m.id);
    const back = proxy.seen.answers.slice(1);
    assert.deepEqual(back, [...sent].reverse());
    assert.notDeepEqual(back, sent);
    assert.equal(proxy.seen.streams, 1);
  });

  test('a refusal on the stream is the unary call\'s refusal: class, code, reason, violations, metadata', async () => {
    const stream = agent();
    const unary = agent({ session: false });
    const ask = async (client, make) => {
      try {
        await make(client);
      } catch (error) {
        return error;
      }
      return assert.fail('not refused');
    };
    const cases = [
      (c) => c.prepareTool({ runId: 'a:b', callId: '', tool: '', input: 1 }),
      (c) => c.getToolCall({ runId: 'refuse', callId: 'absent' }),
      async (c) => {
        const ref = { runId: 'refuse', callId: `rev-${c.transport}` };
        const p = await c.prepareTool({ ...ref, tool: 't', input: 1 });
        return c.startTool({ ...ref, expectedRevision: p.call.revision + 5 });
      },
      async (c) => {
        const ref = { runId: 'refuse', callId: `mismatch-${c.transport}` };
        await c.prepareTool({ ...ref, tool: 't', input: 1 });
        return c.prepareTool({ ...ref, tool: 't', input: 2 });
      },
    ];
    for (const make of cases) {
      const [viaStream, viaUnary] = [await ask(stream, make), await ask(unary, make)];
      assert.equal(viaStream.constructor, viaUnary.constructor);
      assert.ok(viaStream instanceof EffectdError);
      for (const key of ['code', 'reason', 'details', 'metadata', 'violations', 'retryDelayMs']) {
        assert.deepEqual(viaStream[key], viaUnary[key], key);
      }
    }
    assert.equal(stream.transport, 'session');
  });

  test('a request over the message limit fails alone, before it is sent; the stream goes on', async () => {
    const proxy = await sessionProxy();
    const client = agent({ target: proxy.target, maxMessageBytes: 16 * 1024 });
    const small = client.prepareTool({ runId: 'big', callId: 'small', tool: 't', input: 1 });
    await assert.rejects(
      client.prepareTool({ runId: 'big', callId: 'big', tool: 't', input: 'x'.repeat(20 * 1024) }),
      (error) => error instanceof EffectdError && error.code === 'RESOURCE_EXHAUSTED',
    );
    assert.equal((await small).decision, 'EXECUTE');
    assert.deepEqual(
      proxy.seen.messages.map((m) => m.kind),
      ['prepareTool'],
    );
    assert.equal(proxy.seen.streams, 1);
  });
});

describe('deadlines', () => {
  test('a message not answered in time is cancelled and fails DEADLINE_EXCEEDED; the stream goes on', async () => {
    const proxy = await sessionProxy();
    const client = agent({ target: proxy.target });
    await client.getToolCall({ runId: 'x', callId: 'warm' }).catch(() => {});
    proxy.stall('prepareTool');
    client.timeoutMs = 300; // this call's deadline only: the others have the default
    const late = client.prepareTool({ runId: 'late', callId: 'c1', tool: 't', input: 1 });
    client.timeoutMs = 10_000;
    await assert.rejects(late, (error) => {
      assert.ok(error instanceof EffectdError);
      assert.equal(error.code, 'DEADLINE_EXCEEDED');
      assert.equal(error.reason, '');
      // Ambiguous, as a unary deadline: the safe call takes it for an unknown outcome.
      assert.equal(isOutcomeUnknown(error), true);
      return true;
    });
    const stalled = proxy.seen.messages.find((m) => m.kind === 'prepareTool');
    // The cancel may trail the rejection by a moment on the wire: wait for it, bounded.
    for (let i = 0; i < 200 && !proxy.seen.cancels.length; i += 1) await new Promise((r) => setTimeout(r, 10));
    assert.deepEqual(proxy.seen.cancels, [stalled.id]);
    const later = await client.prepareTool({ runId: 'late', callId: 'c2', tool: 't', input: 1 });
    assert.equal(later.decision, 'EXECUTE');
    assert.equal(proxy.seen.streams, 1);
  });
});

describe('a broken stream', () => {
  test('a message sent and not answered fails UNAVAILABLE, mayHaveBeenApplied; the next call reconnects', async () => {
    const proxy = await sessionProxy();
    const client = agent({ target: proxy.target });
    proxy.cut('prepareTool', { applied: true });
    const ref = { runId: 'broken', callId: 'c1' };
    await assert.rejects(client.prepareTool({ ...ref, tool: 't', input: 1, start: true }), (error) => {
      assert.equal(error.constructor, EffectdError);
      assert.equal(error.code, 'UNAVAILABLE');
      assert.equal(error.reason, '');
      assert.deepEqual(error.metadata, { mayHaveBeenApplied: 'true' });
      assert.equal(isOutcomeUnknown(error), true);
      return true;
    });
    // It was applied (the answer was lost): the next call, on a new stream, finds the attempt held.
    const again = await client.prepareTool({ ...ref, tool: 't', input: 1, start: true });
    assert.equal(again.decision, 'IN_PROGRESS');
    assert.equal(proxy.seen.streams, 2);
    assert.equal(client.transport, 'session');
  });

  test('a lost commit answer: the tool ran once, the commit is sent again on a new stream', async () => {
    const proxy = await sessionProxy();
    proxy.cut('commitTool', { applied: true });
    const call = { runId: 'broken', callId: 'commit', tool: 'send', input: 1 };
    let runs = 0;
    const value = await safeToolCall(agent({ target: proxy.target, recordingRetry: FAST }), call, () => {
      runs += 1;
      return { sent: true };
    });
    assert.deepEqual(value, { sent: true });
    assert.equal(runs, 1);
    assert.equal(proxy.seen.messages.filter((m) => m.kind === 'commitTool').length, 2);
    assert.equal(proxy.seen.streams, 2);
    const record = await agent().getToolCall(call);
    assert.equal(record.state, 'COMMITTED');
    assert.equal(record.history.filter((t) => t.event === 'commit').length, 1);
  });

  test('negative control: with one recording try the same break loses the result (the check above can fail)', async () => {
    const proxy = await sessionProxy();
    proxy.cut('commitTool', { applied: true });
    const call = { runId: 'broken', callId: 'commit-once', tool: 'send', input: 1 };
    await assert.rejects(
      safeToolCall(agent({ target: proxy.target, recordingRetry: { attempts: 1 } }), call, () => 1),
      ResultNotRecorded,
    );
  });

  test('the stream breaking at every commit: the safe call records unknown and never runs the tool again', async () => {
    const proxy = await sessionProxy();
    for (let i = 0; i < FAST.attempts; i += 1) proxy.cut('commitTool');
    const call = { runId: 'broken', callId: 'unknown', tool: 'pay', input: 1 };
    let runs = 0;
    const tool = () => {
      runs += 1;
      return { paid: true };
    };
    await assert.rejects(safeToolCall(agent({ target: proxy.target, recordingRetry: FAST }), call, tool), (error) => {
      assert.ok(error instanceof ResultNotRecorded);
      assert.equal(error.cause.code, 'UNAVAILABLE');
      assert.equal(error.cause.metadata.mayHaveBeenApplied, 'true');
      return true;
    });
    assert.equal((await agent().getToolCall(call)).state, 'UNKNOWN');
    // A new agent asking again: an unknown SIDE_EFFECT goes to an operator, the tool is not run.
    await assert.rejects(safeToolCall(agent(), call, tool), ReconciliationNeeded);
    assert.equal(runs, 1);
  });

  test('a lost prepare answer: the safe call throws unknown without running the tool; asked again it still does not', async () => {
    const proxy = await sessionProxy();
    proxy.cut('prepareTool', { applied: true });
    const call = { runId: 'broken', callId: 'prepare', tool: 'pay', input: 1 };
    let runs = 0;
    const tool = () => {
      runs += 1;
      return 1;
    };
    const client = agent({ target: proxy.target });
    await assert.rejects(safeToolCall(client, call, tool), (error) => error.code === 'UNAVAILABLE' && isOutcomeUnknown(error));
    await assert.rejects(safeToolCall(client, call, tool), CallInProgress);
    assert.equal(runs, 0);
    assert.equal((await agent().getToolCall(call)).state, 'STARTED');
  });

  test('a tool whose own session call broke records unknown; negative control: a definite error is committed', async () => {
    const proxy = await sessionProxy();
    const inner = agent({ target: proxy.target });
    const outer = agent();
    const states = [];
    for (const [callId, definite] of [
      ['inner-unknown', false],
      ['inner-definite', true],
    ]) {
      proxy.cut('prepareTool', { applied: true });
      let runs = 0;
      const call = { runId: 'broken', callId, tool: 'reserve', input: 1 };
      const tool = async () => {
        runs += 1;
        try {
          return await inner.prepareTool({ runId: 'inner', callId, tool: 'reserve', input: 1, start: true });
        } catch (error) {
          // The control: the same failure told as a definite refusal.
          throw definite ? Object.assign(new Error(error.message), { code: 'FAILED_PRECONDITION' }) : error;
        }
      };
      await assert.rejects(safeToolCall(outer, call, tool));
      states.push((await outer.getToolCall(call)).state);
      await assert.rejects(safeToolCall(outer, call, tool)); // never run again either way
      assert.equal(runs, 1);
    }
    assert.deepEqual(states, ['UNKNOWN', 'COMMITTED']);
  });
});

describe('reconnect', () => {
  test('after the daemon restarts, the next call opens a new stream and is served', async () => {
    const dataDir = fs.mkdtempSync('/tmp/efd-rs-');
    let own = await startDaemon({ dataDir });
    try {
      const client = agent({ target: own.target });
      const ref = { runId: 'restart', callId: 'c1' };
      const p = await client.prepareTool({ ...ref, tool: 't', input: 1, start: true });
      await own.stop();
      own = await startDaemon({ dataDir });
      // The first try may still meet the old stream (or the channel's reconnect backoff): a
      // recording request is sent again; the daemon, with the same data, commits it once.
      const up = await client.commitTool({ ...ref, attempt: p.call.attempt, result: 1 });
      assert.equal(up.state, 'COMMITTED');
      const record = await client.getToolCall(ref);
      assert.equal(record.history.filter((t) => t.event === 'commit').length, 1);
      assert.ok(record.history.some((t) => t.event === 'restart'), 'the daemon saw its restart');
      assert.equal(client.transport, 'session');
      assert.ok(client._session.streamsOpened >= 2, String(client._session.streamsOpened));
    } finally {
      await own.stop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });
});

describe('a daemon without the session stream', () => {
  test('UNIMPLEMENTED: the calls in flight and every later call go unary, for the client\'s life', async () => {
    const proxy = await sessionProxy({ session: false });
    const client = agent({ target: proxy.target });
    assert.equal(client.transport, 'session');
    const first = await Promise.all(
      Array.from({ length: 4 }, (_, i) => client.prepareTool({ runId: 'old', callId: `c${i}`, tool: 't', input: i, start: true })),
    );
    assert.ok(first.every((p) => p.decision === 'EXECUTE'));
    assert.equal(client.transport, 'unary');
    const c = await client.commitTool({ runId: 'old', callId: 'c0', attempt: 1, result: 1 });
    assert.equal(c.state, 'COMMITTED');
    const record = await agent().getToolCall({ runId: 'old', callId: 'c0' });
    assert.deepEqual(record.history.map((t) => t.event), ['prepare', 'start', 'commit']);
  });

  test('PERMISSION_DENIED before anything was served (an older daemon with tokens) goes unary too', async () => {
    const proxy = await sessionProxy();
    proxy.refuse(grpc.status.PERMISSION_DENIED);
    const client = agent({ target: proxy.target });
    assert.equal((await client.prepareTool({ runId: 'old-tokens', callId: 'c1', tool: 't', input: 1 })).decision, 'EXECUTE');
    assert.equal((await client.getToolCall({ runId: 'old-tokens', callId: 'c1' })).state, 'PREPARED');
    assert.equal(client.transport, 'unary');
    assert.equal(proxy.seen.streams, 1);
  });

  test('negative control: a stream refused UNAVAILABLE is not taken for an older daemon', async () => {
    const proxy = await sessionProxy();
    proxy.refuse(grpc.status.UNAVAILABLE);
    const client = agent({ target: proxy.target });
    await assert.rejects(client.prepareTool({ runId: 'down', callId: 'c1', tool: 't', input: 1 }), (e) => e.code === 'UNAVAILABLE');
    assert.equal(client.transport, 'session');
  });

  test('session: false never opens a stream', async () => {
    const proxy = await sessionProxy();
    const client = agent({ target: proxy.target, session: false });
    assert.equal(client.transport, 'unary');
    await client.prepareTool({ runId: 'off', callId: 'c1', tool: 't', input: 1 });
    assert.equal(proxy.seen.streams, 0);
  });
});

describe('nothing keeps the process alive', () => {
  const script = (closeIt) => `
const { Client } = require(${JSON.stringify(path.resolve(here, '..', 'src', 'index.js'))});
const client = new Client({ target: process.argv[1], session: true });
client.prepareTool({ runId: 'exit', callId: String(process.pid), tool: 't', input: 1 }).then((answer) => {
  const handles = process.getActiveResourcesInfo().filter((r) => r !== 'TTYWrap');
  ${closeIt ? 'client.close();' : ''}
  console.log(JSON.stringify({ decision: answer.decision, transport: client.transport, handles }));
});
`;
  const run = (closeIt) =>
    promisify(execFile)(process.execPath, ['-e', script(closeIt), daemon.target], { timeout: 60_000 });

  test('close() ends the stream: the process exits by itself', async () => {
    const { stdout } = await run(true);
    const out = JSON.parse(stdout);
    assert.equal(out.decision, 'EXECUTE');
    assert.equal(out.transport, 'session');
  });

  test('an idle stream is ended: even without close() the process exits by itself', async () => {
    const { stdout } = await run(false);
    const out = JSON.parse(stdout);
    assert.equal(out.transport, 'session');
    // The control: the stream was open, holding a handle, when the answer came.
    assert.ok(out.handles.length > 0, JSON.stringify(out.handles));
  });
});
