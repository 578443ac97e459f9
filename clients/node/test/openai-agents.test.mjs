// @effectd/client/openai-agents: OpenAI Agents JS function tools through the ledger, driven by the
// SDK's own run() and its ScriptedModel (the SDK's Model interface, scripted: no network). Each
// property has its negative control: the same agent with the unwrapped tool (or the SDK's own
// approval), caught running a call twice or running what effectd never approved.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Agent, RunState, run, setTracingDisabled, tool } from '@openai/agents';
import { ScriptedModel, assistantMessage, functionCall } from '@openai/agents/testing';
import { Client, ApprovalPending, OutcomeUnknown, ReconciliationNeeded, errors } from '../src/index.js';
import { AgentLedger, ApprovalMismatch, LedgerInterruption, NoLedgerRun, interruptionOf } from '../src/openai-agents.js';
import { ToolPolicy } from '../src/policy.js';
import { startDaemon } from '../src/testing.js';

setTracingDisabled(true);
let daemon;
let effectd;
let runs = 0;

before(async () => {
  daemon = await startDaemon();
  effectd = new Client({ target: daemon.target });
});

after(async () => {
  effectd?.close();
  await daemon?.stop();
});

const TO = { type: 'object', properties: { to: { type: 'string' } }, required: ['to'], additionalProperties: false };

/** The side effects, kept outside the framework and the ledger: sends by recipient. */
function mailer({ unknown = 0, sdkErrors = false, parallel = 1 } = {}) {
  const sent = [];
  let failures = unknown;
  const send = tool({
    name: 'send',
    description: 'Sends an e-mail.',
    parameters: TO,
    // null: an exception reaches the ledger (the SDK's default turns it into text for the model).
    ...(sdkErrors ? {} : { errorFunction: null }),
    execute: async ({ to }) => {
      sent.push(to);
      if (failures > 0) {
        failures -= 1;
        // The parallel calls of the step are all under way before the connection drops.
        for (let i = 0; i < 200 && sent.length < parallel; i += 1) await new Promise((r) => setTimeout(r, 5));
        throw new OutcomeUnknown(`the connection to the mail server dropped sending to ${to}`);
      }
      return `sent to ${to} (#${sent.length})`;
    },
  });
  return { send, sent };
}

const calls = (...list) => list.map(([to, callId]) => functionCall('send', { to }, { callId }));
const agentOf = (model, tools) => new Agent({ name: 'mailer', model, tools });
const newRun = () => `oa-run-${process.pid}-${(runs += 1)}`;

/** The tool outputs a model was sent, by call id. */
function outputsRead(model) {
  const out = {};
  for (const { request } of model.calls) {
    for (const item of Array.isArray(request.input) ? request.input : []) {
      if (item.type === 'function_call_result') out[item.callId] = item.output?.text ?? item.output;
    }
  }
  return out;
}

const POLICY = ToolPolicy.fromToml('[tools.send]\neffect = "side-effect"\nrequire_approval = true\n');

