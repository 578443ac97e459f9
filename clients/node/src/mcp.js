'use strict';
/**
 * `@effectd/client/mcp`: every MCP `tools/call` through the ledger.
 *
 * `LedgeredMcpClient` wraps a connected `Client` of `@modelcontextprotocol/sdk`
 * (an optional peer dependency: this module never loads it, it calls the
 * client it is given) and runs each `callTool` through `safeToolCall`
 * (channel MCP), keyed by the agent's run id and the model's tool call id:
 *
 *   committed before (same call id)    -> its stored result; the server is not contacted
 *   result with isError false          -> committed OK, the result stored
 *   result with isError true           -> committed ERROR `MCP_TOOL_ERROR` with the whole result:
 *                                         it ran, so it never runs again; a repeat returns it
 *   callTool throws (connection        -> UNKNOWN (ReportUnknown), the client invalidated,
 *     closed, server killed, timeout,     McpConnectionLost thrown; never sent again (the SDK
 *     an error answer)                    does not tell a server's error from a local one)
 *   the policy requires approval       -> ApprovalPending: an approver decides, then the same
 *                                         call id is called again
 *   unknown outcome before (same id)   -> ReconciliationNeeded (SIDE_EFFECT) or RetryRequired
 *                                         (the daemon never starts an MCP call of unknown
 *                                         outcome again, ADR-010 D5)
 *
 * A stored result is returned as the CallToolResult it is (the daemon refuses to reconcile an
 * MCP call with anything else); a stored value that is none (a plain value, recorded before
 * the daemon checked) is returned as a CallToolResult whose text it is, never as a bare value.
 *
 * After a transport failure the wrapper refuses every call (SessionInvalidated,
 * ADR-010 D5) until the caller reconnects and wraps the new client. The effect
 * comes from the operator's policy (`decideEffect`, the same rules and layout
 * as the Python client's `McpPolicy`); the ledger records the tool as
 * `mcp://{server}/{tool}` with the input `{server, tool, arguments}`. An
 * IDEMPOTENT_WRITE carries its key `${runId}:${callId}` in `_meta` as
 * `dev.effectd/idempotency-key`.
 *
 *   const { LedgeredMcpClient } = require('@effectd/client/mcp');
 *   const tools = new LedgeredMcpClient(mcpClient, effectd, { runId, server: 'mail', policy });
 *   const result = await tools.callTool({ name: 'send', arguments: { to }, callId: toolCall.id });
 */

const { safeToolCall, OutcomeUnknown, ToolFailed } = require('./safe');
const { PolicyError, checkKeys, checkTable, loadToml, parseFlag, parseRule } = require('./policy');

const MCP_TOOL_ERROR = 'MCP_TOOL_ERROR';
const KEY_META = 'dev.effectd/idempotency-key';
const MAX_TOOL_PAGES = 100;
const EFFECT_NAMES = { read: 'READ', 'idempotent-write': 'IDEMPOTENT_WRITE', 'side-effect': 'SIDE_EFFECT' };
const CAUTION = { READ: 0, IDEMPOTENT_WRITE: 1, SIDE_EFFECT: 2 };

/** The MCP policy is invalid; the message names the setting (a `PolicyError` of `./policy`). */
class McpPolicyError extends PolicyError {
  constructor(message) {
    super(message);
    this.name = 'McpPolicyError';
  }
}

/** The client lost its connection during a call: reconnect, and wrap the new client. */
class SessionInvalidated extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'SessionInvalidated';
  }
}

/**
 * The connection failed while the call was in flight: UNKNOWN, never sent again. `runId` and
 * `callId` name the call to reconcile.
 */
class McpConnectionLost extends OutcomeUnknown {
  constructor(message, options) {
    super(message, options);
    this.name = 'McpConnectionLost';
    this.runId = options?.runId;
    this.callId = options?.callId;
  }
}

