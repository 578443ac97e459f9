'use strict';
/**
 * How the client reaches the daemon: channel credentials (plaintext on the
 * local socket, or TLS), the one message-size limit, and the bearer token
 * sent with every call. The same rules as the Python client's
 * `effectd_client._channel`.
 *
 * The token travels as `authorization: Bearer <token>` call metadata, not as
 * call credentials: grpc-js refuses call credentials on an insecure channel,
 * and the default transport, a Unix socket, is one.
 */

const grpc = require('@grpc/grpc-js');

/** The daemon's default message limit (`--max-message-size`), both directions. */
const DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024;
/** Read when no `token` option is given. */
const TOKEN_ENV = 'EFFECTD_TOKEN';

// RFC 6750 b64token characters are a subset: visible ASCII, no spaces.
const SENDABLE = /^[\x21-\x7e]+$/;

function isPem(value) {
  return value === undefined || value === null || Buffer.isBuffer(value);
}

/**
 * The channel credentials of the `tls` and `credentials` options.
 *
 * `tls: true` or `tls: {}` verifies the daemon against the system roots;
 * `tls: { ca }` against `ca`; `cert` and `key` (mutual TLS) come together.
 */
function channelCredentials(tls, credentials) {
  if (tls === undefined || tls === null || tls === false) {
    return credentials ?? grpc.credentials.createInsecure();
  }
  if (credentials !== undefined) {
    throw new TypeError('tls and credentials: give one or the other');
  }
  const { ca = null, cert = null, key = null } = tls === true ? {} : tls;
  if (![ca, cert, key].every(isPem)) {
    throw new TypeError('tls: ca, cert and key must be Buffers of PEM');
  }
  if ((cert === null) !== (key === null)) {
    throw new TypeError('tls: cert and key: give both (mutual TLS) or neither');
  }
  return grpc.credentials.createSsl(ca, key, cert);
}

/**
 * What the client needs from its options: credentials, channel options,
 * and a function giving each call's metadata. The token is held in this
 * closure only, so inspecting or serializing the client never shows it.
 */
function connection({
  token,
  tls,
  credentials,
  maxMessageBytes = DEFAULT_MAX_MESSAGE_BYTES,
  channelOptions = {},
}) {
  const bearer = token === undefined || token === null ? process.env[TOKEN_ENV] || '' : token;
  if (typeof bearer !== 'string' || (bearer !== '' && !SENDABLE.test(bearer))) {
    // The message must not quote the token: it is a secret.
    throw new TypeError('token: must be visible ASCII characters without spaces');
  }
  if (!Number.isInteger(maxMessageBytes) || maxMessageBytes < 1) {
    throw new TypeError('maxMessageBytes: must be a positive integer');
  }
  return {
    credentials: channelCredentials(tls, credentials),
    secure: !(tls === undefined || tls === null || tls === false),
    hasToken: bearer !== '',
    channelOptions: {
      'grpc.max_send_message_length': maxMessageBytes,
      'grpc.max_receive_message_length': maxMessageBytes,
      // A channel that lost its daemon tries to connect again after 0.1 s, then at most every second
      // (grpc-js's default backoff grows to 2 minutes): a daemon back from a restart is found within a
      // second, however long it was away, by the requests that wait for it (reconnect.js).
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.max_reconnect_backoff_ms': 1000,
      ...channelOptions,
    },
    metadata() {
      const metadata = new grpc.Metadata();
      if (bearer !== '') metadata.set('authorization', `Bearer ${bearer}`);
      return metadata;
    },
  };
}

module.exports = { connection, DEFAULT_MAX_MESSAGE_BYTES, TOKEN_ENV };
