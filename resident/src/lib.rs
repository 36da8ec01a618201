//! Letting go of the code that only start-up ran.
//!
//! Most of an idle relay's resident memory is not data but its own code: start-up (argument
//! parsing, the config file, opening the store and its migrations, TLS set-up, the router) runs
//! code from all over the binary once, and Linux maps code in 64 KB windows around each page
//! touched ("fault-around"), so an idle proxy kept ~8 MB of the binary's 10 MB of code mapped
//! for its whole life, of which it then runs a small part (BENCHMARKS.md, "idle footprint").
//!
//! Once a process has started, [`release_start_up_code`] drops its mapping of the executable's
//! read-only segments that hold nothing but the file's own bytes (code, read-only data). The
//! pages stay in the page cache: nothing is freed in `free`'s sense, and code that runs again
//! maps back on first use from memory, with no disk read. What changes is what the process
//! holds: its resident set becomes the data it keeps and the code it still runs.
//!
//! Only mappings that cannot differ from the file are touched: not writable, and no private
//! (copy-on-write) page — `Anonymous: 0 kB` in `/proc/self/smaps`. The relocated read-only data
//! (`.data.rel.ro`, written by the dynamic loader before it was made read-only) has such pages
//! and is left alone; dropping it would bring back the unrelocated bytes. Only the executable's
//! own mappings are considered by [`release_start_up_code`]: they live as long as the process.
//!
//! [`release_loaded_code`] (the dashboard window's process, which runs far more library code to
//! open its window than to keep it open, and WebKit's processes through the `webkit-trim`
//! library) also drops loaded shared libraries' read-only mappings.
//! A library can be unloaded, and something else mapped at its address, between reading the list
//! and dropping: so each library is first pinned (`dlopen` with `RTLD_NOLOAD | RTLD_NODELETE`,
//! which finds an already loaded object and marks it never to be unloaded), the list is read
//! again, and only pinned libraries' mappings are dropped.

/// What [`release_start_up_code`] let go of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    /// Mappings dropped.
    pub mappings: usize,
    /// Their resident bytes at the time.
    pub bytes: u64,
}

/// Drops this process's mappings of its executable's read-only, never-written segments (see the
/// module). Does nothing where there is no `/proc` (not Linux).
pub fn release_start_up_code() -> Released {
    #[cfg(target_os = "linux")]
    {
        let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
            return Released::default();
        };
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return Released::default();
        };
        let exe = exe.to_string_lossy();
        drop_mappings(droppable(&smaps, |path| path == exe))
    }
    #[cfg(not(target_os = "linux"))]
    {
        Released::default()
    }
}

/// Drops this process's mappings of its executable's and its loaded shared libraries'
/// read-only, never-written segments (see the module): what a process keeps mapped after
/// start-up is then what it runs again. Does nothing where there is no `/proc` (not Linux).
pub fn release_loaded_code() -> Released {
    #[cfg(target_os = "linux")]
    {
        let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
            return Released::default();
        };
        let exe = exe.to_string_lossy();
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return Released::default();
        };
        let mut candidates: Vec<&str> = droppable_paths(&smaps)
            .into_iter()
            .filter(|path| *path != exe && looks_like_a_shared_library(path))
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        let pinned: Vec<&str> = candidates.into_iter().filter(|path| pin(path)).collect();
        // Read again: only now are the pinned libraries' mappings known to stay theirs.
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return Released::default();
        };
        drop_mappings(droppable(&smaps, |path| {
            path == exe || pinned.binary_search(&path).is_ok()
        }))
    }
    #[cfg(not(target_os = "linux"))]
    {
        Released::default()
    }
}

/// Whether a mapped file's name is a shared object's (`libx.so`, `libx.so.1.2`): only those
/// are offered to `dlopen`, which would otherwise open fonts and caches to read their headers.
fn looks_like_a_shared_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".so") || name.contains(".so.")
}

/// Marks the already loaded shared object at `path` never to be unloaded; false when `path` is
/// not a loaded object. Loads nothing new (`RTLD_NOLOAD`).
#[cfg(target_os = "linux")]
fn pin(path: &str) -> bool {
    let Ok(name) = std::ffi::CString::new(path) else {
        return false;
    };
    // SAFETY: `name` is a valid C string; with RTLD_NOLOAD dlopen only looks the object up among
    // those loaded (no constructor runs) and, found, adds RTLD_NODELETE to it. The handle is
    // closed again at once: the object's reference count is unchanged, and NODELETE stays.
    unsafe {
        let handle = libc::dlopen(
            name.as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        );
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
    }
    true
}

