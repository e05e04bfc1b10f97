"""Certificates and keys of a local control plane: one CA, serving certificates for loopback,
client certificates per component, and the service-account signing key."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# A throwaway cluster: long enough for any test run or demo, short enough to never matter.
_VALIDITY = dt.timedelta(days=30)
_SERVING_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
_SERVING_IPS = ("127.0.0.1", "10.96.0.1")

_Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class ClusterPki:
    ca: Pair
    apiserver: Pair
    admin: Pair
    controller_manager: Pair
    scheduler: Pair
    kwok: Pair
    service_account_key: Path
    service_account_public: Path


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def _key_pem(key: _Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _issue(
    directory: Path,
    name: str,
    subject: x509.Name,
    issuer: tuple[x509.Certificate, _Key] | None,
    *,
    ca: bool = False,
    server: bool = False,
    client: bool = False,
) -> tuple[Pair, x509.Certificate, _Key]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    issuer_cert, issuer_key = issuer if issuer else (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server:
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in _SERVING_NAMES]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _SERVING_IPS]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    pair = Pair(
        cert=_write(directory / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
        key=_write(directory / f"{name}.key", _key_pem(key), private=True),
    )
    return pair, cert, key


def _user(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def generate(directory: Path) -> ClusterPki:
    """Write a fresh PKI into `directory` (created 0700)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    ca_pair, ca_cert, ca_key = _issue(
        directory, "ca", _user("inferfleet-dev-cluster-ca"), None, ca=True
    )
    issuer = (ca_cert, ca_key)

    def client(name: str, common_name: str, organization: str | None = None) -> Pair:
        return _issue(directory, name, _user(common_name, organization), issuer, client=True)[0]

    apiserver = _issue(
        directory, "apiserver", _user("kube-apiserver"), issuer, server=True, client=True
    )[0]
    signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = signing_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    private = signing_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    return ClusterPki(
        ca=ca_pair,
        apiserver=apiserver,
        # system:masters bypasses RBAC: the admin of a throwaway cluster, never the operator.
        admin=client("admin", "inferfleet-admin", "system:masters"),
        controller_manager=client("controller-manager", "system:kube-controller-manager"),
        scheduler=client("scheduler", "system:kube-scheduler"),
        # kwok plays the kubelets: the Node authorizer's identity for nodes is per node, so
        # it runs as a cluster admin of node and pod status instead.
        kwok=client("kwok", "kwok-controller", "system:masters"),
        service_account_key=_write(directory / "service-account.key", private, private=True),
        service_account_public=_write(directory / "service-account.pub", public),
    )
