'use strict';
/**
 * Testing helper: a real effectd daemon in a fresh temporary data directory,
 * serving on a Unix socket only.
 *
 *   const daemon = await startDaemon();
 *   const client = new Client({ target: daemon.target });
 *   ...
 *   await daemon.stop();
 *
 * The daemon is `python -m sidecar serve`, with the interpreter from
 * `EFFECTD_PYTHON`, by default the repository's `.venv/bin/python`.
 */

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const DEFAULT_PYTHON = path.resolve(__dirname, '..', '..', '..', '.venv', 'bin', 'python');

/**
 * @param {object} [options]
 * @param {string} [options.python] default EFFECTD_PYTHON, else ../../.venv/bin/python.
 * @param {string[]} [options.args] more `effectd serve` arguments.
 * @param {Record<string, string>} [options.env] more environment variables of the daemon, e.g.
 *   `EFFECTD_TOKENS` (the tokens TOML) to require bearer tokens.
 * @param {number} [options.readyTimeoutMs] default 20 s.
 * @returns {Promise<{target: string, tcp: string | null, socket: string, dataDir: string, process: import('node:child_process').ChildProcess, stop: () => Promise<void>}>}
 */
async function startDaemon({
  python = process.env.EFFECTD_PYTHON || DEFAULT_PYTHON,
  args = ['--no-sync'],
  env = {},
  readyTimeoutMs = 20_000,
} = {}) {
  // Unix socket paths are limited to ~107 bytes: keep the directory short.
  const base = os.platform() === 'win32' ? os.tmpdir() : '/tmp';
  const dataDir = fs.mkdtempSync(path.join(base, 'efd-'));
  const socket = path.join(dataDir, 'effectd.sock');
  const child = spawn(python, ['-m', 'sidecar', 'serve', '--data-dir', dataDir, ...args], {
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
        reject(new Error(`cannot run ${python}: ${error.message}`));
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
    fs.rmSync(dataDir, { recursive: true, force: true });
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
    fs.rmSync(dataDir, { recursive: true, force: true });
  }

  // "effectd X ready on unix:PATH and HOST:PORT" when a TCP listener was asked for.
  const tcp = stderr.match(/\bready on \S+ and (\S+)/)?.[1] ?? null;
  return { target: `unix:${socket}`, tcp, socket, dataDir, process: child, stop, stderr: () => stderr };
}

module.exports = { startDaemon, DEFAULT_PYTHON };
