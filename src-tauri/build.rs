//! Generates the Tauri context (config, embedded UI assets, ACL) at compile time.

fn main() {
    tauri_build::build()
}
