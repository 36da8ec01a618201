//! Just enough of the GGUF format to read a model's architecture, name and trained context
//! length from its key-value header, without reading the tensors.
//!
//! Layout (little-endian): `"GGUF"`, version `u32`, tensor count, key-value count, then the
//! pairs: key (string), value type (`u32`), value. Counts and string lengths are `u64` from
//! version 2 on, `u32` in version 1. Values we do not want are skipped with seeks, so a
//! 150 000-entry tokenizer array costs a fraction of a second.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// What the header says about a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GgufInfo {
    /// The format version.
    pub version: u32,
    /// `general.architecture`, e.g. `llama`, `qwen2`, `clip` (a projector).
    pub architecture: Option<String>,
    /// `general.name`.
    pub name: Option<String>,
    /// `<architecture>.context_length`: the trained context.
    pub context_length: Option<u64>,
}

/// Sanity bounds: a corrupt header must fail fast, not allocate gigabytes.
const MAX_KEY_LEN: u64 = 64 * 1024;
const MAX_KV: u64 = 1_000_000;
const MAX_KEPT_STRING: u64 = 64 * 1024;
const MAX_NESTING: u32 = 4;

const STRING: u32 = 8;
const ARRAY: u32 = 9;

/// Reads the header of the GGUF file at `path`.
pub fn read_info(path: &Path) -> Result<GgufInfo, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    parse(&mut std::io::BufReader::new(file))
}

/// Reads a GGUF header from `reader`.
pub fn parse<R: Read + Seek>(reader: &mut R) -> Result<GgufInfo, String> {
    let mut magic = [0u8; 4];
    reader
        .read_exact(&mut magic)
        .map_err(|_| "too short for a GGUF file".to_string())?;
    if &magic != b"GGUF" {
        return Err("not a GGUF file (bad magic)".to_string());
    }
    let version = read_u32(reader)?;
    if !(1..=3).contains(&version) {
        if (1..=3).contains(&version.swap_bytes()) {
            return Err("big-endian GGUF files are not supported".to_string());
        }
        return Err(format!("unsupported GGUF version {version}"));
    }
    let mut header = Header { reader, version };
    let _tensors = header.count()?;
    let kv_count = header.count()?;
    if kv_count > MAX_KV {
        return Err(format!("implausible key-value count {kv_count}"));
    }
    let mut info = GgufInfo {
        version,
        ..GgufInfo::default()
    };
    let mut context_lengths: Vec<(String, u64)> = Vec::new();
    for _ in 0..kv_count {
        let key = header.string(MAX_KEY_LEN)?;
        let kind = read_u32(header.reader)?;
        match key.as_str() {
            "general.architecture" if kind == STRING => {
                info.architecture = Some(header.string(MAX_KEPT_STRING)?)
            }
            "general.name" if kind == STRING => info.name = Some(header.string(MAX_KEPT_STRING)?),
            _ if key.ends_with(".context_length") => match header.integer(kind)? {
                Some(value) => context_lengths.push((key, value)),
                None => header.skip_value(kind, 0)?,
            },
            _ => header.skip_value(kind, 0)?,
        }
        let found = info.architecture.as_ref().and_then(|arch| {
            let wanted = format!("{arch}.context_length");
            context_lengths.iter().find(|(k, _)| *k == wanted)
        });
        if let Some((_, value)) = found {
            info.context_length = Some(*value);
            if info.name.is_some() {
                break;
            }
        }
    }
    Ok(info)
}

struct Header<'a, R> {
    reader: &'a mut R,
    version: u32,
}

