export type Effect = 'READ' | 'IDEMPOTENT_WRITE' | 'SIDE_EFFECT';
export type EffectWord = 'read' | 'idempotent-write' | 'side-effect';

/** The operator's word on one tool; undefined: the policy's default (approval) or SIDE_EFFECT. */
export interface ToolRule {
  effect?: Effect;
  requireApproval?: boolean;
  /** Start a call of unknown outcome again (never a SIDE_EFFECT); undefined: the adapter's default. */
  retryUnknown?: boolean;
}

export interface ToolDecision {
  effect: Effect;
  requireApproval: boolean;
  retryUnknown: boolean | undefined;
}

export const EFFECT_NAMES: Readonly<Record<EffectWord, Effect>>;
export const RULE_KEYS: readonly string[];

/** A tool or MCP policy is invalid; the message names the setting. */
export class PolicyError extends Error {}

export class ToolPolicy {
  constructor(tools?: Record<string, Effect | ToolRule>, options?: { requireApproval?: boolean });
  readonly tools: Readonly<Record<string, ToolRule>>;
  readonly requireApproval: boolean;
  rule(tool: string): ToolRule;
  decide(tool: string): ToolDecision;
  static of(policy?: ToolPolicy | Record<string, Effect | ToolRule> | null): ToolPolicy;
  /** The TOML layout's document (`require_approval`, `[tools.NAME]` with `effect`, `require_approval`, `retry_unknown`). */
  static fromMapping(doc: Record<string, unknown>): ToolPolicy;
  static fromToml(text: string): ToolPolicy;
}

export function loadToml(text: string): Record<string, unknown>;
