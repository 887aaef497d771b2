//! Where Tether keeps state on disk by default (XDG data dir), with environment overrides.

use std::path::PathBuf;

/// `$OVERRIDE_VAR`, else `$XDG_DATA_HOME/<app>`, else `~/.local/share/<app>`.
pub fn data_dir(app: &str, override_var: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(override_var).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_DATA_HOME").filter(|p| !p.is_empty()) {
        return PathBuf::from(p).join(app);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
    PathBuf::from(home).join(".local/share").join(app)
}
