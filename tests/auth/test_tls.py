"""TLS and mutual TLS on the TCP listener (contract §10.1; reliability-anchors
§4.3: a failed mTLS handshake surfaces as UNAVAILABLE, not UNAUTHENTICATED)."""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc

from sidecar.clock import ManualClock
from sidecar.config import ConfigError, ServeConfig
from sidecar.rpc import tls
from sidecar.testing import running_daemon
from tests.auth.support import AGENT_A, TOKENS
from tests.support.certs import Pki, make_pki

PROBE_TIMEOUT = 10.0


def tls_config(data_dir: Path, pki: Pki, *, mutual: bool) -> ServeConfig:
    return ServeConfig(
        data_dir=data_dir,
        listen="127.0.0.1:0",
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca if mutual else None,
        tokens_text=TOKENS,
    )


def get(channel: grpc.Channel) -> grpc.StatusCode:
    """The code of a GetToolCall over `channel` (NOT_FOUND means it was
    served: the call reached the handler)."""
    stub = ledger_pb2_grpc.ToolLedgerStub(channel)
    try:
        stub.GetToolCall(
            pb.GetToolCallRequest(ref=pb.CallRef(run_id="r", call_id="c")),
            metadata=(("authorization", f"Bearer {AGENT_A}"),),
            timeout=PROBE_TIMEOUT,
        )
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def secure(
    target: str,
    root: bytes,
    cert: bytes | None = None,
    key: bytes | None = None,
) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=root, private_key=key, certificate_chain=cert
    )
    return grpc.secure_channel(target, credentials)


def test_tls_serves_a_client_that_trusts_the_server(short_tmp: Path) -> None:
    pki = make_pki(short_tmp / "pki")
    with running_daemon(tls_config(short_tmp / "data", pki, mutual=False)) as d:
        assert d.endpoints.tcp is not None
        with secure(d.endpoints.tcp, pki.ca_pem) as channel:
            assert get(channel) is grpc.StatusCode.NOT_FOUND
        # A client that trusts another CA refuses the server.
        with secure(d.endpoints.tcp, pki.untrusted_ca_pem) as channel:
            assert get(channel) is grpc.StatusCode.UNAVAILABLE


def test_plaintext_against_the_tls_port_fails(short_tmp: Path) -> None:
    pki = make_pki(short_tmp / "pki")
    with running_daemon(tls_config(short_tmp / "data", pki, mutual=False)) as d:
        assert d.endpoints.tcp is not None
        with grpc.insecure_channel(d.endpoints.tcp) as channel:
            assert get(channel) is grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_requires_a_client_certificate(short_tmp: Path) -> None:
    pki = make_pki(short_tmp / "pki")
    with running_daemon(tls_config(short_tmp / "data", pki, mutual=True)) as d:
        target = d.endpoints.tcp
        assert target is not None
        with secure(
            target, pki.ca_pem, pki.client.cert_pem, pki.client.key_pem
        ) as channel:
            assert get(channel) is grpc.StatusCode.NOT_FOUND
        with secure(target, pki.ca_pem) as channel:
            assert get(channel) is grpc.StatusCode.UNAVAILABLE
        untrusted = pki.untrusted_client
        with secure(target, pki.ca_pem, untrusted.cert_pem, untrusted.key_pem) as ch:
            assert get(ch) is grpc.StatusCode.UNAVAILABLE


def test_without_a_client_ca_no_client_certificate_is_needed(short_tmp: Path) -> None:
    """Control for the test above: the refusal there comes from the client
    CA setting, not from the client's channel."""
    pki = make_pki(short_tmp / "pki")
    with running_daemon(tls_config(short_tmp / "data", pki, mutual=False)) as d:
        assert d.endpoints.tcp is not None
        with secure(d.endpoints.tcp, pki.ca_pem) as channel:
            assert get(channel) is grpc.StatusCode.NOT_FOUND


def test_a_rotated_certificate_serves_new_connections(short_tmp: Path) -> None:
    """Certificates are re-read at the next handshake after their files
    change: no restart."""
    old = make_pki(short_tmp / "old")
    new = make_pki(short_tmp / "new")
    live = short_tmp / "live"
    live.mkdir()
    cert, key = live / "cert.pem", live / "key.pem"
    shutil.copy(old.server.cert, cert)
    shutil.copy(old.server.key, key)
    config = ServeConfig(
        data_dir=short_tmp / "data",
        listen="127.0.0.1:0",
        tls_cert=cert,
        tls_key=key,
        tokens_text=TOKENS,
    )
    with running_daemon(config) as d:
        target = d.endpoints.tcp
        assert target is not None
        with secure(target, old.ca_pem) as channel:
            assert get(channel) is grpc.StatusCode.NOT_FOUND
        # Rotate: write the new pair beside, then rename over (atomic).
        for src, dst in ((new.server.cert, cert), (new.server.key, key)):
            tmp = dst.with_suffix(".tmp")
            shutil.copy(src, tmp)
            tmp.replace(dst)
        with secure(target, new.ca_pem) as channel:
            assert get(channel) is grpc.StatusCode.NOT_FOUND
        with secure(target, old.ca_pem) as channel:
            assert get(channel) is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("missing", ["tls_cert", "tls_key"])
