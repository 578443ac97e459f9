'use strict';
/**
 * `@effectd/client/langgraph`: LangGraph.js tool calls through the ledger.
 *
 * `new LedgeredToolCalls(effectd, { policy }).toolNode(tools)` is a ToolNode
 * (`@langchain/langgraph/prebuilt`) whose every call runs through `safeToolCall`, keyed by the
 * graph run's thread id (the run id, `configurable.thread_id`) and the model's tool call id
 * (idempotency key `run:call`), with the effect the operator's ToolPolicy gives the tool (a
 * SIDE_EFFECT when it says nothing), as the Python `effectd_client.langgraph` does:
 *
 *   committed before (same call id)    -> its stored ToolMessage (or Command); the tool does not
 *     (a resumed graph re-runs the        run
 *     tools node from its start)
 *   the tool returns                   -> committed (LangGraph's own serializer), then handed on
 *   the tool throws a definite error   -> committed as an error result (LANGGRAPH_TOOL_ERROR):
 *                                         the model reads ToolNode's error message, a repeat the
 *                                         same message, the tool not run again
 *   the tool throws an unknown outcome -> recorded UNKNOWN: an interrupt asks an operator to
 *     (OutcomeUnknown, a timeout, a       reconcile it (a READ / IDEMPOTENT_WRITE: to retry it);
 *     lost connection)                    it is never run again by itself
 *   the policy requires approval       -> an interrupt for the approver; `approve(value)` /
 *                                         `reject(value)` as the resume value, recorded in
 *                                         effectd, bound to the arguments effectd recorded
 *   rejected by an approver            -> an error ToolMessage for the model
 *   another attempt holds a live lease -> waits for it (at most `inProgressWaitMs`), then an
 *                                         interrupt
 *
 * The calls of one model message run side by side; once they all settled, one `interrupt()` of
 * the tools node names, in `calls`, every call of the message waiting for a human, so one resume
 * answers them all (a list of answers). A resume value that is no answer of `approve` / `reject` /
 * `retry` (a framework-only "accept", anything else) decides nothing: the node looks again and asks
 * again. An answer that fits no waiting call (another call, arguments other than effectd recorded)
 * is refused: the node asks again, its value's `refused` saying why.
 *
 * The graph must checkpoint the model's message before its tools run (run it with
 * `durability: 'sync'`): a model called again after a crash would name its calls anew.
 * `@langchain/langgraph` is an optional peer dependency, loaded by `toolNode` only.
 */

const { safeToolCall, isOutcomeUnknown, CallRejected, ToolFailed, ApprovalPending, ReconciliationNeeded } = require('./safe');
const { RetryRequired, CallInProgress } = require('./safe');
const { EffectdError, errors } = require('./errors');
const { ToolPolicy } = require('./policy');
const { ApprovalMismatch, shows } = require('./adapter');

/** The error code of a tool whose failure became ToolNode's error ToolMessage: the tool ran. */
const TOOL_ERROR = 'LANGGRAPH_TOOL_ERROR';
/** The key of an interrupt's value that says it comes from effectd (its kind). */
const KIND = 'effectd';
// Interrupts one node run may be resumed from, and the pause between looks at a held call.
const MAX_ROUNDS = 50;
const IN_PROGRESS_POLL_MS = 200;

const MESSAGES = {
  approval:
    'the call waits for an approver: resume with approve(...) or reject(...) of this request (a list of answers ' +
    'for several of `calls`), or after an approver decided it in effectd',
  reconcile:
    'a side effect of unknown outcome: an operator reconciles it in effectd (effectd ctl reconcile RUN CALL ' +
    '--result JSON, or --not-executed); then resume the graph (with any value)',
  retry:
    "the last attempt's outcome is unknown: resume with retry(...) to run this READ or IDEMPOTENT_WRITE tool " +
    'again, after checking it is safe',
  in_progress: 'another attempt holds the call (a live process, or a crashed one whose lease has not run out): resume the graph to wait again',
};

/** The graph run's thread id: the default run id. */
function threadRunId(config) {
  const thread = config?.configurable?.thread_id;
  if (thread === undefined || thread === null || String(thread) === '') {
    throw new TypeError(
      "a ledgered tool call needs the graph run's thread id: compile the graph with a checkpointer and invoke it " +
        "with { configurable: { thread_id: ... } }",
    );
  }
  return String(thread);
}

function langgraph() {
  return {
    graph: require('@langchain/langgraph'),
    prebuilt: require('@langchain/langgraph/prebuilt'),
    messages: require('@langchain/core/messages'),
  };
}

