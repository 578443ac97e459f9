// @effectd/client/mcp: every tools/call of a real MCP server
// (@modelcontextprotocol/sdk's McpServer, over stdio and Streamable HTTP) runs at most once.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { Client, ApprovalPending, ReconciliationNeeded } from '../src/index.js';
import {
  LedgeredMcpClient,
  decideEffect,
  checkPolicy,
  McpConnectionLost,
  McpPolicyError,
  SessionInvalidated,
  MCP_TOOL_ERROR,
  KEY_META,
} from '../src/mcp.js';
import { startDaemon } from '../src/testing.js';
import { TRANSPORTS, connect, executions, killServer, startServer, waitFor } from '../fixtures/mcp-servers.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const AGENT = path.join(here, '..', 'fixtures', 'mcp-agent.mjs');
let daemon;
let effectd;
const open = [];

before(async () => {
  daemon = await startDaemon();
  effectd = new Client({ target: daemon.target });
});

after(async () => {
  for (const c of open) await c.close().catch(() => {});
  effectd?.close();
  await daemon?.stop();
});

async function session(server) {
  const client = await connect(server);
  open.push(client);
  return client;
}

/** The property: the tool ran once, however the connection ended. */
function checkNeverReissued(server, tool) {
  const n = executions(server.state, tool);
  if (n !== 1) throw new assert.AssertionError({ message: `${tool} ran ${n} times` });
}

// Over Streamable HTTP the SDK notices a dead server only at the request's
// timeout (60 s by default): the calls the tests interrupt set a shorter one.
const KILLED = { timeout: 5_000 };

/** Runs `call` on a new client and kills the server while its tool runs; returns what it threw. */
async function interrupted(server, call) {
  fs.writeFileSync(path.join(server.state, 'hold'), '');
  const mcp = await session(server);
  const running = call(mcp).then(
    () => null,
    (error) => error,
  );
  await waitFor(() => executions(server.state, 'slow_send') > 0, 'the tool to run');
  killServer(server.state);
  const error = await running;
  fs.rmSync(path.join(server.state, 'hold'));
  assert.ok(error, 'the call did not fail');
  return error;
}

