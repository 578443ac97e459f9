'use strict';
/**
 * `@effectd/client/policy`: the operator's tool policy, shared by the framework adapters: each
 * tool's effect, whether its calls wait for an approver, and whether a call of unknown outcome
 * runs again. The same vocabulary, TOML layout and error messages as the Python client's
 * `effectd_client.policy`.
 *
 * A framework's tool carries no trustworthy word on what it does to the world, so the effect is
 * the operator's to say, by tool name; a tool nobody named is a SIDE_EFFECT without approval
 * (ADR-010 D2). Free of I/O and of any framework.
 *
 *     require_approval = false     # default for tools without their own word
 *
 *     [tools.search_flights]
 *     effect = "read"              # "read" | "idempotent-write" | "side-effect"
 *     retry_unknown = true         # run a call of unknown outcome again
 *
 *     [tools.book_flight]
 *     effect = "side-effect"
 *     require_approval = true
 *
 *   const { ToolPolicy } = require('@effectd/client/policy');
 *   const policy = ToolPolicy.fromToml(fs.readFileSync('tools.toml', 'utf8'));
 *   policy.decide('book_flight'); // { effect: 'SIDE_EFFECT', requireApproval: true, retryUnknown: undefined }
 */

/** The policy file's words for the effects, and the client's names they stand for. */
const EFFECT_NAMES = Object.freeze({
  read: 'READ',
  'idempotent-write': 'IDEMPOTENT_WRITE',
  'side-effect': 'SIDE_EFFECT',
});
const EFFECTS = new Set(Object.values(EFFECT_NAMES));
/** The settings of one tool's table. */
const RULE_KEYS = Object.freeze(['effect', 'require_approval', 'retry_unknown']);

/** A tool or MCP policy is invalid; the message names the setting. */
class PolicyError extends Error {
  constructor(message) {
    super(message);
    this.name = 'PolicyError';
  }
}

function isTable(value) {
  return value !== null && typeof value === 'object' && !Array.isArray(value) && !(value instanceof Date);
}

function checkTable(where, value) {
  if (!isTable(value)) throw new PolicyError(`${where}: must be a table`);
}

function checkKeys(where, table, allowed) {
  const unknown = Object.keys(table).filter((k) => !allowed.includes(k)).sort();
  if (unknown.length) throw new PolicyError(`${where}: unknown setting '${unknown[0]}'`);
}

function parseFlag(where, value) {
  if (typeof value !== 'boolean') throw new PolicyError(`${where}: must be true or false`);
  return value;
}

/**
 * One tool's table of the file layout (`keys`: the settings it may have) as its rule.
 * @returns {{effect?: string, requireApproval?: boolean, retryUnknown?: boolean}}
 */
function parseRule(where, table, keys = RULE_KEYS) {
  checkTable(where, table);
  checkKeys(where, table, keys);
  const rule = {};
  if ('effect' in table) {
    const effect = Object.hasOwn(EFFECT_NAMES, table.effect) ? EFFECT_NAMES[table.effect] : undefined;
    if (effect === undefined) throw new PolicyError(`${where}.effect: one of ${Object.keys(EFFECT_NAMES).join(', ')}`);
    rule.effect = effect;
  }
  if ('require_approval' in table) rule.requireApproval = parseFlag(`${where}.require_approval`, table.require_approval);
  if ('retry_unknown' in table) rule.retryUnknown = parseFlag(`${where}.retry_unknown`, table.retry_unknown);
  return Object.freeze(rule);
}

/** A rule given in code: an effect name ('READ', ...), or `{effect, requireApproval, retryUnknown}`. */
function codeRule(where, rule) {
  if (typeof rule === 'string') rule = { effect: rule };
  if (!isTable(rule)) throw new PolicyError(`${where}: an effect name or {effect, requireApproval, retryUnknown}`);
  checkKeys(where, rule, ['effect', 'requireApproval', 'retryUnknown']);
  if (rule.effect !== undefined && !EFFECTS.has(rule.effect)) {
    throw new PolicyError(`${where}.effect: one of ${[...EFFECTS].join(', ')}`);
  }
  for (const name of ['requireApproval', 'retryUnknown']) {
    if (rule[name] !== undefined) parseFlag(`${where}.${name}`, rule[name]);
  }
  return Object.freeze({ ...rule });
}

/** A policy file's document; throws `PolicyError` when it is not TOML. */
function loadToml(text) {
  // Loaded here only: the rest of the module (and the adapters) never need the parser.
  const { parse } = require('smol-toml');
  try {
    return parse(text);
  } catch (error) {
    throw new PolicyError(`not valid TOML: ${error.message}`);
  }
}

/**
 * The operator's tool policy: rules by tool name (a bare effect name is a rule with just that
 * effect), and the approval of the rest. Immutable.
 */
class ToolPolicy {
  /**
   * @param {Record<string, string | {effect?: string, requireApproval?: boolean, retryUnknown?: boolean}>} [tools]
   *   rules by tool name; effects are the client's names ('READ', 'IDEMPOTENT_WRITE', 'SIDE_EFFECT').
   * @param {{requireApproval?: boolean}} [options] the approval of tools without their own word.
   */
  constructor(tools = {}, { requireApproval = false } = {}) {
    checkTable('tools', tools);
    const rules = {};
    for (const [name, rule] of Object.entries(tools)) rules[name] = codeRule(`tools.${name}`, rule);
    // A copy: the caller's object changed later changes no policy.
    this.tools = Object.freeze(rules);
    this.requireApproval = parseFlag('require_approval', requireApproval);
    Object.freeze(this);
  }

  /** The operator's word on `tool` (empty when it says nothing). */
  rule(tool) {
    return Object.hasOwn(this.tools, tool) ? this.tools[tool] : Object.freeze({});
  }

  /**
   * The effect, approval and retry of a call of `tool`.
   * @returns {{effect: string, requireApproval: boolean, retryUnknown: boolean | undefined}}
   */
  decide(tool) {
    const rule = this.rule(tool);
    return {
      effect: rule.effect ?? 'SIDE_EFFECT',
      requireApproval: rule.requireApproval ?? this.requireApproval,
      retryUnknown: rule.retryUnknown,
    };
  }

  /** A policy, or one of rules by tool name; undefined/null: the empty policy. */
  static of(policy) {
    if (policy instanceof ToolPolicy) return policy;
    return new ToolPolicy(policy ?? {});
  }

  /**
   * The policy a parsed document describes (the TOML layout above).
   * @throws {PolicyError} naming the setting that is wrong.
   */
  static fromMapping(doc) {
    checkTable('policy', doc);
    checkKeys('policy', doc, ['tools', 'require_approval']);
    const tools = doc.tools ?? {};
    checkTable('tools', tools);
    const rules = {};
    for (const [name, table] of Object.entries(tools)) rules[name] = parseRule(`tools.${name}`, table);
    return new ToolPolicy(rules, { requireApproval: parseFlag('require_approval', doc.require_approval ?? false) });
  }

  /** The policy of a TOML text; throws `PolicyError`. */
  static fromToml(text) {
    return ToolPolicy.fromMapping(loadToml(text));
  }
}

module.exports = {
  ToolPolicy,
  PolicyError,
  EFFECT_NAMES,
  RULE_KEYS,
  loadToml,
  parseRule,
  parseFlag,
  checkKeys,
  checkTable,
};
