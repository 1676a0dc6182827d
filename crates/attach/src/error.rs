//! What can go wrong reading or tracing another process, each said so a
//! person knows what to do; and why the kernel refused, when it did.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("no process {0}")]
    NoProcess(u32),
    #[error("process {0} has exited (a zombie waiting for its parent)")]
    Zombie(u32),
    /// The kernel refused to let us read or trace the process; `cause` says why.
    #[error("cannot {action} process {pid}: {cause}")]
    NotPermitted { pid: u32, action: &'static str, cause: String },
    #[error("process {pid} does not use glibc's malloc ({library} is loaded): malloc_trim would return nothing")]
    NotGlibc { pid: u32, library: String },
    #[error("process {0} has no libc.so.6 mapped (statically linked, a Go binary?): memgap trim needs glibc's malloc from a shared libc")]
    Static(u32),
    /// A state of the process in which memgap will not touch it.
    #[error("process {pid} {state}")]
    Unsuitable { pid: u32, state: String },
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{0}")]
    Failed(String),
}

impl AttachError {
    /// An I/O error on a /proc file of `pid`, turned into what it means.
    pub fn from_proc(pid: u32, action: &'static str, path: &str, error: io::Error) -> AttachError {
        match error.kind() {
            io::ErrorKind::NotFound if !std::path::Path::new(&format!("/proc/{pid}")).exists() => AttachError::NoProcess(pid),
            io::ErrorKind::PermissionDenied => AttachError::NotPermitted { pid, action, cause: permission_cause(pid) },
            _ => AttachError::Io { path: path.to_string(), source: error },
        }
    }
}

/// CAP_SYS_PTRACE's bit in the capability sets.
const CAP_SYS_PTRACE: u32 = 19;

/// Why the kernel refuses to let this process trace (or read the memory
/// map of) `pid`: yama's ptrace_scope, another user, a tracer already
/// attached, or a process that is not dumpable.
pub fn permission_cause(pid: u32) -> String {
    let own = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let target = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let privileged =
        field(&own, "CapEff").and_then(|caps| u64::from_str_radix(caps, 16).ok()).is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0);
    let uid =
        |status: &str| field(status, "Uid").map(|uids| uids.split_whitespace().map(str::to_string).collect::<Vec<_>>()).unwrap_or_default();
    let (own_uid, target_uids) = (uid(&own), uid(&target));
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok().and_then(|s| s.trim().parse::<u32>().ok());
    let tracer = field(&target, "TracerPid").unwrap_or("0");
    let me = own_uid.get(1).map_or("?", String::as_str);
    if tracer != "0" {
        return format!("it is already traced by process {tracer} (a debugger?); detach it first");
    }
    if scope == Some(3) {
        return "kernel.yama.ptrace_scope is 3: ptrace is disabled until the next reboot".to_string();
    }
    if scope == Some(2) && !privileged {
        return format!("kernel.yama.ptrace_scope is 2: only root (CAP_SYS_PTRACE) may trace; memgap runs as uid {me}");
    }
    let other_user = !target_uids.is_empty() && target_uids.iter().take(3).any(|u| Some(u) != own_uid.first());
    if other_user && !privileged {
        let owner = target_uids.first().map_or("?", String::as_str);
        let remedy = if owner == "0" { "run memgap as root".to_string() } else { format!("run memgap as uid {owner} or as root") };
        return format!("it belongs to uid {owner} and memgap runs as uid {me} without CAP_SYS_PTRACE; {remedy}");
    }
    if scope == Some(1) && !privileged {
        return "kernel.yama.ptrace_scope is 1: only a parent may trace its children; run memgap as root, or set kernel.yama.ptrace_scope=0".to_string();
    }
    if !privileged {
        return "it is not dumpable (setuid, or prctl(PR_SET_DUMPABLE, 0)) or a security module refuses; run memgap as root".to_string();
    }
    "the kernel refused even with CAP_SYS_PTRACE (a security module, or the process lives in a parent user namespace)".to_string()
}

/// The value of `Key:` in a /proc status file.
pub(crate) fn field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|line| line.strip_prefix(key)?.strip_prefix(':').map(str::trim))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_status_fields() {
        let status = "Name:\tcat\nUid:\t1000\t1000\t1000\t1000\nTracerPid:\t0\n";
        assert_eq!(field(status, "Uid"), Some("1000\t1000\t1000\t1000"));
        assert_eq!(field(status, "TracerPid"), Some("0"));
        assert_eq!(field(status, "Tracer"), None);
    }

    #[test]
    fn a_missing_process_is_no_process() {
        let error = AttachError::from_proc(u32::MAX, "read", "/proc/x/smaps", io::Error::from(io::ErrorKind::NotFound));
        assert!(matches!(error, AttachError::NoProcess(_)), "{error}");
    }
}