/** A result with isError, handed to safeToolCall as an error result. */
class McpToolError extends Error {
  constructor(result) {
    const texts = (result.content || []).map((c) => c?.text).filter(Boolean);
    super(texts.join(' ') || 'the tool reported an error');
    this.name = 'McpToolError';
    this.code = MCP_TOOL_ERROR;
    this.result = result;
    this.errorResult = result;
  }
}

/**
 * The CallToolResult a stored result holds; a value that is none (a plain value, recorded
 * before the daemon checked the shape of an MCP call's reconciled result) as one whose text it is.
 */
function restored(value, isError = false) {
  const isResult = value !== null && typeof value === 'object' && Array.isArray(value.content);
  if (isResult) return value;
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  return { content: [{ type: 'text', text }], isError };
}

/** The name a call is recorded under. */
function ledgerToolName(server, tool) {
  return `mcp://${server}/${tool}`;
}

/** The hints a server stated (undefined: absent, not the spec default). */
function hintsOf(annotations) {
  const a = annotations || {};
  const hint = (name) => (typeof a[name] === 'boolean' ? a[name] : undefined);
  return {
    readOnly: hint('readOnlyHint'),
    destructive: hint('destructiveHint'),
    idempotent: hint('idempotentHint'),
  };
}

function claimedEffect(h) {
  if (h.readOnly === true && h.destructive !== true) return 'READ';
  return h.idempotent === true ? 'IDEMPOTENT_WRITE' : 'SIDE_EFFECT';
}

function floorEffect(h) {
  const writes = h.readOnly === false || h.destructive === true || h.idempotent === false;
  if ((h.readOnly === true && h.destructive !== true) || !writes) return 'READ';
  return h.idempotent === true ? 'IDEMPOTENT_WRITE' : 'SIDE_EFFECT';
}

function flag(where, value, otherwise) {
  if (value === undefined) return otherwise;
  if (typeof value !== 'boolean') throw new McpPolicyError(`${where}: must be true or false`);
  return value;
}

function table(where, value) {
  if (value === undefined) return {};
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new McpPolicyError(`${where}: must be an object`);
  }
  return value;
}

function onlyKeys(where, value, allowed) {
  const unknown = Object.keys(value).filter((k) => !allowed.includes(k));
  if (unknown.length) throw new McpPolicyError(`${where}: unknown setting '${unknown[0]}'`);
}

/**
 * Checks a policy object: `{servers: {NAME: {trusted, requireApproval, tools: {TOOL: {effect,
 * requireApproval}}}}}`, effects 'read' | 'idempotent-write' | 'side-effect'.
 * @throws {McpPolicyError} naming the setting.
 */
function checkPolicy(policy) {
  const doc = table('policy', policy);
  onlyKeys('policy', doc, ['servers']);
  const servers = table('servers', doc.servers);
  for (const [name, server] of Object.entries(servers)) {
    const where = `servers.${name}`;
    onlyKeys(where, table(where, server), ['trusted', 'requireApproval', 'tools']);
    flag(`${where}.trusted`, server.trusted, false);
    flag(`${where}.requireApproval`, server.requireApproval, false);
    for (const [tool, rule] of Object.entries(table(`${where}.tools`, server.tools))) {
      const at = `${where}.tools.${tool}`;
      onlyKeys(at, table(at, rule), ['effect', 'requireApproval']);
      if (rule.effect !== undefined && !(rule.effect in EFFECT_NAMES)) {
        throw new McpPolicyError(`${at}.effect: one of ${Object.keys(EFFECT_NAMES).join(', ')}`);
      }
      flag(`${at}.requireApproval`, rule.requireApproval, undefined);
    }
  }
  return policy;
}

const MCP_RULE_KEYS = ['effect', 'require_approval'];
const FILE_WORDS = Object.fromEntries(Object.entries(EFFECT_NAMES).map(([word, name]) => [name, word]));

/**
 * The MCP policy a parsed document describes, in the TOML layout of the Python client's
 * `McpPolicy` (`[servers.NAME]` with `trusted`, `require_approval`, `[servers.NAME.tools.TOOL]`
 * with `effect`, `require_approval`; the words of `@effectd/client/policy`, without
 * `retry_unknown`: an MCP call of unknown outcome is never sent again).
 * @returns {object} the policy object `LedgeredMcpClient` takes.
 * @throws {import('./policy').PolicyError} naming the setting that is wrong.
 */
