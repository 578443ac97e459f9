'use strict';
/**
 * What the framework adapters (`./ai`, `./openai-agents`, `./langgraph`) share: the interruption
 * that ends a run when the ledger stops a tool call, naming every call of the run that waits for
 * a human (the daemon's Recover plan), and the check that an approval shows the arguments effectd
 * recorded. Free of any framework.
 */

const { EffectdError } = require('./errors');
const { CallRejected, ToolFailed, isOutcomeUnknown } = require('./safe');

// The recovery actions that wait for a human.
const HUMAN = new Set(['RECONCILE', 'RETRY_NEEDS_POLICY', 'WAIT_FOR_APPROVAL']);

/**
 * The ledger stopped a tool call: the run ends here, the tool did not run (or ran and its outcome
 * is unknown, recorded UNKNOWN). `cause` is the client's reason (`ReconciliationNeeded`,
 * `ApprovalPending`, `CallInProgress`, `RetryRequired`, a refusal such as `errors.INPUT_MISMATCH`,
 * or what the tool threw when its outcome is unknown); `call` the ledger's record when known;
 * `calls` every call of the run waiting for a human now (UNKNOWN: reconcile or retry it;
 * AWAITING_APPROVAL: approve it), in the daemon's judgement.
 */
class LedgerInterruption extends Error {
  constructor(cause, calls = []) {
    const waiting = calls.map((c) => `${c.callId} (${c.toolName}, ${c.state})`).join(', ');
    const also = waiting ? `; the calls of the run waiting for a human: ${waiting}` : '';
    super(`effectd stopped the tool call: ${cause?.message ?? cause}${also}`, { cause });
    this.name = 'LedgerInterruption';
    this.call = cause?.call ?? null;
    this.calls = calls;
  }
}

/** The arguments an approval shows are not those effectd recorded for the call: nothing decided. */
class ApprovalMismatch extends Error {
  constructor(message) {
    super(message);
    this.name = 'ApprovalMismatch';
  }
}

/**
 * The interruption of `runId` by `cause`, naming every call of the run waiting for a human
 * (Recover: the daemon's judgement, after expired leases became UNKNOWN; a call still running is
 * not one).
 *
 * The parallel calls of a step killed together do not turn UNKNOWN together: each lease was last
 * renewed at its own heartbeat. So while a call waits for a human and another is still STARTED,
 * the others' leases are waited out (each at most its own lease, once) and the run recovered
 * again: a sibling that died with the first is named now, not at the next resume; one whose
 * attempt is alive renewed its lease and is not named.
 */
async function interruption(effectd, runId, cause) {
  let plan;
  try {
    plan = await effectd.recover({ runId });
    const wait = leaseLeftMs(plan, Date.now());
    if (wait > 0 && waitingOf(plan).length) {
      await new Promise((resolve) => setTimeout(resolve, wait));
      plan = await effectd.recover({ runId });
    }
  } catch (error) {
    if (error instanceof EffectdError) return new LedgerInterruption(cause);
    throw error;
  }
  return new LedgerInterruption(cause, waitingOf(plan));
}

// Past a lease's end, before the run is recovered again.
const LEASE_MARGIN_MS = 50;

function waitingOf(plan) {
  return plan.items.filter((i) => HUMAN.has(i.action) && i.call.state !== 'STARTED').map((i) => i.call);
}

/**
 * Milliseconds until the last lease of the plan's STARTED calls ends (0: none), each bounded by
 * its own lease (the time from its last start or heartbeat to its end: the daemon's clock may not
 * be ours).
 */
function leaseLeftMs(plan, now) {
  const left = plan.items
    .filter((i) => i.call.state === 'STARTED' && i.call.leaseExpiresAt)
    .map(({ call }) => {
      const end = call.leaseExpiresAt.getTime();
      const lease = call.updatedAt ? Math.max(0, end - call.updatedAt.getTime()) : end - now;
      return Math.min(end - now, lease);
    });
  return left.length ? Math.max(...left) + LEASE_MARGIN_MS : 0;
}

/** JSON values equal as JSON (key order aside). */
function sameJson(a, b) {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  if (ka.length !== Object.keys(b).length) return false;
  return ka.every((k) => Object.hasOwn(b, k) && sameJson(a[k], b[k]));
}

/**
 * Whether the input effectd kept for `call` is `shown` (true when it keeps none any more: the
 * daemon compares fingerprints when the call starts).
 */
function shows(call, shown) {
  const kept = call.keptInput?.json;
  if (kept === null || kept === undefined) return true;
  return sameJson(typeof kept === 'string' ? JSON.parse(kept) : kept, JSON.parse(JSON.stringify(shown ?? null)));
}

/**
 * Decides a call waiting for approval in effectd, after checking that `shown` (the arguments the
 * framework showed the approver) are those effectd recorded.
 * @throws {ApprovalMismatch}
 */
async function decide(effectd, { runId, callId, shown, approve, approver, reason }) {
  const call = await effectd.getToolCall({ runId, callId });
  if (call.state === 'AWAITING_APPROVAL' && (!call.keptInput?.json || !shows(call, shown))) {
    throw new ApprovalMismatch(`${callId}: effectd recorded other arguments than the approval shows`);
  }
  return effectd.decideApproval({
    runId,
    callId,
    approve,
    approver,
    reason: reason || (approve ? 'approved' : 'rejected'),
    expectedRevision: call.revision,
    inputFingerprint: call.inputFingerprint,
  });
}

/**
 * What became of a ledgered call that did not hand back a value: 'answer' (a definite error the
 * model reads: the tool failed, now or before, or an approver rejected it) or 'stop' (the run
 * must end: the ledger did not run it, or its outcome is unknown).
 */
function classify(error, tracked) {
  if (tracked.error !== undefined && error === tracked.error) return 'answer';
  if (error instanceof CallRejected || error instanceof ToolFailed) return 'answer';
  return 'stop';
}

/** Runs `fn` (the tool) and tells a definite failure from an unknown outcome, as safeToolCall does. */
function tracking(fn, unknownOn) {
  // `error`: what the tool threw when it is a definite failure (committed, then rethrown as it is).
  const state = { error: undefined };
  const run = async (ctx) => {
    try {
      return await fn(ctx);
    } catch (error) {
      if (!isOutcomeUnknown(error, { unknownOn })) state.error = error;
      throw error;
    }
  };
  return { run, state };
}

/**
 * The ledgered calls of each run in flight in this process. When one call stops the run, the
 * interruption waits for its siblings (the parallel calls of the same model response) to settle,
 * so that it names every unsettled call of the run at once, not those that happened to finish
 * first.
 */
class Inflight {
  constructor() {
    this._runs = new Map();
  }

  /** Runs `work` (a promise factory) as one of `runId`'s calls. */
  async track(runId, work) {
    const calls = this._runs.get(runId) ?? new Set();
    this._runs.set(runId, calls);
    const running = Promise.resolve().then(work);
    const settled = running.then(() => {}, () => {});
    calls.add(settled);
    try {
      return await running;
    } finally {
      calls.delete(settled);
      if (!calls.size) this._runs.delete(runId);
    }
  }

  /** Settles when every other call of `runId` in flight now has settled. */
  async siblings(runId) {
    await Promise.all([...(this._runs.get(runId) ?? [])]);
  }
}

module.exports = { LedgerInterruption, ApprovalMismatch, Inflight, interruption, leaseLeftMs, shows, decide, classify, tracking, HUMAN };
