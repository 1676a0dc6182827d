//! How memgap creates, appends to and opens files, in one place, so that a
//! run in a shared directory such as /tmp cannot be turned against the
//! files of whoever runs it (often root):
//!
//! - a new file is created exclusively (`O_CREAT|O_EXCL|O_NOFOLLOW`), mode
//!   0600 whatever the umask ([`create_new`]): a name someone planted (a
//!   symlink, a file of theirs, a stale file) is refused, never followed or
//!   truncated;
//! - a file is appended to only when it is the one this run created, checked
//!   by device and inode ([`FileIdentity`], [`open_created`]);
//! - an output made in one go (a report, an export) is written to a new
//!   private file beside its name and renamed onto it ([`write_replacing`]);
//!   only a regular file of the user's own is replaced that way;
//! - names handed to other programs (the GHC RTS) point into a private
//!   directory ([`PrivateDir`], mode 0700, made with `mkdtemp`);
//! - a file to read is opened without blocking and refused unless it is a
//!   regular file ([`open_regular`]): a FIFO with no writer or a character
//!   device would otherwise hang or never end.
//!
//! Not for the agent inside a traced program, which may not allocate: it
//! uses the same flags through raw system calls.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The file a run created: its device and inode, to recognise it later
/// whatever happened to its name meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    pub device: u64,
    pub inode: u64,
}

impl FileIdentity {
    pub fn of(file: &File) -> io::Result<FileIdentity> {
        let meta = file.metadata()?;
        Ok(FileIdentity { device: meta.dev(), inode: meta.ino() })
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

fn open_raw(path: &Path, flags: libc::c_int, mode: libc::mode_t) -> io::Result<File> {
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path; the descriptor returned is owned by the File.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened (non-negative) and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Creates `path`, which must not exist (not even as a dangling symlink),
/// for writing, mode 0600 whatever the umask. An existing name fails with
/// [`io::ErrorKind::AlreadyExists`].
pub fn create_new(path: &Path) -> io::Result<(File, FileIdentity)> {
    let file = open_raw(path, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600)?;
    // The umask may have taken bits off 0600 (never added any): set it.
    // SAFETY: a descriptor we own.
    if unsafe { libc::fchmod(file.as_raw_fd(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let identity = FileIdentity::of(&file)?;
    Ok((file, identity))
}

/// Opens for reading and writing the file this run created at `path`:
/// fails unless the name still leads, without a symlink, to that very file.
pub fn open_created(path: &Path, identity: FileIdentity) -> io::Result<File> {
    let file = open_raw(path, libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0)?;
    if FileIdentity::of(&file)? != identity {
        return Err(io::Error::other("no longer the file this run created"));
    }
    Ok(file)
}

/// Opens `path` for reading, without blocking on a FIFO that has no writer,
/// and refuses anything but a regular file (a FIFO, a device, a directory).
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = open_raw(path, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("not a regular file (a {})", kind_of(&meta))));
    }
    // Reads of a regular file never block; clear the flag all the same so
    // the descriptor behaves as an ordinary one.
    // SAFETY: a descriptor we own.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    Ok(file)
}

fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_symlink() {
        "symlink"
    } else {
        "special file"
    }
}

/// Why an existing name cannot take an output, or None when it may: it does
/// not exist, or it is a regular file of the user's own (replaced whole).
pub fn replaceable(path: &Path) -> Option<String> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(_) => return None,
    };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_file() {
        return Some(format!("{} exists and is a {}, not a file memgap may replace", path.display(), kind_of(&meta)));
    }
    if meta.uid() != me {
        return Some(format!("{} exists and belongs to uid {}, not to you", path.display(), meta.uid()));
    }
    None
}

