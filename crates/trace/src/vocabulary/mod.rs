//! The words that cross process and crate boundaries, spelled once: the
//! environment through which `memgap run` talks to the libraries and
//! samplers it loads into a program ([`env`]), the sources of METRICS
//! records ([`source`]) and their kinds ([`kind`]), and the metric names of
//! the Go runtime ([`go`]) and of the GHC RTS ([`ghc`]).
//!
//! Only constants and small functions over them: the agent reads [`env`]
//! inside the traced program, where nothing may allocate.
//!
//! Not for: what a figure means (the model) or how a record is encoded
//! ([`crate::records`]).
//!
//! ```
//! use memgap_trace::vocabulary::{env, source};
//! let mut command = std::process::Command::new("true");
//! command.env(env::AREA_DIR, "/run/user/0/memgap.1").env(env::FOLLOW, env::FOLLOW_OFF);
//! assert_eq!(env::AREA_DIR.c_name(), c"MEMGAP_AREA_DIR");
//! assert_eq!(source::RUBY, "ruby");
//! ```

pub mod ghc;
pub mod go;

/// The environment variables memgap's processes and libraries read.
pub mod env {
    use core::ffi::CStr;
    use std::ffi::OsStr;

    /// An environment variable's name, as std's processes take it and as
    /// the preloaded libraries look it up with `getenv` (NUL-terminated,
    /// without allocating).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct EnvVar(&'static CStr);

    impl EnvVar {
        pub const fn new(name: &'static CStr) -> EnvVar {
            assert!(name.to_str().is_ok(), "environment variable names are ASCII");
            EnvVar(name)
        }

        pub const fn c_name(self) -> &'static CStr {
            self.0
        }

        pub const fn name(self) -> &'static str {
            match self.0.to_str() {
                Ok(name) => name,
                Err(_) => panic!("checked in EnvVar::new"),
            }
        }
    }

    impl AsRef<OsStr> for EnvVar {
        fn as_ref(&self) -> &OsStr {
            OsStr::new(self.name())
        }
    }

    impl core::fmt::Display for EnvVar {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str(self.name())
        }
    }

    // The agent's protocol: `memgap run` sets these for the agent it preloads.

    /// The private directory where the agent creates its shared buffers; the
    /// agent records nothing without it.
    pub const AREA_DIR: EnvVar = EnvVar::new(c"MEMGAP_AREA_DIR");
    /// The run's id, in hexadecimal, written into every process's trace.
    pub const RUN_ID: EnvVar = EnvVar::new(c"MEMGAP_RUN_ID");
    /// [`FOLLOW_OFF`]: record the first process only, not its children.
    pub const FOLLOW: EnvVar = EnvVar::new(c"MEMGAP_FOLLOW");
    pub const FOLLOW_OFF: &str = "0";
    /// How call stacks are unwound: [`STACKS_DWARF`], [`STACKS_FRAME_POINTERS`]
    /// or [`STACKS_NONE`].
    pub const STACKS: EnvVar = EnvVar::new(c"MEMGAP_STACKS");
    pub const STACKS_DWARF: &str = "dwarf";
    pub const STACKS_FRAME_POINTERS: &str = "fp";
    pub const STACKS_NONE: &str = "none";
    /// The most frames a call stack keeps.
    pub const STACK_DEPTH: EnvVar = EnvVar::new(c"MEMGAP_STACK_DEPTH");
    /// [`PYTHON_STACKS_OFF`]: no Python frames in call stacks.
    pub const PYTHON_STACKS: EnvVar = EnvVar::new(c"MEMGAP_PYTHON_STACKS");
    pub const PYTHON_STACKS_OFF: &str = "off";
    /// The shared buffers' size in MiB.
    pub const BUFFER_MB: EnvVar = EnvVar::new(c"MEMGAP_BUFFER_MB");

    // The trim remedy's library.

    /// Milliseconds between two `malloc_trim` calls.
    pub const TRIM_INTERVAL_MS: EnvVar = EnvVar::new(c"MEMGAP_TRIM_INTERVAL_MS");
    /// Trim only when glibc holds at least this many free bytes.
    pub const TRIM_THRESHOLD: EnvVar = EnvVar::new(c"MEMGAP_TRIM_THRESHOLD");

    // The runtimes' samplers.

    /// `WFD,RFD`: the pipe the Go helper package writes its lines to and the
    /// one it reads answers from.
    pub const GO_METRICS: EnvVar = EnvVar::new(c"MEMGAP_GO_METRICS");
    /// Milliseconds between the Go helper's samples.
    pub const GO_INTERVAL_MS: EnvVar = EnvVar::new(c"MEMGAP_GO_INTERVAL_MS");
    /// Where the Ruby sampler writes (`%p`: the pid).
    pub const RUBY_OUT: EnvVar = EnvVar::new(c"MEMGAP_RUBY_OUT");
    pub const RUBY_INTERVAL_MS: EnvVar = EnvVar::new(c"MEMGAP_RUBY_INTERVAL_MS");
    /// Where the Node.js sampler writes (`%p`: the pid, `%t`: the thread).
    pub const NODE_OUT: EnvVar = EnvVar::new(c"MEMGAP_NODE_OUT");
    pub const NODE_INTERVAL_MS: EnvVar = EnvVar::new(c"MEMGAP_NODE_INTERVAL_MS");

    // A person's settings for memgap itself.

    /// The agent library to preload instead of the one beside memgap.
    pub const AGENT: EnvVar = EnvVar::new(c"MEMGAP_AGENT");
    /// The trim remedy's library instead of the one beside memgap.
    pub const TRIM_LIBRARY: EnvVar = EnvVar::new(c"MEMGAP_TRIM_LIBRARY");
    /// [`INDEX_OFF`]: replays neither read nor write an index beside a trace.
    pub const INDEX: EnvVar = EnvVar::new(c"MEMGAP_INDEX");
    pub const INDEX_OFF: &str = "off";
    /// Milliseconds a replay runs before its progress bar shows.
    pub const PROGRESS_AFTER_MS: EnvVar = EnvVar::new(c"MEMGAP_PROGRESS_AFTER_MS");
    /// Where separate debug files are looked for (default /usr/lib/debug).
    pub const DEBUG_DIR: EnvVar = EnvVar::new(c"MEMGAP_DEBUG_DIR");

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn names_read_the_same_as_str_and_as_c_string() {
            assert_eq!(AREA_DIR.name(), "MEMGAP_AREA_DIR");
            assert_eq!(AREA_DIR.c_name().to_bytes(), AREA_DIR.name().as_bytes());
            assert_eq!(AsRef::<OsStr>::as_ref(&RUN_ID), OsStr::new("MEMGAP_RUN_ID"));
            assert_eq!(GO_METRICS.to_string(), "MEMGAP_GO_METRICS");
        }
    }
}

