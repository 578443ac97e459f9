"""The tests `make test-fast` leaves out beside those marked `slow` in their own
module: each named here costs seconds (a daemon or a framework started as its
own process, a TLS handshake against a timeout, a random search, a race run
round after round) and what it checks is checked again by `make test`, which
runs everything. A node id is listed whole, or as a prefix: a module, or a
test with every parameter (`name[`); `STORE_ON_BOTH` below names the gRPC
boundary's tests on PostgreSQL. What stays in the fast loop to catch a
broken promise is listed in tests/README.md."""

from __future__ import annotations

import pytest

SLOW = (
    # Model-based torture, fuzzing, crash loops, linearizability, clock jumps.
    "tests/torture/",
    # Streams cut by their deadline, on every kind of stream.
    "tests/rpc/test_gate_streams.py",
    # The race check of Reconcile, round after round, with its racy control.
    "tests/rpc/test_reconcile_rpc.py::test_the_race_check_catches_a_racy_service[",
    # A commit lost to a storage fault, through a proxy that cuts it.
    "tests/rpc/test_storage_faults_rpc.py::test_a_lost_commit_answers_unavailable",
    "tests/rpc/test_storage_faults_rpc.py::test_the_client_sees_an_unknown_commit",
    # Several daemons on one PostgreSQL store.
    "tests/services/test_many_daemons.py",
    # Daemons started as processes on a restored or unreachable database.
    "tests/storage/test_pg_restore.py::test_a_restored_database_answers",
    "tests/storage/test_pg_restore.py::test_a_marking_stopped_half_way",
    "tests/storage/test_pg_restore.py::test_the_url_is_printed_masked",
    "tests/storage/test_postgres_schema.py::test_a_daemon_whose_database_is",
    # TLS handshakes, each against a daemon of its own.
    "tests/clients/test_auth_options.py::test_tls_",
    "tests/clients/test_auth_options.py::test_mutual_tls_",
    "tests/clients/test_auth_options.py::test_the_daemon_over_mutual_tls_",
    # The testing daemon killed and restarted under an agent.
    "tests/clients/test_testing_daemon.py::test_a_crash_",
    "tests/clients/test_testing_daemon.py::test_the_crash_catches_",
    # MCP servers as processes (stdio, and HTTP servers per test).
    "tests/clients/test_mcp.py",
    # Pydantic AI agents against a daemon restarted per test.
    "tests/clients/test_pydantic_ai.py",
    # Google ADK and CrewAI agents, each in its framework's own venv as a
    # process; Agent Framework agents against a daemon per test.
    "tests/clients/test_google_adk.py",
    "tests/clients/test_crewai.py",
    "tests/clients/test_agent_framework.py",
    # What a fresh interpreter imports: a process of its own each.
    "tests/clients/test_contrib.py::test_the_extension_surface_and_the_folder_load",
    "tests/clients/test_policy.py::test_the_policy_imports_no_framework",
    "tests/clients/test_langgraph.py::test_importing_the_client_does_not",
    "tests/clients/test_openai_agents.py::test_importing_the_client_does_not",
    "tests/observability/test_otel.py::test_without_the_setting_the_sdk_is_not",
    # A daemon restarted between a tool and its commit.
    "tests/clients/test_safe_recording.py::test_a_daemon_restart_between",
    # Real timeouts waited out: a client library's transport failing, an
    # SDK's retries and deadlines, a watcher thread ending, a daemon away, a
    # deadline passing on the wall clock.
    "tests/clients/test_safe_outcomes.py::test_a_transport_failure_of_a_client_library",
    "tests/clients/test_transport_decisions.py::test_sdk_default_retries_never",
    "tests/clients/test_transport_decisions.py::test_the_sdks_timeout_is_the_calls",
    "tests/clients/test_transport_decisions.py::test_negative_control_a_raised_decision",
    "tests/clients/test_transport_decisions.py::test_a_committed_stream_ends_at_the_sdks",
    "tests/clients/test_safe_watcher.py::test_the_watcher_thread_ends_when_no_call",
    "tests/clients/test_reconnect.py::test_a_daemon_that_stays_away_fails_the_call",
    "tests/clients/test_langgraph.py::test_a_call_another_attempt_holds_waits",
    "tests/clients/test_langgraph.py::test_a_call_held_longer_than_the_wait_is",
    "tests/services/test_off_loop.py::test_a_verification_whose_deadline_passed",
    "tests/storage/test_postgres_faults.py::test_a_statement_timeout_answers",
    "tests/provider/test_provider_rpc.py::test_the_deadline_covers_every_attempt",
    "tests/provider/test_acceptance.py::test_case_13_a_silent_upstream_ends",
    "tests/provider/test_acceptance.py::test_a_committed_stream_that_stalls_ends",
)


# The gRPC boundary's tests of a module that runs them on each store
# (`tests.support.postgres.both_stores`) run on LMDB in the fast loop, and on
# PostgreSQL too in `make test`: the PostgreSQL store keeps its own contract
# (tests/storage/test_store_contract.py) and its race with its control
# (tests/storage/test_postgres_race.py) in the fast loop.
STORE_ON_BOTH = "tests/rpc/"


def is_slow(item: pytest.Item) -> bool:
    if item.nodeid.startswith(SLOW):
        return True
    callspec = getattr(item, "callspec", None)
    return (
        item.nodeid.startswith(STORE_ON_BOTH)
        and callspec is not None
        and callspec.params.get("store_kind") == "postgres"
    )


def mark(items: list[pytest.Item]) -> None:
    """Marks `slow` the collected tests that `SLOW` and `STORE_ON_BOTH` name."""
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