for (const transport of TRANSPORTS) {
  describe(`MCP over ${transport}`, () => {
    let server;
    before(async () => {
      server = await startServer(transport);
    });
    after(() => server.stop());

    test('a repeated call returns the stored result; the server runs it once', async () => {
      const first = await new LedgeredMcpClient(await session(server), effectd, {
        runId: `${transport}-r1`,
        server: 'counter',
      }).callTool({ name: 'send', arguments: { to: 'ann' }, callId: 'tc-1' });
      const again = await new LedgeredMcpClient(await session(server), effectd, {
        runId: `${transport}-r1`,
        server: 'counter',
      }).callTool({ name: 'send', arguments: { to: 'ann' }, callId: 'tc-1' });
      assert.deepEqual(again, first);
      const call = await effectd.getToolCall({ runId: `${transport}-r1`, callId: 'tc-1' });
      assert.equal(call.toolName, 'mcp://counter/send');
      assert.equal(call.channel, 'MCP');
      assert.equal(executions(server.state, 'send'), 1);
    });

    test('an agent killed between commit and answer: the resumed repeat gets the stored result', async () => {
      const before = executions(server.state, 'send');
      const runId = `${transport}-crash`;
      const agent = spawn(
        process.execPath,
        [AGENT, daemon.target, server.state, transport, String(server.port), runId, 'tc-7'],
        { stdio: 'ignore' },
      );
      const exited = new Promise((resolve) => agent.once('exit', resolve));
      try {
        await waitFor(() => fs.existsSync(path.join(server.state, 'committed')), 'the commit');
      } finally {
        agent.kill('SIGKILL');
        await exited;
      }
      const seen = JSON.parse(fs.readFileSync(path.join(server.state, 'committed'), 'utf8'));
      const tools = new LedgeredMcpClient(await session(server), effectd, { runId, server: 'counter' });
      assert.deepEqual(await tools.callTool({ name: 'send', arguments: { to: 'ann' }, callId: 'tc-7' }), seen);
      assert.equal(executions(server.state, 'send'), before + 1);
    });

    test('a server killed mid-call: UNKNOWN, the client invalidated, never sent again', async () => {
      const runId = `${transport}-kill`;
      let tools;
      const error = await interrupted(server, (mcp) => {
        tools = new LedgeredMcpClient(mcp, effectd, { runId, server: 'counter' });
        return tools.callTool({ name: 'slow_send', arguments: { to: 'bo' }, callId: 'tc-2' }, undefined, KILLED);
      });
      assert.ok(error instanceof McpConnectionLost, String(error));
      // It names the call to reconcile (issue 25 item 15).
      assert.deepEqual([error.runId, error.callId], [runId, 'tc-2']);
      assert.match(error.message, new RegExp(`call tc-2 of run ${runId}: .*effectd ctl show ${runId} tc-2`));
      assert.equal((await effectd.getToolCall({ runId, callId: 'tc-2' })).state, 'UNKNOWN');
      assert.ok(tools.invalidated);
      await assert.rejects(
        tools.callTool({ name: 'slow_send', arguments: { to: 'bo' }, callId: 'tc-2' }),
        SessionInvalidated,
      );
      await server.restart();
      const again = new LedgeredMcpClient(await session(server), effectd, { runId, server: 'counter' });
      await assert.rejects(
        again.callTool({ name: 'slow_send', arguments: { to: 'bo' }, callId: 'tc-2' }),
        ReconciliationNeeded,
      );
      checkNeverReissued(server, 'slow_send');
    });

    test('negative control: a naive retry after the kill runs the tool twice, and the check says so', async () => {
      fs.rmSync(path.join(server.state, 'slow_send'), { force: true });
      await interrupted(server, (mcp) => mcp.callTool({ name: 'slow_send', arguments: { to: 'bo' } }, undefined, KILLED));
      await server.restart();
      await (await session(server)).callTool({ name: 'slow_send', arguments: { to: 'bo' } });
      assert.throws(() => checkNeverReissued(server, 'slow_send'), /ran 2 times/);
    });

    test('annotations do not downgrade a side effect (a trusted server is believed: the control)', async () => {
      const runId = `${transport}-hints`;
      const mcp = await session(server);
      const pinned = { servers: { counter: { tools: { lookup: { effect: 'read' }, send: { effect: 'side-effect' } } } } };
      const trusted = { servers: { counter: { trusted: true } } };
      const cases = [
        [{}, 'send', 'untrusted'],
        [pinned, 'send', 'pinned'],
        [trusted, 'send', 'trusted'],
        [pinned, 'lookup', 'raised'],
      ];
      const effects = {};
      for (const [policy, name, callId] of cases) {
        const tools = new LedgeredMcpClient(mcp, effectd, { runId, server: 'counter', policy });
        await tools.callTool({ name, arguments: name === 'send' ? { to: 'x' } : { query: 'q' }, callId });
        effects[callId] = (await effectd.getToolCall({ runId, callId })).effect;
      }
      assert.deepEqual(effects, { untrusted: 'SIDE_EFFECT', pinned: 'SIDE_EFFECT', trusted: 'READ', raised: 'SIDE_EFFECT' });
    });

    test('a call the policy holds for approval runs once approved', async () => {
      const runId = `${transport}-approve`;
      const before = executions(server.state, 'send');
      const policy = { servers: { counter: { tools: { send: { requireApproval: true } } } } };
      const tools = new LedgeredMcpClient(await session(server), effectd, { runId, server: 'counter', policy });
      const ask = () => tools.callTool({ name: 'send', arguments: { to: 'cy' }, callId: 'tc-3' });
      const pending = await ask().catch((error) => error);
      assert.ok(pending instanceof ApprovalPending, String(pending));
      assert.equal(executions(server.state, 'send'), before);
      await effectd.decideApproval({
        runId,
        callId: 'tc-3',
        approve: true,
        approver: 'ops',
        reason: 'looks right',
        expectedRevision: pending.call.revision,
        inputFingerprint: pending.call.inputFingerprint,
      });
      const first = await ask();
      assert.deepEqual(await ask(), first);
      assert.equal(executions(server.state, 'send'), before + 1);
    });

    test('an isError result is committed as an error and never run again', async () => {
      const runId = `${transport}-error`;
      const tools = new LedgeredMcpClient(await session(server), effectd, { runId, server: 'counter' });
      const ask = () => tools.callTool({ name: 'fail', arguments: { to: 'dee' }, callId: 'tc-4' });
      const first = await ask();
      assert.equal(first.isError, true);
      assert.deepEqual(await ask(), JSON.parse(JSON.stringify(first)));
      const call = await effectd.getToolCall({ runId, callId: 'tc-4' });
      assert.equal(call.state, 'COMMITTED');
      assert.equal(call.result.errorCode, MCP_TOOL_ERROR);
      assert.equal(executions(server.state, 'fail'), 1);
    });

    test('a stored value that is no CallToolResult is returned as one with its text', async () => {
      // Recorded before the daemon checked the shape of an MCP call's reconciled result
      // (issue 25 item 5: fails before the fix: the bare value was returned).
      const runId = `${transport}-plain`;
      const before = executions(server.state, 'send');
      const tools = new LedgeredMcpClient(await session(server), effectd, { runId, server: 'counter' });
      for (const [callId, stored, text] of [
        ['tc-8', 'charged i-9', 'charged i-9'],
        ['tc-9', { charged: 9 }, '{"charged":9}'],
      ]) {
        const input = { server: 'counter', tool: 'send', arguments: { to: 'ann' } };
        const p = await effectd.prepareTool({ runId, callId, toolName: 'mcp://counter/send', input, start: true, channel: 'MCP' });
        await effectd.commitTool({ runId, callId, attempt: p.call.attempt, result: stored });
        const result = await tools.callTool({ name: 'send', arguments: { to: 'ann' }, callId });
        assert.deepEqual(result, { content: [{ type: 'text', text }], isError: false });
      }
      assert.equal(executions(server.state, 'send'), before);
    });

    test('an IDEMPOTENT_WRITE carries its key in _meta', async () => {
      const runId = `${transport}-key`;
      const policy = { servers: { counter: { tools: { upsert: { effect: 'idempotent-write' } } } } };
      const tools = new LedgeredMcpClient(await session(server), effectd, { runId, server: 'counter', policy });
      await tools.callTool({ name: 'upsert', arguments: { name: 'eve' }, callId: 'tc-5' });
      const meta = JSON.parse(fs.readFileSync(path.join(server.state, 'upsert.meta'), 'utf8'));
      assert.equal(meta[KEY_META], `${runId}:tc-5`);
    });
  });
}

