// @effectd/client/policy: the operator's tool policy, in the words, TOML layout and error
// messages of the Python client's effectd_client.policy.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ToolPolicy, PolicyError, EFFECT_NAMES } from '../src/policy.js';
import { mcpPolicyFromToml, decideEffect, McpPolicyError } from '../src/mcp.js';

const FILE = `
require_approval = false

[tools.search_flights]
effect = "read"
retry_unknown = true

[tools.update_profile]
effect = "idempotent-write"

[tools.book_flight]
effect = "side-effect"
require_approval = true
`;

describe('decide', () => {
  const policy = ToolPolicy.fromToml(FILE);
  // Each row: tool -> the decision the file gives (ADR-010 D2: unnamed is a SIDE_EFFECT).
  const rows = [
    ['search_flights', { effect: 'READ', requireApproval: false, retryUnknown: true }],
    ['update_profile', { effect: 'IDEMPOTENT_WRITE', requireApproval: false, retryUnknown: undefined }],
    ['book_flight', { effect: 'SIDE_EFFECT', requireApproval: true, retryUnknown: undefined }],
    ['unnamed', { effect: 'SIDE_EFFECT', requireApproval: false, retryUnknown: undefined }],
  ];
  for (const [tool, decision] of rows) {
    test(`${tool} decides ${JSON.stringify(decision)}`, () => {
      assert.deepEqual(policy.decide(tool), decision);
    });
  }

  test("the policy's require_approval is the default of tools without their own word", () => {
    const p = ToolPolicy.fromToml('require_approval = true\n[tools.a]\nrequire_approval = false\n[tools.b]\neffect = "read"\n');
    assert.equal(p.decide('a').requireApproval, false);
    assert.equal(p.decide('b').requireApproval, true);
    assert.equal(p.decide('c').requireApproval, true);
  });

  test('in code: rules by tool name, a bare effect name a rule with just that effect', () => {
    const p = ToolPolicy.of({ search: 'READ', book: { requireApproval: true } });
    assert.deepEqual(p.decide('search'), { effect: 'READ', requireApproval: false, retryUnknown: undefined });
    assert.deepEqual(p.decide('book'), { effect: 'SIDE_EFFECT', requireApproval: true, retryUnknown: undefined });
    assert.equal(ToolPolicy.of(p), p);
    assert.deepEqual(ToolPolicy.of(undefined).decide('x'), { effect: 'SIDE_EFFECT', requireApproval: false, retryUnknown: undefined });
  });

  test("the caller's object changed later changes no policy", () => {
    const rules = { search: 'READ' };
    const p = new ToolPolicy(rules);
    rules.search = 'SIDE_EFFECT';
    rules.other = 'READ';
    assert.equal(p.decide('search').effect, 'READ');
    assert.equal(p.decide('other').effect, 'SIDE_EFFECT');
    assert.ok(Object.isFrozen(p) && Object.isFrozen(p.tools));
  });

  test('a tool named like an Object.prototype member is still unnamed', () => {
    assert.equal(ToolPolicy.of({}).decide('constructor').effect, 'SIDE_EFFECT');
    assert.equal(ToolPolicy.of({}).decide('toString').requireApproval, false);
  });

  test('the file words are those of the Python client', () => {
    assert.deepEqual(EFFECT_NAMES, { read: 'READ', 'idempotent-write': 'IDEMPOTENT_WRITE', 'side-effect': 'SIDE_EFFECT' });
  });
});

describe('a wrong setting is named (the Python messages)', () => {
  const rows = [
    ['x = 1', "policy: unknown setting 'x'"],
    ['tools = 1', 'tools: must be a table'],
    ['require_approval = "yes"', 'require_approval: must be true or false'],
    ['[tools]\na = 1', 'tools.a: must be a table'],
    ['[tools.a]\nzeta = 1\nbeta = 2', "tools.a: unknown setting 'beta'"],
    ['[tools.a]\neffect = "write"', 'tools.a.effect: one of read, idempotent-write, side-effect'],
    ['[tools.a]\neffect = "READ"', 'tools.a.effect: one of read, idempotent-write, side-effect'],
    ['[tools.a]\neffect = "toString"', 'tools.a.effect: one of read, idempotent-write, side-effect'],
    ['[tools.a]\nrequire_approval = 1', 'tools.a.require_approval: must be true or false'],
    ['[tools.a]\nretry_unknown = "true"', 'tools.a.retry_unknown: must be true or false'],
  ];
  for (const [text, message] of rows) {
    test(`${JSON.stringify(text)} -> ${message}`, () => {
      assert.throws(() => ToolPolicy.fromToml(text), (e) => e instanceof PolicyError && e.message === message);
    });
  }

  test('a text that is not TOML', () => {
    assert.throws(() => ToolPolicy.fromToml('[['), (e) => e instanceof PolicyError && e.message.startsWith('not valid TOML: '));
  });

  test('rules in code are checked too', () => {
    assert.throws(() => ToolPolicy.of({ a: 'read' }), /tools\.a\.effect: one of READ, IDEMPOTENT_WRITE, SIDE_EFFECT/);
    assert.throws(() => ToolPolicy.of({ a: { retryUnknown: 'yes' } }), /tools\.a\.retryUnknown: must be true or false/);
    assert.throws(() => ToolPolicy.of({ a: { retry_unknown: true } }), /tools\.a: unknown setting 'retry_unknown'/);
  });
});

describe("the MCP policy's TOML layout (the Python McpPolicy's)", () => {
  test('servers and pinned tools, in the same words', () => {
    const policy = mcpPolicyFromToml(`
[servers.mail]
require_approval = true

[servers.mail.tools.search]
effect = "read"
require_approval = false
`);
    assert.deepEqual(decideEffect(policy, 'mail', 'search'), { effect: 'READ', requireApproval: false, reason: 'pinned by the policy' });
    assert.equal(decideEffect(policy, 'mail', 'send').requireApproval, true);
    assert.equal(decideEffect(policy, 'mail', 'send').effect, 'SIDE_EFFECT');
  });

  test('retry_unknown is not an MCP setting: an MCP call of unknown outcome is never sent again', () => {
    assert.throws(
      () => mcpPolicyFromToml('[servers.mail.tools.send]\nretry_unknown = true'),
      (e) => e instanceof PolicyError && e.message === "servers.mail.tools.send: unknown setting 'retry_unknown'",
    );
    assert.throws(() => mcpPolicyFromToml('[servers.mail]\ntrusted = "yes"'), /servers\.mail\.trusted: must be true or false/);
    assert.ok(new McpPolicyError('x') instanceof PolicyError);
  });
});
