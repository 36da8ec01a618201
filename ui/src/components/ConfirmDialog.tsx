import type { ComponentChildren } from 'preact';
import { useEffect, useRef } from 'preact/hooks';

/**
 * Asks before something that cannot be undone (revoking a key). Focus starts on Cancel, so an
 * Enter pressed out of habit does nothing harmful; Escape cancels.
 */
export function ConfirmDialog({
  title,
  children,
  confirmLabel,
  busy = false,
  error,
  onConfirm,
  onCancel,
  testid,
}: {
  title: string;
  children: ComponentChildren;
  confirmLabel: string;
  busy?: boolean;
  error?: string | null;
  onConfirm: () => void;
  onCancel: () => void;
  testid?: string;
}) {
  const cancel = useRef<HTMLButtonElement>(null);
  const box = useRef<HTMLDivElement>(null);
  useEffect(() => {
    const opener = document.activeElement as HTMLElement | null;
    cancel.current?.focus();
    // Back to the button that opened the dialog, so keyboard users keep their place.
    return () => opener?.focus?.();
  }, []);

  const onKeyDown = (e: KeyboardEvent) => {
    if (e.key === 'Escape' && !busy) {
      e.preventDefault();
      onCancel();
      return;
    }
    // Tab stays inside the dialog: the page behind it is inert while it asks.
    if (e.key === 'Tab' && box.current) {
      const focusable = Array.from(box.current.querySelectorAll<HTMLElement>('button:not([disabled]), a[href], [tabindex="0"]'));
      if (!focusable.length) return;
      const first = focusable[0];
      const last = focusable[focusable.length - 1];
      if (e.shiftKey && document.activeElement === first) {
        e.preventDefault();
        last.focus();
      } else if (!e.shiftKey && document.activeElement === last) {
        e.preventDefault();
        first.focus();
      }
    }
  };

  return (
    <div class="overlay" onKeyDown={onKeyDown}>
      <div
        ref={box}
        class="dialog card"
        role="alertdialog"
        aria-modal="true"
        aria-labelledby="confirm-title"
        aria-describedby="confirm-body"
        data-testid={testid}
      >
        <h2 id="confirm-title">{title}</h2>
        <div id="confirm-body">{children}</div>
        {error ? (
          <div class="alert alert-error" role="alert">
            {error}
          </div>
        ) : null}
        <div class="row-end">
          <button ref={cancel} type="button" class="btn" onClick={onCancel} disabled={busy}>
            Cancel
          </button>
          <button type="button" class="btn btn-danger" onClick={onConfirm} disabled={busy}>
            {busy ? 'Working…' : confirmLabel}
          </button>
        </div>
      </div>
    </div>
  );
}
