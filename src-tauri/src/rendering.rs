//! Software rendering (and an interpreting JavaScript engine) for the tray app and its dashboard
//! window, chosen before GTK or WebKit start (Linux).
//!
//! The dashboard is text, tables and four small canvas charts, which the CPU draws easily. GPU
//! rendering costs memory on every box the tray app sits on (BENCHMARKS.md, "2026-11-25, desktop
//! footprint"): GDK probes OpenGL when it opens the display, which loads the GL driver (Mesa and
//! LLVM, ~28 MB PSS measured) into the tray-only app at login, where nothing is drawn with GL at
//! all; WebKit's accelerated compositing loads it again in the web process and adds its layer
//! buffers (~100 MB PSS there, measured). WebKit still opens an EGL display in
//! both processes (which loads the GL driver once a window exists): it has no switch for that.
//!
//! These are GTK's and WebKitGTK's own switches, read from the environment when the display
//! opens and when WebKit starts its processes (which inherit it). A variable the user already
//! set wins: `WEBKIT_DISABLE_COMPOSITING_MODE=0 GDK_GL=` brings GPU rendering back.

/// The variables and the values that select software rendering.
pub const SOFTWARE_RENDERING: &[(&str, &str)] = &[
    // GDK: no OpenGL probe at display open (GTK 3's GDK_GL flags).
    ("GDK_GL", "disable"),
    // WebKit: draw the page without accelerated compositing (its layer buffers and GL
    // context were ~100 MB of the web process).
    ("WEBKIT_DISABLE_COMPOSITING_MODE", "1"),
    // WebKit: hand the drawn page to the window through shared memory, not DMA-BUF buffers
    // (which only accelerated compositing needs): 2 MB less in the window's process, measured.
    ("WEBKIT_DISABLE_DMABUF_RENDERER", "1"),
    // JavaScriptCore: interpret, do not compile. The dashboard's script is small and mostly
    // waits for events; the JIT's compiled code and profiling data were 11 MB of the web process
    // (measured, BENCHMARKS.md "what a box pays") for no CPU saved at rest (3.3% of a core with
    // and without it, live charts running).
    ("JSC_useJIT", "0"),
];

/// The defaults among `defaults` that `is_set` says the environment does not set yet.
pub fn unset<'a>(
    defaults: &'a [(&'a str, &'a str)],
    is_set: impl Fn(&str) -> bool,
) -> Vec<(&'a str, &'a str)> {
    defaults
        .iter()
        .copied()
        .filter(|(name, _)| !is_set(name))
        .collect()
}

/// Sets [`SOFTWARE_RENDERING`] where the environment does not say otherwise. Call it first
/// thing in the GUI path, while the process has a single thread (setting the environment races
/// with other threads reading it) and before anything opens the display.
pub fn prefer_software_rendering() {
    if !cfg!(target_os = "linux") {
        return; // the variables are GTK's and WebKitGTK's
    }
    for (name, value) in unset(SOFTWARE_RENDERING, |name| std::env::var_os(name).is_some()) {
        std::env::set_var(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_switch_is_set_when_the_environment_has_none() {
        assert_eq!(unset(SOFTWARE_RENDERING, |_| false), SOFTWARE_RENDERING);
    }

    #[test]
    fn a_variable_the_user_set_is_left_alone() {
        let left = unset(SOFTWARE_RENDERING, |name| {
            name == "WEBKIT_DISABLE_COMPOSITING_MODE"
        });
        assert_eq!(left.len(), SOFTWARE_RENDERING.len() - 1);
        assert!(left
            .iter()
            .all(|(name, _)| *name != "WEBKIT_DISABLE_COMPOSITING_MODE"));
    }

    #[test]
    fn the_process_environment_gets_the_switches_it_lacks() {
        // Its own test binary would be cleaner, but these variables are read by nothing else in
        // this one: GTK and WebKit never start in the unit tests.
        std::env::set_var("WEBKIT_DISABLE_COMPOSITING_MODE", "0");
        prefer_software_rendering();
        if cfg!(target_os = "linux") {
            assert_eq!(std::env::var("GDK_GL").as_deref(), Ok("disable"));
        }
        assert_eq!(
            std::env::var("WEBKIT_DISABLE_COMPOSITING_MODE").as_deref(),
            Ok("0"),
            "the user's value wins"
        );
    }
}
