"""Optional TLS on the TCP listeners (issue 17): a cluster of two real nodes started with
``--tls`` runs tasks, actor calls and object pulls across them; what crosses its TCP
connections is not plain text; a man in the middle who ends TLS with a certificate of
his own, or strips TLS from the Challenge, is refused by the token proofs that bind the
listener's certificate; a node cannot join without matching the head's TLS."""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)
from cryptography.x509.oid import NameOID

from rtml.exceptions import ProtocolError
from rtml.ids import random_id
from rtml.rpc import messages as m
from rtml.rpc.admission import HELLO_TIMEOUT
from rtml.rpc.client import connect_socket, handshake, make_hello
from rtml.rpc.framing import FrameDecoder, frame
from rtml.rpc.tls import binding_of, client_context, make_certificate, server_tls
from rtml.worker.main import MAX_PENDING as WORKER_MAX_PENDING
from tests.integration.test_cli import (
    CLI_TIMEOUT,
    Head,
    _env,
    _free_port,
    _stop,
    rtml,
    started_head,
)

DRIVER = """
import numpy as np
import rtml
rtml.init(address="auto")

@rtml.remote(resources={"far": 1})
def far(array):
    return rtml.get_runtime_context().get_node_id(), int(array.sum()), np.ones(3_000_000)

@rtml.remote(resources={"far": 1})
class Counter:
    def __init__(self):
        self.n = 0
    def add(self, k):
        self.n += k
        return self.n

big = rtml.put(np.arange(2_000_000, dtype=np.int64))      # 16 MB, made on the head node
small = rtml.put(np.arange(20_000, dtype=np.int64))       # 160 KB: shared memory, no stream
node, total, back = rtml.get(far.remote(big))
_, small_total, _ = rtml.get(far.remote(small))
counter = Counter.remote()
calls = rtml.get([counter.add.remote(k) for k in range(1, 11)])
print(node, total, small_total, int(back.sum()), calls[-1], flush=True)
print(" ".join(n["NodeManagerAddress"] for n in rtml.nodes()), flush=True)
"""


@dataclass
class TlsCluster:
    head: Head
    node_dir: Path
    node_id: str


@pytest.fixture
def cert_names() -> tuple[str, str]:
    """The names in the head's and the node's certificates; "": rtml makes its own."""
    return "", ""


def _cert_args(directory: Path, name: str) -> list[str]:
    """``--tls-cert/--tls-key`` of a new self-signed certificate for ``name``."""
    if not name:
        return []
    cert, key = _certificate(name)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(Encoding.PEM))
    key_path.write_bytes(_pem(key))
    key_path.chmod(0o600)
    return ["--tls-cert", str(cert_path), "--tls-key", str(key_path)]


@pytest.fixture
def tls_head(tmp_path: Path, cert_names: tuple[str, str]) -> Iterator[Head]:
    session_dir = tmp_path / "head"
    started = rtml("start", "--head", "--tls", *_cert_args(tmp_path, cert_names[0]),
                   "--port", str(_free_port()), "--num-cpus", "1",
                   "--session-dir", str(session_dir), cwd=tmp_path)
    try:
        yield started_head(started, session_dir, tmp_path)
    finally:
        _stop(session_dir, tmp_path)


@pytest.fixture
def tls_cluster(tls_head: Head, tmp_path: Path, cert_names: tuple[str, str]
                ) -> Iterator[TlsCluster]:
    head = tls_head
    assert "--tls" in head.stdout  # the join hint carries it
    node_dir = tmp_path / "node"
    joined = rtml("start", "--address", head.address, "--tls",
                  *_cert_args(tmp_path, cert_names[1]), "--num-cpus", "2",
                  "--resources", '{"far": 2}', "--session-dir", str(node_dir),
                  cwd=tmp_path, env=_env(RTML_TOKEN=head.token))
    try:
        assert joined.returncode == 0, joined.stderr
        record = json.loads((node_dir / "session.json").read_text())
        yield TlsCluster(head, node_dir, record["node_id"])
    finally:
        _stop(node_dir, tmp_path)


def _first_frame(sock: socket.socket) -> m.Msg:
    decoder = FrameDecoder()
    while True:
        data = sock.recv(65536)
        assert data, "closed before its first frame"
        frames = decoder.feed(data)
        if frames:
            return m.decode(frames[0])


@pytest.mark.parametrize("cert_names", [("", ""), ("head.example.test", "node.example.test")],
                         ids=["made", "given"])
def test_a_tls_cluster_runs_tasks_actors_and_pulls_across_nodes(tls_cluster) -> None:
    # "given": each node's own certificate (--tls-cert), for a name of its own: the pulls
    # of objects between them (gRPC, which checks the name) work as with rtml's.
    head = tls_cluster.head
    driver = head.driver(DRIVER)
    out, err = driver.communicate(timeout=CLI_TIMEOUT)
    assert driver.returncode == 0, err
    results, addresses = out.splitlines()
    node, total, small_total, back, last = results.split()
    assert node == tls_cluster.node_id  # it ran on the other node, which pulled `big`
    assert int(total) == sum(range(2_000_000)) and int(small_total) == sum(range(20_000))
    assert int(back) == 3_000_000  # its 24 MB result came back over TLS too
    assert int(last) == sum(range(1, 11))  # actor calls, driver -> worker on the far node
    assert len(addresses.split()) == 2
    for address in (head.address, *addresses.split()):
        with connect_socket(address) as sock:  # each TCP listener announces TLS
            challenge = _first_frame(sock)
            assert isinstance(challenge, m.Challenge) and challenge.tls


