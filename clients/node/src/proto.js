'use strict';
/**
 * Loads the effectd protos at run time (no generated JS): the service
 * definitions for @grpc/grpc-js, the enum tables, and the decoders of the
 * google.rpc status details.
 *
 * The .proto files are read from the repository's `protos/` directory
 * (`../../protos` from this package), or from `EFFECTD_PROTOS_DIR`. The
 * google/rpc protos they import (google.rpc.Status, the session stream's
 * error) come with this package (`protos/`), so a directory holding only
 * effectd/v1/ loads too; one that has its own google/rpc/ is read first.
 * A message that no RPC carries (SessionHello, the first frame of the framed
 * transport) is encoded by protobufjs from the same files (`messageType`).
 */

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const DEFAULT_PROTOS_DIR = path.resolve(__dirname, '..', '..', '..', 'protos');
const GOOGLE_RPC_DIR = path.resolve(__dirname, '..', 'protos');

const FILES = [
  'effectd/v1/errors.proto',
  'effectd/v1/ledger.proto',
  'effectd/v1/checkpoints.proto',
  'effectd/v1/recovery.proto',
  'effectd/v1/retry.proto',
];

// Decoded messages are plain objects: camelCase fields, enums as their full
// names (the client strips the prefix), 64-bit integers as Numbers (revisions
// stay far below 2^53), unset scalars as defaults, unset messages as null.
const LOADER_OPTIONS = {
  keepCase: false,
  longs: Number,
  enums: String,
  bytes: Buffer,
  defaults: true,
  oneofs: true,
};

const cache = new Map();

/** The loaded protos of one directory, loaded once per process. */
function load(protosDir = process.env.EFFECTD_PROTOS_DIR || DEFAULT_PROTOS_DIR) {
  const dir = path.resolve(protosDir);
  let loaded = cache.get(dir);
  if (!loaded) {
    loaded = loadFrom(dir);
    cache.set(dir, loaded);
  }
  return loaded;
}

function loadFrom(dir) {
  const definition = protoLoader.loadSync(FILES, { ...LOADER_OPTIONS, includeDirs: [dir, GOOGLE_RPC_DIR] });
  const v1 = grpc.loadPackageDefinition(definition).effectd.v1;
  const enumValues = (name) => {
    const entry = definition[`effectd.v1.${name}`];
    if (!entry || entry.format !== 'Protocol Buffer 3 EnumDescriptorProto') {
      throw new Error(`effectd.v1.${name} is not an enum of the protos in ${dir}`);
    }
    return entry.type.value.map((v) => v.name);
  };
  return {
    dir,
    messageType: messageTypes(dir),
    services: {
      ledger: v1.ToolLedger,
      checkpoints: v1.Checkpoints,
      recovery: v1.Recovery,
      retry: v1.RetryPolicy,
    },
    enums: {
      ErrorReason: enumValues('ErrorReason'),
      Effect: enumValues('Effect'),
      CallChannel: enumValues('CallChannel'),
      CallState: enumValues('CallState'),
      Decision: enumValues('Decision'),
      Outcome: enumValues('Outcome'),
      Resolution: enumValues('Resolution'),
      RecoveryAction: enumValues('RecoveryAction'),
      RetryContext: enumValues('RetryContext'),
      FailureKind: enumValues('FailureKind'),
    },
  };
}

/**
 * `messageType(name)`: the protobufjs type of the effectd.v1 message `name` in the protos of `dir`,
 * read at its first use.
 */
function messageTypes(dir) {
  let root = null;
  return (name) => {
    if (!root) {
      root = new protobuf.Root();
      // As proto-loader's includeDirs: `dir` first, then this package's google/rpc; the
      // google/protobuf protos are among protobufjs's bundled common ones.
      root.resolvePath = (_origin, target) => {
        if (path.isAbsolute(target)) return target;
        const found = [dir, GOOGLE_RPC_DIR].map((base) => path.join(base, target)).find((p) => fs.existsSync(p));
        return found ?? target;
      };
      root.loadSync(FILES);
    }
    return root.lookupType(`effectd.v1.${name}`);
  };
}

let googleRpc = null;

/** Decoders of google.rpc.Status, ErrorInfo and BadRequest. */
function statusTypes() {
  if (!googleRpc) {
    const root = new protobuf.Root();
    // google/protobuf/{any,duration}.proto are among protobufjs's bundled common protos.
    root.resolvePath = (_origin, target) =>
      path.isAbsolute(target) ? target : path.join(GOOGLE_RPC_DIR, target);
    root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto']);
    googleRpc = {
      Status: root.lookupType('google.rpc.Status'),
      ErrorInfo: root.lookupType('google.rpc.ErrorInfo'),
      BadRequest: root.lookupType('google.rpc.BadRequest'),
      RetryInfo: root.lookupType('google.rpc.RetryInfo'),
    };
  }
  return googleRpc;
}

module.exports = { load, statusTypes, DEFAULT_PROTOS_DIR };
