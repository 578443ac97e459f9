'use strict';
/**
 * The ledger session stream (`ToolLedger.Session`): one long-lived duplex
 * stream per client that carries the requests of PrepareTool, PrepareTools,
 * StartTool, CommitTool, ReportUnknown, Heartbeat and GetToolCall as
 * messages, many in flight at once, each answered as soon as it is done (not
 * in the order sent).
 *
 * Every failure is a @grpc/grpc-js-like error ({code, details, metadata} with
 * the `grpc-status-details-bin` trailer of the unary call), so the client
 * translates it at the same boundary and a refusal looks the same whichever
 * way it came:
 *
 *   the daemon's answer `error` (google.rpc.Status) -> that status, as sent
 *   the caller's wait passed                         -> DEADLINE_EXCEEDED (a
 *                                                       `cancel` is sent)
 *   the stream broke after the message was sent      -> UNAVAILABLE,
 *                                                       mayHaveBeenApplied=true
 *     ... by the daemon stopping (SHUTTING_DOWN, once  -> mayHaveBeenApplied=false
 *     every message it read is answered)
 *   the stream broke before it, twice, or found no   -> UNAVAILABLE,
 *     connection to the daemon                          mayHaveBeenApplied=false
 *   the client was closed                            -> CANCELLED
 *
 * A message is "sent" once it is handed to the stream; one still queued in
 * this client (the stream was not writable: gRPC flow control) is sent again
 * once on a new stream when its stream breaks: it cannot have been applied.
 * A stream that found no connection (`neverConnected`: gRPC never sent it)
 * sent none of its messages, whatever was handed to it: they fail at once as
 * not sent, and the client waits for the daemon (reconnect.js).
 * The next message after a break opens a new stream. A daemon that answers
 * the stream UNIMPLEMENTED before answering anything (one older than the
 * session; PERMISSION_DENIED if it requires tokens) is asked by the unary
 * RPCs, for the client's life: the messages in flight then go as unary calls
 * (the daemon applied none of them). A stream refused UNAUTHENTICATED fails
 * its messages alike (the next call tries a stream again). A stream refused
 * for lack of room (RESOURCE_EXHAUSTED, CONCURRENCY_LIMITED or RATE_LIMITED)
 * served none of its messages either: they go as unary calls, and so does
 * every call for the pause the refusal names (1 s when it names none). A stream whose
 * end says for how long to ask the unary RPCs instead (`unaryForMs`: the
 * framed session's, frames.js, that found the daemon serving gRPC without its
 * framed socket) served nothing either: its messages, and every call for that
 * long, go as unary calls; then a stream is tried again.
 *
 * An idle stream (nothing in flight for `idleMs`) is ended, so that an open
 * stream never keeps the process alive for long after its last answer.
 */

const grpc = require('@grpc/grpc-js');
const { fromServiceError } = require('./errors');
const {
  FIELDS,
  neverConnected,
  statusError,
  failure,
  broken,
  deadlineExceeded,
  closed,
  describe,
} = require('./session-wire');

const MAX_TIMEOUT_MS = 2 ** 32 - 1;
/** Sends of one message on a new stream after its stream broke before it was sent. */
const RESENDS = 1;
/** An idle stream is ended after this long. */
const DEFAULT_IDLE_MS = 5_000;

/**
 * Statuses of a stream that served nothing and never will for this client: a
 * daemon older than the session (UNIMPLEMENTED; PERMISSION_DENIED when it
 * requires tokens, as it refuses every method it does not know), or a
 * credential that may call none of the session's messages.
 */
const UNSERVED = [grpc.status.UNIMPLEMENTED, grpc.status.PERMISSION_DENIED];
/** A stream refused before it served anything, for its credential: each message is refused alike. */
const REFUSALS = [grpc.status.UNAUTHENTICATED];
/**
 * The reasons of a daemon with no room for another stream (its admission refused it whole): a
 * RESOURCE_EXHAUSTED that names none of them is grpc-js's own (an answer over the client's size
 * limit), which may end a stream whose messages were applied.
 */
const NO_ROOM = new Set(['CONCURRENCY_LIMITED', 'RATE_LIMITED']);
/** How long messages go as unary calls after a daemon had no room for a stream, unless it says (RetryInfo). */
const FULL_PAUSE_MS = 1_000;

const identity = (buffer) => buffer;

