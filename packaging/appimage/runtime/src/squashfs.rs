//! The appended squashfs image: checked, named by its hash, unpacked whole or not at all.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use backhand::{FilesystemReader, InnerNode};
use xxhash_rust::xxh3::Xxh3Default;

/// What the user can do about a broken image, said once for every way it can be broken.
const GET_IT_AGAIN: &str = "download or build the AppImage again";

/// Why unpacking failed. The wording is left to the caller: the cache and `--appimage-extract`
/// write to different places and so give different advice.
#[derive(Debug)]
pub enum Error {
    /// The image cannot be read: a truncated download, a damaged file, a foreign format.
    Damaged(String),
    /// Writing the tree failed at `path`; `needed` is the unpacked size in bytes (0 if unknown).
    Write {
        path: PathBuf,
        err: io::Error,
        needed: u64,
    },
}

impl Error {
    fn write(path: &Path, needed: u64) -> impl FnOnce(io::Error) -> Error + '_ {
        move |err| Error::Write {
            path: path.to_owned(),
            err,
            needed,
        }
    }
}

fn damaged(what: impl std::fmt::Display) -> Error {
    Error::Damaged(format!("{what}: {GET_IT_AGAIN}"))
}

/// A squashfs image `len` bytes long at `offset` in `file`.
pub struct Image {
    pub file: File,
    pub offset: u64,
    pub len: u64,
}

impl Image {
    /// Checks the superblock before anything else reads the image, so that the usual faults (an
    /// incomplete download, a file that is no AppImage of ours) get a plain message instead of a
    /// parser error from deep inside the squashfs reader.
    pub fn open(file: File, offset: u64) -> Result<Image, Error> {
        let size = file.metadata().map_err(damaged)?.len();
        let mut sb = [0u8; 96];
        (&file)
            .seek(SeekFrom::Start(offset))
            .and_then(|_| (&file).read_exact(&mut sb))
            .map_err(|_| {
                damaged(format!(
                    "no squashfs image follows the runtime at byte {offset}"
                ))
            })?;
        let u16_at = |at: usize| u16::from_le_bytes([sb[at], sb[at + 1]]);
        if &sb[..4] != b"hsqs" || u16_at(28) != 4 {
            return Err(damaged(format!("no squashfs 4 image at byte {offset}")));
        }
        // Compressor id 1 is gzip, the only decompressor compiled in (pure Rust, no C library).
        if u16_at(20) != 1 {
            return Err(damaged(format!(
                "the image uses squashfs compressor {}, this runtime reads only gzip",
                u16_at(20)
            )));
        }
        let len = u64::from_le_bytes(sb[40..48].try_into().expect("8 bytes"));
        if offset.saturating_add(len) > size {
            return Err(damaged(format!(
                "the file is incomplete ({size} of {} bytes)",
                offset.saturating_add(len)
            )));
        }
        Ok(Image { file, offset, len })
    }

    /// Names this image's unpacked copy: a hash of the runtime's version and the squashfs bytes,
    /// so a new build gets a fresh copy, the same build always finds its own, and a runtime of
    /// another version (which may unpack differently) never reuses an older runtime's tree.
    pub fn id(&self) -> Result<String, Error> {
        let mut hasher = Xxh3Default::new();
        hasher.update(env!("CARGO_PKG_VERSION").as_bytes());
        let mut f = &self.file;
        f.seek(SeekFrom::Start(self.offset)).map_err(damaged)?;
        let mut rest = f.take(self.len);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = rest.read(&mut buf).map_err(damaged)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(format!("{:032x}", hasher.digest128()))
    }
}

/// Distinguishes temporary trees of one process (tests unpack from several threads).
static NEXT_TEMP: AtomicU32 = AtomicU32::new(0);

/// Unpacks `image` to `dest` so that `dest` appears complete or not at all: the tree is written to
/// a temporary sibling and renamed into place (one atomic step on one filesystem). Returns false
/// when another process renamed its copy of the same image into place first: ours is dropped.
pub fn install(image: &Image, dest: &Path) -> Result<bool, Error> {
    let parent = dest.parent().unwrap_or(Path::new("."));
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let temp = parent.join(format!(
        ".tmp-{name}-{}-{}",
        std::process::id(),
        NEXT_TEMP.fetch_add(1, Ordering::Relaxed)
    ));
    let result = unpack(image, &temp).and_then(|needed| match fs::rename(&temp, dest) {
        Ok(()) => Ok(true),
        // Someone else was quicker: their tree is the same image's.
        Err(_) if fs::symlink_metadata(dest.join("AppRun")).is_ok() => Ok(false),
        Err(err) => Err(Error::Write {
            path: dest.to_owned(),
            err,
            needed,
        }),
    });
    if !matches!(result, Ok(true)) {
        let _ = fs::remove_dir_all(&temp);
    }
    result
}

