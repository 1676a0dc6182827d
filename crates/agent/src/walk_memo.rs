//! Whole stack walks, remembered per thread.
//!
//! A walk is a function of the registers it starts from, the unwind rules
//! (fixed while the modules are) and the stack words it reads. A walk that
//! starts where a remembered one started and finds every word that one
//! read unchanged must end in the same frames, so checking those words (one
//! or two a frame, in the cache already) replaces unwinding them again.
//!
//! Some words a walk reads are not code but saved frame pointers, an
//! ordinary register in most code whose value differs from call to call.
//! So each new walk has a twin that reads those words (and starts from a
//! frame pointer) poisoned: when the twin reads the same places and ends in
//! the same frames, the values did not matter, and later recalls check only
//! the code words, the word that ended the walk, and the refused reads.
//! Otherwise (frame-pointer code) every word is checked, and the frame
//! pointer must repeat, as it does there with the stack pointer.
//!
//! A recall starts at the stack pointer of the walk it recalls, on the same
//! thread: its reads have the walk's bounds, so a read the walk's bounds
//! refused would be refused again and one they allowed is allowed again.
//! Refused reads are therefore not kept, and a recall reads the kept words
//! without checking bounds again.
//!
//! Programs whose walks rarely repeat (deep recursion of varying depth)
//! would pay the second walk for nothing: a window in which few walks were
//! recalled pauses remembering for a while.

use alloc::vec::Vec;

/// A stack word a walk read: its address and value, or with `REFUSED` set
/// in the address, a read the walk's bounds refused (the address alone
/// decides that, for a walk that starts at the same stack pointer).
pub type Read = (u64, u64);
pub const REFUSED: u64 = 1 << 63;

/// Remembered walks per thread: sets picked by stack pointer, of `WAYS`
/// walks each (several call paths reach malloc at the same depth), the
/// most recently used first: a recall checks it first, and a new walk
/// replaces the least recently used. (Replacing in turn and checking in
/// slot order made a program whose calls come in runs along several paths
/// of one depth compare most of a wrong walk's words before the right one.)
const SETS: usize = 32;
const WAYS: usize = 16;
/// Captures per window; a window with fewer recalls than a quarter of them
/// pauses remembering for `PAUSE_WINDOWS` windows.
const WINDOW: u32 = 4096;
const PAUSE_WINDOWS: u32 = 16;

#[derive(Clone, Default)]
struct Remembered {
    ip: u64,
    sp: u64,
    /// The frame pointer the walk depended on, if it did: `bp_mask` is
    /// then all ones, else 0 (a mask rather than an Option: one test).
    bp: u64,
    bp_mask: u64,
    /// The unwinder's module generation when walked.
    modules: u64,
    reads: Vec<Read>,
    token: u32,
}

#[derive(Default)]
pub struct WalkMemo {
    slots: Vec<Remembered>,
    /// The walk of the current capture, until [`WalkMemo::remember`] gives
    /// its token; cleared when the next capture begins.
    pending: Option<Remembered>,
    /// A buffer for the next walk's reads (an evicted walk's).
    spare: Vec<Read>,
    /// Scratch for a walk's reads, which of them are exact, and its twin's frames.
    pub log: Vec<Read>,
    pub exact: Vec<bool>,
    pub twin_frames: Vec<u64>,
    captures: u32,
    recalls: u32,
    paused_windows: u32,
}

impl WalkMemo {
    /// A capture begins: forgets a walk nobody remembered, counts the
    /// capture, and says whether to remember (false while paused).
    #[inline]
    pub fn begin(&mut self) -> bool {
        if let Some(unclaimed) = self.pending.take() {
            self.spare = unclaimed.reads;
        }
        self.captures += 1;
        if self.captures == WINDOW {
            if self.paused_windows > 0 {
                self.paused_windows -= 1;
            } else if self.recalls < WINDOW / 4 {
                self.paused_windows = PAUSE_WINDOWS;
            }
            (self.captures, self.recalls) = (0, 0);
        }
        self.paused_windows == 0
    }

