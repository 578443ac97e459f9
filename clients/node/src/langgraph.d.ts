import type { Client } from './client';
import type { ToolPolicy, ToolRule, Effect } from './policy';
import { ApprovalMismatch } from './adapter';

export { ApprovalMismatch };

/** The error code of a tool whose failure became ToolNode's error ToolMessage (the tool ran). */
export const TOOL_ERROR: 'LANGGRAPH_TOOL_ERROR';
/** The key of an interrupt's value that says it comes from effectd: its kind. */
export const KIND: 'effectd';

export type InterruptKind = 'approval' | 'reconcile' | 'retry' | 'in_progress';

/** One call waiting for a human, as an interrupt shows it. */
export interface LedgerRequest {
  effectd: InterruptKind;
  runId: string;
  callId: string;
  tool: string;
  arguments: unknown;
  effect: Effect;
  state: string;
  inputFingerprint: string;
  revision: number;
  message: string;
}

/** An interrupt's value: the first call waiting, every call of the step waiting (`calls`), why an answer was refused. */
export interface LedgerInterrupt extends LedgerRequest {
  calls: LedgerRequest[];
  refused?: string;
}

/** A resume value deciding (or retrying) one call. */
export interface LedgerAnswer {
  runId: string;
  callId: string;
  inputFingerprint: string;
  arguments: unknown;
  revision?: number;
  approve?: boolean;
  approver?: string;
  reason?: string;
  retry?: true;
}

/** The graph run's `configurable.thread_id`: the default run id. */
export function threadRunId(config: { configurable?: Record<string, unknown> }): string;
/** The resume value approving the call an approval interrupt shows, bound to its arguments. */
export function approve(value: LedgerRequest, options: { approver: string; reason?: string }): LedgerAnswer;
/** The resume value rejecting it: the tool never runs, the model reads the rejection. */
export function reject(value: LedgerRequest, options: { approver: string; reason?: string }): LedgerAnswer;
/** The resume value running a READ / IDEMPOTENT_WRITE of unknown outcome again. */
export function retry(value: LedgerRequest): LedgerAnswer;

/** LangGraph.js ToolNode calls through the ledger. */
export class LedgeredToolCalls {
  constructor(
    effectd: Client,
    options?: {
      policy?: ToolPolicy | Record<string, Effect | ToolRule>;
      runId?: (config: any) => string;
      approver?: Client;
      leaseMs?: number;
      timeoutMs?: number;
      inProgressWaitMs?: number;
      requireSyncDurability?: boolean;
    },
  );
  readonly policy: ToolPolicy;
  /** A ToolNode (`@langchain/langgraph/prebuilt`) of the tools, each call through the ledger. */
  toolNode(tools: any[], options?: { name?: string; tags?: string[] }): any;
}
