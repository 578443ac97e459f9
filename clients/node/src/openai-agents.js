'use strict';
/**
 * `@effectd/client/openai-agents`: OpenAI Agents JS function tools through the ledger.
 *
 * `AgentLedger.tool(functionTool)` returns a copy of an `@openai/agents` FunctionTool whose
 * `invoke` runs each call through `safeToolCall`, keyed by the run id of `ledger.run(runId, fn)`
 * and the model's call id (`details.toolCall.callId`), and whose `needsApproval` asks effectd.
 * The SDK is an optional peer dependency: this module never loads it.
 *
 *   committed before (same call id)    -> its stored output; the tool does not run (a RunState
 *                                         restored after a crash sees what the first run saw)
 *   the tool returns                   -> committed, then returned
 *   the tool throws, outcome definite  -> committed as an error; the model reads its text (a
 *                                         repeat reads it again without running the tool)
 *   the tool throws, outcome unknown   -> UNKNOWN; `LedgerInterruption` ends the run (the SDK
 *     (a timeout, a lost connection)      throws it as the `error` of its ToolCallError); it
 *                                         is never run again
 *   the ledger stops it (RECONCILE,    -> `LedgerInterruption`, nothing run; `calls` names
 *     AWAIT_APPROVAL, IN_PROGRESS,        every call of the run waiting for a human
 *     retry required, other arguments)
 *   approval required (the policy, or  -> the SDK's own interruption (`result.interruptions`)
 *     the tool's needsApproval)           while effectd holds the call in AWAITING_APPROVAL;
 *                                         `ledger.approve(item)` decides it in effectd, bound to
 *                                         the arguments the item shows
 *   rejected in effectd                -> the model reads the rejection
 *
 * An approval given only in the SDK (`state.approve(item)`, `alwaysApprove`) authorizes nothing
 * effectd has not approved: the call ends the run with `LedgerInterruption` (cause
 * `ApprovalPending`) and does not run.
 */

const { AsyncLocalStorage } = require('node:async_hooks');
const { safeToolCall } = require('./safe');
const { ToolPolicy } = require('./policy');
const { LedgerInterruption, ApprovalMismatch, Inflight, interruption, decide, classify, tracking } = require('./adapter');

/** A ledgered tool was called outside `ledger.run(runId, ...)`: no run id, nothing made up. */
class NoLedgerRun extends Error {
  constructor(message) {
    super(message);
    this.name = 'NoLedgerRun';
  }
}

function argumentsOf(text) {
  if (typeof text !== 'string') return text ?? null;
  try {
    return text === '' ? {} : JSON.parse(text);
  } catch {
    return text; // Arguments that are not JSON are recorded as the text they are.
  }
}

/** The text the model reads for a definite failure, fresh or stored. */
function failureText(error) {
  if (error?.name === 'CallRejected') return `the tool was not run: ${error.message}`;
  const message = error?.name === 'ToolFailed' ? error.errorMessage : error?.message ?? String(error);
  return `An error occurred while running the tool: ${message}`;
}

/** The SDK's ToolCallError carries what the tool threw as `error`: the interruption, if any. */
function interruptionOf(error) {
  for (let e = error, n = 0; e && n < 5; n += 1) {
    if (e instanceof LedgerInterruption) return e;
    e = e.error ?? e.cause;
  }
  return null;
}

/** OpenAI Agents JS function tools through the ledger (see the module docs). */
class AgentLedger {
  /**
   * @param {import('./client').Client} effectd
   * @param {object} [options]
   * @param {object} [options.policy] the operator's ToolPolicy (or its rules by tool name).
   * @param {number} [options.leaseMs] the lease of each attempt (0: the daemon's default).
   */
  constructor(effectd, { policy, leaseMs = 0 } = {}) {
    this.effectd = effectd;
    this.policy = ToolPolicy.of(policy);
    this.leaseMs = leaseMs;
    this._run = new AsyncLocalStorage();
    this._tools = new Map();
    this._inflight = new Inflight();
  }

  /**
   * Runs `fn` (e.g. `() => run(agent, input)`) with every ledgered call keyed by `runId`; resume
   * with the same run id.
   */
  run(runId, fn) {
    if (!runId || runId.includes(':')) throw new TypeError("runId: a non-empty id without ':'");
    return this._run.run({ runId }, fn);
  }

  _runId(name) {
    const current = this._run.getStore();
    if (!current) throw new NoLedgerRun(`${name}: a ledgered tool was called outside ledger.run(runId, ...)`);
    return current.runId;
  }

