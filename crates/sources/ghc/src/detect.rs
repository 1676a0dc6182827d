//! Is a command a GHC-compiled program, and will its RTS write an eventlog
//! for us? Decided from the binary's bytes (RTS symbols and strings) and by
//! asking the RTS itself: `PROG +RTS -l -ol/dev/null --info -RTS` prints
//! the RTS's facts and exits before `main` runs. The RTS complains on
//! stderr when `-l` needs an `-eventlog` build or when RTS options are
//! disabled (`-rtsopts=none`, or `ignore`), and then memgap must not set
//! GHCRTS: the program would print a warning it never printed before.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A statically linked RTS carries its entry point `hs_init_ghc` and the
/// `--info` key `GHC RTS`; a program linked against the shared RTS names
/// `libHSrts` among its needed libraries.
const MARKERS: &[(&[u8], &[u8])] = &[(b"hs_init_ghc", b"GHC RTS"), (b"libHSrts", b"hs_main")];

/// Whether the file at `path` looks like a GHC-compiled program.
pub fn is_ghc_binary(path: &Path) -> bool {
    let Ok(mut file) = std::fs::File::open(path) else { return false };
    let mut head = [0u8; 4];
    if file.read_exact(&mut head).is_err() || &head != b"\x7fELF" {
        return false;
    }
    // SAFETY: read-only map of a program file; a concurrent rewrite could
    // only change what is found, and the map is dropped before returning.
    let Ok(bytes) = (unsafe { memmap2::Mmap::map(&file) }) else { return false };
    let has = |needle: &[u8]| memchr::memmem::find(&bytes, needle).is_some();
    MARKERS.iter().any(|&(a, b)| has(a) && has(b))
}

/// A command name as the shell would find it.
pub fn resolve_command(name: &Path) -> Option<PathBuf> {
    if name.components().count() > 1 {
        return name.is_file().then(|| name.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// What the RTS said about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RtsSupport {
    /// `-l` is accepted: GHCRTS can turn the eventlog on.
    Eventlog { ghc_version: String, rts_way: String },
    /// The RTS refused: build with `-rtsopts -eventlog`. `reason` is the RTS's first line.
    Refused { reason: String },
}

/// Asks the program's RTS (see the module comment). At most `timeout`.
pub fn probe(program: &Path, timeout: Duration) -> RtsSupport {
    let child = Command::new(program)
        .args(["+RTS", "-l", "-ol/dev/null", "--info", "-RTS"])
        .env_remove("GHCRTS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => return RtsSupport::Refused { reason: error.to_string() },
    };
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() < timeout => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    let Some(status) = status else { return RtsSupport::Refused { reason: "the program did not answer `+RTS --info`".into() } };
    let field = |key: &str| {
        let needle = format!("(\"{key}\", \"");
        let at = stdout.find(&needle)? + needle.len();
        Some(stdout[at..].split('"').next()?.to_string())
    };
    let complaint = stderr.lines().map(str::trim).find(|l| !l.is_empty());
    match (status.success(), field("GHC RTS"), complaint) {
        (true, Some(_), None) => RtsSupport::Eventlog { ghc_version: field("GHC version").unwrap_or_default(), rts_way: field("RTS way").unwrap_or_default() },
        (_, _, Some(line)) => RtsSupport::Refused { reason: line.to_string() },
        _ => RtsSupport::Refused { reason: "the program did not answer `+RTS --info`".into() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_programs_are_not_ghc_programs() {
        assert!(!is_ghc_binary(Path::new("/bin/sh")));
        assert!(!is_ghc_binary(Path::new("/nonexistent")));
        assert!(!is_ghc_binary(Path::new("/etc/passwd")));
    }

    #[test]
    fn a_program_that_is_no_rts_is_refused() {
        match probe(Path::new("/bin/true"), Duration::from_secs(5)) {
            RtsSupport::Refused { .. } => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn resolves_through_path() {
        assert!(resolve_command(Path::new("sh")).is_some());
        assert_eq!(resolve_command(Path::new("./no-such-program")), None);
    }
}
