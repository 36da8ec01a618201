//! The library as the dynamic loader meets it: preloaded into real programs, one of them named
//! like a WebKit helper process.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The library's `FILE_NAME` and `FIRST_RELEASE` (a cdylib's items cannot be imported here).
const FILE_NAME: &str = "libmodelrelay_webkit_trim.so";
const FIRST_RELEASE: Duration = Duration::from_secs(3);

/// The library, built now: `cargo test` builds a cdylib's tests but not the cdylib itself, so
/// a library left from an earlier build would be tested otherwise. Cargo leaves it in the
/// profile's folder, above this test's `deps/`.
fn library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let profile = exe.parent().and_then(Path::parent).unwrap();
            let mut build = Command::new(env!("CARGO"));
            build.args(["build", "--quiet", "--lib", "-p", env!("CARGO_PKG_NAME")]);
            if profile.ends_with("release") {
                build.arg("--release");
            }
            let status = build.status().unwrap();
            assert!(status.success(), "cargo could not build the library");
            let library = profile.join(FILE_NAME);
            assert!(library.exists(), "{} was not built", library.display());
            library
        })
        .clone()
}

/// A copy of the system program `program` named `name` in `dir`: the library looks at the name.
fn copy_of(program: &str, dir: &Path, name: &str) -> PathBuf {
    let copy = dir.join(name);
    std::fs::copy(program, &copy).unwrap();
    copy
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("webkit-trim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Resident bytes of libc's read-only, unmodified mappings in `pid`.
fn libc_resident(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    relay_resident::droppable(&smaps, |path| path.contains("/libc.so"))
        .iter()
        .map(|mapping| mapping.resident)
        .sum()
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_webkit_helper_lets_go_of_its_libraries_code_and_anything_else_is_left_alone() {
    let dir = tempdir();
    let start = |name: &str| {
        let program = copy_of("/bin/sleep", &dir, name);
        Killed(
            Command::new(program)
                .arg("30")
                .env("LD_PRELOAD", library())
                .spawn()
                .unwrap(),
        )
    };
    let helper = start("WebKitWebProcess");
    let other = start("sleep");
    std::thread::sleep(Duration::from_millis(300));
    let (helper_before, other_before) = (libc_resident(helper.0.id()), libc_resident(other.0.id()));
    assert!(helper_before > 0 && other_before > 0);
    std::thread::sleep(FIRST_RELEASE + Duration::from_secs(1));
    let (helper_after, other_after) = (libc_resident(helper.0.id()), libc_resident(other.0.id()));
    // `sleep` sleeps: nothing maps libc's code back in the helper, and nothing drops it in the other.
    assert!(
        helper_after < helper_before / 2,
        "the helper still maps {helper_after} of {helper_before} bytes of libc"
    );
    assert_eq!(
        other_after, other_before,
        "a program that is not WebKit's was trimmed"
    );
    drop((helper, other));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn what_a_preloaded_process_starts_does_not_inherit_the_library() {
    let dir = tempdir().join("env");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["WebKitNetworkProcess", "env"] {
        let program = copy_of("/usr/bin/env", &dir, name);
        let output = Command::new(program)
            .env(
                "LD_PRELOAD",
                format!("{}:{}", library().display(), library().display()),
            )
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{name}: {output:?}");
        assert!(
            !printed.contains("LD_PRELOAD"),
            "{name} passes the library on:\n{printed}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
