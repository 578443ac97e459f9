"""Server-side prepared statements are a setting: on by default (the driver
prepares a statement it ran five times), off with `prepare_threshold=None`,
which a pooler in transaction mode needs (a statement prepared on one server
connection is unknown on the next)."""

from __future__ import annotations

import pytest

from sidecar.storage.api import ReadView, Table
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from sidecar.storage.postgres.views import PgReadView


def _prepared_after_repeats(url: str, options: PostgresOptions) -> int:
    """Statements prepared on the one point-read connection after the same
    read ran ten times."""
    store = PostgresStore(url, options)
    try:
        for _ in range(10):
            store.read_point(lambda view: view.get(Table.META, b"absent"))

        def count(view: ReadView) -> int:
            assert isinstance(view, PgReadView)
            rows = view.rows("SELECT count(*) FROM pg_prepared_statements", ())
            return int(str(rows[0][0]))

        return store.read_point(count)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("threshold", "prepares"), [(5, True), (None, False)], ids=["default", "off"]
)
def test_server_side_prepares_follow_the_setting(
    pg_url: str, threshold: int | None, prepares: bool
) -> None:
    options = PostgresOptions(readers=1, prepare_threshold=threshold)
    assert (_prepared_after_repeats(pg_url, options) > 0) is prepares
