//! Exports of weighted call stacks for other tools: collapsed stacks
//! (flamegraph.pl, speedscope, inferno), pprof's `profile.proto` (`go tool
//! pprof`, Pyroscope, Grafana) and a flame graph SVG.
//!
//! Frames come symbolized (memgap-symbolize); a frame without a function is
//! named `module+0xoffset` or by its address everywhere, so the three outputs
//! agree on names.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use memgap_symbolize::Frame;
use prost::Message;

/// One call stack and its weights, one per sample type (live bytes,
/// fragmentation bytes…).
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedStack {
    /// Leaf first; inlined frames come before the frame they were inlined
    /// into, as [`memgap_symbolize::Symbolizer`] returns them.
    pub frames: Vec<Frame>,
    pub values: Vec<i64>,
}

/// What one entry of [`WeightedStack::values`] measures, e.g.
/// `("live_space", "bytes")`; pprof uses the unit to scale what it prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleType {
    pub name: String,
    pub unit: String,
}

/// Collapsed-stack lines, `root;…;leaf value`, one per distinct stack, sorted;
/// stacks whose value is 0 are left out.
pub fn folded(stacks: &[WeightedStack], value_index: usize) -> String {
    let mut totals: BTreeMap<String, i64> = BTreeMap::new();
    for stack in stacks {
        let value = stack.values.get(value_index).copied().unwrap_or(0);
        if value != 0 {
            *totals.entry(folded_stack(&stack.frames)).or_default() += value;
        }
    }
    totals.into_iter().filter(|(_, value)| *value != 0).map(|(stack, value)| format!("{stack} {value}\n")).collect()
}

fn folded_stack(frames: &[Frame]) -> String {
    // ';' separates frames and a newline ends the line; neither may appear
    // inside a name (C++ operators and lambdas can hold odd characters).
    let names: Vec<String> = frames.iter().rev().map(|frame| frame.label().replace([';', '\n'], "_")).collect();
    names.join(";")
}

/// A flame graph of one value (through inferno), with `unit` naming what the
/// widths count ("bytes"). Only positive values can be drawn.
pub fn flamegraph_svg(stacks: &[WeightedStack], value_index: usize, unit: &str, title: &str) -> anyhow::Result<String> {
    let positive: Vec<WeightedStack> =
        stacks.iter().filter(|stack| stack.values.get(value_index).is_some_and(|value| *value > 0)).cloned().collect();
    if positive.is_empty() {
        anyhow::bail!("no stack has a positive value to draw in a flame graph");
    }
    let lines = folded(&positive, value_index);
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = unit.to_string();
    options.colors = inferno::flamegraph::color::Palette::Basic(inferno::flamegraph::color::BasicPalette::Mem);
    // Same colour for the same function in every graph, and the same file for
    // the same input.
    options.hash = true;
    options.deterministic = true;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.lines(), &mut svg)?;
    Ok(String::from_utf8(svg)?)
}

/// The program's executable as loaded: pprof's first mapping, the one it
/// names as the profile's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MainBinary {
    pub path: String,
    pub base: u64,
    pub size: u64,
    pub build_id: Vec<u8>,
}

