'use strict';
/**
 * The ledger session over the daemon's framed transport (docs/contract.md §2.8): the session
 * stream's messages as frames on `effectd.frames.sock`, a plain Unix socket beside the daemon's
 * gRPC socket, without gRPC. A frame is a 4-byte big-endian length, then one protobuf message; the
 * client's first frame is a `SessionHello` (the version, and the `authorization` and `traceparent`
 * the stream's metadata carries on gRPC), every later one a `SessionRequest`, and every frame of the
 * daemon a `SessionResponse`; one of id 0 ends the session with its `error`, as the stream's status
 * does on gRPC.
 *
 * `FramesSession` is session.js's `Session` with one connection standing for one stream
 * (`FramedCall`, what a @grpc/grpc-js duplex call is to it), so that the messages in flight, the
 * deadlines and cancels, the failure table and the idle end are the stream's, to the letter:
 *
 *   the connection ended by the daemon's id 0 frame     -> that status, as the stream's (a refused
 *                                                           hello: UNAUTHENTICATED fails each message
 *                                                           so, PERMISSION_DENIED: unary calls)
 *   the connection broke after it took the message      -> UNAVAILABLE, mayHaveBeenApplied=true
 *   the socket refused the connection: nothing was sent -> UNAVAILABLE, mayHaveBeenApplied=false
 *                                                           (the client waits for the daemon)
 *   ... and the daemon's gRPC socket took one           -> the daemon serves gRPC without the framed
 *                                                           socket (--no-local-frames, or older):
 *                                                           those messages and every call for
 *                                                           NO_FRAMES_PAUSE_MS go as unary calls,
 *                                                           then the framed socket is tried again
 *
 * A message is taken once it is handed to the connected socket; one the socket would not take yet
 * (its buffer full) waits in the session and is sent once more on a new connection if this one
 * breaks. The socket never keeps the process alive (it is unref'd): a call waiting for its answer
 * does, by its deadline's timer. The same rules as the Python client's `effectd_client._frames`.
 */

const { EventEmitter } = require('node:events');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const { Session } = require('./session');
const { NO_CONNECTION, statusError } = require('./session-wire');

/** Read for a `unix:` target: 'grpc' keeps the gRPC session stream. */
const TRANSPORT_ENV = 'EFFECTD_TRANSPORT';
/** How long calls are unary once the daemon is found serving gRPC without the framed socket. */
const NO_FRAMES_PAUSE_MS = 5_000;
/** Of the frames' format. */
const VERSION = 1;
const HEADER_BYTES = 4;
// How long the probe of the gRPC socket may take to be accepted.
const PROBE_TIMEOUT_MS = 1_000;

/** The framed socket beside a daemon's gRPC socket (effectd.sock: effectd.frames.sock). */
function framesPath(grpcSocket) {
  const { dir, name, ext } = path.parse(grpcSocket);
  return path.join(dir, `${name}.frames${ext}`);
}

/**
 * The gRPC socket of `target` when a client should use the framed one beside it: a `unix:` target
 * whose daemon serves one, and `EFFECTD_TRANSPORT` not 'grpc'; else null.
 */
function localSocket(target) {
  if ((process.env[TRANSPORT_ENV] ?? '').trim().toLowerCase() === 'grpc') return null;
  if (!target.startsWith('unix:')) return null;
  let socket = target.slice('unix:'.length);
  if (socket.startsWith('//')) socket = socket.slice(2);
  return fs.existsSync(framesPath(socket)) ? socket : null;
}

/**
 * Whether the daemon's gRPC socket takes a connection (its framed one having refused one): a
 * daemon serving gRPC without the framed transport.
 * @returns {Promise<boolean>}
 */
function grpcAlone(grpcSocket) {
  return new Promise((resolve) => {
    const probe = net.createConnection(grpcSocket);
    probe.unref();
    const done = (alone) => {
      probe.destroy();
      resolve(alone);
    };
    probe.setTimeout(PROBE_TIMEOUT_MS, () => done(false));
    probe.once('connect', () => done(true));
    probe.once('error', () => done(false));
  });
}

/** A frame over the size limit: the connection cannot go on (its next frame cannot be found). */
class FrameTooLarge extends Error {}

/** Cuts a byte stream into frames, however it comes: a frame in pieces, several frames in one chunk. */
class FrameReader {
  /** @param {number} maxBytes the largest frame taken. */
  constructor(maxBytes) {
    this._maxBytes = maxBytes;
    this._chunks = [];
    this._length = 0;
    /** The size of the frame being read once its header is; null before. */
    this._size = null;
  }

