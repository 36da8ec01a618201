//! The two desktop processes are what they say: the tray process, which a box keeps running,
//! links no web view; the window process does. Read from the binaries' dynamic sections
//! (`readelf -d`, binutils), Linux only.

use std::process::Command;

/// The shared libraries `binary` names as needed.
fn needed(binary: &str) -> Vec<String> {
    let output = Command::new("readelf")
        .args(["-d", binary])
        .output()
        .expect("readelf (binutils) runs");
    assert!(output.status.success(), "readelf -d {binary}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| Some(line.split('[').nth(1)?.trim_end_matches(']').to_string()))
        .collect()
}

const WEB_VIEW: [&str; 3] = ["libwebkit2gtk", "libjavascriptcoregtk", "libsoup"];

#[cfg(target_os = "linux")]
#[test]
fn the_tray_process_links_no_web_view_and_the_window_process_does() {
    let tray = needed(env!("CARGO_BIN_EXE_modelrelay-desktop"));
    assert!(
        tray.iter().any(|lib| lib.starts_with("libgtk-3")),
        "{tray:?}"
    );
    for web in WEB_VIEW {
        assert!(
            !tray.iter().any(|lib| lib.starts_with(web)),
            "the tray process links {web}: {tray:?}"
        );
    }
    let window = needed(env!("CARGO_BIN_EXE_modelrelay-dashboard"));
    assert!(
        window.iter().any(|lib| lib.starts_with("libwebkit2gtk")),
        "{window:?}"
    );
}

#[test]
fn the_window_process_started_by_hand_says_what_it_is_and_exits() {
    let output = Command::new(env!("CARGO_BIN_EXE_modelrelay-dashboard"))
        .stdin(std::process::Stdio::null())
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .output()
        .expect("the window process runs");
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("open the dashboard from the tray"), "{said}");
}