describe('OpenAI Agents JS through the ledger', () => {
  test('a single call runs once; the model reads its output; the ledger committed it', async () => {
    const { send, sent } = mailer();
    const ledger = new AgentLedger(effectd);
    const runId = newRun();
    const model = new ScriptedModel([calls(['ann', 'c1']), [assistantMessage('Mailed Ann.')]]);
    const result = await ledger.run(runId, () => run(agentOf(model, [ledger.tool(send)]), 'Mail Ann'));
    assert.equal(result.finalOutput, 'Mailed Ann.');
    assert.deepEqual(sent, ['ann']);
    assert.equal(outputsRead(model).c1, 'sent to ann (#1)');
    assert.equal((await effectd.getToolCall({ runId, callId: 'c1' })).state, 'COMMITTED');
  });

  test('a ledgered tool called outside ledger.run is refused, never keyed by a made-up run', async () => {
    const { send, sent } = mailer();
    const model = new ScriptedModel([calls(['ann', 'c1']), [assistantMessage('x')]]);
    await assert.rejects(run(agentOf(model, [new AgentLedger(effectd).tool(send)]), 'Mail Ann'), (e) => e.error instanceof NoLedgerRun);
    assert.deepEqual(sent, []);
  });

  for (const wrapped of [true, false]) {
    test(`parallel calls of one response, run again from the start: ${wrapped ? 'each ran once, the stored outputs read' : 'CONTROL, unwrapped: each ran twice'}`, async () => {
      const { send, sent } = mailer();
      const runId = newRun();
      for (const attempt of [1, 2]) {
        const ledger = new AgentLedger(effectd);
        const model = new ScriptedModel([calls(['ann', 'c1'], ['bob', 'c2'], ['cy', 'c3']), [assistantMessage('Mailed them.')]]);
        const agent = agentOf(model, [wrapped ? ledger.tool(send) : send]);
        const result = await ledger.run(runId, () => run(agent, 'Mail them'));
        assert.equal(result.finalOutput, 'Mailed them.', `attempt ${attempt}`);
      }
      assert.deepEqual(sent.sort(), wrapped ? ['ann', 'bob', 'cy'] : ['ann', 'ann', 'bob', 'bob', 'cy', 'cy']);
    });
  }

  test('CONTROL, unwrapped with the SDK default errorFunction: an unknown outcome is read as an error, the model asks again: sent twice', async () => {
    const { send, sent } = mailer({ unknown: 1, sdkErrors: true });
    const model = new ScriptedModel([calls(['ann', 'c1']), calls(['ann', 'c1-again']), [assistantMessage('Mailed Ann.')]]);
    await run(agentOf(model, [send]), 'Mail Ann');
    assert.deepEqual(sent, ['ann', 'ann']);
  });

  test('unknown outcomes end the run naming every unsettled call; refused until reconciled; the model reads the result found', async () => {
    const { send, sent } = mailer({ unknown: 2, parallel: 2 });
    const runId = newRun();
    const ledger = new AgentLedger(effectd);
    const script = () => new ScriptedModel([calls(['ann', 'c1'], ['bob', 'c2']), [assistantMessage('Mailed them.')]]);
    const first = script();
    const error = await ledger.run(runId, () => run(agentOf(first, [ledger.tool(send)]), 'Mail them')).then(() => null, (e) => e);
    const stop = interruptionOf(error);
    assert.ok(stop instanceof LedgerInterruption, String(error));
    assert.deepEqual(stop.calls.map((c) => [c.callId, c.state]).sort(), [['c1', 'UNKNOWN'], ['c2', 'UNKNOWN']]);
    assert.equal(first.calls.length, 1, 'the model read the unknown outcome');

    // Run again before anyone reconciled: refused, nothing runs.
    const again = await ledger.run(runId, () => run(agentOf(script(), [ledger.tool(send)]), 'Mail them')).then(() => null, (e) => e);
    assert.ok(interruptionOf(again)?.cause instanceof ReconciliationNeeded);
    assert.deepEqual(sent.sort(), ['ann', 'bob']);

    const c1 = await effectd.getToolCall({ runId, callId: 'c1' });
    await effectd.reconcile({ runId, callId: 'c1', expectedRevision: c1.revision, operator: 'op', reason: 'found it', evidence: 'outbox', result: 'sent to ann (outbox #1)' });
    const c2 = await effectd.getToolCall({ runId, callId: 'c2' });
    await effectd.reconcile({
      runId, callId: 'c2', expectedRevision: c2.revision, operator: 'op', reason: 'not sent', evidence: 'outbox',
      notExecuted: true, confirmedDeadAttempt: c2.attempt,
    });
    const model = script();
    const done = await ledger.run(runId, () => run(agentOf(model, [ledger.tool(send)]), 'Mail them'));
    assert.equal(done.finalOutput, 'Mailed them.');
    const read = outputsRead(model);
    assert.equal(read.c1, 'sent to ann (outbox #1)');
    assert.match(read.c2, /^sent to bob/);
    assert.deepEqual(sent.sort(), ['ann', 'bob', 'bob'], 'Bob: the lost attempt, then the one run after reconciliation');
  });

  /** A run stopped at the SDK's approval interruption; returns the agent, its item, the saved state. */
  async function awaitingApproval(tools, runId, ledger, to = 'ann') {
    const model = new ScriptedModel([calls([to, 'c1']), [assistantMessage('Mailed Ann.')]]);
    const agent = agentOf(model, tools);
    const result = await ledger.run(runId, () => run(agent, 'Mail Ann'));
    assert.equal(result.interruptions.length, 1, 'no approval interruption');
    return { agent, model, item: result.interruptions[0], saved: result.state.toString() };
  }

  for (const wrapped of [true, false]) {
    test(`approved, then resumed twice from the state saved before the approval: ${wrapped ? 'approved in effectd, sent once' : 'CONTROL, approved in the SDK: sent twice'}`, async () => {
      const { send, sent } = mailer();
      const runId = newRun();
      const ledger = new AgentLedger(effectd, { policy: POLICY });
      const tools = [wrapped ? ledger.tool(send) : { ...send, needsApproval: async () => true }];
      const { agent, model, item, saved } = await awaitingApproval(tools, runId, ledger);
      if (wrapped) {
        assert.equal((await effectd.getToolCall({ runId, callId: 'c1' })).state, 'AWAITING_APPROVAL');
        await ledger.approve(item, { approver: 'ann', runId });
      }
      for (const attempt of [1, 2]) {
        // A process restores the state saved at the interruption (the one that approved is gone).
        const state = await RunState.fromString(agent, saved);
        if (wrapped) assert.deepEqual(await ledger.run(runId, () => ledger.applyDecisions(state)), []);
        else for (const i of state.getInterruptions()) state.approve(i);
        model.enqueue([assistantMessage('Mailed Ann.')]);
        const result = await ledger.run(runId, () => run(agent, state));
        assert.equal(result.finalOutput, 'Mailed Ann.', `attempt ${attempt}`);
      }
      assert.deepEqual(sent, wrapped ? ['ann'] : ['ann', 'ann']);
    });
  }

  for (const wrapped of [true, false]) {
    test(`an approval given only in the SDK: ${wrapped ? 'authorizes nothing, the run ends' : 'CONTROL, unwrapped: the tool runs'}`, async () => {
      const { send, sent } = mailer();
      const runId = newRun();
      const ledger = new AgentLedger(effectd, { policy: POLICY });
      const tools = [wrapped ? ledger.tool(send) : { ...send, needsApproval: async () => true }];
      const { agent, saved } = await awaitingApproval(tools, runId, ledger);
      const state = await RunState.fromString(agent, saved);
      for (const i of state.getInterruptions()) state.approve(i);
      const error = await ledger.run(runId, () => run(agent, state)).then(() => null, (e) => e);
      if (wrapped) {
        assert.ok(interruptionOf(error)?.cause instanceof ApprovalPending, String(error));
        assert.deepEqual(interruptionOf(error).calls.map((c) => [c.callId, c.state]), [['c1', 'AWAITING_APPROVAL']]);
        assert.deepEqual(sent, []);
      } else {
        assert.deepEqual(sent, ['ann']);
      }
    });
  }

  test('an approval item showing other arguments than effectd recorded is refused; nothing is decided', async () => {
    const { send, sent } = mailer();
    const runId = newRun();
    const ledger = new AgentLedger(effectd, { policy: POLICY });
    const { item } = await awaitingApproval([ledger.tool(send)], runId, ledger);
    const edited = { ...item, rawItem: { ...item.rawItem, arguments: JSON.stringify({ to: 'mallory' }) } };
    await assert.rejects(ledger.approve(edited, { approver: 'ann', runId }), ApprovalMismatch);
    assert.equal((await effectd.getToolCall({ runId, callId: 'c1' })).state, 'AWAITING_APPROVAL');
    assert.deepEqual(sent, []);
  });

  for (const wrapped of [true, false]) {
    test(`approved, then the call's arguments edited in the saved state: ${wrapped ? 'refused (INPUT_MISMATCH), nothing sent' : 'CONTROL, unwrapped: the edited call runs'}`, async () => {
      const { send, sent } = mailer();
      const runId = newRun();
      const ledger = new AgentLedger(effectd, { policy: POLICY });
      const tools = [wrapped ? ledger.tool(send) : { ...send, needsApproval: async () => true }];
      const { agent, model, item, saved } = await awaitingApproval(tools, runId, ledger);
      if (wrapped) await ledger.approve(item, { approver: 'ann', runId });
      const state = await RunState.fromString(agent, saved.replaceAll('\\"ann\\"', '\\"mallory\\"'));
      assert.match(state.getInterruptions()[0].rawItem.arguments, /mallory/);
      for (const i of state.getInterruptions()) state.approve(i);
      model.enqueue([assistantMessage('Mailed.')]);
      const error = await ledger.run(runId, () => run(agent, state)).then(() => null, (e) => e);
      if (wrapped) {
        assert.ok(interruptionOf(error)?.cause instanceof errors.INPUT_MISMATCH, String(error));
        assert.deepEqual(sent, []);
      } else {
        assert.deepEqual(sent, ['mallory']);
      }
    });
  }
});

test('@effectd/client/openai-agents exports exactly these, and loads no @openai package', async () => {
  const { spawnSync } = await import('node:child_process');
  const probe = [
    "const oa = require('@effectd/client/openai-agents');",
    "const loaded = Object.keys(require.cache).filter((k) => k.includes('@openai'));",
    'console.log(JSON.stringify({ names: Object.keys(oa).sort(), loaded }));',
  ].join('\n');
  const done = spawnSync(process.execPath, ['-e', probe], { cwd: new URL('..', import.meta.url), encoding: 'utf8' });
  assert.equal(done.status, 0, done.stderr);
  assert.deepEqual(JSON.parse(done.stdout), {
    names: ['AgentLedger', 'ApprovalMismatch', 'LedgerInterruption', 'NoLedgerRun', 'interruptionOf'],
    loaded: [],
  });
});
