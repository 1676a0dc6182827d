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
    let answer = ask_rts(program, &["+RTS", "-l", "-ol/dev/null", "--info", "-RTS"], None, timeout);
    match answer {
        Err(reason) => RtsSupport::Refused { reason },
        Ok(RtsAnswer { success: true, complaint: None, stdout }) if info_field(&stdout, "GHC RTS").is_some() => RtsSupport::Eventlog {
            ghc_version: info_field(&stdout, "GHC version").unwrap_or_default(),
            rts_way: info_field(&stdout, "RTS way").unwrap_or_default(),
        },
        Ok(RtsAnswer { complaint: Some(line), .. }) => RtsSupport::Refused { reason: line },
        Ok(_) => RtsSupport::Refused { reason: "the program did not answer `+RTS --info`".into() },
    }
}

/// Whether the program's RTS takes `--numa` from GHCRTS (after the
/// user's own `ghcrts`), as `memgap compare`'s ghc-numa configuration sets
/// it: GHCRTS is read before the command line, so `PROG +RTS --info -RTS`
/// answers only once `--numa` was accepted, before `main` runs. Err: the
/// RTS's complaint (an RTS built without NUMA support says so).
pub fn probe_numa(program: &Path, ghcrts: Option<&str>, timeout: Duration) -> Result<(), String> {
    let flags = match ghcrts.map(str::trim).filter(|flags| !flags.is_empty()) {
        Some(flags) => format!("{flags} --numa"),
        None => "--numa".to_string(),
    };
    match ask_rts(program, &["+RTS", "--info", "-RTS"], Some(&flags), timeout)? {
        RtsAnswer { complaint: Some(line), .. } => Err(line),
        RtsAnswer { success: true, stdout, .. } if info_field(&stdout, "GHC RTS").is_some() => Ok(()),
        _ => Err("the program did not answer `+RTS --info`".into()),
    }
}

struct RtsAnswer {
    success: bool,
    stdout: String,
    /// The first line the RTS wrote on stderr.
    complaint: Option<String>,
}

/// Runs the program with `args` (and GHCRTS set to `ghcrts`, or removed),
/// stdin empty, for at most `timeout`; Err when it could not start or did
/// not end in time.
fn ask_rts(program: &Path, args: &[&str], ghcrts: Option<&str>, timeout: Duration) -> Result<RtsAnswer, String> {
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    match ghcrts {
        Some(flags) => command.env("GHCRTS", flags),
        None => command.env_remove("GHCRTS"),
    };
    let mut child = command.spawn().map_err(|error| error.to_string())?;
    // Read while it runs: a program that writes more than a pipe holds
    // must not stall until the timeout.
    let readers = [
        child.stdout.take().map(|mut out| std::thread::spawn(move || read_all(&mut out))),
        child.stderr.take().map(|mut err| std::thread::spawn(move || read_all(&mut err))),
    ];
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
    let [stdout, stderr] = readers.map(|reader| reader.and_then(|r| r.join().ok()).unwrap_or_default());
    let Some(status) = status else { return Err(format!("the program did not answer `{}`", args.join(" "))) };
    Ok(RtsAnswer { success: status.success(), stdout, complaint: stderr.lines().map(str::trim).find(|l| !l.is_empty()).map(String::from) })
}

/// At most 1 MiB of what a pipe gives.
fn read_all(pipe: &mut impl Read) -> String {
    let mut bytes = Vec::new();
    let _ = pipe.take(1 << 20).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A value of `+RTS --info`'s list: `("KEY", "VALUE")`.
fn info_field(stdout: &str, key: &str) -> Option<String> {
    let needle = format!("(\"{key}\", \"");
    let at = stdout.find(&needle)? + needle.len();
    Some(stdout[at..].split('"').next()?.to_string())
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
    fn a_program_that_is_no_rts_takes_no_numa() {
        assert!(probe_numa(Path::new("/bin/true"), None, Duration::from_secs(5)).is_err());
        assert!(probe_numa(Path::new("/nonexistent/prog"), Some("-N2"), Duration::from_secs(5)).is_err());
    }

    #[test]
    fn resolves_through_path() {
        assert!(resolve_command(Path::new("sh")).is_some());
        assert_eq!(resolve_command(Path::new("./no-such-program")), None);
    }
}