impl<R: Read + Seek> Header<'_, R> {
    /// A count or string length: `u32` in version 1, `u64` after.
    fn count(&mut self) -> Result<u64, String> {
        if self.version == 1 {
            read_u32(self.reader).map(u64::from)
        } else {
            read_u64(self.reader)
        }
    }

    fn string(&mut self, max: u64) -> Result<String, String> {
        let len = self.count()?;
        if len > max {
            return Err(format!("string of {len} bytes exceeds {max}"));
        }
        let mut bytes = vec![0u8; len as usize];
        self.reader
            .read_exact(&mut bytes)
            .map_err(|_| truncated())?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// An integer value of any integer type; `None` (value not consumed) for other types.
    fn integer(&mut self, kind: u32) -> Result<Option<u64>, String> {
        let value = match kind {
            0 => u64::from(read_array::<1, R>(self.reader)?[0]),
            1 => i8::from_le_bytes(read_array(self.reader)?).max(0) as u64,
            2 => u64::from(u16::from_le_bytes(read_array(self.reader)?)),
            3 => i16::from_le_bytes(read_array(self.reader)?).max(0) as u64,
            4 => u64::from(read_u32(self.reader)?),
            5 => i32::from_le_bytes(read_array(self.reader)?).max(0) as u64,
            10 => read_u64(self.reader)?,
            11 => i64::from_le_bytes(read_array(self.reader)?).max(0) as u64,
            _ => return Ok(None),
        };
        Ok(Some(value))
    }

    fn skip_value(&mut self, kind: u32, depth: u32) -> Result<(), String> {
        if let Some(size) = fixed_size(kind) {
            return self.skip(size);
        }
        match kind {
            STRING => {
                let len = self.count()?;
                self.skip(len)
            }
            ARRAY if depth < MAX_NESTING => {
                let item = read_u32(self.reader)?;
                let count = self.count()?;
                if let Some(size) = fixed_size(item) {
                    let total = size
                        .checked_mul(count)
                        .ok_or_else(|| "array size overflows".to_string())?;
                    return self.skip(total);
                }
                for _ in 0..count {
                    self.skip_value(item, depth + 1)?;
                }
                Ok(())
            }
            _ => Err(format!("unknown value type {kind}")),
        }
    }

    fn skip(&mut self, bytes: u64) -> Result<(), String> {
        let offset = i64::try_from(bytes).map_err(|_| truncated())?;
        self.reader
            .seek(SeekFrom::Current(offset))
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

fn fixed_size(kind: u32) -> Option<u64> {
    match kind {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

fn truncated() -> String {
    "the GGUF header is truncated".to_string()
}

fn read_array<const N: usize, R: Read>(reader: &mut R) -> Result<[u8; N], String> {
    let mut bytes = [0u8; N];
    reader.read_exact(&mut bytes).map_err(|_| truncated())?;
    Ok(bytes)
}

fn read_u32<R: Read>(reader: &mut R) -> Result<u32, String> {
    read_array(reader).map(u32::from_le_bytes)
}

fn read_u64<R: Read>(reader: &mut R) -> Result<u64, String> {
    read_array(reader).map(u64::from_le_bytes)
}

/// Writes small synthetic GGUF headers, for tests here and in `scan`.
#[cfg(test)]
pub(crate) mod testing {
    /// A value to write.
    pub enum Value<'a> {
        U32(u32),
        U64(u64),
        Str(&'a str),
        Strings(&'a [&'a str]),
        F32s(&'a [f32]),
    }

    /// A GGUF file (version 3, or 1 with its narrower counts) with these key-value pairs.
    pub fn gguf(version: u32, pairs: &[(&str, Value)]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(version.to_le_bytes());
        let count = |out: &mut Vec<u8>, n: u64| {
            if version == 1 {
                out.extend((n as u32).to_le_bytes())
            } else {
                out.extend(n.to_le_bytes())
            }
        };
        let string = |out: &mut Vec<u8>, s: &str| {
            count(out, s.len() as u64);
            out.extend(s.as_bytes());
        };
        count(&mut out, 0);
        count(&mut out, pairs.len() as u64);
        for (key, value) in pairs {
            string(&mut out, key);
            match value {
                Value::U32(v) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                Value::U64(v) => {
                    out.extend(10u32.to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                Value::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    string(&mut out, s);
                }
                Value::Strings(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    count(&mut out, items.len() as u64);
                    for item in *items {
                        string(&mut out, item);
                    }
                }
                Value::F32s(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(6u32.to_le_bytes());
                    count(&mut out, items.len() as u64);
                    for item in *items {
                        out.extend(item.to_le_bytes());
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{gguf, Value};
    use super::*;
    use std::io::Cursor;

    #[test]
    fn architecture_name_and_context_are_read_past_arrays_of_any_kind() {
        let tokens: Vec<String> = (0..1000).map(|i| format!("tok{i}")).collect();
        let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let bytes = gguf(
            3,
            &[
                ("general.architecture", Value::Str("qwen2")),
                ("tokenizer.ggml.tokens", Value::Strings(&tokens)),
                ("tokenizer.ggml.scores", Value::F32s(&[0.5; 300])),
                ("llama.context_length", Value::U32(1)),
                ("qwen2.context_length", Value::U32(32768)),
                ("general.name", Value::Str("Qwen2.5 7B Instruct")),
            ],
        );
        let info = parse(&mut Cursor::new(bytes)).unwrap();
        assert_eq!(info.version, 3);
        assert_eq!(info.architecture.as_deref(), Some("qwen2"));
        assert_eq!(info.name.as_deref(), Some("Qwen2.5 7B Instruct"));
        assert_eq!(info.context_length, Some(32768));
    }

    #[test]
    fn version_1_and_context_before_architecture_work() {
        let bytes = gguf(
            1,
            &[
                ("llama.context_length", Value::U64(4096)),
                ("general.architecture", Value::Str("llama")),
            ],
        );
        let info = parse(&mut Cursor::new(bytes)).unwrap();
        assert_eq!(info.context_length, Some(4096));
        assert_eq!(info.name, None);
    }

    #[test]
    fn bad_or_truncated_headers_are_errors_not_panics() {
        assert!(parse(&mut Cursor::new(b"GGML....".to_vec()))
            .unwrap_err()
            .contains("magic"));
        let bytes = gguf(3, &[("general.architecture", Value::Str("llama"))]);
        for cut in [3, 8, 20, bytes.len() - 2] {
            assert!(
                parse(&mut Cursor::new(bytes[..cut].to_vec())).is_err(),
                "{cut}"
            );
        }
        let mut big_endian = b"GGUF".to_vec();
        big_endian.extend(3u32.to_be_bytes());
        assert!(parse(&mut Cursor::new(big_endian))
            .unwrap_err()
            .contains("big-endian"));
        let mut huge_key = gguf(3, &[]);
        huge_key.truncate(16);
        huge_key.extend(1u64.to_le_bytes());
        huge_key.extend(u64::MAX.to_le_bytes());
        assert!(parse(&mut Cursor::new(huge_key))
            .unwrap_err()
            .contains("exceeds"));
    }
}
