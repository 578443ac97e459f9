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
 *   fn resolves                      -> commit the result: `serialize(value)` if given, else the
 *                                       value as JSON, what JSON cannot say by the fallback of
 *                                       `jsonable` (BigInt, Map, Set, cycles, ...)
 *   fn throws (a definite error)     -> commit an error result (code = error.code
 *                                       if a string, else error.name; payload:
 *                                       error.errorResult if set), rethrow
 *   fn throws an unknown outcome:    -> report the outcome unknown, rethrow
 *     OutcomeUnknown (or any error
 *     with outcomeUnknown = true), a
 *     TimeoutError or AbortError, a
 *     connection error (ECONNRESET,
 *     EPIPE, undici's, ...), a gRPC
 *     UNAVAILABLE / DEADLINE_EXCEEDED /
 *     UNKNOWN / CANCELLED, what
 *     `unknownOn` says, or an error
 *     whose `cause` is one of these
 *   fn runs past `timeoutMs`         -> report the outcome unknown, throw OutcomeUnknown
 *
 * The recording requests are retried by the client (`recordingRetry`); an
 * outcome that still cannot be recorded throws `ResultNotRecorded` (an
 * OutcomeUnknown carrying `result` or `error`), never a tool failure. A result
 * handed back (fresh, stored, or an error result) is then acknowledged
 * (AcknowledgeRecovery), which starts its retention window.
 *
 * If reporting an unknown outcome is itself refused, the tool's error is still
 * the one thrown, with the refusal as `error.recordingError` (the lease runs
 * out all the same). The error classes match the Python client's:
 *
 *   Error
 *   ├── OutcomeUnknown               thrown BY a tool: it cannot know if it ran
 *   │   └── ResultNotRecorded        the tool ran; the ledger could not record it
 *   └── ToolCallStopped              the helper did not run the tool (call)
 *       ├── ReconciliationNeeded     RECONCILE: an operator must reconcile it
 *       ├── ApprovalPending          AWAIT_APPROVAL
 *       ├── CallInProgress           IN_PROGRESS: another attempt holds it
 *       ├── RetryRequired            unknown outcome, and retryUnknown not set
 *       ├── CallRejected             REJECTED (result: the rejection)
 *       └── ToolFailed               the stored result is an error result
 */

const { EffectdError, errors } = require('./errors');

const RETRY_REQUIRED =
  "the last attempt's outcome is unknown; pass retryUnknown: true to retry this READ or IDEMPOTENT_WRITE";

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

/**
 * The tool ran, but the ledger did not record its outcome: `result` is what it
 * returned (`error` what it threw), `cause` the ledger's refusal or failure
 * after the recording retries. The call stays STARTED or UNKNOWN, never run
 * again by itself.
 */
class ResultNotRecorded extends OutcomeUnknown {
  constructor(message, call, { result, error, cause } = {}) {
    super(`${call.runId}:${call.callId} (${call.toolName}): ${message}`, cause ? { cause } : undefined);
    this.name = 'ResultNotRecorded';
    this.call = call;
    this.result = result;
    this.error = error;
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
  'ERR_NETWORK',
  'ERR_SOCKET_CONNECTION_TIMEOUT',
  'ERR_STREAM_PREMATURE_CLOSE',
  'ERR_HTTP2_STREAM_ERROR',
  'UND_ERR_SOCKET',
  'UND_ERR_CLOSED',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
]);
// gRPC statuses after which the server may have acted: CANCELLED, UNKNOWN,
// DEADLINE_EXCEEDED, UNAVAILABLE (numbers from @grpc/grpc-js, names from
// this client's EffectdError).
const GRPC_UNKNOWN = new Set([1, 2, 4, 14]);
const GRPC_UNKNOWN_NAMES = new Set(['CANCELLED', 'UNKNOWN', 'DEADLINE_EXCEEDED', 'UNAVAILABLE']);

function knownUnknown(error) {
  if (error.outcomeUnknown === true || error.name === 'TimeoutError' || error.name === 'AbortError') return true;
  if (UNKNOWN_CODES.has(error.code)) return true;
  if (typeof error.code === 'number' && 'metadata' in error && GRPC_UNKNOWN.has(error.code)) return true;
  return error instanceof EffectdError && GRPC_UNKNOWN_NAMES.has(error.code);
}

/** A declaration is an Error class (with its subclasses) or a predicate. */
function matches(error, declared = []) {
  return declared.some((m) =>
    m === Error || m.prototype instanceof Error ? error instanceof m : Boolean(m(error)),
  );
}

/**
 * Whether `error`, thrown by a tool, leaves its effect unknown: the tool's
 * `unknownOn`, then its `definiteOn`, then the known kinds, then the same
 * along its `cause` chain; else a definite failure.
 */
function isOutcomeUnknown(error, { unknownOn = [], definiteOn = [] } = {}) {
  const seen = new Set();
  for (let e = error; e && typeof e === 'object' && !seen.has(e); e = e.cause) {
    seen.add(e);
    if (matches(e, unknownOn)) return true;
    if (matches(e, definiteOn)) return false;
    if (knownUnknown(e)) return true;
  }
  return false;
}

function errorCodeOf(error) {
  if (error && typeof error.code === 'string' && error.code) return error.code;
  if (error && typeof error.name === 'string' && error.name && error.name !== 'Error') return error.name;
  return 'ERROR';
}

/** `text` the daemon accepts: no control characters but \n and \t, at most `maxBytes` of UTF-8. */
function boundedText(text, maxBytes = 4096) {
  let t = String(text).replace(/[\x00-\x08\x0b-\x1f\x7f-\x9f]/g, '?');
  if (typeof t.toWellFormed === 'function') t = t.toWellFormed();
  const bytes = Buffer.from(t, 'utf8');
  if (bytes.length <= maxBytes) return t;
  return `${bytes.subarray(0, maxBytes - 3).toString('utf8').replace(/\uFFFD$/, '')}...`;
}

/**
 * `value` as plain JSON, the fallback for what JSON.stringify cannot say:
 * a BigInt or an integer beyond Number.MAX_SAFE_INTEGER becomes its text (a
 * small BigInt its number), a non-finite number its text, a Buffer base64
 * text, a Date its ISO text, a Map an object, a Set an array, an Error
 * {name, message}, a value that contains itself '<cycle>'; objects keep
 * JSON.stringify's rules (toJSON, own enumerable keys, undefined dropped).
 */
function jsonable(value, active = new Set()) {
  if (value === null || value === undefined) return null;
  switch (typeof value) {
    case 'boolean':
    case 'string':
      return value;
    case 'number':
      return Number.isFinite(value) && !(Number.isInteger(value) && !Number.isSafeInteger(value))
        ? value
        : String(value);
    case 'bigint':
      return value >= -Number.MAX_SAFE_INTEGER && value <= Number.MAX_SAFE_INTEGER ? Number(value) : String(value);
    case 'function':
    case 'symbol':
      return null;
    default:
  }
  if (value instanceof Uint8Array) return Buffer.from(value).toString('base64');
  if (value instanceof Date) return Number.isNaN(value.getTime()) ? null : value.toISOString();
  if (active.has(value)) return '<cycle>';
  active.add(value);
  try {
    if (typeof value.toJSON === 'function') return jsonable(value.toJSON(), active);
    if (Array.isArray(value)) return value.map((v) => jsonable(v, active));
    if (value instanceof Set) return [...value].map((v) => jsonable(v, active));
    if (value instanceof Map) {
      const out = {};
      for (const [k, v] of value) out[typeof k === 'string' ? k : JSON.stringify(jsonable(k, active))] = jsonable(v, active);
      return out;
    }
    if (value instanceof Error) return { name: value.name, message: value.message };
    const out = {};
    for (const [k, v] of Object.entries(value)) {
      if (v !== undefined && typeof v !== 'function' && typeof v !== 'symbol') out[k] = jsonable(v, active);
    }
    return out;
  } finally {
    active.delete(value);
  }
}

/** What is committed for a returned value: a Buffer as raw bytes, else JSON. */
function encodeResult(value, serialize) {
  const stored = serialize ? serialize(value) : value;
  if (stored instanceof Uint8Array) return Buffer.from(stored);
  return jsonable(stored);
}

/** Marks a result handed back as delivered; a lost acknowledgement only delays retention. */
async function acknowledge(client, call, record) {
  if (call.acknowledge === false || record.acknowledged) return;
  try {
    await client.acknowledgeRecovery({ runId: call.runId, callIds: [call.callId] });
  } catch {
    // The result is stored; only its retention window waits.
  }
}

/** One last try to leave the reason in the ledger, as UNKNOWN. */
async function noteUnrecorded(client, call, attempt, cause) {
  const reason = boundedText(`the outcome could not be recorded: ${cause?.message ?? cause}`);
  try {
    await client.reportUnknown({ runId: call.runId, callId: call.callId, attempt, reason, retry: { attempts: 1 } });
  } catch {
    // The lease runs out all the same: the call ends UNKNOWN.
  }
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
 * @param {Array<Function>} [call.unknownOn] Error classes or predicates that mean the tool cannot know
 *   whether it acted (reported unknown).
 * @param {Array<Function>} [call.definiteOn] Error classes or predicates that are definite failures
 *   (committed as errors) although the default classification says unknown; unknownOn wins.
 * @param {(value: any) => any} [call.serialize] turns the returned value into the JSON value (or Buffer)
 *   committed; without it what JSON cannot say goes through the `jsonable` fallback.
 * @param {boolean} [call.acknowledge] default true: acknowledge the result once handed back.
 * @param {'TOOL'|'MCP'|'CHILD_FOREGROUND'|'DURABLE_BACKGROUND'} [call.channel] default 'TOOL': how the
 *   tool is reached (part of the call's identity); the daemon applies its retry rules (an MCP call of
 *   unknown outcome is never started again, ADR-010 D5).
 * @param {(ctx: {idempotencyKey?: string, attempt: number, signal: AbortSignal, call: object}) => any} fn
 *   the tool; for IDEMPOTENT_WRITE, `ctx.idempotencyKey` ('run:call') is the key the target must de-duplicate on.
 * @returns {Promise<*>} the committed result's value (parsed JSON or Buffer), fresh or stored.
 * @throws {ResultNotRecorded} the tool ran and the ledger could not record its outcome.
 */
async function safeToolCall(client, call, fn) {
  const { runId, callId, tool, input, effect = 'SIDE_EFFECT', requireApproval = false, leaseMs = 0 } = call;
  const { channel = 'TOOL' } = call;
  const retry = Boolean(call.retryUnknown);
  let answer;
  try {
    // With `retry` the daemon applies the retry rules in the same transaction
    // (budget, kill switch, channel; never a SIDE_EFFECT).
    answer = await client.prepareTool({
      runId,
      callId,
      tool,
      input,
      effect,
      requireApproval,
      start: true,
      leaseMs,
      retry,
      channel,
    });
  } catch (error) {
    // ADR-010 D3: an unknown outcome is retried only when asked for.
    if (error instanceof errors.INVALID_TRANSITION && error.metadata.retryRequired === 'true') {
      throw new RetryRequired(RETRY_REQUIRED, await client.getToolCall({ runId, callId }));
    }
    throw error;
  }
  if (answer.decision === 'EXECUTE' && !answer.attemptHeld) {
    // A daemon that predates `retry` on PrepareTool invites the retry instead.
    if (answer.retryRequired && !retry) throw new RetryRequired(RETRY_REQUIRED, answer.call);
    answer = await client.startTool({ runId, callId, retry: answer.retryRequired, leaseMs });
  }
  const { decision, call: record } = answer;
  if (decision === 'RETURN_RESULT' || decision === 'REJECTED') await acknowledge(client, call, record);
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
    const retry = { deadlineMs: Math.max(1_000, heartbeatMs) };
    const beat = setInterval(() => {
      client.heartbeat({ runId, callId, attempt, leaseMs: call.leaseMs || 0, retry }).catch(() => {});
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
    if (isOutcomeUnknown(error, call)) {
      try {
        await client.reportUnknown({ runId, callId, attempt, reason: boundedText(String(error?.message || error)) });
      } catch (recording) {
        // The tool's error stays the one thrown; the ledger's refusal rides along.
        if (error && typeof error === 'object') error.recordingError = recording;
      }
      throw error;
    }
    const errorCode = boundedText(errorCodeOf(error), 256);
    let failed;
    try {
      failed = await client.commitTool({
        runId,
        callId,
        attempt,
        result: error?.errorResult,
        errorCode,
        errorMessage: boundedText(String(error?.message ?? error)),
        acknowledge: call.acknowledge !== false,
      });
    } catch (recording) {
      await noteUnrecorded(client, call, attempt, recording);
      throw new ResultNotRecorded(`the tool failed (${errorCode}) and the ledger did not record it`, answer.call, {
        error,
        cause: recording,
      });
    }
    await acknowledge(client, call, failed);
    throw error;
  }
  for (const stop of timers) stop();
  let committed;
  try {
    // Acknowledged with the commit (one durable write instead of two): the
    // result is handed back right after.
    committed = await client.commitTool({
      runId,
      callId,
      attempt,
      result: encodeResult(value, call.serialize),
      acknowledge: call.acknowledge !== false,
    });
  } catch (failure) {
    await noteUnrecorded(client, call, attempt, failure);
    throw new ResultNotRecorded('the tool returned and the ledger did not record its result', answer.call, {
      result: value,
      cause: failure,
    });
  }
  await acknowledge(client, call, committed);
  return committed.result.value;
}

module.exports = {
  safeToolCall,
  isOutcomeUnknown,
  jsonable,
  OutcomeUnknown,
  ResultNotRecorded,
  ToolCallStopped,
  ReconciliationNeeded,
  ApprovalPending,
  CallInProgress,
  RetryRequired,
  CallRejected,
  ToolFailed,
};
