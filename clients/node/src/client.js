'use strict';
/**
 * The promise client: one method per ToolLedger, Checkpoints, Recovery and
 * RetryPolicy RPC, plain objects in and out. Every gRPC error is translated
 * to an EffectdError (subclass) here, and nowhere else.
 *
 * PrepareTool, PrepareTools, StartTool, CommitTool, ReportUnknown, Heartbeat
 * and GetToolCall go over the ledger session unless the `session` option is
 * false or the daemon does not serve it: on the daemon's framed socket
 * (frames.js) for a `unix:` target whose daemon serves one, unless
 * `EFFECTD_TRANSPORT=grpc`, else on the gRPC session stream (session.js); the
 * other RPCs are unary calls.
 */

const { inspect } = require('node:util');
const { connection } = require('./connection');
const { load } = require('./proto');
const { fromServiceError } = require('./errors');
const { Session } = require('./session');
const { FramesSession, localSocket } = require('./frames');
const { FIELDS } = require('./session-wire');
const { Outage, backoffMs, DEFAULT_RECONNECT_WAIT_MS } = require('./reconnect');
const c = require('./convert');

const DEFAULT_TARGET = 'unix:.effectd/effectd.sock';
/** Read when no `session` option is given: '0', 'false' or 'off' turns the session stream off. */
const SESSION_ENV = 'EFFECTD_SESSION';
// Calls per Recover answer when a plan is read page by page (the most the
// daemon answers at once).
const RECOVER_PAGE_SIZE = 1000;

function sessionDefault() {
  const value = (process.env[SESSION_ENV] ?? '').trim().toLowerCase();
  return !['0', 'false', 'off', 'no'].includes(value);
}

/**
 * How the recording requests (CommitTool, ReportUnknown, Heartbeat,
 * AcknowledgeRecovery) are sent again. The daemon answers each of them the
 * same when it comes again with the same attempt (a commit of the stored
 * result is answered as done, another result is RESULT_MISMATCH), so a
 * request whose answer was lost, or that a transient refusal turned away, is
 * retried: at most `attempts` tries within `deadlineMs`, waiting
 * `initialBackoffMs` doubling up to `maxBackoffMs` (half of it jittered),
 * never less than a refusal's RetryInfo. `onRetry(error, waitMs)` is called
 * before each wait.
 */
const DEFAULT_RECORDING_RETRY = Object.freeze({
  attempts: 8,
  deadlineMs: 30_000,
  initialBackoffMs: 100,
  maxBackoffMs: 2_000,
  onRetry: null,
});

/** UNAVAILABLE, a try's own deadline, or a refusal that says when to try again. */
function transient(error) {
  if (error.code === 'UNAVAILABLE') return true;
  if (error.code === 'DEADLINE_EXCEEDED' && !error.reason) return true;
  return error.retryDelayMs !== null && error.retryDelayMs !== undefined;
}

/** Milliseconds to wait before try `tries + 1`, or null: give up. */
function recordingWait(policy, tries, error, elapsedMs, jitter) {
  if (tries >= policy.attempts || !transient(error)) return null;
  let delay = backoffMs(tries, policy.initialBackoffMs, policy.maxBackoffMs, jitter);
  if (error.retryDelayMs !== null && error.retryDelayMs !== undefined) delay = Math.max(delay, error.retryDelayMs);
  return elapsedMs + delay >= policy.deadlineMs ? null : delay;
}

