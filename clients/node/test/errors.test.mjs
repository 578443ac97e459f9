// Errors: every ErrorReason has a class, and real refusals map to them.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import { Client, EffectdError, errors, fromServiceError } from '../src/index.js';
import { startDaemon } from '../src/testing.js';

const here = path.dirname(fileURLToPath(import.meta.url));
// protobufjs's bundled google.protobuf.Any keeps the snake_case field name type_url.
const ERRORS_PROTO = path.resolve(here, '..', '..', '..', 'protos', 'effectd', 'v1', 'errors.proto');

/** The ErrorReason value names, read from errors.proto as text (not through the client). */
function reasonsInProto() {
  const source = fs.readFileSync(ERRORS_PROTO, 'utf8');
  const body = source.match(/enum ErrorReason \{([\s\S]*?)\n\}/)[1];
  return [...body.matchAll(/^\s*([A-Z][A-Z0-9_]*)\s*=\s*\d+;/gm)]
    .map((m) => m[1])
    .filter((name) => name !== 'ERROR_REASON_UNSPECIFIED');
}

/** A @grpc/grpc-js error as the daemon sends it: google.rpc.Status in the trailer. */
function serviceError(code, reason, { metadata = {}, violations = [], domain = 'effectd', retryDelay } = {}) {
  const root = new protobuf.Root();
  root.resolvePath = (_o, t) => (path.isAbsolute(t) ? t : path.join(here, '..', 'protos', t));
  root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto']);
  const pack = (type, value) => ({
    type_url: `type.googleapis.com/google.rpc.${type}`,
    value: root.lookupType(`google.rpc.${type}`).encode(value).finish(),
  });
  const details = [pack('ErrorInfo', { reason, domain, metadata })];
  if (violations.length) details.push(pack('BadRequest', { fieldViolations: violations }));
  if (retryDelay) details.push(pack('RetryInfo', { retryDelay }));
  const status = root.lookupType('google.rpc.Status').encode({ code, message: 'refused', details }).finish();
  const trailer = new grpc.Metadata();
  trailer.set('grpc-status-details-bin', Buffer.from(status));
  return Object.assign(new Error(`${code} refused`), { code, details: 'refused', metadata: trailer });
}

describe('the error mapping is complete', () => {
  const reasons = reasonsInProto();

  test('errors.proto has reasons to map (the parse of the proto works)', () => {
    assert.ok(reasons.length >= 25, `only ${reasons.length} reasons found`);
    assert.ok(reasons.includes('INPUT_MISMATCH'));
  });

  test('every ErrorReason value of errors.proto has its EffectdError subclass, and no other class exists', () => {
    assert.deepEqual(Object.keys(errors).sort(), [...reasons].sort());
    for (const reason of reasons) {
      const cls = errors[reason];
      assert.equal(typeof cls, 'function', reason);
      assert.ok(cls.prototype instanceof EffectdError, reason);
      assert.equal(cls.reason, reason);
    }
    assert.equal(errors.INPUT_MISMATCH.name, 'InputMismatchError');
    assert.equal(errors.SIDE_EFFECT_NOT_RETRY_SAFE.name, 'SideEffectNotRetrySafeError');
  });

  for (const reason of reasons) {
    test(`a status with reason ${reason} becomes errors.${reason}`, () => {
      const error = fromServiceError(serviceError(grpc.status.FAILED_PRECONDITION, reason, { metadata: { k: 'v' } }));
      assert.ok(error instanceof errors[reason]);
      assert.equal(error.reason, reason);
      assert.equal(error.code, 'FAILED_PRECONDITION');
      assert.deepEqual(error.metadata, { k: 'v' });
    });
  }

  test('BadRequest violations are decoded with their field and description', () => {
    const error = fromServiceError(
      serviceError(grpc.status.INVALID_ARGUMENT, 'INVALID_REQUEST', {
        violations: [{ field: 'ref.run_id', description: 'is required' }],
      }),
    );
    assert.ok(error instanceof errors.INVALID_REQUEST);
    assert.deepEqual(error.violations, [{ field: 'ref.run_id', description: 'is required' }]);
  });

  test('google.rpc.RetryInfo becomes retryDelayMs; without it retryDelayMs is null', () => {
    const later = fromServiceError(
      serviceError(grpc.status.RESOURCE_EXHAUSTED, 'STORAGE_FULL', { retryDelay: { seconds: 2, nanos: 500_000_000 } }),
    );
    assert.equal(later.retryDelayMs, 2500);
    assert.equal(fromServiceError(serviceError(grpc.status.ABORTED, 'REVISION_CONFLICT')).retryDelayMs, null);
  });

  test('a status without effectd details is a plain EffectdError with an empty reason', () => {
    const plain = Object.assign(new Error('14 UNAVAILABLE'), { code: 14, details: 'down', metadata: new grpc.Metadata() });
    const error = fromServiceError(plain);
    assert.equal(error.constructor, EffectdError);
    assert.equal(error.code, 'UNAVAILABLE');
    assert.equal(error.reason, '');
    assert.equal(error.cause, plain);
  });

  test('an ErrorInfo of another domain is not taken for an effectd reason', () => {
    const foreign = fromServiceError(serviceError(grpc.status.NOT_FOUND, 'NOT_FOUND', { domain: 'example.com' }));
    assert.equal(foreign.constructor, EffectdError);
    assert.equal(foreign.reason, '');
    assert.equal(foreign.code, 'NOT_FOUND');
  });

  test('an undecodable status trailer leaves the plain status', () => {
    const trailer = new grpc.Metadata();
    trailer.set('grpc-status-details-bin', Buffer.from([0xff, 0xff, 0xff]));
    const error = fromServiceError(Object.assign(new Error('x'), { code: 9, details: 'x', metadata: trailer }));
    assert.equal(error.code, 'FAILED_PRECONDITION');
    assert.equal(error.reason, '');
  });
});

