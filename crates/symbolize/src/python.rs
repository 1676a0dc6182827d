//! Python frames: a stack's Python values (see [`memgap_trace::python`])
//! named by the PYTHON_CODE records of the trace (file, qualified name, the
//! line its instruction is on), and placed where the interpreter ran them:
//! each run of the eval loop (`_PyEval_EvalFrameDefault` in the native
//! stack) stands for the Python frames it ran, from the innermost Python
//! frame to the one the interpreter was entered for.

use memgap_trace::python::{LINE_TABLE_CPYTHON_311, PythonCode, decode_frame, is_python_frame};
use rustc_hash::FxHashMap;

use crate::Frame;

/// The interpreter's eval loop, whose native frames the Python frames replace.
const EVAL_FUNCTION: &str = "_PyEval_EvalFrameDefault";

/// The code objects of a trace, by (image, id).
#[derive(Debug, Default, Clone)]
pub struct PythonCodes {
    codes: FxHashMap<(u32, u32), PythonCode>,
}

impl PythonCodes {
    pub fn add(&mut self, image: u32, code: &PythonCode) {
        self.codes.insert((image, code.id), code.clone());
    }

    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// The frame a Python value of a stack stands for: `qualified name` in
    /// `file` at the instruction's line (the first line when the
    /// instruction or the code object is unknown).
    pub fn frame(&self, value: u64) -> Option<Frame> {
        let python = decode_frame(value)?;
        let code = self.codes.get(&(python.image as u32, python.code));
        let line = code.map(|code| match (code.line_table_format, python.instruction) {
            (LINE_TABLE_CPYTHON_311, Some(instruction)) => {
                line_311(&code.line_table, code.first_line, instruction).unwrap_or(code.first_line)
            }
            _ => code.first_line,
        });
        Some(Frame {
            function: Some(code.map_or_else(|| format!("<python code {}>", python.code), |code| code.qualified_name.clone())),
            file: code.map(|code| code.file.clone()),
            line,
            module: String::new(),
            module_offset: value,
            inlined: false,
            address: value,
        })
    }

    /// A stack's frames, innermost first: the native ones as `native` names
    /// them, with each run of the eval loop replaced by the Python frames it
    /// ran, as `python_frame` gives them (from [`Self::frame`]). Python
    /// frames left over (a native stack cut at its depth) go outermost.
    /// Frames may be of any form that reads as one (shared ones, say).
    pub fn expand<F: AsRef<Frame>>(
        &self,
        raw: &[u64],
        mut native: impl FnMut(u64) -> Vec<F>,
        mut python_frame: impl FnMut(u64) -> Option<F>,
    ) -> Vec<F> {
        let split = raw.iter().position(|&value| is_python_frame(value)).unwrap_or(raw.len());
        let (addresses, python) = raw.split_at(split);
        // Runs of Python frames, innermost first; each ends at an entry frame.
        let mut runs: Vec<&[u64]> = python.split_inclusive(|&value| decode_frame(value).is_some_and(|frame| frame.entry)).collect();
        runs.reverse();
        let mut frames = Vec::with_capacity(raw.len());
        for &address in addresses {
            let named = native(address);
            let is_eval = named
                .last()
                .and_then(|frame| frame.as_ref().function.as_deref())
                .is_some_and(|function| function.starts_with(EVAL_FUNCTION));
            match runs.pop() {
                Some(run) if is_eval => frames.extend(run.iter().filter_map(|&value| python_frame(value))),
                other => {
                    if let Some(run) = other {
                        runs.push(run);
                    }
                    frames.extend(named);
                }
            }
        }
        while let Some(run) = runs.pop() {
            frames.extend(run.iter().filter_map(|&value| python_frame(value)));
        }
        frames
    }
}

/// Whether `frame` is a Python frame (as [`PythonCodes::frame`] makes them).
pub fn is_python(frame: &Frame) -> bool {
    frame.module.is_empty() && is_python_frame(frame.address)
}

/// The line of the instruction `instruction` (in code units) in CPython
/// 3.11's location table (Objects/locations.md): entries of 1-8 code units,
/// each a first byte `1 code:4 length-1:3` and the code's data.
pub fn line_311(table: &[u8], first_line: u32, instruction: u32) -> Option<u32> {
    let mut line = first_line as i64;
    let mut at = 0usize;
    let mut start = 0u64;
    while at < table.len() {
        let first = table[at];
        if first & 0x80 == 0 {
            return None;
        }
        let code = (first >> 3) & 15;
        let length = (first & 7) as u64 + 1;
        at += 1;
        let (delta, known) = match code {
            15 => (0, false),
            14 => {
                let delta = signed_varint(table, &mut at)?;
                for _ in 0..3 {
                    varint(table, &mut at)?;
                }
                (delta, true)
            }
            13 => (signed_varint(table, &mut at)?, true),
            10..=12 => {
                at += 2;
                (code as i64 - 10, true)
            }
            _ => {
                at += 1;
                (0, true)
            }
        };
        line += delta;
        if (start..start + length).contains(&(instruction as u64)) {
            return (known && line > 0).then_some(line as u32);
        }
        start += length;
    }
    None
}