class Client {
  /**
   * @param {object} [options]
   * @param {string} [options.target] `unix:PATH` or `HOST:PORT` (default `unix:.effectd/effectd.sock`).
   * @param {string} [options.namespace] '' means "default".
   * @param {number} [options.timeoutMs] deadline of every call (default 10 s).
   * @param {string} [options.token] bearer token, sent as `authorization: Bearer` metadata on
   *   every call (default `EFFECTD_TOKEN`; '' sends none). Never shown by inspecting the client.
   * @param {true | {ca?: Buffer, cert?: Buffer, key?: Buffer}} [options.tls] TLS: `ca` verifies the
   *   daemon (default the system roots), `cert` and `key` are the client's own (mutual TLS).
   * @param {number} [options.maxMessageBytes] largest message sent or received (default 8 MiB,
   *   the daemon's default).
   * @param {grpc.ChannelCredentials} [options.credentials] default insecure (local socket); not with `tls`.
   * @param {object} [options.channelOptions] passed to @grpc/grpc-js.
   * @param {string} [options.protosDir] where effectd/v1/*.proto are (default the repository's protos/).
   * @param {object} [options.recordingRetry] how CommitTool, ReportUnknown, Heartbeat and
   *   AcknowledgeRecovery are retried: {attempts = 8, deadlineMs = 30000, initialBackoffMs = 100,
   *   maxBackoffMs = 2000, onRetry(error, waitMs)}.
   * @param {boolean} [options.session] carry the ledger's tool-call requests over one session (default
   *   true, unless `EFFECTD_SESSION` is '0', 'false' or 'off'): on the daemon's framed socket for a
   *   `unix:` target whose daemon serves one (unless `EFFECTD_TRANSPORT` is 'grpc'), else on the gRPC
   *   session stream; false: one unary call each.
   * @param {number} [options.reconnectWaitMs] how long a call whose request was not sent (the daemon
   *   away, restarting or stopping) waits for the daemon before it fails UNAVAILABLE, never past its
   *   deadline (default 5000; 0: it fails at once). A request that may have reached the daemon is never
   *   sent again this way.
   */
  constructor({
    target = DEFAULT_TARGET,
    namespace = '',
    timeoutMs = 10_000,
    token,
    tls,
    maxMessageBytes,
    credentials,
    channelOptions = {},
    protosDir,
    recordingRetry = {},
    session = sessionDefault(),
    reconnectWaitMs = DEFAULT_RECONNECT_WAIT_MS,
  } = {}) {
    const loaded = load(protosDir);
    const { services } = loaded;
    this.target = target;
    this.namespace = namespace;
    this.timeoutMs = timeoutMs;
    this.recordingRetry = { ...DEFAULT_RECORDING_RETRY, ...recordingRetry };
    const conn = connection({ token, tls, credentials, maxMessageBytes, channelOptions });
    this._connection = conn;
    this._outage = new Outage(target, reconnectWaitMs);
    credentials = conn.credentials;
    this._ledger = new services.ledger(target, credentials, conn.channelOptions);
    // The other stubs share the first one's channel.
    const shared = { channelOverride: this._ledger.getChannel() };
    this._checkpoints = new services.checkpoints(target, credentials, shared);
    this._recovery = new services.recovery(target, credentials, shared);
    this._retry = new services.retry(target, credentials, shared);
    this._session = session ? this._sessionOf(loaded) : null;
  }

  /** The ledger session: on the framed socket of a daemon on this host, else the gRPC stream. */
  _sessionOf({ services, messageType }) {
    const options = {
      method: services.ledger.service.Session,
      metadata: () => this._connection.metadata(),
      maxMessageBytes: this._connection.channelOptions['grpc.max_send_message_length'],
      unary: (method, request, ms) => this._unary(this._ledger, method, request, ms),
    };
    const grpcSocket = localSocket(this.target);
    const helloType = grpcSocket === null ? null : helloOf(messageType);
    if (helloType !== null) {
      const maxReceiveBytes = this._connection.channelOptions['grpc.max_receive_message_length'];
      return new FramesSession({ ...options, grpcSocket, helloType, maxReceiveBytes });
    }
    return new Session({ ...options, stub: this._ledger });
  }

  /**
   * How the ledger's tool-call requests travel: 'frames' (the daemon's framed socket), 'session'
   * (the gRPC session stream) or 'unary' (the `session` option is false, the daemon answered the
   * stream UNIMPLEMENTED: an older daemon, or, for a while, it serves gRPC without its framed socket).
   */
  get transport() {
    return this._session ? this._session.transport : 'unary';
  }

