"""The `effectd.v1.ToolLedger` service: translation only."""

from __future__ import annotations

from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb

from sidecar.ledger.rules import AGENT
from sidecar.ledger.validation import Violations
from sidecar.rpc import caller, convert, operator_orders
from sidecar.services.ledger import LedgerService
from sidecar.services.operator import OperatorService

Context = grpc.aio.ServicerContext[Any, Any]


class ToolLedger:
    def __init__(self, ledger: LedgerService, operator: OperatorService) -> None:
        self._ledger = ledger
        self._operator = operator
        self._limits = ledger.limits

    async def PrepareTool(
        self, req: pb.PrepareToolRequest, _: Context
    ) -> pb.PrepareToolResponse:
        who = caller.current()
        v = Violations()
        spec = convert.prepare_spec(v, who, req, self._limits)
        v.require()
        return convert.prepare_response(await self._ledger.prepare(spec))

    async def PrepareTools(
        self, req: pb.PrepareToolsRequest, _: Context
    ) -> pb.PrepareToolsResponse:
        who = caller.current()
        v = Violations()
        if not 1 <= len(req.calls) <= self._limits.max_batch:
            v.add(
                "calls",
                f"must hold 1..{self._limits.max_batch} calls, got {len(req.calls)}",
            )
            v.require()  # before reading each of too many
        specs = [
            convert.prepare_spec(v, who, c, self._limits, f"calls[{i}]")
            for i, c in enumerate(req.calls)
        ]
        seen: dict[object, int] = {}
        for i, spec in enumerate(specs):
            if spec.ref in seen:
                v.add(f"calls[{i}].ref", f"repeats calls[{seen[spec.ref]}].ref")
            seen.setdefault(spec.ref, i)
        v.require()
        answers = await self._ledger.prepare_many(specs)
        return pb.PrepareToolsResponse(
            results=[convert.prepare_response(a) for a in answers]
        )

    async def StartTool(
        self, req: pb.StartToolRequest, _: Context
    ) -> pb.StartToolResponse:
        who = caller.current()
        v = Violations()
        ref = convert.ref(v, who, req.ref, self._limits)
        lease = convert.lease_ms(v, req.lease_ms, self._limits)
        v.require()
        answer = await self._ledger.start(
            ref,
            lease_ms=lease,
            retry=req.retry,
            expected_revision=convert.optional_revision(req),
            actor=who.actor(AGENT),
        )
        return pb.StartToolResponse(
            decision=convert.DECISION_TO_PB[answer.decision],
            call=convert.agent_call_pb(answer.call),
            idempotency_key=answer.idempotency_key,
        )

    async def CommitTool(
        self, req: pb.CommitToolRequest, _: Context
    ) -> pb.CommitToolResponse:
        who = caller.current()
        v = Violations()
        ref = convert.ref(v, who, req.ref, self._limits)
        if req.attempt == 0:
            v.add("attempt", "is required: the attempt number StartTool gave")
        if not req.HasField("result"):
            v.add("result", "is required")
        result = convert.result(v, req.result, self._limits)
        v.require()
        answer = await self._ledger.commit(
            ref,
            attempt=req.attempt,
            result=result,
            expected_revision=convert.optional_revision(req),
            actor=who.actor(AGENT),
            acknowledge=req.acknowledge,
        )
        return pb.CommitToolResponse(call=convert.agent_call_pb(answer.call))

    async def ReportUnknown(
        self, req: pb.ReportUnknownRequest, _: Context
    ) -> pb.ReportUnknownResponse:
        who = caller.current()
        v = Violations()
        ref = convert.ref(v, who, req.ref, self._limits)
        if req.attempt == 0:
            v.add("attempt", "is required")
        v.text("reason", req.reason, self._limits.max_text_bytes)
        v.require()
        answer = await self._ledger.report_unknown(
            ref, attempt=req.attempt, reason=req.reason, actor=who.actor(AGENT)
        )
        return pb.ReportUnknownResponse(call=convert.agent_call_pb(answer.call))

    async def Heartbeat(
        self, req: pb.HeartbeatRequest, _: Context
    ) -> pb.HeartbeatResponse:
        who = caller.current()
        v = Violations()
        ref = convert.ref(v, who, req.ref, self._limits)
        if req.attempt == 0:
            v.add("attempt", "is required")
        lease = convert.lease_ms(v, req.lease_ms, self._limits)
        v.require()
        answer = await self._ledger.heartbeat(
            ref, attempt=req.attempt, lease_ms=lease, actor=who.actor(AGENT)
        )
        return pb.HeartbeatResponse(call=convert.agent_call_pb(answer.call))

    async def DecideApproval(
        self, req: pb.DecideApprovalRequest, _: Context
    ) -> pb.DecideApprovalResponse:
        who = caller.current()
        v = Violations()
        ref = convert.ref(v, who, req.ref, self._limits)
        decision = operator_orders.approval_decision(v, who, req, self._limits)
        v.require()
        answer = await self._operator.decide_approval(ref, decision)
        return pb.DecideApprovalResponse(call=convert.call_pb(answer.call))

    async def Reconcile(
        self, req: pb.ReconcileRequest, _: Context
    ) -> pb.ReconcileResponse:
        who = caller.current()
        v = Violations()
        ref = convert.ref(v, who, req.ref, self._limits)
        order = operator_orders.reconcile_order(v, who, req, self._limits)
        v.require()
        answer = await self._operator.reconcile(ref, order)
        return pb.ReconcileResponse(call=convert.call_pb(answer.call))

    async def GetToolCall(
        self, req: pb.GetToolCallRequest, _: Context
    ) -> pb.GetToolCallResponse:
        who = caller.current()
        v = Violations()
        ref = convert.ref(v, who, req.ref, self._limits)
        v.require()
        call = await self._ledger.get(ref)
        return pb.GetToolCallResponse(call=convert.call_pb(call))

    async def ListToolCalls(
        self, req: pb.ListToolCallsRequest, _: Context
    ) -> pb.ListToolCallsResponse:
        who = caller.current()
        v = Violations()
        scope: frozenset[str] | None
        if req.all_namespaces:
            if req.namespace:
                v.add("namespace", "must be empty with all_namespaces")
            scope = who.visible
        else:
            scope = frozenset({convert.namespace(v, who, req.namespace)})
        convert.run_id(v, req.run_id, self._limits)
        states = convert.states(v, list(req.states))
        size = convert.page_size(v, req.page_size, self._limits)
        v.require()
        page = await self._ledger.list(
            scope,
            run_id=req.run_id,
            states=states,
            page_size=size,
            page_token=req.page_token,
        )
        return pb.ListToolCallsResponse(
            calls=[convert.call_pb(c, history=False) for c in page.calls],
            next_page_token=page.next_page_token,
            searched_namespaces=page.namespaces,
        )