/// `madvise(MADV_DONTNEED)` on each mapping; what was dropped.
#[cfg(target_os = "linux")]
fn drop_mappings(mappings: Vec<Mapping>) -> Released {
    let mut released = Released::default();
    for mapping in mappings {
        // SAFETY: the range is a whole mapping of this process that is read-only and holds no
        // private page (checked from smaps just now), of the executable or of a library that can
        // no longer be unloaded: MADV_DONTNEED only removes its page table entries, and the next
        // access maps the same file bytes back. No Rust object lives there (it is code and
        // constants).
        let dropped = unsafe {
            libc::madvise(
                mapping.start as *mut libc::c_void,
                mapping.end - mapping.start,
                libc::MADV_DONTNEED,
            )
        };
        if dropped == 0 {
            released.mappings += 1;
            released.bytes += mapping.resident;
        }
    }
    released
}

/// A mapping [`droppable`] chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub start: usize,
    pub end: usize,
    /// Resident bytes.
    pub resident: u64,
}

/// The mappings in `smaps` (the text of `/proc/PID/smaps`) of the files `keep` accepts that are
/// readable, not writable, have resident pages and no private ones.
pub fn droppable(smaps: &str, keep: impl Fn(&str) -> bool) -> Vec<Mapping> {
    unmodified_file_mappings(smaps)
        .into_iter()
        .filter(|(path, _)| keep(path))
        .map(|(_, mapping)| mapping)
        .collect()
}

/// The files that have mappings [`droppable`] would accept.
#[cfg(target_os = "linux")]
fn droppable_paths(smaps: &str) -> Vec<&str> {
    unmodified_file_mappings(smaps)
        .into_iter()
        .map(|(path, _)| path)
        .collect()
}

