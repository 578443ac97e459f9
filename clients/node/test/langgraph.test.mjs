// @effectd/client/langgraph: LangGraph.js ToolNode calls through the ledger, driven by a real
// StateGraph (checkpointed, durability 'sync') and a scripted chat model (a BaseChatModel whose n-th
// answer is the script's n-th turn: no network). Each property has its negative control: the same
// graph with LangGraph's own ToolNode, caught running a call twice or running what effectd never
// approved.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Command, END, MemorySaver, MessagesAnnotation, START, StateGraph } from '@langchain/langgraph';
import { ToolNode, toolsCondition } from '@langchain/langgraph/prebuilt';
import { BaseChatModel } from '@langchain/core/language_models/chat_models';
import { AIMessage, HumanMessage, ToolMessage } from '@langchain/core/messages';
import { tool } from '@langchain/core/tools';
import { z } from 'zod';
import { Client, OutcomeUnknown } from '../src/index.js';
import { LedgeredToolCalls, ApprovalMismatch, approve, reject, retry, TOOL_ERROR } from '../src/langgraph.js';
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

/** The n-th answer for the n-th model turn of the conversation; then every tool result it read. */
class ScriptedChatModel extends BaseChatModel {
  constructor(script) {
    super({});
    this.script = script;
  }

  _llmType() {
    return 'scripted';
  }

  async _generate(messages) {
    const turn = messages.filter((m) => AIMessage.isInstance(m)).length;
    const message = turn < this.script.length
      ? new AIMessage({
        content: '',
        tool_calls: this.script[turn].map(([id, to]) => ({ name: 'send', args: { to }, id, type: 'tool_call' })),
      })
      : new AIMessage(`read: ${messages.filter((m) => ToolMessage.isInstance(m)).map((m) => m.content).join(' | ')}`);
    return { generations: [{ message, text: String(message.content) }] };
  }
}

/** The side effects, kept outside the framework and the ledger: sends by recipient. */
function mailer({ unknown = [], failing = [] } = {}) {
  const sent = [];
  const send = tool(
    async ({ to }) => {
      sent.push(to);
      if (failing.includes(to)) throw new Error(`no mailbox ${to}`);
      if (unknown.includes(to) && sent.filter((s) => s === to).length === 1) throw new OutcomeUnknown(`the connection dropped sending to ${to}`);
      return `sent to ${to}`;
    },
    { name: 'send', description: 'Sends an e-mail.', schema: z.object({ to: z.string() }) },
  );
  return { send, sent };
}

function graphOf(model, node, saver) {
  const callModel = async (state) => ({ messages: [await model.invoke(state.messages)] });
  return new StateGraph(MessagesAnnotation)
    .addNode('model', callModel)
    .addNode('tools', node)
    .addEdge(START, 'model')
    .addConditionalEdges('model', toolsCondition, ['tools', END])
    .addEdge('tools', 'model')
    .compile({ checkpointer: saver });
}

const newRun = () => `lg-run-${process.pid}-${(runs += 1)}`;
const POLICY = ToolPolicy.fromToml('[tools.send]\neffect = "side-effect"\n');
const APPROVAL = ToolPolicy.fromToml('[tools.send]\neffect = "side-effect"\nrequire_approval = true\n');

/** An agent: its graph on a checkpointer that `restart()` forgets (a retried job starts over). */
function agent(script, { wrapped = true, policy = POLICY, tools = mailer() } = {}) {
  const ledger = new LedgeredToolCalls(effectd, { policy, leaseMs: 1000, inProgressWaitMs: 5000 });
  const node = wrapped ? ledger.toolNode([tools.send]) : new ToolNode([tools.send]);
  const runId = newRun();
  const config = { configurable: { thread_id: runId }, durability: 'sync' };
  const self = {
    runId,
    sent: tools.sent,
    graph: graphOf(new ScriptedChatModel(script), node, new MemorySaver()),
    run: (input = { messages: [new HumanMessage('mail them')] }) => self.graph.invoke(input, config),
    resume: (value) => self.graph.invoke(new Command({ resume: value }), config),
    restart: () => {
      self.graph = graphOf(new ScriptedChatModel(script), node, new MemorySaver());
    },
  };
  return self;
}

