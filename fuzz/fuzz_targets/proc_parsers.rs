//! Every parser of a /proc file, and the `memgap snapshot` ledger built
//! from what they parsed. The input is split on "\0" into smaps, status,
//! numa_maps, task syscall and mountinfo texts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memgap_attach::cgroup::parse_mountinfo;
use memgap_attach::procfs::{parse_numa_maps, parse_status, parse_syscall};
use memgap_model::{ProcfsReading, outside_ledger};
use memgap_trace::smaps::parse_smaps;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|&b| b == 0);
    let smaps = parts.next().unwrap_or_default();
    let text = |part: Option<&[u8]>| String::from_utf8_lossy(part.unwrap_or_default()).into_owned();
    let (status, numa, syscall, mountinfo) = (text(parts.next()), text(parts.next()), text(parts.next()), text(parts.next()));
    let mappings = parse_smaps(smaps);
    let status = parse_status(&status);
    let _ = parse_syscall(&syscall);
    let _ = parse_mountinfo(&mountinfo);
    let reading = ProcfsReading {
        pid: 1,
        command: status.name.clone(),
        threads: status.threads,
        status: status.rss,
        allocator: memgap_attach::modules::allocator_of(&mappings).to_string(),
        mappings,
        stack_pointers: vec![0x7ffd_0000_0000],
        numa: parse_numa_maps(&numa),
        cgroup: None,
        ..ProcfsReading::default()
    };
    let _ = outside_ledger(&reading);
});
