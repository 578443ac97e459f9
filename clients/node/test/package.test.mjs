// The package surface: the public exports, and the README example, run as written.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { test } from 'node:test';
import * as index from '../src/index.js';
import { startDaemon } from '../src/testing.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..');

test('the public exports are exactly these (and ESM named imports see them all)', () => {
  const names = Object.keys(index).filter((name) => name !== 'default').sort();
  assert.deepEqual(names, [
    'ApprovalPending',
    'CallInProgress',
    'CallRejected',
    'Client',
    'DEFAULT_TARGET',
    'EffectdError',
    'OutcomeUnknown',
    'ReconciliationNeeded',
    'ResultNotRecorded',
    'RetryRequired',
    'ToolCallStopped',
    'ToolFailed',
    'errors',
    'fromServiceError',
    'safeToolCall',
  ]);
});

test('package.json pins exact dependency versions and tests with node --test', () => {
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
  for (const [name, version] of Object.entries(pkg.dependencies)) {
    assert.match(version, /^\d+\.\d+\.\d+$/, `${name} is not pinned: ${version}`);
  }
  // Node's own runner, no framework; test files run a few at a time.
  assert.match(pkg.scripts.test, /^node --test( --test-concurrency=\d+)?$/);
  const lock = JSON.parse(fs.readFileSync(path.join(root, 'package-lock.json'), 'utf8'));
  assert.deepEqual(lock.packages[''].dependencies, pkg.dependencies);
});

test('the README example runs as written against a daemon in ./.effectd', async () => {
  const readme = fs.readFileSync(path.join(root, 'README.md'), 'utf8');
  const example = readme.match(/```js\n([\s\S]*?)```/)[1];
  const daemon = await startDaemon();
  try {
    // The example's relative target, .effectd/effectd.sock, seen from a working directory.
    const cwd = fs.mkdtempSync('/tmp/efd-readme-');
    fs.symlinkSync(daemon.dataDir, path.join(cwd, '.effectd'));
    const script = path.join(cwd, 'example.js');
    fs.writeFileSync(script, example.replace("require('@effectd/client')", `require(${JSON.stringify(root)})`));
    try {
      const { stdout } = await promisify(execFile)(process.execPath, [script], { cwd, timeout: 15_000 });
      assert.match(stdout, /orderId: 'o-1'[\s\S]*orderId: 'o-1'/);
      // safeToolCall acknowledged call-1 when it handed the result back; the
      // RPCs one by one acknowledged nothing.
      assert.match(stdout, /call-1 ALREADY_DELIVERED\ncall-2 REPLAY_RESULT/);
    } finally {
      fs.rmSync(cwd, { recursive: true, force: true });
    }
  } finally {
    await daemon.stop();
  }
});
