//! /proc/PID/numa_maps: per mapping, its memory policy and resident pages
//! per node (`N<node>=<pages>`, in pages of `kernelpagesize_kB`). Works on
//! any process we may read, with no agent.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MappingNodes {
    pub start: u64,
    /// `default`, `bind:0-1`, `interleave:0-3`, `prefer:1`…
    pub policy: String,
    /// `heap`, `stack`, `huge`, `file=PATH`, or empty (anonymous).
    pub kind: String,
    pub bytes_by_node: BTreeMap<u32, u64>,
}

pub fn parse(text: &str) -> Vec<MappingNodes> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let start = u64::from_str_radix(fields.next()?, 16).ok()?;
            let policy = fields.next()?.to_string();
            let page_bytes =
                line.split_whitespace().find_map(|f| f.strip_prefix("kernelpagesize_kB=")?.parse::<u64>().ok()).unwrap_or(4) * 1024;
            let mut m = MappingNodes { start, policy, ..MappingNodes::default() };
            for field in fields {
                if field == "heap" || field == "stack" || field == "huge" || field.starts_with("file=") {
                    m.kind = field.to_string();
                } else if let Some((node, pages)) = field.strip_prefix('N').and_then(|f| f.split_once('='))
                    && let (Ok(node), Ok(pages)) = (node.parse::<u32>(), pages.parse::<u64>())
                {
                    *m.bytes_by_node.entry(node).or_default() += pages * page_bytes;
                }
            }
            Some(m)
        })
        .collect()
}

pub fn read(pid: u32) -> std::io::Result<Vec<MappingNodes>> {
    std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).map(|text| parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_mapping() {
        let text = "55e9add12000 default heap anon=10 dirty=10 active=0 N0=10 kernelpagesize_kB=4\n\
7f0000000000 interleave:0-1 anon=512 dirty=512 N0=256 N1=256 kernelpagesize_kB=4\n\
7f1000000000 bind:1 file=/memfd:huge\\040(deleted) huge anon=1 dirty=1 N1=1 kernelpagesize_kB=2048\n\
7f2000000000 default file=/usr/lib/libc.so.6\n";
        let maps = parse(text);
        assert_eq!(maps.len(), 4);
        assert_eq!((maps[0].start, maps[0].policy.as_str(), maps[0].kind.as_str()), (0x55e9add12000, "default", "heap"));
        assert_eq!(maps[0].bytes_by_node, BTreeMap::from([(0, 40960)]));
        assert_eq!(maps[1].bytes_by_node, BTreeMap::from([(0, 1 << 20), (1, 1 << 20)]));
        assert_eq!((maps[2].policy.as_str(), maps[2].kind.as_str()), ("bind:1", "huge"));
        assert_eq!(maps[2].bytes_by_node, BTreeMap::from([(1, 2 << 20)]));
        assert!(maps[3].bytes_by_node.is_empty() && maps[3].kind.starts_with("file="));
    }

    #[test]
    fn reads_this_process() {
        let Ok(maps) = read(std::process::id()) else { return }; // no numa_maps without CONFIG_NUMA
        let resident: u64 = maps.iter().flat_map(|m| m.bytes_by_node.values()).sum();
        assert!(resident > 0);
    }
}
