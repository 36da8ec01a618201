import { describe, expect, it } from 'vitest';
import { decodeJoinCode, encodeJoinCode, isFingerprint, JOIN_CODE_PREFIX, looksLikeJoinCode } from './joincode';

const b64 = (s: string) => btoa(String.fromCharCode(...new TextEncoder().encode(s)));
const b64url = (s: string) => b64(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
const fromB64url = (s: string) =>
  new TextDecoder().decode(Uint8Array.from(atob(s.replace(/-/g, '+').replace(/_/g, '/')), (c) => c.charCodeAt(0)));

describe('join codes', () => {
  it('encodes as mrj1. + unpadded base64url of the JSON', () => {
    const code = encodeJoinCode({ url: 'http://10.0.0.2:8080', secret: 's3cr3t', provider: 'local' });
    expect(code.startsWith(JOIN_CODE_PREFIX)).toBe(true);
    const payload = code.slice(JOIN_CODE_PREFIX.length);
    expect(payload).not.toMatch(/[=+/]/);
    expect(JSON.parse(fromB64url(payload))).toEqual({
      url: 'http://10.0.0.2:8080',
      secret: 's3cr3t',
      provider: 'local',
    });
  });

  it('round-trips, including secrets with characters that need base64url', () => {
    const details = { url: 'https://relay.example:443', secret: '??>>~~ü/+', provider: 'gpu' };
    const r = decodeJoinCode(encodeJoinCode(details));
    expect(r).toEqual({ ok: true, details });
  });

  it('leaves provider out when not set', () => {
    const r = decodeJoinCode(encodeJoinCode({ url: 'http://h:1', secret: 'x' }));
    expect(r).toEqual({ ok: true, details: { url: 'http://h:1', secret: 'x' } });
  });

  it('decodes codes made elsewhere, padded or not, with whitespace around', () => {
    // 67 bytes: standard base64 of it ends in "=" padding.
    const json = '{"url":"http://192.168.1.5:8080","secret":"abc","provider":"local"} ';
    expect(b64(json).endsWith('=')).toBe(true);
    const unpadded = `mrj1.${b64url(json)}`;
    const padded = `mrj1.${b64(json).replace(/\+/g, '-').replace(/\//g, '_')}`;
    for (const code of [unpadded, padded, `  ${unpadded}\n`, unpadded.replace(/(.{20})/g, '$1\n')]) {
      expect(decodeJoinCode(code)).toEqual({
        ok: true,
        details: { url: 'http://192.168.1.5:8080', secret: 'abc', provider: 'local' },
      });
    }
  });

  it('rejects what is not a join code, with a reason', () => {
    const cases: [string, RegExp][] = [
      ['', /empty/],
      ['http://10.0.0.1:8080', /starts with/],
      ['mrj1.!!!!', /damaged/],
      [`mrj1.${b64url('not json')}`, /damaged/],
      [`mrj1.${b64url('[1,2]')}`, /join details/],
      [`mrj1.${b64url('{"secret":"x"}')}`, /proxy URL/],
      [`mrj1.${b64url('{"url":"ftp://x","secret":"x"}')}`, /proxy URL/],
      [`mrj1.${b64url('{"url":"http://x"}')}`, /secret/],
      [`mrj1.${b64url('{"url":"http://x","secret":"s","provider":3}')}`, /provider/],
    ];
    for (const [code, reason] of cases) {
      const r = decodeJoinCode(code);
      expect(r.ok, code).toBe(false);
      if (!r.ok) expect(r.error).toMatch(reason);
    }
  });

  it('carries the certificate fingerprint of a proxy serving TLS, and checks it', () => {
    const fingerprint = `sha256:${'ab'.repeat(32)}`;
    const details = { url: 'https://10.0.0.2:8080', secret: 's', provider: 'local', fingerprint };
    expect(decodeJoinCode(encodeJoinCode(details))).toEqual({ ok: true, details });
    // What the relay makes decodes too (its field order, no provider).
    const relayMade = `mrj1.${b64url(`{"url":"https://h:1","secret":"s","fingerprint":"${fingerprint}"}`)}`;
    expect(decodeJoinCode(relayMade)).toEqual({ ok: true, details: { url: 'https://h:1', secret: 's', fingerprint } });
    const damaged = decodeJoinCode(`mrj1.${b64url('{"url":"https://h:1","secret":"s","fingerprint":"sha256:abc"}')}`);
    expect(damaged.ok).toBe(false);
    if (!damaged.ok) expect(damaged.error).toMatch(/fingerprint/);
  });

  it('recognises fingerprints as the relay prints them and as browsers show them', () => {
    const hex = '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08';
    const colons = hex.toUpperCase().match(/../g)!.join(':');
    for (const text of [`sha256:${hex}`, ` SHA256:${hex.toUpperCase()} `, hex, colons]) {
      expect(isFingerprint(text), text).toBe(true);
    }
    for (const text of ['', 'sha256:', hex.slice(2), `${hex}00`, `sha1:${hex}`, hex.replace('9', 'g')]) {
      expect(isFingerprint(text), text).toBe(false);
    }
  });

  it('tells join codes from URLs', () => {
    expect(looksLikeJoinCode(' mrj1.abc')).toBe(true);
    expect(looksLikeJoinCode('http://x')).toBe(false);
  });
});
