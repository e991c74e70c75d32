"""HTTPS through the real process: the model endpoint and an MCP server served over TLS
with a certificate of the test's own, trusted through ``SSL_CERT_FILE`` (as a corporate CA
would be), and refused, plainly, without it. The agent imports its reactor without pyOpenSSL
(``cli.importReactor``); the MCP client loads it when it first needs it."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, ssl
from twisted.web.server import Site

from .e2e import agentText, modelEnv, text, updates
from .mcp_e2e import http, toolMessages
from .mcp_http import ScriptedHTTPMCP
from .scripted_model import ScriptedModel
from .sdkclient import RecordingClient, connect, initialized, onLoop
from .test_e2e_mcp_servers import allowAll


def selfSigned(folder: Path) -> tuple[Path, bytes]:
    """A CA-style certificate for 127.0.0.1 and localhost: its file, and the PEM of it and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hermes-acp tests")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certPEM = certificate.public_bytes(serialization.Encoding.PEM)
    keyPEM = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())
    path = folder / "test-ca.pem"
    path.write_bytes(certPEM)
    return path, certPEM + keyPEM


@pytest.fixture
def tlsServers(tmp_path):
    """The scripted model and a scripted HTTP MCP server, both over HTTPS on loopback:
    (model, its URL, the MCP server, its URL, the certificate's file)."""
    caFile, pem = selfSigned(tmp_path)
    options = ssl.PrivateCertificate.loadPEM(pem).options()
    model, web = ScriptedModel(), ScriptedHTTPMCP({})
    ports = [reactor.listenSSL(0, Site(resource), options, interface="127.0.0.1") for resource in (model, web)]
    modelURL = f"https://127.0.0.1:{ports[0].getHost().port}/v1"
    mcpURL = f"https://127.0.0.1:{ports[1].getHost().port}/mcp"
    yield model, modelURL, web, mcpURL, caFile
    web.disconnectAll()
    for port in ports:
        pytest_twisted.blockon(port.stopListening())


def scenario(modelURL: str, mcpURL: str, cwd: Path, **env: str) -> Any:
    async def run():
        async with connect(RecordingClient(permission=allowAll), env=modelEnv(modelURL, **env)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(cwd), mcp_servers=[http("web", mcpURL)])).session_id
            error = None
            try:
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("over tls")]), 30)
            except Exception as e:  # the SDK's RequestError
                error = e
            return error, updates(wire, sid), wire.problems()

    return onLoop(run())


@pytest_twisted.ensureDeferred
async def test_httpsWithTheCertificateTrusted(tlsServers, tmp_path) -> None:
    """``SSL_CERT_FILE`` names the CA: the model answers over HTTPS, and the MCP server's
    tool is called over HTTPS and its result reaches the model."""
    model, modelURL, web, mcpURL, caFile = tlsServers
    model.default.responses += [
        [{"tool_calls": [{"id": "e", "name": "mcp__web__echo", "arguments": {"text": "through tls"}}]}],
        [{"text": "both over https"}],
    ]
    error, found, problems = await scenario(modelURL, mcpURL, tmp_path, SSL_CERT_FILE=str(caFile))
    assert problems == [] and error is None
    assert "both over https" in agentText(found)
    assert toolMessages(model.chatRequests[1]) == ["through tls"]


@pytest_twisted.ensureDeferred
async def test_untrustedCertificateIsSaidPlainly(tlsServers, tmp_path) -> None:
    """Without the CA, both are refused, each with a message that names the cause and the fix."""
    model, modelURL, web, mcpURL, _ = tlsServers
    error, found, problems = await scenario(modelURL, mcpURL, tmp_path)
    assert problems == []
    assert error is not None and "TLS certificate not trusted" in str(error) and "SSL_CERT_FILE" in str(error)
    assert "MCP server web is not available" in agentText(found)
    assert model.chatRequests == []


def test_theReactorIsImportedWithoutOpenSSLAndHTTPSStillWorks() -> None:
    """``cli.importReactor`` (every entry point of the agent): no pyOpenSSL at start; the web
    client's HTTPS loads it when first needed; only the reactor's own TLS (connectSSL, startTLS,
    which the agent does not use) is gone, and says so."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from hermes_acp.cli import importReactor\n"
        "importReactor()\n"
        "from twisted.internet import reactor\n"
        "print('OpenSSL' in sys.modules)\n"
        "from twisted.web.client import BrowserLikePolicyForHTTPS\n"
        "print(type(BrowserLikePolicyForHTTPS().creatorForNetloc(b'example.com', 443)).__name__)\n"
        "print('OpenSSL' in sys.modules)\n"
        "try:\n"
        "    reactor.connectSSL('127.0.0.1', 9, None, None)\n"
        "except AssertionError as e:\n"
        "    print(e)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd="/")
    assert run.stdout.splitlines() == ["False", "ClientTLSOptions", "True", "SSL support is not present"], run.stderr