/// Random hex digits from the kernel, for names nobody can guess.
fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    // SAFETY: fills the buffer it is given.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr() as *mut libc::c_void, bytes.len(), 0) };
    if got != bytes.len() as isize {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        bytes = (now ^ (u64::from(std::process::id()) << 40)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A temporary name beside `path`: `.<name>.<random>.partial`.
fn partial_name(path: &Path) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(path.file_name().unwrap_or(OsStr::new("memgap")));
    name.push(format!(".{}.partial", random_suffix()));
    path.with_file_name(name)
}

/// Writes `path` whole: `fill` writes into a new private file beside it,
/// which is then renamed onto `path`, so no half-written file is ever seen
/// and a symlink planted at `path` is replaced, not followed. Refused (with
/// the reason) when `path` exists and is not a regular file of the user's.
pub fn write_replacing(path: &Path, fill: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<()> {
    if let Some(reason) = replaceable(path) {
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, reason));
    }
    let partial = partial_name(path);
    let (mut file, _) = create_new(&partial)?;
    let written = fill(&mut file).and_then(|()| file.flush());
    drop(file);
    let renamed = written.and_then(|()| std::fs::rename(&partial, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    renamed
}

/// A directory only its owner can enter (0700), made with `mkdtemp` under
/// a random name, and removed with what it holds when dropped.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// Makes `<parent>/<prefix>XXXXXX`.
    pub fn new_in(parent: &Path, prefix: &str) -> io::Result<PrivateDir> {
        let mut template = parent.join(format!("{prefix}XXXXXX")).into_os_string().into_vec();
        template.push(0);
        // SAFETY: a NUL-terminated template mkdtemp rewrites in place.
        let made = unsafe { libc::mkdtemp(template.as_mut_ptr() as *mut libc::c_char) };
        if made.is_null() {
            return Err(io::Error::last_os_error());
        }
        template.pop();
        Ok(PrivateDir { path: PathBuf::from(OsString::from_vec(template)) })
    }

    /// In the temporary directory ($TMPDIR, else /tmp; /dev/shm or
    /// /var/tmp when those cannot be written) whose path has no whitespace:
    /// a path that goes into a space-separated option list (GHCRTS) must
    /// not need quoting.
    pub fn in_temp_without_spaces(prefix: &str) -> io::Result<PrivateDir> {
        let mut candidates: Vec<PathBuf> = std::env::var_os("TMPDIR").filter(|t| !t.is_empty()).map(PathBuf::from).into_iter().collect();
        candidates.extend(["/tmp", "/dev/shm", "/var/tmp"].map(PathBuf::from));
        let mut last_error = io::Error::new(io::ErrorKind::NotFound, "no temporary directory without whitespace in its path");
        for parent in candidates {
            if parent.as_os_str().as_bytes().iter().any(u8::is_ascii_whitespace) || !parent.is_absolute() {
                continue;
            }
            match PrivateDir::new_in(&parent, prefix) {
                Ok(dir) => return Ok(dir),
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The files whose contents went into this process's answers besides the
/// trace asked about (parent traces, the programs symbolized, measurements
/// beside the trace): a saved answer holds only while they are unchanged.
static CONSULTED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Notes that `path` was read (or looked for: its absence counts too).
pub fn note_consulted(path: &Path) {
    if let Ok(mut consulted) = CONSULTED.lock()
        && !consulted.iter().any(|known| known == path)
    {
        consulted.push(path.to_path_buf());
    }
}

/// The files noted since the last call, and forgets them.
pub fn take_consulted() -> Vec<PathBuf> {
    CONSULTED.lock().map(|mut consulted| std::mem::take(&mut *consulted)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    /// Runs `f` with the umask at 000, as the most careless user would.
    fn under_umask_000<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: umask only changes the process's file-creation mask.
        let old = unsafe { libc::umask(0) };
        let result = f();
        // SAFETY: restores the mask read above.
        unsafe { libc::umask(old) };
        result
    }

    #[test]
    fn new_files_are_private_and_never_follow_or_reuse_a_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.mgt");
        let (mut file, identity) = under_umask_000(|| create_new(&path)).unwrap();
        file.write_all(b"mine").unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(create_new(&path).unwrap_err().kind(), io::ErrorKind::AlreadyExists);

        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let planted = dir.path().join("planted.mgt");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        assert_eq!(create_new(&planted).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        let dangling = dir.path().join("dangling.mgt");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert_eq!(create_new(&dangling).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert!(!dir.path().join("nowhere").exists());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

        // The same file is found again; another file at that name is not.
        open_created(&path, identity).unwrap();
        std::fs::rename(&victim, &path).unwrap();
        assert!(open_created(&path, identity).is_err());
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&planted, &path).unwrap();
        assert!(open_created(&path, identity).is_err());
    }

    #[test]
    fn outputs_replace_only_the_users_own_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.html");
        under_umask_000(|| write_replacing(&path, |f| f.write_all(b"one"))).unwrap();
        assert_eq!(mode(&path), 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_replacing(&path, |f| f.write_all(b"two")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(mode(&path), 0o600);

        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let planted = dir.path().join("planted.html");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let error = write_replacing(&planted, |f| f.write_all(b"x")).unwrap_err();
        assert!(error.to_string().contains("symlink"), "{error}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // A failed fill leaves nothing behind.
        let failed = dir.path().join("failed.html");
        assert!(write_replacing(&failed, |_| Err(io::Error::other("no"))).is_err());
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 3, "{left:?}");
    }

    #[test]
    fn private_directories_are_0700_and_go_away() {
        let dir = tempfile::tempdir().unwrap();
        let private = under_umask_000(|| PrivateDir::new_in(dir.path(), "memgap-")).unwrap();
        let path = private.path().to_path_buf();
        assert_eq!(mode(&path), 0o700);
        std::fs::write(path.join("inside"), b"x").unwrap();
        drop(private);
        assert!(!path.exists());
        let temp = PrivateDir::in_temp_without_spaces("memgap-test-").unwrap();
        assert!(!temp.path().as_os_str().as_bytes().iter().any(u8::is_ascii_whitespace));
    }

    #[test]
    fn special_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = c_path(&fifo).unwrap();
        // SAFETY: `c` is a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let error = open_regular(&fifo).unwrap_err();
        assert!(error.to_string().contains("FIFO"), "{error}");
        let error = open_regular(Path::new("/dev/zero")).unwrap_err();
        assert!(error.to_string().contains("character device"), "{error}");
        assert!(open_regular(dir.path()).is_err());
        let file = dir.path().join("plain");
        std::fs::write(&file, b"abc").unwrap();
        let mut text = String::new();
        open_regular(&file).unwrap().read_to_string(&mut text).unwrap();
        assert_eq!(text, "abc");
    }
}
