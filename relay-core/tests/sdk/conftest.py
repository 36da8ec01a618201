"""Fixtures: the mock backend and a real `modelrelay` process (proxy + in-process worker) in front
of it. Nothing is built here: the binary comes from `MODELRELAY_BIN`, by default
`<repo>/target/debug/modelrelay` (run `cargo build` first). Every wait is bounded.

The shared `relay` runs twice: over plain http, and over https with `--tls self-signed`, which
the clients trust through the generated certificate file (`verify=`), never by turning
verification off.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mock_backend import CHAT_MODEL, EMBED_MODEL, MockBackend  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_BIN = REPO_ROOT / "target" / "debug" / "modelrelay"

#: Bound on the relay printing its URL.
STARTUP_TIMEOUT = 15.0
#: Bound on the in-process worker registering the backend's models.
READY_TIMEOUT = 15.0
#: Bound on a clean exit after SIGTERM.
SHUTDOWN_TIMEOUT = 10.0

#: Every environment variable `modelrelay` reads (see `modelrelay --help`).
RELAY_ENV = {
    "LISTEN_ADDR", "WORKER_SECRET", "PROVIDER_NAME", "MAX_QUEUE_LEN", "QUEUE_TIMEOUT_SECS",
    "REQUEST_TIMEOUT_SECS", "MAX_BODY_BYTES", "HEARTBEAT_INTERVAL_SECS", "HEARTBEAT_TIMEOUT_SECS",
    "DRAIN_TIMEOUT_SECS", "LOG_LEVEL", "PROXY_URL", "WORKER_NAME", "BACKEND_URL", "MODELS",
    "MAX_CONCURRENCY", "PROTOCOL_VERSION", "WORKER_DRAIN_TIMEOUT_SECS", "TLS_CERT", "TLS_KEY",
    "PROXY_FINGERPRINT", "FORWARD_CLIENT_AUTH", "WORKER_SECRET_FILE", "MAX_CONNECTIONS",
    "PROXY_SILENCE_TIMEOUT_SECS",
    # A developer's DATABASE_URL (set for some other program) would make the relay under test
    # keep its keys and usage in that PostgreSQL server instead of its temporary data directory.
    "DATABASE_URL",
}

URL_PATTERN = re.compile(r"ModelRelay is serving at (https?://\S+)")


def http_get_json(
    url: str, timeout: float = 5.0, ca_file: Path | None = None, token: str | None = None
) -> tuple[int, dict]:
    """GET `url` without any proxy, trusting `ca_file` for https, with the admin `token` when
    given; returns (status, parsed JSON body)."""
    handlers: list = [urllib.request.ProxyHandler({})]
    if ca_file is not None:
        handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(ca_file))))
    opener = urllib.request.build_opener(*handlers)
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


class _Pump(threading.Thread):
    """Reads one pipe line by line into a list so the child never blocks on a full pipe."""

    def __init__(self, pipe, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.pipe = pipe
        self.lines: list[str] = []
        self.changed = threading.Condition()

    def run(self) -> None:
        for raw in iter(self.pipe.readline, b""):
            with self.changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def text(self) -> str:
        with self.changed:
            return "\n".join(self.lines)

    def wait_for(self, pattern: re.Pattern, timeout: float) -> re.Match | None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.lines:
                    match = pattern.search(line)
                    if match:
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or not self.is_alive():
                    return None
                self.changed.wait(min(left, 0.2))


class Relay:
    """A running `modelrelay` child process."""

    def __init__(self, process: subprocess.Popen, data_dir: Path) -> None:
        self.process = process
        self.data_dir = data_dir
        self.stdout = _Pump(process.stdout, "relay-stdout")
        self.stderr = _Pump(process.stderr, "relay-stderr")
        self.stdout.start()
        self.stderr.start()
        self.url = ""
        #: The certificate to trust when the relay serves https (`--tls self-signed`).
        self.ca_file: Path | None = None

    def http_client(self, sdk):
        """For `sdk` (the `openai` or `anthropic` module): its default HTTP client, trusting this
        relay's certificate, for `http_client=`; None over plain http (the SDK's own default)."""
        if self.ca_file is None:
            return None
        return sdk.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(self.ca_file)))

    def curl_args(self) -> list[str]:
        """curl options that trust this relay's certificate (none over plain http)."""
        return [] if self.ca_file is None else ["--cacert", str(self.ca_file)]

    def output(self) -> str:
        return f"--- stdout ---\n{self.stdout.text()}\n--- stderr ---\n{self.stderr.text()}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)

    def kill_if_running_after(self, check) -> None:
        """Runs `check(self)`; whatever happens, no process outlives it."""
        try:
            check(self)
        finally:
            self.kill()

    def terminate_and_wait(self) -> int | None:
        """SIGTERM, then the exit code within SHUTDOWN_TIMEOUT (None if it had to be killed)."""
        if self.process.poll() is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=SHUTDOWN_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


