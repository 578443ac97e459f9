"""Calls in the states `effectd ctl` shows, and its tables read back."""

from __future__ import annotations

from effectd_client import Client

RUN = "run-1"


def awaiting(client: Client, call_id: str, run: str = RUN) -> None:
    client.prepare_tool(
        run, call_id, "send_email", {"to": call_id}, require_approval=True
    )


def unknown(client: Client, call_id: str, run: str = RUN) -> None:
    prepared = client.prepare_tool(run, call_id, "charge", {"id": call_id}, start=True)
    client.report_unknown(run, call_id, prepared.call.attempt, "the process died")


def committed(client: Client, call_id: str, run: str = RUN) -> None:
    prepared = client.prepare_tool(run, call_id, "search", {"q": call_id}, start=True)
    client.commit_tool(run, call_id, prepared.call.attempt, {"hits": 1})


def rows(out: str) -> list[list[str]]:
    """The cells of a table, header excluded, up to the first blank line."""
    return [line.split() for line in out.split("\n\n", maxsplit=1)[0].splitlines()[1:]]
