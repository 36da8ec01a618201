// End-to-end helpers: the real relay binary, a mock OpenAI backend, and headless Chromium.
// Every process started here is killed when the test process exits, even on failure.

import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
export const UI_DIR = path.resolve(here, '..');
export const ARTIFACTS = path.join(here, 'artifacts');
export const RELAY_BIN = process.env.MODELRELAY_BIN
  ? path.resolve(process.env.MODELRELAY_BIN)
  : path.resolve(UI_DIR, '../target/debug/modelrelay');
export const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

const children = new Set();
const tempDirs = new Set();
const cleanups = [];

function killAll() {
  for (const child of children) {
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      try {
        child.kill('SIGKILL');
      } catch {
        /* already gone */
      }
    }
  }
  children.clear();
  for (const dir of tempDirs) {
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch {
      /* ignore */
    }
  }
  tempDirs.clear();
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    killAll();
    process.exit(130);
  });
}

/** Run `fn` at the end of the test (in reverse order), whatever happens. */
export function defer(fn) {
  cleanups.push(fn);
}

/** Run and forget the deferred cleanups; call from `after`/`afterEach`. */
export async function cleanup() {
  while (cleanups.length) {
    const fn = cleanups.pop();
    try {
      await withTimeout(Promise.resolve().then(fn), 15_000, 'cleanup step');
    } catch (e) {
      console.error('cleanup failed:', e);
    }
  }
}

export function tempDir(prefix = 'mr-e2e-') {
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  tempDirs.add(dir);
  return dir;
}

export function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    }),
  ]);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A port nobody listens on right now (127.0.0.1). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Poll `check` until it returns a truthy value or `ms` passes. */