  /** What `console.log` and `util.inspect` show: whether a token is set, never the token. */
  [inspect.custom]() {
    const token = this._connection.hasToken ? ", token: '<hidden>'" : '';
    return `Client { target: '${this.target}', namespace: '${this.namespace}', tls: ${this._connection.secure}${token} }`;
  }

  /** Ends the session (its stream or connection) and closes the channel; pending calls fail. */
  close() {
    this._session?.close();
    this._ledger.close();
  }

  /** One request; its error is an EffectdError. Sent again once the daemon is back when it was not sent (reconnect.js). */
  _call(stub, method, request, timeoutMs = this.timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    return this._send(stub, method, request, timeoutMs).catch((error) =>
      this._outage.again(error, (ms) => this._send(stub, method, request, ms), deadline),
    );
  }

  /** One try: on the session stream (its failures are gRPC-like errors) or unary. */
  _send(stub, method, request, timeoutMs) {
    if (this._session && stub === this._ledger && Object.hasOwn(FIELDS, method)) {
      return this._session.call(method, request, timeoutMs);
    }
    return this._unary(stub, method, request, timeoutMs);
  }

  /** One unary call; its error is an EffectdError. */
  _unary(stub, method, request, timeoutMs) {
    return new Promise((resolve, reject) => {
      const options = { deadline: Date.now() + timeoutMs };
      stub[method](request, this._connection.metadata(), options, (error, response) => {
        if (error) reject(fromServiceError(error));
        else resolve(response);
      });
    });
  }

  /** A recording request, sent again with the same attempt while it fails transiently. */
  async _record(stub, method, request, retry) {
    const policy = { ...this.recordingRetry, ...retry };
    const start = Date.now();
    for (let tries = 1; ; tries += 1) {
      const timeoutMs = Math.max(1, Math.min(this.timeoutMs, policy.deadlineMs - (Date.now() - start)));
      try {
        return await this._call(stub, method, request, timeoutMs);
      } catch (error) {
        const wait = recordingWait(policy, tries, error, Date.now() - start, Math.random());
        if (wait === null) throw error;
        policy.onRetry?.(error, wait);
        await new Promise((resolve) => setTimeout(resolve, wait));
      }
    }
  }

  _ref({ runId, callId }) {
    return { namespace: this.namespace, runId, callId };
  }

  // -- tool calls -------------------------------------------------------------

  _prepareRequest({
    runId,
    callId,
    tool,
    toolName = tool,
    input,
    effect = 'SIDE_EFFECT',
    requireApproval = false,
    start = false,
    leaseMs = 0,
    retry = false,
    channel = 'TOOL',
  }) {
    return {
      ref: this._ref({ runId, callId }),
      toolName,
      effect: c.enumIn('Effect', effect),
      input: c.payloadIn(input),
      requireApproval,
      start,
      leaseMs,
      retry,
      channel: c.enumIn('CallChannel', channel),
    };
  }

  /**
   * Records the call (or finds it) and returns the decision. With `start`, EXECUTE means this caller
   * holds the attempt; a READ or IDEMPOTENT_WRITE whose last attempt has an unknown outcome starts again
   * only with `retry`, under the daemon's retry rules (else INVALID_TRANSITION with
   * `metadata.retryRequired`, or the retry rule's refusal).
   *
   * `channel` ('TOOL', 'MCP', 'CHILD_FOREGROUND', 'DURABLE_BACKGROUND'; part of the call's identity) says how
   * the tool is reached; its retry rules apply (an MCP call of unknown outcome is never started again).
   *
   * @param {object} args {runId, callId, tool, input, effect = 'SIDE_EFFECT', requireApproval, start, leaseMs, retry,
   *   channel = 'TOOL'}
   * @returns {Promise<{decision: string, call: object, idempotencyKey: string, attemptHeld: boolean, retryRequired: boolean}>}
   */
  async prepareTool(args) {
    return preparedOut(await this._call(this._ledger, 'PrepareTool', this._prepareRequest(args)));
  }

