'use strict';
/**
 * `@effectd/client/ai`: the Vercel AI SDK's tool calls through the ledger.
 *
 * `AiToolLedger.tools(toolset)` returns a copy of an AI SDK `ToolSet` whose `execute` runs each
 * call through `safeToolCall`, keyed by the run id the application gives and the model's
 * `toolCallId` (idempotency key `run:toolCallId`), and whose `needsApproval` asks effectd. The
 * `ai` package is an optional peer dependency: this module never loads it.
 *
 *   committed before (same toolCallId)   -> its stored output; the tool does not run
 *   the tool returns                     -> committed, then handed to the model
 *   the tool throws a definite error     -> committed as an error result; the model reads it, a
 *                                           repeat reads the same error without running the tool
 *   rejected by an approver              -> an error the model reads; the tool never runs
 *   outcome unknown (timeout, lost       -> recorded UNKNOWN; the run stops (`stopWhen`) with
 *     connection), or the ledger stops      `ledger.interruption`, a LedgerInterruption naming
 *     it (RECONCILE, AWAIT_APPROVAL,        every call of the run waiting for a human; the call is
 *     IN_PROGRESS, retry required,          never run again by itself
 *     other arguments for the same id)
 *   the policy or the tool's own          -> `needsApproval` answers true while effectd holds the
 *     needsApproval requires approval        call in AWAITING_APPROVAL: the SDK's approval request;
 *                                           `ledger.approve(request)` decides it in effectd; an
 *                                           approval given only in the SDK runs nothing
 *
 * The model never reads an interrupted call's error: `ledger.responseMessages(result)` drops
 * those results, and `ledger.resume(messages)` later runs (through the ledger) the calls of the
 * last assistant message that have no result, so the model receives the stored or reconciled
 * result, or the call runs once if it never did.
 */

const { safeToolCall } = require('./safe');
const { ToolPolicy } = require('./policy');
const { LedgerInterruption, ApprovalMismatch, Inflight, interruption, decide, classify, tracking } = require('./adapter');

/** A tool's output as a tool-result part's `output`, as the SDK makes it. */
function outputOf(value) {
  return typeof value === 'string' ? { type: 'text', value } : { type: 'json', value: value ?? null };
}

/** An Error the model reads (the SDK turns it into a tool-error / error-text). */
function answerError(error) {
  if (error?.name === 'CallRejected' || error?.name === 'ToolFailed') {
    const message = error.name === 'CallRejected'
      ? `the tool was not run: ${error.message}`
      : error.errorMessage || error.message;
    return Object.assign(new Error(message), { name: error.name, cause: error });
  }
  return error;
}

/** The Vercel AI SDK's tools of one run through the ledger (see the module docs). */
class AiToolLedger {
  /**
   * @param {import('./client').Client} effectd
   * @param {object} options
   * @param {string} options.runId the run that keys every call; the same when it resumes.
   * @param {object} [options.policy] the operator's ToolPolicy (or its rules by tool name).
   * @param {number} [options.leaseMs] the lease of each attempt (0: the daemon's default).
   * @param {number} [options.timeoutMs] after this a call's outcome is unknown (0: none).
   */
  constructor(effectd, { runId, policy, leaseMs = 0, timeoutMs = 0 }) {
    if (!runId || runId.includes(':')) throw new TypeError("runId: a non-empty id without ':'");
    this.effectd = effectd;
    this.runId = runId;
    this.policy = ToolPolicy.of(policy);
    this.leaseMs = leaseMs;
    this.timeoutMs = timeoutMs;
    /** The LedgerInterruption that stopped the run last, or null. */
    this.interruption = null;
    this._stopped = new Set();
    this._tools = new Map();
    this._inflight = new Inflight();
    /** A StopCondition for generateText/streamText's `stopWhen`: true once the ledger stopped a call. */
    this.stopWhen = () => this._stopped.size > 0;
  }