export async function waitFor(check, { ms = 15_000, interval = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + ms;
  let lastError;
  while (Date.now() < deadline) {
    try {
      const v = await check();
      if (v) return v;
    } catch (e) {
      lastError = e;
    }
    await sleep(interval);
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what}${lastError ? `: ${lastError.message}` : ''}`);
}

/**
 * A mock OpenAI-compatible backend: GET /v1/models, POST /v1/chat/completions (JSON, or SSE
 * chunks with `chunkDelayMs` between them when `stream: true`). Every request is kept in
 * `state.seen` ({ body, at, closedEarlyAt }: when its client went away before the end). With
 * `usageWhenAsked`, a stream carries usage only when `stream_options.include_usage` asks, in
 * its own last chunk, as OpenAI and llama-server do; prompt tokens are then the words of the
 * messages, so a test can tell what was counted. `reply(body)` may give the text of a
 * non-streamed answer (the default is a fixed sentence).
 */
// `promptTps`: the backend reports llama-server's `timings` with each streamed answer, as if it
// evaluated prompts (a word a token) at that many tokens a second: what cost routing measures.
export async function startMockBackend({ model = 'mock-model', chunks = 20, chunkDelayMs = 100, usageWhenAsked = false, reply = null, promptTps = null } = {}) {
  const state = { requests: 0, chunkDelayMs, chunks, seen: [] };
  const sockets = new Set();
  const server = createServer(async (req, res) => {
    const url = new URL(req.url, 'http://x');
    if (req.method === 'GET' && url.pathname === '/v1/models') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data: [{ id: model, object: 'model', owned_by: 'mock' }] }));
      return;
    }
    if (req.method === 'POST' && url.pathname === '/v1/chat/completions') {
      let body = '';
      for await (const part of req) body += part;
      state.requests += 1;
      let parsed = {};
      try {
        parsed = JSON.parse(body);
      } catch {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: 'bad json', type: 'invalid_request_error', code: null } }));
        return;
      }
      const id = `chatcmpl-mock-${state.requests}`;
      const created = Math.floor(Date.now() / 1000);
      const seen = { body: parsed, at: Date.now(), closedEarlyAt: null };
      state.seen.push(seen);
      const promptTokens = usageWhenAsked ? wordsOf(parsed.messages) : 5;
      if (parsed.stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
        let closed = false;
        res.on('close', () => {
          if (!res.writableFinished) seen.closedEarlyAt = Date.now();
          closed = true;
        });
        for (let i = 0; i < state.chunks && !closed; i++) {
          const chunk = {
            id,
            object: 'chat.completion.chunk',
            created,
            model: parsed.model ?? model,
            choices: [{ index: 0, delta: i === 0 ? { role: 'assistant', content: 'tok ' } : { content: 'tok ' }, finish_reason: null }],
          };
          res.write(`data: ${JSON.stringify(chunk)}\n\n`);
          await sleep(state.chunkDelayMs);
        }
        if (!closed) {
          const usage = { prompt_tokens: promptTokens, completion_tokens: state.chunks, total_tokens: promptTokens + state.chunks };
          const last = {
            id,
            object: 'chat.completion.chunk',
            created,
            model: parsed.model ?? model,
            choices: [{ index: 0, delta: {}, finish_reason: 'stop' }],
          };
          if (!usageWhenAsked) last.usage = usage;
          if (promptTps) {
            const words = wordsOf(parsed.messages);
            last.timings = { prompt_n: words, prompt_ms: (words * 1000) / promptTps, predicted_n: state.chunks, predicted_ms: state.chunks * state.chunkDelayMs };
          }
          res.write(`data: ${JSON.stringify(last)}\n\n`);
          if (usageWhenAsked && parsed.stream_options?.include_usage) {
            const usageChunk = { id, object: 'chat.completion.chunk', created, model: parsed.model ?? model, choices: [], usage };
            res.write(`data: ${JSON.stringify(usageChunk)}\n\n`);
          }
          res.write('data: [DONE]\n\n');
          res.end();
        }
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          id,
          object: 'chat.completion',
          created,
          model: parsed.model ?? model,
          choices: [{ index: 0, message: { role: 'assistant', content: reply?.(parsed) ?? 'Hello from the mock.' }, finish_reason: 'stop' }],
          usage: { prompt_tokens: promptTokens, completion_tokens: 4, total_tokens: promptTokens + 4 },
        }),
      );
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: 'not found', type: 'invalid_request_error', code: null } }));
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  const port = await freePort();
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', resolve);
  });
  const mock = {
    port,
    url: `http://127.0.0.1:${port}`,
    state,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
  defer(mock.close);
  return mock;
}

/** The words of chat messages' text: the mock's token count. */
function wordsOf(messages = []) {
  let words = 0;
  for (const message of messages) {
    const parts = typeof message.content === 'string' ? [message.content] : (message.content ?? []).map((p) => p.text ?? '');
    for (const text of parts) words += text.split(/\s+/).filter(Boolean).length;
  }
  return words;
}

/**
 * Start the real relay binary. `args` come first (e.g. ['serve'] or ['worker', ...]); the
 * config file and data directory are always temporary. Resolves once /api/status answers
 * (or, for a worker, once the process is running).
 */
export async function startRelay({
  args = [],
  env = {},
  name = 'relay',
  listen,
  config = null,
  waitReady = true,
  adminToken = null,
} = {}) {
  const dataDir = tempDir(`mr-${name}-`);
  const configPath = path.join(dataDir, 'config.toml');
  // An empty file is a first run (the settings API shows an empty `toml`).
  writeFileSync(configPath, config ?? '');
  const port = listen ? Number(listen.split(':').pop()) : await freePort();
  const listenAddr = listen ?? `127.0.0.1:${port}`;
  const isWorker = args[0] === 'worker';
  const fullArgs = [...args, '--config', configPath];
  if (!isWorker) fullArgs.push('--listen', listenAddr);
  const relayEnv = {
    PATH: process.env.PATH,
    HOME: dataDir,
    XDG_CONFIG_HOME: path.join(dataDir, 'xdg-config'),
    XDG_DATA_HOME: path.join(dataDir, 'xdg-data'),
    MODELRELAY_DATA_DIR: dataDir,
    LOG_LEVEL: 'info',
    NO_COLOR: '1',
    ...env,
  };
  const child = spawn(RELAY_BIN, fullArgs, {
    env: relayEnv,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  children.add(child);
  let log = '';
  const onData = (d) => {
    log += d.toString();
    if (log.length > 200_000) log = log.slice(-100_000);
  };
  child.stdout.on('data', onData);
  child.stderr.on('data', onData);
  let exited = null;
  const exitPromise = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      exited = { code, signal };
      children.delete(child);
      resolve(exited);
    });
  });
  const url = `http://127.0.0.1:${port}`;
  const relay = {
    name,
    port,
    url,
    dataDir,
    configPath,
    child,
    log: () => log,
    exited: () => exited,
    async stop() {
      if (exited) return;
      try {
        process.kill(-child.pid, 'SIGTERM');
      } catch {
        /* gone */
      }
      const r = await Promise.race([exitPromise, sleep(5000).then(() => null)]);
      if (!r) {
        try {
          process.kill(-child.pid, 'SIGKILL');
        } catch {
          /* gone */
        }
        await Promise.race([exitPromise, sleep(2000)]);
      }
    },
    /** The admin token: the configured one, else the one the relay stored in its data directory. */
    ownerToken() {
      return adminToken ?? readFileSync(path.join(dataDir, 'admin-token'), 'utf8').trim();
    },
    /** A one-time sign-in link, made the documented way: `modelrelay dashboard --print`. */
    async dashboardLink() {
      const out = await new Promise((resolve, reject) => {
        const run = spawn(RELAY_BIN, ['dashboard', '--print', '--config', configPath], {
          env: relayEnv,
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        let stdout = '';
        let stderr = '';
        run.stdout.on('data', (d) => (stdout += d));
        run.stderr.on('data', (d) => (stderr += d));
        run.on('error', reject);
        run.on('exit', (code) =>
          code === 0 ? resolve(stdout.trim()) : reject(new Error(`modelrelay dashboard exited ${code}: ${stderr}`)),
        );
      });
      if (!out.includes('/login?code=')) throw new Error(`no sign-in link: ${out}`);
      return out;
    },
    /** Open the dashboard in `page` the documented way (signed in), then at `hash` (e.g. '#/keys'). */
    async open(page, hash = '') {
      await page.goto(await relay.dashboardLink());
      // The link lands on `/`, where the app picks its first page (the wizard on a first run);
      // once it has, move within the page as a click on its navigation would.
      if (!hash) return;
      await page.waitForFunction(() => location.hash.startsWith('#/'));
      await page.evaluate((h) => (location.hash = h), hash);
    },
    /** A JSON API route of this relay, as its owner (with the admin token). */
    async api(route, init = {}) {
      const headers = { ...(init.headers ?? {}) };
      if (!isWorker && headers.authorization === undefined) headers.authorization = `Bearer ${relay.ownerToken()}`;
      const res = await fetch(url + route, { ...init, headers, signal: AbortSignal.timeout(10_000) });
      const text = await res.text();
      let body = text;
      try {
        body = JSON.parse(text);
      } catch {
        /* not JSON */
      }
      return { status: res.status, body };
    },
  };
  defer(() => relay.stop());
  if (waitReady && !isWorker) {
    await waitFor(
      async () => {
        if (exited) throw new Error(`${name} exited early (${JSON.stringify(exited)}):\n${log}`);
        const r = await relay.api('/api/status');
        return r.status === 200;
      },
      { ms: 20_000, what: `${name} to answer /api/status` },
    ).catch((e) => {
      throw new Error(`${e.message}\n--- ${name} log ---\n${log}`);
    });
    await checkEmbeddedUi(relay);
  } else {
    await sleep(200);
    if (exited) throw new Error(`${name} exited early (${JSON.stringify(exited)}):\n${log}`);
  }
  return relay;
}

/**
 * The relay embeds ui/dist when it is compiled: testing a binary built before the last
 * `npm run build` would test an old UI. Fail early and say so.
 */
async function checkEmbeddedUi(relay) {
  const distIndex = path.join(UI_DIR, 'dist', 'index.html');
  if (!existsSync(distIndex) || process.env.E2E_ALLOW_STALE_UI) return;
  const res = await fetch(relay.url + '/', { signal: AbortSignal.timeout(5000) });
  const served = await res.text();
  if (served !== readFileSync(distIndex, 'utf8')) {
    throw new Error(
      `${RELAY_BIN} serves a different UI than ui/dist (it embeds the UI when compiled): ` +
        'run `npm run build`, then `cargo build -p relay-core`, then the e2e tests again.',
    );
  }
}

/** Headless Debian Chromium with a fresh profile; closed by `cleanup()`. */
export async function launchBrowser({ extraArgs = [] } = {}) {
  const profile = tempDir('mr-chromium-');
  mkdirSync(profile, { recursive: true });
  const context = await withTimeout(
    chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      timeout: 30_000,
      viewport: { width: 1360, height: 900 },
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--disable-dev-shm-usage',
        ...extraArgs,
      ],
    }),
    40_000,
    'launching Chromium',
  );
  defer(() => context.close());
  context.setDefaultTimeout(15_000);
  context.setDefaultNavigationTimeout(20_000);
  const page = context.pages()[0] ?? (await context.newPage());
  const consoleErrors = [];
  page.on('console', (msg) => {
    if (msg.type() === 'error') consoleErrors.push(msg.text());
  });
  page.on('pageerror', (err) => consoleErrors.push(String(err)));
  return { context, page, consoleErrors };
}

/**
 * Send a chat completion through the relay. Streaming requests resolve when the whole answer
 * has been read; the promise is tracked so cleanup waits for nothing (it aborts instead).
 */
export function chat(relayUrl, { model = 'mock-model', stream = true, timeoutMs = 60_000, apiKey = null, content = 'hi' } = {}) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), timeoutMs);
  defer(() => controller.abort());
  const headers = { 'content-type': 'application/json' };
  // A client API key (the Keys page), sent the way OpenAI clients send theirs.
  if (apiKey) headers.authorization = `Bearer ${apiKey}`;
  return fetch(`${relayUrl}/v1/chat/completions`, {
    method: 'POST',
    headers,
    body: JSON.stringify({ model, stream, messages: [{ role: 'user', content }] }),
    signal: controller.signal,
  })
    .then(async (res) => ({ status: res.status, text: await res.text() }))
    .finally(() => clearTimeout(timer));
}

/** Status of the relay's in-process state via the API. */
export async function status(relay) {
  const r = await relay.api('/api/status');
  if (r.status !== 200) throw new Error(`/api/status answered ${r.status}: ${JSON.stringify(r.body)}`);
  return r.body;
}