/// The `source` of METRICS records: who measured the figures.
pub mod source {
    /// The Go runtime (helper package, gctrace lines, MemStats over HTTP).
    pub const GO: &str = "go";
    /// The GHC RTS eventlog.
    pub const GHC: &str = "ghc";
    /// Ruby's sampler (GC.stat, ObjectSpace).
    pub const RUBY: &str = "ruby";
    /// Node.js's sampler (V8 heap spaces).
    pub const NODE: &str = "node";
    /// CPython's pymalloc, read by the agent.
    pub const PYTHON: &str = "python";
    /// The program's own `malloc_trim` calls, seen by the agent.
    pub const MALLOC: &str = "malloc";
}

/// The `kind` of METRICS records: what one record of its source holds.
/// A kind means the same for every source that writes it.
pub mod kind {
    /// A runtime's figures, sampled periodically (the Go helper, the Ruby
    /// and Node samplers).
    pub const SAMPLE: &str = "sample";
    /// A sample taken as a major collection ended (Ruby, Node).
    pub const MAJOR_GC: &str = "major_gc";
    /// A sampler's last sample, as the program exits (Ruby, Node).
    pub const EXIT: &str = "exit";
    /// A sampler's description of the runtime, once: version, sizes (Ruby, Node).
    pub const META: &str = "meta";
    /// One collection: a Go gctrace line, a GHC eventlog GC.
    pub const GC: &str = "gc";
    /// Go: the build's version, once.
    pub const BUILD: &str = "build";
    /// Go: the size classes its version implies, once.
    pub const SIZE_CLASSES: &str = "size_classes";
    /// Go: runtime.MemStats read over HTTP (`memgap attach --go`).
    pub const MEMSTATS: &str = "memstats";
    /// Go: the runtime's accounting read from its memory (`memgap snapshot PID`, `memgap watch`).
    pub const PROCESS_MEMORY: &str = "process_memory";
    /// GHC: the heap's parameters and the build, once.
    pub const INFO: &str = "info";
    /// GHC: one heap-profile census.
    pub const HEAP_PROFILE: &str = "heap_profile";
    /// GHC: the `+RTS -s` summary the RTS printed on stderr at exit.
    pub const RTS_SUMMARY: &str = "rts_summary";
    /// GHC: the `-Dg` memory inventory a debug RTS printed on stderr.
    pub const INVENTORY: &str = "inventory";
    /// An allocator's own statistics (jemalloc, tcmalloc, mimalloc).
    pub const STATS: &str = "stats";
    /// CPython's pymalloc arenas, counted at a snapshot.
    pub const PYMALLOC: &str = "pymalloc";
    /// A `malloc_trim` call (source `malloc`).
    pub const TRIM: &str = "trim";
    /// A walk of glibc's malloc state from outside (`memgap watch`, source `glibc`).
    pub const WALK: &str = "walk";
}
