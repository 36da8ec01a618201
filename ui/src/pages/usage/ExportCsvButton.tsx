import { useState } from 'preact/hooks';
import { api, errorMessage } from '../../api';

/**
 * Downloads the usage CSV with the page's filters. The file is fetched like the rest of the API
 * (a plain link could not carry the admin token), then saved through a temporary object URL.
 */
export function ExportCsvButton({ query, fileName, disabled }: { query: string; fileName: string; disabled?: boolean }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  const download = async () => {
    setBusy(true);
    setError(null);
    try {
      const blob = await api.usageCsv(query);
      const url = URL.createObjectURL(blob);
      const a = document.createElement('a');
      a.href = url;
      a.download = fileName;
      document.body.appendChild(a);
      a.click();
      a.remove();
      // Revoked a little later: some browsers start reading the URL after click() returns.
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (e) {
      setError(`Could not export: ${errorMessage(e)}`);
    } finally {
      setBusy(false);
    }
  };

  return (
    <span class="export-csv">
      <button type="button" class="btn" onClick={download} disabled={busy || disabled} data-testid="usage-export-csv">
        {busy ? 'Exporting…' : 'Export CSV'}
      </button>
      {error ? (
        <span class="field-error" role="alert" data-testid="usage-export-error">
          {error}
        </span>
      ) : null}
    </span>
  );
}
