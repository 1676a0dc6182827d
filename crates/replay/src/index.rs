//! The index beside a trace (`T.mgt` → `T.mgt.idx`): answers already
//! computed from the trace, so that asking again does not replay it.
//!
//! An answer is stored under the query that produced it, with what it was
//! computed from: the trace (its length, modification time, inode and a
//! checksum of its first and last bytes), memgap's own executable, and
//! every other file the computation read (parent traces, the programs
//! symbolized, measurements beside the trace), as noted by
//! [`memgap_trace::files::note_consulted`]. An answer is used only while
//! all of these are unchanged; the file itself is versioned and checksummed.
//! Anything else — a stale, cut, corrupt or foreign index, a symlink at its
//! name — is ignored without a word and the answer computed from the trace,
//! then saved in a new index that replaces the old one (created
//! exclusively beside it, mode 0600, then renamed; a symlink is never
//! followed). A directory that cannot be written simply gets no index.
//!
//! `MEMGAP_INDEX=off` neither reads nor writes an index.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use memgap_trace::vocabulary::env;

const MAGIC: &[u8; 8] = b"MGAPIDX\0";
/// Bumped whenever the layout of the file or of an answer changes.
const VERSION: u32 = 1;
/// Bytes at each end of the trace that go into its checksum.
const EDGE_BYTES: u64 = 64 << 10;
/// Bounds on what is read, whatever the file says.
const MAX_INDEX_BYTES: u64 = 256 << 20;
const MAX_ANSWERS: usize = 64;
const MAX_ANSWER_BYTES: u64 = 1 << 30;
const MAX_NAME_BYTES: usize = 1 << 16;
const MAX_DEPENDENCIES: usize = 1 << 16;

/// Where the index of `trace` lives.
pub fn path_of(trace: &Path) -> PathBuf {
    let mut name = trace.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".idx");
    trace.with_file_name(name)
}

/// Whether indexes are read and written (`MEMGAP_INDEX=off`: neither).
pub fn enabled() -> bool {
    std::env::var_os(env::INDEX).is_none_or(|v| v != env::INDEX_OFF)
}

/// The index of one trace as read once: answers already computed from the
/// same trace and files are looked up in it, and a new answer is added to
/// it, without reading the file again.
pub struct Opened<'a> {
    trace: &'a Path,
    /// The trace's stamp when the index is in use (`None`: it is off, or
    /// the trace cannot be read).
    stamp: Option<Stamp>,
    /// The index on disk, when it is intact and made from this trace.
    index: Option<Index>,
}

impl<'a> Opened<'a> {
    pub fn read(trace: &'a Path) -> Opened<'a> {
        let stamp = if enabled() { Stamp::of_trace(trace) } else { None };
        let index = stamp.as_ref().and_then(|stamp| Index::read(trace, stamp));
        Opened { trace, stamp, index }
    }

    /// Whether answers are read and saved (not when indexes are off or the
    /// trace cannot be read).
    pub fn in_use(&self) -> bool {
        self.stamp.is_some()
    }

    /// The answer to `query` the index holds, computed from the same trace
    /// and files; `None` when there is none (nothing is computed).
    pub fn saved(&self, query: &str) -> Option<Vec<u8>> {
        self.index.as_ref()?.lookup(query)
    }

    /// The saved answer to `query`, else `compute`d, for a computation that
    /// also yields other answers worth keeping (each under its own query),
    /// made from the same files; what was computed is saved.
    pub fn answer_keeping<E>(
        self,
        query: &str,
        compute: impl FnOnce() -> Result<(Vec<u8>, Vec<(String, Vec<u8>)>), E>,
    ) -> Result<Vec<u8>, E> {
        let Opened { trace, stamp, index } = self;
        let Some(before) = stamp else { return compute().map(|(value, _)| value) };
        if let Some(saved) = index.as_ref().and_then(|index| index.lookup(query)) {
            return Ok(saved);
        }
        memgap_trace::files::take_consulted();
        let (value, others) = compute()?;
        let consulted = memgap_trace::files::take_consulted();
        // A trace that changed meanwhile (still being recorded) is indexed next time.
        if Stamp::of_trace(trace).as_ref() == Some(&before) {
            let mut dependencies: Vec<(PathBuf, Stamp)> = Vec::new();
            let own = std::env::current_exe().ok();
            for path in own.into_iter().chain(consulted).filter(|p| p != trace) {
                if !dependencies.iter().any(|(known, _)| *known == path) {
                    let stamp = Stamp::of_file(&path);
                    dependencies.push((path, stamp));
                }
            }
            let mut index = index.unwrap_or(Index { trace: before, answers: Vec::new() });
            // The others first: the asked answer is the newest, the last dropped past the bounds.
            for (query, value) in others.iter().map(|(q, v)| (q.as_str(), v.as_slice())).chain([(query, value.as_slice())]) {
                index.answers.retain(|a| a.query != query);
                index.answers.push(Answer {
                    query: query.to_string(),
                    dependencies: dependencies.clone(),
                    value: lz4_flex::compress(value),
                    raw_len: value.len() as u64,
                });
            }
            index.write(trace);
        }
        Ok(value)
    }
}

/// What identifies a file's contents without reading it all.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Stamp {
    present: bool,
    len: u64,
    mtime_s: i64,
    mtime_ns: u32,
    device: u64,
    inode: u64,
    /// CRC-32 of the first and last bytes (the trace only).
    edges: u32,
}