  /**
   * The frames `chunk` completes, in order.
   * @param {Buffer} chunk
   * @returns {Buffer[]}
   * @throws {FrameTooLarge}
   */
  push(chunk) {
    this._chunks.push(chunk);
    this._length += chunk.length;
    const frames = [];
    for (;;) {
      if (this._size === null) {
        if (this._length < HEADER_BYTES) break;
        const size = this._take(HEADER_BYTES).readUInt32BE(0);
        if (size > this._maxBytes) {
          throw new FrameTooLarge(`Received message larger than max (${size} vs. ${this._maxBytes})`);
        }
        this._size = size;
      }
      if (this._length < this._size) break;
      frames.push(this._take(this._size));
      this._size = null;
    }
    return frames;
  }

  /** The next `n` bytes (there are at least that many). */
  _take(n) {
    const all = this._chunks.length === 1 ? this._chunks[0] : Buffer.concat(this._chunks, this._length);
    const rest = all.subarray(n);
    this._chunks = rest.length ? [rest] : [];
    this._length = rest.length;
    return all.subarray(0, n);
  }
}

/**
 * One connection to the framed socket, as a @grpc/grpc-js duplex call is to `Session`: `write`
 * (false: wait for 'drain'), `end`, `cancel`; events 'data' (a SessionResponse), 'drain', and at
 * its end 'error' (unless OK) then 'status'. A status that says `unaryForMs` found the daemon
 * serving gRPC without the framed socket.
 */
class FramedCall extends EventEmitter {
  /**
   * @param {object} options
   * @param {string} options.path the framed socket.
   * @param {string} options.grpcSocket the daemon's gRPC socket, probed when the framed one refuses.
   * @param {Buffer} options.hello the SessionHello, the first frame.
   * @param {(bytes: Buffer) => object} options.deserialize reads a SessionResponse.
   * @param {number} options.maxReceiveBytes the largest frame read.
   * @param {(grpcSocket: string) => Promise<boolean>} options.probe says whether gRPC alone serves.
   */
  constructor({ path: framesSocket, grpcSocket, hello, deserialize, maxReceiveBytes, probe }) {
    super();
    this._path = framesSocket;
    this._grpcSocket = grpcSocket;
    this._deserialize = deserialize;
    this._reader = new FrameReader(maxReceiveBytes);
    this._probe = probe;
    /** Whether the socket connected; before, the frames written wait here, none has left this process. */
    this._connected = false;
    this._unsent = [];
    /** Whether this client ended its side (an idle session, or close()). */
    this._ending = false;
    this._done = false;
    const socket = net.createConnection(framesSocket);
    this._socket = socket;
    // A call waiting for its answer keeps the process alive by its deadline's timer; the socket never does.
    socket.unref();
    socket.on('connect', () => {
      this._connected = true;
      // In one write: a daemon that refuses the hello has them all before it closes (a write after
      // its close would fail EPIPE before its refusal is read, and its status would be lost).
      const unsent = Buffer.concat(this._unsent);
      this._unsent = null;
      socket.write(unsent);
    });
    socket.on('data', (chunk) => this._received(chunk));
    socket.on('drain', () => this.emit('drain'));
    socket.on('end', () => {
      if (this._ending) this._finish(grpc.status.OK, '');
      else this._finish(grpc.status.UNAVAILABLE, 'the daemon closed the connection');
    });
    socket.on('error', (error) => {
      if (this._connected) this._finish(grpc.status.UNAVAILABLE, `the connection failed: ${error.message}`);
      else this._refused(error);
    });
    socket.on('close', () => {
      // Before it connected, the error settles it (after the probe).
      if (this._connected) this._finish(grpc.status.UNAVAILABLE, 'the connection closed');
    });
    // The first frame, once it connects; the session's messages follow it.
    this.write(hello);
  }

  /** Sends one message as a frame; false: the socket's buffer is full, wait for 'drain'. */
  write(bytes) {
    if (this._done || this._socket.destroyed) return false;
    const frame = Buffer.allocUnsafe(HEADER_BYTES + bytes.length);
    frame.writeUInt32BE(bytes.length, 0);
    frame.set(bytes, HEADER_BYTES);
    if (!this._connected) {
      this._unsent.push(frame);
      return true;
    }
    return this._socket.write(frame);
  }

  /** Ends this client's side: the daemon answers what it holds, then closes. */
  end() {
    this._ending = true;
    if (!this._socket.destroyed) this._socket.end();
  }

  cancel() {
    this._finish(grpc.status.CANCELLED, 'Cancelled on client');
  }

