//! The lines the helper package (`go/memgap`, imported by a Go program)
//! writes to `memgap run` through the pipe named in `MEMGAP_GO_METRICS`
//! ([`memgap_trace::vocabulary::env::GO_METRICS`]):
//!
//! ```text
//! hello go1.26.8                          once: runtime.Version()
//! sample NAME=VALUE NAME=VALUE …          runtime/metrics at an interval
//! snapshot                                "take a snapshot now"; memgap answers with one byte
//! ```
//!
//! Names are runtime/metrics names (they hold no space or `=`); histogram
//! buckets are `NAME[UPPER]` with UPPER the bucket's exclusive upper bound
//! (`inf` for the last), each value the bucket's count.

#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Hello { version: String },
    Sample(Vec<(String, f64)>),
    Snapshot,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine(pub String);

impl std::fmt::Display for BadLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the Go helper sent a line memgap does not understand: {:?}", self.0)
    }
}

pub fn parse(line: &str) -> Result<Line, BadLine> {
    let line = line.trim_end();
    let bad = || BadLine(line.chars().take(80).collect());
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    match word {
        "hello" if !rest.is_empty() => Ok(Line::Hello { version: rest.to_string() }),
        "snapshot" => Ok(Line::Snapshot),
        "sample" => rest
            .split_whitespace()
            .map(|pair| {
                let (name, value) = pair.rsplit_once('=').ok_or_else(bad)?;
                let value = match value {
                    "inf" | "+Inf" => f64::INFINITY,
                    "NaN" => f64::NAN,
                    v => v.parse().map_err(|_| bad())?,
                };
                Ok((name.to_string(), value))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Line::Sample),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helper_package_reads_the_variables_memgap_sets() {
        let helper = include_str!("../../../../go/memgap/memgap.go");
        for variable in [memgap_trace::vocabulary::env::GO_METRICS, memgap_trace::vocabulary::env::GO_INTERVAL_MS] {
            assert!(helper.contains(&format!("\"{variable}\"")), "{variable}");
        }
    }

    #[test]
    fn parses_lines() {
        assert_eq!(parse("hello go1.26.8-X:nogreenteagc\n"), Ok(Line::Hello { version: "go1.26.8-X:nogreenteagc".into() }));
        assert_eq!(parse("snapshot"), Ok(Line::Snapshot));
        let Line::Sample(values) = parse(
            "sample /memory/classes/heap/free:bytes=8192 /gc/heap/allocs-by-size:bytes[17]=1048576 /gc/heap/allocs-by-size:bytes[inf]=3",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(values[0], ("/memory/classes/heap/free:bytes".into(), 8192.0));
        assert_eq!(values[1], ("/gc/heap/allocs-by-size:bytes[17]".into(), 1048576.0));
        assert_eq!(values[2].0, "/gc/heap/allocs-by-size:bytes[inf]");
        assert!(parse("sample a=b").is_err());
        assert!(parse("hi there").is_err());
        assert!(parse("hello").is_err());
    }
}