fn varint(table: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *table.get(*at)?;
        *at += 1;
        value |= ((byte & 63) as u64) << shift;
        if byte & 64 == 0 || shift > 56 {
            return Some(value);
        }
        shift += 6;
    }
}

fn signed_varint(table: &[u8], at: &mut usize) -> Option<i64> {
    let value = varint(table, at)?;
    Some(if value & 1 != 0 { -((value >> 1) as i64) } else { (value >> 1) as i64 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_trace::python::encode_frame;

    /// A function of nine lines (a loop, a call over two lines, an else)
    /// as CPython 3.11.2 compiled it: its `co_linetable`, and the line of
    /// each code unit from `co.co_lines()`.
    const TABLE: &[u8] = &[
        128, 0, 216, 10, 12, 128, 67, 221, 13, 18, 144, 49, 137, 88, 140, 88, 240, 0, 5, 5, 26, 240, 0, 5, 5, 26, 136, 1, 216, 11, 12, 136,
        113, 137, 53, 240, 0, 4, 9, 26, 216, 12, 15, 143, 74, 138, 74, 149, 121, 216, 16, 20, 241, 3, 1, 24, 22, 244, 0, 1, 24, 22, 241, 0,
        1, 13, 23, 244, 0, 1, 13, 23, 240, 0, 1, 13, 23, 240, 0, 1, 13, 23, 240, 6, 0, 13, 16, 143, 74, 138, 74, 144, 113, 137, 77, 140,
        77, 136, 77, 136, 77, 216, 11, 14, 128, 74,
    ];
    const LINES: &[u32] = &[
        1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 6,
        5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 9, 9,
    ];

    #[test]
    fn lines_of_a_311_location_table() {
        for (instruction, &line) in LINES.iter().enumerate() {
            assert_eq!(line_311(TABLE, 1, instruction as u32), Some(line), "code unit {instruction}");
        }
        assert_eq!(line_311(TABLE, 1, LINES.len() as u32), None);
        assert_eq!(line_311(&[0x7f], 1, 0), None, "a table not starting an entry");
    }

    fn native(function: &str, address: u64) -> Frame {
        Frame {
            function: Some(function.into()),
            file: None,
            line: None,
            module: "/usr/bin/python3.11".into(),
            module_offset: address,
            inlined: false,
            address,
        }
    }

    #[test]
    fn python_frames_take_the_place_of_the_eval_loop() {
        let mut codes = PythonCodes::default();
        for (id, name, first_line) in [(1, "grow", 10), (2, "main", 20), (3, "<module>", 1)] {
            codes.add(
                0,
                &PythonCode {
                    id,
                    first_line,
                    line_table_format: 0,
                    file: "/srv/app.py".into(),
                    qualified_name: name.into(),
                    line_table: Vec::new(),
                },
            );
        }
        // grow ← main (one run of the eval loop), then C calls back into <module>.
        let raw = [0x10, 0x20, 0x30, 0x40, 0x50, encode_frame(1, Some(3), false), encode_frame(2, None, true), encode_frame(3, None, true)];
        let names = |address: u64| match address {
            0x10 => vec![native("PyList_Append", 0x10)],
            0x20 | 0x40 => vec![native("_PyEval_EvalFrameDefault", address)],
            0x30 => vec![native("PyObject_Call", 0x30)],
            _ => vec![native("main", address)],
        };
        let frames = codes.expand(&raw, names, |value| codes.frame(value));
        let labels: Vec<String> = frames.iter().map(|f| format!("{}:{}", f.label(), f.line.unwrap_or(0))).collect();
        assert_eq!(labels, ["PyList_Append:0", "grow:10", "main:20", "PyObject_Call:0", "<module>:1", "main:0"]);
        assert!(is_python(&frames[1]) && !is_python(&frames[0]));
        // No eval loop in the native stack (cut short): Python frames outermost.
        let frames = codes.expand(&[0x10, encode_frame(1, None, true)], names, |value| codes.frame(value));
        assert_eq!(frames.iter().map(Frame::label).collect::<Vec<_>>(), ["PyList_Append", "grow"]);
    }
}
