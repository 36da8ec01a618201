//! The control plane: DNS rebinding (`Host`), cross-site requests (`Origin`,
//! `Sec-Fetch-Site`), and the settings that need the admin token even on loopback.
