'use strict';
/**
 * @effectd/client: a promise client of effectd over @grpc/grpc-js, loading
 * the effectd protos at run time.
 *
 *   const { Client, safeToolCall } = require('@effectd/client');
 *   const effectd = new Client({ target: 'unix:.effectd/effectd.sock' });
 *   const sent = await safeToolCall(effectd,
 *     { runId: 'run-1', callId: 'call-1', tool: 'send_email', input: { to: 'a@b.c' } },
 *     async () => mailer.send({ to: 'a@b.c' }));
 */

const { Client, DEFAULT_TARGET } = require('./client');
const { EffectdError, errors, fromServiceError } = require('./errors');
const {
  safeToolCall,
  OutcomeUnknown,
  ResultNotRecorded,
  ToolCallStopped,
  ReconciliationNeeded,
  ApprovalPending,
  CallInProgress,
  RetryRequired,
  CallRejected,
  ToolFailed,
} = require('./safe');

// Shorthand properties only, so that ESM `import { Client } from ...` finds them.
module.exports = {
  Client,
  DEFAULT_TARGET,
  EffectdError,
  errors,
  fromServiceError,
  safeToolCall,
  OutcomeUnknown,
  ResultNotRecorded,
  ToolCallStopped,
  ReconciliationNeeded,
  ApprovalPending,
  CallInProgress,
  RetryRequired,
  CallRejected,
  ToolFailed,
};
