"""TLS credentials of the TCP listener, reloaded without a restart.

gRPC asks for the certificate configuration at every new handshake
(`dynamic_ssl_server_credentials`); the files are read again when one of
them changed, so a rotated certificate (cert-manager, a renewed key pair)
serves new connections while established ones continue. A rotation that
leaves unreadable or mismatched files keeps the configuration in force and
says so in the log.

With a client CA configured, client certificates are required: a
`root_certificates` without `require_client_authentication=True` would
accept clients with none (measured: reliability-anchors §4.3).
"""

from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

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

    def configuration(self) -> Any:
        """The files as gRPC's configuration; refuses a key that does not
        belong to the certificate (gRPC would accept it and fail every
        handshake)."""
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
        return grpc.ssl_server_certificate_configuration(
            [(key, cert)], root_certificates=ca
        )


class MismatchedFiles(ValueError):
    """The TLS files are readable but not a certificate, its key and a CA."""


class CertificateReloader:
    """The fetcher gRPC calls before each handshake: a new configuration
    when the files changed since the last one, else None (keep it)."""

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._lock = threading.Lock()
        self._stamp = files.stamp()
        self.initial = files.configuration()
        self.reloads = 0

    def __call__(self) -> Any:
        with self._lock:
            try:
                stamp = self._files.stamp()
                if stamp == self._stamp:
                    return None
                config = self._files.configuration()
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


def server_credentials(cfg: ServeConfig) -> grpc.ServerCredentials:
    if cfg.tls_cert is None or cfg.tls_key is None:
        raise ConfigError("tls-cert: TLS needs tls-cert and tls-key")
    files = TlsFiles(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
    try:
        reloader = CertificateReloader(files)
    except OSError as exc:
        raise ConfigError(
            f"tls-cert: cannot read {exc.filename}: {exc.strerror}"
        ) from None
    except MismatchedFiles as exc:
        raise ConfigError(f"tls-cert and tls-key: {exc}") from None
    return grpc.dynamic_ssl_server_credentials(
        reloader.initial,
        reloader,
        require_client_authentication=cfg.tls_client_ca is not None,
    )
