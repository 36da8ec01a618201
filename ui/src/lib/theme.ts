// The page's colours as the stylesheet sets them, for drawings (charts) that cannot use CSS.

/** The value of CSS custom property `name` on the document, or `fallback` when unset. */
export function cssVar(name: string, fallback: string): string {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}
