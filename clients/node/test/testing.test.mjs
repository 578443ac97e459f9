// checkDeduplication: a target that de-duplicates durably on the key passes; each flaw is caught at its step.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { checkDeduplication, DeduplicationNotProven, idempotencyKey } from '../src/testing.js';

const RUN = 'owner-test';

function target({ dedup = true, racy = false, forgetful = false, countAll = false } = {}) {
  let seen = new Set();
  const effects = new Map();
  return {
    async write(key) {
      const present = seen.has(key);
      if (racy) await new Promise((resolve) => setImmediate(resolve)); // every racer checks first
      if (dedup && present) return;
      seen.add(key);
      effects.set(key, (effects.get(key) ?? 0) + 1);
    },
    async count(key) {
      if (countAll) return [...effects.values()].reduce((a, b) => a + b, 0);
      return effects.get(key) ?? 0;
    },
    async restart() {
      if (forgetful) seen = new Set();
    },
  };
}

const check = (t) => checkDeduplication({ write: t.write, count: t.count, value: 1, restart: t.restart, runId: RUN });

describe('checkDeduplication', () => {
  test('a target that de-duplicates durably on the key passes every step', async () => {
    const report = await check(target());
    assert.deepEqual(report.passed, ['fresh', 'first', 'repeated', 'concurrent', 'restarted', 'distinct']);
    assert.equal(report.key, idempotencyKey(RUN, 'call-1'));
    assert.equal(report.key, 'owner-test:call-1');
  });

  for (const [name, options, step] of [
    ['no de-duplication', { dedup: false }, 'repeated'],
    ['check then write', { racy: true }, 'concurrent'],
    ['de-duplication in memory only', { forgetful: true }, 'restarted'],
    ['a count that ignores the key', { countAll: true }, 'concurrent'],
  ]) {
    test(`negative control: ${name} is caught at ${step}`, async () => {
      await assert.rejects(check(target(options)), (error) => error instanceof DeduplicationNotProven && error.step === step);
    });
  }

  test('a refused duplicate is counted, not a failure', async () => {
    const t = target();
    const refusing = {
      ...t,
      async write(key) {
        if ((await t.count(key)) > 0) throw new Error('409 Conflict');
        return t.write(key);
      },
    };
    const report = await check(refusing);
    // The 3 repeats and the one after the restart; the racing writes all pass its check at once.
    assert.equal(report.refusedRepeats, 3 + 1);
  });
});
