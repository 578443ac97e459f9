import type { ChildProcess } from 'node:child_process';

export const DEFAULT_PYTHON: string;

export interface Daemon {
  target: string;
  /** The TCP listener's `HOST:PORT` (with `--listen`), else null. */
  tcp: string | null;
  socket: string;
  dataDir: string;
  process: ChildProcess;
  stop(): Promise<void>;
  stderr(): string;
}

export function startDaemon(options?: {
  python?: string;
  args?: string[];
  /** More environment variables of the daemon, e.g. `EFFECTD_TOKENS`. */
  env?: Record<string, string>;
  readyTimeoutMs?: number;
  /** Serve this data directory, kept at `stop()` (a restart finds the same ledger and socket). */
  dataDir?: string;
}): Promise<Daemon>;

export interface DeduplicationReport {
  key: string;
  writes: number;
  refusedRepeats: number;
  /** The requirements that passed, in order: fresh, first, repeated, concurrent, restarted, distinct. */
  passed: string[];
}

/** Evidence that a target de-duplicates on the idempotency key; throws DeduplicationNotProven. */
export function checkDeduplication(options: {
  write: (key: string, value: any) => unknown;
  count: (key: string) => number | Promise<number>;
  value?: unknown;
  repeats?: number;
  concurrency?: number;
  restart?: () => unknown;
  distinctKeys?: boolean;
  runId?: string;
}): Promise<DeduplicationReport>;

/** The key effectd hands an IDEMPOTENT_WRITE tool: `${runId}:${callId}`. */
export function idempotencyKey(runId: string, callId: string): string;

export class DeduplicationNotProven extends Error {
  readonly step: string;
}
