"""TLS credentials of the TCP listener, reloaded without a restart.

gRPC asks for the certificate configuration at every new handshake
(`dynamic_ssl_server_credentials`); the files are read again when one of
them changed, so a rotated certificate (cert-manager, a renewed key pair)
serves new connections while established ones continue. A rotation that
leaves unreadable or mismatched files keeps the configuration in force and
says so in the log, and so does a certificate that has expired or is not
valid yet (at start and at each reload).

With a client CA configured, client certificates are required: a
`root_certificates` without `require_client_authentication=True` would
accept clients with none (measured: reliability-anchors §4.3).
"""

from __future__ import annotations

import datetime
import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sidecar.clock import Clock, SystemClock
from sidecar.config import ConfigError, ServeConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None

    def stamp(self) -> tuple[tuple[int, int, int], ...]:
        """What identifies the files' current contents cheaply."""
        paths = [self.cert, self.key] + ([self.client_ca] if self.client_ca else [])
        stamps = []
        for p in paths:
            st = p.stat()
            stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(stamps)

    def configuration(self, now_ns: int | None = None) -> Any:
        """The files as gRPC's configuration; refuses a key that does not
        belong to the certificate (gRPC would accept it and fail every
        handshake). With `now_ns` (wall-clock nanoseconds), a certificate
        that has expired or is not valid yet is logged: it is served anyway
        (a clock can be wrong), but clients will refuse it."""
        cert = self.cert.read_bytes()
        key = self.key.read_bytes()
        ca = self.client_ca.read_bytes() if self.client_ca else None
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                self.cert, self.key
            )
            if self.client_ca is not None:
                ssl.create_default_context(cafile=self.client_ca)
        except ssl.SSLError as exc:
            raise MismatchedFiles(
                exc.reason or "not a certificate and its key"
            ) from None
        if now_ns is not None:
            warn_outside_validity(self.cert, cert, now_ns)
        return grpc.ssl_server_certificate_configuration(
            [(key, cert)], root_certificates=ca
        )


def warn_outside_validity(path: Path, pem: bytes, now_ns: int) -> None:
    """Logs a warning when the chain's first certificate (the server's) is
    expired or not valid yet at `now_ns`."""
    # Imported here, only with TLS on: `cryptography` is about 9 MB of the
    # resident memory of a daemon that would otherwise never use it.
    from cryptography import x509  # noqa: PLC0415

    try:
        leaf = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return  # ssl has accepted it; nothing more to say here
    now = datetime.datetime.fromtimestamp(now_ns / 1e9, datetime.UTC)
    if now > leaf.not_valid_after_utc:
        log.warning(
            "the TLS certificate %s expired at %s: clients will refuse it; "
            "replace it (it is read again at the next handshake)",
            path,
            leaf.not_valid_after_utc.isoformat(),
        )
    elif now < leaf.not_valid_before_utc:
        log.warning(
            "the TLS certificate %s is not valid before %s: clients will "
            "refuse it until then; check it and this machine's clock",
            path,
            leaf.not_valid_before_utc.isoformat(),
        )


class MismatchedFiles(ValueError):
    """The TLS files are readable but not a certificate, its key and a CA."""


class CertificateReloader:
    """The fetcher gRPC calls before each handshake: a new configuration
    when the files changed since the last one, else None (keep it)."""

    def __init__(self, files: TlsFiles, clock: Clock | None = None) -> None:
        self._files = files
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._stamp = files.stamp()
        self.initial = files.configuration(self._clock.wall_ns())
        self.reloads = 0

    def __call__(self) -> Any:
        with self._lock:
            try:
                stamp = self._files.stamp()
                if stamp == self._stamp:
                    return None
                config = self._files.configuration(self._clock.wall_ns())
            except OSError as exc:
                log.error(
                    "TLS files unreadable (%s); the certificate in force stays",
                    exc.strerror,
                )
                return None
            except MismatchedFiles as exc:
                log.error(
                    "TLS files rejected (%s); the certificate in force stays", exc
                )
                return None
            self._stamp = stamp
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self._files.cert)
            return config


def server_credentials(
    cfg: ServeConfig, clock: Clock | None = None
) -> grpc.ServerCredentials:
    if cfg.tls_cert is None or cfg.tls_key is None:
        raise ConfigError("tls_cert", "TLS needs tls-cert and tls-key")
    files = TlsFiles(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
    try:
        reloader = CertificateReloader(files, clock)
    except OSError as exc:
        raise ConfigError(
            "tls_cert", f"cannot read {exc.filename}: {exc.strerror}"
        ) from None
    except MismatchedFiles as exc:
        raise ConfigError(("tls_cert", "tls_key"), str(exc)) from None
    return grpc.dynamic_ssl_server_credentials(
        reloader.initial,
        reloader,
        require_client_authentication=cfg.tls_client_ca is not None,
    )