describe('refusals of a real daemon', () => {
  let daemon;
  let client;
  before(async () => {
    daemon = await startDaemon();
    client = new Client({ target: daemon.target });
  });
  after(async () => {
    client?.close();
    await daemon?.stop();
  });

  test('another input for the same call is INPUT_MISMATCH (FAILED_PRECONDITION)', async () => {
    const ref = { runId: 'e', callId: 'mismatch', tool: 't' };
    await client.prepareTool({ ...ref, input: { a: 1 } });
    await assert.rejects(client.prepareTool({ ...ref, input: { a: 2 } }), (error) => {
      assert.ok(error instanceof errors.INPUT_MISMATCH);
      assert.ok(error instanceof EffectdError);
      assert.equal(error.code, 'FAILED_PRECONDITION');
      assert.equal(error.reason, 'INPUT_MISMATCH');
      return true;
    });
  });

  test('a malformed request is INVALID_REQUEST listing every field violation', async () => {
    await assert.rejects(client.prepareTool({ runId: 'a:b', callId: '', tool: '', input: 1 }), (error) => {
      assert.ok(error instanceof errors.INVALID_REQUEST);
      assert.equal(error.code, 'INVALID_ARGUMENT');
      const fields = error.violations.map((v) => v.field);
      assert.ok(fields.includes('ref.run_id'), fields.join());
      assert.ok(fields.includes('ref.call_id'), fields.join());
      assert.ok(error.violations.every((v) => typeof v.description === 'string' && v.description));
      return true;
    });
  });

  test('a stale expected revision is REVISION_CONFLICT (ABORTED) carrying currentRevision', async () => {
    const ref = { runId: 'e', callId: 'rev' };
    const p = await client.prepareTool({ ...ref, tool: 't', input: 1 });
    await assert.rejects(client.startTool({ ...ref, expectedRevision: p.call.revision + 5 }), (error) => {
      assert.ok(error instanceof errors.REVISION_CONFLICT);
      assert.equal(error.code, 'ABORTED');
      assert.equal(error.currentRevision, p.call.revision);
      return true;
    });
    await assert.rejects(
      client.putCheckpoint('absent-key', 'x', { expectedRevision: 3 }),
      (error) => error instanceof errors.REVISION_CONFLICT && error.currentRevision === 0,
    );
  });

  test('an unknown call is NOT_FOUND', async () => {
    await assert.rejects(client.getToolCall({ runId: 'e', callId: 'nope' }), (error) => {
      assert.ok(error instanceof errors.NOT_FOUND);
      assert.equal(error.code, 'NOT_FOUND');
      return true;
    });
  });

  test('a commit from an older attempt is STALE_ATTEMPT', async () => {
    const ref = { runId: 'e', callId: 'stale' };
    const p = await client.prepareTool({ ...ref, tool: 't', input: 1, start: true, effect: 'READ' });
    await client.reportUnknown({ ...ref, attempt: p.call.attempt, reason: 'lost' });
    const retried = await client.startTool({ ...ref, retry: true });
    assert.equal(retried.call.attempt, 2);
    await assert.rejects(client.commitTool({ ...ref, attempt: 1, result: 1 }), errors.STALE_ATTEMPT);
  });

  test('an unreachable daemon is a plain EffectdError (UNAVAILABLE or DEADLINE_EXCEEDED)', async () => {
    const nowhere = new Client({ target: `unix:${daemon.dataDir}/nothing.sock`, timeoutMs: 300 });
    try {
      await assert.rejects(nowhere.getToolCall({ runId: 'e', callId: 'x' }), (error) => {
        assert.equal(error.constructor, EffectdError);
        assert.ok(['UNAVAILABLE', 'DEADLINE_EXCEEDED'].includes(error.code), error.code);
        assert.equal(error.reason, '');
        return true;
      });
    } finally {
      nowhere.close();
    }
  });
});
