"""The Vercel AI SDK driver: `tests/adapters/node/ai.mjs`, generateText one
step at a time with the SDK's MockLanguageModelV4 (scripted), the transcript
saved in the work directory after each step; the adapter is
`@effectd/client/ai`'s AiToolLedger, the control the bare tool. A pause is
the SDK's `tool-approval-request` or a `LedgerInterruption`; an answer is a
`tool-approval-response`; a finished step is run again by replaying the
transcript cut after its calls (`ledger.resume`)."""

from __future__ import annotations

from tests.adapters.drivers.node import NodeDriver

DRIVER = NodeDriver("node_ai", "ai", ("messages.json",))
