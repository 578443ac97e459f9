'use strict';
/**
 * Refusals from the daemon, translated at one boundary (`fromServiceError`).
 *
 *   Error
 *   └── EffectdError            code (gRPC status name), reason, metadata, violations,
 *       │                       retryDelayMs (google.rpc.RetryInfo, when sent)
 *       └── one class per ErrorReason value, e.g. errors.INPUT_MISMATCH
 *           (InputMismatchError), generated from errors.proto at load time
 *
 * Match on the class or on `reason`, never on the message text. A status
 * without effectd's ErrorInfo (a connection failure, a deadline) is a plain
 * EffectdError with `reason === ''`.
 */

const grpc = require('@grpc/grpc-js');
const { load, statusTypes } = require('./proto');

const DOMAIN = 'effectd';
const DETAILS_KEY = 'grpc-status-details-bin';
const ERROR_INFO_URL = 'type.googleapis.com/google.rpc.ErrorInfo';
const BAD_REQUEST_URL = 'type.googleapis.com/google.rpc.BadRequest';
const RETRY_INFO_URL = 'type.googleapis.com/google.rpc.RetryInfo';

class EffectdError extends Error {
  /**
   * @param {object} fields
   * @param {string} fields.code gRPC status name, e.g. 'FAILED_PRECONDITION'.
   * @param {string} fields.reason ErrorReason name, e.g. 'INPUT_MISMATCH'; '' if none.
   * @param {string} fields.message the daemon's explanation (not for matching).
   * @param {Record<string, string>} [fields.metadata] ErrorInfo metadata.
   * @param {{field: string, description: string}[]} [fields.violations] BadRequest field violations.
   * @param {number|null} [fields.retryDelayMs] google.rpc.RetryInfo: when to try again, if known.
   * @param {Error} [fields.cause] the @grpc/grpc-js error.
   */
  constructor({ code, reason = '', message = '', metadata = {}, violations = [], retryDelayMs = null, cause }) {
    super(`${reason || code}: ${message}`, cause ? { cause } : undefined);
    this.name = new.target.name;
    this.code = code;
    this.reason = reason;
    this.details = message;
    this.metadata = metadata;
    this.violations = violations;
    this.retryDelayMs = retryDelayMs;
  }
}

/** 'INPUT_MISMATCH' -> 'InputMismatchError'. */
function className(reason) {
  const words = reason.toLowerCase().split('_');
  return `${words.map((w) => w[0].toUpperCase() + w.slice(1)).join('')}Error`;
}

function reasonClass(reason) {
  // A computed key gives the class its name, so stack traces show it.
  const cls = {
    [className(reason)]: class extends EffectdError {},
  }[className(reason)];
  Object.defineProperty(cls, 'reason', { value: reason, enumerable: true });
  return cls;
}

/** One EffectdError subclass per ErrorReason value of the protos. */
const errors = Object.freeze(
  Object.fromEntries(
    load()
      .enums.ErrorReason.filter((reason) => reason !== 'ERROR_REASON_UNSPECIFIED')
      .map((reason) => [reason, reasonClass(reason)]),
  ),
);

// REVISION_CONFLICT carries the revision found ('0' when absent) as metadata.
Object.defineProperty(errors.REVISION_CONFLICT.prototype, 'currentRevision', {
  get() {
    return this.metadata.currentRevision === undefined ? undefined : Number(this.metadata.currentRevision);
  },
});

// The codes that mean exactly one ErrorReason, whoever sent them.
const REASON_OF_CODE = ['UNAUTHENTICATED', 'PERMISSION_DENIED'];

function decodeDetails(metadata) {
  const found = { reason: '', metadata: {}, violations: [], retryDelayMs: null };
  const values = metadata && typeof metadata.get === 'function' ? metadata.get(DETAILS_KEY) : [];
  if (!values.length) return found;
  const types = statusTypes();
  let status;
  try {
    status = types.Status.decode(values[0]);
  } catch {
    return found; // An undecodable trailer leaves the plain status.
  }
  for (const detail of status.details) {
    // protobufjs's bundled google.protobuf.Any keeps the snake_case name.
    const url = detail.type_url ?? detail.typeUrl;
    if (url === ERROR_INFO_URL) {
      const info = types.ErrorInfo.decode(detail.value);
      if (info.domain === DOMAIN) {
        found.reason = info.reason;
        found.metadata = { ...info.metadata };
      }
    } else if (url === BAD_REQUEST_URL) {
      const bad = types.BadRequest.decode(detail.value);
      found.violations = bad.fieldViolations.map((v) => ({
        field: v.field,
        description: v.description,
      }));
    } else if (url === RETRY_INFO_URL) {
      const delay = types.RetryInfo.decode(detail.value).retryDelay;
      if (delay) found.retryDelayMs = Number(delay.seconds) * 1000 + Math.floor(delay.nanos / 1e6);
    }
  }
  return found;
}

/** The EffectdError (subclass) for an error of @grpc/grpc-js. */
function fromServiceError(error) {
  if (error instanceof EffectdError) return error;
  const code = typeof error.code === 'number' ? grpc.status[error.code] || String(error.code) : 'UNKNOWN';
  const details = decodeDetails(error.metadata);
  const { metadata, violations, retryDelayMs } = details;
  // A refusal made before the daemon's error table (a proxy, a transport
  // check) still names its one possible reason.
  const reason = details.reason || (REASON_OF_CODE.includes(code) ? code : '');
  const Cls = Object.hasOwn(errors, reason) ? errors[reason] : EffectdError;
  return new Cls({
    code,
    reason,
    message: error.details ?? error.message ?? '',
    metadata,
    violations,
    retryDelayMs,
    cause: error,
  });
}

module.exports = { EffectdError, errors, fromServiceError, className };
