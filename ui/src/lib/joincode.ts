// Join codes: one line, "mrj1." + base64url(JSON {"url","secret","provider"}), plus "fingerprint"
// (`sha256:<hex>` of the proxy's TLS certificate) when the proxy serves TLS itself.

import type { JoinDetails } from '../types';

export const JOIN_CODE_PREFIX = 'mrj1.';

function bytesToBase64Url(bytes: Uint8Array): string {
  let bin = '';
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function base64UrlToBytes(text: string): Uint8Array {
  if (!/^[A-Za-z0-9_\-+/]*={0,2}$/.test(text)) throw new Error('not base64url');
  let b64 = text.replace(/=+$/, '').replace(/-/g, '+').replace(/_/g, '/');
  if (b64.length % 4 === 1) throw new Error('bad base64url length');
  while (b64.length % 4 !== 0) b64 += '=';
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** Encode join details as a one-line code. `provider` is included when set. */
export function encodeJoinCode(details: JoinDetails): string {
  const payload: Record<string, string> = { url: details.url, secret: details.secret };
  if (details.provider) payload.provider = details.provider;
  if (details.fingerprint) payload.fingerprint = details.fingerprint;
  const json = JSON.stringify(payload);
  return JOIN_CODE_PREFIX + bytesToBase64Url(new TextEncoder().encode(json));
}

export type DecodeResult = { ok: true; details: JoinDetails } | { ok: false; error: string };

/** Decode a join code pasted by a user (surrounding whitespace and line breaks are ignored). */
export function decodeJoinCode(input: string): DecodeResult {
  const code = input.replace(/\s+/g, '');
  if (!code) return { ok: false, error: 'The join code is empty.' };
  if (!code.startsWith(JOIN_CODE_PREFIX)) {
    return { ok: false, error: `A join code starts with "${JOIN_CODE_PREFIX}".` };
  }
  let parsed: unknown;
  try {
    const bytes = base64UrlToBytes(code.slice(JOIN_CODE_PREFIX.length));
    parsed = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
  } catch {
    return { ok: false, error: 'The join code is damaged: copy it again, all of it.' };
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    return { ok: false, error: 'The join code does not hold join details.' };
  }
  const obj = parsed as Record<string, unknown>;
  if (typeof obj.url !== 'string' || !/^https?:\/\//i.test(obj.url)) {
    return { ok: false, error: 'The join code has no proxy URL.' };
  }
  if (typeof obj.secret !== 'string' || obj.secret === '') {
    return { ok: false, error: 'The join code has no secret.' };
  }
  if (obj.provider != null && typeof obj.provider !== 'string') {
    return { ok: false, error: 'The join code has an invalid provider.' };
  }
  if (obj.fingerprint != null && (typeof obj.fingerprint !== 'string' || !isFingerprint(obj.fingerprint))) {
    return { ok: false, error: 'The join code has a damaged certificate fingerprint: copy it again, all of it.' };
  }
  const details: JoinDetails = { url: obj.url, secret: obj.secret };
  if (typeof obj.provider === 'string' && obj.provider !== '') details.provider = obj.provider;
  if (typeof obj.fingerprint === 'string') details.fingerprint = obj.fingerprint;
  return { ok: true, details };
}

/**
 * True for a certificate fingerprint as the relay prints it or as browsers show it: `sha256:` and
 * 64 hex digits, or colon-separated pairs, any case (the relay checks it again).
 */
export function isFingerprint(text: string): boolean {
  const hex = text.trim().replace(/^sha256:/i, '');
  return /^[0-9a-f]{64}$/i.test(hex) || /^([0-9a-f]{2}:){31}[0-9a-f]{2}$/i.test(hex);
}

/** True when the text looks like a join code rather than a URL. */
export function looksLikeJoinCode(text: string): boolean {
  return text.trim().startsWith(JOIN_CODE_PREFIX);
}
