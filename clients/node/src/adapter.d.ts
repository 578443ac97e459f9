import type { ToolCall } from './index';

/** The ledger stopped a tool call: the run ends here. */
export class LedgerInterruption extends Error {
  /** The client's reason: ReconciliationNeeded, ApprovalPending, CallInProgress, RetryRequired, a refusal, or the tool's unknown outcome. */
  cause: unknown;
  /** The ledger's record of the call, when known. */
  call: ToolCall | null;
  /** Every call of the run waiting for a human (UNKNOWN, AWAITING_APPROVAL), in the daemon's judgement. */
  calls: ToolCall[];
}

/** The arguments an approval shows are not those effectd recorded: nothing was decided. */
export class ApprovalMismatch extends Error {}
