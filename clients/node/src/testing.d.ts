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
}): Promise<Daemon>;
