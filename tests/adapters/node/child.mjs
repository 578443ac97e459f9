// An agent written in Node, for the conformance suite's Node drivers (drivers/node_*.py):
//
//   node tests/adapters/node/child.mjs FRAMEWORK SPEC_JSON
//
// runs (or resumes) the run once, the framework's own way, with the adapter of
// @effectd/client (or the bare tool when `wrapped` is false), and prints its outcome as the last
// line of stdout: {"paused": [{"call_id", "kind", "arguments", "raw"}], "final": "..."}. SPEC's
// `command` is `run`, `replay` (the finished run's tool step again) or `answer` (an approval
// pause resumed with SPEC's `answer`). With `hook`, the model prints {"turn": n} before each turn
// and waits for a line on stdin (the driver runs the daemon-restart scenario's hook meanwhile).
import { requireNode } from './common.mjs';

// Each framework's agent: a module whose default export runs it (spec, client) -> outcome.
const FRAMEWORKS = {
  langgraph: './langgraph.mjs',
  ai: './ai.mjs',
  'openai-agents': './openai-agents.mjs',
  mcp: './mcp.mjs',
};

async function main() {
  const [framework, specText] = process.argv.slice(2);
  const spec = JSON.parse(specText);
  const { Client } = requireNode('./src/index.js');
  const effectd = new Client({ target: spec.target });
  try {
    const { default: agent } = await import(FRAMEWORKS[framework]);
    const outcome = await agent(spec, effectd);
    process.stdout.write(`${JSON.stringify({ outcome })}\n`);
  } finally {
    effectd.close();
  }
  process.exit(0);
}

main();