class Session {
  /**
   * @param {object} options
   * @param {object} options.stub the ToolLedger stub (its channel carries the stream).
   * @param {object} options.method the Session method's definition (path, serializers).
   * @param {() => grpc.Metadata} options.metadata the metadata the stream is opened with.
   * @param {number} options.maxMessageBytes larger requests fail alone, before they are sent.
   * @param {(method: string, request: object, timeoutMs: number) => Promise<object>} options.unary
   *   asks the unary RPC: used for the client's life once the daemon answers UNIMPLEMENTED.
   * @param {number} [options.idleMs] an idle stream is ended after this long.
   * @param {string} [options.transport] what `transport` says while the session serves.
   */
  constructor({ stub, method, metadata, maxMessageBytes, unary, idleMs = DEFAULT_IDLE_MS, transport = 'session' }) {
    this._stub = stub;
    this._path = method.path;
    this._serialize = method.requestSerialize;
    this._deserialize = method.responseDeserialize;
    this._metadata = metadata;
    this._maxMessageBytes = maxMessageBytes;
    this._unary = unary;
    this._idleMs = idleMs;
    this._nextId = 1;
    /** id -> entry: {id, method, request, timeoutMs, deadline, resolve, reject, timer, stream, sent, resends}. */
    this._pending = new Map();
    this._stream = null; // {call, queue: entry[], answered: boolean, writable: boolean}
    this._idleTimer = null;
    this._closed = false;
    /** True once the daemon would not serve the stream: every call is unary from then on. */
    this.unserved = false;
    /** Until this time (a `Date.now()` value) every call is unary. */
    this._unaryUntil = 0;
    this._transport = transport;
    /** Streams opened so far. */
    this.streamsOpened = 0;
  }

  /** How the calls travel now: the session's own way, or 'unary' (not served, or for a while). */
  get transport() {
    return this.unserved || Date.now() < this._unaryUntil ? 'unary' : this._transport;
  }

  /** The answer to `request`, the request of the unary RPC `method`, within `timeoutMs`. */
  call(method, request, timeoutMs) {
    if (this.unserved || Date.now() < this._unaryUntil) return this._unary(method, request, timeoutMs);
    if (this._closed) return Promise.reject(closed());
    const field = FIELDS[method];
    const id = this._nextId;
    this._nextId += 1;
    const message = { id, timeoutMs: Math.max(1, Math.min(MAX_TIMEOUT_MS, Math.ceil(timeoutMs))), [field]: request };
    let bytes;
    try {
      bytes = this._serialize(message);
    } catch (error) {
      return Promise.reject(error);
    }
    if (bytes.length > this._maxMessageBytes) {
      // As grpc-js refuses a unary request that is too large: before sending, this message alone.
      return Promise.reject(
        failure(
          grpc.status.RESOURCE_EXHAUSTED,
          `Sent message larger than max (${bytes.length} vs. ${this._maxMessageBytes})`,
        ),
      );
    }
    return new Promise((resolve, reject) => {
      const entry = {
        id,
        method,
        field,
        request,
        bytes,
        timeoutMs,
        deadline: Date.now() + timeoutMs,
        resolve,
        reject,
        timer: null,
        stream: null,
        sent: false,
        resends: 0,
      };
      entry.timer = setTimeout(() => this._expire(entry), timeoutMs);
      this._pending.set(id, entry);
      this._enqueue(entry);
    });
  }

  /** Queues `entry` on the current stream, opening one if there is none. */
  _enqueue(entry) {
    this._clearIdle();
    let stream;
    try {
      stream = this._stream ?? this._open();
    } catch (error) {
      this._settle(entry, error);
      return;
    }
    entry.stream = stream;
    stream.queue.push(entry);
    this._flush(stream);
  }

  /** Ends the stream; what is in flight fails CANCELLED. New calls fail the same. */
  close() {
    this._closed = true;
    this._clearIdle();
    for (const entry of [...this._pending.values()]) this._settle(entry, closed());
    const stream = this._stream;
    this._stream = null;
    if (stream) {
      stream.call.end();
      stream.call.cancel();
    }
  }

  // -- the stream ---------------------------------------------------------------

  _open() {
    const call = this._stub.makeBidiStreamRequest(this._path, identity, this._deserialize, this._metadata());
    const stream = { call, queue: [], answered: false, writable: true, done: false };
    this.streamsOpened += 1;
    let error = null;
    call.on('data', (answer) => this._answer(stream, answer));
    call.on('error', (e) => {
      error = e;
    });
    call.on('drain', () => {
      stream.writable = true;
      this._flush(stream);
    });
    call.on('status', (status) => this._ended(stream, status.code === grpc.status.OK ? null : (error ?? status)));
    this._stream = stream;
    return stream;
  }

  _flush(stream) {
    while (stream.writable && !stream.done && stream.queue.length) {
      const entry = stream.queue.shift();
      if (this._pending.get(entry.id) !== entry) continue; // expired while queued
      entry.sent = true;
      try {
        stream.writable = stream.call.write(entry.bytes);
      } catch {
        // The stream is ending: its status settles the message.
        stream.writable = false;
      }
    }
  }

