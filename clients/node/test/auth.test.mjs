// The client against a daemon that requires bearer tokens and serves TLS:
// the token rides on every call, mutual TLS verifies both ends, one message
// limit holds, and the token never shows when the client is inspected.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { inspect } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { Client, EffectdError, errors } from '../src/index.js';
import { startDaemon, DEFAULT_PYTHON } from '../src/testing.js';

const AGENT = 'agent-token-0123456789abcdef';
const OPERATOR = 'operator-token-0123456789abcdef';
const TOKENS = `
[[token]]
name = "agent-a"
secret = "${AGENT}"
roles = ["agent"]
namespaces = ["team-a"]

[[token]]
name = "oncall"
secret = "${OPERATOR}"
roles = ["agent", "approver", "operator"]
namespaces = ["*"]
`;
const KIB = 1024;
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** A throwaway CA, server and client certificates, made by the Python test support. */
function makePki() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'efd-pki-'));
  const python = process.env.EFFECTD_PYTHON || DEFAULT_PYTHON;
  const script = 'import sys, pathlib; from tests.support.certs import make_pki; make_pki(pathlib.Path(sys.argv[1]))';
  execFileSync(python, ['-c', script, dir], { cwd: repo, stdio: ['ignore', 'ignore', 'inherit'] });
  const read = (name) => fs.readFileSync(path.join(dir, name));
  return {
    dir,
    file: (name) => path.join(dir, name),
    ca: read('ca.pem'),
    untrustedCa: read('untrusted-ca.pem'),
    cert: read('client.pem'),
    key: read('client-key.pem'),
  };
}

async function rejectsWith(promise, Cls) {
  await assert.rejects(promise, (error) => {
    assert.ok(error instanceof Cls, `${error.constructor.name}: ${error.message}`);
    return true;
  });
}

describe('bearer tokens', () => {
  let daemon;
  before(async () => {
    daemon = await startDaemon({ env: { EFFECTD_TOKENS: TOKENS } });
  });
  after(async () => {
    await daemon?.stop();
  });

  test('the right token is served in its one namespace', async () => {
    const agent = new Client({ target: daemon.target, token: AGENT });
    const oncall = new Client({ target: daemon.target, token: OPERATOR, namespace: 'team-a' });
    try {
      const prepared = await agent.prepareTool({ runId: 'r', callId: 'c1', tool: 'search', input: { q: 1 } });
      assert.equal(prepared.call.namespace, 'team-a');
      assert.equal((await oncall.getToolCall({ runId: 'r', callId: 'c1' })).toolName, 'search');
    } finally {
      agent.close();
      oncall.close();
    }
  });

  for (const [name, token] of [
    ['none', ''],
    ['unknown', 'not-a-token-of-this-daemon'],
    ['truncated', AGENT.slice(0, -1)],
  ]) {
    test(`a missing or wrong token is UNAUTHENTICATED (${name}), quoting no token`, async () => {
      const client = new Client({ target: daemon.target, token });
      try {
        await assert.rejects(client.putCheckpoint('k', Buffer.from('v')), (error) => {
          assert.ok(error instanceof errors.UNAUTHENTICATED, error.message);
          assert.equal(error.code, 'UNAUTHENTICATED');
          for (const secret of [AGENT, OPERATOR, token]) {
            if (secret) assert.ok(!error.message.includes(secret));
          }
          return true;
        });
      } finally {
        client.close();
      }
    });
  }

  test('EFFECTD_TOKEN is the default token', async () => {
    const saved = process.env.EFFECTD_TOKEN;
    process.env.EFFECTD_TOKEN = AGENT;
    try {
      const client = new Client({ target: daemon.target });
      try {
        assert.ok((await client.putCheckpoint('from-env', Buffer.from('v'))) > 0);
      } finally {
        client.close();
      }
    } finally {
      if (saved === undefined) delete process.env.EFFECTD_TOKEN;
      else process.env.EFFECTD_TOKEN = saved;
    }
  });

  test('an agent token may not reconcile: PERMISSION_DENIED; the operator may', async () => {
    const agent = new Client({ target: daemon.target, token: AGENT });
    const oncall = new Client({ target: daemon.target, token: OPERATOR, namespace: 'team-a' });
    const ref = { runId: 'r', callId: 'charge' };
    try {
      const prepared = await agent.prepareTool({ ...ref, tool: 'charge', input: { id: 1 }, start: true });
      const unknown = await agent.reportUnknown({ ...ref, attempt: prepared.call.attempt, reason: 'died' });
      const order = {
        ...ref,
        expectedRevision: unknown.revision,
        reason: 'checked',
        evidence: 'no charge',
        notExecuted: true,
        confirmedDeadAttempt: prepared.call.attempt,
      };
      await rejectsWith(agent.reconcile(order), errors.PERMISSION_DENIED);
      const done = await oncall.reconcile(order);
      assert.ok(done.revision > unknown.revision);
    } finally {
      agent.close();
      oncall.close();
    }
  });
});

