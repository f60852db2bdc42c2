"""The control plane's certificates and keys, made fresh for each plane (as envtest does).

One CA signs the API server's serving certificate, every client certificate (the admin, the
API server's own client to the node agent) and Kueue's webhook serving certificate, so one
`caBundle` serves the webhooks and one CA file the clients; the front proxy (the aggregator's
client to Kueue's visibility server) has a CA of its own, as in kubeadm clusters. ECDSA P-256
keys: quick to make, and accepted by every part.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 7
API_SERVER_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every file the plane's parts are given."""

    ca: Pair
    api_server: Pair
    admin: Pair
    kubelet_client: Pair
    webhook: Pair
    front_proxy_ca: Pair
    front_proxy_client: Pair
    service_account_key: Path
    service_account_public: Path

    def ca_pem(self) -> bytes:
        return self.ca.cert.read_bytes()


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _write(
    folder: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Pair:
    pair = Pair(folder / f"{name}.crt", folder / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _private(pair.key, key)
    return pair


def _private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _builder(
    subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


class _Authority:
    def __init__(self, common: str) -> None:
        self.key = _key()
        self.name = _name(common)
        usage = x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=True,
            crl_sign=True,
            encipher_only=False,
            decipher_only=False,
        )
        self.cert = (
            _builder(self.name, self.name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(usage, critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        common: str,
        *,
        organization: str | None = None,
        server: tuple[str, ...] = (),
        client: bool = False,
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A leaf for `common`; `server`: the DNS names and IPs it serves."""
        key = _key()
        uses = []
        if server:
            uses.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            uses.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = _builder(_name(common, organization), self.name, key.public_key())
        builder = builder.add_extension(x509.ExtendedKeyUsage(uses), critical=False)
        if server:
            names: list[x509.GeneralName] = []
            for entry in server:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(entry)))
                except ValueError:
                    names.append(x509.DNSName(entry))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key


def make(folder: Path, *, service_ip: str) -> Pki:
    """Write a fresh set into `folder` (0700; keys 0600). `service_ip`: the `kubernetes`
    Service's cluster IP, which the API server's certificate also names."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    ca = _Authority("kernel-queue-test-ca")
    front = _Authority("kernel-queue-front-proxy-ca")
    loopback = ("127.0.0.1",)
    sa_key = _key()
    sa_public = folder / "service-account.pub"
    sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    _private(folder / "service-account.key", sa_key)
    return Pki(
        ca=_write(folder, "ca", ca.cert, ca.key),
        api_server=_write(
            folder,
            "apiserver",
            *ca.issue("kube-apiserver", server=(*loopback, service_ip, *API_SERVER_NAMES)),
        ),
        admin=_write(
            folder,
            "admin",
            *ca.issue("kubernetes-admin", organization="system:masters", client=True),
        ),
        kubelet_client=_write(
            folder,
            "apiserver-kubelet-client",
            *ca.issue("kube-apiserver-kubelet-client", organization="system:masters", client=True),
        ),
        webhook=_write(
            folder, "webhook", *ca.issue("kueue-webhook", server=(*loopback, "localhost"))
        ),
        front_proxy_ca=_write(folder, "front-proxy-ca", front.cert, front.key),
        front_proxy_client=_write(
            folder, "front-proxy-client", *front.issue("front-proxy-client", client=True)
        ),
        service_account_key=folder / "service-account.key",
        service_account_public=sa_public,
    )


def self_signed(folder: Path, common: str) -> Pair:
    """A self-signed serving certificate for 127.0.0.1 in `folder` as `tls.crt`/`tls.key`,
    made once: for the paths every Kueue reads whatever its plane (metrics, visibility). Planes
    that start at once (one per test worker) make it under a lock, so none reads a certificate
    with another's key."""
    pair = Pair(folder / "tls.crt", folder / "tls.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if pair.cert.exists() and pair.key.exists():  # made while this one waited
            return pair
        authority = _Authority(common)
        cert, key = authority.issue(common, server=("127.0.0.1", "localhost"))
        _private(pair.key, key)
        partial = pair.cert.with_suffix(".partial")  # the certificate appears whole, key first
        partial.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        partial.replace(pair.cert)
    return pair
