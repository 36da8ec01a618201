import { useEffect, useRef } from 'preact/hooks';

/** The admin token's input, focused when it appears (both token dialogs use it). */
export function TokenField({ value, onChange }: { value: string; onChange: (value: string) => void }) {
  const input = useRef<HTMLInputElement>(null);
  useEffect(() => input.current?.focus(), []);
  return (
    <label class="field">
      <span>Admin token</span>
      <input
        ref={input}
        type="password"
        autocomplete="current-password"
        value={value}
        onInput={(e) => onChange((e.target as HTMLInputElement).value)}
      />
    </label>
  );
}
