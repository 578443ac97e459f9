// The conformance suite's world (tests/adapters/world.py) for agents written in Node: the tool's
// body `book(item)` (one line appended, fsynced, to WORKDIR/effects, the side-effect counter the
// test process reads), the kill points of WORKDIR/kill, and the scripted model's final text.
import fs from 'node:fs';
import path from 'node:path';

const HOLD_MS = 60_000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export const resultText = (item) => `booked ${item}`;
export const finalText = (results) => `done: ${results.join(' | ')}`;

export function killPoint(workdir) {
  const file = path.join(workdir, 'kill');
  return fs.existsSync(file) ? fs.readFileSync(file, 'utf8').trim() : null;
}

export function die() {
  process.kill(process.pid, 'SIGKILL');
}

function append(file, entry) {
  const keys = Object.keys(entry).sort();
  const line = `{${keys.map((k) => `${JSON.stringify(k)}: ${JSON.stringify(entry[k])}`).join(', ')}}\n`;
  const fd = fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT, 0o600);
  try {
    fs.writeSync(fd, line);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** The tool's body, shared by every Node driver, with the scenario's kill points around it. */
export async function book(workdir, item) {
  const point = killPoint(workdir);
  if (point === 'before') die();
  if (point === 'siblings') return siblings(workdir, item);
  append(path.join(workdir, 'effects'), { item, pid: process.pid });
  if (point === 'inside') die();
  return resultText(item);
}

async function siblings(workdir, item) {
  const first = item === 'i1';
  if (first) append(path.join(workdir, 'effects'), { item, pid: process.pid });
  fs.writeFileSync(path.join(workdir, `in-${item}`), '');
  const want = Number(fs.readFileSync(path.join(workdir, 'siblings'), 'utf8'));
  const end = Date.now() + HOLD_MS;
  while (fs.readdirSync(workdir).filter((n) => n.startsWith('in-')).length < want) {
    if (Date.now() > end) throw new Error('the siblings never all reached the tool');
    await sleep(10);
  }
  if (first) die();
  await sleep(HOLD_MS); // the first call kills the process meanwhile
  throw new Error('not killed');
}

/** The scripted model's hook: at a turn's start and once it has its answer. */
export function modelTurn(workdir, turn, { answered }) {
  const point = killPoint(workdir);
  if (turn === 0) return;
  if (point === 'after' && !answered) die();
  if (point === 'after-model' && answered) die();
}
