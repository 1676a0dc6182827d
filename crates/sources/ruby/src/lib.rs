//! The Ruby source: what Ruby knows of its own memory.
//!
//! `memgap run` loads [`RUNTIME`]'s sampler into every Ruby process it
//! starts (`RUBYOPT=-r<file>`, before the user's own options); the sampler
//! appends GC.stat and ObjectSpace figures to a file per pid after garbage
//! collections and at exit, which become METRICS records (source `ruby`) in
//! the process's trace.
//!
//! Not for: deciding what the figures mean (the model's Ruby layer does).

use std::ffi::{OsStr, OsString};
use std::path::Path;

use memgap_source_sampler::Runtime;
use memgap_trace::vocabulary::env;

pub const SOURCE: &str = memgap_trace::vocabulary::source::RUBY;

/// Ruby's sampler.
pub const RUNTIME: Runtime = Runtime {
    source: SOURCE,
    script: include_str!("sampler.rb"),
    script_name: "sampler.rb",
    out_env: env::RUBY_OUT.name(),
    out_pattern: "ruby.%p",
    interval_env: env::RUBY_INTERVAL_MS.name(),
    load_env: "RUBYOPT",
    load_value: rubyopt,
    text_keys: &["version"],
    is_whole: |_, _| true,
    note: |text| Some(format!("ruby {}", text.get("version")?)),
};

/// `-r<sampler>`, then the user's RUBYOPT.
fn rubyopt(existing: Option<&OsStr>, sampler: &Path) -> OsString {
    let mut rubyopt = OsString::from("-r");
    rubyopt.push(sampler);
    if let Some(existing) = existing.filter(|v| !v.is_empty()) {
        rubyopt.push(" ");
        rubyopt.push(existing);
    }
    rubyopt
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_reads_the_variables_memgap_sets() {
        for variable in [env::RUBY_OUT, env::RUBY_INTERVAL_MS] {
            assert!(RUNTIME.script.contains(variable.name()), "{variable}");
        }
    }
    use memgap_trace::records::Record;

    #[test]
    fn reads_sampler_lines() {
        let text = "100 meta version=3.1.2 rvalue_size=40 heap_page_size=16384\n\
                    200 major_gc heap_allocated_pages=53 heap_live_slots=20694 memsize_of_all=4194304\n\
                    300 exit heap_allocated_pa";
        let samples = RUNTIME.read(text);
        assert_eq!(samples.text.get("version").map(String::as_str), Some("3.1.2"));
        assert_eq!(samples.metrics.len(), 2);
        assert_eq!(samples.skipped_lines, 1);
        assert_eq!(samples.metrics[0].get("rvalue_size"), Some(40.0));
        assert_eq!(samples.metrics[1].kind, memgap_trace::vocabulary::kind::MAJOR_GC);
        assert_eq!(samples.metrics[1].get("memsize_of_all"), Some(4194304.0));
        let records: Vec<_> = RUNTIME.records(std::slice::from_ref(&samples)).collect();
        assert!(matches!(&records[0], Record::Note { text, .. } if text == "ruby 3.1.2"));
        assert_eq!(records.len(), 3);
    }

    #[test]
    fn the_sampler_comes_before_the_users_options() {
        let path = Path::new("/tmp/memgap-ruby-x/sampler.rb");
        assert_eq!(rubyopt(None, path), OsString::from("-r/tmp/memgap-ruby-x/sampler.rb"));
        assert_eq!(rubyopt(Some(OsStr::new("-w")), path), OsString::from("-r/tmp/memgap-ruby-x/sampler.rb -w"));
    }
}