  _answer(stream, answer) {
    stream.answered = true;
    const entry = this._pending.get(answer.id);
    if (!entry || entry.stream !== stream) return; // its caller stopped waiting
    if (answer.response === 'error') {
      this._settle(entry, statusError(answer.error));
    } else if (answer.response === entry.field) {
      this._settle(entry, null, answer[entry.field]);
    } else {
      this._settle(
        entry,
        failure(grpc.status.INTERNAL, `the daemon answered ${entry.method} with ${answer.response || 'nothing'}`),
      );
    }
    this._idleCheck(stream);
  }

  /** The stream ended: by an error status, or OK (the daemon stopped, or an idle stream we ended). */
  _ended(stream, error) {
    stream.done = true;
    if (this._stream === stream) this._stream = null;
    const mine = [...this._pending.values()].filter((e) => e.stream === stream);
    if (error && error.unaryForMs > 0 && !stream.answered) {
      // The daemon serves the RPCs, not this way, for now: the stream took nothing.
      this._unaryUntil = Date.now() + error.unaryForMs;
      this._byUnary(mine);
      return;
    }
    if (!mine.length) return;
    const noRoom = error && error.code === grpc.status.RESOURCE_EXHAUSTED && !stream.answered ? fromServiceError(error) : null;
    if (noRoom && NO_ROOM.has(noRoom.reason)) {
      // The daemon had no room for another stream: its messages go as unary calls, each holding a
      // slot only while it is served, for the pause the refusal names, then a stream again.
      this._unaryUntil = Date.now() + (noRoom.retryDelayMs ?? FULL_PAUSE_MS);
      this._byUnary(mine);
      return;
    }
    if (error && UNSERVED.includes(error.code) && !stream.answered) {
      // A daemon older than the session (with tokens it refuses a method it
      // does not know), or a credential that may call none of its messages:
      // the stream served nothing, and each unary call answers for itself.
      this.unserved = true;
      this._clearIdle();
      this._byUnary(mine);
      return;
    }
    if (error && REFUSALS.includes(error.code) && !stream.answered) {
      // The stream was refused before anything was served (the credential):
      // each message is refused as its unary call would be.
      for (const entry of mine) this._settle(entry, error);
      return;
    }
    const why = describe(error);
    // A stream that never connected took nothing; a new one at once would find no connection either.
    const connected = !neverConnected(error);
    // The daemon ends a stream as it stops once every message it read is answered: one sent and
    // unanswered then was never read (docs/contract.md §12).
    const read = !(error && error.code === grpc.status.UNAVAILABLE && fromServiceError(error).reason === 'SHUTTING_DOWN');
    const again = [];
    for (const entry of mine) {
      if (entry.sent && connected) this._settle(entry, broken(read, why));
      else if (entry.resends >= RESENDS || this._closed || !connected) this._settle(entry, broken(false, why));
      else again.push(entry);
    }
    for (const entry of again) {
      entry.resends += 1;
      this._enqueue(entry);
    }
  }

  /** Asks the unary RPC of each of `entries`, none of which the daemon served, within its deadline. */
  _byUnary(entries) {
    for (const entry of entries) {
      this._forget(entry);
      const left = Math.max(1, entry.deadline - Date.now());
      this._unary(entry.method, entry.request, left).then(entry.resolve, entry.reject);
    }
  }

  // -- one message --------------------------------------------------------------

  /** The caller's wait passed: cancel the message if it was sent, and fail it. */
  _expire(entry) {
    if (this._pending.get(entry.id) !== entry) return;
    const stream = entry.stream;
    this._settle(entry, deadlineExceeded());
    if (entry.sent && stream && !stream.done) {
      try {
        stream.call.write(this._serialize({ id: entry.id, cancel: {} }));
      } catch {
        // The stream is ending: the daemon cancels what it had in flight.
      }
    }
    if (stream) this._idleCheck(stream);
  }

  _forget(entry) {
    clearTimeout(entry.timer);
    this._pending.delete(entry.id);
  }

  _settle(entry, error, value) {
    if (this._pending.get(entry.id) !== entry) return;
    this._forget(entry);
    if (error) entry.reject(error);
    else entry.resolve(value);
  }

  // -- idleness -----------------------------------------------------------------

  _idleCheck(stream) {
    if (this._stream !== stream || this._pending.size || this._idleTimer) return;
    this._idleTimer = setTimeout(() => {
      this._idleTimer = null;
      if (this._stream === stream && !this._pending.size) {
        this._stream = null;
        stream.call.end();
      }
    }, this._idleMs);
    this._idleTimer.unref();
  }

  _clearIdle() {
    if (this._idleTimer) {
      clearTimeout(this._idleTimer);
      this._idleTimer = null;
    }
  }
}

module.exports = { Session, DEFAULT_IDLE_MS, NO_ROOM };
