//! /proc/PID/smaps, parsed into the [`Mapping`]s a snapshot holds: by the
//! agent for its own process, and by `memgap snapshot` for another one.

use crate::records::Mapping;

/// Parses /proc/PID/smaps: a header line per mapping
/// (`start-end perms offset dev inode [name]`) followed by `Key: N kB` lines.
pub fn parse_smaps(text: &[u8]) -> Vec<Mapping> {
    let mut mappings: Vec<Mapping> = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        let first = line.split(|&b| b == b' ').next().unwrap_or(&[]);
        if let Some(dash) = first.iter().position(|&b| b == b'-')
            && let (Some(start), Some(end)) = (hex(&first[..dash]), hex(&first[dash + 1..]))
        {
            let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
            fields.next();
            let perms = fields.next().unwrap_or(&[]);
            let offset = fields.next().and_then(hex).unwrap_or(0);
            fields.next(); // device
            let inode = fields.next().and_then(decimal).unwrap_or(0);
            let name: Vec<u8> = fields.collect::<Vec<_>>().join(&b' ');
            mappings.push(Mapping {
                start,
                end,
                perms: String::from_utf8_lossy(perms).into_owned(),
                offset,
                inode,
                name: String::from_utf8_lossy(&name).into_owned(),
                ..Mapping::default()
            });
            continue;
        }
        let Some(mapping) = mappings.last_mut() else { continue };
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let kib = || line[colon + 1..].split(|&b| b == b' ').find(|f| !f.is_empty()).and_then(decimal).unwrap_or(0).saturating_mul(1024);
        match &line[..colon] {
            b"Rss" => mapping.rss = kib(),
            b"Anonymous" => mapping.anonymous = kib(),
            b"LazyFree" => mapping.lazy_free = kib(),
            b"Swap" => mapping.swap = kib(),
            _ => {}
        }
    }
    mappings
}

fn hex(text: &[u8]) -> Option<u64> {
    u64::from_str_radix(core::str::from_utf8(text).ok()?, 16).ok()
}

fn decimal(text: &[u8]) -> Option<u64> {
    core::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_smaps() {
        let text = b"55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n\
Size:                132 kB\nRss:                   8 kB\nAnonymous:             8 kB\nLazyFree:              4 kB\nSwap:                  0 kB\n\
7f1c8a000000-7f1c8a021000 r-xp 00002000 fe:01 1234                       /usr/lib/x86_64-linux-gnu/libc.so.6\n\
Rss:                 100 kB\nVmFlags: rd ex mr mw me\n\
7f1c8b000000-7f1c8b001000 rw-p 00000000 00:00 0 \nRss: 4 kB\n";
        let maps = parse_smaps(text);
        assert_eq!(maps.len(), 3);
        assert_eq!((maps[0].start, maps[0].end, maps[0].name.as_str()), (0x55d0c0a00000, 0x55d0c0a21000, "[heap]"));
        assert_eq!((maps[0].rss, maps[0].anonymous, maps[0].lazy_free), (8192, 8192, 4096));
        assert_eq!((maps[1].inode, maps[1].offset, maps[1].rss), (1234, 0x2000, 102400));
        assert_eq!(maps[1].name, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert!(maps[0].is_private_writable_anonymous() && !maps[1].is_private_writable_anonymous());
        assert!(maps[2].is_private_writable_anonymous() && maps[2].name.is_empty());
    }

    /// Lines that look like smaps, with values out of any range.
    fn smaps_like() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let number = prop_oneof![
            Just("0".to_string()),
            Just(u64::MAX.to_string()),
            Just("18446744073709551616".to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            "[0-9a-f]{0,20}"
        ];
        let header = (any::<u64>(), any::<u64>(), "[rwxps-]{0,5}", "[0-9a-f]{0,17}", number.clone(), "[ -~]{0,30}")
            .prop_map(|(start, end, perms, offset, inode, name)| format!("{start:x}-{end:x} {perms} {offset} 00:00 {inode} {name}"));
        let field = (prop_oneof![Just("Rss"), Just("Anonymous"), Just("LazyFree"), Just("Swap"), Just("Size"), Just("VmFlags")], number)
            .prop_map(|(key, value)| format!("{key}: {value} kB"));
        let line = prop_oneof![header, field, "[ -~]{0,40}"];
        proptest::collection::vec(line, 0..30).prop_map(|lines| lines.join("\n").into_bytes())
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = parse_smaps(&bytes);
        }

        #[test]
        fn hostile_smaps_never_panic(text in smaps_like()) {
            for mapping in parse_smaps(&text) {
                let _ = mapping.is_private_writable_anonymous();
            }
        }
    }
}
