"""A throwaway PKI for TLS and mutual-TLS tests, generated fresh in `tmp_path`.

`make_pki(tmp_path)` writes a test CA, a server certificate valid for `localhost`,
`127.0.0.1` and `::1`, a client certificate, and a second CA that nobody trusts (with a
client certificate of its own), so a test can show both that the trusted chain is
accepted and that an untrusted one is refused. Keys are P-256 (fast to generate) and
written with mode 0600, like real key files; certificates are valid from an hour ago
for a day, so clock skew between the generator and the TLS stack does not matter.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: The names the server certificate is valid for: what tests dial.
SERVER_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class CertKey:
    """A certificate and its private key, as PEM files and as the bytes in them."""

    cert: Path
    key: Path
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True, slots=True)
class Pki:
    """Everything a TLS test needs; see the module docstring.

    `ca`/`ca_pem` is the trusted root (pass it as the client's root certificates and
    as the daemon's `tls_client_ca`); `server` is signed by it for `SERVER_NAMES`;
    `client` is signed by it for client authentication. `untrusted_ca` is an unrelated
    root and `untrusted_client` a client certificate it signed: a daemon that checks
    client certificates against `ca` must refuse it.
    """

    ca: Path
    ca_pem: bytes
    server: CertKey
    client: CertKey
    untrusted_ca: Path
    untrusted_ca_pem: bytes
    untrusted_client: CertKey


@dataclass(frozen=True, slots=True)
class _Authority:
    name: x509.Name
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def make_pki(directory: Path) -> Pki:
    """Generate a fresh PKI under `directory` (created if missing) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca = _authority("effectd test CA", now)
    other = _authority("effectd untrusted CA", now)
    ca_path = _write(directory / "ca.pem", _pem(ca.cert), private=False)
    other_path = _write(directory / "untrusted-ca.pem", _pem(other.cert), private=False)
    return Pki(
        ca=ca_path,
        ca_pem=ca_path.read_bytes(),
        server=_leaf(directory, "server", ca, now, server=True),
        client=_leaf(directory, "client", ca, now, server=False),
        untrusted_ca=other_path,
        untrusted_ca_pem=other_path.read_bytes(),
        untrusted_client=_leaf(directory, "untrusted-client", other, now, server=False),
    )


def _authority(common_name: str, now: datetime.datetime) -> _Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return _Authority(name=name, key=key, cert=cert)


def _leaf(
    directory: Path,
    stem: str,
    issuer: _Authority,
    now: datetime.datetime,
    *,
    server: bool,
) -> CertKey:
    key = ec.generate_private_key(ec.SECP256R1())
    common_name = "localhost" if server else f"effectd-test-{stem}"
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = (
        ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    )
    builder = (
        _builder(subject, issuer.name, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()),
            critical=False,
        )
    )
    if server:
        # Clients check the name they dialled against the SAN, never the CN.
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName(SERVER_NAMES[0]),
                    *(
                        x509.IPAddress(ipaddress.ip_address(address))
                        for address in SERVER_NAMES[1:]
                    ),
                ]
            ),
            critical=False,
        )
    cert = builder.sign(issuer.key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    cert_path = _write(directory / f"{stem}.pem", _pem(cert), private=False)
    key_path = _write(directory / f"{stem}-key.pem", key_pem, private=True)
    return CertKey(
        cert=cert_path,
        key=key_path,
        cert_pem=cert_path.read_bytes(),
        key_pem=key_pem,
    )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, *, private: bool) -> Path:
    # A key file is created 0600 from the start, never chmod-ed after being readable.
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return path