/// A gzipped `profile.proto`, as `go tool pprof` reads it. Each distinct
/// address becomes one Location holding its inlined frames as Lines, each
/// module one Mapping, `main` (when known) the first. Every stack must carry
/// one value per sample type.
pub fn pprof<'a>(stacks: &'a [WeightedStack], types: &[SampleType], main: Option<&'a MainBinary>) -> Vec<u8> {
    let mut builder = ProfileBuilder::default();
    builder.strings.index(""); // pprof requires string_table[0] == "".
    for sample_type in types {
        let value_type =
            proto::ValueType { r#type: builder.strings.index(&sample_type.name), unit: builder.strings.index(&sample_type.unit) };
        builder.profile.sample_type.push(value_type);
    }
    builder.profile.default_sample_type = builder.profile.sample_type.first().map_or(0, |value_type| value_type.r#type);
    // pprof takes the first mapping for the main binary ("File: …" in its
    // reports): the executable, else the module of the outermost frames.
    if let Some(main) = main {
        let filename = builder.strings.index(&main.path);
        let build_id = if main.build_id.is_empty() {
            0
        } else {
            builder.strings.index(&main.build_id.iter().map(|b| format!("{b:02x}")).collect::<String>())
        };
        builder.profile.mapping.push(proto::Mapping {
            id: 1,
            memory_start: main.base,
            memory_limit: main.base + main.size,
            filename,
            build_id,
            has_functions: true,
            ..Default::default()
        });
        builder.mappings.insert((main.path.as_str(), main.base), 0);
    }
    for stack in stacks {
        if let Some(root) = stack.frames.last() {
            builder.mapping(std::slice::from_ref(root));
        }
    }
    for stack in stacks {
        let location_id = location_groups(&stack.frames).map(|group| builder.location(group)).collect();
        let mut value = stack.values.clone();
        value.resize(types.len(), 0);
        builder.profile.sample.push(proto::Sample { location_id, value });
    }
    builder.profile.string_table = builder.strings.table;
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    gzip.write_all(&builder.profile.encode_to_vec()).expect("gzip into memory");
    gzip.finish().expect("gzip into memory")
}

/// The frames of one address: inlined frames up to and including the one
/// they were inlined into. (Consecutive equal addresses are not enough:
/// direct recursion repeats a return address.)
fn location_groups(frames: &[Frame]) -> impl Iterator<Item = &[Frame]> {
    frames.split_inclusive(|frame| !frame.inlined)
}

#[derive(Default)]
struct ProfileBuilder<'a> {
    profile: proto::Profile,
    strings: StringTable,
    locations: HashMap<&'a [Frame], u64>,
    functions: HashMap<(String, String), u64>,
    /// By (module path, base): the same library loaded at different addresses
    /// in two processes is two mappings.
    mappings: HashMap<(&'a str, u64), usize>,
}

impl<'a> ProfileBuilder<'a> {
    fn location(&mut self, frames: &'a [Frame]) -> u64 {
        if let Some(&id) = self.locations.get(frames) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let line =
            frames.iter().map(|frame| proto::Line { function_id: self.function(frame), line: frame.line.map_or(0, i64::from) }).collect();
        let address = frames[0].address;
        let mapping_id = self.mapping(frames);
        self.profile.location.push(proto::Location { id, mapping_id, address, line });
        self.locations.insert(frames, id);
        id
    }

    fn function(&mut self, frame: &Frame) -> u64 {
        let key = (frame.label(), frame.file.clone().unwrap_or_default());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let name = self.strings.index(&key.0);
        let filename = self.strings.index(&key.1);
        self.profile.function.push(proto::Function { id, name, system_name: name, filename });
        self.functions.insert(key, id);
        id
    }

    /// 0 (no mapping) for addresses outside every module.
    fn mapping(&mut self, frames: &'a [Frame]) -> u64 {
        let first = &frames[0];
        if first.module.is_empty() {
            return 0;
        }
        let base = first.address - first.module_offset;
        let index = match self.mappings.get(&(first.module.as_str(), base)) {
            Some(&index) => index,
            None => {
                let filename = self.strings.index(&first.module);
                // Every location gets a function (at worst named module+offset),
                // so pprof need not try to symbolize anything itself.
                let mapping = proto::Mapping {
                    id: self.profile.mapping.len() as u64 + 1,
                    memory_start: base,
                    filename,
                    has_functions: true,
                    ..Default::default()
                };
                self.profile.mapping.push(mapping);
                self.mappings.insert((first.module.as_str(), base), self.profile.mapping.len() - 1);
                self.profile.mapping.len() - 1
            }
        };
        // The module's size is not known here: the mapping ends after the
        // highest address seen in it.
        let mapping = &mut self.profile.mapping[index];
        mapping.memory_limit = mapping.memory_limit.max(first.address + 1);
        mapping.has_filenames |= frames.iter().any(|frame| frame.file.is_some());
        mapping.has_line_numbers |= frames.iter().any(|frame| frame.line.is_some());
        mapping.has_inline_frames |= frames.len() > 1;
        mapping.id
    }
}

#[derive(Default)]
struct StringTable {
    table: Vec<String>,
    indexes: HashMap<String, i64>,
}

impl StringTable {
    fn index(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.indexes.get(text) {
            return index;
        }
        let index = self.table.len() as i64;
        self.table.push(text.to_string());
        self.indexes.insert(text.to_string(), index);
        index
    }
}

/// A gzipped profile as [`pprof`] writes it, decoded (for tests and tools).
pub fn read_pprof(gzipped: &[u8]) -> anyhow::Result<proto::Profile> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gzipped), &mut bytes)?;
    Ok(proto::Profile::decode(&bytes[..])?)
}

