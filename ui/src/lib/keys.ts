// The Keys page's logic: the create form (parsing, validation, request body) and how a key is
// shown in the list. Pure functions, unit-tested.

import type { ApiKey, NewApiKey, Status } from '../types';
import { DASH, formatDateTime, formatDuration } from './format';

export interface KeyForm {
  name: string;
  /** Allowed models as typed: comma, space or newline separated; empty allows every model. */
  models: string;
  maxConcurrent: string;
  requestsPerMinute: string;
  /** `interactive` or `batch`, as the select holds it. */
  priority: string;
  /** Turns for each turn of a weight-1 client, as typed; empty is 1. */
  weight: string;
}

export const EMPTY_KEY_FORM: KeyForm = {
  name: '',
  models: '',
  maxConcurrent: '',
  requestsPerMinute: '',
  priority: 'interactive',
  weight: '',
};

/** The largest weight the relay accepts (README, "Priority and fair turns"). */
export const MAX_KEY_WEIGHT = 16;

export type KeyFormErrors = Partial<Record<keyof KeyForm, string>>;

/** Names longer than this are refused here; the list would not show them whole anyway. */
export const MAX_KEY_NAME = 100;

/** The models of a typed list, trimmed and without repeats, in the order typed. */
export function parseModelList(text: string): string[] {
  const seen = new Set<string>();
  for (const part of text.split(/[\s,]+/)) {
    const model = part.trim();
    if (model) seen.add(model);
  }
  return Array.from(seen);
}

/** Add a model to the typed list, or take it out when it is there (the served-model chips). */
export function toggleModel(text: string, model: string): string {
  const list = parseModelList(text);
  const next = list.includes(model) ? list.filter((m) => m !== model) : [...list, model];
  return next.join(', ');
}

/** A limit field: empty is "no limit"; otherwise a whole number from 1 up. */
function parseLimit(text: string, what: string): { value?: number; error?: string } {
  const t = text.trim();
  if (!t) return {};
  if (!/^\d+$/.test(t)) return { error: `${what} must be a whole number (or empty for no limit).` };
  const value = Number(t);
  if (value < 1 || !Number.isSafeInteger(value)) return { error: `${what} must be at least 1 (or empty for no limit).` };
  return { value };
}

/**
 * Check the form and build the POST /api/keys body. The relay checks again (and its 400 message
 * is shown as is); checking here points at the field before a round trip.
 */
export function validateKeyForm(form: KeyForm): { body: NewApiKey | null; errors: KeyFormErrors } {
  const errors: KeyFormErrors = {};
  const name = form.name.trim();
  if (!name) errors.name = 'Give the key a name, e.g. the app or person that will use it.';
  else if (name.length > MAX_KEY_NAME) errors.name = `The name is too long (at most ${MAX_KEY_NAME} characters).`;
  const concurrent = parseLimit(form.maxConcurrent, 'Concurrent requests');
  if (concurrent.error) errors.maxConcurrent = concurrent.error;
  const rpm = parseLimit(form.requestsPerMinute, 'Requests per minute');
  if (rpm.error) errors.requestsPerMinute = rpm.error;
  const weight = parseLimit(form.weight, 'Weight');
  if (weight.error) errors.weight = weight.error.replace('(or empty for no limit)', '(or empty for 1)');
  else if (weight.value !== undefined && weight.value > MAX_KEY_WEIGHT)
    errors.weight = `Weight must be ${MAX_KEY_WEIGHT} at most.`;
  if (Object.keys(errors).length) return { body: null, errors };

  const body: NewApiKey = { name };
  const models = parseModelList(form.models);
  if (models.length) body.models = models;
  if (concurrent.value !== undefined) body.max_concurrent = concurrent.value;
  if (rpm.value !== undefined) body.requests_per_minute = rpm.value;
  // Interactive is the relay's default: only batch needs saying.
  if (form.priority === 'batch') body.priority = 'batch';
  // 1 is the relay's default too.
  if (weight.value !== undefined && weight.value > 1) body.weight = weight.value;
  return { body, errors };
}

export const isRevoked = (key: ApiKey): boolean => key.revoked_at != null;

/** Active keys first, then revoked ones; newest first within each. */
export function sortKeys(keys: ApiKey[]): ApiKey[] {
  return [...keys].sort((a, b) => {
    if (isRevoked(a) !== isRevoked(b)) return isRevoked(a) ? 1 : -1;
    return Date.parse(b.created_at) - Date.parse(a.created_at) || a.name.localeCompare(b.name);
  });
}

/** The limits of a key in a few words: "llama3, qwen · 4 at once · 60/min · batch · weight 3", or "None". */
export function limitsLabel(
  key: Pick<ApiKey, 'models' | 'max_concurrent' | 'requests_per_minute' | 'priority' | 'weight'>,
): string {
  const parts: string[] = [];
  if (key.models && key.models.length) parts.push(key.models.join(', '));
  if (key.max_concurrent != null) parts.push(`${key.max_concurrent} at once`);
  if (key.requests_per_minute != null) parts.push(`${key.requests_per_minute}/min`);
  if (key.priority === 'batch') parts.push('batch');
  if (key.weight != null && key.weight > 1) parts.push(`weight ${key.weight}`);
  return parts.length ? parts.join(' · ') : 'None';
}

/** An RFC 3339 instant as a local date-time ("2026-11-25 13:00:00"), or a dash. */
export function formatInstant(iso: string | null | undefined): string {
  if (!iso) return DASH;
  const ms = Date.parse(iso);
  return Number.isFinite(ms) ? formatDateTime(ms) : iso;
}

/** How long ago an RFC 3339 instant was ("5m 02s ago"), `never` when there is none. */
export function formatAgo(iso: string | null | undefined, nowMs: number, never = 'never'): string {
  if (!iso) return never;
  const ms = Date.parse(iso);
  if (!Number.isFinite(ms)) return iso;
  const diff = nowMs - ms;
  // Clocks of the browser and the relay can differ by a little: "just now", not "-2 s ago".
  if (diff < 5_000) return 'just now';
  return `${formatDuration(diff)} ago`;
}

/**
 * Whether inference needs a client key, as the node block of the status says; null without a
 * status or when the relay does not say (older relays).
 */
export function requiresApiKeys(status: Status | null | undefined): boolean | null {
  const value: unknown = status?.node?.require_api_keys;
  return typeof value === 'boolean' ? value : null;
}

/** The model the snippets of a new key use: one it may use, else one the relay serves. */
export function snippetModel(allowed: string[] | null | undefined, served: string[]): string | null {
  if (allowed && allowed.length) return allowed[0];
  return served[0] ?? null;
}
