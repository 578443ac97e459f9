// The Vercel AI SDK agent: generateText, one step at a time, with a scripted model (the SDK's
// MockLanguageModelV4: its n-th answer for the n-th assistant turn of the prompt), the transcript
// saved in the work directory after each step (the application's saved messages, so a run begun
// in a killed process resumes in another). The adapter is `@effectd/client/ai`'s AiToolLedger
// (`tools`, `stopWhen`, `responseMessages`, `resume`); the control the bare tool. A pause is an
// SDK `tool-approval-request` or a LedgerInterruption; an approval is answered with the SDK's
// `tool-approval-response`; a finished step is run again by replaying the transcript cut after
// its calls.
import fs from 'node:fs';
import path from 'node:path';
import { beforeTurn, requireNode } from './common.mjs';
import { book, finalText, modelTurn } from './world.mjs';

const { generateText, jsonSchema, stepCountIs, tool } = requireNode('ai');
const { MockLanguageModelV4 } = requireNode('ai/test');
const { AiToolLedger, ApprovalMismatch, LedgerInterruption } = requireNode('./src/ai.js');
const { CallInProgress } = requireNode('./src/index.js');
const { ToolPolicy } = requireNode('./src/policy.js');

const POLICY = '[tools.book]\neffect = "side-effect"\n';
const APPROVAL = `${POLICY}require_approval = true\n`;
const USAGE = { inputTokens: { total: 1 }, outputTokens: { total: 1 } };
// Steps of one run at most, and the looks at a call another attempt holds (a crashed process's).
const MAX_STEPS = 20;
const IN_PROGRESS_LOOKS = 300;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function textOf(output) {
  if (output?.type === 'text' || output?.type === 'error-text') return String(output.value);
  return JSON.stringify(output?.value ?? output);
}

function modelOf(spec) {
  return new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      const turn = prompt.filter((m) => m.role === 'assistant').length;
      await beforeTurn(spec, turn);
      modelTurn(spec.workdir, turn, { answered: false });
      let content;
      let finish;
      if (turn < spec.script.length) {
        content = spec.script[turn].map(([id, item]) => ({
          type: 'tool-call',
          toolCallId: id,
          toolName: 'book',
          input: JSON.stringify({ item }),
        }));
        finish = 'tool-calls';
      } else {
        const seen = prompt
          .filter((m) => m.role === 'tool')
          .flatMap((m) => m.content.filter((p) => p.type === 'tool-result').map((p) => textOf(p.output)));
        content = [{ type: 'text', text: finalText(seen) }];
        finish = 'stop';
      }
      modelTurn(spec.workdir, turn, { answered: true });
      return { content, finishReason: { unified: finish, raw: undefined }, usage: USAGE, warnings: [] };
    },
  });
}

/** The application's saved transcript. */
class Transcript {
  constructor(workdir) {
    this.file = path.join(workdir, 'messages.json');
  }

  load() {
    return fs.existsSync(this.file) ? JSON.parse(fs.readFileSync(this.file, 'utf8')) : null;
  }

  save(messages) {
    const tmp = `${this.file}.tmp`;
    const fd = fs.openSync(tmp, 'w');
    try {
      fs.writeSync(fd, JSON.stringify(messages));
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, this.file);
  }
}

/** The last assistant message's approval requests that no response answers yet. */
function unanswered(messages) {
  let last = messages.length - 1;
  while (last >= 0 && messages[last].role === 'tool') last -= 1;
  const assistant = messages[last];
  if (!assistant || assistant.role !== 'assistant' || !Array.isArray(assistant.content)) return [];
  const answered = new Set(
    messages.slice(last + 1).flatMap((m) => m.content.filter((p) => p.type === 'tool-approval-response').map((p) => p.approvalId)),
  );
  const calls = new Map(assistant.content.filter((p) => p.type === 'tool-call').map((p) => [p.toolCallId, p]));
  return assistant.content
    .filter((p) => p.type === 'tool-approval-request' && !answered.has(p.approvalId))
    .map((p) => ({ ...p, toolCall: calls.get(p.toolCallId) }));
}

const approvalPause = (request) => ({
  call_id: request.toolCall.toolCallId,
  kind: 'approval',
  arguments: request.toolCall.input,
  raw: request,
});

/** The pause of a LedgerInterruption: every call it names, with the arguments the model gave. */
function interruptionPause(interruption, messages) {
  const inputs = new Map(
    messages
      .filter((m) => m.role === 'assistant' && Array.isArray(m.content))
      .flatMap((m) => m.content.filter((p) => p.type === 'tool-call').map((p) => [p.toolCallId, p.input])),
  );
  return interruption.calls.map((c) => ({
    call_id: c.callId,
    kind: c.state === 'AWAITING_APPROVAL' ? 'approval' : c.state === 'UNKNOWN' ? 'reconcile' : 'other',
    arguments: inputs.get(c.callId) ?? {},
    raw: null,
  }));
}

