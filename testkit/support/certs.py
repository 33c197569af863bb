"""A throwaway CA, server and client certificates for TLS tests (``cryptography``)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: a client trusting it must fail


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name))
            .issuer_name(_name(common_name)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, common_name: str,
          server: bool) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(common_name))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(
                   [ExtendedKeyUsageOID.SERVER_AUTH if server
                    else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_certs(folder: Path) -> CertFiles:
    ca_key, ca_cert = _ca("tokenpath test CA")
    server_key, server_cert = _leaf(ca_key, ca_cert, "localhost", server=True)
    client_key, client_cert = _leaf(ca_key, ca_cert, "tokenpath test client", server=False)
    _, other_ca = _ca("unrelated CA")
    files = CertFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key",
                      folder / "client.pem", folder / "client.key", folder / "other-ca.pem")
    _write_cert(ca_cert, files.ca)
    _write_cert(server_cert, files.server_cert)
    _write_key(server_key, files.server_key)
    _write_cert(client_cert, files.client_cert)
    _write_key(client_key, files.client_key)
    _write_cert(other_ca, files.other_ca)
    return files