  /** prepareTool for a batch of parallel calls, in one transaction; answers in order. */
  async prepareTools(calls) {
    const request = { calls: calls.map((call) => this._prepareRequest(call)) };
    const response = await this._call(this._ledger, 'PrepareTools', request);
    return response.results.map(preparedOut);
  }

  /** Starts a PREPARED call (or, with `retry`, retries a READ / IDEMPOTENT_WRITE one). */
  async startTool({ runId, callId, retry = false, leaseMs = 0, expectedRevision }) {
    const request = { ref: this._ref({ runId, callId }), retry, leaseMs, expectedRevision };
    const r = await this._call(this._ledger, 'StartTool', request);
    const decision = c.enumOut('Decision', r.decision);
    return {
      decision,
      call: c.toolCallOut(r.call),
      idempotencyKey: r.idempotencyKey,
      attemptHeld: decision === 'EXECUTE',
      retryRequired: false,
    };
  }

  /**
   * Commits the attempt's result: `result` (JSON value or Buffer) or, with
   * `errorCode`, an error result. With `acknowledge`, the result is also
   * marked delivered in the same transaction (the answer says `acknowledged`;
   * a daemon older than the option leaves it false).
   */
  async commitTool({
    runId,
    callId,
    attempt,
    result,
    errorCode = '',
    errorMessage = '',
    expectedRevision,
    acknowledge = false,
    retry,
  }) {
    const payload = result === undefined && errorCode ? null : c.payloadIn(result);
    const request = {
      ref: this._ref({ runId, callId }),
      attempt,
      result: {
        outcome: errorCode ? 'OUTCOME_ERROR' : 'OUTCOME_OK',
        payload,
        errorCode,
        errorMessage,
      },
      expectedRevision,
      acknowledge,
    };
    return c.toolCallOut((await this._record(this._ledger, 'CommitTool', request, retry)).call);
  }

  /** The attempt cannot know whether the tool ran: STARTED becomes UNKNOWN (retried like a commit). */
  async reportUnknown({ runId, callId, attempt, reason = '', retry }) {
    const request = { ref: this._ref({ runId, callId }), attempt, reason };
    return c.toolCallOut((await this._record(this._ledger, 'ReportUnknown', request, retry)).call);
  }

  /** Extends the lease of the attempt that holds the call (retried like a commit). */
  async heartbeat({ runId, callId, attempt, leaseMs = 0, retry }) {
    const request = { ref: this._ref({ runId, callId }), attempt, leaseMs };
    return c.toolCallOut((await this._record(this._ledger, 'Heartbeat', request, retry)).call);
  }

  /** Approves or rejects a call as seen at `expectedRevision` with `inputFingerprint`. */
  async decideApproval({ runId, callId, approve, approver, reason, expectedRevision, inputFingerprint }) {
    const request = {
      ref: this._ref({ runId, callId }),
      approve,
      approver,
      reason,
      expectedRevision,
      inputFingerprint,
    };
    return c.toolCallOut((await this._call(this._ledger, 'DecideApproval', request)).call);
  }

  /**
   * Resolves a STARTED or UNKNOWN call: `notExecuted: true`, or the result
   * found in the target system (`result`, or `errorCode` for an error result).
   */
  async reconcile({
    runId,
    callId,
    expectedRevision,
    operator,
    reason,
    evidence,
    result,
    errorCode = '',
    errorMessage = '',
    notExecuted = false,
    confirmedDeadAttempt = 0,
  }) {
    const request = {
      ref: this._ref({ runId, callId }),
      expectedRevision,
      operator,
      reason,
      evidence,
      confirmedDeadAttempt,
    };
    if (notExecuted) {
      request.notExecuted = true;
    } else {
      request.result = {
        outcome: errorCode ? 'OUTCOME_ERROR' : 'OUTCOME_OK',
        payload: result === undefined && errorCode ? null : c.payloadIn(result),
        errorCode,
        errorMessage,
      };
    }
    return c.toolCallOut((await this._call(this._ledger, 'Reconcile', request)).call);
  }

