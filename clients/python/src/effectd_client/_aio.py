"""The client: one method per RPC of ToolLedger, Checkpoints and Recovery,
typed values in and out.

Written once, as the asyncio client (`effectd_client._aio`, grpc.aio); the
synchronous client (`effectd_client._client`) is written from it by
`clients/python/unasync.py` at build time (build output, not kept in git;
`make` writes it again when this changes). What only the
synchronous client does is in `effectd_client._client_sync`. Requests are
built and answers converted by `effectd_client._requests`. Longer than the
client's other modules on purpose: it is the public surface of one method per
RPC, each with its docstring, kept in one class.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from effectd.v1 import checkpoints_pb2_grpc, ledger_pb2_grpc, recovery_pb2_grpc

from effectd_client import _requests as req
from effectd_client._channel import DEFAULT_MAX_MESSAGE_BYTES, Connection, connection
from effectd_client._exceptions import EffectdError, NotFound

# unasync: async-only
from effectd_client._frames_aio import session_of

# unasync: end
from effectd_client._operator_aio import AsyncAdmin, AsyncOperator
from effectd_client._reconnect import DEFAULT_WAIT, Outage
from effectd_client._recording import RecordingRetry
from effectd_client._session_calls import LedgerCalls, wanted
from effectd_client._types import (
    Channel,
    Checkpoint,
    Effect,
    Prepared,
    RecoveryPlan,
    State,
    ToolCall,
)

# unasync: sync-only
# from effectd_client._client_sync import closer, recovered, session_of
# unasync: end

T = TypeVar("T")


class AsyncClient:
    """A connection to effectd (`unix:PATH` or `HOST:PORT`); `with` closes it.

    The asyncio client's methods are awaited, inside a running event loop;
    the synchronous client's block their thread. Both send the ledger
    requests of every task or thread over one session stream by default.

    Args:
        target: `unix:PATH` or `HOST:PORT`, or a `Connection` (then none of
            its options below is given as a keyword).
        namespace: sent with every request; with authentication on, empty
            means the token's namespace when it grants exactly one.
        timeout: the deadline of each call, in seconds.
        token: the bearer token, sent as `authorization: Bearer` metadata on
            every call; None reads `EFFECTD_TOKEN`, "" sends none. Never
            shown by `repr()`.
        tls: TLS with the system's root certificates; implied by any of the
            three PEM options.
        root_certificates: PEM roots that verify the daemon's certificate.
        certificate_chain: PEM client certificate (mutual TLS), with
            `private_key`.
        private_key: PEM key of `certificate_chain`.
        max_message_bytes: the largest message sent or received, by
            default the daemon's own default (8 MiB); a larger request
            fails before it is sent, as RESOURCE_EXHAUSTED.
        recording_retry: how CommitTool, ReportUnknown, Heartbeat and
            AcknowledgeRecovery are sent again after a transient failure
            (they are idempotent on the daemon); by default 8 tries within
            30 s.
        session: the ledger's hot requests of every thread as messages of
            one session stream, or False: a unary call each; None (the
            default) is the stream unless `EFFECTD_SESSION` is 0, false or
            off. docs/client-session.md says what a broken stream means.
        reconnect_wait: seconds a call whose request was not sent (the
            daemon away, restarting or stopping) waits for the daemon before
            it fails UNAVAILABLE, never past its `timeout`; 0: it fails at
            once. A request that may have reached the daemon is never sent
            again this way (docs/client-session.md).
    """

    def __init__(
        self,
        target: str | Connection = "unix:.effectd/effectd.sock",
        *,
        namespace: str = "",
        timeout: float = 10.0,
        token: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        recording_retry: RecordingRetry | None = None,
        session: bool | None = None,
        reconnect_wait: float = DEFAULT_WAIT,
    ) -> None:
        self.namespace = namespace
        self.timeout = timeout
        self.recording_retry = recording_retry or RecordingRetry()
        self._connection = connection(
            target,
            token=token,
            tls=tls,
            root_certificates=root_certificates,
            certificate_chain=certificate_chain,
            private_key=private_key,
            max_message_bytes=max_message_bytes,
        )
        self._metadata = self._connection.metadata
        self._outage = Outage(self._connection.target, reconnect_wait)
        self._channel = self._connection.aio_channel()
        self._ledger = ledger_pb2_grpc.ToolLedgerStub(self._channel)
        self._checkpoints = checkpoints_pb2_grpc.CheckpointsStub(self._channel)
        self._recovery = recovery_pb2_grpc.RecoveryStub(self._channel)
        # A daemon on this host that serves the framed transport is asked
        # through it (`session_of`), else by the gRPC stream.
        self._session = (
            session_of(self._connection, self._channel) if wanted(session) else None
        )
        self._tool = LedgerCalls(
            self._ledger, self._session.method if self._session else None
        )
        # unasync: sync-only
        # # Dropped without close(), it ends its stream and reader thread too.
        # self._release = closer(self, self._session, self._channel)
        # unasync: end

    def __repr__(self) -> str:
        return self._connection.describe("AsyncClient", self.namespace)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        # unasync: async-only
        if self._session is not None:
            await self._session.close()
        await self._channel.close(None)
        # unasync: sync-only
        # self._release()
        # unasync: end

    @property
    def admin(self) -> AsyncAdmin:
        """The Admin service's RPCs: audit, policy, backup, stats, daemons
        (`effectd_client._operator_aio`)."""
        return AsyncAdmin(self._call, self._channel, self.namespace)

    @property
    def operator(self) -> AsyncOperator:
        """A person's reads and decisions, each answering the whole record."""
        return AsyncOperator(self._call, self._ledger, self._recovery, self.namespace)

    async def _call(
        self,
        method: Callable[..., Awaitable[T]],
        request: object,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's gRPC deadline
    ) -> T:
        """One request; sent again once the daemon is back when it was not
        sent (`effectd_client._reconnect`). `timeout` (the client's when None)
        is the call's deadline, sent with it; the wait for the daemon ends
        with it too."""
        timeout = self.timeout if timeout is None else timeout
        started = time.monotonic()
        try:
            return await method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            error = EffectdError.from_rpc_error(exc)
        with self._outage.waiting(error, started, timeout) as waiting:
            while True:
                await asyncio.sleep(waiting.pause())
                try:
                    return await method(
                        request, timeout=waiting.timeout(), metadata=self._metadata
                    )
                except grpc.RpcError as exc:
                    waiting.failed(EffectdError.from_rpc_error(exc))

    async def _record(
        self,
        method: Callable[..., Awaitable[T]],
        request: object,
        retry: RecordingRetry | None,
    ) -> T:
        """A recording request, sent again while it fails transiently."""
        policy = retry or self.recording_retry
        start, tries = time.monotonic(), 0
        while True:
            tries += 1
            elapsed = time.monotonic() - start
            try:
                return await self._call(
                    method, request, policy.try_timeout(self.timeout, elapsed)
                )
            except EffectdError as error:
                wait = policy.next_wait(tries, error, time.monotonic() - start)
            await asyncio.sleep(wait)

    # -- tool calls ----------------------------------------------------------

    async def prepare_tool(
        self,
        run_id: str,
        call_id: str,
        tool_name: str,
        input: Any,
        *,
        effect: Effect = Effect.SIDE_EFFECT,
        require_approval: bool = False,
        start: bool = False,
        lease_ms: int = 0,
        retry: bool = False,
        channel: Channel = Channel.TOOL,
    ) -> Prepared:
        """Records the call (or finds it) and returns the decision.

        With `start`, EXECUTE means this caller holds the attempt; a READ or
        IDEMPOTENT_WRITE whose last attempt has an unknown outcome starts
        again only with `retry`, under the daemon's retry rules (else
        `InvalidTransition` with `metadata["retryRequired"]`, or the retry
        rule's refusal). `channel` (part of the call's identity) says how the
        tool is reached; its retry rules apply (an MCP call of unknown
        outcome is never started again).
        """
        request = req.prepare_tool(
            self.namespace,
            run_id,
            call_id,
            tool_name,
            input,
            effect=effect,
            require_approval=require_approval,
            start=start,
            lease_ms=lease_ms,
            retry=retry,
            channel=channel,
        )
        return req.prepared(await self._call(self._tool.PrepareTool, request))

    async def start_tool(
        self,
        run_id: str,
        call_id: str,
        *,
        retry: bool = False,
        lease_ms: int = 0,
        expected_revision: int | None = None,
    ) -> Prepared:
        """Starts a PREPARED call; with `retry`, one of unknown outcome again."""
        request = req.start_tool(
            self.namespace,
            run_id,
            call_id,
            retry=retry,
            lease_ms=lease_ms,
            expected_revision=expected_revision,
        )
        return req.started(await self._call(self._tool.StartTool, request))

    async def commit_tool(
        self,
        run_id: str,
        call_id: str,
        attempt: int,
        result: Any = None,
        *,
        error_code: str = "",
        error_message: str = "",
        acknowledge: bool = False,
        retry: RecordingRetry | None = None,
    ) -> ToolCall:
        """Commits the result, or with `error_code` an error one; `acknowledge`
        marks it delivered in the same transaction. Sent again while it fails
        transiently (`recording_retry`, `retry`): a repeat is answered done."""
        request = req.commit_tool(
            self.namespace,
            run_id,
            call_id,
            attempt,
            result,
            error_code=error_code,
            error_message=error_message,
            acknowledge=acknowledge,
        )
        r = await self._record(self._tool.CommitTool, request, retry)
        return ToolCall.from_pb(r.call)

    async def report_unknown(
        self,
        run_id: str,
        call_id: str,
        attempt: int,
        reason: str,
        *,
        retry: RecordingRetry | None = None,
    ) -> ToolCall:
        """The attempt cannot know whether the tool ran; retried like a commit."""
        request = req.report_unknown(self.namespace, run_id, call_id, attempt, reason)
        r = await self._record(self._tool.ReportUnknown, request, retry)
        return ToolCall.from_pb(r.call)

    async def heartbeat(
        self,
        run_id: str,
        call_id: str,
        attempt: int,
        lease_ms: int = 0,
        *,
        retry: RecordingRetry | None = None,
    ) -> ToolCall:
        """Extends the attempt's lease; retried like a commit."""
        request = req.heartbeat(self.namespace, run_id, call_id, attempt, lease_ms)
        r = await self._record(self._tool.Heartbeat, request, retry)
        return ToolCall.from_pb(r.call)

    async def get_tool_call(self, run_id: str, call_id: str) -> ToolCall:
        request = req.get_tool_call(self.namespace, run_id, call_id)
        r = await self._call(self._tool.GetToolCall, request)
        return ToolCall.from_pb(r.call)

    async def list_tool_calls(
        self,
        run_id: str = "",
        states: tuple[State, ...] = (),
        page_size: int = 0,
        *,
        all_namespaces: bool = False,
    ) -> AsyncIterator[ToolCall]:
        """Every matching call, following page tokens. `all_namespaces`:
        of every namespace the caller may see (without authentication, all
        of them; with a token, its grants) instead of the client's one."""
        token = ""
        while True:
            request = req.list_tool_calls(
                self.namespace,
                run_id,
                states,
                page_size,
                token,
                all_namespaces=all_namespaces,
            )
            page = await self._call(self._ledger.ListToolCalls, request)
            for c in page.calls:
                yield ToolCall.from_pb(c)
            token = page.next_page_token
            if not token:
                return

    # -- approvals, reconciliation, recovery ---------------------------------

    async def decide_approval(
        self,
        run_id: str,
        call_id: str,
        *,
        approve: bool,
        approver: str,
        reason: str,
        expected_revision: int,
        input_fingerprint: str,
    ) -> ToolCall:
        """Approves or rejects the call as seen at `expected_revision`."""
        request = req.decide_approval(
            self.namespace,
            run_id,
            call_id,
            approve=approve,
            approver=approver,
            reason=reason,
            expected_revision=expected_revision,
            input_fingerprint=input_fingerprint,
        )
        r = await self._call(self._ledger.DecideApproval, request)
        return ToolCall.from_pb(r.call)

    async def reconcile(
        self,
        run_id: str,
        call_id: str,
        *,
        expected_revision: int,
        operator: str,
        reason: str,
        evidence: str,
        result: Any = None,
        not_executed: bool = False,
        confirmed_dead_attempt: int = 0,
    ) -> ToolCall:
        """Resolves an unknown outcome: the result found, or never executed.

        "Never executed" is refused (`ReconcileQuarantine`) until the call
        has been UNKNOWN for the daemon's quarantine, unless
        `confirmed_dead_attempt` names its attempt: the operator's word that
        the attempt's process is gone.
        """
        request = req.reconcile(
            self.namespace,
            run_id,
            call_id,
            expected_revision=expected_revision,
            operator=operator,
            reason=reason,
            evidence=evidence,
            result=result,
            not_executed=not_executed,
            confirmed_dead_attempt=confirmed_dead_attempt,
        )
        return ToolCall.from_pb(
            (await self._call(self._ledger.Reconcile, request)).call
        )

    async def recover(
        self, run_id: str, *, page_size: int = req.RECOVER_PAGE_SIZE
    ) -> RecoveryPlan:
        """The plan for every call of a crashed run, read page by page."""
        # unasync: async-only
        pages = [p async for p in self.recover_pages(run_id, page_size=page_size)]
        return RecoveryPlan.joined(pages)
        # unasync: sync-only
        # return recovered(
        #     self._call,
        #     self._recovery.Recover,
        #     lambda token: req.recover(self.namespace, run_id, page_size, token),
        #     self.timeout,
        #     self._metadata,
        # )
        # unasync: end

    async def recover_pages(
        self, run_id: str, *, page_size: int = req.RECOVER_PAGE_SIZE
    ) -> AsyncIterator[RecoveryPlan]:
        """The plan of a crashed run, one page (at most `page_size` calls,
        1..1000) at a time, in call_id byte order; a page is `interrupted`
        when one of its own calls interrupts the run."""
        token = ""
        while True:
            request = req.recover(self.namespace, run_id, page_size, token)
            page = await self._call(self._recovery.Recover, request)
            yield RecoveryPlan.from_pb(page)
            token = page.next_page_token
            if not token:
                return

    async def acknowledge_recovery(
        self,
        run_id: str,
        call_ids: list[str],
        *,
        retry: RecordingRetry | None = None,
    ) -> None:
        """Marks committed results as delivered to the transcript; retried
        like a commit."""
        request = req.acknowledge_recovery(self.namespace, run_id, call_ids)
        await self._record(self._recovery.AcknowledgeRecovery, request, retry)

    # -- checkpoints ---------------------------------------------------------

    async def get_checkpoint(self, key: str) -> Checkpoint | None:
        """The checkpoint at `key`; None when absent."""
        request = req.get_checkpoint(self.namespace, key)
        try:
            r = await self._call(self._checkpoints.Get, request)
        except NotFound:
            return None
        return Checkpoint.from_pb(r.checkpoint)

    async def put_checkpoint(
        self, key: str, value: bytes, *, expected_revision: int | None = None
    ) -> int:
        """Writes `key` if it is at `expected_revision`, or absent when None."""
        request = req.put_checkpoint(self.namespace, key, value, expected_revision)
        return (await self._call(self._checkpoints.Put, request)).revision

    async def delete_checkpoint(self, key: str, expected_revision: int) -> None:
        request = req.delete_checkpoint(self.namespace, key, expected_revision)
        await self._call(self._checkpoints.Delete, request)

    async def list_checkpoints(
        self, prefix: str = "", *, keys_only: bool = False
    ) -> AsyncIterator[Checkpoint]:
        token = ""
        while True:
            request = req.list_checkpoints(self.namespace, prefix, keys_only, token)
            page = await self._call(self._checkpoints.List, request)
            for c in page.checkpoints:
                yield Checkpoint.from_pb(c)
            token = page.next_page_token
            if not token:
                return
