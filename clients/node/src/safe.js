'use strict';
/**
 * `safeToolCall`: run a tool at most as often as ADR-010 allows.
 *
 * The helper prepares and starts the call in one round trip and follows the
 * decision: a committed call returns its stored result without running the
 * tool; a call waiting for approval, rejected, held by another attempt or in
 * need of reconciliation throws; only an attempt this caller holds runs the
 * tool, and its outcome is recorded before the helper returns:
 *
 *   fn resolves                      -> commit the result (JSON, or raw for a Buffer)
 *   fn throws (a definite error)     -> commit an error result (code = error.code
 *                                       if a string, else error.name), rethrow
 *   fn throws OutcomeUnknown, a      -> report the outcome unknown, rethrow
 *     TimeoutError, a connection
 *     error (ECONNRESET, EPIPE, ...),
 *     or runs past `timeoutMs`
 *   fn resolves to a value that is   -> report the outcome unknown, throw the TypeError
 *     not JSON (a BigInt, a cycle)
 *
 * If recording a failure is itself refused, the tool's error is still the one
 * thrown, with the refusal as `error.recordingError`. The error classes match
 * the Python client's:
 *
 *   Error
 *   ├── OutcomeUnknown               thrown BY a tool: it cannot know if it ran
 *   └── ToolCallStopped              the helper did not run the tool (call)
 *       ├── ReconciliationNeeded     RECONCILE: an operator must reconcile it
 *       ├── ApprovalPending          AWAIT_APPROVAL
 *       ├── CallInProgress           IN_PROGRESS: another attempt holds it
 *       ├── RetryRequired            unknown outcome, and retryUnknown not set
 *       ├── CallRejected             REJECTED (result: the rejection)
 *       └── ToolFailed               the stored result is an error result
 */

const { payloadIn } = require('./convert');

/**
 * Thrown by a tool when it cannot know whether its effect happened (a lost
 * connection after the request was sent); the helper throws it on timeout.
 * Any error with `outcomeUnknown === true` counts as one.
 */
class OutcomeUnknown extends Error {
  constructor(message = 'the outcome of the tool call is unknown', options) {
    super(message, options);
    this.name = 'OutcomeUnknown';
    this.outcomeUnknown = true;
  }
}

/** The helper did not run the tool; `call` is the record as found. */
class ToolCallStopped extends Error {
  constructor(message, call) {
    super(`${call.runId}:${call.callId} (${call.toolName}): ${message}`);
    this.name = new.target.name;
    this.call = call;
  }
}

class ReconciliationNeeded extends ToolCallStopped {}
class ApprovalPending extends ToolCallStopped {}
class CallInProgress extends ToolCallStopped {}
class RetryRequired extends ToolCallStopped {}

class CallRejected extends ToolCallStopped {
  constructor(message, call) {
    super(message, call);
    this.result = call.result;
  }
}

/** A repeated call whose committed result is an error: the tool is not run again. */
class ToolFailed extends ToolCallStopped {
  constructor(call) {
    const { errorCode, errorMessage } = call.result;
    super(`the tool failed earlier (${errorCode}): ${errorMessage}`, call);
    this.result = call.result;
    this.errorCode = errorCode;
    this.errorMessage = errorMessage;
  }
}

function stopped(decision, call) {
  switch (decision) {
    case 'RECONCILE':
      return new ReconciliationNeeded(
        'a side effect of unknown outcome: an operator must reconcile it; it is never run again by itself',
        call,
      );
    case 'AWAIT_APPROVAL':
      return new ApprovalPending('the call waits for an approver', call);
    case 'REJECTED':
      return new CallRejected(`an approver rejected the call: ${call.result?.errorMessage ?? ''}`, call);
    case 'IN_PROGRESS':
      return new CallInProgress('another attempt holds the call', call);
    default:
      return new CallInProgress(`the call could not be started (${decision})`, call);
  }
}

// Connection failures after a request may have been sent: the target may
// have acted on it (Python's ConnectionError, TimeoutError).
const UNKNOWN_CODES = new Set([
  'ECONNRESET',
  'ECONNABORTED',
  'ECONNREFUSED',
  'EPIPE',
  'ETIMEDOUT',
  'UND_ERR_SOCKET',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
]);

function isOutcomeUnknown(error) {
  if (!error || typeof error !== 'object') return false;
  if (error.outcomeUnknown === true || error.name === 'TimeoutError') return true;
  // fetch (undici) wraps the socket error as its cause.
  return UNKNOWN_CODES.has(error.code) || UNKNOWN_CODES.has(error.cause?.code);
}

function errorCodeOf(error) {
  if (error && typeof error.code === 'string' && error.code) return error.code;
  if (error && typeof error.name === 'string' && error.name && error.name !== 'Error') return error.name;
  return 'ERROR';
}

