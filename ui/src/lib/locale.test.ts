import { describe, expect, it } from 'vitest';
import { guardNavigatorLanguage, usableLocale } from './locale';

describe('usableLocale', () => {
  it('keeps valid tags and replaces what Intl rejects', () => {
    expect(usableLocale('de-DE')).toBe('de-DE');
    expect(usableLocale('C')).toBe('en-US');
    expect(usableLocale('')).toBe('en-US');
    expect(usableLocale(undefined)).toBe('en-US');
  });

  it('makes a C-locale navigator safe for Intl', () => {
    const nav = { language: 'C' } as unknown as Navigator;
    expect(() => new Intl.NumberFormat(nav.language)).toThrow(RangeError);
    guardNavigatorLanguage(nav);
    expect(nav.language).toBe('en-US');
    expect(() => new Intl.NumberFormat(nav.language)).not.toThrow();
  });
});
