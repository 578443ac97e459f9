// The MCP agent: a host whose scripted model decides the calls, an MCP `Client` of
// @modelcontextprotocol/sdk connected over the SDK's in-memory transport to an `McpServer` with
// the tool `book` in the agent's own process (so that a kill point in the tool kills the agent).
// The adapter is `@effectd/client/mcp`'s LedgeredMcpClient around that client; the control the
// bare `Client.callTool`. The calls of one model response are sent together, and every call's
// verdict is kept: a pause names them all.
//
// MCP has no agent loop of its own: the host's transcript (each model response and each call's
// result) is saved in the work directory after every step, as a host's conversation store would,
// and a run resumes from it, sending the calls still without a result again under their call ids.
// A pause is what `callTool` throws for a call (ApprovalPending, ReconciliationNeeded); a call
// another attempt holds (CallInProgress: a killed process's lease still runs) is sent again once
// that lease is out. A finished step runs again from the transcript cut after the model response
// that made its calls. MCP has no approval of its own (a host's consent is outside the protocol):
// the only approval is effectd's; a human's edit of the shown arguments is the host sending the
// call again with the edited arguments under its call id.
import fs from 'node:fs';
import path from 'node:path';
import { beforeTurn, requireNode } from './common.mjs';
import { book, finalText, modelTurn } from './world.mjs';

const { Client: McpClient } = requireNode('@modelcontextprotocol/sdk/client/index.js');
const { McpServer } = requireNode('@modelcontextprotocol/sdk/server/mcp.js');
const { InMemoryTransport } = requireNode('@modelcontextprotocol/sdk/inMemory.js');
const { z } = requireNode('zod');
const { ApprovalPending, CallInProgress, ReconciliationNeeded, errors } = requireNode('./src/index.js');
const { LedgeredMcpClient, mcpPolicyFromToml } = requireNode('./src/mcp.js');

const SERVER = 'booking';
const POLICY = `[servers.${SERVER}.tools.book]\neffect = "side-effect"\n`;
const APPROVAL = `${POLICY}require_approval = true\n`;
// Host steps of one run at most, and the looks at a call another attempt holds.
const MAX_STEPS = 20;
const IN_PROGRESS_LOOKS = 300;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The MCP server, in this process: the tool `book` is the world's. */
function serverOf(spec) {
  const server = new McpServer({ name: SERVER, version: '1.0.0' });
  server.registerTool(
    'book',
    { description: 'Books an item (the side effect).', inputSchema: { item: z.string() } },
    async ({ item }) => ({ content: [{ type: 'text', text: await book(spec.workdir, item) }] }),
  );
  return server;
}

async function connected(spec) {
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  const server = serverOf(spec);
  await server.connect(serverSide);
  const mcp = new McpClient({ name: 'host', version: '1.0.0' });
  await mcp.connect(clientSide);
  return { mcp, server };
}

const textOf = (result) => result.content.map((c) => String(c.text ?? '')).join(' ');

/** The host's conversation: model responses (calls, or a final text) and each call's result. */
class Transcript {
  constructor(workdir) {
    this.file = path.join(workdir, 'transcript.json');
    const saved = fs.existsSync(this.file) ? JSON.parse(fs.readFileSync(this.file, 'utf8')) : {};
    this.responses = saved.responses ?? [];
    this.results = saved.results ?? {};
  }

  save() {
    const tmp = `${this.file}.tmp`;
    const fd = fs.openSync(tmp, 'w');
    try {
      fs.writeSync(fd, JSON.stringify({ responses: this.responses, results: this.results }));
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, this.file);
  }

  /** The last response's calls without a result: [callId, item]. */
  pending() {
    const last = this.responses.at(-1);
    return (last?.calls ?? []).filter(([callId]) => !(callId in this.results));
  }
}

/** The scripted model answers the transcript: its next turn's calls, or the final text. */
async function modelTurnOf(spec, t) {
  const turn = t.responses.length;
  await beforeTurn(spec, turn);
  modelTurn(spec.workdir, turn, { answered: false });
  let answer;
  if (turn < spec.script.length) {
    answer = { calls: spec.script[turn] };
  } else {
    const order = spec.script.flat().map(([callId]) => callId);
    answer = { text: finalText(order.filter((c) => c in t.results).map((c) => t.results[c])) };
  }
  modelTurn(spec.workdir, turn, { answered: true });
  t.responses.push(answer);
  t.save();
}

const KINDS = [
  [ReconciliationNeeded, 'reconcile'],
  [ApprovalPending, 'approval'],
  [CallInProgress, 'other'],
];

/** The run, from its saved transcript, until a pause or the model's final text. */
async function drive(spec, t, call) {
  let looks = 0;
  for (let step = 0; step < MAX_STEPS; step += 1) {
    const last = t.responses.at(-1);
    if (last && 'text' in last) return { paused: [], final: last.text };
    const pending = t.pending();
    if (pending.length) {
      const outs = await Promise.allSettled(pending.map(([callId, item]) => call(callId, item)));
      const paused = [];
      outs.forEach((out, n) => {
        const [callId, item] = pending[n];
        if (out.status === 'fulfilled') {
          t.results[callId] = textOf(out.value);
          return;
        }
        const kind = KINDS.find(([type]) => out.reason instanceof type);
        if (!kind) throw out.reason;
        paused.push({ call_id: callId, kind: kind[1], arguments: { item }, raw: null });
      });
      t.save();
      if (paused.some((p) => p.kind === 'other') && (looks += 1) < IN_PROGRESS_LOOKS) {
        // Another attempt holds a call (a process killed a moment ago): wait for its lease.
        await sleep(200);
        step -= 1;
        continue;
      }
      if (paused.length) return { paused, final: '' };
    }
    await modelTurnOf(spec, t);
  }
  throw new Error(`the run did not end in ${MAX_STEPS} steps`);
}

export default async function agent(spec, effectd) {
  const t = new Transcript(spec.workdir);
  if (spec.command === 'replay') {
    // The finished run's first tool step again: the transcript cut after the response that made it.
    t.responses = t.responses.slice(0, 1);
    t.results = {};
    t.save();
  }
  const { mcp, server } = await connected(spec);
  try {
    const tools = new LedgeredMcpClient(mcp, effectd, {
      runId: spec.run_id,
      server: SERVER,
      policy: mcpPolicyFromToml(spec.approval ? APPROVAL : POLICY),
      leaseMs: 1000,
    });
    if (spec.command === 'answer' && spec.answer === 'edited') {
      // The call sent again under its id with the arguments a human edited: refused before the
      // server is called (the run then asks again); had it run, the run would go on from its result.
      const [[callId]] = t.pending();
      try {
        t.results[callId] = textOf(await tools.callTool({ name: 'book', arguments: { item: 'edited' }, callId }));
        t.save();
      } catch (error) {
        if (!(error instanceof errors.INPUT_MISMATCH)) throw error;
      }
    }
    const call = (callId, item) =>
      spec.wrapped
        ? tools.callTool({ name: 'book', arguments: { item }, callId })
        : mcp.callTool({ name: 'book', arguments: { item } });
    return await drive(spec, t, call);
  } finally {
    await mcp.close();
    await server.close();
  }
}