def test_tls_needs_both_files(short_tmp: Path, missing: str) -> None:
    pki = make_pki(short_tmp / "pki")
    config = replace(
        ServeConfig(data_dir=short_tmp, listen="127.0.0.1:0", tokens_text=TOKENS),
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
    )
    broken = (
        replace(config, tls_cert=None)
        if missing == "tls_cert"
        else replace(config, tls_key=None)
    )
    with pytest.raises(ValueError, match="tls-cert and tls-key"):
        broken.validate()


def _reloader(live: Path, pki: Pki) -> tls.CertificateReloader:
    live.mkdir()
    shutil.copy(pki.server.cert, live / "cert.pem")
    shutil.copy(pki.server.key, live / "key.pem")
    return tls.CertificateReloader(
        tls.TlsFiles(live / "cert.pem", live / "key.pem", None)
    )


def _swap(source: Path, target: Path) -> None:
    tmp = target.with_suffix(".tmp")
    shutil.copy(source, tmp)
    tmp.replace(target)


def test_the_reloader_answers_a_new_configuration_only_after_a_change(
    short_tmp: Path,
) -> None:
    """gRPC asks before every handshake: None keeps the configuration in
    force; a changed pair is read once."""
    old, new = make_pki(short_tmp / "old"), make_pki(short_tmp / "new")
    reloader = _reloader(short_tmp / "live", old)
    assert reloader() is None
    _swap(new.server.key, short_tmp / "live" / "key.pem")
    _swap(new.server.cert, short_tmp / "live" / "cert.pem")
    assert reloader() is not None
    assert reloader.reloads == 1
    assert reloader() is None


def test_a_rotation_to_bad_files_keeps_the_certificate_in_force(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = make_pki(short_tmp / "old"), make_pki(short_tmp / "new")
    live = short_tmp / "live"
    reloader = _reloader(live, old)
    # Half a rotation: the new certificate with the old key.
    _swap(new.server.cert, live / "cert.pem")
    assert reloader() is None
    (live / "key.pem").unlink()
    assert reloader() is None
    assert reloader.reloads == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("rejected" in m for m in messages)
    assert any("unreadable" in m for m in messages)


def test_a_daemon_does_not_start_with_a_key_of_another_certificate(
    short_tmp: Path,
) -> None:
    one, other = make_pki(short_tmp / "one"), make_pki(short_tmp / "other")
    config = ServeConfig(
        data_dir=short_tmp / "data",
        listen="127.0.0.1:0",
        tls_cert=one.server.cert,
        tls_key=other.server.key,
        tokens_text=TOKENS,
    )
    with pytest.raises(ConfigError, match="tls-cert and tls-key"):
        tls.server_credentials(config)


DAY_NS = 86_400 * 10**9


def _started_at(
    short_tmp: Path, caplog: pytest.LogCaptureFixture, offset_ns: int
) -> list[str]:
    """The warnings of a TLS daemon started on a clock `offset_ns` from now
    (the test certificates are valid from an hour ago for a day)."""
    caplog.set_level("WARNING", logger="sidecar.rpc.tls")
    pki = make_pki(short_tmp / "pki")
    clock = ManualClock(wall_ns=time.time_ns() + offset_ns)
    with running_daemon(tls_config(short_tmp / "data", pki, mutual=False), clock):
        pass
    return [r.getMessage() for r in caplog.records if r.name == "sidecar.rpc.tls"]


def test_an_expired_certificate_is_served_with_a_warning(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two days on, the certificate has expired: the daemon starts (a clock
    may be wrong) but says so (issue 10 item 27: fails before the fix: it
    started without a word)."""
    [warning] = _started_at(short_tmp, caplog, 2 * DAY_NS)
    assert "expired" in warning
    assert str(short_tmp / "pki") in warning


def test_a_certificate_not_valid_yet_is_served_with_a_warning(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    [warning] = _started_at(short_tmp, caplog, -DAY_NS)
    assert "not valid before" in warning


def test_a_valid_certificate_starts_without_a_warning(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Control: at the time the certificate was made, nothing is logged."""
    assert _started_at(short_tmp, caplog, 0) == []


def test_a_rotation_to_an_expired_certificate_is_logged(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The check runs again when the files are read again."""
    old, new = make_pki(short_tmp / "old"), make_pki(short_tmp / "new")
    live = short_tmp / "live"
    live.mkdir()
    shutil.copy(old.server.cert, live / "cert.pem")
    shutil.copy(old.server.key, live / "key.pem")
    clock = ManualClock(wall_ns=time.time_ns())
    reloader = tls.CertificateReloader(
        tls.TlsFiles(live / "cert.pem", live / "key.pem", None), clock
    )
    assert not caplog.records
    clock.advance(2 * 86_400)
    _swap(new.server.key, live / "key.pem")
    _swap(new.server.cert, live / "cert.pem")
    assert reloader() is not None
    assert any("expired" in r.getMessage() for r in caplog.records)
