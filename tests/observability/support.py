"""Helpers for observability tests: scraping /metrics, and a daemon whose
provider route `up` (with an API key) points at a scripted upstream."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.seams import Seams
from sidecar.testing import RunningDaemon, running_daemon
from tests.provider.support import FakeSleep
from tests.provider.upstream import Reply, Upstream, serving

API_KEY = "sk-observed-provider-key-5150"


@dataclass(frozen=True, slots=True)
class Scrape:
    """One scrape: (name, sorted labels) -> value, samples as exposed."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(
        default_factory=dict
    )
    text: str = ""

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))


def scrape(address: str) -> Scrape:
    """GET http://ADDRESS/metrics and parse it as Prometheus text."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return Scrape(samples, text)


@contextmanager
def observed_daemon(
    tmp: Path, *script: Reply, tokens_text: str | None = None
) -> Iterator[tuple[RunningDaemon, Upstream]]:
    """A daemon with /metrics on 127.0.0.1:0 and a provider route `up`
    carrying API_KEY, on a manual clock whose retries never sleep."""
    with serving(*script) as up:
        providers = tmp / "providers.toml"
        (tmp / "key").write_text(API_KEY)
        providers.write_text(
            f'[routes.up]\nbase_url = "{up.base_url}"\n'
            f'credential_file = "{tmp / "key"}"\nidempotency_key = true\n'
            'paths = ["/v1/"]\n'
        )
        config = ServeConfig(
            data_dir=tmp / "data",
            init=True,
            providers_file=providers,
            metrics_listen="127.0.0.1:0",
            tokens_text=tokens_text,
        )
        clock = ManualClock()
        seams = Seams(clock=clock, backoff_sleep=FakeSleep(clock))
        with running_daemon(config, seams=seams) as running:
            yield running, up
