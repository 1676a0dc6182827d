//! The memory cgroup of a process: its usage, its limit (the lowest on the
//! way up to the root) and what the usage is made of.
//!
//! /proc/PID/cgroup gives the cgroup's path, relative to our cgroup
//! namespace; our /proc/self/mountinfo says where that hierarchy is
//! mounted. The unified hierarchy (v2: memory.current, memory.max,
//! memory.stat, memory.events) is used when it has the memory controller,
//! else the v1 memory controller (memory.usage_in_bytes,
//! memory.limit_in_bytes, memory.stat).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memgap_types::outside::CgroupMemory;

/// v1 reports "no limit" as the largest page-aligned i64.
const V1_UNLIMITED: u64 = 1 << 62;

/// memory.stat keys kept (v2 names), and their v1 equivalents.
const STAT_KEYS: [(&str, &str); 8] = [
    ("anon", "total_rss"),
    ("file", "total_cache"),
    ("shmem", "total_shmem"),
    ("file_mapped", "total_mapped_file"),
    ("kernel", ""),
    ("sock", ""),
    ("slab", ""),
    ("swap", "total_swap"),
];

/// A cgroup filesystem mount: where, which version, and which cgroup is its root.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub point: PathBuf,
    pub root: String,
    pub version: u8,
    /// v1: the controllers it holds (super options), e.g. "rw,memory".
    pub options: String,
}

/// The memory cgroup of `pid`, or None when it is in none with memory
/// accounting (or the hierarchy is not mounted here).
pub fn of_process(pid: u32) -> Option<CgroupMemory> {
    let membership = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mounts = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").ok()?);
    find(&membership, &mounts)
}

pub fn find(membership: &str, mounts: &[Mount]) -> Option<CgroupMemory> {
    let path_of = |matches: &dyn Fn(&str) -> bool| {
        membership.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            matches(controllers).then(|| path.to_string())
        })
    };
    let v2 = path_of(&|c: &str| c.is_empty()).and_then(|path| {
        let mount = mounts.iter().find(|m| m.version == 2)?;
        read(mount, &path, 2)
    });
    v2.or_else(|| {
        let path = path_of(&|c: &str| c.split(',').any(|c| c == "memory"))?;
        let mount = mounts.iter().find(|m| m.version == 1 && m.options.split(',').any(|o| o == "memory"))?;
        read(mount, &path, 1)
    })
}

/// The figures of cgroup `path` under `mount`; None if it has no memory files.
fn read(mount: &Mount, path: &str, version: u8) -> Option<CgroupMemory> {
    // Paths are relative to our cgroup namespace; the mount may show a subtree.
    let relative = path.strip_prefix(mount.root.trim_end_matches('/')).unwrap_or(path);
    let dir = mount.point.join(relative.trim_start_matches('/'));
    let (usage, limit, events) = if version == 2 {
        ("memory.current", "memory.max", "memory.events")
    } else {
        ("memory.usage_in_bytes", "memory.limit_in_bytes", "memory.oom_control")
    };
    let current_bytes = number(&dir.join(usage))?;
    let mut memory = CgroupMemory { version, path: path.to_string(), current_bytes, ..CgroupMemory::default() };
    // The effective limit is the lowest on the way up.
    let mut level = dir.clone();
    loop {
        if let Some(max) = number(&level.join(limit)).filter(|&max| version == 2 || max < V1_UNLIMITED)
            && memory.max_bytes.is_none_or(|lowest| max < lowest)
        {
            memory.max_bytes = Some(max);
            let below_mount = level.strip_prefix(&mount.point).unwrap_or(Path::new(""));
            memory.limit_path = Some(cgroup_path(&mount.root, below_mount));
        }
        if level == mount.point || !level.pop() {
            break;
        }
    }
    let stat = key_values(&dir.join("memory.stat"));
    for (v2_key, v1_key) in STAT_KEYS {
        let key = if version == 2 { v2_key } else { v1_key };
        if let Some(&value) = stat.get(key).filter(|_| !key.is_empty()) {
            memory.stat.insert(v2_key.to_string(), value);
        }
    }
    memory.oom_kills = key_values(&dir.join(events)).get("oom_kill").copied();
    Some(memory)
}

