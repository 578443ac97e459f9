// The OpenAI Agents JS agent: run() with the SDK's ScriptedModel (`@openai/agents/testing`), each
// step a responder whose answer is the script's turn for the function calls the input holds; the
// RunState saved in the work directory at an approval interruption. The adapter is
// `@effectd/client/openai-agents`' AgentLedger (`run`, `tool`, `approve`, `applyDecisions`); the
// control the bare function tool. A pause is an SDK interruption (`result.interruptions`) or a
// LedgerInterruption (the `error` of the SDK's ToolCallError); a run without a saved state starts
// from its input again, the SDK's way of running a finished step again (the model names the same
// calls).
import fs from 'node:fs';
import path from 'node:path';
import { beforeTurn, requireNode } from './common.mjs';
import { book, finalText, modelTurn } from './world.mjs';

const { Agent, RunState, run, setTracingDisabled, tool } = requireNode('@openai/agents');
const { ScriptedModel, assistantMessage, functionCall, modelResponder } = requireNode('@openai/agents/testing');
const { AgentLedger, ApprovalMismatch, interruptionOf } = requireNode('./src/openai-agents.js');
const { CallInProgress } = requireNode('./src/index.js');
const { ToolPolicy } = requireNode('./src/policy.js');

setTracingDisabled(true);
const POLICY = '[tools.book]\neffect = "side-effect"\n';
const APPROVAL = `${POLICY}require_approval = true\n`;
// Model calls of one run at most, and the looks at a call another attempt holds.
const MAX_TURNS = 20;
const IN_PROGRESS_LOOKS = 300;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function modelOf(spec) {
  const respond = async ({ request }) => {
    const items = Array.isArray(request.input) ? request.input : [];
    const made = items.filter((i) => i.type === 'function_call').length;
    let turn = 0;
    for (let n = 0; turn < spec.script.length && n < made; turn += 1) n += spec.script[turn].length;
    await beforeTurn(spec, turn);
    modelTurn(spec.workdir, turn, { answered: false });
    const output = turn < spec.script.length
      ? spec.script[turn].map(([id, item]) => functionCall('book', { item }, { callId: id }))
      : [assistantMessage(finalText(items.filter((i) => i.type === 'function_call_result').map((i) => String(i.output?.text ?? i.output))))];
    modelTurn(spec.workdir, turn, { answered: true });
    return output;
  };
  return new ScriptedModel(Array.from({ length: MAX_TURNS }, () => modelResponder(respond)));
}

function bookTool(spec) {
  return tool({
    name: 'book',
    description: 'Books an item (the side effect).',
    parameters: { type: 'object', properties: { item: { type: 'string' } }, required: ['item'], additionalProperties: false },
    errorFunction: null, // an exception reaches the ledger
    execute: async ({ item }) => book(spec.workdir, item),
  });
}

const itemOf = (spec, callId) => {
  const call = spec.script.flat().find(([id]) => id === callId);
  return call ? { item: call[1] } : {};
};

function pausedOf(spec, interruption) {
  return interruption.calls.map((c) => ({
    call_id: c.callId,
    kind: c.state === 'AWAITING_APPROVAL' ? 'approval' : c.state === 'UNKNOWN' ? 'reconcile' : 'other',
    arguments: itemOf(spec, c.callId),
    raw: null,
  }));
}

const approvalPause = (item) => ({
  call_id: item.rawItem.callId,
  kind: 'approval',
  arguments: JSON.parse(item.rawItem.arguments),
  raw: { callId: item.rawItem.callId, name: item.rawItem.name, arguments: item.rawItem.arguments },
});

export default async function agent(spec, effectd) {
  const stateFile = path.join(spec.workdir, 'state.json');
  const ledger = new AgentLedger(effectd, { policy: ToolPolicy.fromToml(spec.approval ? APPROVAL : POLICY), leaseMs: 1000 });
  const bare = bookTool(spec);
  const sdkAgent = new Agent({ name: 'booker', model: modelOf(spec), tools: [spec.wrapped ? ledger.tool(bare) : bare] });
  return ledger.run(spec.run_id, async () => {
    const saved = async () =>
      spec.command !== 'replay' && fs.existsSync(stateFile)
        ? RunState.fromString(sdkAgent, fs.readFileSync(stateFile, 'utf8'))
        : null;
    let state = await saved();
    if (spec.command === 'answer' && spec.answer === 'framework only') {
      const item = state.getInterruptions().find((i) => i.rawItem.callId === spec.raw.callId);
      state.approve(item); // the SDK's own approval, never recorded in effectd
    } else if (state) {
      if (spec.command === 'answer' && spec.answer === 'edited') {
        // Approved through the adapter with the shown arguments edited.
        const item = state.getInterruptions().find((i) => i.rawItem.callId === spec.raw.callId);
        const edited = { ...item, rawItem: { ...item.rawItem, arguments: JSON.stringify({ item: 'edited' }) } };
        try {
          await ledger.approve(edited, { approver: 'ann' });
        } catch (error) {
          if (!(error instanceof ApprovalMismatch)) throw error;
        }
      }
      // effectd's decisions, applied to the restored state; a call still waiting stays paused.
      const waiting = await ledger.applyDecisions(state);
      if (waiting.length) return { paused: waiting.map(approvalPause), final: '' };
    }
    for (let looks = 0; ; looks += 1) {
      let result;
      try {
        result = await run(sdkAgent, state ?? 'book', { maxTurns: MAX_TURNS });
      } catch (error) {
        const stop = interruptionOf(error);
        if (!stop) throw error;
        // Another attempt holds a call (a process killed a moment ago): wait for its lease.
        if (stop.cause instanceof CallInProgress && looks < IN_PROGRESS_LOOKS) {
          await sleep(200);
          state = await saved();
          if (state) await ledger.applyDecisions(state);
          continue;
        }
        return { paused: pausedOf(spec, stop), final: '' };
      }
      if (result.interruptions?.length) {
        fs.writeFileSync(stateFile, result.state.toString());
        return { paused: result.interruptions.map(approvalPause), final: '' };
      }
      fs.rmSync(stateFile, { force: true }); // the run is finished: its saved state is dropped
      return { paused: [], final: String(result.finalOutput) };
    }
  });
}
