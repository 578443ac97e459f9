// The LangGraph.js agent: a StateGraph of a scripted chat model (a BaseChatModel: its n-th answer is
// the script's n-th turn) and a ToolNode, checkpointed in a file of the work directory (durability
// 'sync'); the adapter is `LedgeredToolCalls.toolNode`, the control LangGraph's own ToolNode. A pause
// is the graph's `__interrupt__`; an answer is `Command({ resume })`; a finished step is run again
// by forking the thread from the checkpoint before its tools node (LangGraph's time travel).
import fs from 'node:fs';
import path from 'node:path';
import { beforeTurn, requireNode } from './common.mjs';
import { book, finalText, modelTurn } from './world.mjs';

const { Command, END, MemorySaver, MessagesAnnotation, START, StateGraph } = requireNode('@langchain/langgraph');
const { ToolNode, toolsCondition } = requireNode('@langchain/langgraph/prebuilt');
const { BaseChatModel } = requireNode('@langchain/core/language_models/chat_models');
const { AIMessage, HumanMessage, ToolMessage } = requireNode('@langchain/core/messages');
const { tool } = requireNode('@langchain/core/tools');
const { z } = requireNode('zod');
const { LedgeredToolCalls, approve } = requireNode('./src/langgraph.js');
const { ToolPolicy } = requireNode('./src/policy.js');

const POLICY = '[tools.book]\neffect = "side-effect"\n';
const APPROVAL = `${POLICY}require_approval = true\n`;

/** LangGraph's MemorySaver, kept in a file after each write (fsynced, renamed into place). */
class FileSaver extends MemorySaver {
  constructor(file) {
    super();
    this.file = file;
    if (fs.existsSync(file)) {
      const { storage, writes } = JSON.parse(fs.readFileSync(file, 'utf8'), (_, v) => (v?.$b64 !== undefined ? new Uint8Array(Buffer.from(v.$b64, 'base64')) : v));
      Object.assign(this.storage, storage);
      Object.assign(this.writes, writes);
    }
  }

  save() {
    const text = JSON.stringify({ storage: this.storage, writes: this.writes }, (_, v) => (v instanceof Uint8Array ? { $b64: Buffer.from(v).toString('base64') } : v));
    const tmp = `${this.file}.tmp`;
    const fd = fs.openSync(tmp, 'w');
    try {
      fs.writeSync(fd, text);
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, this.file);
  }

  async put(...args) {
    const out = await super.put(...args);
    this.save();
    return out;
  }

  async putWrites(...args) {
    const out = await super.putWrites(...args);
    this.save();
    return out;
  }
}

class ScriptedChatModel extends BaseChatModel {
  constructor(spec) {
    super({});
    this.spec = spec;
  }

  _llmType() {
    return 'scripted';
  }

  async _generate(messages) {
    const { spec } = this;
    const turn = messages.filter((m) => AIMessage.isInstance(m)).length;
    await beforeTurn(spec, turn);
    modelTurn(spec.workdir, turn, { answered: false });
    const message = turn < spec.script.length
      ? new AIMessage({
        content: '',
        tool_calls: spec.script[turn].map(([id, item]) => ({ name: 'book', args: { item }, id, type: 'tool_call' })),
      })
      : new AIMessage(finalText(messages.filter((m) => ToolMessage.isInstance(m)).map((m) => String(m.content))));
    modelTurn(spec.workdir, turn, { answered: true });
    return { generations: [{ message, text: String(message.content) }] };
  }
}

function graphOf(spec, effectd, saver) {
  const bookTool = tool(async ({ item }) => book(spec.workdir, item), {
    name: 'book',
    description: 'Books an item (the side effect).',
    schema: z.object({ item: z.string() }),
  });
  const node = spec.wrapped
    ? new LedgeredToolCalls(effectd, {
      policy: ToolPolicy.fromToml(spec.approval ? APPROVAL : POLICY),
      leaseMs: 1000,
    }).toolNode([bookTool])
    : new ToolNode([bookTool]);
  const model = new ScriptedChatModel(spec);
  return new StateGraph(MessagesAnnotation)
    .addNode('model', async (state) => ({ messages: [await model.invoke(state.messages)] }))
    .addNode('tools', node)
    .addEdge(START, 'model')
    .addConditionalEdges('model', toolsCondition, ['tools', END])
    .addEdge('tools', 'model')
    .compile({ checkpointer: saver });
}

function outcomeOf(result) {
  const paused = [];
  for (const { value } of result.__interrupt__ ?? []) {
    for (const call of value?.calls ?? [value]) {
      const kind = { approval: 'approval', reconcile: 'reconcile' }[call?.effectd] ?? 'other';
      paused.push({ call_id: call?.callId ?? '', kind, arguments: call?.arguments ?? {}, raw: call });
    }
  }
  const last = result.messages?.at(-1);
  return { paused, final: paused.length || !last ? '' : String(last.content) };
}

function resumeValue(answer, raw) {
  if (answer === 'decided in effectd') return 'decided';
  // LangGraph's human-in-the-loop convention: an "accept" response.
  if (answer === 'framework only') return { type: 'accept', args: null };
  return approve({ ...raw, arguments: { item: 'edited' } }, { approver: 'ann' });
}

export default async function agent(spec, effectd) {
  const saver = new FileSaver(path.join(spec.workdir, 'checkpoints.json'));
  const graph = graphOf(spec, effectd, saver);
  let config = { configurable: { thread_id: spec.run_id } };
  let input = null;
  if (spec.command === 'replay') {
    const history = [];
    for await (const state of graph.getStateHistory(config)) history.push(state);
    const before = history.filter((h) => h.next.length === 1 && h.next[0] === 'tools').at(-1);
    config = before.config;
  } else if (spec.command === 'answer') {
    input = new Command({ resume: resumeValue(spec.answer, spec.raw) });
  } else if (!(await saver.getTuple(config))) {
    input = { messages: [new HumanMessage('book')] };
  }
  return outcomeOf(await graph.invoke(input, { ...config, durability: 'sync' }));
}