/// Every readable, not writable mapping in `smaps` with resident pages and no private one, with
/// its path (empty for anonymous memory).
fn unmodified_file_mappings<'a>(smaps: &'a str) -> Vec<(&'a str, Mapping)> {
    let mut found = Vec::new();
    let mut current: Option<(&'a str, Mapping, bool)> = None;
    let mut anonymous = None;
    let mut finish = |current: Option<(&'a str, Mapping, bool)>, anonymous: Option<u64>| {
        if let Some((path, mapping, eligible)) = current {
            if eligible && anonymous == Some(0) && mapping.resident > 0 {
                found.push((path, mapping));
            }
        }
    };
    for line in smaps.lines() {
        if let Some(Header { range, perms, path }) = mapping_header(line) {
            finish(current.take(), anonymous.take());
            let eligible = perms.starts_with('r') && perms.as_bytes().get(1) == Some(&b'-');
            current = range.map(|(start, end)| {
                let mapping = Mapping {
                    start,
                    end,
                    resident: 0,
                };
                (path, mapping, eligible && path.starts_with('/'))
            });
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let kib = || {
            value
                .trim()
                .strip_suffix("kB")
                .and_then(|n| n.trim().parse::<u64>().ok())
        };
        match key {
            "Rss" => {
                if let (Some((_, mapping, _)), Some(kib)) = (current.as_mut(), kib()) {
                    mapping.resident = kib * 1024;
                }
            }
            "Anonymous" => anonymous = kib(),
            _ => {}
        }
    }
    finish(current, anonymous);
    found
}

/// A mapping's first line in smaps.
struct Header<'a> {
    /// Its addresses, when they parse.
    range: Option<(usize, usize)>,
    perms: &'a str,
    path: &'a str,
}

/// A mapping's first line, `start-end perms offset dev inode [path]`; `None` for other lines.
fn mapping_header(line: &str) -> Option<Header<'_>> {
    let mut fields = line.split_ascii_whitespace();
    let range = fields.next()?;
    let (start, end) = range.split_once('-')?;
    if start.is_empty() || !start.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let perms = fields.next()?;
    let (_offset, _dev, _inode) = (fields.next()?, fields.next()?, fields.next()?);
    // The path is the rest of the line (it may hold spaces).
    let path = line
        .splitn(6, |c: char| c.is_ascii_whitespace())
        .nth(5)
        .map(str::trim)
        .unwrap_or("");
    let parsed = usize::from_str_radix(start, 16)
        .ok()
        .zip(usize::from_str_radix(end, 16).ok())
        .filter(|(start, end)| start < end);
    Some(Header {
        range: parsed,
        perms,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0100000 r--p 00000000 fe:00 123    /usr/bin/modelrelay
Size:               1024 kB
Rss:                 352 kB
Anonymous:             0 kB
VmFlags: rd mr mw me
55d0a0100000-55d0a0900000 r-xp 00100000 fe:00 123    /usr/bin/modelrelay
Size:               8192 kB
Rss:                8268 kB
Anonymous:             0 kB
55d0a0900000-55d0a0940000 r--p 00900000 fe:00 123    /usr/bin/modelrelay
Rss:                 248 kB
Anonymous:           248 kB
55d0a0940000-55d0a0948000 rw-p 00940000 fe:00 123    /usr/bin/modelrelay
Rss:                  32 kB
Anonymous:            12 kB
7f0000000000-7f0000100000 r-xp 00000000 fe:00 456    /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 900 kB
Anonymous:             0 kB
7f0000200000-7f0000208000 rw-s 00000000 fe:00 789    /data/modelrelay.db-shm
Rss:                  32 kB
Anonymous:             0 kB
7f0000300000-7f0000301000 r--p 00000000 fe:00 123    /usr/bin/modelrelay
Rss:                   0 kB
Anonymous:             0 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0      [vdso]
Rss:                   4 kB
Anonymous:             0 kB
";

    #[test]
    fn only_the_executables_read_only_unmodified_resident_mappings_are_dropped() {
        let found = droppable(SMAPS, |path| path == "/usr/bin/modelrelay");
        assert_eq!(
            found,
            [
                Mapping {
                    start: 0x55d0a0000000,
                    end: 0x55d0a0100000,
                    resident: 352 * 1024
                },
                Mapping {
                    start: 0x55d0a0100000,
                    end: 0x55d0a0900000,
                    resident: 8268 * 1024
                },
            ]
        );
    }

    #[test]
    fn a_mapping_without_an_anonymous_line_is_kept() {
        let text = "1000-2000 r-xp 00000000 fe:00 1 /bin/x\nRss: 4 kB\n";
        assert!(droppable(text, |path| path == "/bin/x").is_empty());
        assert!(droppable("garbage\n\nzz-yy r-xp\n", |path| path == "/bin/x").is_empty());
    }

    #[test]
    fn a_path_with_spaces_is_read_whole() {
        let text =
            "1000-2000 r-xp 00000000 fe:00 1 /opt/Model Relay/bin/x\nRss: 4 kB\nAnonymous: 0 kB\n";
        assert_eq!(
            droppable(text, |path| path == "/opt/Model Relay/bin/x").len(),
            1
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_lets_go_of_its_code_and_keeps_running_it() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe = exe.to_string_lossy();
        let resident = || -> u64 {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            droppable(&smaps, |path| path == exe)
                .iter()
                .map(|m| m.resident)
                .sum()
        };
        let before = resident();
        let released = release_start_up_code();
        assert!(released.mappings >= 1, "{released:?}");
        assert!(released.bytes > 0);
        // This code runs on (it maps back as it runs, as does the test harness on its other
        // threads: this crate's test binary is small, so that is a good part of it), and less of
        // the binary is mapped.
        let after = resident();
        assert!(
            released.bytes >= before / 2,
            "{} of {before} bytes let go",
            released.bytes
        );
        assert!(after < before, "{after} of {before} bytes still mapped");
    }

    #[test]
    fn only_shared_objects_are_offered_to_the_loader() {
        for library in [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1",
            "/opt/app/libplugin.so",
        ] {
            assert!(looks_like_a_shared_library(library), "{library}");
        }
        for other in [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/mime/mime.cache",
            "/dev/dri/renderD128",
            "/SYSV00000000 (deleted)",
            "/opt/some.solution/data",
        ] {
            assert!(!looks_like_a_shared_library(other), "{other}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_lets_go_of_its_libraries_code_and_keeps_running_it() {
        let libraries = || -> u64 {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            droppable(&smaps, |path| path.contains("/libc.so"))
                .iter()
                .map(|m| m.resident)
                .sum()
        };
        let before = libraries();
        assert!(before > 0, "libc's code is mapped");
        let released = release_loaded_code();
        assert!(released.mappings >= 2, "{released:?}");
        // libc runs on (this formats and allocates through it), with far less of it mapped.
        let text = format!("{:?}", std::fs::read_dir("/proc/self").unwrap().count());
        assert!(!text.is_empty());
        let after = libraries();
        assert!(
            after < before,
            "{after} of {before} bytes of libc still mapped"
        );
    }
}
