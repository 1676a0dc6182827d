//! The trace files of one `memgap run`: the top process's trace is created
//! by memgap itself, exclusively, before the program starts (a name already
//! taken is refused then, and the program never runs), and what memgap adds
//! after the run goes only into files this run made: the top trace checked by
//! device and inode, the others by their owner and this run's id.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use memgap_trace::files::{self, FileIdentity};
use memgap_trace::framing::{self, FileHeader};
use memgap_trace::records::Record;

use crate::sys::pipe;

/// The top trace's name, made before the program runs.
pub enum Reservation {
    /// The name has no `%p`: memgap made the file already.
    Made { path: PathBuf, identity: FileIdentity },
    /// The name holds the pid: the child makes it between fork and exec and
    /// reports its pid and the file's identity through this pipe.
    InChild { report: OwnedFd, write_end: OwnedFd },
}

/// Why the top trace could not be made: one line for the user.
pub fn refusal(path: &Path, error: &io::Error) -> String {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return format!("{} is a directory: -o names the trace file (say {}/trace.mgt)", path.display(), path.display());
    }
    match error.kind() {
        io::ErrorKind::AlreadyExists => format!(
            "{} already exists: memgap writes a trace only into a new file (never over, nor through, an existing name); remove it or choose another -o",
            path.display()
        ),
        _ => format!("cannot create the trace {}: {}", path.display(), plain(error)),
    }
}

/// Refuses, before the program starts, outputs the run will write beside
/// its trace (the report, the kept eventlog) whose names are taken by
/// something memgap may not replace. Names holding the pid are only known
/// later: they are checked when written.
pub fn outputs_free(pattern: &Path, outputs: &[PathBuf]) -> Result<(), String> {
    if pattern.as_os_str().as_bytes().windows(2).any(|w| w == b"%p") {
        return Ok(());
    }
    match outputs.iter().find_map(|path| files::replaceable(path)) {
        Some(reason) => Err(reason),
        None => Ok(()),
    }
}

/// The system's message without Rust's "(os error N)".
fn plain(error: &io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Makes the top trace's file, or arranges for the child to make it before
/// it runs anything. The trace's directory must exist.
pub fn reserve(command: &mut Command, pattern: &Path) -> Result<Reservation, String> {
    let dir = pattern.parent().unwrap_or(Path::new("."));
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(format!("cannot create the trace {}: {} is not a directory", pattern.display(), dir.display())),
        Err(error) => return Err(format!("cannot create the trace {}: {}: {}", pattern.display(), dir.display(), plain(&error))),
    }
    let bytes = pattern.as_os_str().as_bytes();
    if !bytes.windows(2).any(|w| w == b"%p") {
        return match files::create_new(pattern) {
            Ok((_, identity)) => Ok(Reservation::Made { path: pattern.to_path_buf(), identity }),
            Err(error) => Err(refusal(pattern, &error)),
        };
    }
    let (read, write) = pipe().map_err(|e| format!("cannot start: {e}"))?;
    // Everything the child needs is allocated here: between fork and exec
    // it may only call async-signal-safe functions.
    let pieces = split_at_pid(bytes);
    let mut path = Vec::with_capacity(bytes.len() + 16 * pieces.len() + 1);
    let write_fd = write.as_raw_fd();
    // SAFETY: only getpid, open, fchmod, fstat, write and close run in the child.
    unsafe {
        command.pre_exec(move || {
            let pid = libc::getpid();
            path.clear();
            let mut digits = [0u8; 10];
            let mut n = pid as u32;
            let mut start = digits.len();
            loop {
                start -= 1;
                digits[start] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            for (i, piece) in pieces.iter().enumerate() {
                if i > 0 {
                    path.extend_from_slice(&digits[start..]);
                }
                path.extend_from_slice(piece);
            }
            path.push(0);
            libc::write(write_fd, &pid as *const i32 as *const libc::c_void, 4);
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            let fd = libc::open(path.as_ptr() as *const libc::c_char, flags, 0o600 as libc::c_uint);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut stat: libc::stat = std::mem::zeroed();
            let made = libc::fchmod(fd, 0o600) == 0 && libc::fstat(fd, &mut stat) == 0;
            let error = io::Error::last_os_error();
            libc::close(fd);
            if !made {
                return Err(error);
            }
            let identity = [stat.st_dev, stat.st_ino];
            libc::write(write_fd, identity.as_ptr() as *const libc::c_void, 16);
            Ok(())
        });
    }
    Ok(Reservation::InChild { report: read, write_end: write })
}

/// The pattern's text around each `%p`: joined with the pid between them,
/// they make the trace's name.
fn split_at_pid(pattern: &[u8]) -> Vec<Vec<u8>> {
    let mut pieces = vec![Vec::new()];
    let mut i = 0;
    while i < pattern.len() {
        if pattern[i..].starts_with(b"%p") {
            pieces.push(Vec::new());
            i += 2;
        } else {
            pieces.last_mut().expect("never empty").push(pattern[i]);
            i += 1;
        }
    }
    pieces
}

/// What the child reported: its pid (when it got that far) and the
/// identity of the file it made (when it made it). Call after spawn
/// returned: the child has written all it will (or exec'd, closing its end).
fn child_report(report: OwnedFd, write_end: OwnedFd) -> (Option<u32>, Option<FileIdentity>) {
    drop(write_end);
    let mut file = File::from(report);
    let mut bytes = Vec::new();
    let _ = io::Read::read_to_end(&mut file, &mut bytes);
    let pid = bytes.get(0..4).map(|b| i32::from_ne_bytes(b.try_into().unwrap()) as u32);
    let identity = bytes.get(4..20).map(|b| FileIdentity {
        device: u64::from_ne_bytes(b[0..8].try_into().unwrap()),
        inode: u64::from_ne_bytes(b[8..16].try_into().unwrap()),
    });
    (pid, identity)
}

impl Reservation {
    /// After `spawn` failed: the line to print when the failure was the
    /// trace's (the program never started), else None (the program itself
    /// could not start; the empty trace made for it is removed).
    pub fn spawn_failed(self, error: &io::Error, trace_path: impl Fn(u32) -> PathBuf) -> Option<String> {
        match self {
            Reservation::Made { path, identity } => {
                remove_if_still(&path, identity);
                None
            }
            Reservation::InChild { report, write_end } => match child_report(report, write_end) {
                (Some(pid), None) => Some(refusal(&trace_path(pid), error)),
                (Some(pid), Some(identity)) => {
                    remove_if_still(&trace_path(pid), identity);
                    None
                }
                (None, _) => None,
            },
        }
    }

    /// After the program started: the top trace and its identity.
    pub fn started(self) -> Option<FileIdentity> {
        match self {
            Reservation::Made { identity, .. } => Some(identity),
            Reservation::InChild { report, write_end } => child_report(report, write_end).1,
        }
    }
}

fn remove_if_still(path: &Path, identity: FileIdentity) {
    if files::open_created(path, identity).is_ok() {
        let _ = std::fs::remove_file(path);
    }
}

/// The run id in a trace's header; None for a file that is not a trace.
pub fn run_id_of(path: &Path) -> Option<u64> {
    let mut header = [0u8; framing::FILE_HEADER_LEN];
    File::open(path).and_then(|mut f| io::Read::read_exact(&mut f, &mut header)).ok()?;
    FileHeader::decode(&header).ok().map(|h| h.run_id)
}

/// Every trace in `dir` that run `run_id` wrote (each process of the run
/// writes its own, beside the top one), sorted by name.
pub fn of_run(dir: &Path, run_id: u64) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "mgt") && run_id_of(path) == Some(run_id))
        .collect();
    found.sort();
    found
}

