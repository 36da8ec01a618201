//! What runs when the dynamic loader loads the library (its `.init_array` entry), before the
//! host program's `main`, while the process has one thread.

use crate::{is_webkit_helper, preload_without_this, AGAIN_EVERY, FIRST_RELEASE};

/// Called by the dynamic loader once the library is loaded, like a C constructor.
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

extern "C" fn on_load() {
    // Nothing may unwind into the loader, in a program that is not ours.
    let _ = std::panic::catch_unwind(|| {
        forget_preload();
        let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
        if is_webkit_helper(&exe.to_string_lossy()) {
            trim_in_the_background();
        }
    });
}

/// Takes this library out of the environment the process passes on. Safe to set here: before
/// `main`, the process has a single thread.
fn forget_preload() {
    let Some(value) = std::env::var_os("LD_PRELOAD") else {
        return;
    };
    match preload_without_this(&value.to_string_lossy()) {
        Some(rest) => std::env::set_var("LD_PRELOAD", rest),
        None => std::env::remove_var("LD_PRELOAD"),
    }
}

fn trim_in_the_background() {
    let _ = std::thread::Builder::new()
        .name("modelrelay-trim".into())
        .spawn(|| {
            std::thread::sleep(FIRST_RELEASE);
            loop {
                relay_resident::release_loaded_code();
                std::thread::sleep(AGAIN_EVERY);
            }
        });
}
