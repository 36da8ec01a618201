//! The real start-on-login entry (auto-launch) against a throwaway home directory. Its own test
//! binary with a single test, because it points HOME elsewhere for the whole process.

#[cfg(target_os = "linux")]
#[test]
fn xdg_autostart_entry_is_written_and_removed() {
    use relay_desktop::autostart::{LoginItem, OsLoginItem, HIDDEN_FLAG};

    let home = std::env::temp_dir().join(format!("relay-desktop-autostart-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    // auto-launch finds ~/.config/autostart through $HOME; nothing else in this process reads it.
    std::env::set_var("HOME", &home);

    let item = OsLoginItem::new("ModelRelay", "/usr/bin/modelrelay-desktop").unwrap();
    assert_eq!(item.is_enabled(), Ok(false));
    item.set_enabled(true).unwrap();
    assert_eq!(item.is_enabled(), Ok(true));
    let entry = home.join(".config/autostart/ModelRelay.desktop");
    let text = std::fs::read_to_string(&entry).unwrap();
    assert!(text.contains("/usr/bin/modelrelay-desktop"), "{text}");
    assert!(text.contains(HIDDEN_FLAG), "{text}");
    item.set_enabled(false).unwrap();
    assert_eq!(item.is_enabled(), Ok(false));
    assert!(!entry.exists());
    let _ = std::fs::remove_dir_all(&home);
}
