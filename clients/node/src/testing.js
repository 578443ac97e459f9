'use strict';
/**
 * Testing helpers for a user's own tests: a real effectd daemon in a fresh temporary data
 * directory, serving on a Unix socket only, and a crash in the middle of a tool call.
 *
 *   const daemon = await startDaemon();
 *   const client = new Client({ target: daemon.target });
 *   ...
 *   await daemon.stop();
 *
 * The daemon is `python -m sidecar serve` with the interpreter from `python` or
 * `EFFECTD_PYTHON`, else the repository's `.venv/bin/python` when there is one, else the
 * `effectd` command on PATH (`command`, or `EFFECTD_COMMAND`, names another).
 *
 * `crashAndResume(agentModule, target, { at })` runs an agent in a child process that is
 * killed with SIGKILL at a point of its first commit, then runs it again in this process, as
 * the restarted agent would, and reports what the second run saw (see `./crash.js`).
 */

const { spawn } = require('node:child_process');
const { randomUUID } = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const DEFAULT_PYTHON = path.resolve(__dirname, '..', '..', '..', '.venv', 'bin', 'python');

/**
 * How to run effectd: `[python, '-m', 'sidecar']`, or the `effectd` command.
 * @returns {string[]}
 */
function daemonCommand({ python, command } = {}) {
  if (command) return Array.isArray(command) ? command : [command];
  const interpreter = python || process.env.EFFECTD_PYTHON;
  if (interpreter) return [interpreter, '-m', 'sidecar'];
  if (process.env.EFFECTD_COMMAND) return [process.env.EFFECTD_COMMAND];
  if (fs.existsSync(DEFAULT_PYTHON)) return [DEFAULT_PYTHON, '-m', 'sidecar'];
  return ['effectd'];
}

/**
 * @param {object} [options]
 * @param {string} [options.python] the interpreter of `python -m sidecar`; default
 *   EFFECTD_PYTHON, else the repository's .venv/bin/python, else `effectd` on PATH.
 * @param {string | string[]} [options.command] run this instead (e.g. `'effectd'` on PATH, or
 *   `['/opt/effectd/bin/effectd']`); `serve` and its arguments follow. Default EFFECTD_COMMAND.
 * @param {string[]} [options.args] more `effectd serve` arguments.
 * @param {Record<string, string>} [options.env] more environment variables of the daemon, e.g.
 *   `EFFECTD_TOKENS` (the tokens TOML) to require bearer tokens.
 * @param {number} [options.readyTimeoutMs] default 20 s.
 * @param {string} [options.dataDir] serve this data directory (kept at `stop()`, so that a daemon
 *   started on it again finds the same ledger on the same socket); default a fresh temporary one,
 *   removed at `stop()`. The daemon is started with `--init`: a new ledger is created there if the
 *   directory holds none.
 * @returns {Promise<{target: string, tcp: string | null, socket: string, dataDir: string, process: import('node:child_process').ChildProcess, stop: () => Promise<void>}>}
 */
async function startDaemon({
  python,
  command,
  args = ['--no-sync'],
  env = {},
  readyTimeoutMs = 20_000,
  dataDir: given,
} = {}) {
  // Unix socket paths are limited to ~107 bytes: keep the directory short.
  const base = os.platform() === 'win32' ? os.tmpdir() : '/tmp';
  const dataDir = given ? path.resolve(given) : fs.mkdtempSync(path.join(base, 'efd-'));
  const removeData = () => {
    if (!given) fs.rmSync(dataDir, { recursive: true, force: true });
  };
  const socket = path.join(dataDir, 'effectd.sock');
  const [program, ...before] = daemonCommand({ python, command });
  // --init: the directory is new on purpose (or holds the ledger of an earlier start, which
  // --init leaves as it is).
  const child = spawn(program, [...before, 'serve', '--data-dir', dataDir, '--init', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, ...env },
  });
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);

  let stderr = '';
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  try {
    await new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`effectd did not get ready in ${readyTimeoutMs} ms:\n${stderr}`)),
        readyTimeoutMs,
      );
      child.once('error', (error) => {
        clearTimeout(timer);
        reject(new Error(`cannot run ${program}: ${error.message}`));
      });
      exited.then(({ code, signal }) => {
        clearTimeout(timer);
        reject(new Error(`effectd exited (${code ?? signal}) before it was ready:\n${stderr}`));
      });
      child.stderr.setEncoding('utf8');
      child.stderr.on('data', (chunk) => {
        stderr += chunk;
        // The whole ready line: it names the TCP address too.
        if (/\bready on [^\n]*\n/.test(stderr) && fs.existsSync(socket)) {
          clearTimeout(timer);
          resolve();
        }
      });
    });
  } catch (error) {
    child.kill('SIGKILL');
    await exited;
    process.removeListener('exit', killOnExit);
    removeData();
    throw error;
  }

  async function stop() {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    }
    process.removeListener('exit', killOnExit);
    removeData();
  }

  // "effectd X ready on unix:PATH and HOST:PORT" when a TCP listener was asked for.
  const tcp = stderr.match(/\bready on \S+ and (\S+)/)?.[1] ?? null;
  return { target: `unix:${socket}`, tcp, socket, dataDir, process: child, stop, stderr: () => stderr };
}