/// Writes the whole tree into the new directory `dir`; returns its size in bytes.
fn unpack(image: &Image, dir: &Path) -> Result<u64, Error> {
    let reader = BufReader::new(image.file.try_clone().map_err(damaged)?);
    let squashfs = FilesystemReader::from_reader_with_offset(reader, image.offset)
        .map_err(|e| damaged(format!("the squashfs image cannot be read ({e})")))?;
    let needed: u64 = squashfs
        .files()
        .map(|node| match &node.inner {
            InnerNode::File(file) => file.file_len() as u64,
            _ => 0,
        })
        .sum();
    fs::create_dir(dir).map_err(Error::write(dir, needed))?;

    let mut dirs = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    // files() is sorted by path, so every directory comes before what it holds.
    for node in squashfs.files() {
        let relative = node.fullpath.strip_prefix("/").unwrap_or(&node.fullpath);
        // A damaged or hostile image must not write outside `dir`.
        if !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(damaged(format!(
                "bad path {:?} in the image",
                node.fullpath
            )));
        }
        let path = dir.join(relative);
        // Permission bits only: never set-user-ID files in a user's cache.
        let mode = u32::from(node.header.permissions) & 0o777;
        match &node.inner {
            InnerNode::Dir(_) => {
                if !relative.as_os_str().is_empty() {
                    fs::create_dir(&path).map_err(Error::write(&path, needed))?;
                }
                dirs.push((path, mode));
            }
            InnerNode::File(file) => {
                let mut data = squashfs.file(file).reader_checked().map_err(damaged)?;
                let mut out = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .map_err(Error::write(&path, needed))?;
                // Copied by hand to tell a bad image (read) from a full disk (write).
                loop {
                    let n = data.read(&mut buf).map_err(|e| {
                        damaged(format!(
                            "{} cannot be unpacked ({e})",
                            node.fullpath.display()
                        ))
                    })?;
                    if n == 0 {
                        break;
                    }
                    out.write_all(&buf[..n])
                        .map_err(Error::write(&path, needed))?;
                }
                // On disk before the rename publishes it: after a crash the cache must not hold a
                // complete-looking tree of empty files that would be reused forever.
                out.sync_all().map_err(Error::write(&path, needed))?;
                // Exact modes regardless of the umask (the binary must stay executable).
                out.set_permissions(fs::Permissions::from_mode(mode))
                    .map_err(Error::write(&path, needed))?;
            }
            InnerNode::Symlink(link) => {
                symlink(&link.link, &path).map_err(Error::write(&path, needed))?
            }
            // Devices, pipes and sockets: an AppDir has none, and a user could not make them.
            _ => {}
        }
    }
    // Directory modes last, deepest first: a read-only directory must not block its contents.
    for (path, mode) in dirs.iter().rev() {
        fs::set_permissions(path, fs::Permissions::from_mode(*mode))
            .map_err(Error::write(path, needed))?;
    }
    Ok(needed)
}

/// Where the unpacked tree is and whether this start unpacked it.
pub struct Cached {
    pub dir: PathBuf,
    pub unpacked: bool,
}

/// The image's tree under `root`, unpacked on the first start of this image only.
pub fn cached(image: &Image, root: &Path) -> Result<Cached, Error> {
    let dir = root.join(image.id()?);
    let has_app_run = || fs::symlink_metadata(dir.join("AppRun")).is_ok();
    if has_app_run() {
        return Ok(Cached {
            dir,
            unpacked: false,
        });
    }
    // A tree without AppRun was damaged after it was unpacked: start over. Trees appear by a
    // rename, AppRun already inside, so if the folder exists and only then AppRun is missing, it
    // is not one that another start renamed into place a moment ago.
    if dir.exists() && !has_app_run() {
        let _ = fs::remove_dir_all(&dir);
    }
    fs::create_dir_all(root).map_err(Error::write(root, 0))?;
    remove_stale_temps(root);
    let unpacked = install(image, &dir)?;
    Ok(Cached { dir, unpacked })
}

