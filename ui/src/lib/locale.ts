// Some environments report a language that is not a BCP 47 tag: WebKitGTK under a `C` or
// `POSIX` locale (common on servers and minimal Linux desktops) reports "C". Intl then throws
// `RangeError: invalid language tag`, and uPlot builds an Intl.NumberFormat from
// navigator.language when its module loads, which would leave the whole page blank.

/** `tag` if Intl accepts it as a locale, otherwise `fallback`. */
export function usableLocale(tag: string | undefined, fallback = 'en-US'): string {
  if (!tag) return fallback;
  try {
    return Intl.getCanonicalLocales(tag)[0] ?? fallback;
  } catch {
    return fallback;
  }
}

/** Makes `navigator.language` a tag Intl accepts, before anything formats with it. */
export function guardNavigatorLanguage(nav: Navigator | undefined = globalThis.navigator): void {
  if (!nav) return;
  const usable = usableLocale(nav.language);
  if (usable !== nav.language) {
    Object.defineProperty(nav, 'language', { configurable: true, get: () => usable });
  }
}
