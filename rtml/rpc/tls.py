"""Optional TLS on the TCP listeners, authenticated by the cluster token, not a CA.

    listener --Challenge(version, nonce S, tls=True)--> connector     (plain text)
    <==================== TLS handshake ======================>      the listener's cert
    listener <--Hello(nonce C, proof = HMAC(token, client, S, C, B))--   (inside TLS)
    listener --HelloReply(proof = HMAC(token, server, C, S, B))-->

``B`` is the channel binding of RFC 5929 (``tls-server-end-point``): the SHA-256 of the
listener's certificate as each side saw it. Certificates are self-signed and nobody
checks them against a CA; the proofs do the work. A man in the middle who ends TLS with
a certificate of its own shows the connector another ``B`` than the listener's, so
neither side's proof checks at the other, and one who strips ``tls=True`` from the
Challenge leaves the connector proving ``B = b""`` to a listener that checks its own
certificate's hash: both refused. So a node needs no CA and nothing pinned by hand: the
token it already holds authenticates every listener's certificate.

Unix sockets stay plain (they never leave the machine, and their directory is the
user's own). A listener's certificate and key: given (``--tls-cert/--tls-key``), or
made by :func:`make_certificate` in the node's session directory, mode 0600.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from rtml.exceptions import ProtocolError

CERT_NAME = "rtml-node"
"""The subject and only DNS name of the certificates rtml makes."""


@dataclass(frozen=True)
class ServerTls:
    """A listener's TLS: its context and the channel binding its certificate gives."""

    context: ssl.SSLContext
    binding: bytes
    cert_pem: bytes
    """Its certificate, and the CAs the file gave after it (never the key)."""


def server_tls(cert_path: str, key_path: str) -> ServerTls:
    """The TLS of a listener with this certificate and key. Raises ValueError naming
    the file that is missing or not a PEM certificate/key pair."""
    for path in (cert_path, key_path):
        if not os.path.isfile(path):
            raise ValueError(f"TLS file {path} does not exist; pass --tls-cert and "
                             f"--tls-key (PEM files), or --tls alone to make them")
    _check_private(key_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_path, key_path)
    except ssl.SSLError as exc:
        raise ValueError(f"{cert_path} and {key_path} are not a PEM certificate and its "
                         f"private key: {exc}") from None
    der, pem = _certificates(cert_path)
    return ServerTls(context, binding_of(der), pem)


def _certificates(cert_path: str) -> tuple[bytes, bytes]:
    """The certificate TLS shows (DER), and the certificates of the file (PEM, the key
    left out), read as OpenSSL reads them: text around them, a private key in the same
    file, and the CAs after the first are allowed."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    try:
        chain = x509.load_pem_x509_certificates(Path(cert_path).read_bytes())
    except ValueError as exc:
        raise ValueError(f"{cert_path} holds no PEM certificate that can be read ({exc}); "
                         f"pass a PEM certificate to --tls-cert") from None
    pem = b"".join(cert.public_bytes(Encoding.PEM) for cert in chain)
    if not cert_name(pem):
        raise ValueError(f"the certificate in {cert_path} names no host (no DNS name, no "
                         f"common name), which pulls of objects over TLS check; pass one "
                         f"that does, or --tls alone to have rtml make one")
    return chain[0].public_bytes(Encoding.DER), pem


def cert_name(pem: bytes) -> str:
    """The host the first certificate of ``pem`` names (its first DNS name, else its
    common name; "" if none): gRPC checks the name of the certificate it pins, so a
    puller tells it the one the holder's certificate has (``--tls-cert`` may name any)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    try:
        names = cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    names += [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return names[0] if names else ""


def _check_private(key_path: str) -> None:
    """Refuse a key that another user may read or write (as ssh refuses one): whoever
    reads it can end TLS with the listener's own certificate, so the binding checks at
    both ends, and read and rewrite all that crosses. Raises ValueError naming the fix."""
    status = os.stat(key_path)
    if status.st_uid != os.geteuid():
        raise ValueError(f"TLS key {key_path} belongs to another user (uid "
                         f"{status.st_uid}); use a copy of your own, mode 0600")
    if status.st_mode & 0o077:
        raise ValueError(f"TLS key {key_path} may be read by other users (mode "
                         f"{status.st_mode & 0o777:04o}): chmod 600 {key_path}")


def listener_tls(cert_path: str, key_path: str) -> ServerTls | None:
    """A TCP listener's TLS from its config's paths; None where they are "" (plain)."""
    return server_tls(cert_path, key_path) if cert_path else None


def client_context() -> ssl.SSLContext:
    """The connector's context: any certificate is taken, since the handshake's proofs
    bind the one seen (module docstring); TLS 1.2 at least."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def binding_of(der: bytes | None) -> bytes:
    """The channel binding of a certificate (DER): its SHA-256."""
    if not der:
        raise ProtocolError("the TLS peer showed no certificate")
    return hashlib.sha256(der).digest()


def make_certificate(directory: str) -> tuple[str, str]:
    """A new self-signed certificate and key (EC P-256, ten years) in ``directory``
    (``tls.crt``, ``tls.key``: 0600); returns their paths. Reuses a pair made before."""
    cert_path = os.path.join(directory, "tls.crt")
    key_path = os.path.join(directory, "tls.key")
    if os.path.isfile(cert_path) and os.path.isfile(key_path):
        return cert_path, key_path
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CERT_NAME)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(CERT_NAME)]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write_private(key_path, key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _write_private(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)
