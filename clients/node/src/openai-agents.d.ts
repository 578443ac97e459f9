import type { Client } from './client';
import type { ToolCall } from './index';
import type { ToolPolicy, ToolRule, Effect } from './policy';
import { LedgerInterruption, ApprovalMismatch } from './adapter';

export { LedgerInterruption, ApprovalMismatch };

/** A ledgered tool was called outside ledger.run(runId, ...). */
export class NoLedgerRun extends Error {}

/** The LedgerInterruption an SDK error carries (a ToolCallError's `error`), or null. */
export function interruptionOf(error: unknown): LedgerInterruption | null;

export interface DeclaredTool {
  effect?: Effect;
  retryUnknown?: boolean;
  /** After this a call's outcome is unknown (recorded UNKNOWN, the run ends). */
  timeoutMs?: number;
  unknownOn?: Array<Function>;
}

/** OpenAI Agents JS function tools through the ledger. */
export class AgentLedger {
  constructor(effectd: Client, options?: { policy?: ToolPolicy | Record<string, Effect | ToolRule>; leaseMs?: number });
  readonly policy: ToolPolicy;
  /** Runs fn with every ledgered call keyed by runId. */
  run<T>(runId: string, fn: () => T): T;
  /** A copy of a FunctionTool (made with errorFunction: null) whose calls go through the ledger. */
  tool<T extends { type: 'function'; name: string; invoke: Function }>(tool: T, declared?: DeclaredTool): T;
  approve(item: { rawItem: { callId?: string; name: string; arguments: string } }, options: { approver: string; reason?: string; state?: { approve(item: unknown): void }; runId?: string }): Promise<ToolCall>;
  reject(item: { rawItem: { callId?: string; name: string; arguments: string } }, options: { approver: string; reason?: string; state?: { reject(item: unknown): void }; runId?: string }): Promise<ToolCall>;
  /** Applies effectd's decisions to a restored RunState's interruptions; returns those still waiting. */
  applyDecisions<S extends { getInterruptions(): any[]; approve(item: any): void; reject(item: any): void }>(state: S, options?: { runId?: string }): Promise<any[]>;
}
