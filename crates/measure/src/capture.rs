//! A command's stdout and stderr, captured to compare and to explain failures.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::process::Stdio;

/// An unlinked temporary file: read only after the command ended, so a
/// background process that keeps the descriptor open cannot block memgap,
/// and memgap's own memory does not grow with the output.
pub struct Capture {
    file: File,
}

/// FNV-1a, 64 bits: enough to tell outputs apart, stable across builds
/// (std's hasher is not).
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Capture {
    pub fn new() -> io::Result<Capture> {
        Ok(Capture { file: tempfile::tempfile()? })
    }

    pub fn stdio(&self) -> io::Result<Stdio> {
        Ok(Stdio::from(self.file.try_clone()?))
    }

    /// The hash of everything written, and its length in bytes.
    pub fn hash(&mut self) -> io::Result<(u64, u64)> {
        self.file.seek(SeekFrom::Start(0))?;
        let mut hash = FNV_OFFSET;
        let mut length = 0u64;
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = self.file.read(&mut buffer)?;
            if n == 0 {
                return Ok((hash, length));
            }
            for &byte in &buffer[..n] {
                hash = (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
            }
            length += n as u64;
        }
    }

    /// Every line, lossily decoded; `None` when there is more than
    /// `max_bytes` (then only the hash is compared).
    pub fn lines(&mut self, max_bytes: u64) -> io::Result<Option<Vec<String>>> {
        let length = self.file.seek(SeekFrom::End(0))?;
        if length > max_bytes {
            return Ok(None);
        }
        self.file.seek(SeekFrom::Start(0))?;
        let mut bytes = Vec::with_capacity(length as usize);
        self.file.read_to_end(&mut bytes)?;
        Ok(Some(String::from_utf8_lossy(&bytes).lines().map(String::from).collect()))
    }

    /// The last whole lines within `max_bytes` of the end, lossily decoded.
    pub fn tail(&mut self, max_bytes: u64) -> io::Result<String> {
        let length = self.file.seek(SeekFrom::End(0))?;
        let start = length.saturating_sub(max_bytes);
        self.file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        self.file.read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes);
        let whole_lines = match text.find('\n') {
            Some(newline) if start > 0 => &text[newline + 1..],
            _ => &text[..],
        };
        Ok(whole_lines.trim_end().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn hash_and_tail() {
        let mut capture = Capture::new().unwrap();
        assert_eq!(capture.hash().unwrap(), (FNV_OFFSET, 0));
        capture.file.write_all(b"first line\nsecond line\nthird\n").unwrap();
        let (hash, length) = capture.hash().unwrap();
        assert_eq!(length, 29);
        let mut again = Capture::new().unwrap();
        again.file.write_all(b"first line\nsecond line\nthird\n").unwrap();
        assert_eq!(again.hash().unwrap().0, hash);
        assert_eq!(capture.tail(12).unwrap(), "third");
        assert_eq!(capture.tail(1000).unwrap(), "first line\nsecond line\nthird");
        assert_eq!(capture.lines(1000).unwrap().unwrap(), ["first line", "second line", "third"]);
        assert_eq!(capture.lines(28).unwrap(), None);
    }

    #[test]
    fn fnv_reference_value() {
        let mut capture = Capture::new().unwrap();
        capture.file.write_all(b"a").unwrap();
        assert_eq!(capture.hash().unwrap().0, 0xaf63_dc4c_8601_ec8c);
    }
}