  /**
   * A copy of `tool` (a FunctionTool of `tool({...})`, made with `errorFunction: null` so that its
   * exceptions reach the ledger) whose calls go through the ledger.
   * @param {object} tool
   * @param {{effect?: string, retryUnknown?: boolean, timeoutMs?: number, unknownOn?: Array<Function>}} [declared]
   */
  tool(tool, declared = {}) {
    if (tool?.type !== 'function' || typeof tool.invoke !== 'function') {
      throw new TypeError('tool: a function tool of @openai/agents (tool({...}))');
    }
    const rule = { ...this.policy.decide(tool.name), ...declared };
    const entry = { tool, rule };
    this._tools.set(tool.name, entry);
    return {
      ...tool,
      needsApproval: (runContext, input, callId) => this._needsApproval(entry, runContext, input, callId),
      invoke: (runContext, input, details) => this._invoke(entry, runContext, input, details),
    };
  }

  async _requiresApproval({ tool, rule }, runContext, input, callId) {
    if (rule.requireApproval) return true;
    return Boolean(await tool.needsApproval?.(runContext, input, callId));
  }

  _call({ tool, rule }, runId, callId, args, requireApproval) {
    return {
      runId,
      callId,
      tool: tool.name,
      input: args,
      effect: rule.effect,
      requireApproval,
      retryUnknown: Boolean(rule.retryUnknown) && rule.effect !== 'SIDE_EFFECT',
      unknownOn: rule.unknownOn,
      leaseMs: this.leaseMs,
      timeoutMs: rule.timeoutMs ?? 0,
    };
  }

  /** True while effectd holds the call for an approver: the SDK's interruption. */
  async _needsApproval(entry, runContext, input, callId) {
    if (!(await this._requiresApproval(entry, runContext, input, callId))) return false;
    const call = this._call(entry, this._runId(entry.tool.name), callId, argumentsOf(JSON.stringify(input)), true);
    try {
      const answer = await this.effectd.prepareTool({ ...call, start: false, retry: false, channel: 'TOOL' });
      return answer.decision === 'AWAIT_APPROVAL';
    } catch {
      return false; // invoke meets the same refusal and ends the run.
    }
  }

  async _invoke(entry, runContext, input, details) {
    const runId = this._runId(entry.tool.name);
    const callId = details?.toolCall?.callId;
    if (!callId) throw new TypeError(`${entry.tool.name}: the SDK gave no call id`);
    const args = argumentsOf(input);
    const requireApproval = await this._requiresApproval(entry, runContext, args, callId);
    const call = this._call(entry, runId, callId, args, requireApproval);
    const tracked = tracking((ctx) => entry.tool.invoke(runContext, input, { ...details, effectd: ctx }), entry.rule.unknownOn);
    let outcome;
    try {
      return await this._inflight.track(runId, () => safeToolCall(this.effectd, call, tracked.run));
    } catch (error) {
      if (classify(error, tracked.state) === 'answer') return failureText(error);
      outcome = error;
    }
    await this._inflight.siblings(runId);
    throw await interruption(this.effectd, runId, outcome);
  }

  /**
   * Approves the call of an SDK interruption (`result.interruptions`' item) in effectd, bound to
   * the arguments it shows, and in `state` when given.
   * @throws {ApprovalMismatch} effectd recorded other arguments than the item shows.
   */
  async approve(item, { approver, reason = '', state, runId } = {}) {
    const call = await this._decide(item, true, approver, reason, runId);
    state?.approve(item);
    return call;
  }

  /** Rejects the call in effectd (and in `state`): the model reads the rejection; it never runs. */
  async reject(item, { approver, reason = '', state, runId } = {}) {
    const call = await this._decide(item, false, approver, reason, runId);
    state?.reject(item);
    return call;
  }

  async _decide(item, approve, approver, reason, runId) {
    const raw = item?.rawItem;
    if (!raw?.callId || !this._tools.has(raw.name)) throw new TypeError(`${raw?.name}: not a call of a ledgered tool`);
    return decide(this.effectd, {
      runId: runId ?? this._runId(raw.name),
      callId: raw.callId,
      shown: argumentsOf(raw.arguments),
      approve,
      approver,
      reason,
    });
  }

  /**
   * Applies effectd's decisions to a restored RunState's interruptions (approved: approved in the
   * state; rejected: rejected); returns the items still waiting. The SDK does not ask needsApproval
   * again for a pending interruption when it resumes: call this before `run(agent, state)`.
   */
  async applyDecisions(state, { runId } = {}) {
    const waiting = [];
    for (const item of state.getInterruptions()) {
      const raw = item.rawItem;
      if (!raw?.callId || !this._tools.has(raw.name)) {
        waiting.push(item);
        continue;
      }
      let call;
      try {
        call = await this.effectd.getToolCall({ runId: runId ?? this._runId(raw.name), callId: raw.callId });
      } catch {
        waiting.push(item);
        continue;
      }
      const decided = call.approval?.decidedAt || call.approval?.approver;
      if (call.state === 'AWAITING_APPROVAL' || !decided) waiting.push(item);
      else if (call.approval.approved === false) state.reject(item);
      else state.approve(item);
    }
    return waiting;
  }
}

module.exports = { AgentLedger, LedgerInterruption, ApprovalMismatch, NoLedgerRun, interruptionOf };