/**
 * Evidence that a target system de-duplicates on the idempotency key (ADR-010: "effectively once"
 * must be proven by the target system's own tests; effectd proves only that it does not repeat a
 * call itself). A tool owner runs it in their test suite against a real (test) instance of the target;
 * when it passes, the operator may list the tool as proven (`[tools.NAME] idempotency_proven = true`),
 * which matters once the policy sets `[retry] require_idempotency_proof = true`.
 *
 * `write(key, value)` performs the tool's effect with idempotency key `key`; `count(key)` says how many
 * effects the target holds for it. Required, in order (the step names the failure):
 *   fresh       no effect for a new key yet
 *   first       one write makes exactly one effect
 *   repeated    writes repeated with the same key add none
 *   concurrent  writes racing with a new key make exactly one effect
 *   restarted   after `restart()` (when given) a repeat adds none: the de-duplication is durable
 *   distinct    another key makes its own effect and the first key's count does not move
 * A repeat that throws (a refused duplicate, e.g. 409) is counted, not a failure.
 *
 * @param {object} options
 * @param {(key: string, value: any) => any} options.write may return a promise.
 * @param {(key: string) => number | Promise<number>} options.count
 * @param {*} [options.value] the tool's input, passed to every write.
 * @param {number} [options.repeats] default 3.
 * @param {number} [options.concurrency] default 4 racing writes.
 * @param {() => any} [options.restart] restarts the target (or its de-duplication store).
 * @param {boolean} [options.distinctKeys] default true; off only for a target that de-duplicates by content.
 * @param {string} [options.runId] default a fresh one.
 * @returns {Promise<{key: string, writes: number, refusedRepeats: number, passed: string[]}>}
 * @throws {DeduplicationNotProven} with `step`.
 */
async function checkDeduplication({
  write,
  count,
  value = null,
  repeats = 3,
  concurrency = 4,
  restart,
  distinctKeys = true,
  runId = `dedup-check-${randomUUID().slice(0, 12)}`,
}) {
  if (repeats < 1 || concurrency < 2) throw new RangeError('repeats must be at least 1 and concurrency at least 2');
  const key = idempotencyKey(runId, 'call-1');
  const other = idempotencyKey(runId, 'call-2');
  const racing = idempotencyKey(runId, 'call-3');
  const report = { key, writes: 0, refusedRepeats: 0, passed: [] };
  const expect = async (step, k, want, what) => {
    const got = await count(k);
    if (got !== want) throw new DeduplicationNotProven(step, `${what}: count(${JSON.stringify(k)}) is ${got}, expected ${want}`);
  };
  const again = async (k) => {
    report.writes += 1;
    try {
      await write(k, value);
    } catch {
      report.refusedRepeats += 1; // A target may refuse a duplicate: not a failure.
    }
  };
  await expect('fresh', key, 0, 'a new key already has effects');
  report.passed.push('fresh');
  report.writes += 1;
  await write(key, value);
  await expect('first', key, 1, 'one write');
  report.passed.push('first');
  for (let i = 0; i < repeats; i += 1) await again(key);
  await expect('repeated', key, 1, `${repeats} repeats`);
  report.passed.push('repeated');
  await expect('concurrent', racing, 0, 'a new key has effects');
  await Promise.all(Array.from({ length: concurrency }, () => again(racing)));
  await expect('concurrent', racing, 1, `${concurrency} racing first writes`);
  report.passed.push('concurrent');
  if (restart) {
    await restart();
    await again(key);
    await expect('restarted', key, 1, 'a repeat after a restart');
    report.passed.push('restarted');
  }
  if (distinctKeys) {
    await write(other, value);
    await expect('distinct', other, 1, "another key's write");
    await expect('distinct', key, 1, "after another key's write");
    report.passed.push('distinct');
  }
  return report;
}

/** The key effectd hands an IDEMPOTENT_WRITE tool (scheme 1, ADR-010 D2). */
function idempotencyKey(runId, callId) {
  return `${runId}:${callId}`;
}

/** The target did not show de-duplication on the key; `step` names the failed requirement. */
class DeduplicationNotProven extends Error {
  constructor(step, message) {
    super(`${step}: ${message}`);
    this.name = 'DeduplicationNotProven';
    this.step = step;
  }
}

const { crashAndResume, CrashPoint } = require('./crash');

module.exports = {
  startDaemon,
  daemonCommand,
  DEFAULT_PYTHON,
  checkDeduplication,
  idempotencyKey,
  DeduplicationNotProven,
  crashAndResume,
  CrashPoint,
};