describe('decideEffect', () => {
  const liesReadOnly = { readOnlyHint: true, destructiveHint: false };
  const rows = [
    [{}, undefined, 'SIDE_EFFECT'],
    [{}, liesReadOnly, 'SIDE_EFFECT'],
    [{ servers: { s: { tools: { t: { effect: 'read' } } } } }, liesReadOnly, 'READ'],
    [{ servers: { s: { tools: { t: { effect: 'read' } } } } }, { readOnlyHint: false }, 'SIDE_EFFECT'],
    [{ servers: { s: { tools: { t: { effect: 'read' } } } } }, { readOnlyHint: false, idempotentHint: true }, 'IDEMPOTENT_WRITE'],
    [{ servers: { s: { trusted: true } } }, undefined, 'SIDE_EFFECT'],
    [{ servers: { s: { trusted: true } } }, liesReadOnly, 'READ'],
    [{ servers: { s: { trusted: true, tools: { t: { effect: 'side-effect' } } } } }, liesReadOnly, 'SIDE_EFFECT'],
  ];
  for (const [policy, annotations, effect] of rows) {
    test(`${JSON.stringify(policy)} ${JSON.stringify(annotations)} -> ${effect}`, () => {
      assert.equal(decideEffect(checkPolicy(policy), 's', 't', annotations).effect, effect);
    });
  }

  test('an invalid policy names the setting', () => {
    assert.throws(() => checkPolicy({ servers: { s: { trusted: 1 } } }), McpPolicyError);
    assert.throws(() => checkPolicy({ servers: { s: { tools: { t: { effect: 'write' } } } } }), /servers\.s\.tools\.t\.effect/);
    assert.throws(() => checkPolicy({ server: {} }), /unknown setting 'server'/);
  });
});

describe('the package', () => {
  test('@effectd/client/mcp exports exactly these, and neither entry point loads the SDK', async () => {
    const probe = [
      "const mcp = require('@effectd/client/mcp');",
      "require('@effectd/client');",
      "const loaded = Object.keys(require.cache).some((k) => k.includes('@modelcontextprotocol'));",
      'console.log(JSON.stringify({ names: Object.keys(mcp).sort(), loaded }));',
    ].join('\n');
    const out = await new Promise((resolve, reject) => {
      const child = spawn(process.execPath, ['-e', probe], { cwd: path.join(here, '..') });
      let text = '';
      child.stdout.on('data', (chunk) => {
        text += chunk;
      });
      child.once('error', reject);
      child.once('exit', (code) => (code === 0 ? resolve(text) : reject(new Error(`exit ${code}`))));
    });
    assert.deepEqual(JSON.parse(out), {
      names: [
        'KEY_META',
        'LedgeredMcpClient',
        'MCP_TOOL_ERROR',
        'McpConnectionLost',
        'McpPolicyError',
        'SessionInvalidated',
        'checkPolicy',
        'decideEffect',
        'ledgerToolName',
        'mcpPolicyFromMapping',
        'mcpPolicyFromToml',
      ],
      loaded: false,
    });
  });
});
