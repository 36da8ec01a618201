//! The real stack the end-to-end tests drive, built once outside the checkout by
//! `scripts/real-clients.sh` (which runs `../shared/tools/realstack/setup.sh`) into `$REALSTACK`
//! (default `~/.cache/modelrelay-realstack`): `bin/llama-server`, `models/tiny-random-llama.gguf`
//! (27 MB, random weights, the real Qwen2 tokenizer and chat template) and the real Claude Code
//! in `claude-code/`. Building takes minutes, so tests never build it: without it each test
//! prints why it is skipped and passes.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;

/// The built stack.
pub struct Stack {
    pub llama_server: PathBuf,
    pub model: PathBuf,
    /// The `claude` command, where installed.
    pub claude: Option<PathBuf>,
}

/// Where the stack lives.
pub fn root() -> PathBuf {
    std::env::var_os("REALSTACK")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/modelrelay-realstack"))
        })
        .unwrap_or_else(|| PathBuf::from(".cache/modelrelay-realstack"))
}

/// The stack, or `None` after printing why `test` is skipped. With `needs_claude`, Claude Code
/// must be there too.
pub fn stack(test: &str, needs_claude: bool) -> Option<Stack> {
    let root = root();
    let claude = root.join("claude-code/node_modules/.bin/claude");
    let stack = Stack {
        llama_server: root.join("bin/llama-server"),
        model: root.join("models/tiny-random-llama.gguf"),
        claude: claude.is_file().then_some(claude),
    };
    if stack.llama_server.is_file()
        && stack.model.is_file()
        && (!needs_claude || stack.claude.is_some())
    {
        return Some(stack);
    }
    // Straight to stderr, past the test harness's capture, so the skip is visible.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: no real stack in {} (needs bin/llama-server, \
         models/tiny-random-llama.gguf{}; make it once with scripts/real-clients.sh, \
         about 7 minutes, or point $REALSTACK at a built stack)",
        root.display(),
        if needs_claude {
            " and claude-code/"
        } else {
            ""
        }
    );
    None
}
