import type { Client } from './client';
import type { ToolPolicy, ToolRule, Effect } from './policy';
import { LedgerInterruption, ApprovalMismatch } from './adapter';

export { LedgerInterruption, ApprovalMismatch };

/** What code declares for one tool, over the policy's word. */
export interface DeclaredTool {
  effect?: Effect;
  retryUnknown?: boolean;
  /** Error classes or predicates that leave the outcome unknown. */
  unknownOn?: Array<Function>;
}

/** The Vercel AI SDK's tools of one run through the ledger. */
export class AiToolLedger {
  constructor(
    effectd: Client,
    options: { runId: string; policy?: ToolPolicy | Record<string, Effect | ToolRule>; leaseMs?: number; timeoutMs?: number },
  );
  readonly runId: string;
  readonly policy: ToolPolicy;
  /** The interruption of the last stop, or null. */
  interruption: LedgerInterruption | null;
  /** A StopCondition for generateText / streamText: true once the ledger stopped a call. */
  readonly stopWhen: (options: { steps: unknown[] }) => boolean;
  /** A copy of the ToolSet whose execute and needsApproval go through the ledger. */
  tools<T extends Record<string, any>>(toolset: T, declared?: Partial<Record<keyof T, DeclaredTool>>): T;
  /** result.response.messages without the results of the calls the ledger stopped. */
  responseMessages(result: { response: { messages: any[] } }): any[];
  /** The messages with the results of the last step's calls, run through the ledger. */
  resume<M extends any[]>(messages: M): Promise<M>;
  /** Approves the call of a tool-approval-request part in effectd; returns the tool-approval-response part. */
  approve(request: { type: 'tool-approval-request'; approvalId: string; toolCall: { toolCallId: string; toolName: string; input: unknown } }, options: { approver: string; reason?: string }): Promise<{ type: 'tool-approval-response'; approvalId: string; approved: boolean; reason?: string }>;
  reject(request: { type: 'tool-approval-request'; approvalId: string; toolCall: { toolCallId: string; toolName: string; input: unknown } }, options: { approver: string; reason?: string }): Promise<{ type: 'tool-approval-response'; approvalId: string; approved: boolean; reason?: string }>;
}
