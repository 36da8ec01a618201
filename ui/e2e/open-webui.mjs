// The real Open WebUI (PyPI `open-webui`), started offline against a relay, for the test that
// does what its users do. Its environment is large (about 7 GB with torch), so it lives outside
// the checkout in a cache made once by scripts/real-clients.sh; without it the test is skipped
// and says why.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { defer, freePort, tempDir, waitFor } from './helpers.mjs';

export const OPEN_WEBUI_ENV =
  process.env.OPEN_WEBUI_ENV ?? path.join(os.homedir(), '.cache', 'modelrelay-openwebui', 'venv');
export const OPEN_WEBUI_BIN = path.join(OPEN_WEBUI_ENV, 'bin', 'open-webui');

/** Why the Open WebUI test cannot run here, or null when it can. */
export function openWebUiMissing() {
  if (existsSync(OPEN_WEBUI_BIN)) return null;
  return `no Open WebUI environment at ${OPEN_WEBUI_ENV} (make it once with scripts/real-clients.sh: ~7 GB, ~15 min; CI does)`;
}

/**
 * Open WebUI on a free loopback port, single-user (no sign-up), offline (no model hub, no
 * update check, no telemetry), its only connection the relay's OpenAI endpoint.
 */
export async function startOpenWebUI({ relayUrl, defaultModel }) {
  const dataDir = tempDir('mr-openwebui-');
  const port = await freePort();
  const env = {
    PATH: `${path.join(OPEN_WEBUI_ENV, 'bin')}:${process.env.PATH}`,
    HOME: dataDir,
    DATA_DIR: dataDir,
    WEBUI_SECRET_KEY: 'e2e-open-webui-secret',
    WEBUI_AUTH: 'False',
    OFFLINE_MODE: 'true',
    HF_HUB_OFFLINE: '1',
    TRANSFORMERS_OFFLINE: '1',
    BYPASS_EMBEDDING_AND_RETRIEVAL: 'true',
    RAG_EMBEDDING_MODEL_AUTO_UPDATE: 'false',
    ENABLE_VERSION_UPDATE_CHECK: 'false',
    ANONYMIZED_TELEMETRY: 'false',
    SCARF_NO_ANALYTICS: 'true',
    DO_NOT_TRACK: 'true',
    ENABLE_OLLAMA_API: 'false',
    OPENAI_API_BASE_URL: `${relayUrl}/v1`,
    OPENAI_API_KEY: 'unused',
    DEFAULT_MODELS: defaultModel,
    TASK_MODEL_EXTERNAL: defaultModel,
  };
  const child = spawn(OPEN_WEBUI_BIN, ['serve', '--host', '127.0.0.1', '--port', String(port)], {
    env,
    cwd: dataDir,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  let log = '';
  const onData = (d) => {
    log += d.toString();
    if (log.length > 400_000) log = log.slice(-200_000);
  };
  child.stdout.on('data', onData);
  child.stderr.on('data', onData);
  let exited = null;
  const exit = new Promise((resolve) => child.on('exit', (code, signal) => resolve((exited = { code, signal }))));
  const stop = async () => {
    if (exited) return;
    try {
      process.kill(-child.pid, 'SIGTERM');
    } catch {
      /* gone */
    }
    const done = await Promise.race([exit, new Promise((r) => setTimeout(() => r(null), 10_000))]);
    if (!done) {
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
  };
  defer(stop);
  const url = `http://127.0.0.1:${port}`;
  await waitFor(
    async () => {
      if (exited) throw new Error(`Open WebUI exited early (${JSON.stringify(exited)}):\n${log.slice(-4000)}`);
      const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(2_000) }).catch(() => null);
      return res?.ok === true;
    },
    { ms: 120_000, interval: 500, what: 'Open WebUI to start' },
  );
  return { url, log: () => log, stop };
}
