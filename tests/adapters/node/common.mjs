// What the Node agents of the conformance suite share: the package's own modules and frameworks
// (clients/node's node_modules), and the daemon-restart scenario's hook.
import { createRequire } from 'node:module';
import readline from 'node:readline';

/** `require` from the Node package: @effectd/client's sources and the pinned frameworks. */
export const requireNode = createRequire(new URL('../../../clients/node/package.json', import.meta.url));

let lines;
/** Before each model turn: the driver's hook, when the spec asks for it (a line each way). */
export async function beforeTurn(spec, turn) {
  if (!spec.hook) return;
  lines ??= readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  process.stdout.write(`${JSON.stringify({ turn })}\n`);
  await lines.next();
}