/// The parts of pprof's profile.proto (github.com/google/pprof,
/// proto/profile.proto) that memgap writes, with its field numbers.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        /// Innermost inlined function first; the last is the real caller.
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: &str = "/opt/app/bin/server";
    const APP_BASE: u64 = 0x5555_0000_0000;

    fn frame(function: Option<&str>, line: u32, address: u64, inlined: bool) -> Frame {
        Frame {
            function: function.map(str::to_string),
            file: function.map(|_| "/src/server.c".to_string()),
            line: function.map(|_| line),
            module: APP.to_string(),
            module_offset: address - APP_BASE,
            inlined,
            address,
        }
    }

    /// main → handle_request → (inlined) make_buffer, main → load_config (twice),
    /// and main → an address outside every module → a stripped library.
    fn stacks() -> Vec<WeightedStack> {
        let main = frame(Some("main"), 50, APP_BASE + 0x1500, false);
        let make_buffer = frame(Some("make_buffer"), 12, APP_BASE + 0x1200, true);
        let handle_request = frame(Some("handle_request"), 30, APP_BASE + 0x1200, false);
        let load_config = frame(Some("load_config"), 40, APP_BASE + 0x1300, false);
        let library = Frame {
            function: None,
            file: None,
            line: None,
            module: "/usr/lib/libplugin.so".to_string(),
            module_offset: 0x2a0,
            inlined: false,
            address: 0x7f00_0000_02a0,
        };
        let nowhere = Frame { module: String::new(), module_offset: 0xdead, address: 0xdead, ..frame(None, 0, APP_BASE, false) };
        vec![
            WeightedStack { frames: vec![make_buffer, handle_request, main.clone()], values: vec![4096, 100, 8192] },
            WeightedStack { frames: vec![load_config.clone(), main.clone()], values: vec![1000, 0, 1000] },
            WeightedStack { frames: vec![load_config, main.clone()], values: vec![24, 0, 24] },
            WeightedStack { frames: vec![library, nowhere, main], values: vec![0, 0, 512] },
        ]
    }

    fn types() -> Vec<SampleType> {
        [("live_space", "bytes"), ("fragmentation_space", "bytes"), ("alloc_space", "bytes")]
            .map(|(name, unit)| SampleType { name: name.to_string(), unit: unit.to_string() })
            .to_vec()
    }

    #[test]
    fn folded_lines_are_root_first_merged_and_skip_zero() {
        assert_eq!(folded(&stacks(), 0), "main;handle_request;make_buffer 4096\nmain;load_config 1024\n");
        assert_eq!(
            folded(&stacks(), 2),
            "main;0xdead;libplugin.so+0x2a0 512\nmain;handle_request;make_buffer 8192\nmain;load_config 1024\n"
        );
        assert_eq!(folded(&stacks(), 7), "");
    }

    fn decode(gzipped: &[u8]) -> proto::Profile {
        read_pprof(gzipped).unwrap()
    }

    #[test]
    fn pprof_puts_inlined_frames_in_one_location() {
        let profile = decode(&pprof(&stacks(), &types(), None));
        let string = |index: i64| profile.string_table[index as usize].as_str();
        assert_eq!(string(0), "");
        let type_names: Vec<&str> = profile.sample_type.iter().map(|value_type| string(value_type.r#type)).collect();
        assert_eq!(type_names, ["live_space", "fragmentation_space", "alloc_space"]);
        assert_eq!(profile.sample.len(), 4);
        assert_eq!(profile.sample[0].value, [4096, 100, 8192]);

        // make_buffer inlined into handle_request: one location, two lines, innermost first.
        let leaf = &profile.location[profile.sample[0].location_id[0] as usize - 1];
        let function_name = |id: u64| string(profile.function[id as usize - 1].name);
        let lines: Vec<(&str, i64)> = leaf.line.iter().map(|line| (function_name(line.function_id), line.line)).collect();
        assert_eq!(lines, [("make_buffer", 12), ("handle_request", 30)]);
        assert_eq!(leaf.address, APP_BASE + 0x1200);
        assert_eq!(profile.sample[0].location_id.len(), 2);
        // Shared frames are shared locations.
        assert_eq!(profile.sample[1].location_id, profile.sample[2].location_id);

        let mappings: Vec<(&str, u64)> = profile.mapping.iter().map(|mapping| (string(mapping.filename), mapping.memory_start)).collect();
        assert_eq!(mappings, [(APP, APP_BASE), ("/usr/lib/libplugin.so", 0x7f00_0000_0000)]);
        assert!(profile.mapping[0].has_inline_frames && profile.mapping[0].has_line_numbers);
        assert!(!profile.mapping[1].has_filenames);
        assert_eq!(leaf.mapping_id, profile.mapping[0].id);
    }

    /// The outermost frame is libc's (__libc_start_call_main): the
    /// executable still comes first, with its whole extent and build id.
    #[test]
    fn the_main_binary_is_the_first_mapping() {
        let libc_start = Frame {
            function: Some("__libc_start_call_main".to_string()),
            file: None,
            line: None,
            module: "/usr/lib/x86_64-linux-gnu/libc.so.6".to_string(),
            module_offset: 0x271ca,
            inlined: false,
            address: 0x7f00_1002_71ca,
        };
        let stacks =
            vec![WeightedStack { frames: vec![frame(Some("load_config"), 40, APP_BASE + 0x1300, false), libc_start], values: vec![64] }];
        let main = MainBinary { path: APP.to_string(), base: APP_BASE, size: 0x4000, build_id: vec![0xab, 0x01] };
        let profile = decode(&pprof(&stacks, &types()[..1], Some(&main)));
        let string = |index: i64| profile.string_table[index as usize].as_str();
        let mappings: Vec<(&str, u64, u64, &str)> =
            profile.mapping.iter().map(|m| (string(m.filename), m.memory_start, m.memory_limit, string(m.build_id))).collect();
        assert_eq!(mappings[0], (APP, APP_BASE, APP_BASE + 0x4000, "ab01"));
        assert_eq!(mappings[1].0, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(profile.location[0].mapping_id, 1, "the executable's frame is in the first mapping");
        // Without it, the outermost frame's module is the guess.
        let guessed = decode(&pprof(&stacks, &types()[..1], None));
        assert_eq!(guessed.string_table[guessed.mapping[0].filename as usize], "/usr/lib/x86_64-linux-gnu/libc.so.6");
    }

    #[test]
    fn recursion_keeps_one_location_per_frame() {
        let recurse = frame(Some("recurse"), 7, APP_BASE + 0x1100, false);
        let stack = WeightedStack { frames: vec![recurse.clone(), recurse.clone(), recurse], values: vec![1] };
        let profile = decode(&pprof(&[stack], &types()[..1], None));
        assert_eq!(profile.sample[0].location_id, [1, 1, 1]);
        assert_eq!(profile.location[0].line.len(), 1);
    }

    /// The real reader: `go tool pprof` must list the functions with their values.
    #[test]
    fn go_tool_pprof_reads_the_profile() {
        if std::process::Command::new("go").arg("version").output().is_err() {
            println!("note: go is not installed; skipped checking the profile with `go tool pprof`");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memgap.pb.gz");
        std::fs::write(&path, pprof(&stacks(), &types(), None)).unwrap();
        let top = |sample_index: &str| {
            let output = std::process::Command::new("go")
                .args(["tool", "pprof", "-top", "-unit=B", &format!("-sample_index={sample_index}")])
                .arg(&path)
                .output()
                .unwrap();
            assert!(output.status.success(), "go tool pprof failed: {}", String::from_utf8_lossy(&output.stderr));
            String::from_utf8(output.stdout).unwrap()
        };
        // "4096B 80.00% 80.00% 4096B 80.00%  make_buffer (inline)": flat first, the name sixth.
        let flat = |report: &str, function: &str| -> Option<String> {
            let columns = report.lines().map(|line| line.split_whitespace().collect::<Vec<_>>());
            columns.filter(|columns| columns.get(5) == Some(&function)).map(|columns| columns[0].to_string()).next()
        };
        let live = top("live_space");
        assert_eq!(flat(&live, "make_buffer").as_deref(), Some("4096B"), "{live}");
        assert!(live.contains("make_buffer (inline)"), "{live}");
        assert_eq!(flat(&live, "load_config").as_deref(), Some("1024B"), "{live}");
        let allocated = top("alloc_space");
        assert_eq!(flat(&allocated, "libplugin.so+0x2a0").as_deref(), Some("512B"), "{allocated}");
        assert_eq!(flat(&allocated, "0xdead").as_deref(), Some("0"), "{allocated}");
        assert!(allocated.contains("Type: alloc_space") && allocated.contains("File: server"), "{allocated}");
    }

    #[test]
    fn flamegraph_names_the_functions() {
        let svg = flamegraph_svg(&stacks(), 0, "bytes", "Live heap at peak").unwrap();
        assert!(svg.starts_with("<?xml") && svg.contains("<svg"));
        for text in ["Live heap at peak", "make_buffer", "load_config", "4,096 bytes"] {
            assert!(svg.contains(text), "missing {text:?}");
        }
        assert!(flamegraph_svg(&stacks(), 1, "bytes", "Nothing here").is_ok());
        assert!(flamegraph_svg(&stacks(), 9, "bytes", "Nothing here").is_err());
    }
}