const last = (result) => String(result.messages.at(-1).content);
const interrupts = (result) => (result.__interrupt__ ?? []).map((i) => i.value);

describe('LangGraph.js through the ledger', () => {
  test('a single call runs once; the graph run again from its start gets the stored result', async () => {
    const a = agent([[['c1', 'ann']]]);
    assert.equal(last(await a.run()), 'read: sent to ann');
    a.restart();
    assert.equal(last(await a.run()), 'read: sent to ann');
    assert.deepEqual(a.sent, ['ann']);
    const call = await effectd.getToolCall({ runId: a.runId, callId: 'c1' });
    assert.equal(call.state, 'COMMITTED');
    assert.equal(call.result.value.content, 'sent to ann');
  });

  test('negative control: the unwrapped ToolNode sends again when the graph starts over', async () => {
    const a = agent([[['c1', 'ann']]], { wrapped: false });
    await a.run();
    a.restart();
    await a.run();
    assert.deepEqual(a.sent, ['ann', 'ann']);
  });

  test('three parallel calls each run once, run again from the start', async () => {
    const a = agent([[['c1', 'ann'], ['c2', 'bob'], ['c3', 'cy']]]);
    assert.equal(last(await a.run()), 'read: sent to ann | sent to bob | sent to cy');
    a.restart();
    assert.equal(last(await a.run()), 'read: sent to ann | sent to bob | sent to cy');
    assert.deepEqual([...a.sent].sort(), ['ann', 'bob', 'cy']);
  });

  test('a definite failure is committed: the model reads it, a repeat reads it without running', async () => {
    const a = agent([[['c1', 'nobody']]], { tools: mailer({ failing: ['nobody'] }) });
    const first = last(await a.run());
    assert.match(first, /no mailbox nobody/);
    a.restart();
    assert.equal(last(await a.run()), first);
    assert.deepEqual(a.sent, ['nobody']);
    const call = await effectd.getToolCall({ runId: a.runId, callId: 'c1' });
    assert.equal(call.result.errorCode, TOOL_ERROR);
  });

  test('unknown outcomes: one interrupt names every unsettled sibling; never replayed; reconciled results read', async () => {
    const a = agent([[['c1', 'ann'], ['c2', 'bob'], ['c3', 'cy']]], { tools: mailer({ unknown: ['ann', 'bob'] }) });
    const first = await a.run();
    const [value] = interrupts(first);
    assert.equal(value.effectd, 'reconcile');
    assert.deepEqual(value.calls.map((c) => [c.callId, c.effectd]), [['c1', 'reconcile'], ['c2', 'reconcile']]);
    // Resumed unsettled: asked again, nothing sent again.
    const again = await a.resume('look again');
    assert.deepEqual(interrupts(again)[0].calls.map((c) => c.callId), ['c1', 'c2']);
    assert.deepEqual([...a.sent].sort(), ['ann', 'bob', 'cy']);
    const c1 = await effectd.getToolCall({ runId: a.runId, callId: 'c1' });
    await effectd.reconcile({
      runId: a.runId, callId: 'c1', expectedRevision: c1.revision, operator: 'olga', reason: 'found it',
      evidence: 'outbox', result: 'found ann',
    });
    const c2 = await effectd.getToolCall({ runId: a.runId, callId: 'c2' });
    await effectd.reconcile({
      runId: a.runId, callId: 'c2', expectedRevision: c2.revision, operator: 'olga', reason: 'not sent',
      evidence: 'outbox', notExecuted: true, confirmedDeadAttempt: c2.attempt,
    });
    const done = await a.resume('reconciled');
    assert.equal(last(done), 'read: found ann | sent to bob | sent to cy');
    assert.deepEqual([...a.sent].sort(), ['ann', 'bob', 'bob', 'cy']); // bob: never went out, then once
  });

  test('approval: asked in effectd; a framework-only accept or edited arguments authorize nothing', async () => {
    const a = agent([[['c1', 'ann']]], { policy: APPROVAL });
    const [value] = interrupts(await a.run());
    assert.equal(value.effectd, 'approval');
    assert.deepEqual(value.arguments, { to: 'ann' });
    // LangGraph's human-in-the-loop "accept": not an approval of effectd.
    const accepted = interrupts(await a.resume({ type: 'accept', args: null }));
    assert.equal(accepted[0].effectd, 'approval');
    assert.deepEqual(a.sent, []);
    // Approved with other arguments than shown: refused, asked again.
    const edited = approve({ ...value, arguments: { to: 'mallory' } }, { approver: 'ann' });
    const refused = interrupts(await a.resume(edited));
    assert.match(refused[0].refused, /other arguments/);
    assert.deepEqual(a.sent, []);
    assert.equal((await effectd.getToolCall({ runId: a.runId, callId: 'c1' })).state, 'AWAITING_APPROVAL');
    assert.throws(() => approve({ ...value, effectd: 'reconcile' }, { approver: 'ann' }), ApprovalMismatch);
    // Approved as shown: runs once; the graph started over gets the stored result.
    assert.equal(last(await a.resume(approve(refused[0], { approver: 'ann', reason: 'ok' }))), 'read: sent to ann');
    a.restart();
    assert.equal(last(await a.run()), 'read: sent to ann');
    assert.deepEqual(a.sent, ['ann']);
  });

  test('negative control: an approval only in LangGraph (interruptBefore) runs the unwrapped tool', async () => {
    const tools = mailer();
    const callModel = async (state) => ({ messages: [await new ScriptedChatModel([[['c1', 'ann']]]).invoke(state.messages)] });
    const graph = new StateGraph(MessagesAnnotation)
      .addNode('model', callModel)
      .addNode('tools', new ToolNode([tools.send]))
      .addEdge(START, 'model')
      .addConditionalEdges('model', toolsCondition, ['tools', END])
      .addEdge('tools', 'model')
      .compile({ checkpointer: new MemorySaver(), interruptBefore: ['tools'] });
    const config = { configurable: { thread_id: newRun() } };
    await graph.invoke({ messages: [new HumanMessage('mail ann')] }, config);
    assert.deepEqual(tools.sent, []);
    await graph.invoke(null, config); // "approved" in the framework alone
    assert.deepEqual(tools.sent, ['ann']);
  });

  test('approval decided in effectd, then resumed; a rejection is read by the model', async () => {
    const a = agent([[['c1', 'ann'], ['c2', 'bob']]], { policy: APPROVAL });
    const [value] = interrupts(await a.run());
    assert.deepEqual(value.calls.map((c) => c.callId), ['c1', 'c2']);
    const c1 = await effectd.getToolCall({ runId: a.runId, callId: 'c1' });
    await effectd.decideApproval({
      runId: a.runId, callId: 'c1', approve: true, approver: 'ann', reason: 'ok',
      expectedRevision: c1.revision, inputFingerprint: c1.inputFingerprint,
    });
    const rest = interrupts(await a.resume('decided'));
    assert.deepEqual(rest[0].calls.map((c) => c.callId), ['c2']);
    const done = await a.resume([reject(rest[0], { approver: 'ann', reason: 'not bob' })]);
    assert.match(last(done), /^read: sent to ann \| the tool was not run: .*not bob/);
    assert.deepEqual(a.sent, ['ann']);
  });

  test('a retry interrupt for a READ of unknown outcome runs it again only when answered with retry()', async () => {
    const tools = mailer({ unknown: ['ann'] });
    const policy = ToolPolicy.fromToml('[tools.send]\neffect = "read"\n');
    const a = agent([[['c1', 'ann']]], { policy, tools });
    const [value] = interrupts(await a.run());
    assert.equal(value.effectd, 'retry');
    assert.equal(interrupts(await a.resume('look'))[0].effectd, 'retry');
    assert.deepEqual(tools.sent, ['ann']);
    // Granted: it runs again (and answers this time).
    assert.equal(last(await a.resume(retry(value))), 'read: sent to ann');
    assert.deepEqual(tools.sent, ['ann', 'ann']);
  });

  test('a graph run without durability "sync" is refused before any tool runs', async () => {
    const a = agent([[['c1', 'ann']]]);
    await assert.rejects(
      a.graph.invoke({ messages: [new HumanMessage('x')] }, { configurable: { thread_id: a.runId }, durability: 'async' }),
      /durability/,
    );
    assert.deepEqual(a.sent, []);
  });
});
