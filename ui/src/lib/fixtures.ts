// A Status as the contract shows it, for unit tests.
import type { Status } from '../types';

const NO_HISTORY = { unix_ms: [], cpu_percent: [], memory_percent: [], vram_percent: [] };

export function sampleStatus(over: Partial<Status> = {}): Status {
  return {
    node: {
      version: '0.1.0',
      url: 'http://127.0.0.1:8080',
      listen: '127.0.0.1:8080',
      roles: { proxy: true, worker: true },
      worker: { state: 'connected', proxy_url: 'http://127.0.0.1:8080', name: 'gpu-box', last_error: null },
      admin_token_required: false,
      require_api_keys: false,
      uptime_secs: 125,
      claude_code: { model: 'qwen2.5-7b', small_model: 'qwen2.5-7b' },
      lifecycle: [],
    },
    workers: [
      {
        id: 'w-2',
        provider: 'local',
        name: 'zeta',
        host: '10.0.0.9',
        models: ['llama3'],
        load: 0,
        max_concurrent: 2,
        state: 'idle',
        connected_unix_ms: 1_763_740_000_000,
        heartbeat_ms: null,
        hardware: null,
        hardware_history: NO_HISTORY,
        model_states: null,
        context_windows: {},
        speeds: {},
      },
      {
        id: 'w-1',
        provider: 'local',
        name: 'gpu-box',
        host: '127.0.0.1',
        models: ['qwen2.5-7b'],
        load: 1,
        max_concurrent: 4,
        state: 'busy',
        connected_unix_ms: 1_763_740_000_000,
        heartbeat_ms: 0.8,
        hardware: null,
        hardware_history: NO_HISTORY,
        model_states: null,
        context_windows: {},
        speeds: { 'qwen2.5-7b': { prompt_tps: 2048.4, generation_tps: 45.25, sides_first: false } },
      },
    ],
    models: [
      { name: 'qwen2.5-7b', provider: 'local', workers: ['w-1'] },
      { name: 'llama3', provider: 'local', workers: ['w-2'] },
      { name: 'gone', provider: 'local', workers: [] },
    ],
    queues: [{ provider: 'local', depth: 2 }],
    in_flight: [
      {
        id: 'r-17',
        model: 'qwen2.5-7b',
        provider: 'local',
        worker: 'w-1',
        state: 'running',
        streaming: true,
        age_ms: 1234,
        ttft_ms: 45,
        tokens: 120,
        tokens_per_sec: 97.2,
        reason: 'cache_hit',
        weighed: null,
      },
      {
        id: 'r-18',
        model: 'qwen2.5-7b',
        provider: 'local',
        worker: null,
        state: 'queued',
        streaming: false,
        age_ms: 5000,
        ttft_ms: null,
        tokens: 0,
        tokens_per_sec: null,
        reason: null,
        weighed: null,
      },
    ],
    totals: { requests: 10, errors: 1, tokens: 1234 },
    series: {
      interval_secs: 1,
      unix_secs: [1_763_740_000, 1_763_740_001, 1_763_740_002],
      requests_per_sec: [0, 2, 1],
      tokens_per_sec: [0, 180, 90],
      errors_per_sec: [0, 0, 1],
      queue_depth: [0, 1],
    },
    sleepers: [],
    affinity: { enabled: true, hits: 0, misses: 0, new: 0, entries: 0 },
    // Every reason, none counted yet (as a proxy that has placed nothing lists them).
    placements: {
      cost_routing: false,
      by_reason: (
        ['cache_hit', 'home_busy', 'new_conversation', 'least_loaded', 'faster_box', 'waking', 'side_request'] as const
      ).map((reason) => ({ reason, count: 0 })),
    },
    storage: { writable: true, problem: null, since_unix_ms: null, usage_records_not_stored: 0, writes_failed: 0 },
    ...over,
  };
}