/// Removes temporary trees left by processes that died while unpacking (killed, power cut): their
/// names carry the process id, and a process that no longer exists will not finish them.
pub fn remove_stale_temps(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(".tmp-")) else {
            continue;
        };
        let Some(pid) = rest.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::sync::{Arc, Barrier};

    /// A directory removed at the end of the test.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(name: &str) -> TempDir {
            let n = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!(
                "appimage-runtime-test-{name}-{}-{n}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir_all(&path).unwrap();
            TempDir(path)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    const PREFIX: usize = 1234; // stands in for the runtime ELF before the image

    /// A small AppDir-like tree packed the way scripts/desktop-appimage.sh packs the real one,
    /// behind PREFIX bytes of filler. Returns the image file's path.
    fn make_image(tmp: &Path) -> PathBuf {
        let src = tmp.join("src");
        fs::create_dir_all(src.join("usr/bin")).unwrap();
        fs::create_dir_all(src.join("empty")).unwrap();
        fs::write(src.join("AppRun"), "#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(src.join("AppRun"), fs::Permissions::from_mode(0o755)).unwrap();
        // Larger than a squashfs block (128 KiB), and compressible only in part (16 letters in a
        // pseudo-random order), so it is stored compressed and in several blocks.
        let mut seed = 1u32;
        let big: Vec<u8> = (0..300_000)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                b'a' + (seed >> 16) as u8 % 16
            })
            .collect();
        fs::write(src.join("usr/bin/app"), &big).unwrap();
        fs::set_permissions(src.join("usr/bin/app"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(src.join("app.png"), "png").unwrap();
        fs::set_permissions(src.join("app.png"), fs::Permissions::from_mode(0o644)).unwrap();
        symlink("app.png", src.join(".DirIcon")).unwrap();
        let squashfs = tmp.join("image.squashfs");
        let status = Command::new("mksquashfs")
            .arg(&src)
            .arg(&squashfs)
            .args([
                "-noappend",
                "-all-root",
                "-comp",
                "gzip",
                "-quiet",
                "-no-progress",
            ])
            .status()
            .expect("mksquashfs (Debian package squashfs-tools) is needed for these tests");
        assert!(status.success());
        let mut bytes = vec![0x5a; PREFIX];
        bytes.extend(fs::read(&squashfs).unwrap());
        let image = tmp.join("test.AppImage");
        fs::write(&image, bytes).unwrap();
        image
    }

    fn open(path: &Path) -> Result<Image, Error> {
        Image::open(File::open(path).unwrap(), PREFIX as u64)
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn temps_in(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp-"))
            .collect()
    }

    #[test]
    fn unpacks_the_whole_tree_with_modes_and_symlinks() {
        let tmp = TempDir::new("tree");
        let image = open(&make_image(&tmp.0)).unwrap();
        let dest = tmp.0.join("out");
        assert!(install(&image, &dest).unwrap());

        assert_eq!(
            fs::read_to_string(dest.join("AppRun")).unwrap(),
            "#!/bin/sh\necho hi\n"
        );
        assert_eq!(mode(&dest.join("AppRun")), 0o755);
        assert_eq!(mode(&dest.join("app.png")), 0o644);
        assert_eq!(
            fs::read(dest.join("usr/bin/app")).unwrap(),
            fs::read(tmp.0.join("src/usr/bin/app")).unwrap()
        );
        assert_eq!(mode(&dest.join("usr/bin/app")), 0o755);
        assert_eq!(
            fs::read_link(dest.join(".DirIcon")).unwrap(),
            Path::new("app.png")
        );
        assert!(dest.join("empty").is_dir());
        assert!(temps_in(&tmp.0).is_empty());
    }

    #[test]
    fn a_second_start_reuses_the_tree() {
        let tmp = TempDir::new("reuse");
        let image = open(&make_image(&tmp.0)).unwrap();
        let root = tmp.0.join("cache");
        let first = cached(&image, &root).unwrap();
        assert!(first.unpacked);
        // A file the image does not have: a second unpacking would lose it.
        fs::write(first.dir.join("marker"), "").unwrap();
        let second = cached(&image, &root).unwrap();
        assert!(!second.unpacked);
        assert_eq!(second.dir, first.dir);
        assert!(second.dir.join("marker").exists());
        assert_eq!(fs::read_dir(&root).unwrap().count(), 1);

        // Damaged after unpacking (AppRun deleted): unpacked again rather than failing forever.
        fs::remove_file(first.dir.join("AppRun")).unwrap();
        let third = cached(&image, &root).unwrap();
        assert!(third.unpacked);
        assert!(third.dir.join("AppRun").exists());
        assert!(!third.dir.join("marker").exists());
    }

    #[test]
    fn starts_at_the_same_moment_all_get_one_complete_tree() {
        let tmp = TempDir::new("race");
        let path = make_image(&tmp.0);
        let root = tmp.0.join("cache");
        let barrier = Arc::new(Barrier::new(4));
        let starts: Vec<_> = (0..4)
            .map(|_| {
                let (path, root, barrier) = (path.clone(), root.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let image = open(&path).unwrap();
                    barrier.wait();
                    let c = cached(&image, &root).unwrap();
                    (c.dir, c.unpacked)
                })
            })
            .collect::<Vec<_>>() // all spawned before any is joined: they meet at the barrier
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let dir = &starts[0].0;
        assert!(starts.iter().all(|(d, _)| d == dir));
        // Exactly one copy was renamed into place, whoever else unpacked dropped theirs.
        assert_eq!(starts.iter().filter(|(_, unpacked)| *unpacked).count(), 1);
        assert_eq!(fs::read(dir.join("usr/bin/app")).unwrap().len(), 300_000);
        assert!(temps_in(&root).is_empty());
    }

    #[test]
    fn a_new_image_gets_its_own_tree() {
        let tmp = TempDir::new("versions");
        let path = make_image(&tmp.0);
        let root = tmp.0.join("cache");
        let first = cached(&open(&path).unwrap(), &root).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        bytes[PREFIX + 200] ^= 0xff; // any change of the image
        fs::write(&path, bytes).unwrap();
        assert_ne!(
            open(&path).unwrap().id().unwrap(),
            first.dir.file_name().unwrap().to_str().unwrap()
        );
    }

    #[test]
    fn a_damaged_image_says_so_and_leaves_nothing_behind() {
        let tmp = TempDir::new("damaged");
        let path = make_image(&tmp.0);
        let good = fs::read(&path).unwrap();
        let root = tmp.0.join("cache");

        // Cut short, as by an interrupted download.
        let bytes_used = u64::from_le_bytes(good[PREFIX + 40..PREFIX + 48].try_into().unwrap());
        fs::write(&path, &good[..PREFIX + bytes_used as usize - 1]).unwrap();
        match open(&path) {
            Err(Error::Damaged(m)) => assert!(m.contains("incomplete"), "{m}"),
            _ => panic!("a truncated image was accepted"),
        }
        // Not a squashfs at all.
        fs::write(&path, vec![0u8; 5000]).unwrap();
        assert!(matches!(open(&path), Err(Error::Damaged(m)) if m.contains("no squashfs")));
        // Compressed data overwritten (the superblock intact): found while unpacking.
        let mut bytes = good.clone();
        bytes[PREFIX + 200..PREFIX + 4000].fill(0xa5);
        fs::write(&path, bytes).unwrap();
        match cached(&open(&path).unwrap(), &root) {
            Err(Error::Damaged(m)) => assert!(m.contains(GET_IT_AGAIN), "{m}"),
            Err(e) => panic!("wrong error: {e:?}"),
            Ok(_) => panic!("a damaged image unpacked"),
        }
        assert_eq!(
            fs::read_dir(&root).unwrap().count(),
            0,
            "left something in the cache"
        );
    }

    #[test]
    fn temporary_trees_of_dead_processes_are_removed() {
        let tmp = TempDir::new("stale");
        let dead = tmp.0.join(".tmp-abc-4294967294-0"); // above any pid the kernel hands out
        let ours = tmp.0.join(format!(".tmp-abc-{}-99", std::process::id()));
        fs::create_dir_all(dead.join("usr")).unwrap();
        fs::create_dir_all(&ours).unwrap();
        remove_stale_temps(&tmp.0);
        assert!(!dead.exists());
        assert!(ours.exists(), "a live process's tree is its own business");
    }
}