  _received(chunk) {
    if (this._done) return;
    let frames;
    try {
      frames = this._reader.push(chunk);
    } catch (error) {
      if (!(error instanceof FrameTooLarge)) throw error;
      this._finish(grpc.status.RESOURCE_EXHAUSTED, error.message);
      return;
    }
    for (const frame of frames) {
      if (this._done) return;
      let answer;
      try {
        answer = this._deserialize(frame);
      } catch (error) {
        this._finish(grpc.status.INTERNAL, `a frame of the daemon is not a SessionResponse: ${error.message}`);
        return;
      }
      if (answer.id === 0) {
        // The daemon ends the session with this status, then closes.
        const status = answer.error ?? { code: grpc.status.UNKNOWN, message: 'the daemon ended the session', details: [] };
        this._end(statusError(status));
        return;
      }
      this.emit('data', answer);
    }
  }

  /** The socket refused the connection: nothing of it left this process. */
  async _refused(error) {
    let alone = false;
    try {
      alone = await this._probe(this._grpcSocket);
    } catch {
      // No answer from the probe: the daemon is taken for away.
    }
    if (alone) {
      const message = `the daemon serves gRPC without the framed socket ${this._path} (${error.code ?? error.message})`;
      this._finish(grpc.status.UNAVAILABLE, message, NO_FRAMES_PAUSE_MS);
    } else {
      this._finish(grpc.status.UNAVAILABLE, `${NO_CONNECTION} to the framed socket ${this._path} (${error.message})`);
    }
  }

  _finish(code, message, unaryForMs = 0) {
    const error = statusError({ code, message, details: [] });
    if (unaryForMs) error.unaryForMs = unaryForMs;
    this._end(error);
  }

  /** The connection's end, once: 'error' (unless OK), then 'status'. */
  _end(error) {
    if (this._done) return;
    this._done = true;
    this._socket.destroy();
    const status = { code: error.code, details: error.details, metadata: error.metadata };
    if (error.code !== grpc.status.OK) this.emit('error', error);
    this.emit('status', status);
  }
}

/** What `Session` asks a stub for, made of connections to the framed socket. */
class FramesChannel {
  constructor({ grpcSocket, helloType, maxReceiveBytes }) {
    this.grpcSocket = grpcSocket;
    this.path = framesPath(grpcSocket);
    this._helloType = helloType;
    // As grpc-js's limit, -1 is none: a frame's length field then bounds it.
    this._maxReceiveBytes = maxReceiveBytes < 0 ? 2 ** 32 - 1 : maxReceiveBytes;
    /** Says whether the gRPC socket alone serves, once the framed one refused a connection. */
    this.probe = grpcAlone;
  }

  /** A new connection, opened with the hello made of `metadata` (its authorization and traceparent). */
  makeBidiStreamRequest(_method, _serialize, deserialize, metadata) {
    const fields = { version: VERSION };
    for (const key of ['authorization', 'traceparent']) {
      const [value] = metadata.get(key);
      if (value) fields[key] = String(value);
    }
    const type = this._helloType;
    return new FramedCall({
      path: this.path,
      grpcSocket: this.grpcSocket,
      hello: Buffer.from(type.encode(type.create(fields)).finish()),
      deserialize,
      maxReceiveBytes: this._maxReceiveBytes,
      probe: (socket) => this.probe(socket),
    });
  }
}

/** The client's ledger session on the framed transport: `Session`'s interface, `transport` 'frames'. */
class FramesSession extends Session {
  /**
   * @param {object} options
   * @param {string} options.grpcSocket the daemon's gRPC socket; the framed one is beside it.
   * @param {object} options.helloType the protobufjs type of SessionHello.
   * @param {object} options.method the Session method's definition (its serializers).
   * @param {() => grpc.Metadata} options.metadata what the hello carries (authorization, traceparent).
   * @param {number} options.maxMessageBytes larger requests fail alone, before they are sent.
   * @param {number} options.maxReceiveBytes a larger frame of the daemon ends the connection.
   * @param {(method: string, request: object, timeoutMs: number) => Promise<object>} options.unary
   *   asks the unary RPC.
   * @param {number} [options.idleMs] an idle connection is ended after this long.
   */
  constructor({ grpcSocket, helloType, method, metadata, maxMessageBytes, maxReceiveBytes, unary, idleMs }) {
    const channel = new FramesChannel({ grpcSocket, helloType, maxReceiveBytes });
    super({ stub: channel, method, metadata, maxMessageBytes, unary, idleMs, transport: 'frames' });
    this.channel = channel;
  }
}

module.exports = {
  FramesSession,
  FrameReader,
  framesPath,
  localSocket,
  grpcAlone,
  TRANSPORT_ENV,
  NO_FRAMES_PAUSE_MS,
};