impl Stamp {
    fn of_meta(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            present: true,
            len: meta.len(),
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec() as u32,
            device: meta.dev(),
            inode: meta.ino(),
            edges: 0,
        }
    }

    /// A file that is missing counts as such: one appearing later changes the answer.
    fn of_file(path: &Path) -> Stamp {
        std::fs::metadata(path).map(|meta| Stamp::of_meta(&meta)).unwrap_or_default()
    }

    fn of_trace(trace: &Path) -> Option<Stamp> {
        let file = memgap_trace::files::open_regular(trace).ok()?;
        let meta = file.metadata().ok()?;
        let mut stamp = Stamp::of_meta(&meta);
        let mut edges = vec![0u8; EDGE_BYTES.min(stamp.len) as usize];
        file.read_exact_at(&mut edges, 0).ok()?;
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&edges);
        let tail_at = stamp.len.saturating_sub(EDGE_BYTES);
        file.read_exact_at(&mut edges, tail_at).ok()?;
        hasher.update(&edges);
        stamp.edges = hasher.finalize();
        Some(stamp)
    }

    fn put(&self, out: &mut Vec<u8>) {
        out.push(u8::from(self.present));
        for value in [self.len, self.mtime_s as u64, u64::from(self.mtime_ns), self.device, self.inode, u64::from(self.edges)] {
            out.extend_from_slice(&value.to_le_bytes());
        }
    }

    fn take(input: &mut Input<'_>) -> Option<Stamp> {
        let present = match input.bytes(1)?[0] {
            0 => false,
            1 => true,
            _ => return None,
        };
        let mut values = [0u64; 6];
        for value in &mut values {
            *value = input.u64()?;
        }
        Some(Stamp {
            present,
            len: values[0],
            mtime_s: values[1] as i64,
            mtime_ns: u32::try_from(values[2]).ok()?,
            device: values[3],
            inode: values[4],
            edges: u32::try_from(values[5]).ok()?,
        })
    }
}

struct Answer {
    query: String,
    dependencies: Vec<(PathBuf, Stamp)>,
    /// LZ4 block of the answer's `raw_len` bytes.
    value: Vec<u8>,
    raw_len: u64,
}

struct Index {
    trace: Stamp,
    answers: Vec<Answer>,
}

impl Index {
    /// The index of `trace`, when it is one of ours, intact and made from
    /// this very trace (`stamp`).
    fn read(trace: &Path, stamp: &Stamp) -> Option<Index> {
        let bytes = read_own_file(&path_of(trace))?;
        let index = Index::decode(&bytes)?;
        (index.trace == *stamp).then_some(index)
    }

