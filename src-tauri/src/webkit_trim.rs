//! Lighter WebKit processes for the dashboard window: before WebKit starts its web and network
//! processes, the window's process names `libmodelrelay_webkit_trim.so` (the `webkit-trim`
//! crate) in `LD_PRELOAD`, which they inherit. Loaded there, the library lets each go of the
//! code its start-up ran, as this process does itself: with the live dashboard open, 125 → 78 MB
//! (web process) and 35 → 14 MB (network process), measured (BENCHMARKS.md, "what a box pays").
//!
//! The library is looked for beside this program (a cargo build: both in `target/<profile>/`)
//! and in `../lib/modelrelay/` from it (the `.deb`'s `/usr/lib/modelrelay/`, the AppImage's
//! `usr/lib/modelrelay/`), never on a search path: `LD_PRELOAD` gets an absolute path, in a
//! folder only whoever installed this program can write to. Without it the window works the
//! same, heavier. `MODELRELAY_TRIM_WEBKIT=0` turns it off (to compare, or should a WebKit ever
//! disagree with it); a `LD_PRELOAD` the user set is kept, the library added after it.

use std::path::{Path, PathBuf};

/// The library's file name (the `webkit-trim` crate's `FILE_NAME`).
pub const LIBRARY: &str = "libmodelrelay_webkit_trim.so";

/// `0` here turns the trimming off.
pub const SWITCH: &str = "MODELRELAY_TRIM_WEBKIT";

/// Where the library is looked for, in order, for the program at `exe`.
pub fn places(exe: &Path) -> Vec<PathBuf> {
    let Some(dir) = exe.parent() else {
        return Vec::new();
    };
    let mut places = vec![dir.join(LIBRARY)];
    if let Some(prefix) = dir.parent() {
        places.push(prefix.join("lib").join("modelrelay").join(LIBRARY));
    }
    places
}

/// `LD_PRELOAD`'s new value with `library` added to `current`; an error says why the library
/// cannot be named there (the loader splits the list at colons and spaces and would load the
/// pieces of such a path).
pub fn preload_value(current: Option<&str>, library: &Path) -> Result<String, String> {
    let Some(path) = library
        .to_str()
        .filter(|path| library.is_absolute() && !path.is_empty())
    else {
        return Err(format!(
            "{} is not an absolute UTF-8 path",
            library.display()
        ));
    };
    if path.contains([':', ' ', '\t', '\n']) {
        return Err(format!(
            "{path} holds a colon or a space, which LD_PRELOAD cannot carry"
        ));
    }
    match current.map(str::trim).filter(|current| !current.is_empty()) {
        None => Ok(path.to_owned()),
        Some(current) if current.split([':', ' ']).any(|entry| entry == path) => {
            Ok(current.to_owned())
        }
        Some(current) => Ok(format!("{current}:{path}")),
    }
}

/// Names the library in this process's `LD_PRELOAD` for the WebKit processes it will start, and
/// says what it did (for the log, which starts later). Call it while the process has a single
/// thread (setting the environment races with threads reading it), before WebKit starts.
pub fn trim_webkit_processes() -> Result<PathBuf, String> {
    if !cfg!(target_os = "linux") {
        return Err("only WebKitGTK's processes (Linux) are trimmed".into());
    }
    if std::env::var_os(SWITCH).is_some_and(|value| value == "0") {
        return Err(format!("{SWITCH}=0"));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let library = places(&exe)
        .into_iter()
        .find(|place| place.is_file())
        .ok_or_else(|| format!("no {LIBRARY} beside {}", exe.display()))?;
    let current = std::env::var("LD_PRELOAD").ok();
    let value = preload_value(current.as_deref(), &library)?;
    std::env::set_var("LD_PRELOAD", value);
    Ok(library)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_looked_for_beside_the_program_then_in_its_lib_folder() {
        assert_eq!(
            places(Path::new("/usr/bin/modelrelay-dashboard")),
            [
                PathBuf::from("/usr/bin/libmodelrelay_webkit_trim.so"),
                PathBuf::from("/usr/lib/modelrelay/libmodelrelay_webkit_trim.so"),
            ]
        );
        assert_eq!(
            places(Path::new("/home/a/.cache/modelrelay/appimage/abc/usr/bin/modelrelay-dashboard"))[1],
            PathBuf::from("/home/a/.cache/modelrelay/appimage/abc/usr/lib/modelrelay/libmodelrelay_webkit_trim.so")
        );
        assert!(places(Path::new("/")).is_empty());
    }

    #[test]
    fn the_library_is_added_after_what_the_user_preloads() {
        let library = Path::new("/usr/lib/modelrelay/libmodelrelay_webkit_trim.so");
        let path = library.to_str().unwrap();
        assert_eq!(preload_value(None, library).unwrap(), path);
        assert_eq!(preload_value(Some("  "), library).unwrap(), path);
        assert_eq!(
            preload_value(Some("/opt/mine.so"), library).unwrap(),
            format!("/opt/mine.so:{path}")
        );
        // Already named (a dashboard started from a dashboard's environment): not twice.
        let twice = format!("/opt/mine.so {path}");
        assert_eq!(preload_value(Some(&twice), library).unwrap(), twice);
    }

    #[test]
    fn a_path_the_loader_would_split_or_resolve_is_refused() {
        for bad in [
            "/home/a b/.cache/lib.so",
            "/opt/x:y/lib.so",
            "relative/lib.so",
            "",
        ] {
            assert!(preload_value(None, Path::new(bad)).is_err(), "{bad:?}");
        }
    }
}
