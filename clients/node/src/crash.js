'use strict';
/**
 * A crash in the middle of a tool call, for a user's own tests: the way effectd's tests prove
 * that a tool runs at most once (the Node twin of `effectd_client.testing.crash_and_resume`).
 *
 *   const report = await crashAndResume(require.resolve('./agent.js'), daemon.target, {
 *     args: ['trip-1'],
 *     at: CrashPoint.BEFORE_COMMIT,
 *   });
 *   assert.ok(report.crashed);
 *   assert.ok(report.resumedError instanceof ReconciliationNeeded);
 *   assert.equal(bookings(), 1);
 *
 * The agent is a module exporting `async (target, ...args) => ...` (as `agent`, `default`, or
 * `module.exports` itself) that makes its tool calls through this package (`safeToolCall`,
 * `LedgeredMcpClient`, or its own `Client` calls). It runs first in a child process whose
 * `Client#commitTool` kills the process with SIGKILL before (BEFORE_COMMIT: the tool's effect
 * happened, its result is not recorded) or right after (AFTER_COMMIT: recorded, never used) its
 * first commit; then, once the crashed attempt's lease has run out (give the agent a short
 * `leaseMs`), the same function runs again in this process, as the restarted agent would.
 * The child must load this same copy of `@effectd/client` (one install in node_modules).
 */

const { spawn } = require('node:child_process');
const path = require('node:path');
const { pathToFileURL } = require('node:url');
const { Client } = require('./client');

const CrashPoint = Object.freeze({
  /** The tool ran (its effect happened) and the commit was not sent. */
  BEFORE_COMMIT: 'before_commit',
  /** The result is committed; the agent never used it. */
  AFTER_COMMIT: 'after_commit',
});

// Bounded waits: how long a crashed call's lease may take to run out.
const LEASE_WAIT_MS = 120_000;
const POLL_MS = 100;

/** The agent function a module exports: `exportName`, `agent`, `default`, or the module itself. */
async function loadAgent(modulePath, exportName) {
  const ns = await import(pathToFileURL(path.resolve(modulePath)).href);
  const candidates = [ns[exportName], ns.default?.[exportName], ns.agent, ns.default?.agent, ns.default];
  const fn = candidates.find((candidate) => typeof candidate === 'function');
  if (!fn) throw new TypeError(`${modulePath} exports no agent function (${exportName}, agent or default)`);
  return fn;
}

function checkPoint(at) {
  if (!Object.values(CrashPoint).includes(at)) throw new RangeError(`at: one of ${Object.values(CrashPoint).join(', ')}`);
}

/** In the child: SIGKILL before, or right after, the first commit. */
function armCrash(at) {
  checkPoint(at);
  const commit = Client.prototype.commitTool;
  Client.prototype.commitTool = async function crashingCommit(...args) {
    if (at === CrashPoint.AFTER_COMMIT) await commit.apply(this, args);
    process.kill(process.pid, 'SIGKILL');
    // Not reached: the signal cannot be caught. Never let the call answer.
    return new Promise(() => {});
  };
}

/** Lets the crashed attempts' leases run out and has the daemon find them (Recover marks them UNKNOWN). */
async function expireLeases(target, clientOptions, deadline) {
  const client = new Client({ ...clientOptions, target });
  try {
    while (Date.now() < deadline) {
      const started = [];
      for await (const call of client.listToolCalls({ states: ['STARTED'] })) started.push(call);
      if (started.length === 0) return;
      for (const runId of new Set(started.map((call) => call.runId))) await client.recover({ runId });
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
    throw new Error("the crashed call's lease did not run out");
  } finally {
    client.close();
  }
}

/**
 * Runs `agent(target, ...args)` from `agentModule` in a child process killed at `at`, then again
 * in this process, and reports what the second run saw.
 *
 * @param {string} agentModule path of the module that exports the agent function.
 * @param {string} target the daemon's target (`startDaemon().target`).
 * @param {object} [options]
 * @param {any[]} [options.args] more arguments of the agent (JSON values: they cross a process).
 * @param {string} [options.at] a `CrashPoint`; default BEFORE_COMMIT.
 * @param {string} [options.exportName] default `agent` (then `default`, or the module itself).
 * @param {number} [options.timeoutMs] how long the child may take to reach the point; default 60 s.
 * @param {object} [options.clientOptions] options of the `Client` that waits for the leases
 *   (`token`, `tls`...).
 * @returns {Promise<{crashed: boolean, resumed?: any, resumedError?: any}>} `crashed` is false
 *   when the child finished without committing anything.
 */
async function crashAndResume(
  agentModule,
  target,
  { args = [], at = CrashPoint.BEFORE_COMMIT, exportName = 'agent', timeoutMs = 60_000, clientOptions = {} } = {},
) {
  checkPoint(at); // refused here, not in the child
  const agent = await loadAgent(agentModule, exportName);
  const spec = JSON.stringify({ module: path.resolve(agentModule), exportName, target, args, at });
  const child = spawn(process.execPath, [path.join(__dirname, 'crash-child.js'), spec], {
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const exited = new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code, signal) => resolve({ code, signal }));
  });
  let timer;
  const timedOut = new Promise((resolve) => {
    timer = setTimeout(() => resolve(null), timeoutMs);
  });
  const ended = await Promise.race([exited, timedOut]);
  clearTimeout(timer);
  if (ended === null) {
    child.kill('SIGKILL');
    await exited;
    throw new Error(`the agent did not reach ${at} within ${timeoutMs} ms`);
  }
  const crashed = ended.signal === 'SIGKILL';
  await expireLeases(target, clientOptions, Date.now() + LEASE_WAIT_MS);
  try {
    return { crashed, resumed: await agent(target, ...args) };
  } catch (error) {
    return { crashed, resumedError: error };
  }
}

module.exports = { crashAndResume, CrashPoint, armCrash, loadAgent };