describe('the client', () => {
  test('inspecting it says a token is set but never shows it', () => {
    const client = new Client({ target: 'unix:/nonexistent.sock', token: AGENT, namespace: 'team-a' });
    try {
      for (const text of [inspect(client, { depth: 10, showHidden: true }), String(Object.entries(client))]) {
        assert.ok(!text.includes(AGENT), text);
      }
      assert.match(inspect(client), /token: '<hidden>'/);
    } finally {
      client.close();
    }
  });

  test('an unsendable token is refused without quoting it', () => {
    for (const bad of [` ${AGENT}`, `${AGENT}\n`, `two ${AGENT}`]) {
      assert.throws(
        () => new Client({ target: 'unix:/nonexistent.sock', token: bad }),
        (error) => error instanceof TypeError && /token/.test(error.message) && !error.message.includes(AGENT),
      );
    }
  });

  test('half a client identity, or tls with credentials, is refused', () => {
    assert.throws(() => new Client({ tls: { cert: Buffer.from('x') } }), /cert and key/);
    assert.throws(() => new Client({ tls: true, credentials: {} }), /tls and credentials/);
  });
});

describe('one message limit, both directions', () => {
  let daemon;
  before(async () => {
    daemon = await startDaemon({ args: ['--no-sync', '--max-message-size', String(64 * KIB)] });
  });
  after(async () => {
    await daemon?.stop();
  });

  test('the daemon refuses a request over its limit; one under it is served', async () => {
    const client = new Client({ target: daemon.target });
    try {
      assert.ok((await client.putCheckpoint('under', Buffer.alloc(60 * KIB))) > 0);
      await assert.rejects(client.putCheckpoint('over', Buffer.alloc(70 * KIB)), (error) => {
        assert.ok(error instanceof EffectdError);
        assert.equal(error.code, 'RESOURCE_EXHAUSTED');
        return true;
      });
    } finally {
      client.close();
    }
  });

  test('a client limited to 16 KiB neither sends nor receives more', async () => {
    const small = new Client({ target: daemon.target, maxMessageBytes: 16 * KIB });
    try {
      assert.ok((await small.putCheckpoint('small', Buffer.alloc(8 * KIB))) > 0);
      for (const call of [
        () => small.putCheckpoint('big', Buffer.alloc(20 * KIB)),
        () => small.getCheckpoint('under'), // 60 KiB, written above
      ]) {
        await assert.rejects(call(), (error) => error.code === 'RESOURCE_EXHAUSTED');
      }
    } finally {
      small.close();
    }
  });
});

describe('mutual TLS', () => {
  let daemon;
  let pki;
  before(async () => {
    pki = makePki();
    daemon = await startDaemon({
      env: { EFFECTD_TOKENS: TOKENS },
      args: [
        '--no-sync',
        '--listen',
        '127.0.0.1:0',
        '--tls-cert',
        pki.file('server.pem'),
        '--tls-key',
        pki.file('server-key.pem'),
        '--tls-client-ca',
        pki.file('ca.pem'),
      ],
    });
    assert.ok(daemon.tcp, daemon.stderr());
  });
  after(async () => {
    await daemon?.stop();
    if (pki) fs.rmSync(pki.dir, { recursive: true, force: true });
  });

  const attempt = async (options) => {
    const client = new Client({ target: daemon.tcp, token: AGENT, timeoutMs: 5_000, ...options });
    try {
      return await client.putCheckpoint('tls', Buffer.from('v'));
    } finally {
      client.close();
    }
  };

  test('the CA, the client certificate and a token are served', async () => {
    assert.ok((await attempt({ tls: { ca: pki.ca, cert: pki.cert, key: pki.key } })) > 0);
  });

  test('no client certificate, an untrusted root, or plaintext never reach the daemon', async () => {
    // A refused handshake looks like a daemon away: a client that waits for one
    // (reconnectWaitMs) would wait out its deadline before failing the same way.
    for (const options of [
      { tls: { ca: pki.ca } },
      { tls: { ca: pki.untrustedCa, cert: pki.cert, key: pki.key } },
      {},
    ]) {
      await assert.rejects(
        attempt({ ...options, reconnectWaitMs: 0 }),
        (error) => error.code === 'UNAVAILABLE',
      );
    }
  });
});
