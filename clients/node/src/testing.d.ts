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

/** How `startDaemon` runs effectd: `[python, '-m', 'sidecar']`, or the `effectd` command. */
export function daemonCommand(options?: { python?: string; command?: string | string[] }): string[];

export function startDaemon(options?: {
  /** The interpreter of `python -m sidecar`; default EFFECTD_PYTHON, else the repository's venv. */
  python?: string;
  /** Run this instead (e.g. `'effectd'` on PATH); default EFFECTD_COMMAND, else `effectd` when no venv. */
  command?: string | string[];
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

/** Where the first run of the agent dies (SIGKILL, nothing flushed). */
export const CrashPoint: Readonly<{
  /** The tool ran (its effect happened) and the commit was not sent. */
  BEFORE_COMMIT: 'before_commit';
  /** The result is committed; the agent never used it. */
  AFTER_COMMIT: 'after_commit';
}>;

export type CrashPointValue = (typeof CrashPoint)[keyof typeof CrashPoint];

export interface CrashReport<T = unknown> {
  /** The first run died at the point (false: it finished without committing anything). */
  crashed: boolean;
  /** What the resumed run returned. */
  resumed?: T;
  /** What the resumed run threw (e.g. ReconciliationNeeded after BEFORE_COMMIT). */
  resumedError?: unknown;
}

/**
 * Runs the agent exported by `agentModule` (`async (target, ...args) => ...`) in a child process
 * killed with SIGKILL at `at` of its first commit, then again in this process once the crashed
 * attempt's lease has run out, and reports what the second run saw.
 */
export function crashAndResume<T = unknown>(
  agentModule: string,
  target: string,
  options?: {
    /** More arguments of the agent (JSON values: they cross a process). */
    args?: unknown[];
    /** Default BEFORE_COMMIT. */
    at?: CrashPointValue;
    /** Default `agent` (then `default`, or the module itself). */
    exportName?: string;
    /** How long the child may take to reach the point; default 60 s. */
    timeoutMs?: number;
    /** Options of the Client that waits for the leases (token, tls...). */
    clientOptions?: Record<string, unknown>;
  },
): Promise<CrashReport<T>>;