/// The cgroup path of a directory `below` a mount of cgroup `root`.
fn cgroup_path(root: &str, below: &Path) -> String {
    let path = format!("{}/{}", root.trim_end_matches('/'), below.display());
    if path.len() > 1 { path.trim_end_matches('/').to_string() } else { path }
}

/// A file holding one number; "max" (v2's no limit) and anything else unreadable is None.
fn number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `key value` lines (memory.stat, memory.events).
fn key_values(path: &Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(|line| line.split_once(' ')).filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?))).collect()
}

/// The cgroup mounts in /proc/self/mountinfo:
/// `ID PARENT MAJ:MIN ROOT POINT OPTIONS [TAGS…] - FSTYPE SOURCE SUPER_OPTIONS`.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let mut after = after.split(' ');
            let version = match after.next()? {
                "cgroup2" => 2,
                "cgroup" => 1,
                _ => return None,
            };
            let options = after.nth(1).unwrap_or("").to_string();
            Some(Mount { point: PathBuf::from(unescape(fields.get(4)?)), root: unescape(fields.get(3)?), version, options })
        })
        .collect()
}

/// mountinfo escapes spaces and the like as \040 (octal).
fn unescape(field: &str) -> String {
    let mut out = String::new();
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        match rest.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok()) {
            Some(byte) => {
                out.push(byte as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out + rest
}

/// A cgroup of the unified (v2) hierarchy, named on a command line.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedCgroup {
    /// Its directory, under the cgroup2 mount.
    pub dir: PathBuf,
    /// Its path as /proc/PID/cgroup shows it (`/system.slice/app.service`).
    pub path: String,
    mount: Mount,
}

/// The v2 cgroup `name`: its directory (`/sys/fs/cgroup/system.slice/app.service`)
/// or its path as /proc/PID/cgroup shows it (`/system.slice/app.service`).
pub fn v2_named(name: &str) -> Result<NamedCgroup, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let mount =
        parse_mountinfo(&mountinfo).into_iter().find(|m| m.version == 2).ok_or("no cgroup v2 (unified) hierarchy is mounted here")?;
    named_under(name, mount)
}

fn named_under(name: &str, mount: Mount) -> Result<NamedCgroup, String> {
    let given = Path::new(name);
    let dir = match given.strip_prefix(&mount.point) {
        Ok(_) => given.to_path_buf(),
        Err(_) => {
            let relative = name.strip_prefix(mount.root.trim_end_matches('/')).unwrap_or(name);
            mount.point.join(relative.trim_start_matches('/'))
        }
    };
    if !dir.join("cgroup.procs").is_file() {
        return Err(format!("{name} is not a cgroup v2 directory (no {})", dir.join("cgroup.procs").display()));
    }
    let below = dir.strip_prefix(&mount.point).unwrap_or(Path::new(""));
    Ok(NamedCgroup { path: cgroup_path(&mount.root, below), dir, mount })
}

impl NamedCgroup {
    /// Its memory figures now (limit, usage, OOM kills); None once it is gone
    /// or when it is the root, which has no memory.current.
    pub fn memory(&self) -> Option<CgroupMemory> {
        read(&self.mount, &self.path, 2)
    }

    /// The processes in it and in the cgroups below it.
    pub fn processes(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        let mut dirs = vec![self.dir.clone()];
        while let Some(dir) = dirs.pop() {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|line| line.trim().parse::<u32>().ok()));
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            dirs.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write(dir: &Path, name: &str, text: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn parses_mountinfo() {
        let text = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
41 31 0:38 /docker/abc /sys/fs/cgroup/my\\040unified rw,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 2);
        assert_eq!((mounts[0].version, mounts[0].options.as_str()), (1, "rw,memory"));
        assert_eq!(
            (mounts[1].point.to_str().unwrap(), mounts[1].root.as_str(), mounts[1].version),
            ("/sys/fs/cgroup/my unified", "/docker/abc", 2)
        );
    }

