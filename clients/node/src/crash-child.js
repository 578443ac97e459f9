'use strict';
/**
 * The child process of `crashAndResume` (./crash.js): arms the crash at the first commit, then
 * runs the agent. `node crash-child.js '{"module", "exportName", "target", "args", "at"}'`.
 */

const { armCrash, loadAgent } = require('./crash');

async function main() {
  const { module: agentModule, exportName, target, args, at } = JSON.parse(process.argv[2]);
  armCrash(at);
  const agent = await loadAgent(agentModule, exportName);
  await agent(target, ...args);
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);