/**
 * Runs `fn` for the tool call `runId`/`callId` only when the ledger says so,
 * and records its outcome.
 *
 * @param {import('./client').Client} client
 * @param {object} call
 * @param {string} call.runId
 * @param {string} call.callId
 * @param {string} call.tool the tool's name.
 * @param {*} call.input JSON value or Buffer; a repeat must send the same input.
 * @param {'READ'|'IDEMPOTENT_WRITE'|'SIDE_EFFECT'} [call.effect] default 'SIDE_EFFECT'.
 * @param {boolean} [call.requireApproval]
 * @param {number} [call.leaseMs] lease of the attempt (0: the daemon's default, 30 s).
 * @param {number} [call.timeoutMs] after this the outcome is unknown: reported, and OutcomeUnknown thrown.
 * @param {number} [call.heartbeatMs] lease renewal period while fn runs (default a third of the lease; 0 disables).
 * @param {boolean} [call.retryUnknown] retry a READ or IDEMPOTENT_WRITE whose last attempt has an
 *   unknown outcome (under the daemon's retry rules, with the same key); otherwise RetryRequired is thrown.
 * @param {(ctx: {idempotencyKey?: string, attempt: number, signal: AbortSignal, call: object}) => any} fn
 *   the tool; for IDEMPOTENT_WRITE, `ctx.idempotencyKey` ('run:call') is the key the target must de-duplicate on.
 * @returns {Promise<*>} the committed result's value (parsed JSON or Buffer), fresh or stored.
 */
async function safeToolCall(client, call, fn) {
  const { runId, callId, tool, input, effect = 'SIDE_EFFECT', requireApproval = false, leaseMs = 0 } = call;
  let answer = await client.prepareTool({ runId, callId, tool, input, effect, requireApproval, start: true, leaseMs });
  if (answer.decision === 'EXECUTE' && !answer.attemptHeld) {
    if (answer.retryRequired && !call.retryUnknown) {
      // ADR-010 D3: an unknown outcome is retried only when asked for.
      throw new RetryRequired(
        "the last attempt's outcome is unknown; pass retryUnknown: true to retry this READ or IDEMPOTENT_WRITE",
        answer.call,
      );
    }
    // The daemon applies the retry rules (budget, kill switch; never a SIDE_EFFECT).
    answer = await client.startTool({ runId, callId, retry: answer.retryRequired, leaseMs });
  }
  const { decision, call: record } = answer;
  if (decision === 'RETURN_RESULT') {
    if (record.result.ok) return record.result.value;
    throw new ToolFailed(record);
  }
  if (decision !== 'EXECUTE' || !answer.attemptHeld) throw stopped(decision, record);
  return execute(client, call, answer, fn);
}

async function execute(client, call, answer, fn) {
  const { runId, callId, timeoutMs = 0 } = call;
  const { attempt } = answer.call;
  const controller = new AbortController();
  // The lease granted (the daemon's default when leaseMs is 0), as a wall-clock estimate.
  const granted = answer.call.leaseExpiresAt ? answer.call.leaseExpiresAt.getTime() - Date.now() : 0;
  const lease = call.leaseMs || (granted > 0 ? granted : 30_000);
  const heartbeatMs = call.heartbeatMs ?? Math.max(50, Math.floor(lease / 3));
  const timers = [];
  if (heartbeatMs > 0) {
    // A lost heartbeat is not fatal here: the commit is fenced by the attempt.
    const beat = setInterval(() => {
      client.heartbeat({ runId, callId, attempt, leaseMs: call.leaseMs || 0 }).catch(() => {});
    }, heartbeatMs);
    beat.unref();
    timers.push(() => clearInterval(beat));
  }
  const ctx = {
    idempotencyKey: answer.call.effect === 'IDEMPOTENT_WRITE' ? answer.idempotencyKey : undefined,
    attempt,
    signal: controller.signal,
    call: answer.call,
  };
  let value;
  try {
    const running = Promise.resolve().then(() => fn(ctx));
    if (timeoutMs > 0) {
      const timedOut = new Promise((_, reject) => {
        const timer = setTimeout(() => {
          const error = new OutcomeUnknown(`${call.tool} timed out after ${timeoutMs} ms`);
          controller.abort(error);
          reject(error);
        }, timeoutMs);
        timers.push(() => clearTimeout(timer));
      });
      running.catch(() => {}); // Settles after the timeout: nobody awaits it then.
      value = await Promise.race([running, timedOut]);
    } else {
      value = await running;
    }
  } catch (error) {
    for (const stop of timers) stop();
    try {
      if (isOutcomeUnknown(error)) {
        await client.reportUnknown({ runId, callId, attempt, reason: String(error?.message || error) });
      } else {
        await client.commitTool({
          runId,
          callId,
          attempt,
          errorCode: errorCodeOf(error),
          errorMessage: String(error?.message ?? error),
        });
      }
    } catch (recording) {
      // The tool's error stays the one thrown; the ledger's refusal rides along.
      if (error && typeof error === 'object') error.recordingError = recording;
    }
    throw error;
  }
  for (const stop of timers) stop();
  try {
    payloadIn(value);
  } catch (error) {
    // The tool ran but its result cannot be stored: only an operator can tell
    // what the caller should see, so the outcome is reported unknown.
    await client.reportUnknown({ runId, callId, attempt, reason: `the result could not be stored: ${error.message}` });
    throw error;
  }
  const committed = await client.commitTool({ runId, callId, attempt, result: value });
  return committed.result.value;
}

module.exports = {
  safeToolCall,
  OutcomeUnknown,
  ToolCallStopped,
  ReconciliationNeeded,
  ApprovalPending,
  CallInProgress,
  RetryRequired,
  CallRejected,
  ToolFailed,
};
