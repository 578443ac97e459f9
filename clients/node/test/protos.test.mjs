// Loading the protos: effectd/v1 imports google/rpc/status.proto (the session stream's error), which
// this package ships; a protos directory holding only effectd/v1, and the packed package, load too.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { test } from 'node:test';

const run = promisify(execFile);
const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..');
const repoProtos = path.resolve(root, '..', '..', 'protos');

/** A directory with a copy of effectd/v1/*.proto and nothing else. */
function effectdOnly() {
  const dir = fs.mkdtempSync('/tmp/efd-protos-');
  fs.cpSync(path.join(repoProtos, 'effectd'), path.join(dir, 'effectd'), { recursive: true });
  return dir;
}

// Loads in a fresh process (the loaded protos are cached per process) and prints what it found.
const PROBE = `
const { load } = require(process.argv[1] + '/src/proto.js');
const { services } = load();
const session = services.ledger.service.Session;
console.log(JSON.stringify({ session: Boolean(session && session.requestStream && session.responseStream) }));
`;

test('ledger.proto imports google/rpc/status.proto: the repository protos load with it', async () => {
  assert.match(fs.readFileSync(path.join(repoProtos, 'effectd', 'v1', 'ledger.proto'), 'utf8'), /import "google\/rpc\/status.proto";/);
  const { stdout } = await run(process.execPath, ['-e', PROBE, root], { env: { ...process.env, EFFECTD_PROTOS_DIR: '' } });
  assert.deepEqual(JSON.parse(stdout), { session: true });
});

test('EFFECTD_PROTOS_DIR holding only effectd/v1 loads, google/rpc coming from the package', async () => {
  const dir = effectdOnly();
  try {
    assert.equal(fs.existsSync(path.join(dir, 'google')), false);
    const { stdout } = await run(process.execPath, ['-e', PROBE, root], { env: { ...process.env, EFFECTD_PROTOS_DIR: dir } });
    assert.deepEqual(JSON.parse(stdout), { session: true });
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('the packed package ships google/rpc and loads the protos with EFFECTD_PROTOS_DIR', async () => {
  const work = fs.mkdtempSync('/tmp/efd-pack-');
  const dir = effectdOnly();
  try {
    const { stdout } = await run('npm', ['pack', '--json', '--pack-destination', work], { cwd: root });
    const [packed] = JSON.parse(stdout);
    const files = packed.files.map((f) => f.path);
    assert.ok(files.includes('protos/google/rpc/status.proto'), files.join());
    assert.ok(files.includes('src/session.js'), files.join());
    await run('tar', ['-xzf', path.join(work, packed.filename), '-C', work]);
    const unpacked = path.join(work, 'package');
    // The unpacked package finds its dependencies where this checkout installed them.
    const env = { ...process.env, EFFECTD_PROTOS_DIR: dir, NODE_PATH: path.join(root, 'node_modules') };
    const probe = await run(process.execPath, ['-e', PROBE, unpacked], { env });
    assert.deepEqual(JSON.parse(probe.stdout), { session: true });
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
