//! Where the appended squashfs starts: right after this runtime's own ELF file.
//!
//! An AppImage is `runtime ELF ++ squashfs`. The runtime cannot know its own length at compile
//! time (it is patched and concatenated afterwards), but the linker puts the section header table
//! last in the file, so the ELF ends at `e_shoff + e_shnum * e_shentsize`. That is how AppImage
//! runtimes find their payload; `--appimage-offset` prints it and the build script checks that it
//! equals the runtime's file size.

use std::fs::File;
use std::io::Read;

/// Enough of the file for the largest (64-bit) ELF header.
pub const HEADER_LEN: usize = 64;

/// The payload offset from an ELF header (`header` holds the file's first bytes).
pub fn payload_offset(header: &[u8]) -> Result<u64, String> {
    if header.len() < 52 || &header[..4] != b"\x7fELF" {
        return Err("it does not start with an ELF header".into());
    }
    // e_ident[EI_DATA]: the byte order of every field after e_ident.
    let big_endian = match header[5] {
        1 => false,
        2 => true,
        other => return Err(format!("unknown ELF byte order {other}")),
    };
    let field = |at: usize, len: usize| -> Result<u64, String> {
        let bytes = header
            .get(at..at + len)
            .ok_or("the ELF header is cut short")?;
        let mut value = 0u64;
        for i in 0..len {
            let byte = if big_endian {
                bytes[i]
            } else {
                bytes[len - 1 - i]
            };
            value = value << 8 | u64::from(byte);
        }
        Ok(value)
    };
    // e_ident[EI_CLASS]: the field offsets differ between 32- and 64-bit files.
    let (shoff, shentsize, shnum) = match header[4] {
        1 => (field(0x20, 4)?, field(0x2E, 2)?, field(0x30, 2)?),
        2 => (field(0x28, 8)?, field(0x3A, 2)?, field(0x3C, 2)?),
        other => return Err(format!("unknown ELF class {other}")),
    };
    if shoff == 0 || shnum == 0 {
        // No section header table: nothing marks where the ELF ends.
        return Err("the ELF file has no section header table".into());
    }
    shoff
        .checked_add(shnum * shentsize)
        .ok_or_else(|| "the ELF section header table lies past any file size".into())
}

/// The payload offset of an open file, read from its start.
pub fn payload_offset_of(file: &File) -> Result<u64, String> {
    let mut header = Vec::with_capacity(HEADER_LEN);
    file.take(HEADER_LEN as u64)
        .read_to_end(&mut header)
        .map_err(|e| format!("cannot read the ELF header: {e}"))?;
    payload_offset(&header)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header with only the fields `payload_offset` reads filled in.
    fn header(class: u8, big_endian: bool, shoff: u64, shentsize: u16, shnum: u16) -> Vec<u8> {
        let mut h = vec![0u8; HEADER_LEN];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = class;
        h[5] = if big_endian { 2 } else { 1 };
        h[8..11].copy_from_slice(b"AI\x02"); // the AppImage magic lives in the padding
        let mut put = |at: usize, len: usize, value: u64| {
            let bytes = value.to_be_bytes();
            let bytes = &bytes[8 - len..];
            for i in 0..len {
                h[at + i] = if big_endian {
                    bytes[i]
                } else {
                    bytes[len - 1 - i]
                };
            }
        };
        if class == 2 {
            put(0x28, 8, shoff);
            put(0x3A, 2, shentsize.into());
            put(0x3C, 2, shnum.into());
        } else {
            put(0x20, 4, shoff);
            put(0x2E, 2, shentsize.into());
            put(0x30, 2, shnum.into());
        }
        h
    }

    #[test]
    fn offset_is_the_end_of_the_section_header_table() {
        assert_eq!(
            payload_offset(&header(2, false, 0x1_0000, 64, 29)),
            Ok(0x1_0000 + 29 * 64)
        );
        assert_eq!(
            payload_offset(&header(1, false, 0x8000, 40, 12)),
            Ok(0x8000 + 12 * 40)
        );
        assert_eq!(
            payload_offset(&header(2, true, 0x12_3456, 64, 3)),
            Ok(0x12_3456 + 3 * 64)
        );
        assert_eq!(
            payload_offset(&header(1, true, 0x400, 40, 7)),
            Ok(0x400 + 7 * 40)
        );
    }

    #[test]
    fn not_an_elf_file_is_an_error() {
        assert!(
            payload_offset(b"hsqs and then some more bytes than an ELF header has..........")
                .unwrap_err()
                .contains("ELF header")
        );
        assert!(payload_offset(&header(2, false, 0x1000, 64, 3)[..20]).is_err());
        let mut bad_class = header(2, false, 0x1000, 64, 3);
        bad_class[4] = 9;
        assert!(payload_offset(&bad_class).unwrap_err().contains("class"));
        assert!(payload_offset(&header(2, false, 0, 64, 0))
            .unwrap_err()
            .contains("no section header table"));
        assert!(payload_offset(&header(2, false, u64::MAX - 10, 64, 3)).is_err());
    }

    /// The assumption the format rests on, checked on real linker output: this test binary's
    /// section header table is the last thing in it, so the offset is exactly its size.
    #[test]
    fn a_real_binary_ends_where_its_section_headers_end() {
        let exe = std::env::current_exe().unwrap();
        let file = File::open(&exe).unwrap();
        let size = file.metadata().unwrap().len();
        assert_eq!(payload_offset_of(&file), Ok(size), "{}", exe.display());
    }
}