  /**
   * A copy of `toolset` whose calls go through the ledger.
   * @param {Record<string, object>} toolset the AI SDK tools (`tool({...})`) by name.
   * @param {Record<string, {effect?: string, retryUnknown?: boolean, unknownOn?: Array<Function>}>} [declared]
   *   per tool: what the code declares, over the policy's word.
   */
  tools(toolset, declared = {}) {
    const out = {};
    for (const [name, tool] of Object.entries(toolset)) {
      if (typeof tool.execute !== 'function') {
        out[name] = tool; // Executed by the provider or the client: nothing for the ledger to hold.
        continue;
      }
      const rule = { ...this.policy.decide(name), ...(declared[name] || {}) };
      const entry = { name, tool, rule };
      this._tools.set(name, entry);
      out[name] = {
        ...tool,
        needsApproval: (input, options) => this._needsApproval(entry, input, options),
        execute: (input, options) => this._execute(entry, input, options),
      };
    }
    return out;
  }

  async _requiresApproval({ tool, rule }, input, options) {
    // The policy requires it, else the tool's own needsApproval (a bool or its predicate).
    if (rule.requireApproval) return true;
    const own = tool.needsApproval;
    if (typeof own === 'function') return Boolean(await own(input, options));
    return own === true;
  }

  _call(entry, input, toolCallId, requireApproval) {
    return {
      runId: this.runId,
      callId: toolCallId,
      tool: entry.name,
      input: input ?? null,
      effect: entry.rule.effect,
      requireApproval,
      retryUnknown: Boolean(entry.rule.retryUnknown) && entry.rule.effect !== 'SIDE_EFFECT',
      unknownOn: entry.rule.unknownOn,
      leaseMs: this.leaseMs,
      timeoutMs: this.timeoutMs,
    };
  }

  /** True while effectd holds the call for an approver: the SDK then asks for approval. */
  async _needsApproval(entry, input, options) {
    if (!(await this._requiresApproval(entry, input, options))) return false;
    const call = this._call(entry, input, options.toolCallId, true);
    try {
      const answer = await this.effectd.prepareTool({ ...call, start: false, retry: false, channel: 'TOOL' });
      return answer.decision === 'AWAIT_APPROVAL';
    } catch {
      return false; // execute meets the same refusal and stops the run.
    }
  }

  async _execute(entry, input, options) {
    const requireApproval = await this._requiresApproval(entry, input, options);
    const call = this._call(entry, input, options.toolCallId, requireApproval);
    const tracked = tracking((ctx) => entry.tool.execute(input, { ...options, effectd: ctx }), entry.rule.unknownOn);
    let outcome;
    try {
      return await this._inflight.track(this.runId, () => safeToolCall(this.effectd, call, tracked.run));
    } catch (error) {
      if (classify(error, tracked.state) === 'answer') throw answerError(error);
      outcome = error;
    }
    this._stopped.add(options.toolCallId);
    // The parallel calls of the same step settle first: the interruption names them all.
    await this._inflight.siblings(this.runId);
    const stop = await interruption(this.effectd, this.runId, outcome);
    this.interruption = stop;
    throw stop;
  }

  /**
   * The messages of `result.response` to keep, without the results of the calls the ledger
   * stopped (the model must not read them: they are settled in effectd, then `resume`d).
   */
  responseMessages(result) {
    const out = [];
    for (const message of result.response.messages) {
      if (message.role !== 'tool') {
        out.push(message);
        continue;
      }
      const content = message.content.filter(
        (part) => part.type !== 'tool-result' || !this._stopped.has(part.toolCallId),
      );
      if (content.length) out.push({ ...message, content });
    }
    return out;
  }