    fn set(sp: u64) -> core::ops::Range<usize> {
        // Stack pointers are 16-byte aligned and nearby: hash the bits above.
        let set = ((sp >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % SETS;
        set * WAYS..(set + 1) * WAYS
    }

    /// The token of a remembered walk from these registers whose kept
    /// words all still hold; `read` reads a word the walk read (within
    /// its bounds, see the module's notes).
    #[inline(always)]
    pub fn recall(&mut self, ip: u64, sp: u64, bp: u64, modules: u64, read: impl Fn(u64) -> u64) -> Option<u32> {
        let ways = self.slots.get_mut(Self::set(sp))?;
        // The most recently used walk of the set, nearly always the one.
        let first = ways.first()?;
        if first.holds(ip, sp, bp, modules, &read) {
            self.recalls += 1;
            return Some(first.token);
        }
        self.recall_other_way(ip, sp, bp, modules, &read)
    }

    /// [`Self::recall`] past the most recently used walk of the set.
    #[inline(never)]
    fn recall_other_way(&mut self, ip: u64, sp: u64, bp: u64, modules: u64, read: &impl Fn(u64) -> u64) -> Option<u32> {
        let ways = self.slots.get_mut(Self::set(sp))?;
        let way = ways.iter().position(|entry| entry.holds(ip, sp, bp, modules, read))?;
        ways[..=way].rotate_right(1);
        self.recalls += 1;
        Some(ways[0].token)
    }

    /// Keeps the walk just made, which read `log`, until its token is
    /// known. `exact`: when its poisoned twin agreed, which reads to check.
    pub fn walked(&mut self, ip: u64, sp: u64, bp: u64, modules: u64, log: &[Read], exact: Option<&[bool]>) {
        let mut reads = core::mem::take(&mut self.spare);
        reads.clear();
        let allowed = |read: &&Read| read.0 & REFUSED == 0;
        match exact {
            Some(exact) => reads.extend(log.iter().zip(exact).filter(|(_, exact)| **exact).map(|(read, _)| read).filter(allowed)),
            None => reads.extend(log.iter().filter(allowed)),
        }
        // An even count, for `reads_hold`: the last word twice.
        if let Some(&last) = reads.last()
            && reads.len() % 2 == 1
        {
            reads.push(last);
        }
        let bp_mask = if exact.is_none() { u64::MAX } else { 0 };
        self.pending = Some(Remembered { ip, sp, bp: bp & bp_mask, bp_mask, modules, reads, token: 0 });
    }

    /// Remembers the pending walk under `token` (the caller's stack id).
    pub fn remember(&mut self, token: u32) {
        let Some(mut walk) = self.pending.take() else { return };
        // A walk that read nothing (it ended before the first frame) is
        // not worth a slot: recalling it would check nothing.
        if walk.reads.is_empty() {
            self.spare = walk.reads;
            return;
        }
        if self.slots.is_empty() {
            self.slots = alloc::vec![Remembered::default(); SETS * WAYS];
        }
        walk.token = token;
        let ways = &mut self.slots[Self::set(walk.sp)];
        ways.rotate_right(1);
        // The evicted walk's buffer serves the next walk.
        self.spare = core::mem::replace(&mut ways[0], walk).reads;
    }
}

impl Remembered {
    /// Whether this is a walk from these registers whose kept words all
    /// still hold.
    #[inline(always)]
    fn holds(&self, ip: u64, sp: u64, bp: u64, modules: u64, read: &impl Fn(u64) -> u64) -> bool {
        self.sp == sp && self.ip == ip && self.modules == modules && (self.bp ^ bp) & self.bp_mask == 0 && reads_hold(&self.reads, read)
    }
}

/// Whether every word in `reads` (an even count, see
/// [`WalkMemo::walked`]) still holds its value, and there is one. Two
/// words a step, their differences or-ed: one branch per pair.
#[inline(always)]
fn reads_hold(reads: &[Read], read: &impl Fn(u64) -> u64) -> bool {
    for pair in reads.chunks_exact(2) {
        if (read(pair[0].0) ^ pair[0].1) | (read(pair[1].0) ^ pair[1].1) != 0 {
            return false;
        }
    }
    !reads.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memo_with(reads: &[Read], exact: Option<&[bool]>, token: u32) -> WalkMemo {
        let mut memo = WalkMemo::default();
        memo.walked(0x10, 0x7000, 0x55, 1, reads, exact);
        memo.remember(token);
        memo
    }

    #[test]
    fn recalls_only_when_every_word_read_is_unchanged() {
        let reads = [(0x7008, 0x401000), (0x7010, 0x1234), (0x7030, 0x402000), (0x6000 | REFUSED, 0)];
        let mut memo = memo_with(&reads, Some(&[true, false, true, true]), 7);
        let asked = core::cell::RefCell::new(Vec::new());
        let stack = |changed: Option<u64>| {
            let asked = &asked;
            move |at: u64| {
                asked.borrow_mut().push(at);
                match at {
                    0x7008 => 0x401000,
                    0x7030 => changed.unwrap_or(0x402000),
                    _ => 0xdead,
                }
            }
        };
        assert_eq!(memo.recall(0x10, 0x7000, 0x99, 1, stack(None)), Some(7), "bp and the saved word at 0x7010 did not matter");
        assert_eq!(*asked.borrow(), [0x7008, 0x7030], "only the exact words, never a refused one");
        assert_eq!(memo.recall(0x10, 0x7000, 0x99, 1, stack(Some(0x403000))), None, "a return address changed");
        assert_eq!(memo.recall(0x10, 0x7010, 0x99, 1, stack(None)), None, "another stack pointer");
        assert_eq!(memo.recall(0x10, 0x7000, 0x99, 2, stack(None)), None, "modules changed");
    }

    #[test]
    fn a_walk_whose_twin_disagreed_is_recalled_only_with_every_word_and_the_frame_pointer() {
        let mut memo = memo_with(&[(0x7008, 0x401000), (0x7010, 0x1234)], None, 3);
        let stack = |at: u64| if at == 0x7008 { 0x401000 } else { 0x1234 };
        assert_eq!(memo.recall(0x10, 0x7000, 0x55, 1, stack), Some(3));
        assert_eq!(memo.recall(0x10, 0x7000, 0x56, 1, stack), None);
        assert_eq!(memo.recall(0x10, 0x7000, 0x55, 1, |at| if at == 0x7010 { 0x1235 } else { stack(at) }), None, "every word is checked");
    }

    #[test]
    fn a_walk_that_only_read_refused_words_is_not_kept() {
        let mut memo = memo_with(&[(0x6000 | REFUSED, 0)], Some(&[true]), 5);
        assert_eq!(memo.recall(0x10, 0x7000, 0x55, 1, |_| 0), None);
    }

    /// A memo whose set for stack pointer 0x7000 holds walks 1..=WAYS,
    /// each told apart by the word it read.
    fn full_set() -> WalkMemo {
        let mut memo = WalkMemo::default();
        for token in 1..=WAYS as u32 {
            memo.walked(0x10, 0x7000, 0, 1, &[(0x7008, u64::from(token))], Some(&[true]));
            memo.remember(token);
        }
        memo
    }

    #[test]
    fn walks_from_one_stack_pointer_share_a_set() {
        let mut memo = full_set();
        for token in 1..=WAYS as u32 {
            assert_eq!(memo.recall(0x10, 0x7000, 0, 1, |_| u64::from(token)), Some(token));
        }
        memo.walked(0x10, 0x7000, 0, 1, &[(0x7008, 99)], Some(&[true]));
        memo.remember(99);
        assert_eq!(memo.recall(0x10, 0x7000, 0, 1, |_| 1), None, "the least recently recalled was replaced");
        assert_eq!(memo.recall(0x10, 0x7000, 0, 1, |_| 99), Some(99));
    }

    #[test]
    fn the_least_recently_recalled_walk_is_replaced() {
        let mut memo = full_set();
        assert_eq!(memo.recall(0x10, 0x7000, 0, 1, |_| 1), Some(1), "the oldest, now the most recent");
        memo.walked(0x10, 0x7000, 0, 1, &[(0x7008, 99)], Some(&[true]));
        memo.remember(99);
        assert_eq!(memo.recall(0x10, 0x7000, 0, 1, |_| 2), None, "the least recently used was replaced");
        for token in [1, 3, 4, 99] {
            assert_eq!(memo.recall(0x10, 0x7000, 0, 1, |_| u64::from(token)), Some(token));
        }
    }

    #[test]
    fn a_walk_not_remembered_before_the_next_capture_is_forgotten() {
        let mut memo = WalkMemo::default();
        memo.begin();
        memo.walked(0x10, 0x7000, 0, 1, &[(0x7008, 0x401000)], Some(&[true]));
        // No token for it (the walk found no frames); the next capture walks
        // without remembering (paused) and its caller remembers a token.
        memo.begin();
        memo.remember(9);
        assert_eq!(memo.recall(0x10, 0x7000, 0, 1, |_| 0x401000), None);
    }

    #[test]
    fn remembering_pauses_after_a_window_of_few_recalls() {
        let mut memo = WalkMemo::default();
        assert!((0..WINDOW - 1).all(|_| memo.begin()));
        assert!(!memo.begin(), "no recalls in a whole window");
        assert!((0..WINDOW * PAUSE_WINDOWS - 1).all(|_| !memo.begin()));
        assert!(memo.begin(), "remembering resumes");
    }
}