/** A ToolNode's error ToolMessage, carried to the ledger as an error result (the tool ran). */
class ToolErrorMessage extends Error {
  constructor(message, stored) {
    super(String(message.content).slice(0, 1000));
    this.name = 'ToolErrorMessage';
    this.code = TOOL_ERROR;
    this.message_ = message;
    this.errorResult = stored;
  }
}

/** The ledger's JSON of a tool output: whole (LangGraph's serializer), content and status shown. */
async function stored(lg, output) {
  const [type, data] = await new lg.graph.MemorySaver().serde.dumpsTyped(output);
  const value = { type, data: JSON.parse(Buffer.from(data).toString('utf8')) };
  if (lg.messages.ToolMessage.isInstance(output)) return { ...value, content: output.content, status: output.status };
  return { ...value, command: true };
}

/**
 * The tool output a stored result holds; a result an operator recorded when reconciling (any
 * JSON) becomes a ToolMessage with its `content`, or the whole value as JSON text.
 */
async function restored(lg, value, call) {
  if (value && typeof value === 'object' && value.type === 'json' && value.data !== undefined) {
    const out = await new lg.graph.MemorySaver().serde.loadsTyped('json', JSON.stringify(value.data));
    if (lg.messages.ToolMessage.isInstance(out)) return out;
    if (out?.lg_name === 'Command') {
      const { lg_name: _, ...params } = out;
      return new lg.graph.Command(params);
    }
  }
  let content = value && typeof value === 'object' && !Array.isArray(value) ? value.content : value;
  if (typeof content !== 'string' && !Array.isArray(content)) content = JSON.stringify(value);
  return new lg.messages.ToolMessage({ content, name: call.name, tool_call_id: call.id });
}

function errorMessage(lg, call, text) {
  return new lg.messages.ToolMessage({ content: text, name: call.name, tool_call_id: call.id, status: 'error' });
}

/** The value of an interrupt: what waits, and the exact call an answer is about. */
function request(kind, runId, call, record) {
  return {
    [KIND]: kind,
    runId,
    callId: call.id,
    tool: call.name,
    arguments: call.args ?? {},
    effect: record.effect,
    state: record.state,
    inputFingerprint: record.inputFingerprint,
    revision: record.revision,
    message: MESSAGES[kind],
  };
}

function bound(value) {
  if (!value || typeof value !== 'object' || !value[KIND]) throw new ApprovalMismatch('not an interrupt value of effectd');
  const { runId, callId, inputFingerprint } = value;
  return { runId, callId, inputFingerprint, arguments: value.arguments };
}

function answer(value, approve, { approver, reason = '' } = {}) {
  if (value?.[KIND] !== 'approval') throw new ApprovalMismatch('approve() and reject() answer an approval interrupt');
  if (!approver) throw new TypeError('approver: who decides, for the audit log');
  return { ...bound(value), revision: value.revision, approve, approver, reason };
}

/** The resume value that approves the call an approval interrupt shows, bound to its arguments. */
const approve = (value, options) => answer(value, true, options);
/** The resume value that rejects it: the tool never runs, the model reads the rejection. */
const reject = (value, options) => answer(value, false, options);

/** The resume value that runs a READ / IDEMPOTENT_WRITE of unknown outcome again (never a SIDE_EFFECT). */
function retry(value) {
  if (value?.[KIND] !== 'retry') throw new ApprovalMismatch('retry() answers a retry interrupt');
  return { ...bound(value), retry: true };
}

