// @effectd/client/ai: the Vercel AI SDK's tools through the ledger, driven by the SDK's own
// generateText and its MockLanguageModelV4 (scripted, no network). Each property has its
// negative control: the same agent with the unwrapped tool, caught running a call twice (or
// running what effectd never approved).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { generateText, jsonSchema, stepCountIs, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { Client, ApprovalPending, OutcomeUnknown, ReconciliationNeeded, errors } from '../src/index.js';
import { AiToolLedger, ApprovalMismatch, LedgerInterruption } from '../src/ai.js';
import { ToolPolicy } from '../src/policy.js';
import { startDaemon } from '../src/testing.js';

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

const USAGE = { inputTokens: { total: 1 }, outputTokens: { total: 1 } };

/**
 * A scripted model: each step is a list of tool calls [name, id, input] or a text; `prompts`
 * keeps what the model was sent each time (the tool results it read).
 */
function scripted(steps) {
  const prompts = [];
  let i = 0;
  const model = new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      prompts.push(prompt);
      const step = steps[Math.min(i++, steps.length - 1)];
      if (typeof step === 'string') {
        return { content: [{ type: 'text', text: step }], finishReason: { unified: 'stop', raw: undefined }, usage: USAGE, warnings: [] };
      }
      const content = step.map(([toolName, toolCallId, input]) => ({
        type: 'tool-call',
        toolCallId,
        toolName,
        input: JSON.stringify(input),
      }));
      return { content, finishReason: { unified: 'tool-calls', raw: undefined }, usage: USAGE, warnings: [] };
    },
  });
  return { model, prompts };
}

/** What a model read as tool results, by call id. */
function resultsRead(prompts) {
  const out = {};
  for (const prompt of prompts) {
    for (const m of prompt) {
      if (m.role !== 'tool') continue;
      for (const p of m.content) if (p.type === 'tool-result') out[p.toolCallId] = p.output;
    }
  }
  return out;
}

const TO = jsonSchema({ type: 'object', properties: { to: { type: 'string' } }, required: ['to'] });

/** The side effects, kept outside the framework and the ledger: sends by recipient. */
function mailer({ failFirst } = {}) {
  const sent = [];
  let failures = failFirst ?? 0;
  const send = tool({
    description: 'Sends an e-mail.',
    inputSchema: TO,
    execute: async ({ to }) => {
      sent.push(to);
      if (failures > 0) {
        failures -= 1;
        throw new OutcomeUnknown(`the connection to the mail server dropped sending to ${to}`);
      }
      return `sent to ${to} (#${sent.length})`;
    },
  });
  return { send, sent };
}

function newRun() {
  runs += 1;
  return `ai-run-${process.pid}-${runs}`;
}

async function run({ model, tools, messages, ledger }) {
  const stopWhen = ledger ? [stepCountIs(6), ledger.stopWhen] : stepCountIs(6);
  return generateText({ model, tools, messages, stopWhen });
}

const ASK = [{ role: 'user', content: 'Mail Ann and Bob' }];

