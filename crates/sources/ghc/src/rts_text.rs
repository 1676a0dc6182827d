//! What the RTS prints on stderr when asked: the `+RTS -s` summary
//! (ghc/ghc `rts/Stats.c` stat_exit) and the `-Dg` memory inventory of a
//! debug RTS (`rts/sm/Sanity.c` memInventory), as METRICS values.
//!
//! ```text
//!      111,963,920 bytes maximum residency (22 sample(s))
//!              189 MiB total memory in use (0 MB lost due to fragmentation)
//! Memory inventory:
//!   gen 1 blocks : 97874 blocks ( 382.3 MiB)
//!   free         : 287668 blocks (1123.7 MiB)
//! ```

use memgap_trace::vocabulary::ghc as names;

const MIB: f64 = 1024.0 * 1024.0;

/// The `-s` summary's figures, named `allocated_bytes`, `copied_bytes`,
/// `max_residency_bytes`, `max_residency_samples`, `max_slop_bytes`,
/// `total_memory_in_use_bytes`, `lost_to_fragmentation_bytes`, and
/// `gen<N>_collections`. The last summary in the text wins (a program
/// that runs others may print several). None without one.
pub fn parse_summary(text: &str) -> Option<Vec<(String, f64)>> {
    let mut values: Vec<(String, f64)> = Vec::new();
    let mut seen_in_use = false;
    for line in text.lines() {
        let line = line.trim();
        let number = |s: &str| s.replace(',', "").parse::<f64>().ok();
        let mut words = line.split_whitespace();
        let (Some(first), rest) = (words.next(), words.collect::<Vec<_>>()) else { continue };
        let rest_text = rest.join(" ");
        let mut set = |name: &str, value: f64| {
            values.retain(|(n, _)| n != name);
            values.push((name.to_string(), value));
        };
        if let Some(value) = number(first) {
            if rest_text.starts_with("bytes allocated in the heap") {
                set(names::ALLOCATED_BYTES, value);
            } else if rest_text.starts_with("bytes copied during GC") {
                set(names::COPIED_BYTES, value);
            } else if let Some(samples) = rest_text.strip_prefix("bytes maximum residency (") {
                set(names::MAX_RESIDENCY_BYTES, value);
                if let Some(n) = samples.split_whitespace().next().and_then(|n| n.parse::<f64>().ok()) {
                    set(names::MAX_RESIDENCY_SAMPLES, n);
                }
            } else if rest_text.starts_with("bytes maximum slop") {
                set(names::MAX_SLOP_BYTES, value);
            } else if let Some(lost) =
                rest_text.strip_prefix("MiB total memory in use (").or_else(|| rest_text.strip_prefix("MB total memory in use ("))
            {
                seen_in_use = true;
                set(names::TOTAL_MEMORY_IN_USE_BYTES, value * MIB);
                if let Some(mb) = lost.split_whitespace().next().and_then(|n| n.parse::<f64>().ok()) {
                    set(names::LOST_TO_FRAGMENTATION_BYTES, mb * MIB);
                }
            }
        } else if first == "Gen" {
            // "Gen  0   12 colls,   0 par   0.001s ..."
            if let (Some(generation), Some(colls)) = (rest.first().and_then(|g| g.parse::<u32>().ok()), rest.get(1).and_then(|c| number(c)))
                && rest.get(2).is_some_and(|w| w.starts_with("colls"))
            {
                set(&format!("gen{generation}_collections"), colls);
            }
        }
    }
    seen_in_use.then_some(values)
}

/// The last `Memory inventory:` block: one value per line, `<name>_bytes`
/// with spaces as underscores (`gen_1_blocks_bytes`, `free_bytes`,
/// `total_bytes`), from its block count × 4 KiB.
pub fn parse_inventory(text: &str) -> Option<Vec<(String, f64)>> {
    let mut last = None;
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() != "Memory inventory:" {
            continue;
        }
        let mut values = Vec::new();
        while let Some(entry) = lines.peek() {
            let Some((name, figure)) = entry.split_once(':') else { break };
            let Some(blocks) = figure.split_whitespace().next().and_then(|b| b.parse::<f64>().ok()) else { break };
            if !figure.contains("blocks") {
                break;
            }
            let name = name.split_whitespace().collect::<Vec<_>>().join("_");
            values.push((format!("{name}_bytes"), blocks * 4096.0));
            lines.next();
        }
        if !values.is_empty() {
            last = Some(values);
        }
    }
    last
}