function mcpPolicyFromMapping(doc) {
  checkTable('policy', doc);
  checkKeys('policy', doc, ['servers']);
  const servers = doc.servers ?? {};
  checkTable('servers', servers);
  const out = {};
  for (const [name, table] of Object.entries(servers)) {
    const where = `servers.${name}`;
    checkTable(where, table);
    checkKeys(where, table, ['trusted', 'require_approval', 'tools']);
    const tools = table.tools ?? {};
    checkTable(`${where}.tools`, tools);
    const rules = {};
    for (const [tool, t] of Object.entries(tools)) {
      const rule = parseRule(`${where}.tools.${tool}`, t, MCP_RULE_KEYS);
      rules[tool] = {
        ...(rule.effect ? { effect: FILE_WORDS[rule.effect] } : {}),
        ...(rule.requireApproval !== undefined ? { requireApproval: rule.requireApproval } : {}),
      };
    }
    out[name] = {
      trusted: parseFlag(`${where}.trusted`, table.trusted ?? false),
      requireApproval: parseFlag(`${where}.require_approval`, table.require_approval ?? false),
      tools: rules,
    };
  }
  return checkPolicy({ servers: out });
}

/** The MCP policy of a TOML text; throws `PolicyError`. */
function mcpPolicyFromToml(text) {
  return mcpPolicyFromMapping(loadToml(text));
}

/**
 * The effect and approval of a call of `tool` on `server`: the pinned effect, else (trusted
 * server) what its annotations claim, else SIDE_EFFECT; then raised to what the stated hints
 * require (readOnlyHint false, destructiveHint true or idempotentHint false: it writes).
 * @returns {{effect: string, requireApproval: boolean, reason: string}}
 */
function decideEffect(policy, server, tool, annotations) {
  const sp = policy?.servers?.[server] || {};
  const rule = sp.tools?.[tool] || {};
  const hints = hintsOf(annotations);
  let base;
  let reason;
  if (rule.effect !== undefined) {
    [base, reason] = [EFFECT_NAMES[rule.effect], 'pinned by the policy'];
  } else if (sp.trusted === true) {
    [base, reason] = [claimedEffect(hints), 'annotations of a trusted server'];
  } else {
    [base, reason] = ['SIDE_EFFECT', 'not pinned (ADR-010 D2 default)'];
  }
  const floor = floorEffect(hints);
  let effect = base;
  if (CAUTION[floor] > CAUTION[base]) {
    effect = floor;
    reason += "; raised by the server's annotations";
  }
  const requireApproval = rule.requireApproval ?? sp.requireApproval ?? false;
  return { effect, requireApproval, reason };
}

/** An MCP client whose tool calls go through the ledger (see the module docs). */
class LedgeredMcpClient {
  /**
   * @param {object} mcp a connected `Client` of @modelcontextprotocol/sdk.
   * @param {import('./client').Client} effectd
   * @param {object} options
   * @param {string} options.runId the agent run that keys every call.
   * @param {string} options.server the operator's name of this server (the policy's key).
   * @param {object} [options.policy] the operator's MCP policy; empty: every tool a SIDE_EFFECT.
   * @param {number} [options.timeoutMs] after this a call's outcome is unknown (0: none).
   * @param {number} [options.leaseMs] the lease of each attempt (0: the daemon's default).
   */
  constructor(mcp, effectd, { runId, server, policy = {}, timeoutMs = 0, leaseMs = 0 }) {
    if (!server || server.includes('/')) throw new TypeError("server: a non-empty name without '/'");
    this.mcp = mcp;
    this.effectd = effectd;
    this.runId = runId;
    this.server = server;
    this.policy = checkPolicy(policy);
    this.timeoutMs = timeoutMs;
    this.leaseMs = leaseMs;
    this._tools = new Map();
    this._invalidated = null;
  }