describe('the Vercel AI SDK through the ledger', () => {
  test('a single call runs once; the model reads its output; the ledger committed it', async () => {
    const { send, sent } = mailer();
    const ledger = new AiToolLedger(effectd, { runId: newRun() });
    const { model, prompts } = scripted([[['send', 'c1', { to: 'ann' }]], 'Mailed Ann.']);
    const result = await run({ model, tools: ledger.tools({ send }), messages: ASK, ledger });
    assert.equal(result.text, 'Mailed Ann.');
    assert.deepEqual(sent, ['ann']);
    assert.deepEqual(resultsRead(prompts).c1, { type: 'text', value: 'sent to ann (#1)' });
    const call = await effectd.getToolCall({ runId: ledger.runId, callId: 'c1' });
    assert.equal(call.state, 'COMMITTED');
    assert.equal(call.effect, 'SIDE_EFFECT');
  });

  for (const wrapped of [true, false]) {
    test(`parallel calls of one response, run again from the start: ${wrapped ? 'each ran once, the stored outputs read' : 'CONTROL, unwrapped: each ran twice'}`, async () => {
      const { send, sent } = mailer();
      const runId = newRun();
      const steps = [[['send', 'c1', { to: 'ann' }], ['send', 'c2', { to: 'bob' }], ['send', 'c3', { to: 'cy' }]], 'Mailed them.'];
      for (const attempt of [1, 2]) {
        // A second process (the first crashed before it saved the transcript) runs the same
        // conversation: the model names the same calls.
        const ledger = new AiToolLedger(effectd, { runId });
        const { model, prompts } = scripted(steps);
        const tools = wrapped ? ledger.tools({ send }) : { send };
        await run({ model, tools, messages: ASK, ledger: wrapped ? ledger : null });
        if (wrapped) assert.deepEqual(resultsRead(prompts).c2, { type: 'text', value: `sent to bob (#${sent.indexOf('bob') + 1})` }, `attempt ${attempt}`);
      }
      assert.deepEqual(sent.sort(), wrapped ? ['ann', 'bob', 'cy'] : ['ann', 'ann', 'bob', 'bob', 'cy', 'cy']);
    });
  }

  test('CONTROL, unwrapped: an unknown outcome reaches the model as an error, which asks again: sent twice', async () => {
    const { send, sent } = mailer({ failFirst: 1 });
    const { model } = scripted([[['send', 'c1', { to: 'ann' }]], [['send', 'c1-again', { to: 'ann' }]], 'Mailed Ann.']);
    await run({ model, tools: { send }, messages: ASK });
    assert.deepEqual(sent, ['ann', 'ann']);
  });

  test('unknown outcomes stop the run naming every unsettled call; refused until reconciled; the model reads the reconciled result', async () => {
    const { send, sent } = mailer({ failFirst: 2 });
    const runId = newRun();
    const ledger = new AiToolLedger(effectd, { runId });
    const tools = ledger.tools({ send });
    const { model, prompts } = scripted([[['send', 'c1', { to: 'ann' }], ['send', 'c2', { to: 'bob' }]], 'Mailed them.']);
    const first = await run({ model, tools, messages: ASK, ledger });
    assert.equal(prompts.length, 1, 'the model was asked again after an unknown outcome');
    assert.ok(ledger.interruption instanceof LedgerInterruption);
    assert.deepEqual(ledger.interruption.calls.map((c) => [c.callId, c.state]).sort(), [['c1', 'UNKNOWN'], ['c2', 'UNKNOWN']]);
    let messages = [...ASK, ...ledger.responseMessages(first)];
    assert.ok(!JSON.stringify(messages).includes('dropped'), 'the model would read the unknown outcome as an error');

    // Resumed before anyone reconciled: refused, nothing runs.
    await assert.rejects(ledger.resume(messages), (e) => e instanceof LedgerInterruption && e.cause instanceof ReconciliationNeeded);
    assert.deepEqual(sent.sort(), ['ann', 'bob']);

    // The operator finds Ann's mail sent and Bob's not (its process is gone).
    const c1 = await effectd.getToolCall({ runId, callId: 'c1' });
    await effectd.reconcile({ runId, callId: 'c1', expectedRevision: c1.revision, operator: 'op', reason: 'found it', evidence: 'outbox', result: 'sent to ann (outbox #1)' });
    const c2 = await effectd.getToolCall({ runId, callId: 'c2' });
    await effectd.reconcile({
      runId, callId: 'c2', expectedRevision: c2.revision, operator: 'op', reason: 'not sent', evidence: 'outbox',
      notExecuted: true, confirmedDeadAttempt: c2.attempt,
    });
    messages = await ledger.resume(messages);
    const done = await run({ model, tools, messages, ledger });
    assert.equal(done.text, 'Mailed them.');
    const read = resultsRead(prompts);
    assert.deepEqual(read.c1, { type: 'text', value: 'sent to ann (outbox #1)' });
    assert.match(read.c2.value, /^sent to bob/);
    assert.deepEqual(sent.sort(), ['ann', 'bob', 'bob'], 'Bob: the lost attempt, then the one run after reconciliation');
  });

  const POLICY = ToolPolicy.fromToml('[tools.send]\neffect = "side-effect"\nrequire_approval = true\n');

  /** A run that stops at the SDK's approval request of `to`; returns it with the transcript. */
  async function awaitingApproval(tools, ledger, to = 'ann') {
    const { model, prompts } = scripted([[['send', 'c1', { to }]], 'Mailed Ann.']);
    const first = await run({ model, tools, messages: ASK, ledger });
    const request = first.content.find((p) => p.type === 'tool-approval-request');
    assert.ok(request, 'no approval request');
    return { model, prompts, request, messages: [...ASK, ...(ledger ? ledger.responseMessages(first) : first.response.messages)] };
  }

  for (const wrapped of [true, false]) {
    test(`an approval, then the approved step run again after a crash: ${wrapped ? 'approved in effectd, sent once' : 'CONTROL, approved in the SDK only: sent twice'}`, async () => {
      const { send, sent } = mailer();
      const runId = newRun();
      const ledger = new AiToolLedger(effectd, { runId, policy: POLICY });
      const tools = wrapped ? ledger.tools({ send }) : { send: { ...send, needsApproval: true } };
      const { model, request, messages } = await awaitingApproval(tools, wrapped ? ledger : null);
      assert.deepEqual(sent, []);
      if (wrapped) assert.equal((await effectd.getToolCall({ runId, callId: 'c1' })).state, 'AWAITING_APPROVAL');
      const answer = wrapped
        ? await ledger.approve(request, { approver: 'ann' })
        : { type: 'tool-approval-response', approvalId: request.approvalId, approved: true };
      const approved = [...messages, { role: 'tool', content: [answer] }];
      // The process dies before it saves the run's result; another runs from the approval again.
      for (const attempt of [1, 2]) {
        const next = wrapped ? new AiToolLedger(effectd, { runId, policy: POLICY }) : null;
        const nextTools = wrapped ? next.tools({ send }) : tools;
        const resumed = wrapped ? await next.resume(approved) : approved;
        const again = await run({ model, tools: nextTools, messages: resumed, ledger: next });
        assert.equal(again.text, 'Mailed Ann.', `attempt ${attempt}`);
      }
      assert.deepEqual(sent, wrapped ? ['ann'] : ['ann', 'ann']);
    });
  }

  for (const wrapped of [true, false]) {
    test(`an approval given only in the SDK: ${wrapped ? 'authorizes nothing, the run stops' : 'CONTROL, unwrapped: the tool runs'}`, async () => {
      const { send, sent } = mailer();
      const ledger = new AiToolLedger(effectd, { runId: newRun(), policy: POLICY });
      const tools = wrapped ? ledger.tools({ send }) : { send: { ...send, needsApproval: true } };
      const { model, prompts, request, messages } = await awaitingApproval(tools, wrapped ? ledger : null);
      const own = { type: 'tool-approval-response', approvalId: request.approvalId, approved: true };
      const answered = [...messages, { role: 'tool', content: [own] }];
      if (wrapped) {
        await assert.rejects(ledger.resume(answered), (e) => e instanceof LedgerInterruption && e.cause instanceof ApprovalPending);
        assert.deepEqual(ledger.interruption.calls.map((c) => [c.callId, c.state]), [['c1', 'AWAITING_APPROVAL']]);
        assert.equal(prompts.length, 1);
        // Straight into generateText, the SDK runs the approved call itself: the ledger refuses it.
        await run({ model, tools, messages: answered, ledger });
        assert.ok(ledger.interruption.cause instanceof ApprovalPending);
        assert.deepEqual(sent, []);
        assert.equal((await effectd.getToolCall({ runId: ledger.runId, callId: 'c1' })).state, 'AWAITING_APPROVAL');
      } else {
        await run({ model, tools, messages: answered });
        assert.deepEqual(sent, ['ann']);
      }
    });
  }

  test('an approval request showing other arguments than effectd recorded is refused; nothing is decided', async () => {
    const { send, sent } = mailer();
    const ledger = new AiToolLedger(effectd, { runId: newRun(), policy: POLICY });
    const { request } = await awaitingApproval(ledger.tools({ send }), ledger);
    const edited = { ...request, toolCall: { ...request.toolCall, input: { to: 'mallory' } } };
    await assert.rejects(ledger.approve(edited, { approver: 'ann' }), ApprovalMismatch);
    assert.equal((await effectd.getToolCall({ runId: ledger.runId, callId: 'c1' })).state, 'AWAITING_APPROVAL');
    assert.deepEqual(sent, []);
  });

  for (const wrapped of [true, false]) {
    test(`approved, then the call's arguments edited in the transcript: ${wrapped ? 'refused (INPUT_MISMATCH), nothing sent' : 'CONTROL, unwrapped: the edited call runs'}`, async () => {
      const { send, sent } = mailer();
      const ledger = new AiToolLedger(effectd, { runId: newRun(), policy: POLICY });
      const tools = wrapped ? ledger.tools({ send }) : { send: { ...send, needsApproval: true } };
      const { model, request, messages } = await awaitingApproval(tools, wrapped ? ledger : null);
      const answer = wrapped
        ? await ledger.approve(request, { approver: 'ann' })
        : { type: 'tool-approval-response', approvalId: request.approvalId, approved: true };
      const edited = messages.map((m) =>
        m.role !== 'assistant'
          ? m
          : { ...m, content: m.content.map((p) => (p.type === 'tool-call' ? { ...p, input: { to: 'mallory' } } : p)) },
      );
      await run({ model, tools, messages: [...edited, { role: 'tool', content: [answer] }], ledger: wrapped ? ledger : null });
      if (wrapped) {
        assert.deepEqual(sent, []);
        assert.ok(ledger.interruption.cause instanceof errors.INPUT_MISMATCH, String(ledger.interruption.cause));
      } else {
        assert.deepEqual(sent, ['mallory']);
      }
    });
  }
});

test('@effectd/client/ai and /policy export exactly these, and load neither ai nor the TOML parser', async () => {
  const { spawnSync } = await import('node:child_process');
  const probe = [
    "const ai = require('@effectd/client/ai');",
    "const policy = require('@effectd/client/policy');",
    "const loaded = Object.keys(require.cache).filter((k) => /node_modules[\\\\/](ai|smol-toml)[\\\\/]/.test(k));",
    'console.log(JSON.stringify({ ai: Object.keys(ai).sort(), policy: Object.keys(policy).sort(), loaded }));',
  ].join('\n');
  const done = spawnSync(process.execPath, ['-e', probe], { cwd: new URL('..', import.meta.url), encoding: 'utf8' });
  assert.equal(done.status, 0, done.stderr);
  assert.deepEqual(JSON.parse(done.stdout), {
    ai: ['AiToolLedger', 'ApprovalMismatch', 'LedgerInterruption'],
    policy: ['EFFECT_NAMES', 'PolicyError', 'RULE_KEYS', 'ToolPolicy', 'checkKeys', 'checkTable', 'loadToml', 'parseFlag', 'parseRule'],
    loaded: [],
  });
});