/** The bare tool's way of running a transcript's calls without a result (the control). */
async function bareResume(messages, tools) {
  let last = messages.length - 1;
  while (last >= 0 && messages[last].role === 'tool') last -= 1;
  const assistant = messages[last];
  if (!assistant || assistant.role !== 'assistant' || !Array.isArray(assistant.content)) return messages;
  const answered = new Set(messages.slice(last + 1).flatMap((m) => m.content.map((p) => p.toolCallId)));
  const parts = [];
  for (const p of assistant.content.filter((q) => q.type === 'tool-call' && !answered.has(q.toolCallId))) {
    const value = await tools.book.execute(p.input, { toolCallId: p.toolCallId, messages });
    parts.push({ type: 'tool-result', toolCallId: p.toolCallId, toolName: p.toolName, output: { type: 'text', value } });
  }
  return parts.length ? [...messages, { role: 'tool', content: parts }] : messages;
}

/** The run, from its saved transcript (`messages`), until a pause or the model's final text. */
async function drive(spec, effectd, transcript, messages) {
  const ledger = new AiToolLedger(effectd, {
    runId: spec.run_id,
    policy: ToolPolicy.fromToml(spec.approval ? APPROVAL : POLICY),
    leaseMs: 1000,
  });
  const bare = {
    book: tool({
      description: 'Books an item (the side effect).',
      inputSchema: jsonSchema({ type: 'object', properties: { item: { type: 'string' } }, required: ['item'] }),
      execute: async ({ item }) => book(spec.workdir, item),
    }),
  };
  const tools = spec.wrapped ? ledger.tools(bare) : bare;
  const model = modelOf(spec);
  let looks = 0;
  for (let step = 0; step < MAX_STEPS; step += 1) {
    const waiting = unanswered(messages);
    if (waiting.length) return { paused: waiting.map(approvalPause), final: '' };
    if (spec.wrapped) {
      try {
        messages = await ledger.resume(messages);
      } catch (error) {
        if (!(error instanceof LedgerInterruption)) throw error;
        // Another attempt holds a call (a process killed a moment ago): wait for its lease.
        if (error.cause instanceof CallInProgress && (looks += 1) < IN_PROGRESS_LOOKS) {
          await sleep(200);
          step -= 1;
          continue;
        }
        return { paused: interruptionPause(error, messages), final: '' };
      }
    } else {
      messages = await bareResume(messages, tools);
    }
    transcript.save(messages);
    const stopWhen = spec.wrapped ? [stepCountIs(1), ledger.stopWhen] : stepCountIs(1);
    const result = await generateText({ model, tools, messages, stopWhen });
    messages = [...messages, ...(spec.wrapped ? ledger.responseMessages(result) : result.response.messages)];
    transcript.save(messages);
    if (ledger.interruption) {
      const { interruption } = ledger;
      if (interruption.cause instanceof CallInProgress && (looks += 1) < IN_PROGRESS_LOOKS) {
        await sleep(200);
        continue; // the calls without a result are run by `resume` at the next step
      }
      return { paused: interruptionPause(interruption, messages), final: '' };
    }
    if (result.finishReason === 'stop') return { paused: [], final: result.text };
  }
  throw new Error(`the run did not end in ${MAX_STEPS} steps`);
}

export default async function agent(spec, effectd) {
  const transcript = new Transcript(spec.workdir);
  let messages = transcript.load() ?? [{ role: 'user', content: 'book' }];
  if (spec.command === 'replay') {
    // The finished run's first tool step replayed: the transcript cut after its calls.
    const first = messages.findIndex((m) => m.role === 'assistant' && m.content.some?.((p) => p.type === 'tool-call'));
    messages = messages.slice(0, first + 1);
  } else if (spec.command === 'answer') {
    const request = spec.raw;
    let response = { type: 'tool-approval-response', approvalId: request.approvalId, approved: true };
    if (spec.answer === 'edited') {
      const ledger = new AiToolLedger(effectd, { runId: spec.run_id, policy: ToolPolicy.fromToml(APPROVAL) });
      ledger.tools({ book: { execute: async () => null } });
      try {
        response = await ledger.approve(
          { ...request, toolCall: { ...request.toolCall, input: { item: 'edited' } } },
          { approver: 'ann' },
        );
      } catch (error) {
        if (!(error instanceof ApprovalMismatch)) throw error;
        response = null; // refused: nothing decided, the request still waits
      }
    }
    // 'decided in effectd': the application sends the SDK's approval; 'framework only': the
    // SDK's approval alone, never recorded in effectd.
    if (response) {
      messages = [...messages, { role: 'tool', content: [response] }];
      transcript.save(messages);
    }
  }
  return drive(spec, effectd, transcript, messages);
}