    #[test]
    fn v2_limit_set_on_an_ancestor() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let service = root.join("system.slice/app.service");
        write(&root.join("system.slice"), "memory.max", "1073741824\n");
        write(&service, "memory.max", "max\n");
        write(&service, "memory.current", "805306368\n");
        write(&service, "memory.stat", "anon 700000000\nfile 100000000\nkernel 5000000\nsock 0\nshmem 0\nfile_mapped 1000\npgfault 12\n");
        write(&service, "memory.events", "low 0\nhigh 0\nmax 3\noom 0\noom_kill 1\n");
        let mounts = [Mount { point: root.to_path_buf(), root: "/".into(), version: 2, options: String::new() }];
        let memory = find("0::/system.slice/app.service\n", &mounts).expect("a cgroup");
        assert_eq!((memory.version, memory.current_bytes, memory.max_bytes), (2, 805306368, Some(1 << 30)));
        assert_eq!(memory.limit_path.as_deref(), Some("/system.slice"));
        assert_eq!(memory.stat.get("anon"), Some(&700000000));
        assert!(!memory.stat.contains_key("pgfault"));
        assert_eq!(memory.oom_kills, Some(1));
    }

    #[test]
    fn v2_unlimited_and_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(&root.join("a"), "memory.max", "max\n");
        write(&root.join("a"), "memory.current", "4096\n");
        let mounts = [Mount { point: root.to_path_buf(), root: "/".into(), version: 2, options: String::new() }];
        let memory = find("0::/a\n", &mounts).expect("a cgroup");
        assert_eq!((memory.current_bytes, memory.max_bytes, memory.limit_path), (4096, None, None));
        // The root cgroup has no memory.current; a cgroup that is gone neither.
        assert_eq!(find("0::/\n", &mounts), None);
        assert_eq!(find("0::/gone\n", &mounts), None);
        assert_eq!(find("", &mounts), None);
        assert_eq!(find("0::/a\n", &[]), None);
    }

    #[test]
    fn v1_memory_controller() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let group = root.join("job");
        write(root, "memory.limit_in_bytes", "9223372036854771712\n");
        write(&group, "memory.limit_in_bytes", "536870912\n");
        write(&group, "memory.usage_in_bytes", "6950912\n");
        write(&group, "memory.stat", "cache 3846144\nrss 1757184\ntotal_cache 3846144\ntotal_rss 1757184\ntotal_shmem 0\n");
        let mounts = [
            Mount { point: root.join("unified"), root: "/".into(), version: 2, options: String::new() },
            Mount { point: root.to_path_buf(), root: "/".into(), version: 1, options: "rw,memory".into() },
        ];
        let membership = "4:memory:/job\n1:cpu:/\n0::/\n";
        let memory = find(membership, &mounts).expect("the v1 cgroup");
        assert_eq!((memory.version, memory.current_bytes, memory.max_bytes), (1, 6950912, Some(512 << 20)));
        assert_eq!((memory.stat.get("anon"), memory.stat.get("file")), (Some(&1757184), Some(&3846144)));
        assert_eq!(memory.limit_path.as_deref(), Some("/job"));
    }

    #[test]
    fn a_v2_cgroup_named_by_directory_or_path() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let service = root.join("system.slice/app.service");
        write(&root.join("system.slice"), "memory.max", "1073741824\n");
        write(&service, "memory.max", "max\n");
        write(&service, "memory.current", "8192\n");
        write(&service, "cgroup.procs", "12\n7\n");
        write(&service.join("worker"), "cgroup.procs", "40\n7\n");
        write(&root.join("system.slice"), "cgroup.procs", "");
        let mount = Mount { point: root.to_path_buf(), root: "/".into(), version: 2, options: String::new() };
        let by_path = named_under("/system.slice/app.service", mount.clone()).expect("by cgroup path");
        let by_dir = named_under(service.to_str().unwrap(), mount.clone()).expect("by directory");
        assert_eq!(by_path, by_dir);
        assert_eq!((by_path.path.as_str(), by_path.dir.as_path()), ("/system.slice/app.service", service.as_path()));
        assert_eq!(by_path.processes(), [7, 12, 40]);
        let memory = by_path.memory().expect("memory figures");
        assert_eq!((memory.current_bytes, memory.max_bytes), (8192, Some(1 << 30)));
        let error = named_under("/nowhere", mount).unwrap_err();
        assert!(error.contains("not a cgroup v2 directory"), "{error}");
    }
}