    fn lookup(&self, query: &str) -> Option<Vec<u8>> {
        let answer = self.answers.iter().find(|a| a.query == query)?;
        if !answer.dependencies.iter().all(|(path, stamp)| Stamp::of_file(path) == *stamp) {
            return None;
        }
        let value = lz4_flex::decompress(&answer.value, answer.raw_len as usize).ok()?;
        (value.len() as u64 == answer.raw_len).then_some(value)
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        self.trace.put(&mut out);
        out.extend_from_slice(&(self.answers.len() as u32).to_le_bytes());
        for answer in &self.answers {
            put_bytes(&mut out, answer.query.as_bytes());
            out.extend_from_slice(&(answer.dependencies.len() as u32).to_le_bytes());
            for (path, stamp) in &answer.dependencies {
                put_bytes(&mut out, path.as_os_str().as_bytes());
                stamp.put(&mut out);
            }
            out.extend_from_slice(&answer.raw_len.to_le_bytes());
            out.extend_from_slice(&(answer.value.len() as u64).to_le_bytes());
            out.extend_from_slice(&answer.value);
        }
        let checksum = crc32fast::hash(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Index> {
        let (body, checksum) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
        if crc32fast::hash(body).to_le_bytes() != checksum {
            return None;
        }
        let mut input = Input(body);
        if input.bytes(MAGIC.len())? != MAGIC || input.u32()? != VERSION {
            return None;
        }
        let trace = Stamp::take(&mut input)?;
        let count = input.u32()? as usize;
        if count > MAX_ANSWERS {
            return None;
        }
        let mut answers = Vec::with_capacity(count);
        for _ in 0..count {
            let query = String::from_utf8(input.counted(MAX_NAME_BYTES)?.to_vec()).ok()?;
            let dependency_count = input.u32()? as usize;
            if dependency_count > MAX_DEPENDENCIES {
                return None;
            }
            let mut dependencies = Vec::with_capacity(dependency_count.min(1024));
            for _ in 0..dependency_count {
                let path = PathBuf::from(std::ffi::OsStr::from_bytes(input.counted(MAX_NAME_BYTES)?));
                dependencies.push((path, Stamp::take(&mut input)?));
            }
            let raw_len = input.u64()?;
            let stored_len = input.u64()?;
            if raw_len > MAX_ANSWER_BYTES || stored_len > input.0.len() as u64 {
                return None;
            }
            let value = input.bytes(stored_len as usize)?.to_vec();
            answers.push(Answer { query, dependencies, value, raw_len });
        }
        input.0.is_empty().then_some(Index { trace, answers })
    }

    /// Saves the index beside `trace`, the oldest answers dropped past the
    /// bounds. Any failure leaves things as they were: no index is no error.
    fn write(mut self, trace: &Path) {
        let stored = |answers: &[Answer]| answers.iter().map(|a| a.value.len() as u64 + 256).sum::<u64>();
        while self.answers.len() > MAX_ANSWERS || (self.answers.len() > 1 && stored(&self.answers) > MAX_INDEX_BYTES / 2) {
            self.answers.remove(0);
        }
        if stored(&self.answers) > MAX_INDEX_BYTES / 2 {
            return;
        }
        let bytes = self.encode();
        let _ = memgap_trace::files::write_replacing(&path_of(trace), |file| file.write_all(&bytes));
    }
}

/// The bytes of `path` when it is a regular file (not a symlink: never
/// followed) of this user's that no one else may write, and not too large.
fn read_own_file(path: &Path) -> Option<Vec<u8>> {
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a NUL-terminated path; the descriptor is owned by the File.
    let fd = unsafe { libc::open(name.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened (non-negative) and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    let meta = file.metadata().ok()?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_file() || meta.uid() != me || meta.mode() & 0o022 != 0 || meta.len() > MAX_INDEX_BYTES {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_INDEX_BYTES + 1).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A cursor over the index's bytes; every read is checked.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn bytes(&mut self, count: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.0.split_at_checked(count)?;
        self.0 = rest;
        Some(taken)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }

    fn counted(&mut self, max: usize) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        if len > max {
            return None;
        }
        self.bytes(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::os::unix::fs::PermissionsExt;

    fn trace_in(dir: &Path, contents: &[u8]) -> PathBuf {
        let path = dir.join("t.mgt");
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// The saved answer to `query`, else `compute`'s; says whether it was computed.
    fn answer(trace: &Path, query: &str, compute: impl FnOnce() -> Vec<u8>) -> (String, bool) {
        let computed = Cell::new(false);
        let got = Opened::read(trace)
            .answer_keeping::<()>(query, || {
                computed.set(true);
                Ok((compute(), Vec::new()))
            })
            .unwrap();
        (String::from_utf8(got).unwrap(), computed.get())
    }

    fn ask(trace: &Path, query: &str, value: &str) -> (String, bool) {
        answer(trace, query, || value.as_bytes().to_vec())
    }

    #[test]
    fn a_second_query_is_read_from_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let trace = trace_in(dir.path(), &vec![7u8; 200_000]);
        assert_eq!(ask(&trace, "ledger gap", "first"), ("first".into(), true));
        assert_eq!(ask(&trace, "ledger gap", "other"), ("first".into(), false));
        assert_eq!(ask(&trace, "ledger peak", "peak"), ("peak".into(), true));
        assert_eq!(ask(&trace, "ledger gap", "other"), ("first".into(), false), "both kept");
        let meta = std::fs::symlink_metadata(path_of(&trace)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        assert_eq!(path_of(&trace), dir.path().join("t.mgt.idx"));
        // Nothing left over from writing it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_corrupt_index_is_ignored_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let trace = trace_in(dir.path(), b"a small trace");
        ask(&trace, "q", "right");
        let good = std::fs::read(path_of(&trace)).unwrap();
        let mut damaged: Vec<Vec<u8>> = vec![Vec::new(), good[..good.len() / 2].to_vec(), good[..good.len() - 1].to_vec()];
        for at in [0, 9, 20, good.len() / 2, good.len() - 3] {
            let mut flipped = good.clone();
            flipped[at] ^= 0x41;
            damaged.push(flipped);
        }
        for bytes in damaged {
            std::fs::write(path_of(&trace), &bytes).unwrap();
            assert_eq!(ask(&trace, "q", "right"), ("right".into(), true));
            assert_eq!(std::fs::read(path_of(&trace)).unwrap(), good, "rewritten whole");
        }
    }

    #[test]
    fn a_replaced_trace_makes_its_index_stale() {
        let dir = tempfile::tempdir().unwrap();
        let trace = trace_in(dir.path(), &vec![1u8; 300_000]);
        ask(&trace, "q", "old");
        // Same length, same name, one byte different in the middle: the
        // inode and time change with the new file.
        let mut other = vec![1u8; 300_000];
        other[150_000] = 2;
        let replacement = dir.path().join("new");
        std::fs::write(&replacement, &other).unwrap();
        std::fs::rename(&replacement, &trace).unwrap();
        assert_eq!(ask(&trace, "q", "new"), ("new".into(), true));
        assert_eq!(ask(&trace, "q", "x"), ("new".into(), false));
        // Appended to in place (a recording going on).
        std::fs::OpenOptions::new().append(true).open(&trace).unwrap().write_all(b"more").unwrap();
        assert_eq!(ask(&trace, "q", "longer"), ("longer".into(), true));
    }

    #[test]
    fn a_changed_file_the_answer_read_makes_it_stale() {
        let dir = tempfile::tempdir().unwrap();
        let trace = trace_in(dir.path(), b"trace");
        let beside = dir.path().join("t.remedies.json");
        let compute = |value: &str| {
            answer(&trace, "q", || {
                memgap_trace::files::note_consulted(&beside);
                value.as_bytes().to_vec()
            })
        };
        assert_eq!(compute("absent"), ("absent".into(), true));
        assert_eq!(compute("x"), ("absent".into(), false));
        std::fs::write(&beside, b"{}").unwrap();
        assert_eq!(compute("present"), ("present".into(), true));
    }

    #[test]
    fn a_symlink_at_the_index_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let trace = trace_in(dir.path(), b"trace");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, path_of(&trace)).unwrap();
        assert_eq!(ask(&trace, "q", "one"), ("one".into(), true));
        assert_eq!(ask(&trace, "q", "two"), ("two".into(), true), "no index through the link");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(std::fs::symlink_metadata(path_of(&trace)).unwrap().file_type().is_symlink());
        // A link to a valid index of this very trace is not read either.
        std::fs::remove_file(path_of(&trace)).unwrap();
        ask(&trace, "q", "real");
        std::fs::rename(path_of(&trace), &victim).unwrap();
        std::os::unix::fs::symlink(&victim, path_of(&trace)).unwrap();
        assert_eq!(ask(&trace, "q", "fresh"), ("fresh".into(), true));
    }

    #[test]
    fn no_index_where_none_can_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let trace = trace_in(dir.path(), b"trace");
        // A directory at the index's name: it cannot be replaced.
        std::fs::create_dir(path_of(&trace)).unwrap();
        assert_eq!(ask(&trace, "q", "one"), ("one".into(), true));
        assert_eq!(ask(&trace, "q", "two"), ("two".into(), true));
        std::fs::remove_dir(path_of(&trace)).unwrap();
        // A directory that cannot be written (root may write anyway).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
        assert_eq!(ask(&trace, "q", "three"), ("three".into(), true));
        let written = path_of(&trace).exists();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // SAFETY: geteuid cannot fail.
        assert_eq!(written, unsafe { libc::geteuid() } == 0);
    }

    #[test]
    fn an_index_others_may_write_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let trace = trace_in(dir.path(), b"trace");
        ask(&trace, "q", "one");
        std::fs::set_permissions(path_of(&trace), std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(ask(&trace, "q", "two"), ("two".into(), true));
    }
}
