// Type declarations of @effectd/client (the code is plain JS, see index.js).
import type { ChannelCredentials, ChannelOptions } from '@grpc/grpc-js';

export type Effect = 'READ' | 'IDEMPOTENT_WRITE' | 'SIDE_EFFECT';
export type Channel = 'TOOL' | 'MCP' | 'CHILD_FOREGROUND' | 'DURABLE_BACKGROUND';
export type CallState = 'PREPARED' | 'AWAITING_APPROVAL' | 'STARTED' | 'UNKNOWN' | 'COMMITTED';
export type Decision = 'EXECUTE' | 'RETURN_RESULT' | 'AWAIT_APPROVAL' | 'REJECTED' | 'IN_PROGRESS' | 'RECONCILE';
export type RecoveryAction =
  | 'REPLAY_RESULT'
  | 'RECONCILE'
  | 'WAIT_FOR_APPROVAL'
  | 'ERROR_RESULT'
  | 'EXECUTE'
  | 'RETRY_NEEDS_POLICY'
  /** Committed and acknowledged: already in the transcript; append nothing. */
  | 'ALREADY_DELIVERED';
export type RetryContext = 'TOOL' | 'MCP' | 'CHILD_FOREGROUND' | 'DURABLE_BACKGROUND' | 'RUN';
export type FailureKind = 'UNSPECIFIED' | 'TRANSPORT' | 'TIMEOUT' | 'APPLICATION';

/** A JSON value, or a Buffer for a raw payload. */
export type PayloadValue = unknown;

export interface ToolResult {
  outcome: 'OK' | 'ERROR' | 'UNSPECIFIED';
  ok: boolean;
  /** The JSON result parsed, the raw bytes, or null. */
  value: unknown;
  /** The stored JSON text, byte for byte as committed. */
  json: string | null;
  raw: Buffer | null;
  errorCode: string;
  errorMessage: string;
  digest: string;
}

export interface Transition {
  fromState: CallState | 'UNSPECIFIED';
  toState: CallState;
  event: string;
  at: Date | null;
  actor: string;
  reason: string;
  revision: number;
  attempt: number;
}

export interface Approval {
  approved: boolean;
  approver: string;
  reason: string;
  decidedAt: Date | null;
  inputFingerprint: string;
  revision: number;
}

export interface Reconciliation {
  resolution: 'COMMITTED' | 'NOT_EXECUTED';
  operator: string;
  reason: string;
  evidence: string;
  reconciledAt: Date | null;
  fromState: CallState;
  revision: number;
  attempt: number;
}

export interface ToolCall {
  namespace: string;
  runId: string;
  callId: string;
  toolName: string;
  effect: Effect;
  /** 'SIDE_EFFECT' once the operator forced it on this call (ADR-010 R2), else null. */
  forcedEffect: Effect | null;
  channel: Channel;
  state: CallState;
  revision: number;
  idempotencyKey: string;
  keyScheme: number;
  inputFingerprint: string;
  approvalRequired: boolean;
  attempt: number;
  leaseExpiresAt: Date | null;
  result: ToolResult | null;
  acknowledged: boolean;
  createdAt: Date | null;
  updatedAt: Date | null;
  history: Transition[];
  approval: Approval | null;
  reconciliations: Reconciliation[];
  /** UNKNOWN only: since when the outcome is unknown (the reconcile quarantine counts from here). */
  unknownSince: Date | null;
  /**
   * The exact input as sent, kept until the call is committed when it awaits
   * approval (or the daemon's policy keeps inputs); lists and plans omit it.
   * An approval binds `inputFingerprint`, never this copy.
   */
  keptInput: { json: string | null; raw: Buffer | null } | null;
}

export interface Prepared {
  decision: Decision;
  call: ToolCall;
  idempotencyKey: string;
  attemptHeld: boolean;
  retryRequired: boolean;
}

export interface CallRef {
  runId: string;
  callId: string;
}

export interface PrepareArgs extends CallRef {
  tool: string;
  input: PayloadValue;
  effect?: Effect;
  requireApproval?: boolean;
  start?: boolean;
  leaseMs?: number;
  /** With `start`: an explicit retry of a READ / IDEMPOTENT_WRITE whose last attempt has an unknown outcome. */
  retry?: boolean;
  /** How the tool is reached (default 'TOOL'); part of the call's identity; its retry rules apply. */
  channel?: Channel;
}

export interface Checkpoint {
  key: string;
  value: Buffer;
  revision: number;
  updatedAt: Date | null;
}

export interface RecoveryItem {
  action: RecoveryAction;
  call: ToolCall;
  result: ToolResult | null;
  effect: Effect;
  idempotencyKey: string;
}

export interface RecoveryPlan {
  items: RecoveryItem[];
  interrupted: boolean;
  settled: number;
}