class Relay:
    """A man in the middle between a client and ``upstream``: ``mode`` "relay" passes the
    bytes as they are (recording them), "terminate" ends TLS with its own certificate on
    each side, "strip" tells the client no TLS follows and speaks TLS upstream itself."""

    def __init__(self, upstream: str, mode: str, cert_dir: Path) -> None:
        self.upstream, self.mode = upstream, mode
        cert_dir.mkdir()
        self.own_tls = server_tls(*make_certificate(str(cert_dir)))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.seen = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        server = connect_socket(self.upstream)
        challenge = _first_frame(server)
        assert isinstance(challenge, m.Challenge)
        if self.mode == "relay":
            client.sendall(frame(m.encode(challenge)))
            self.seen += frame(m.encode(challenge))
        elif self.mode == "terminate":
            client.sendall(frame(m.encode(challenge)))
            client = self.own_tls.context.wrap_socket(client, server_side=True)
            server = client_context().wrap_socket(server)
        else:
            client.sendall(frame(m.encode(m.Challenge(challenge.version, challenge.nonce,
                                                      False))))
            server = client_context().wrap_socket(server)
        threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()
        self._pipe(server, client)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.seen += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def _hello() -> m.Hello:
    return make_hello("cli", random_id())


def test_what_crosses_a_tls_connection_is_not_plain_text(tls_cluster, tmp_path) -> None:
    relay = Relay(tls_cluster.head.address, "relay", tmp_path / "relay")
    marker = "a-name-only-this-test-says-" + random_id().hex()
    try:
        with connect_socket(relay.address) as plain:
            sock, reply = handshake(plain, tls_cluster.head.token, _hello())
            assert reply.ok and isinstance(sock, ssl.SSLSocket)
            sock.sendall(frame(m.encode(m.GetActorInfo(7, b"", name=marker))))
            answer = _first_frame(sock)
            assert isinstance(answer, m.ActorInfo) and answer.req_id == 7
            sock.close()
    finally:
        relay.close()
    assert len(relay.seen) > 200  # the handshake and the request went through it
    assert marker.encode() not in relay.seen and b"cli" not in relay.seen[40:]


@pytest.mark.parametrize("mode", ["terminate", "strip"])
def test_a_man_in_the_middle_is_refused(tls_cluster, tmp_path, mode) -> None:
    relay = Relay(tls_cluster.head.address, mode, tmp_path / "mitm")
    try:
        with connect_socket(relay.address) as plain, pytest.raises(ProtocolError) as refused:
            handshake(plain, tls_cluster.head.token, _hello())
    finally:
        relay.close()
    # The head finds the client's proof bound to another certificate (or to none) and
    # refuses (or, on a loaded machine, its deadline for the Hello passes first): the man
    # in the middle never sees a reply that would admit him.
    assert ("another certificate" in str(refused.value)
            or "closed the connection" in str(refused.value)), refused.value


def test_a_node_must_match_the_heads_tls(tls_cluster, tmp_path) -> None:
    head = tls_cluster.head
    plain = rtml("start", "--address", head.address, "--num-cpus", "1", "--session-dir",
                 str(tmp_path / "plain"), cwd=tmp_path, env=_env(RTML_TOKEN=head.token))
    assert plain.returncode != 0 and "uses TLS: start this node with --tls" in plain.stderr
    half = rtml("start", "--address", head.address, "--tls", "--tls-cert", "x.pem",
                "--session-dir", str(tmp_path / "half"), cwd=tmp_path,
                env=_env(RTML_TOKEN=head.token))
    assert half.returncode != 0 and "both --tls-cert and --tls-key" in half.stderr
    assert not (tmp_path / "plain" / "session.json").exists()


def _worker_listener(head: Head) -> tuple[psutil.Process, str]:
    """A worker of ``head``'s node, and the address of its TCP listener."""
    record = json.loads((head.session_dir / "session.json").read_text())
    node = next(p["pid"] for p in record["processes"] if p["name"] == "node")
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        for proc in psutil.Process(node).children(recursive=True):
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    return proc, f"{conn.laddr.ip}:{conn.laddr.port}"
        time.sleep(0.1)
    raise AssertionError("no worker of the head node listens on TCP")


