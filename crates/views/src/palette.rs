//! One colour per ledger row, for every view: the report's panels
//! (verdict, timeline, page map, ledger, GHC heap) get them from here as
//! data, the terminal as the nearest xterm-256 colour. A page of the page
//! map takes the colour of the row its bytes fall in.

/// A ledger row's colour: sRGB for the report, an xterm-256 index for the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowColour {
    pub row: &'static str,
    pub rgb: [u8; 3],
    pub xterm: u8,
}

/// The ledger's rows in order, each with its colour.
pub const ROWS: [RowColour; 7] = [
    RowColour { row: "live", rgb: [0x4a, 0x78, 0xc2], xterm: 68 },
    RowColour { row: "slack", rgb: [0x8f, 0xb0, 0xe0], xterm: 110 },
    RowColour { row: "fragmented", rgb: [0xe3, 0xa1, 0x3b], xterm: 214 },
    RowColour { row: "retained", rgb: [0xd0, 0x47, 0x3f], xterm: 167 },
    RowColour { row: "lazy_free", rgb: [0xb5, 0x8a, 0xd6], xterm: 140 },
    RowColour { row: "runtime", rgb: [0x6b, 0xb3, 0x8a], xterm: 72 },
    RowColour { row: "other", rgb: [0xa9, 0xad, 0xb6], xterm: 248 },
];

/// Retained pages malloc_trim cannot reach: the retained colour, darker.
pub const RETAINED_KEPT: RowColour = RowColour { row: "retained", rgb: [0x8c, 0x24, 0x1e], xterm: 124 };
/// memgap's own buffers (counted in other): other's grey, darker.
pub const MEMGAP: RowColour = RowColour { row: "other", rgb: [0x6e, 0x72, 0x7c], xterm: 243 };
/// Pages not resident: in no row.
pub const NOT_RESIDENT: [u8; 3] = [0xe8, 0xe9, 0xed];
/// The kernel's VmRSS, drawn over the rows.
pub const VM_RSS: [u8; 3] = [0x11, 0x11, 0x11];

/// Colours for things that are not ledger rows (a runtime's own heap
/// spaces, stacked), none of them a row's colour.
pub const CATEGORIES: [[u8; 3]; 8] = [
    [0x2f, 0x8f, 0x9d],
    [0x7a, 0x5c, 0x3e],
    [0x5b, 0x4b, 0x9a],
    [0x9d, 0xc3, 0x4b],
    [0xc4, 0x6a, 0xa8],
    [0x8c, 0xd1, 0xd9],
    [0xc9, 0xa8, 0x7c],
    [0x3d, 0x55, 0x6b],
];

/// The colour of a row by name; other's grey for a name not in the ledger.
pub fn row(name: &str) -> RowColour {
    ROWS.iter().copied().find(|c| c.row == name).unwrap_or(ROWS[6])
}

/// `#rrggbb`
pub fn hex(rgb: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2])
}

/// `text` in the colour on a terminal (xterm-256 foreground).
pub fn paint(text: &str, colour: RowColour) -> String {
    format!("\x1b[38;5;{}m{text}\x1b[0m", colour.xterm)
}

/// The palette as the report's script reads it: `rows` (row → `#rrggbb`),
/// and the page map's own entries.
pub fn report_json() -> serde_json::Value {
    let rows: serde_json::Map<String, serde_json::Value> = ROWS.iter().map(|c| (c.row.to_string(), hex(c.rgb).into())).collect();
    serde_json::json!({
        "rows": rows,
        "retained_kept": hex(RETAINED_KEPT.rgb),
        "memgap": hex(MEMGAP.rgb),
        "not_resident": hex(NOT_RESIDENT),
        "vm_rss": hex(VM_RSS),
        "categories": CATEGORIES.iter().map(|&c| hex(c)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The xterm-256 colour cube's channel levels.
    fn xterm_rgb(index: u8) -> [u8; 3] {
        const LEVELS: [u8; 6] = [0, 95, 135, 175, 215, 255];
        match index {
            16..=231 => {
                let i = index - 16;
                [LEVELS[usize::from(i / 36)], LEVELS[usize::from(i / 6 % 6)], LEVELS[usize::from(i % 6)]]
            }
            232..=255 => [8 + 10 * (index - 232); 3],
            _ => panic!("a system colour: {index}"),
        }
    }

    #[test]
    fn terminal_colours_are_near_the_report_colours() {
        for c in ROWS.iter().chain([&RETAINED_KEPT, &MEMGAP]) {
            let t = xterm_rgb(c.xterm);
            let distance = c.rgb.iter().zip(t).map(|(&a, b)| (i32::from(a) - i32::from(b)).abs()).max().unwrap();
            assert!(distance <= 64, "{}: {:?} vs xterm {} {:?}", c.row, c.rgb, c.xterm, t);
        }
    }

    #[test]
    fn every_row_has_its_own_colour() {
        for (i, a) in ROWS.iter().enumerate() {
            for b in &ROWS[i + 1..] {
                assert_ne!(a.rgb, b.rgb);
                assert_ne!(a.xterm, b.xterm);
            }
        }
        assert_eq!(hex(row("fragmented").rgb), "#e3a13b");
        for category in CATEGORIES {
            assert!(ROWS.iter().chain([&RETAINED_KEPT, &MEMGAP]).all(|r| r.rgb != category), "{category:?} is a row's colour");
        }
        assert_eq!(row("no such row"), ROWS[6]);
    }
}