export interface RetryDecision {
  allow: boolean;
  /** The ErrorReason of a denial; '' when allowed. */
  reason: string;
  message: string;
  backoffMs: number;
  effect: Effect;
  maxAttempts: number;
  attemptsUsed: number;
  idempotencyKey: string;
}

/** TLS material, PEM: `ca` verifies the daemon (default the system roots); `cert` and `key` are the client's (mutual TLS). */
export interface TlsOptions {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

export interface ClientOptions {
  target?: string;
  namespace?: string;
  timeoutMs?: number;
  /** Bearer token sent as `authorization: Bearer` on every call; default `EFFECTD_TOKEN`, '' sends none. */
  token?: string;
  /** TLS to the daemon; `true` trusts the system roots. Not together with `credentials`. */
  tls?: true | TlsOptions;
  /** Largest message sent or received, both directions; default 8 MiB (the daemon's default). */
  maxMessageBytes?: number;
  credentials?: ChannelCredentials;
  channelOptions?: ChannelOptions;
  protosDir?: string;
  /** How CommitTool, ReportUnknown, Heartbeat and AcknowledgeRecovery are retried. */
  recordingRetry?: RecordingRetry;
  /**
   * Carry PrepareTool, PrepareTools, StartTool, CommitTool, ReportUnknown, Heartbeat and GetToolCall
   * over one ledger session, many in flight at once; default true, unless `EFFECTD_SESSION` is '0',
   * 'false' or 'off'. false: one unary call each. The session is on the daemon's framed socket for a
   * `unix:` target whose daemon serves one (unless `EFFECTD_TRANSPORT` is 'grpc'), else on the gRPC
   * session stream (ToolLedger.Session). A daemon without the stream is asked by the unary RPCs, for
   * the client's life; one serving gRPC without its framed socket, for 5 s at a time.
   */
  session?: boolean;
  /**
   * How long a call whose request was not sent (the daemon away, restarting or stopping) waits for the
   * daemon before it fails UNAVAILABLE, never past its deadline; default 5000, 0: it fails at once. A
   * request that may have reached the daemon is never sent again this way. The first call of an
   * outage emits a process warning (code `EFFECTD_DAEMON_AWAY`).
   */
  reconnectWaitMs?: number;
}

/** Tries of one recording request (defaults: 8 tries within 30 s, 100 ms doubling to 2 s). */
export interface RecordingRetry {
  attempts?: number;
  deadlineMs?: number;
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  onRetry?: ((error: EffectdError, waitMs: number) => void) | null;
}

export const DEFAULT_TARGET: string;

export class Client {
  constructor(options?: ClientOptions);
  readonly target: string;
  readonly namespace: string;
  readonly timeoutMs: number;
  /**
   * How the ledger's tool-call requests travel: 'frames' (the daemon's framed socket), 'session' (the
   * gRPC session stream), or 'unary' (the `session` option is false, the daemon does not serve the
   * stream, or, for a while, it serves gRPC without its framed socket).
   */
  readonly transport: 'frames' | 'session' | 'unary';
  /** Ends the session and closes the channel; pending calls fail. */
  close(): void;
  prepareTool(args: PrepareArgs): Promise<Prepared>;
  prepareTools(calls: PrepareArgs[]): Promise<Prepared[]>;
  startTool(args: CallRef & { retry?: boolean; leaseMs?: number; expectedRevision?: number }): Promise<Prepared>;
  commitTool(
    args: CallRef & {
      attempt: number;
      result?: PayloadValue;
      errorCode?: string;
      errorMessage?: string;
      expectedRevision?: number;
      acknowledge?: boolean;
      retry?: RecordingRetry;
    },
  ): Promise<ToolCall>;
  reportUnknown(args: CallRef & { attempt: number; reason?: string; retry?: RecordingRetry }): Promise<ToolCall>;
  heartbeat(args: CallRef & { attempt: number; leaseMs?: number; retry?: RecordingRetry }): Promise<ToolCall>;
  decideApproval(
    args: CallRef & {
      approve: boolean;
      approver: string;
      reason: string;
      expectedRevision: number;
      inputFingerprint: string;
    },
  ): Promise<ToolCall>;
  reconcile(
    args: CallRef & {
      expectedRevision: number;
      operator: string;
      reason: string;
      evidence: string;
      result?: PayloadValue;
      errorCode?: string;
      errorMessage?: string;
      notExecuted?: boolean;
      /** The operator's word that this attempt is dead: "never executed" before the quarantine ends. */
      confirmedDeadAttempt?: number;
    },
  ): Promise<ToolCall>;
  getToolCall(args: CallRef): Promise<ToolCall>;
  /** `allNamespaces`: every namespace the caller may see (a token's grants), not the client's one. */
  listToolCalls(args?: {
    runId?: string;
    states?: CallState[];
    pageSize?: number;
    allNamespaces?: boolean;
  }): AsyncGenerator<ToolCall, void>;
  /** Every page of the plan, joined; `pageSize` 1..1000 calls per answer (default 1000). */
  recover(args: { runId: string; pageSize?: number }): Promise<RecoveryPlan>;
  /** The plan one page at a time, in callId byte order. */
  recoverPages(args: { runId: string; pageSize?: number }): AsyncGenerator<RecoveryPlan, void>;
  acknowledgeRecovery(args: { runId: string; callIds: string[]; retry?: RecordingRetry }): Promise<ToolCall[]>;
  decideRetry(args: {
    call?: CallRef;
    facts?: { effect?: Effect; state: CallState; idempotencyKey?: string; toolName?: string };
    context: RetryContext;
    error?: { kind?: FailureKind; retryable?: boolean; code?: string; message?: string };
    attemptsUsed?: number;
    deadline?: Date | number;
    maxAttempts?: number;
  }): Promise<RetryDecision>;
  getCheckpoint(key: string): Promise<Checkpoint | null>;
  putCheckpoint(key: string, value: Buffer | Uint8Array | string | unknown, options?: { expectedRevision?: number }): Promise<number>;
  deleteCheckpoint(key: string, expectedRevision: number): Promise<void>;
  checkpointTxn(txn: {
    compares?: ({ key: string; revision: number } | { key: string; absent: true })[];
    ops?: ({ put: { key: string; value: unknown } } | { delete: { key: string } })[];
  }): Promise<number>;
  listCheckpoints(args?: { prefix?: string; keysOnly?: boolean; pageSize?: number }): AsyncGenerator<Checkpoint, void>;
}

export interface FieldViolation {
  field: string;
  description: string;
}

export class EffectdError extends Error {
  /** The gRPC status name, e.g. 'FAILED_PRECONDITION'. */
  readonly code: string;
  /** The ErrorReason name, e.g. 'INPUT_MISMATCH'; '' when the status has none. */
  readonly reason: string;
  /** The daemon's explanation (not for matching). */
  readonly details: string;
  readonly metadata: Record<string, string>;
  readonly violations: FieldViolation[];
  /** From google.rpc.RetryInfo: when to try again, if the daemon said; else null. */
  readonly retryDelayMs: number | null;
}

export interface ReasonErrorClass {
  new (...args: never[]): EffectdError;
  readonly reason: string;
}

/** One EffectdError subclass per ErrorReason value, e.g. errors.INPUT_MISMATCH. */
export const errors: Readonly<Record<string, ReasonErrorClass>> & {
  readonly REVISION_CONFLICT: { new (...args: never[]): EffectdError & { readonly currentRevision: number | undefined }; readonly reason: string };
};

export function fromServiceError(error: Error): EffectdError;

export class OutcomeUnknown extends Error {
  constructor(message?: string, options?: ErrorOptions);
  readonly outcomeUnknown: true;
}

/** The tool ran; the ledger could not record its outcome (`result`, or `error`; `cause` the ledger's failure). */
export class ResultNotRecorded extends OutcomeUnknown {
  readonly call: ToolCall;
  readonly result: unknown;
  readonly error: unknown;
}

/** The helper did not run the tool; `call` is the record as found. */
export class ToolCallStopped extends Error {
  readonly call: ToolCall;
}
export class ReconciliationNeeded extends ToolCallStopped {}
export class ApprovalPending extends ToolCallStopped {}
export class CallInProgress extends ToolCallStopped {}
export class RetryRequired extends ToolCallStopped {}
export class CallRejected extends ToolCallStopped {
  readonly result: ToolResult;
}
export class ToolFailed extends ToolCallStopped {
  readonly result: ToolResult;
  readonly errorCode: string;
  readonly errorMessage: string;
}

export interface ToolContext {
  /** For IDEMPOTENT_WRITE: 'runId:callId', the same on every attempt. */
  idempotencyKey: string | undefined;
  attempt: number;
  /** Aborted when the call runs past timeoutMs. */
  signal: AbortSignal;
  call: ToolCall;
}

export function safeToolCall<T = unknown>(
  client: Client,
  call: PrepareArgs & {
    timeoutMs?: number;
    heartbeatMs?: number;
    retryUnknown?: boolean;
    /** Error classes or predicates meaning "cannot know whether it acted": reported unknown. */
    unknownOn?: Array<(new (...args: never[]) => Error) | ((error: unknown) => boolean)>;
    /** Error classes or predicates that are definite failures; unknownOn wins. */
    definiteOn?: Array<(new (...args: never[]) => Error) | ((error: unknown) => boolean)>;
    /** Turns the returned value into the JSON value (or Buffer) committed and returned. */
    serialize?: (value: T) => unknown;
    /** Acknowledge the result once handed back (default true). */
    acknowledge?: boolean;
  },
  fn: (ctx: ToolContext) => T | Promise<T>,
): Promise<T>;
