//! `libmodelrelay_webkit_trim.so`: lets WebKit's own processes go of the code their start-up ran.
//!
//! The dashboard window's process lets go of its opening code itself (`relay_resident`), but two
//! thirds of an open window's memory are WebKit's web process and network process, programs of
//! the system's WebKitGTK that run no code of ours. Each maps far more of WebKit, JavaScriptCore,
//! ICU and the GL driver while it starts and loads the page than while it shows it: measured with
//! the live dashboard open, the web process 125 → 78 MB and the network process 35 → 14 MB PSS
//! once that code is let go of (BENCHMARKS.md, "what a box pays").
//!
//! The dashboard process names this library in `LD_PRELOAD` before WebKit starts its processes,
//! which inherit the environment. Loaded, it first takes itself out of `LD_PRELOAD`, so nothing
//! those processes start inherits it; then, in a WebKit helper process only (`WebKit*` in
//! `/proc/self/exe`; anything else the dashboard starts, such as a browser for a link, is left
//! alone), a thread of its own calls `relay_resident::release_loaded_code` [`FIRST_RELEASE`]
//! after start and every [`AGAIN_EVERY`] after that. Code that runs again maps back from the page
//! cache.

#[cfg(target_os = "linux")]
mod on_load;

/// The library's file name, as `LD_PRELOAD` names it.
pub const FILE_NAME: &str = "libmodelrelay_webkit_trim.so";

/// When a WebKit process first lets go: its page has loaded and painted by then (the first
/// paint comes 0.6–1 s after the window is asked for, BENCHMARKS.md).
pub const FIRST_RELEASE: std::time::Duration = std::time::Duration::from_secs(3);

/// How often it lets go again: the dashboard's other views run code the first page did not, and
/// an open window is kept for hours. Each round reads `/proc/self/smaps` and re-maps the code the
/// live charts run: a few milliseconds a minute.
pub const AGAIN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the program at `exe` is one of WebKit's helper processes (`WebKitWebProcess`,
/// `WebKitNetworkProcess`, `WebKitGPUProcess`).
pub fn is_webkit_helper(exe: &str) -> bool {
    exe.rsplit('/')
        .next()
        .is_some_and(|name| name.starts_with("WebKit"))
}

/// `LD_PRELOAD`'s value without this library (entries are separated by colons or spaces, as the
/// dynamic loader reads them); `None` when nothing else is left.
pub fn preload_without_this(value: &str) -> Option<String> {
    let others: Vec<&str> = value
        .split([':', ' '])
        .filter(|entry| !entry.is_empty())
        .filter(|entry| entry.rsplit('/').next() != Some(FILE_NAME))
        .collect();
    (!others.is_empty()).then(|| others.join(":"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_webkits_helper_processes_are_trimmed() {
        for helper in [
            "/usr/lib/x86_64-linux-gnu/webkit2gtk-4.1/WebKitWebProcess",
            "/usr/lib/x86_64-linux-gnu/webkit2gtk-4.1/WebKitNetworkProcess",
            "/usr/libexec/webkit2gtk-4.1/WebKitGPUProcess",
        ] {
            assert!(is_webkit_helper(helper), "{helper}");
        }
        for other in [
            "/usr/bin/modelrelay-dashboard",
            "/usr/bin/xdg-open",
            "/usr/bin/dash",
            "/opt/WebKit/bin/sh",
            "",
        ] {
            assert!(!is_webkit_helper(other), "{other}");
        }
    }

    #[test]
    fn the_library_takes_itself_out_of_the_preload_list_and_keeps_the_rest() {
        let ours = "/usr/lib/modelrelay/libmodelrelay_webkit_trim.so";
        assert_eq!(preload_without_this(ours), None);
        assert_eq!(
            preload_without_this(&format!("/opt/a.so:{ours}")),
            Some("/opt/a.so".into())
        );
        assert_eq!(
            preload_without_this(&format!("{ours} /opt/a.so  libb.so")),
            Some("/opt/a.so:libb.so".into())
        );
        // A library that only ends like ours is somebody else's.
        assert_eq!(
            preload_without_this("/opt/not-libmodelrelay_webkit_trim.so"),
            Some("/opt/not-libmodelrelay_webkit_trim.so".into())
        );
        assert_eq!(preload_without_this(""), None);
        assert_eq!(preload_without_this("::  :"), None);
    }
}
