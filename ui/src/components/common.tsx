import type { ComponentChildren } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import type { Tone } from '../lib/viewmodel';

export function Badge({ tone, children, testid }: { tone: Tone; children: ComponentChildren; testid?: string }) {
  return (
    <span class={`badge badge-${tone}`} data-testid={testid}>
      {children}
    </span>
  );
}

async function copyText(text: string): Promise<boolean> {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return true;
    }
  } catch {
    /* fall back below */
  }
  // Plain http on a LAN address is not a secure context: use a hidden textarea.
  const area = document.createElement('textarea');
  area.value = text;
  area.setAttribute('readonly', '');
  area.style.position = 'fixed';
  area.style.opacity = '0';
  document.body.appendChild(area);
  area.select();
  let ok = false;
  try {
    ok = document.execCommand('copy');
  } catch {
    ok = false;
  }
  area.remove();
  return ok;
}

/** `label` names the button for assistive tech and tests; it shows "Copy". */
export function CopyButton({ text, label = 'Copy', testid }: { text: string; label?: string; testid?: string }) {
  const [state, setState] = useState<'idle' | 'copied' | 'failed'>('idle');
  const timer = useRef<ReturnType<typeof setTimeout>>();
  useEffect(() => () => clearTimeout(timer.current), []);
  const onClick = async () => {
    const ok = await copyText(text);
    setState(ok ? 'copied' : 'failed');
    clearTimeout(timer.current);
    timer.current = setTimeout(() => setState('idle'), 2000);
  };
  return (
    <button type="button" class="btn btn-small" onClick={onClick} data-testid={testid} aria-label={label}>
      {state === 'copied' ? 'Copied' : state === 'failed' ? 'Select and copy' : 'Copy'}
    </button>
  );
}

/** A block of text to copy: a <pre> with a copy button. */
export function CodeBlock({ text, label, testid }: { text: string; label: string; testid?: string }) {
  return (
    <div class="code-block" data-testid={testid}>
      <pre aria-label={label} tabIndex={0}>
        <code>{text}</code>
      </pre>
      <CopyButton text={text} label={`Copy ${label}`} />
    </div>
  );
}

export function Alert({
  kind,
  children,
  testid,
}: {
  kind: 'error' | 'success' | 'info' | 'warning';
  children: ComponentChildren;
  testid?: string;
}) {
  return (
    <div class={`alert alert-${kind}`} role={kind === 'error' ? 'alert' : 'status'} data-testid={testid}>
      {children}
    </div>
  );
}

export function Spinner({ label }: { label: string }) {
  return (
    <span class="spinner-wrap" role="status">
      <span class="spinner" aria-hidden="true" />
      {label}
    </span>
  );
}

export function Card({
  title,
  actions,
  children,
  testid,
  class: cls,
}: {
  title: ComponentChildren;
  actions?: ComponentChildren;
  children: ComponentChildren;
  testid?: string;
  class?: string;
}) {
  const id = typeof title === 'string' ? `card-${title.toLowerCase().replace(/[^a-z0-9]+/g, '-')}` : undefined;
  return (
    <section class={`card ${cls ?? ''}`} data-testid={testid} aria-labelledby={id}>
      <header class="card-header">
        <h2 id={id}>{title}</h2>
        {actions ? <div class="card-actions">{actions}</div> : null}
      </header>
      {children}
    </section>
  );
}

/**
 * A data table inside a horizontally scrolling wrapper. `columns` are the headings; an empty
 * heading is an actions column, named for screen readers only. `children` are the body rows;
 * `footer` is shown under the table (e.g. "showing 50 of 80").
 */
export function DataTable({
  label,
  columns,
  children,
  footer,
}: {
  label: string;
  columns: string[];
  children: ComponentChildren;
  footer?: ComponentChildren;
}) {
  return (
    <div class="table-wrap">
      <table aria-label={label}>
        <thead>
          <tr>
            {columns.map((column, i) => (
              <th scope="col" key={i}>
                {column || <span class="sr-only">Actions</span>}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>{children}</tbody>
      </table>
      {footer}
    </div>
  );
}

/** A labelled form field; its help line turns into the error when there is one (`${id}-help`). */
export function Field({
  label,
  id,
  error,
  help,
  children,
}: {
  label: string;
  id: string;
  error?: string;
  help?: string;
  children: ComponentChildren;
}) {
  return (
    <div class="field">
      <label for={id}>{label}</label>
      {children}
      {error || help ? (
        <span id={`${id}-help`} class={error ? 'field-error' : 'muted small'}>
          {error ?? help}
        </span>
      ) : null}
    </div>
  );
}