def relay_binary() -> Path:
    binary = Path(os.environ.get("MODELRELAY_BIN", DEFAULT_BIN))
    if not binary.is_file():
        pytest.fail(f"modelrelay binary not found at {binary}: run `cargo build` or set MODELRELAY_BIN", pytrace=False)
    return binary


@pytest.fixture(scope="session")
def backend():
    server = MockBackend(chunk_delay=0.005).start()
    try:
        yield server
    finally:
        server.stop()


def start_relay(
    backend: MockBackend,
    data_dir: Path,
    config_text: str | None = None,
    tls: bool = False,
    extra_env: dict[str, str] | None = None,
    ready=None,
) -> Relay:
    """Starts `modelrelay --listen 127.0.0.1:0` (proxy + in-process worker) in front of `backend`
    and waits until it lists the backend's models. `config_text` becomes its config file; `tls`
    serves https with a self-signed certificate (generated into `data_dir/tls/cert.pem`);
    `extra_env` sets more of its environment variables; `ready(relay)`, when given, replaces the
    wait on `/v1/models` (which a relay requiring API keys refuses before any key exists)."""
    # Settings from the developer's shell must not leak into the run under test.
    env = {key: value for key, value in os.environ.items() if key not in RELAY_ENV and not key.startswith("MODELRELAY_")}
    env.update(
        {
            "BACKEND_URL": backend.url,
            "MODELRELAY_DATA_DIR": str(data_dir),
            # The default config file lives under XDG_CONFIG_HOME: point it at a directory with
            # none, so the developer's ~/.config/modelrelay/config.toml is not read.
            "XDG_CONFIG_HOME": str(data_dir / "xdg-config"),
            "LOG_LEVEL": "info",
            "NO_COLOR": "1",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
    )
    env.update(extra_env or {})
    args = [str(relay_binary()), "--listen", "127.0.0.1:0"]
    if tls:
        args += ["--tls", "self-signed"]
    if config_text is not None:
        config_file = data_dir / "config.toml"
        config_file.write_text(config_text)
        args += ["--config", str(config_file)]
    process = subprocess.Popen(
        args,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    relay = Relay(process, data_dir)
    try:
        match = relay.stdout.wait_for(URL_PATTERN, STARTUP_TIMEOUT)
        if match is None:
            pytest.fail(f"modelrelay printed no URL within {STARTUP_TIMEOUT}s\n{relay.output()}", pytrace=False)
        relay.url = match.group(1).rstrip("/")
        if tls:
            assert relay.url.startswith("https://"), relay.url
            relay.ca_file = data_dir / "tls" / "cert.pem"
        if ready is None:
            wait_for_models(relay, {CHAT_MODEL, EMBED_MODEL})
        else:
            ready(relay)
    except BaseException:
        relay.kill()
        raise
    return relay


def assert_clean_exit(relay: Relay) -> None:
    """SIGTERM must drain and exit 0 within SHUTDOWN_TIMEOUT (the process is killed otherwise)."""
    code = relay.terminate_and_wait()
    assert code == 0, f"modelrelay did not exit 0 within {SHUTDOWN_TIMEOUT}s of SIGTERM (got {code})\n{relay.output()}"


@pytest.fixture(scope="session", params=["http", "https"])
def relay(request, backend, tmp_path_factory):
    """The relay shared by the SDK and curl tests, once over http and once over https."""
    tls = request.param == "https"
    # A model no worker serves waits this long for one before its 504 (the tests ask for one).
    relay = start_relay(
        backend,
        tmp_path_factory.mktemp(f"modelrelay-data-{request.param}"),
        tls=tls,
        extra_env={"QUEUE_TIMEOUT_SECS": "2"},
    )
    try:
        yield relay
    finally:
        relay.kill_if_running_after(assert_clean_exit)


@pytest.fixture
def own_relay(backend, tmp_path):
    """A relay of the test's own, for tests that stop it; killed at teardown if still running."""
    data_dir = tmp_path / "modelrelay-data"
    data_dir.mkdir()
    relay = start_relay(backend, data_dir)
    try:
        yield relay
    finally:
        relay.kill()


def wait_for_models(relay: Relay, wanted: set[str]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    listed: set[str] = set()
    while time.monotonic() < deadline:
        if relay.process.poll() is not None:
            pytest.fail(f"modelrelay exited with {relay.process.returncode}\n{relay.output()}", pytrace=False)
        try:
            status, body = http_get_json(f"{relay.url}/v1/models", timeout=2, ca_file=relay.ca_file)
            if status == 200:
                listed = {m["id"] for m in body.get("data", [])}
                if wanted <= listed:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    pytest.fail(
        f"the relay did not list {sorted(wanted)} within {READY_TIMEOUT}s (listed {sorted(listed)})\n{relay.output()}",
        pytrace=False,
    )


def seen_reader(backend: MockBackend):
    """Clears `backend`'s request log and returns a function reading it through `GET /_seen`."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    opener.open(urllib.request.Request(f"{backend.url}/_seen", method="DELETE"), timeout=5).read()

    def read() -> list[dict]:
        status, body = http_get_json(f"{backend.url}/_seen")
        assert status == 200
        return body

    return read


@pytest.fixture
def seen(backend):
    """The backend's request log, cleared for this test."""
    return seen_reader(backend)


#: The relay in front of the chat-only backend maps Claude model names to the mock's model, as
#: a Claude Code user would configure it.
TRANSLATING_RELAY_CONFIG = f'''[proxy.aliases]
"claude-*" = "{CHAT_MODEL}"
'''


@pytest.fixture(scope="session")
def chat_backend():
    """A backend that speaks only chat completions: the relay translates for it."""
    server = MockBackend(chunk_delay=0.005, chat_only=True).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def chat_relay(chat_backend, tmp_path_factory):
    """A relay in front of the chat-only backend, with `claude-*` aliased to the mock model."""
    relay = start_relay(chat_backend, tmp_path_factory.mktemp("modelrelay-chat-only"), TRANSLATING_RELAY_CONFIG)
    try:
        yield relay
    finally:
        relay.kill_if_running_after(assert_clean_exit)


@pytest.fixture
def chat_seen(chat_backend):
    """The chat-only backend's request log, cleared for this test."""
    return seen_reader(chat_backend)


#: The admin token of the relays that require client API keys (`MODELRELAY_ADMIN_TOKEN`):
#: `/admin/*` answers only to a configured token, never to the one a relay generates itself.
ADMIN_TOKEN = "sdk-suite-admin-token-0123456789"

#: The environment of a relay that requires client API keys and publishes `/admin`.
KEYED_RELAY_ENV = {"MODELRELAY_REQUIRE_API_KEYS": "true", "MODELRELAY_ADMIN_TOKEN": ADMIN_TOKEN}


def admin_call(
    relay: Relay,
    method: str,
    path: str,
    body: dict | None = None,
    token: str | None = ADMIN_TOKEN,
    timeout: float = 5.0,
) -> tuple[int, object, dict[str, str]]:
    """`method path` on `relay` with `token` as `Authorization: Bearer` (none when None) and
    `body` as JSON; returns (status, the parsed JSON body or the text, lower-cased headers)."""
    handlers: list = [urllib.request.ProxyHandler({})]
    if relay.ca_file is not None:
        handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(relay.ca_file))))
    opener = urllib.request.build_opener(*handlers)
    request = urllib.request.Request(f"{relay.url}{path}", method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        request.add_header("Content-Type", "application/json")
    try:
        with opener.open(request, data=data, timeout=timeout) as response:
            status, raw, headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        status, raw, headers = error.code, error.read(), error.headers
    text = raw.decode(errors="replace")
    try:
        parsed: object = json.loads(text)
    except ValueError:
        parsed = text
    return status, parsed, {k.lower(): v for k, v in headers.items()}


def wait_for_worker_models(relay: Relay, wanted: set[str] = frozenset({CHAT_MODEL, EMBED_MODEL})) -> None:
    """Waits until `GET /admin/workers` shows a worker serving `wanted`: the readiness check of a
    relay that refuses `/v1/models` without a key."""
    deadline = time.monotonic() + READY_TIMEOUT
    served: set[str] = set()
    while time.monotonic() < deadline:
        if relay.process.poll() is not None:
            pytest.fail(f"modelrelay exited with {relay.process.returncode}\n{relay.output()}", pytrace=False)
        try:
            status, body, _ = admin_call(relay, "GET", "/admin/workers", timeout=2)
            if status == 200:
                served = {m for w in body["workers"] for m in w.get("models", [])}
                if wanted <= served:
                    return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.1)
    pytest.fail(
        f"no worker served {sorted(wanted)} within {READY_TIMEOUT}s (served {sorted(served)})\n{relay.output()}",
        pytrace=False,
    )


