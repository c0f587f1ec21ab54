"""Certificates and keys of the local control plane (a throwaway CA, made once per state dir).

- CA: signs the apiserver's serving cert and every client cert.
- apiserver serving cert for 127.0.0.1 / localhost and the given cluster addresses.
- client certs: admin (O=system:masters), the kubelet (system:masters: it mints pod tokens
  and runs several Nodes from one process), controller-manager and scheduler (their own
  built-in RBAC identities), the local volume provisioner (a user of its own ClusterRole).
- the ServiceAccount token signing key pair.
- the aggregation layer's front proxy: a CA of its own and the client cert the API server
  presents to extension API servers (an APIService's backend trusts that CA for the identity
  headers, so no other client cert of this cluster can assert a user to it).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)

# identity -> (common name, organisation or None)
CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("pdwarden-admin", "system:masters"),
    "kubelet": ("pdwarden-kubelet", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "scheduler": ("system:kube-scheduler", None),
    # the local volume provisioner: a plain user, given only its ClusterRole (provisioner.rbac)
    "provisioner": ("system:pdwarden-local-provisioner", None),
}


FRONT_PROXY_CLIENT = "front-proxy-client"  # the CN extension API servers accept (requestheader-allowed-names)


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"

    def client_cert(self, who: str) -> Path:
        return self.directory / f"{who}.crt"

    def client_key(self, who: str) -> Path:
        return self.directory / f"{who}.key"

    @property
    def front_proxy_ca_cert(self) -> Path:
        return self.directory / "front-proxy-ca.crt"

    @property
    def front_proxy_client_cert(self) -> Path:
        return self.directory / "front-proxy-client.crt"

    @property
    def front_proxy_client_key(self) -> Path:
        return self.directory / "front-proxy-client.key"

    def complete(self) -> bool:
        files = [self.ca_cert, self.ca_key, self.serving_cert, self.serving_key, self.sa_key, self.sa_pub]
        files += [self.front_proxy_ca_cert, self.front_proxy_client_cert, self.front_proxy_client_key]
        files += [self.client_cert(w) for w in CLIENTS] + [self.client_key(w) for w in CLIENTS]
        return all(f.exists() for f in files)


def serving_ips(pki: Pki) -> set[str]:
    """The IP addresses the apiserver's serving certificate names."""
    cert = x509.load_pem_x509_certificate(pki.serving_cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}


def ensure_pki(directory: Path, ips: Sequence[str] = ()) -> Pki:
    """Create the CA, certs and keys unless a complete set naming `ips` exists already."""
    pki = Pki(directory)
    if pki.complete() and set(ips) <= serving_ips(pki):
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)

    ca_key, ca_cert = _new_ca("pdwarden-local-ca", now)
    ca_name = ca_cert.subject
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca_cert)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys(ips) if ip != "127.0.0.1"),
    ]
    serving = (
        _builder(_name("kube-apiserver"), ca_name, serving_key.public_key(), now)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.serving_cert, serving)

    for who, (cn, org) in CLIENTS.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            _builder(_name(cn, org), ca_name, key.public_key(), now)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(pki.client_key(who), key)
        _write_cert(pki.client_cert(who), cert)

    _front_proxy(pki, now)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def _new_ca(common_name: str, now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _front_proxy(pki: Pki, now: dt.datetime) -> None:
    """The front proxy's CA (its key is not kept: nothing else is ever signed by it) and client."""
    ca_key, ca_cert = _new_ca("pdwarden-local-front-proxy-ca", now)
    ca_name = ca_cert.subject
    _write_cert(pki.front_proxy_ca_cert, ca_cert)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(FRONT_PROXY_CLIENT), ca_name, key.public_key(), now)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.front_proxy_client_key, key)
    _write_cert(pki.front_proxy_client_cert, cert)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: dt.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
