/** A choice among the served models. */
export function ModelSelect({
  label,
  value,
  models,
  onChange,
  testid,
}: {
  label: string;
  value: string;
  models: string[];
  onChange: (model: string) => void;
  testid?: string;
}) {
  return (
    <label class="field field-inline">
      <span>{label}</span>
      <select value={value} onChange={(e) => onChange((e.target as HTMLSelectElement).value)} data-testid={testid}>
        {models.map((m) => (
          <option key={m} value={m}>
            {m}
          </option>
        ))}
      </select>
    </label>
  );
}