  /** True once a transport failure ended this client for calls. */
  get invalidated() {
    return this._invalidated !== null;
  }

  /** Every tool of the server (all pages), remembered for the policy. */
  async listTools() {
    this._checkAlive();
    let page = await this.mcp.listTools();
    const tools = [...page.tools];
    for (let i = 0; i < MAX_TOOL_PAGES && page.nextCursor; i += 1) {
      page = await this.mcp.listTools({ cursor: page.nextCursor });
      tools.push(...page.tools);
    }
    this._tools = new Map(tools.map((t) => [t.name, t]));
    return { tools };
  }

  /** The effect and approval a call of `name` is prepared with. */
  async decide(name) {
    if (!this._tools.has(name)) await this.listTools();
    return decideEffect(this.policy, this.server, name, this._tools.get(name)?.annotations);
  }

  /**
   * Calls the tool at most once for `callId`.
   * @param {{name: string, arguments?: object, callId: string, _meta?: object}} params
   * @param {*} [resultSchema] passed to the SDK's callTool.
   * @param {object} [options] passed to the SDK's callTool (request options).
   * @returns {Promise<object>} the CallToolResult, fresh or stored (plain JSON).
   * @throws {SessionInvalidated} the client lost its connection earlier.
   * @throws {McpConnectionLost} this call's connection failed (UNKNOWN).
   * @throws {import('./safe').ToolCallStopped} the ledger says not to run it.
   */
  async callTool({ name, arguments: args = {}, callId, _meta }, resultSchema, options) {
    this._checkAlive();
    const decision = await this.decide(name);
    const call = {
      runId: this.runId,
      callId,
      tool: ledgerToolName(this.server, name),
      input: { server: this.server, tool: name, arguments: args },
      effect: decision.effect,
      requireApproval: decision.requireApproval,
      channel: 'MCP',
      timeoutMs: this.timeoutMs,
      leaseMs: this.leaseMs,
    };
    try {
      const answer = await safeToolCall(this.effectd, call, async (ctx) => {
        const meta = { ...(_meta || {}) };
        if (ctx.idempotencyKey) meta[KEY_META] = ctx.idempotencyKey;
        const params = { name, arguments: args, ...(Object.keys(meta).length ? { _meta: meta } : {}) };
        let result;
        try {
          result = await this.mcp.callTool(params, resultSchema, { ...options, signal: ctx.signal });
        } catch (error) {
          // Sent, or maybe sent: whatever failed, the server may have run it.
          this._invalidated = error;
          throw new McpConnectionLost(
            `${this.server}/${name}, call ${callId} of run ${this.runId}: the connection failed ` +
              `during the call (${error?.message ?? error}); its outcome is unknown (recorded UNKNOWN) ` +
              `and it is never sent again: reconcile it (effectd ctl show ${this.runId} ${callId})`,
            { cause: error, runId: this.runId, callId },
          );
        }
        if (result.isError) throw new McpToolError(result);
        return result;
      });
      return restored(answer);
    } catch (error) {
      if (error instanceof McpToolError) return error.result;
      if (error instanceof ToolFailed && error.errorCode === MCP_TOOL_ERROR && error.result.value) {
        return restored(error.result.value, true);
      }
      // The deadline passed while the request was out: as lost as a dropped connection.
      if (error instanceof OutcomeUnknown && error.name === 'OutcomeUnknown') this._invalidated ??= error;
      throw error;
    }
  }

  _checkAlive() {
    if (this._invalidated !== null) {
      throw new SessionInvalidated(
        `the client of ${this.server} lost its connection during a call (${this._invalidated?.message}); ` +
          'reconnect and wrap the new client',
        { cause: this._invalidated },
      );
    }
  }
}

module.exports = {
  LedgeredMcpClient,
  decideEffect,
  checkPolicy,
  mcpPolicyFromMapping,
  mcpPolicyFromToml,
  ledgerToolName,
  McpPolicyError,
  SessionInvalidated,
  McpConnectionLost,
  MCP_TOOL_ERROR,
  KEY_META,
};