/// The traces of one run, for what memgap adds to them after the run.
pub struct RunTraces<'a> {
    pub pattern: &'a Path,
    pub run_id: u64,
    pub top_pid: u32,
    pub top_identity: Option<FileIdentity>,
}

impl RunTraces<'_> {
    pub fn path(&self, pid: u32) -> PathBuf {
        trace_path(self.pattern, pid, pid == self.top_pid)
    }

    /// The trace of `pid` opened to add to it, when it is a trace this run
    /// wrote: the top one is the very file memgap made (device and inode);
    /// another is a regular file of the user's holding this run's id. None
    /// for anything else (a name someone planted, another run's trace).
    pub fn open(&self, pid: u32) -> Option<(PathBuf, File)> {
        let path = self.path(pid);
        let file = if pid == self.top_pid {
            files::open_created(&path, self.top_identity?).ok()?
        } else {
            let file = File::options().read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&path).ok()?;
            let meta = file.metadata().ok()?;
            // SAFETY: geteuid cannot fail.
            if !meta.file_type().is_file() || meta.uid() != unsafe { libc::geteuid() } {
                return None;
            }
            file
        };
        let mut header = [0u8; framing::FILE_HEADER_LEN];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut header, 0).ok()?;
        (FileHeader::decode(&header).ok()?.run_id == self.run_id).then_some((path, file))
    }

    /// Removes the top trace memgap made when nothing was written into it
    /// (the agent was not loaded, or refused to record).
    pub fn remove_empty_top(&self) {
        let Some(identity) = self.top_identity else { return };
        let path = self.path(self.top_pid);
        if files::open_created(&path, identity).and_then(|f| f.metadata()).is_ok_and(|m| m.len() == 0) {
            let _ = std::fs::remove_file(&path);
        }
    }

    /// Appends records to the trace of `pid`, in chunks of about 1 MiB, when
    /// that trace is this run's: `Ok(false)` when it is not (a process that
    /// was not followed has none); `Err` says why the file could not take them.
    pub fn append<'a>(&self, pid: u32, records: impl IntoIterator<Item = Record<'a>>) -> Result<bool, String> {
        let Some((path, mut file)) = self.open(pid) else { return Ok(false) };
        memgap_trace::records::append_records_to(&mut file, &path, records).map(|()| true).map_err(|e| e.to_string())
    }
}

/// The trace of process `pid`, named as the agent names it: `%p` becomes the
/// pid; without `%p` the pattern names the top process and others insert
/// their pid before the extension (`t.mgt` → `t.4242.mgt`).
pub fn trace_path(pattern: &Path, pid: u32, top: bool) -> PathBuf {
    let text = pattern.to_string_lossy();
    if text.contains("%p") || top {
        return PathBuf::from(text.replace("%p", &pid.to_string()));
    }
    let stem = pattern.file_stem().unwrap_or_default().to_string_lossy();
    let name = match pattern.extension() {
        Some(ext) if !stem.is_empty() => format!("{stem}.{pid}.{}", ext.to_string_lossy()),
        _ => format!("{}.{pid}", pattern.file_name().unwrap_or_default().to_string_lossy()),
    };
    pattern.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_goes_where_each_percent_p_stands() {
        let join = |pattern: &str, pid: &str| split_at_pid(pattern.as_bytes()).join(pid.as_bytes());
        assert_eq!(join("/t/memgap-sh.%p.mgt", "42"), b"/t/memgap-sh.42.mgt");
        assert_eq!(join("/t/%p-%p%%.mgt", "7"), b"/t/7-7%%.mgt");
        assert_eq!(join("/t/a%", "7"), b"/t/a%");
        assert_eq!(join("%p", "7"), b"7");
    }
}
