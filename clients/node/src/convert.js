'use strict';
/**
 * Plain JS values to effectd messages and back: enums as their names without
 * the prefix ('EXECUTE', 'COMMITTED'), JSON payloads as values, raw payloads
 * as Buffers, timestamps as Dates.
 */

const { load } = require('./proto');

const PREFIXES = {
  Effect: 'EFFECT_',
  CallChannel: 'CALL_CHANNEL_',
  CallState: 'CALL_STATE_',
  Decision: 'DECISION_',
  Outcome: 'OUTCOME_',
  Resolution: 'RESOLUTION_',
  RecoveryAction: 'RECOVERY_ACTION_',
  RetryContext: 'RETRY_CONTEXT_',
  FailureKind: 'FAILURE_KIND_',
};

/** 'DECISION_EXECUTE' -> 'EXECUTE'. */
function enumOut(type, value) {
  const prefix = PREFIXES[type];
  return typeof value === 'string' && value.startsWith(prefix) ? value.slice(prefix.length) : value;
}

/** 'READ' (or 'EFFECT_READ') -> 'EFFECT_READ'; anything unknown is a TypeError. */
function enumIn(type, value) {
  if (value === undefined || value === null) return undefined;
  const prefix = PREFIXES[type];
  const full = String(value).startsWith(prefix) ? String(value) : prefix + String(value);
  if (!load().enums[type].includes(full)) {
    const names = load().enums[type].map((n) => n.slice(prefix.length));
    throw new TypeError(`${type} must be one of ${names.join(', ')}; got ${JSON.stringify(value)}`);
  }
  return full;
}

/** Buffers (and Uint8Arrays) are sent raw, anything else as JSON text. */
function payloadIn(value) {
  if (value instanceof Uint8Array) return { raw: Buffer.from(value) };
  const json = JSON.stringify(value === undefined ? null : value);
  if (json === undefined) throw new TypeError(`cannot serialize ${typeof value} as JSON`);
  return { json };
}

/** Checkpoint values are bytes: Buffers as is, strings as UTF-8, else JSON. */
function bytesIn(value) {
  if (value instanceof Uint8Array) return Buffer.from(value);
  if (typeof value === 'string') return Buffer.from(value, 'utf8');
  return Buffer.from(JSON.stringify(value), 'utf8');
}

function timestampIn(date) {
  if (date === undefined || date === null) return null;
  const ms = date instanceof Date ? date.getTime() : Number(date);
  return { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1e6 };
}

function timestampOut(ts) {
  if (!ts) return null;
  return new Date(Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1e6));
}

function resultOut(r) {
  if (!r) return null;
  const kind = r.payload ? r.payload.kind : undefined;
  const json = kind === 'json' ? r.payload.json : null;
  const raw = kind === 'raw' ? r.payload.raw : null;
  return {
    outcome: enumOut('Outcome', r.outcome),
    ok: r.outcome === 'OUTCOME_OK',
    // The JSON result parsed, the raw bytes, or null for an empty payload.
    value: json !== null ? JSON.parse(json) : raw,
    json,
    raw,
    errorCode: r.errorCode,
    errorMessage: r.errorMessage,
    digest: r.digest,
  };
}

function transitionOut(t) {
  return {
    fromState: enumOut('CallState', t.fromState),
    toState: enumOut('CallState', t.toState),
    event: t.event,
    at: timestampOut(t.at),
    actor: t.actor,
    reason: t.reason,
    revision: t.revision,
    attempt: t.attempt,
  };
}

function approvalOut(a) {
  if (!a) return null;
  return {
    approved: a.approved,
    approver: a.approver,
    reason: a.reason,
    decidedAt: timestampOut(a.decidedAt),
    inputFingerprint: a.inputFingerprint,
    revision: a.revision,
  };
}

function reconciliationOut(r) {
  return {
    resolution: enumOut('Resolution', r.resolution),
    operator: r.operator,
    reason: r.reason,
    evidence: r.evidence,
    reconciledAt: timestampOut(r.reconciledAt),
    fromState: enumOut('CallState', r.fromState),
    revision: r.revision,
    attempt: r.attempt,
  };
}

function keptInputOut(p) {
  if (!p || !p.kind) return null;
  return { json: p.kind === 'json' ? p.json : null, raw: p.kind === 'raw' ? p.raw : null };
}

function toolCallOut(c) {
  if (!c) return null;
  const ref = c.ref || {};
  return {
    namespace: ref.namespace,
    runId: ref.runId,
    callId: ref.callId,
    toolName: c.toolName,
    effect: enumOut('Effect', c.effect),
    // A daemon that predates channels sends none: TOOL.
    channel: c.channel === 'CALL_CHANNEL_UNSPECIFIED' ? 'TOOL' : enumOut('CallChannel', c.channel),
    // 'SIDE_EFFECT' once the operator forced it on this call (ADR-010 R2), else null.
    forcedEffect: c.forcedEffect && c.forcedEffect !== 'EFFECT_UNSPECIFIED' ? enumOut('Effect', c.forcedEffect) : null,
    state: enumOut('CallState', c.state),
    revision: c.revision,
    idempotencyKey: c.idempotencyKey,
    keyScheme: c.keyScheme,
    inputFingerprint: c.inputFingerprint,
    approvalRequired: c.approvalRequired,
    attempt: c.attempt,
    leaseExpiresAt: timestampOut(c.leaseExpiresAt),
    result: resultOut(c.result),
    acknowledged: c.acknowledged,
    createdAt: timestampOut(c.createdAt),
    updatedAt: timestampOut(c.updatedAt),
    history: (c.history || []).map(transitionOut),
    approval: approvalOut(c.approval),
    reconciliations: (c.reconciliations || []).map(reconciliationOut),
    // UNKNOWN only: since when the outcome is unknown (the reconcile quarantine counts from here).
    unknownSince: timestampOut(c.unknownSince),
    // The exact input as sent while it is kept (not in lists or plans): {json, raw}, or null.
    keptInput: keptInputOut(c.keptInput),
  };
}

function checkpointOut(c) {
  return {
    key: c.key,
    value: c.value,
    revision: c.revision,
    updatedAt: timestampOut(c.updatedAt),
  };
}

function recoveryItemOut(i) {
  return {
    action: enumOut('RecoveryAction', i.action),
    call: toolCallOut(i.call),
    result: resultOut(i.result),
    effect: enumOut('Effect', i.effect),
    idempotencyKey: i.idempotencyKey,
  };
}

module.exports = {
  enumIn,
  enumOut,
  payloadIn,
  bytesIn,
  timestampIn,
  timestampOut,
  resultOut,
  toolCallOut,
  checkpointOut,
  recoveryItemOut,
};