/// Whether the RTS options in a command line or GHCRTS ask for the `-s`
/// or `-S` summary on stderr (not into a file) or the `-Dg` inventory.
pub fn asks_for_stderr_stats(rts_options: &[String]) -> bool {
    rts_options
        .iter()
        .any(|o| matches!(o.as_str(), "-s" | "-S" | "-s-" | "-S-" | "--machine-readable") || (o.starts_with("-D") && o.contains('g')))
}

/// The RTS options in a program's argv (`+RTS … -RTS`, up to `--RTS`).
pub fn rts_options_in_args(args: &[String]) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for arg in args {
        match arg.as_str() {
            "--RTS" => break,
            "+RTS" => inside = true,
            "-RTS" => inside = false,
            _ if inside => out.push(arg.clone()),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUMMARY: &str = "2nd plateau\n100000\n     6,321,664,040 bytes allocated in the heap\n     1,063,584,192 bytes copied during GC\n       111,963,920 bytes maximum residency (22 sample(s))\n         1,170,960 bytes maximum slop\n               189 MiB total memory in use (3 MB lost due to fragmentation)\n\n                                     Tot time (elapsed)  Avg pause  Max pause\n  Gen  0      1503 colls,     0 par    0.334s   0.335s     0.0002s    0.0011s\n  Gen  1        22 colls,     0 par    0.480s   0.480s     0.0218s    0.0668s\n";

    #[test]
    fn reads_the_summary() {
        let values = parse_summary(SUMMARY).unwrap();
        let get = |n: &str| values.iter().find(|(k, _)| k == n).map(|&(_, v)| v);
        assert_eq!(get("max_residency_bytes"), Some(111_963_920.0));
        assert_eq!(get("max_residency_samples"), Some(22.0));
        assert_eq!(get("total_memory_in_use_bytes"), Some(189.0 * MIB));
        assert_eq!(get("lost_to_fragmentation_bytes"), Some(3.0 * MIB));
        assert_eq!(get("allocated_bytes"), Some(6_321_664_040.0));
        assert_eq!((get("gen0_collections"), get("gen1_collections")), (Some(1503.0), Some(22.0)));
        assert_eq!(parse_summary("hello\n12 bytes maximum residency (1 sample(s))\n"), None);
    }

    #[test]
    fn reads_the_last_inventory() {
        let text = "Memory inventory:\n  gen 0 blocks :   10 blocks (   0.0 MiB)\n  free         : 500 blocks (2.0 MiB)\n  total        :  504 blocks (   2.0 MiB)\nhi\nMemory inventory:\n  gen 1 blocks : 97874 blocks ( 382.3 MiB)\n  free         : 287668 blocks (1123.7 MiB)\n  total        : 385812 blocks (1507.1 MiB)\n";
        let values = parse_inventory(text).unwrap();
        assert_eq!(
            values,
            vec![
                ("gen_1_blocks_bytes".into(), 97874.0 * 4096.0),
                ("free_bytes".into(), 287668.0 * 4096.0),
                ("total_bytes".into(), 385812.0 * 4096.0)
            ]
        );
        assert_eq!(parse_inventory("nothing"), None);
    }

    #[test]
    fn finds_rts_options() {
        let args: Vec<String> =
            ["strip", "10", "+RTS", "-s", "-hT", "-RTS", "x", "+RTS", "-Dg", "--RTS", "+RTS", "-S"].iter().map(|s| s.to_string()).collect();
        let options = rts_options_in_args(&args);
        assert_eq!(options, vec!["-s", "-hT", "-Dg"]);
        assert!(asks_for_stderr_stats(&options));
        assert!(!asks_for_stderr_stats(&["-sstats.txt".to_string(), "-hT".to_string()]));
    }
}
