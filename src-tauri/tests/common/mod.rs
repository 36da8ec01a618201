//! What every test binary that runs real relay-core nodes needs: a data directory of its own
//! (set for the whole process, which is why each such test is a binary of its own) and a
//! multi-thread runtime for the nodes' tasks.

use std::path::PathBuf;

/// A fresh temporary directory named after `name`, with `MODELRELAY_DATA_DIR` pointing into it
/// (the worker secret is generated there, not in the developer's data directory), and a
/// runtime. The caller removes the directory when done.
pub fn isolated_nodes(name: &str) -> (PathBuf, tokio::runtime::Runtime) {
    let dir = std::env::temp_dir().join(format!("relay-desktop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var("MODELRELAY_DATA_DIR", dir.join("data"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    (dir, runtime)
}
