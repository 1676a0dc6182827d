//! Writing to stdout without dying on a closed pipe (`memgap summary | head`).

use std::io::{ErrorKind, Write};

pub fn print(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|_| stdout.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Writes a file memgap made from a trace (a report, an export): beside its
/// target first, then renamed, so no half-written file is left; readable by
/// its owner only (mode 0600), since it holds addresses, command lines and
/// symbol names.
pub fn write_private(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::OpenOptionsExt;
    let partial = path.with_extension("partial");
    let written = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&partial)
        .and_then(|mut file| {
            // A file left by an earlier run keeps its mode on open: set it.
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            file.write_all(bytes)
        });
    written.with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("cannot write {}", path.display()))
}