def start_keyed_relay(backend: MockBackend, data_dir: Path) -> Relay:
    """A relay that requires client API keys (`MODELRELAY_REQUIRE_API_KEYS`) and publishes
    `/admin` behind `ADMIN_TOKEN`, keeping its keys and usage in `data_dir/modelrelay.db`."""
    return start_relay(backend, data_dir, extra_env=KEYED_RELAY_ENV, ready=wait_for_worker_models)


@pytest.fixture(scope="module")
def keyed_relay(backend, tmp_path_factory):
    """A relay requiring API keys, shared by a module's tests (each makes keys of its own)."""
    relay = start_keyed_relay(backend, tmp_path_factory.mktemp("modelrelay-keyed"))
    try:
        yield relay
    finally:
        relay.kill_if_running_after(assert_clean_exit)


@pytest.fixture
def own_keyed_relay(backend, tmp_path):
    """A keyed relay of the test's own, for tests that stop it or exhaust a per-address limit;
    killed at teardown if still running."""
    data_dir = tmp_path / "modelrelay-keyed"
    data_dir.mkdir()
    relay = start_keyed_relay(backend, data_dir)
    try:
        yield relay
    finally:
        relay.kill()


def create_key(relay: Relay, **fields) -> dict:
    """`POST /admin/keys` with `fields` (name defaults to the calling test's); the 201 answer,
    which carries the secret `key`."""
    fields.setdefault("name", os.environ.get("PYTEST_CURRENT_TEST", "sdk").split(" ")[0][-100:])
    status, made, _ = admin_call(relay, "POST", "/admin/keys", fields)
    assert status == 201, made
    assert isinstance(made, dict) and made["key"].startswith("mr-"), made
    return made