  /**
   * Runs, through the ledger, every call of the last assistant message of `messages` that has no
   * result (and, when the SDK asked for its approval, whose approval response approves it), and
   * returns `messages` with their results (in the last tool message): the stored or reconciled
   * output, a rejection, or a first run. Call it before `generateText` whenever the transcript
   * ends with calls (after an interruption, after approvals): the model is asked only once every
   * call has its result.
   * @throws {LedgerInterruption} a call is still stopped (nothing is added).
   */
  async resume(messages) {
    this._stopped.clear();
    this.interruption = null;
    let last = messages.length - 1;
    while (last >= 0 && messages[last].role === 'tool') last -= 1;
    const assistant = messages[last];
    if (!assistant || assistant.role !== 'assistant' || !Array.isArray(assistant.content)) return messages;
    const answered = new Set();
    const approved = new Set();
    for (const m of messages.slice(last + 1)) {
      for (const part of m.content) {
        if (part.type === 'tool-result') answered.add(part.toolCallId);
        if (part.type === 'tool-approval-response' && part.approved) approved.add(part.approvalId);
      }
    }
    // A call the SDK asked approval for runs here once the SDK's answer approves it (effectd
    // decides whether it may); a denied or unanswered one is the SDK's.
    const waiting = new Set(
      assistant.content
        .filter((p) => p.type === 'tool-approval-request' && !approved.has(p.approvalId))
        .map((p) => p.toolCallId),
    );
    const pending = assistant.content.filter(
      (p) => p.type === 'tool-call' && !p.providerExecuted && !answered.has(p.toolCallId) && !waiting.has(p.toolCallId),
    );
    const results = await Promise.all(
      pending.map(async (part) => {
        const entry = this._tools.get(part.toolName);
        if (!entry) throw new TypeError(`${part.toolName}: not a tool of this ledger`);
        const options = { toolCallId: part.toolCallId, messages: messages.slice(0, last), context: undefined };
        try {
          return { ok: true, part, value: await this._execute(entry, part.input, options) };
        } catch (error) {
          if (error instanceof LedgerInterruption) return { ok: false, part, error, stop: true };
          return { ok: false, part, error };
        }
      }),
    );
    const stop = results.find((r) => r.stop);
    if (stop) throw this.interruption ?? stop.error;
    const parts = results.map(({ ok, part, value, error }) => ({
      type: 'tool-result',
      toolCallId: part.toolCallId,
      toolName: part.toolName,
      output: ok ? outputOf(value) : { type: 'error-text', value: String(error?.message ?? error) },
    }));
    if (!parts.length) return messages;
    const tail = messages[messages.length - 1];
    if (tail.role === 'tool' && messages.length - 1 > last) {
      return [...messages.slice(0, -1), { ...tail, content: [...tail.content, ...parts] }];
    }
    return [...messages, { role: 'tool', content: parts }];
  }

  /**
   * Approves, in effectd, the call of an SDK approval request (`result.content`'s
   * `tool-approval-request` part, with its `toolCall`), bound to the arguments it shows; returns
   * the `tool-approval-response` part to send back in a tool message.
   * @throws {ApprovalMismatch} effectd recorded other arguments than the request shows.
   */
  async approve(request, { approver, reason = '' }) {
    return this._decide(request, true, approver, reason);
  }

  /** Rejects the call in effectd; returns the `tool-approval-response` part (approved false). */
  async reject(request, { approver, reason = '' }) {
    return this._decide(request, false, approver, reason);
  }

  async _decide(request, approve, approver, reason) {
    const toolCall = request?.toolCall;
    if (request?.type !== 'tool-approval-request' || !toolCall) {
      throw new TypeError('request: a tool-approval-request part of result.content (with its toolCall)');
    }
    await decide(this.effectd, {
      runId: this.runId,
      callId: toolCall.toolCallId,
      shown: toolCall.input,
      approve,
      approver,
      reason,
    });
    return {
      type: 'tool-approval-response',
      approvalId: request.approvalId,
      approved: approve,
      ...(reason ? { reason } : {}),
    };
  }
}

module.exports = { AiToolLedger, LedgerInterruption, ApprovalMismatch };
