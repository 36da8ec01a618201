//! ModelRelay's AppImage runtime: the ELF at the start of the `.AppImage` file.
//!
//! An AppImage (type 2) is this program followed by a squashfs image of the AppDir. Runtimes
//! usually mount the image with FUSE, which needs libfuse and a set-user-ID helper that many
//! machines lack; this one unpacks it instead, once per image, into
//! `$XDG_CACHE_HOME/modelrelay/appimage/<hash>` (default `~/.cache/...`), and then `exec`s the
//! tree's `AppRun` with the same arguments. Because it execs, the process id the caller sees is
//! the app's own: signals, `wait` and `/proc/PID` reach the app, not a wrapper.
//!
//! Built by scripts/desktop-appimage.sh, which patches the AppImage magic (`AI\x02` at byte 8)
//! into this ELF and appends the image.

mod elf;
mod squashfs;

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use squashfs::{Error, Image};

const USAGE: &str = "\
Options of the AppImage itself (everything else goes to the app):
  --appimage-extract   unpack the app into ./squashfs-root and exit
  --appimage-offset    print the byte offset of the squashfs image and exit
  --appimage-version   print this runtime's version and exit
  --appimage-help      print this help and exit
Without them, the app is unpacked once into $XDG_CACHE_HOME/modelrelay/appimage
(default ~/.cache/modelrelay/appimage) and started from there.";

fn main() {
    if let Err(message) = run() {
        eprintln!("ModelRelay AppImage: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let args: Vec<OsString> = args.collect();
    // The kernel's name for the file being run: absolute, with symlinks resolved.
    let path = std::fs::read_link("/proc/self/exe")
        .map_err(|e| format!("cannot find the AppImage file via /proc/self/exe ({e})"))?;
    let file = File::open(&path)
        .map_err(|e| format!("cannot read {} ({e}): is it readable?", path.display()))?;
    let offset = elf::payload_offset_of(&file).map_err(|e| {
        format!(
            "{} is damaged: {e}; download or build it again",
            path.display()
        )
    })?;

    match args.first().and_then(|a| a.to_str()) {
        Some("--appimage-offset") => println!("{offset}"),
        Some("--appimage-version") => println!(
            "modelrelay-appimage-runtime {} (type 2; unpacks to the cache, no FUSE; squashfs gzip)",
            env!("CARGO_PKG_VERSION")
        ),
        Some("--appimage-help") => println!("{USAGE}"),
        Some("--appimage-extract") => {
            if args.len() > 1 {
                return Err(
                    "--appimage-extract takes no file pattern here: it unpacks everything".into(),
                );
            }
            let image = Image::open(file, offset).map_err(|e| describe(e, &path, None))?;
            let dest = std::env::current_dir()
                .map_err(|e| format!("cannot find the current folder ({e})"))?
                .join("squashfs-root");
            let exists = || {
                format!(
                    "{} already exists: remove it, or run this from another folder",
                    dest.display()
                )
            };
            if dest.symlink_metadata().is_ok() {
                return Err(exists());
            }
            if !squashfs::install(&image, &dest).map_err(|e| describe(e, &path, None))? {
                return Err(exists());
            }
            println!("{}", dest.display());
        }
        Some(other) if other.starts_with("--appimage-") => {
            return Err(format!("unknown option {other}\n{USAGE}"));
        }
        _ => {
            let root = cache_root()?;
            let image = Image::open(file, offset).map_err(|e| describe(e, &path, Some(&root)))?;
            let start = std::time::Instant::now();
            let cached =
                squashfs::cached(&image, &root).map_err(|e| describe(e, &path, Some(&root)))?;
            if cached.unpacked {
                // Said once per version, so a slow first start and a full cache are explainable.
                eprintln!(
                    "ModelRelay AppImage: unpacked into {} in {:.1} s (once per version)",
                    cached.dir.display(),
                    start.elapsed().as_secs_f64()
                );
            }
            let app_run = cached.dir.join("AppRun");
            // The variables AppImage runtimes set: the app finds its image (ModelRelay's "Start on
            // login" registers $APPIMAGE, not the cached binary) and its original argv[0] and folder.
            let mut command = Command::new(&app_run);
            command
                .args(&args)
                .env("APPIMAGE", &path)
                .env("APPDIR", &cached.dir)
                .env("ARGV0", &argv0);
            if let Ok(owd) = std::env::current_dir() {
                command.env("OWD", owd);
            }
            let err = command.exec(); // returns only on failure
            let advice = if err.kind() == io::ErrorKind::PermissionDenied {
                // The usual cause: a cache on a filesystem mounted `noexec`.
                "the folder may not allow running programs: start it with XDG_CACHE_HOME set \
                 to a folder that does"
                    .to_string()
            } else {
                format!("delete {} and start again", cached.dir.display())
            };
            return Err(format!(
                "cannot start {} ({err}): {advice}",
                app_run.display()
            ));
        }
    }
    Ok(())
}

/// `$XDG_CACHE_HOME/modelrelay/appimage`, else `~/.cache/modelrelay/appimage`.
fn cache_root() -> Result<PathBuf, String> {
    // The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    let base = match std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        _ => match std::env::var_os("HOME").filter(|home| !home.is_empty()) {
            Some(home) => PathBuf::from(home).join(".cache"),
            None => {
                return Err(
                    "neither XDG_CACHE_HOME nor HOME is set: set XDG_CACHE_HOME to a \
                            writable folder to unpack the app into"
                        .into(),
                )
            }
        },
    };
    Ok(base.join("modelrelay").join("appimage"))
}

/// An unpacking error as a sentence that says what to do. `root` is the cache folder (None for
/// `--appimage-extract`, which writes to the current folder).
fn describe(error: Error, image: &Path, root: Option<&Path>) -> String {
    let (path, err, needed) = match error {
        Error::Damaged(what) => return format!("{} is damaged: {what}", image.display()),
        Error::Write { path, err, needed } => (path, err, needed),
    };
    let elsewhere = match root {
        Some(_) => "start it with XDG_CACHE_HOME set to a folder on a disk with room",
        None => "run it from a folder on a disk with room",
    };
    let size = if needed > 0 {
        format!(" (it needs about {} MB)", needed.div_ceil(1_000_000))
    } else {
        String::new()
    };
    let place = root.unwrap_or(&path);
    match err.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => format!(
            "no space left in {} to unpack ModelRelay{size}: free some space there, or {elsewhere}",
            place.display()
        ),
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => format!(
            "cannot write to {} ({err}): make it writable, or {}",
            path.display(),
            elsewhere.replace("on a disk with room", "you can write to")
        ),
        _ => format!(
            "cannot unpack ModelRelay to {}{size}: {err}",
            path.display()
        ),
    }
}