  /** One record with its history. */
  async getToolCall({ runId, callId }) {
    const request = { ref: this._ref({ runId, callId }) };
    return c.toolCallOut((await this._call(this._ledger, 'GetToolCall', request)).call);
  }

  /**
   * Every matching call (without history), following page tokens; with
   * `allNamespaces`, of every namespace the caller may see (a token's grants).
   */
  async *listToolCalls({ runId = '', states = [], pageSize = 0, allNamespaces = false } = {}) {
    let pageToken = '';
    do {
      const request = {
        // allNamespaces: every namespace the caller may see, so none is named.
        namespace: allNamespaces ? '' : this.namespace,
        runId,
        states: states.map((s) => c.enumIn('CallState', s)),
        pageSize,
        pageToken,
        allNamespaces,
      };
      const page = await this._call(this._ledger, 'ListToolCalls', request);
      for (const call of page.calls) yield c.toolCallOut(call);
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  // -- recovery ---------------------------------------------------------------

  /**
   * The plan of a crashed run: one item per call, in callId byte order, read
   * page by page (`pageSize` 1..1000 calls per answer); nothing is executed.
   */
  async recover({ runId, pageSize = RECOVER_PAGE_SIZE }) {
    const plan = { items: [], interrupted: false, settled: 0 };
    for await (const page of this.recoverPages({ runId, pageSize })) {
      plan.items.push(...page.items);
      plan.interrupted ||= page.interrupted;
      plan.settled += page.settled;
    }
    return plan;
  }

  /**
   * The plan of a crashed run one page at a time; a page is `interrupted`
   * when one of its own calls interrupts the run.
   */
  async *recoverPages({ runId, pageSize = RECOVER_PAGE_SIZE }) {
    let pageToken = '';
    do {
      const request = { namespace: this.namespace, runId, pageSize, pageToken };
      const r = await this._call(this._recovery, 'Recover', request);
      yield { items: r.items.map(c.recoveryItemOut), interrupted: r.interrupted, settled: r.settled };
      pageToken = r.nextPageToken;
    } while (pageToken);
  }

  /** Marks committed results as delivered to the transcript (retried like a commit); returns the records. */
  async acknowledgeRecovery({ runId, callIds, retry }) {
    const request = { namespace: this.namespace, runId, callIds };
    const r = await this._record(this._recovery, 'AcknowledgeRecovery', request, retry);
    return r.calls.map(c.toolCallOut);
  }

  // -- retry decisions --------------------------------------------------------

  /**
   * Whether a failed attempt may be retried. A denial is an answer
   * (`allow: false` with its `reason`), not an error.
   *
   * @param {object} args {call: {runId, callId}} or {facts: {effect, state, idempotencyKey, toolName}},
   *   plus context ('TOOL', 'MCP', ...), error {kind, retryable, code, message},
   *   attemptsUsed, deadline (Date), maxAttempts.
   */
  async decideRetry({ call, facts, context, error = {}, attemptsUsed = 0, deadline, maxAttempts = 0 }) {
    const request = {
      context: c.enumIn('RetryContext', context),
      error: {
        kind: c.enumIn('FailureKind', error.kind ?? 'UNSPECIFIED'),
        retryable: Boolean(error.retryable),
        code: error.code ?? '',
        message: error.message ?? '',
      },
      attemptsUsed,
      deadline: c.timestampIn(deadline),
      maxAttempts,
    };
    if (call) request.call = this._ref(call);
    if (facts) {
      request.facts = {
        effect: c.enumIn('Effect', facts.effect ?? 'UNSPECIFIED'),
        state: c.enumIn('CallState', facts.state),
        idempotencyKey: facts.idempotencyKey ?? '',
        toolName: facts.toolName ?? '',
      };
    }
    const r = await this._call(this._retry, 'DecideRetry', request);
    return {
      allow: r.allow,
      reason: r.reason === 'ERROR_REASON_UNSPECIFIED' ? '' : r.reason,
      message: r.message,
      backoffMs: r.backoffMs,
      effect: c.enumOut('Effect', r.effect),
      maxAttempts: r.maxAttempts,
      attemptsUsed: r.attemptsUsed,
      idempotencyKey: r.idempotencyKey,
    };
  }

  // -- checkpoints ------------------------------------------------------------

  /** The checkpoint {key, value: Buffer, revision, updatedAt}, or null when absent. */
  async getCheckpoint(key) {
    try {
      const r = await this._call(this._checkpoints, 'Get', { namespace: this.namespace, key });
      return c.checkpointOut(r.checkpoint);
    } catch (error) {
      if (error.reason === 'NOT_FOUND') return null;
      throw error;
    }
  }

  /**
   * Writes `key` if it is at `expectedRevision`, or, when that is omitted,
   * if it is absent. `value`: a Buffer, a string (UTF-8) or a JSON value.
   * Returns the new revision.
   */
  async putCheckpoint(key, value, { expectedRevision } = {}) {
    const request = { namespace: this.namespace, key, value: c.bytesIn(value) };
    if (expectedRevision === undefined || expectedRevision === null) request.expectAbsent = true;
    else request.expectedRevision = expectedRevision;
    return (await this._call(this._checkpoints, 'Put', request)).revision;
  }

  /** Deletes `key` if it is at `expectedRevision`. */
  async deleteCheckpoint(key, expectedRevision) {
    const request = { namespace: this.namespace, key, expectedRevision };
    await this._call(this._checkpoints, 'Delete', request);
  }

  /**
   * Compares, then puts and deletes, all or nothing. Returns the revision of
   * the puts.
   *
   * @param {object} txn
   * @param {({key: string, revision: number} | {key: string, absent: true})[]} txn.compares
   * @param {({put: {key: string, value: any}} | {delete: {key: string}})[]} txn.ops
   */
  async checkpointTxn({ compares = [], ops = [] }) {
    const request = {
      namespace: this.namespace,
      compares: compares.map((cmp) =>
        cmp.absent ? { key: cmp.key, absent: true } : { key: cmp.key, revision: cmp.revision },
      ),
      ops: ops.map((op) =>
        op.put ? { put: { key: op.put.key, value: c.bytesIn(op.put.value) } } : { delete: { key: op.delete.key } },
      ),
    };
    return (await this._call(this._checkpoints, 'Txn', request)).revision;
  }

  /** Every checkpoint under `prefix`, in key order, following page tokens. */
  async *listCheckpoints({ prefix = '', keysOnly = false, pageSize = 0 } = {}) {
    let pageToken = '';
    do {
      const request = { namespace: this.namespace, prefix, pageSize, pageToken, keysOnly };
      const page = await this._call(this._checkpoints, 'List', request);
      for (const cp of page.checkpoints) yield c.checkpointOut(cp);
      pageToken = page.nextPageToken;
    } while (pageToken);
  }
}

/** SessionHello's type, or null for protos older than the framed transport (the gRPC stream then). */
function helloOf(messageType) {
  try {
    return messageType('SessionHello');
  } catch {
    return null;
  }
}

function preparedOut(r) {
  return {
    decision: c.enumOut('Decision', r.decision),
    call: c.toolCallOut(r.call),
    idempotencyKey: r.idempotencyKey,
    attemptHeld: r.attemptHeld,
    retryRequired: r.retryRequired,
  };
}

module.exports = { Client, DEFAULT_TARGET, DEFAULT_RECORDING_RETRY, SESSION_ENV, recordingWait, transient };
