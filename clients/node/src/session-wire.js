'use strict';
/**
 * What the ledger session shares whichever way its messages travel (the gRPC
 * stream, session.js; the daemon's framed socket, frames.js), free of I/O:
 * the message kinds, and the @grpc/grpc-js-like errors ({code, details,
 * metadata} with the `grpc-status-details-bin` trailer of the unary call) that
 * a session fails its calls with, so that the client translates them at its one
 * boundary (`fromServiceError`) and a refusal reads the same whichever way it
 * came. The same as the Python client's `effectd_client._session_wire`.
 */

const grpc = require('@grpc/grpc-js');
const { statusTypes } = require('./proto');

/** The unary RPC of each message kind, and its field in SessionRequest / SessionResponse. */
const FIELDS = Object.freeze({
  PrepareTool: 'prepareTool',
  PrepareTools: 'prepareTools',
  StartTool: 'startTool',
  CommitTool: 'commitTool',
  ReportUnknown: 'reportUnknown',
  Heartbeat: 'heartbeat',
  GetToolCall: 'getToolCall',
});

/** The ErrorInfo metadata key of a message whose stream broke. */
const MAY_HAVE_BEEN_APPLIED = 'mayHaveBeenApplied';
const DETAILS_KEY = 'grpc-status-details-bin';
const ERROR_INFO_URL = 'type.googleapis.com/google.rpc.ErrorInfo';

/**
 * How @grpc/grpc-js says that a call found no connection (its load balancer's pick failed): nothing
 * of it reached the daemon. A call it had sent ends otherwise ('read ECONNRESET', 'Connection
 * dropped'), and one it never put on the wire grpc-js sends again itself before it fails it so. The
 * framed session says it in the same words when its socket refused the connection.
 */
const NO_CONNECTION = 'No connection established';

/** Whether a call (unary or stream) failed before it had a connection. */
function neverConnected(error) {
  return Boolean(error) && error.code === grpc.status.UNAVAILABLE && String(error.details ?? '').includes(NO_CONNECTION);
}

/** A gRPC-like error of status `status` ({code, message, details: [Any]}). */
function statusError(status) {
  const metadata = new grpc.Metadata();
  if (status.details && status.details.length) {
    metadata.set(DETAILS_KEY, Buffer.from(statusTypes().Status.encode(status).finish()));
  }
  const name = grpc.status[status.code] ?? String(status.code);
  return Object.assign(new Error(`${status.code} ${name}: ${status.message}`), {
    code: status.code,
    details: status.message,
    metadata,
  });
}

/** A failure made by the client, with ErrorInfo `metadata` (domain effectd, no reason) when given. */
function failure(code, message, metadata) {
  const details = [];
  if (metadata) {
    const types = statusTypes();
    details.push({
      type_url: ERROR_INFO_URL,
      value: Buffer.from(types.ErrorInfo.encode({ reason: '', domain: 'effectd', metadata }).finish()),
    });
  }
  return statusError({ code, message, details });
}

/** The stream broke with the message in flight: UNAVAILABLE, and whether the daemon may have applied it. */
function broken(applied, why) {
  const said = applied ? 'may have been applied' : 'was not sent';
  return failure(grpc.status.UNAVAILABLE, `the session stream broke (${why}); the request ${said}`, {
    [MAY_HAVE_BEEN_APPLIED]: applied ? 'true' : 'false',
  });
}

function deadlineExceeded() {
  return failure(grpc.status.DEADLINE_EXCEEDED, 'Deadline Exceeded');
}

function closed() {
  return failure(grpc.status.CANCELLED, 'the client was closed');
}

/** A broken stream's cause, for the message of its messages' failures. */
function describe(status) {
  if (!status) return 'it ended';
  return `${grpc.status[status.code] ?? status.code}: ${status.details}`;
}

module.exports = {
  FIELDS,
  MAY_HAVE_BEEN_APPLIED,
  NO_CONNECTION,
  neverConnected,
  statusError,
  failure,
  broken,
  deadlineExceeded,
  closed,
  describe,
};
