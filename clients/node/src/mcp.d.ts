import type { Client } from './client';
import type { OutcomeUnknown } from './index';
import { PolicyError } from './policy';

export const MCP_TOOL_ERROR: 'MCP_TOOL_ERROR';
export const KEY_META: 'dev.effectd/idempotency-key';

export type McpEffectName = 'read' | 'idempotent-write' | 'side-effect';
export type Effect = 'READ' | 'IDEMPOTENT_WRITE' | 'SIDE_EFFECT';

export interface McpPolicy {
  servers?: Record<
    string,
    {
      /** Its annotations may make a call less conservative (tools not pinned). */
      trusted?: boolean;
      requireApproval?: boolean;
      tools?: Record<string, { effect?: McpEffectName; requireApproval?: boolean }>;
    }
  >;
}

export interface McpDecision {
  effect: Effect;
  requireApproval: boolean;
  reason: string;
}

/** The minimal surface of @modelcontextprotocol/sdk's Client the wrapper calls. */
export interface McpClientLike {
  listTools(params?: { cursor?: string }): Promise<{ tools: Array<{ name: string; annotations?: object }>; nextCursor?: string }>;
  callTool(params: { name: string; arguments?: object; _meta?: object }, resultSchema?: unknown, options?: object): Promise<any>;
}

export class LedgeredMcpClient {
  constructor(
    mcp: McpClientLike,
    effectd: Client,
    options: { runId: string; server: string; policy?: McpPolicy; timeoutMs?: number; leaseMs?: number },
  );
  readonly invalidated: boolean;
  listTools(): Promise<{ tools: Array<{ name: string; annotations?: object }> }>;
  decide(name: string): Promise<McpDecision>;
  callTool(
    params: { name: string; arguments?: object; callId: string; _meta?: object },
    resultSchema?: unknown,
    options?: object,
  ): Promise<any>;
}

export function decideEffect(policy: McpPolicy, server: string, tool: string, annotations?: object): McpDecision;
export function checkPolicy(policy: McpPolicy): McpPolicy;
/** The policy of the Python client's `McpPolicy` TOML layout (snake_case keys), checked. */
export function mcpPolicyFromMapping(doc: Record<string, unknown>): McpPolicy;
export function mcpPolicyFromToml(text: string): McpPolicy;
export function ledgerToolName(server: string, tool: string): string;

export class McpPolicyError extends PolicyError {}
export class SessionInvalidated extends Error {}
export class McpConnectionLost extends OutcomeUnknown {
  /** The run and the call whose outcome is unknown: the call to reconcile. */
  runId: string;
  callId: string;
}
