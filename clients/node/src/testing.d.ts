import type { ChildProcess } from 'node:child_process';

export const DEFAULT_PYTHON: string;

export interface Daemon {
  target: string;
  socket: string;
  dataDir: string;
  process: ChildProcess;
  stop(): Promise<void>;
  stderr(): string;
}

export function startDaemon(options?: { python?: string; args?: string[]; readyTimeoutMs?: number }): Promise<Daemon>;