/** The arguments effectd recorded for the call: its kept input, else the model's. */
function recordedArguments(record, call) {
  const kept = record.keptInput?.json;
  if (kept === null || kept === undefined) return call.args ?? {};
  return typeof kept === 'string' ? JSON.parse(kept) : kept;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** LangGraph.js ToolNode calls through the ledger (see the module docs). */
class LedgeredToolCalls {
  /**
   * @param {import('./client').Client} effectd
   * @param {object} [options]
   * @param {object} [options.policy] the operator's ToolPolicy (or its rules by tool name).
   * @param {(config: object) => string} [options.runId] the run id of a graph run (default its thread id).
   * @param {import('./client').Client} [options.approver] the connection that records decisions (default effectd).
   * @param {number} [options.leaseMs] the lease of each attempt (0: the daemon's default).
   * @param {number} [options.timeoutMs] after this a call's outcome is unknown (0: none).
   * @param {number} [options.inProgressWaitMs] how long to wait for another attempt's lease.
   * @param {boolean} [options.requireSyncDurability] refuse graphs run without durability 'sync'.
   */
  constructor(effectd, options = {}) {
    const { policy, runId = threadRunId, approver, leaseMs = 0, timeoutMs = 0 } = options;
    this.effectd = effectd;
    this.approver = approver ?? effectd;
    this.policy = ToolPolicy.of(policy);
    this.runIdOf = runId;
    this.leaseMs = leaseMs;
    this.timeoutMs = timeoutMs;
    this.inProgressWaitMs = options.inProgressWaitMs ?? 120_000;
    this.requireSyncDurability = options.requireSyncDurability ?? true;
  }

  /** A ToolNode of `tools` whose calls go through this ledger (ToolNode's options beside). */
  toolNode(tools, options = {}) {
    const lg = langgraph();
    const ledger = this;
    class LedgeredToolNode extends lg.prebuilt.ToolNode {
      async run(input, config) {
        const outputs = await ledger._settle(lg, this, input, config);
        this._outputs.set(config, outputs);
        try {
          return await super.run(input, config);
        } finally {
          this._outputs.delete(config);
        }
      }

      async runTool(call, config, state) {
        const done = this._outputs.get(config);
        if (done?.has(call.id)) return done.get(call.id);
        throw new Error(`${call.name}: a tool call the ledger did not see (${call.id})`);
      }
    }
    const node = new LedgeredToolNode(tools, { ...options, handleToolErrors: false });
    node._outputs = new WeakMap();
    return node;
  }

  _check(config) {
    if (!this.requireSyncDurability) return;
    const durability = config?.configurable?.__pregel_durability ?? config?.durability ?? 'async';
    if (durability !== 'sync') {
      throw new TypeError(
        `the graph runs with durability '${durability}': run it with durability: 'sync', so that the model's tool ` +
          'calls are checkpointed before they run',
      );
    }
  }

  /** The calls of this node run, each with its output: run, restored, or asked of a human. */
  async _settle(lg, node, input, config) {
    this._check(config);
    const runId = this.runIdOf(config);
    const calls = pendingCalls(lg, input);
    const state = input?.lg_tool_call ? (({ lg_tool_call: _, ...rest }) => rest)(input) : input;
    const outputs = new Map();
    const retries = new Set();
    let refused = '';
    const polls = Math.ceil(this.inProgressWaitMs / IN_PROGRESS_POLL_MS);
    let waitUntil = 0;
    for (let round = 0; round < MAX_ROUNDS + polls + 1; round += 1) {
      const stops = [];
      await Promise.all(
        calls
          .filter((c) => !outputs.has(c.id))
          .map(async (call) => {
            const got = await this._once(lg, node, runId, call, config, state, retries.has(call.id));
            if (got.stop) stops.push({ call, ...got });
            else outputs.set(call.id, got.output);
          }),
      );
      if (!stops.length) return outputs;
      if (stops.some((s) => s.stop === 'in_progress')) {
        waitUntil = waitUntil || Date.now() + this.inProgressWaitMs;
        if (Date.now() < waitUntil) {
          await sleep(IN_PROGRESS_POLL_MS);
          continue;
        }
      }
      waitUntil = 0;
      const order = calls.map((c) => c.id);
      stops.sort((a, b) => order.indexOf(a.call.id) - order.indexOf(b.call.id));
      const shown = stops.map((s) => request(s.stop, runId, s.call, s.record));
      const value = { ...shown[0], calls: shown, ...(refused ? { refused } : {}) };
      const given = lg.graph.interrupt(value);
      refused = await this._take(given, runId, stops, retries);
    }
    throw new Error(`${runId}: the tool calls were still stopped after ${MAX_ROUNDS} answers`);
  }

  /** One call through the ledger: `{ output }`, or `{ stop, record }` for a human. */
  async _once(lg, node, runId, call, config, state, retryGranted) {
    if (!call.id) throw new TypeError(`the call of ${call.name} has no tool call id`);
    const rule = this.policy.decide(call.name);
    const unknownOn = [...(rule.unknownOn ?? []), (e) => lg.graph.isGraphBubbleUp(e)];
    let fresh;
    const request_ = {
      runId,
      callId: call.id,
      tool: call.name,
      input: call.args ?? {},
      effect: rule.effect,
      requireApproval: Boolean(rule.requireApproval),
      retryUnknown: retryGranted || (Boolean(rule.retryUnknown) && rule.effect !== 'SIDE_EFFECT'),
      unknownOn,
      leaseMs: this.leaseMs,
      timeoutMs: rule.timeoutMs ?? this.timeoutMs,
      serialize: (value) => value.stored,
    };
    const tool = async (ctx) => {
      const withCtx = { ...config, configurable: { ...config.configurable, effectd: ctx } };
      let output;
      try {
        output = await lg.prebuilt.ToolNode.prototype.runTool.call(node, call, withCtx, state);
      } catch (error) {
        if (isOutcomeUnknown(error, { unknownOn })) throw error;
        const message = errorMessage(lg, call, `Error: ${error?.message ?? error}\n Please fix your mistakes.`);
        throw new ToolErrorMessage(message, await stored(lg, message));
      }
      if (lg.messages.ToolMessage.isInstance(output) && output.status === 'error') {
        throw new ToolErrorMessage(output, await stored(lg, output));
      }
      fresh = output;
      return { stored: await stored(lg, output) };
    };
    try {
      const value = await safeToolCall(this.effectd, request_, tool);
      return { output: fresh ?? (await restored(lg, value, call)) };
    } catch (error) {
      return this._stopped(lg, runId, call, error);
    }
  }

  async _stopped(lg, runId, call, error) {
    if (error instanceof ToolErrorMessage) return { output: error.message_ };
    if (error instanceof ToolFailed) {
      if (error.errorCode === TOOL_ERROR && error.result?.value != null) return { output: await restored(lg, error.result.value, call) };
      return { output: errorMessage(lg, call, `Error: ${error.errorMessage}`) };
    }
    if (error instanceof CallRejected) {
      const reason = error.result?.errorMessage || 'an approver rejected the call';
      return { output: errorMessage(lg, call, `the tool was not run: ${reason}`) };
    }
    if (error instanceof ApprovalPending) return { stop: 'approval', record: error.call };
    if (error instanceof ReconciliationNeeded) return { stop: 'reconcile', record: error.call };
    if (error instanceof RetryRequired) return { stop: 'retry', record: error.call };
    if (error instanceof CallInProgress) return { stop: 'in_progress', record: error.call };
    if (lg.graph.isGraphBubbleUp(error) || !isOutcomeUnknown(error)) throw error;
    // This attempt's outcome is unknown (recorded UNKNOWN): a human settles it, with its siblings.
    const record = await this.effectd.getToolCall({ runId, callId: call.id });
    return { stop: record.effect === 'SIDE_EFFECT' ? 'reconcile' : 'retry', record };
  }

  /** Records the decisions and grants the retries a resume value gives; what it refused. */
  async _take(given, runId, stops, retries) {
    const refusals = [];
    for (const one of Array.isArray(given) ? given : [given]) {
      if (!one || typeof one !== 'object' || !(typeof one.approve === 'boolean' || one.retry === true)) continue;
      try {
        const stop = target(one, runId, stops);
        if (one.retry === true) {
          retries.add(stop.call.id);
          continue;
        }
        await this.approver.decideApproval({
          runId,
          callId: stop.call.id,
          approve: one.approve,
          approver: String(one.approver || 'langgraph'),
          reason: String(one.reason || 'answered a LangGraph interrupt'),
          expectedRevision: Number(one.revision),
          inputFingerprint: String(one.inputFingerprint),
        });
      } catch (error) {
        if (error instanceof ApprovalMismatch || error instanceof errors.INPUT_MISMATCH) refusals.push(error.message);
        else if (!(error instanceof EffectdError)) throw error;
        // Decided already (before a crash, in effectd), or a newer revision: the next look says.
      }
    }
    return refusals.join('; ');
  }
}

/** The waiting call an answer is about, once it shows that call's arguments as effectd recorded them. */
function target(given, runId, stops) {
  const stop = given.runId === runId ? stops.find((s) => s.call.id === given.callId) : undefined;
  if (!stop) {
    throw new ApprovalMismatch(
      `the answer is about call ${given.callId} of run ${given.runId}, which does not wait for a human in this step of run ${runId}`,
    );
  }
  if (given.inputFingerprint !== stop.record.inputFingerprint) {
    throw new ApprovalMismatch(`the answer for call ${stop.call.id} is about other arguments than the call waiting has`);
  }
  const recorded = { keptInput: { json: JSON.stringify(recordedArguments(stop.record, stop.call)) } };
  if (!shows(recorded, given.arguments)) {
    throw new ApprovalMismatch(
      `the answer for call ${stop.call.id} shows other arguments (${JSON.stringify(given.arguments)}) than effectd ` +
        'recorded: the approver would decide what they did not see',
    );
  }
  return stop;
}

/** The tool calls of this node run: a Send's one call, or the last AI message's calls without a result. */
function pendingCalls(lg, input) {
  if (input?.lg_tool_call) return [input.lg_tool_call];
  const messages = Array.isArray(input) ? input : input?.messages;
  if (!Array.isArray(messages)) return [];
  const answered = new Set(messages.filter((m) => m.getType?.() === 'tool').map((m) => m.tool_call_id));
  for (let i = messages.length - 1; i >= 0; i -= 1) {
    if (lg.messages.AIMessage.isInstance(messages[i])) {
      return (messages[i].tool_calls ?? []).filter((c) => c.id == null || !answered.has(c.id));
    }
  }
  return [];
}

module.exports = { LedgeredToolCalls, ApprovalMismatch, approve, reject, retry, threadRunId, TOOL_ERROR, KIND };