def _settles(measure, limit: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while measure() > limit and time.monotonic() < deadline:
        time.sleep(0.1)
    return measure() <= limit


def test_idle_tls_connections_keep_no_owner_out_of_a_worker(tls_head) -> None:
    # A worker runs each TLS handshake on a thread of its own, at most WORKER_MAX_PENDING
    # at a time: idle connections must not hold those places against an owner that proves
    # the token at once (the oldest gives way, as on every other listener), and each ends
    # at its deadline, a TLS handshake stalled half way included.
    worker, address = _worker_listener(tls_head)
    threads, fds = worker.num_threads(), worker.num_fds()
    idle = [connect_socket(address) for _ in range(3 * WORKER_MAX_PENDING)]
    stalled = connect_socket(address)
    try:
        assert isinstance(_first_frame(stalled), m.Challenge)
        stalled.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # half a Hello
        for _ in range(3):
            with connect_socket(address) as plain:
                sock, reply = handshake(plain, tls_head.token, _hello())
                assert reply.ok and isinstance(sock, ssl.SSLSocket)
                sock.close()
        assert worker.num_threads() <= threads + WORKER_MAX_PENDING + 8
        stalled.settimeout(HELLO_TIMEOUT + 5.0)
        assert stalled.recv(4096) == b""  # its handshake was cut at the deadline
    finally:
        for sock in (*idle, stalled):
            sock.close()
    # the handshakes' threads and descriptors are all given back
    assert _settles(worker.num_threads, threads, HELLO_TIMEOUT + 5.0), worker.num_threads()
    assert _settles(worker.num_fds, fds, 5.0), (worker.num_fds(), fds)


def _certificate(name: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None = None,
                 der_length_of_3: bool = False) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate for ``name`` (self-signed, or by ``issuer``); ``der_length_of_3``:
    one whose DER length is a multiple of 3 (its base64 has no padding to end at)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = issuer or (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    while True:
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
                .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None),
                               critical=True)
                .sign(issuer_key, hashes.SHA256()))
        if not der_length_of_3 or not len(cert.public_bytes(Encoding.DER)) % 3:
            return cert, key


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


@pytest.mark.parametrize("layout", ["chain", "preamble", "key_first"])
def test_a_listener_binds_the_certificate_it_shows(tmp_path, layout) -> None:
    # PEM files as CAs and tools write them (the leaf and its CA; text before the
    # certificate; the key and the certificate in one file): the listener's binding is
    # that of the certificate TLS shows, as the connector computes it, and what the head
    # lists of a node's certificate holds no private key.
    ca, ca_key = _certificate("rtml-test-ca")
    leaf, key = _certificate("rtml-node", (ca.subject, ca_key), der_length_of_3=True)
    leaf_pem, cert_path, key_path = leaf.public_bytes(Encoding.PEM), tmp_path / "c.pem", tmp_path / "k.pem"
    key_path.write_bytes(_pem(key))
    cert_path.write_bytes({"chain": leaf_pem + ca.public_bytes(Encoding.PEM),
                           "preamble": b"Bag Attributes\n    friendlyName: node\n" + leaf_pem,
                           "key_first": _pem(key) + leaf_pem}[layout])
    for path in (cert_path, key_path):
        path.chmod(0o600)
    tls = server_tls(str(cert_path), str(cert_path if layout == "key_first" else key_path))
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with tls.context.wrap_socket(conn, server_side=True) as wrapped:
            wrapped.recv(1)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    with client_context().wrap_socket(socket.create_connection(listener.getsockname())) as sock:
        assert binding_of(sock.getpeercert(binary_form=True)) == tls.binding
        sock.sendall(b"x")
    server.join(5.0)
    listener.close()
    assert b"PRIVATE KEY" not in tls.cert_pem and leaf_pem in tls.cert_pem


def test_a_certificate_that_names_no_host_is_refused_at_start(tmp_path) -> None:
    # Pulls of objects over TLS (gRPC) check the holder's certificate's name: one with
    # none would start a node whose objects no other node could pull.
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(x509.Name([]))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "c.pem").write_bytes(cert.public_bytes(Encoding.PEM))
    (tmp_path / "k.pem").write_bytes(_pem(key))
    (tmp_path / "k.pem").chmod(0o600)
    started = _start_refused(tmp_path, "--tls-cert", "c.pem", "--tls-key", "k.pem")
    assert "names no host" in started.stderr, started.stderr


def test_a_key_that_others_may_read_is_refused_at_start(tmp_path) -> None:
    # Whoever reads a listener's key can end TLS with its very certificate (the binding
    # then checks) and read what crosses: the key must be this user's alone, as ssh asks.
    args = _cert_args(tmp_path, "node.example.test")
    key = Path(args[3])
    key.chmod(0o640)
    started = _start_refused(tmp_path, *args)
    assert f"{key} may be read by other users" in started.stderr, started.stderr
    assert f"chmod 600 {key}" in started.stderr


def _start_refused(cwd: Path, *tls_args: str) -> subprocess.CompletedProcess[str]:
    """``rtml start --head --tls *tls_args``, which must fail (a head that started
    anyway is stopped)."""
    session_dir = cwd / "refused"
    started = rtml("start", "--head", "--tls", *tls_args, "--port", str(_free_port()),
                   "--session-dir", str(session_dir), cwd=cwd)
    if (session_dir / "session.json").exists():
        _stop(session_dir, cwd)
    assert started.returncode != 0, started.stdout
    return started
