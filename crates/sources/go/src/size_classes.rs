//! Go's small-object size classes and how many objects fit a span, for the
//! Go version that built the program.
//!
//! The table (sizes and pages per span) is the same from Go 1.19 to 1.26
//! (runtime/sizeclasses.go, internal/runtime/gc/sizeclasses.go). What a span
//! holds has changed (runtime/mheap.go, mspan.init):
//! - Go 1.22+ (allocation headers): spans of pointer-holding objects of at
//!   most 512 bytes keep their pointer bitmap in the span's last
//!   `span bytes / 64` bytes.
//! - The Green Tea GC (default from Go 1.26, `GOEXPERIMENT=greenteagc` in
//!   1.25; `nogreenteagc` turns it off) keeps 128 bytes of mark bits at the
//!   end of every span of objects of 16 to 512 bytes.
//!
//! So a span of 16-byte objects holds 512 of them up to Go 1.25 and 504 in
//! Go 1.26. The figures here are for spans of pointer-free objects; a span of
//! pointer-holding objects of at most 512 bytes fits `span bytes / 64` bytes
//! fewer (Go 1.22+).

/// Object sizes of classes 1..=67 (class 0 is a large object with its own span).
pub const SIZES: [u32; 67] = [
    8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704,
    768, 896, 1024, 1152, 1280, 1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472,
    9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576, 27264, 28672, 32768,
];

/// Runtime pages (8 KiB) per span of each class.
pub const PAGES: [u8; 67] = [
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 2, 1, 2, 1, 3, 2, 3, 1, 3,
    2, 3, 4, 5, 6, 1, 7, 6, 5, 4, 3, 5, 7, 2, 9, 7, 5, 8, 3, 10, 7, 4,
];

/// The runtime's page: `_PageShift = 13`.
pub const RUNTIME_PAGE: u32 = 8192;
/// Largest object size whose span holds its own bitmap (gc.MinSizeForMallocHeader on 64-bit).
const MAX_HEAP_BITS_IN_SPAN: u32 = 512;
/// sizeof(spanInlineMarkBits) in Go 1.25+ (runtime/mgcmark_greenteagc.go).
const INLINE_MARK_BITS: u32 = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeClass {
    pub size: u32,
    pub span_bytes: u32,
    /// Objects a span of pointer-free objects holds.
    pub objects_per_span: u32,
}

/// What a Go version string says about the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runtime {
    pub minor: u32,
    pub green_tea: bool,
}

impl Runtime {
    /// From `runtime.Version()` or the buildinfo: `go1.26.8`,
    /// `go1.26.8-X:nogreenteagc`, `go1.25.1 X:greenteagc`, `devel go1.27-…`.
    /// `None` when it names no Go 1.x release.
    pub fn from_version(version: &str) -> Option<Runtime> {
        let at = version.find("go1.")?;
        let digits: String = version[at + 4..].chars().take_while(|c| c.is_ascii_digit()).collect();
        let minor: u32 = digits.parse().ok()?;
        let experiments: Vec<&str> = version.split_once("X:").map(|(_, x)| x.split(',').map(str::trim).collect()).unwrap_or_default();
        let green_tea = if experiments.contains(&"nogreenteagc") { false } else { experiments.contains(&"greenteagc") || minor >= 26 };
        Some(Runtime { minor, green_tea })
    }

    pub fn classes(&self) -> Vec<SizeClass> {
        SIZES
            .iter()
            .zip(PAGES)
            .map(|(&size, pages)| {
                let span_bytes = u32::from(pages) * RUNTIME_PAGE;
                let reserve = if self.green_tea && (16..=MAX_HEAP_BITS_IN_SPAN).contains(&size) { INLINE_MARK_BITS } else { 0 };
                SizeClass { size, span_bytes, objects_per_span: (span_bytes - reserve) / size }
            })
            .collect()
    }
}

/// The class an object of `size` bytes lands in (`None`: a large object).
pub fn class_of(size: u64) -> Option<usize> {
    let i = SIZES.partition_point(|&s| u64::from(s) < size);
    (i < SIZES.len()).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_per_span_follow_the_version() {
        // Measured: Go 1.19–1.21 fit 512 16-byte objects in a span;
        // Go 1.26's Green Tea GC 504, and 512 again with nogreenteagc.
        let per_span = |v: &str| Runtime::from_version(v).unwrap().classes()[1].objects_per_span;
        assert_eq!(per_span("go1.19.13"), 512);
        assert_eq!(per_span("go1.21.3"), 512);
        assert_eq!(per_span("go1.26.8"), 504);
        assert_eq!(per_span("go1.26.8-X:nogreenteagc"), 512);
        assert_eq!(per_span("go1.25.1 X:greenteagc"), 504);
        assert_eq!(per_span("go1.25.1"), 512);
        // 8-byte objects are below the inline mark bits' minimum.
        assert_eq!(Runtime::from_version("go1.26.0").unwrap().classes()[0].objects_per_span, 1024);
        assert_eq!(Runtime::from_version("unknown"), None);
    }

    #[test]
    fn table_matches_the_runtime_header() {
        // sizeclasses.go: class 67 is 32768 bytes in 4 pages, 1 object; class 40 2688 bytes, 1 page, 3 objects.
        let go = Runtime { minor: 21, green_tea: false }.classes();
        assert_eq!((go[66].size, go[66].span_bytes, go[66].objects_per_span), (32768, 32768, 1));
        assert_eq!((go[39].size, go[39].span_bytes, go[39].objects_per_span), (2688, 8192, 3));
        assert_eq!(class_of(16), Some(1));
        assert_eq!(class_of(17), Some(2));
        assert_eq!(class_of(32769), None);
    }
}
