"""What only the https relay (`--tls self-signed`) shows: the SDKs check its certificate for real
(trusting it takes the generated file), and the fingerprint it advertises is that certificate's.
The rest of the suite runs over https through the `relay` fixture's second parameter."""

from __future__ import annotations

import hashlib
import ssl

import anthropic
import openai
import pytest

from conftest import http_get_json

# Only the https relay: indirect parametrization picks that instance of the session fixture.
pytestmark = pytest.mark.parametrize("relay", ["https"], indirect=True)


def test_an_sdk_that_does_not_trust_the_certificate_is_refused(relay):
    with openai.OpenAI(base_url=f"{relay.url}/v1", api_key="x", max_retries=0, timeout=10) as client:
        with pytest.raises(openai.APIConnectionError):
            client.models.list()
    with anthropic.Anthropic(base_url=relay.url, api_key="x", max_retries=0, timeout=10) as client:
        with pytest.raises(anthropic.APIConnectionError):
            client.models.list()


def test_the_advertised_fingerprint_is_the_sha256_of_the_served_certificate(relay):
    der = ssl.PEM_cert_to_DER_cert(relay.ca_file.read_text())
    expected = "sha256:" + hashlib.sha256(der).hexdigest()
    # The join code reveals the worker secret: it is for the node's owner (its admin token).
    owner = (relay.data_dir / "admin-token").read_text().strip()
    status, join = http_get_json(f"{relay.url}/api/join-code", ca_file=relay.ca_file, token=owner)
    assert status == 200, join
    assert join["fingerprint"] == expected
    assert join["url"] == relay.url
    assert f"TLS certificate:     {expected}" in relay.stdout.text()
    status, node = http_get_json(f"{relay.url}/api/status", ca_file=relay.ca_file)
    assert status == 200, node
    assert node["node"]["url"] == relay.url
    assert node["node"]["worker"]["state"] == "connected", "the node's own worker joined its TLS proxy pinned"
