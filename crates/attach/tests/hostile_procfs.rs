//! No panic on whatever /proc shows: every parser of a /proc file, and the
//! ledger built from what they parsed, take arbitrary text (a kernel of
//! another version, a file read half-way as a process exits, values at the
//! edge of u64) and return something.

use std::collections::BTreeMap;

use memgap_attach::cgroup::parse_mountinfo;
use memgap_attach::procfs::{parse_numa_maps, parse_status, parse_syscall};
use memgap_model::{ProcfsReading, outside_ledger};
use memgap_trace::smaps::parse_smaps;
use proptest::prelude::*;

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just(u64::MAX.to_string()),
        Just("18446744073709551616".to_string()),
        Just("-1".to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<u32>().prop_map(|n| n.to_string())
    ]
}

fn status_text() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("Name".to_string()),
        Just("State".to_string()),
        Just("Tgid".to_string()),
        Just("TracerPid".to_string()),
        Just("Threads".to_string()),
        Just("VmRSS".to_string()),
        Just("RssAnon".to_string()),
        Just("RssFile".to_string()),
        Just("RssShmem".to_string()),
        Just("VmHWM".to_string()),
        "[A-Za-z]{1,8}"
    ];
    let line = (key, number(), prop_oneof![Just(" kB".to_string()), Just("".to_string()), Just(" (sleeping)".to_string())])
        .prop_map(|(k, v, unit)| format!("{k}:\t{v}{unit}"));
    proptest::collection::vec(prop_oneof![line, "[ -~\t]{0,40}"], 0..20).prop_map(|lines| lines.join("\n"))
}

fn smaps_text() -> impl Strategy<Value = String> {
    let address = prop_oneof![Just(0u64), Just(u64::MAX), Just(0x5555_5555_4000), any::<u64>()];
    let perms = prop_oneof![
        Just("rw-p".to_string()),
        Just("r-xp".to_string()),
        Just("---p".to_string()),
        Just("rw-s".to_string()),
        "[rwxps-]{0,6}"
    ];
    let name = prop_oneof![
        Just("".to_string()),
        Just("[heap]".to_string()),
        Just("[stack]".to_string()),
        Just("/usr/lib/x86_64-linux-gnu/libc.so.6".to_string()),
        Just("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2".to_string()),
        "[ -~]{0,20}"
    ];
    let header = (address.clone(), address, perms, number(), name)
        .prop_map(|(start, end, perms, inode, name)| format!("{start:x}-{end:x} {perms} 00000000 00:00 {inode} {name}"));
    proptest::collection::vec(prop_oneof![header, smaps_field(), smaps_field(), "[ -~]{0,30}"], 0..24).prop_map(|lines| lines.join("\n"))
}

fn smaps_field() -> impl Strategy<Value = String> {
    let key = prop_oneof![Just("Rss"), Just("Anonymous"), Just("LazyFree"), Just("Swap"), Just("Size")];
    (key, number()).prop_map(|(k, v)| format!("{k}: {v} kB"))
}

fn numa_text() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        (number(), number()).prop_map(|(n, p)| format!("N{n}={p}")),
        number().prop_map(|k| format!("kernelpagesize_kB={k}")),
        "[ -~]{0,12}",
    ];
    proptest::collection::vec(proptest::collection::vec(field, 0..6).prop_map(|f| format!("7f0000000000 default {}", f.join(" "))), 0..8)
        .prop_map(|l| l.join("\n"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn status_never_panics(text in status_text(), garbage in "\\PC{0,200}") {
        let _ = parse_status(&text);
        let _ = parse_status(&garbage);
    }

    #[test]
    fn numa_maps_never_panic(text in numa_text(), garbage in "\\PC{0,200}") {
        let _ = parse_numa_maps(&text);
        let _ = parse_numa_maps(&garbage);
    }

    #[test]
    fn syscall_never_panics(text in "[-0-9a-fx ]{0,80}", garbage in "\\PC{0,100}") {
        let _ = parse_syscall(&text);
        let _ = parse_syscall(&garbage);
    }

    #[test]
    fn mountinfo_never_panics(text in "([0-9]{1,3} [0-9]{1,3} 0:[0-9]{1,2} [ -~\\\\]{0,12} [ -~\\\\]{0,12} rw( shared:1)? - (cgroup2|cgroup|ext4) [a-z]{0,6} [a-z,]{0,12}\n){0,6}", garbage in "\\PC{0,200}") {
        let _ = parse_mountinfo(&text);
        let _ = parse_mountinfo(&garbage);
    }

    /// The whole `memgap snapshot` model from hostile smaps, status and numa_maps.
    #[test]
    fn ledger_of_hostile_procfs_never_panics(smaps in smaps_text(), status in status_text(), numa in numa_text(), pointers in proptest::collection::vec(any::<u64>(), 0..4)) {
        let mappings = parse_smaps(smaps.as_bytes());
        let status = parse_status(&status);
        let reading = ProcfsReading {
            pid: 1,
            command: status.name.clone(),
            threads: status.threads,
            status: status.rss,
            allocator: memgap_attach::modules::allocator_of(&mappings).to_string(),
            mappings,
            stack_pointers: pointers,
            numa: parse_numa_maps(&numa),
            cgroup: None,
            ..ProcfsReading::default()
        };
        let _ = outside_ledger(&reading);
    }
}

#[test]
fn empty_inputs_give_empty_results() {
    assert!(parse_smaps(b"").is_empty());
    assert_eq!(parse_numa_maps(""), BTreeMap::new());
    assert_eq!(parse_syscall(""), (None, None));
    assert!(parse_mountinfo("").is_empty());
}
