'use strict';
/**
 * Waiting for the daemon: a request the client knows it did not send is sent again once the daemon
 * is back, within the call's deadline. The same rules as the Python client's
 * `effectd_client._reconnect`.
 *
 * A request is known not sent (or not applied) when its call failed with
 *
 *   the session stream broken before the message was  -> UNAVAILABLE, mayHaveBeenApplied 'false'
 *     sent, or a stream that found no connection
 *   a unary call that found no connection              -> UNAVAILABLE, grpc-js's 'No connection
 *                                                         established'
 *   the daemon stopping, before it served the request  -> SHUTTING_DOWN
 *
 * and only then: a request that may have reached the daemon (a stream that broke after it took the
 * message, a unary call whose connection broke, a deadline) keeps its failure, whose outcome is
 * unknown; the recording requests are sent again after those by their own retries
 * (`recordingRetry`), which wait here too between their tries. The daemon's STORAGE_UNAVAILABLE is
 * its own to retry.
 *
 * Such a request waits with exponential backoff (half of it jittered) for at most the client's
 * `reconnectWaitMs` from its first failure, and never past the call's own deadline; then it fails
 * UNAVAILABLE, saying the daemon did not come back (still not sent). The first request of an outage
 * emits one process warning (code `EFFECTD_DAEMON_AWAY`); the outage ends when a waiting request
 * gets through, or when the last one waiting gives up.
 */

const { EffectdError, fromServiceError } = require('./errors');
const { MAY_HAVE_BEEN_APPLIED, NO_CONNECTION } = require('./session-wire');

/** How long a request known not sent waits for the daemon, by default. */
const DEFAULT_RECONNECT_WAIT_MS = 5_000;
/** The code of the process warning an outage emits. */
const WARNING_CODE = 'EFFECTD_DAEMON_AWAY';
// The first wait between two tries, doubling up to the largest: the client's channel itself tries
// to connect at least every second (connection.js).
const INITIAL_BACKOFF_MS = 50;
const MAX_BACKOFF_MS = 500;

/** Whether the failed call's request is known not to have reached the daemon, or to have been turned away unserved. */
function notSent(error) {
  if (!(error instanceof EffectdError) || error.code !== 'UNAVAILABLE') return false;
  if (error.reason === 'SHUTTING_DOWN') return true;
  if (error.reason) return false;
  if (error.metadata[MAY_HAVE_BEEN_APPLIED] === 'false') return true;
  return Object.keys(error.metadata).length === 0 && String(error.details).includes(NO_CONNECTION);
}

/** Milliseconds to wait after try `tries`: `initialMs` doubling up to `maxMs`, half of it jittered. */
// grpc-js's account of a deadline reached while the call still waited for a connection (no stream
// on one yet); a call that had a stream names its remote_addr.
const WAITING_FOR_A_CONNECTION = /Waiting for LB pick|waiting for name resolution|waiting for metadata filters/;

/**
 * A try cut by its own deadline before it had a stream on a connection: never written to one, so
 * not sent either. Only a try of `Outage.again`, whose deadline is the call's: a call's first
 * DEADLINE_EXCEEDED stays what it is.
 */
function cutBeforeSent(error) {
  if (!(error instanceof EffectdError) || error.code !== 'DEADLINE_EXCEEDED') return false;
  const details = String(error.details);
  return WAITING_FOR_A_CONNECTION.test(details) && !details.includes('remote_addr=');
}

function backoffMs(tries, initialMs, maxMs, jitter) {
  const full = Math.min(maxMs, initialMs * 2 ** (tries - 1));
  return full / 2 + (jitter * full) / 2;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The waits of one client for its daemon: how many requests wait, and whether this outage was told. */
class Outage {
  constructor(target, waitMs) {
    if (typeof waitMs !== 'number' || !(waitMs >= 0)) {
      throw new TypeError('reconnectWaitMs: must be a number, 0 or more');
    }
    this.target = target;
    this.waitMs = waitMs;
    this._waiting = 0;
    this._told = false;
  }

  /**
   * The answer of `send(timeoutMs)`, sent again while its request is not sent, after `error` (its
   * first failure); the call's deadline is `deadline` (a `Date.now()` value). Throws the failure
   * of a request that may have been sent, or UNAVAILABLE when the daemon did not come back.
   */
  async again(error, send, deadline) {
    let failure = fromServiceError(error);
    if (this.waitMs <= 0 || !notSent(failure)) throw failure;
    const began = Date.now();
    const end = Math.min(began + this.waitMs, deadline);
    this._begin(failure, end - began);
    let back = false;
    try {
      for (let tries = 1; ; tries += 1) {
        const left = end - Date.now();
        if (left <= 0) throw this._gaveUp(began, failure);
        await sleep(Math.min(left, backoffMs(tries, INITIAL_BACKOFF_MS, MAX_BACKOFF_MS, Math.random())));
        const timeoutMs = deadline - Date.now();
        if (timeoutMs <= 0) throw this._gaveUp(began, failure);
        try {
          const answer = await send(timeoutMs);
          back = true;
          return answer;
        } catch (next) {
          failure = fromServiceError(next);
          if (!notSent(failure) && !cutBeforeSent(failure)) throw failure;
        }
      }
    } finally {
      this._end(back);
    }
  }

  _begin(failure, waitMs) {
    this._waiting += 1;
    if (this._told) return;
    this._told = true;
    process.emitWarning(
      `effectd: waiting up to ${(waitMs / 1000).toFixed(1)} s for the daemon at ${this.target} to come back ` +
        `(${failure.message}); requests not sent are sent once it serves`,
      { type: 'EffectdWarning', code: WARNING_CODE },
    );
  }

  _end(back) {
    this._waiting -= 1;
    if (back || !this._waiting) this._told = false;
  }

  _gaveUp(began, last) {
    const waited = ((Date.now() - began) / 1000).toFixed(1);
    return new EffectdError({
      code: 'UNAVAILABLE',
      message: `the daemon at ${this.target} did not come back within ${waited} s; the request was not sent (last: ${last.details})`,
      metadata: { [MAY_HAVE_BEEN_APPLIED]: 'false' },
      cause: last,
    });
  }
}

module.exports = { Outage, notSent, cutBeforeSent, backoffMs, DEFAULT_RECONNECT_WAIT_MS, WARNING_CODE };
