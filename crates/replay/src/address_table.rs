//! The live set's table: block address → value, open addressing probed a
//! group of 16 slots at a time (the SwissTable design: one control byte per
//! slot holds 7 bits of the key's hash, and one SSE2 compare tests 16 slots).
//!
//! Why not a `HashMap`: a replay of a big heap is bound by the cache miss of
//! each free (the block was allocated long ago, its slot is anywhere in a
//! table of megabytes). This table can say where an address's slot is
//! likely to be — a key sits at the first free slot from its home on — so
//! the replay prefetches it some events before the free reaches it; a
//! general map cannot. Why groups rather than the plain linear probing this
//! table had: with the misses prefetched, a replay was bound by mispredicted
//! branches (how far a probe runs, which entries a delete shifts back); a
//! group compare answers with a bit mask instead.

/// Slots for at least this many entries are allocated on the first insert.
const MIN_SLOTS: usize = 1 << 10;
/// Slots one control-byte compare tests.
const GROUP: usize = 16;
/// Control bytes; a full slot's byte is 7 bits of its key's hash (< 0x80).
const EMPTY: u8 = 0x80;
/// A removed entry's slot, kept non-empty while a probe may have passed it
/// to reach a key further on.
const DELETED: u8 = 0xfe;

#[derive(Debug)]
pub(crate) struct AddressTable<V> {
    /// One byte per slot, then the first GROUP bytes again, so that a group
    /// starting at any slot is one unaligned load.
    ctrl: Vec<u8>,
    slots: Slots<V>,
    len: usize,
    /// Empty slots that may still be filled before the table must grow
    /// (deleted slots do not count: they lengthen probes like full ones).
    growth_left: usize,
    /// 64 − log2(slots.len()): the hash's top bits pick the home slot.
    shift: u32,
}

impl<V> Default for AddressTable<V> {
    fn default() -> Self {
        AddressTable { ctrl: Vec::new(), slots: Slots::default(), len: 0, growth_left: 0, shift: 64 }
    }
}

/// Fibonacci hashing: the multiply spreads the low bits (addresses are
/// 16-byte aligned) into the top bits, which pick the home slot; the 7 bits
/// below them are the control byte.
fn hash(key: u64) -> u64 {
    key.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl<V: Copy + ZeroIsValid> AddressTable<V> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn home(&self, hash: u64) -> usize {
        (hash >> self.shift) as usize
    }

    fn tag(&self, hash: u64) -> u8 {
        (hash >> (self.shift - 7)) as u8 & 0x7f
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    fn group(&self, pos: usize) -> Group {
        Group::load(&self.ctrl[pos..pos + GROUP])
    }

    #[inline(always)]
    fn set_ctrl(&mut self, i: usize, byte: u8) {
        self.ctrl[i] = byte;
        if i < GROUP {
            self.ctrl[self.slots.len() + i] = byte;
        }
    }

    #[inline(always)]
    fn find(&self, key: u64) -> Option<usize> {
        if key == 0 || self.slots.is_empty() {
            return None;
        }
        self.probe(key).ok()
    }

    /// Where `key` is (`Ok`), or else where it would go (`Err`): the first
    /// empty or deleted slot of its probe sequence. The table has slots.
    /// Inlined, like `insert` and `remove`, into the live set's apply: the
    /// calls' prologues and epilogues were a tenth of a replay's instructions.
    #[inline(always)]
    fn probe(&self, key: u64) -> Result<usize, usize> {
        let (hash, mask) = (hash(key), self.mask());
        let tag = self.tag(hash);
        let mut pos = self.home(hash);
        let mut free = None;
        loop {
            let group = self.group(pos);
            let mut matches = group.matching(tag);
            while matches != 0 {
                let i = (pos + matches.trailing_zeros() as usize) & mask;
                if self.slots[i].0 == key {
                    return Ok(i);
                }
                matches &= matches - 1;
            }
            let holes = group.empty_or_deleted();
            if free.is_none() && holes != 0 {
                free = Some((pos + holes.trailing_zeros() as usize) & mask);
            }
            if group.empty() != 0 {
                return Err(free.expect("a group with an empty slot has a free one"));
            }
            pos = (pos + GROUP) & mask;
        }
    }

    pub(crate) fn get(&self, key: u64) -> Option<&V> {
        self.find(key).map(|i| &self.slots[i].1)
    }

    pub(crate) fn contains(&self, key: u64) -> bool {
        self.find(key).is_some()
    }

    /// Fetches into the cache the control bytes from `key`'s home and the
    /// first two slots there, where a key nearly always sits.
    #[inline]
    pub(crate) fn prefetch(&self, key: u64) {
        if self.slots.is_empty() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let home = self.home(hash(key));
            // SAFETY: prefetching never faults, and these are in bounds anyway.
            unsafe {
                _mm_prefetch(self.ctrl.as_ptr().add(home).cast::<i8>(), _MM_HINT_T0);
                _mm_prefetch(self.slots.as_ptr().add(home).cast::<i8>(), _MM_HINT_T0);
                _mm_prefetch(self.slots.as_ptr().add((home + 1) & self.mask()).cast::<i8>(), _MM_HINT_T0);
            }
        }
    }

    /// Inserts or replaces; returns the value that was there. `key` must not be 0.
    #[inline(always)]
    pub(crate) fn insert(&mut self, key: u64, value: V) -> Option<V> {
        debug_assert_ne!(key, 0);
        if self.growth_left == 0 {
            self.rehash();
        }
        let i = match self.probe(key) {
            Ok(i) => return Some(std::mem::replace(&mut self.slots[i].1, value)),
            Err(free) => free,
        };
        if self.ctrl[i] == EMPTY {
            self.growth_left -= 1;
        }
        self.set_ctrl(i, self.tag(hash(key)));
        self.slots[i] = (key, value);
        self.len += 1;
        None
    }

    #[inline(always)]
    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        let i = self.find(key)?;
        let mask = self.mask();
        // If the full slots around `i` leave an empty one in every group a
        // probe could have loaded with `i` in it, no probe passed `i` on its
        // way to another key: the slot may become empty again.
        let empty_before = self.group(i.wrapping_sub(GROUP) & mask).empty();
        let empty_after = self.group(i).empty();
        let passed = (empty_before as u16).leading_zeros() + (empty_after as u16).trailing_zeros() >= GROUP as u32;
        if passed {
            self.set_ctrl(i, DELETED);
        } else {
            self.set_ctrl(i, EMPTY);
            self.growth_left += 1;
        }
        self.len -= 1;
        // The slot keeps its old contents: only the control byte tells.
        Some(self.slots[i].1)
    }

    /// Moves every entry to a fresh table with room for as many again
    /// (or the same room, when deleted slots were what filled it): twice
    /// the slots when full, since the table is full at 5/8.
    ///
    /// The hash's top bits pick the home slot, so reading the old slots in
    /// order fills the new ones in order too: the new table's pages are
    /// touched as the old one's are handed back, and the table never holds
    /// both in full.
    fn rehash(&mut self) {
        let count = (self.len * 16 / 5).next_power_of_two().max(MIN_SLOTS);
        let old_slots = std::mem::replace(&mut self.slots, Slots::zeroed(count));
        let mut ctrl = Vec::with_capacity(count + GROUP);
        advise_huge_pages(&ctrl);
        ctrl.resize(count + GROUP, EMPTY);
        let old_ctrl = std::mem::replace(&mut self.ctrl, ctrl);
        self.shift = 64 - count.trailing_zeros();
        self.growth_left = count * 5 / 8;
        self.len = 0;
        let mut read = 0;
        for (entries, bytes) in old_slots.chunks(REHASH_CHUNK).zip(old_ctrl.chunks(REHASH_CHUNK)) {
            for (entry, &byte) in entries.iter().zip(bytes) {
                if byte < EMPTY {
                    self.insert(entry.0, entry.1);
                }
            }
            read += entries.len();
            old_slots.release_before(read);
        }
        release_pages(&old_ctrl);
    }

    pub(crate) fn clear(&mut self) {
        *self = AddressTable::default();
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.slots.iter().zip(&self.ctrl).filter(|(_, byte)| **byte < EMPTY).map(|((key, value), _)| (*key, value))
    }
}

/// The control bytes of GROUP consecutive slots; each query answers with a
/// bit per slot (bit 0: the first).
struct Group {
    #[cfg(target_arch = "x86_64")]
    bytes: core::arch::x86_64::__m128i,
    #[cfg(not(target_arch = "x86_64"))]
    bytes: [u8; GROUP],
}

#[cfg(target_arch = "x86_64")]
impl Group {
    fn load(ctrl: &[u8]) -> Group {
        use core::arch::x86_64::_mm_loadu_si128;
        assert!(ctrl.len() >= GROUP);
        // SAFETY: SSE2 is part of x86-64; the slice holds GROUP bytes.
        Group { bytes: unsafe { _mm_loadu_si128(ctrl.as_ptr().cast()) } }
    }

    fn matching(&self, byte: u8) -> u32 {
        use core::arch::x86_64::{_mm_cmpeq_epi8, _mm_movemask_epi8, _mm_set1_epi8};
        // SAFETY: SSE2 is part of x86-64.
        unsafe { _mm_movemask_epi8(_mm_cmpeq_epi8(self.bytes, _mm_set1_epi8(byte as i8))) as u32 }
    }

    /// Slots with the high bit set: empty or deleted.
    fn empty_or_deleted(&self) -> u32 {
        use core::arch::x86_64::_mm_movemask_epi8;
        // SAFETY: SSE2 is part of x86-64.
        unsafe { _mm_movemask_epi8(self.bytes) as u32 }
    }

    fn empty(&self) -> u32 {
        self.matching(EMPTY)
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Group {
    fn load(ctrl: &[u8]) -> Group {
        Group { bytes: ctrl[..GROUP].try_into().unwrap() }
    }

    fn matching(&self, byte: u8) -> u32 {
        self.bytes.iter().enumerate().fold(0, |mask, (i, &b)| mask | (u32::from(b == byte) << i))
    }

    fn empty_or_deleted(&self) -> u32 {
        self.bytes.iter().enumerate().fold(0, |mask, (i, &b)| mask | (u32::from(b & 0x80 != 0) << i))
    }

    fn empty(&self) -> u32 {
        self.matching(EMPTY)
    }
}

const HUGE_PAGE: usize = 2 << 20;
/// Old slots a rehash moves before it hands their pages back.
const REHASH_CHUNK: usize = 1 << 15;

/// A value whose bytes may all be zero: the slots of a fresh table are the
/// zero pages of a new mapping, never written before an entry lands there.
///
/// # Safety
/// Every field of the type must be valid with all its bytes zero.
pub(crate) unsafe trait ZeroIsValid {}

// SAFETY: integers.
unsafe impl ZeroIsValid for u32 {}
// SAFETY: integers.
unsafe impl ZeroIsValid for u64 {}
// SAFETY: integers.
unsafe impl ZeroIsValid for usize {}

/// A table's slots, in an anonymous mapping of their own: its pages stay
/// untouched (zero, and not resident) until an entry lands on them, and
/// are handed back to the kernel when the table moves on.
struct Slots<V> {
    ptr: std::ptr::NonNull<(u64, V)>,
    len: usize,
}

// SAFETY: the mapping is owned as a Vec's buffer would be.
unsafe impl<V: Send> Send for Slots<V> {}
// SAFETY: as above; shared access is read-only.
unsafe impl<V: Sync> Sync for Slots<V> {}

impl<V> Default for Slots<V> {
    fn default() -> Self {
        Slots { ptr: std::ptr::NonNull::dangling(), len: 0 }
    }
}

impl<V> std::fmt::Debug for Slots<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slots({})", self.len)
    }
}

impl<V: ZeroIsValid> Slots<V> {
    /// `len` slots, every one zero.
    fn zeroed(len: usize) -> Slots<V> {
        let bytes = Self::bytes(len);
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let address = unsafe {
            libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if address == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(std::alloc::Layout::array::<(u64, V)>(len).expect("a table's size fits a layout"));
        }
        advise(address as usize, bytes, libc::MADV_HUGEPAGE);
        Slots { ptr: std::ptr::NonNull::new(address.cast()).expect("mmap succeeded"), len }
    }
}

impl<V> Slots<V> {
    fn bytes(len: usize) -> usize {
        len.checked_mul(std::mem::size_of::<(u64, V)>()).expect("a table's size fits usize")
    }

    /// Hands back the whole pages of the first `count` slots, which are no
    /// longer read (they read as zero after).
    fn release_before(&self, count: usize) {
        let page = page_size();
        let end = Self::bytes(count.min(self.len)) / page * page;
        if end > 0 {
            // SAFETY: pages of our own mapping, whose slots the caller no longer reads.
            unsafe { libc::madvise(self.ptr.as_ptr().cast(), end, libc::MADV_DONTNEED) };
        }
    }
}

impl<V> std::ops::Deref for Slots<V> {
    type Target = [(u64, V)];
    fn deref(&self) -> &[(u64, V)] {
        // SAFETY: `len` slots mapped at `ptr`, valid as zero or as written.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<V> std::ops::DerefMut for Slots<V> {
    fn deref_mut(&mut self) -> &mut [(u64, V)] {
        // SAFETY: as in deref, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<V> Drop for Slots<V> {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `zeroed`, no longer referred to.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), Self::bytes(self.len)) };
        }
    }
}

fn page_size() -> usize {
    // SAFETY: no precondition.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize
}

/// Asks for transparent huge pages under a big table's array (where the
/// kernel leaves that to madvise): lookups land anywhere in it, and with
/// 4 KiB pages most of them would also miss the TLB.
fn advise_huge_pages<T>(array: &Vec<T>) {
    advise_allocation(array, libc::MADV_HUGEPAGE);
}

/// Gives the pages of an array about to be dropped back to the kernel.
/// `memgap` keeps freed memory for reuse (see its `keep_freed_memory`), but
/// a grown table's old arrays are smaller than anything the table asks for
/// again: kept, they are a large share of the RSS of a report on a big heap.
fn release_pages<T>(array: &Vec<T>) {
    advise_allocation(array, libc::MADV_DONTNEED);
}

/// [`advise`] for `array`'s whole allocation.
fn advise_allocation<T>(array: &Vec<T>, advice: libc::c_int) {
    advise(array.as_ptr() as usize, array.capacity() * std::mem::size_of::<T>(), advice);
}

/// `advice` for the whole huge pages of the `bytes` at `address`, memory
/// of our own (none below 4 MiB).
fn advise(address: usize, bytes: usize, advice: libc::c_int) {
    if bytes < 2 * HUGE_PAGE {
        return;
    }
    let start = address.next_multiple_of(HUGE_PAGE);
    let end = (address + bytes) & !(HUGE_PAGE - 1);
    if end > start {
        // SAFETY: our own allocation's or mapping's pages. MADV_HUGEPAGE
        // changes no contents; MADV_DONTNEED zeroes them, and is only given
        // for an array whose contents are no longer read (the allocator's
        // own bookkeeping sits outside its whole pages, or is written by
        // the free that follows).
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, advice) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Behaves as a map under any inserts and removes, including keys
        /// that collide in a small table (nearby multiples of 16).
        #[test]
        fn matches_a_map(ops in proptest::collection::vec((any::<bool>(), 1u64..3000, any::<u32>()), 0..3000)) {
            let mut table = AddressTable::default();
            let mut model = HashMap::new();
            for (insert, slot, value) in ops {
                let key = slot * 16;
                if insert {
                    prop_assert_eq!(table.insert(key, value), model.insert(key, value));
                } else {
                    prop_assert_eq!(table.remove(key), model.remove(&key));
                }
                prop_assert_eq!(table.len(), model.len());
            }
            for (key, value) in &model {
                prop_assert_eq!(table.get(*key), Some(value));
            }
            let mut listed: Vec<(u64, u32)> = table.iter().map(|(k, v)| (k, *v)).collect();
            listed.sort_unstable();
            let mut expected: Vec<(u64, u32)> = model.into_iter().collect();
            expected.sort_unstable();
            prop_assert_eq!(listed, expected);
        }
    }

    proptest! {
        /// Keys whose homes crowd into 8 slots of the smallest table: long
        /// runs of full slots, so removals leave deleted slots that later
        /// probes must pass and inserts reuse.
        #[test]
        fn matches_a_map_when_keys_crowd(ops in proptest::collection::vec((any::<bool>(), 0usize..250), 0..4000)) {
            let shift = 64 - MIN_SLOTS.trailing_zeros();
            let crowded: Vec<u64> = (1..).map(|k| k * 16).filter(|&key| hash(key) >> shift < 8).take(250).collect();
            let mut table = AddressTable::default();
            let mut model = HashMap::new();
            for (step, (insert, pick)) in ops.into_iter().enumerate() {
                let key = crowded[pick];
                if insert {
                    prop_assert_eq!(table.insert(key, step), model.insert(key, step));
                } else {
                    prop_assert_eq!(table.remove(key), model.remove(&key));
                }
            }
            prop_assert_eq!(table.len(), model.len());
            for key in &crowded {
                prop_assert_eq!(table.get(*key), model.get(key));
            }
            prop_assert_eq!(table.iter().count(), model.len());
        }
    }

    /// Hours of churn at a steady size: removals leave deleted slots, the
    /// table rehashes in place rather than growing, and every key stays
    /// findable through the deleted slots before it.
    #[test]
    fn steady_churn_neither_grows_nor_loses_keys() {
        let mut table = AddressTable::default();
        let mut live = std::collections::VecDeque::new();
        let mut rng = 1u64;
        for step in 0..200_000u64 {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let key = ((rng >> 20) % 100_000 + 1) * 16;
            if table.insert(key, step).is_none() {
                live.push_back(key);
            }
            if live.len() > 300 {
                let old = live.pop_front().unwrap();
                assert!(table.remove(old).is_some());
            }
        }
        assert_eq!(table.len(), live.len());
        assert_eq!(table.slots.len(), MIN_SLOTS, "300 live keys fit the smallest table");
        assert!(live.iter().all(|&key| table.contains(key)));
        assert_eq!(table.iter().count(), live.len());
    }

    /// Each growth doubles the slots: a table that quadrupled held a big
    /// heap's blocks in four times the memory they need at its peak.
    #[test]
    fn a_full_table_doubles() {
        let mut table = AddressTable::default();
        let mut sizes = vec![];
        for key in 1..=200_000u64 {
            table.insert(key * 16, key);
            if sizes.last() != Some(&table.slots.len()) {
                sizes.push(table.slots.len());
            }
        }
        assert_eq!(sizes, (10..=19).map(|bits| 1usize << bits).collect::<Vec<_>>());
        assert!((1..=200_000u64).all(|key| table.get(key * 16) == Some(&key)));
    }

    /// Resident pages of `slots`, by mincore.
    fn resident_pages(slots: &Slots<u64>) -> usize {
        let page = page_size();
        let bytes = Slots::<u64>::bytes(slots.len);
        let mut vec = vec![0u8; bytes.div_ceil(page)];
        // SAFETY: our own page-aligned mapping of `bytes`, one byte per page in `vec`.
        assert_eq!(unsafe { libc::mincore(slots.ptr.as_ptr().cast(), bytes, vec.as_mut_ptr()) }, 0);
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// A fresh table's slots cost no memory until entries land on them, and
    /// the slots a rehash has read are handed back (they read as zero after).
    #[test]
    fn slots_are_resident_only_where_written_and_until_released() {
        let page = page_size();
        let per_page = page / std::mem::size_of::<(u64, u64)>();
        let mut slots: Slots<u64> = Slots::zeroed(64 * per_page);
        assert_eq!(resident_pages(&slots), 0);
        assert!(slots.iter().step_by(per_page).all(|&slot| slot == (0, 0)));
        for (i, slot) in slots.iter_mut().enumerate() {
            *slot = (i as u64, !(i as u64));
        }
        assert_eq!(resident_pages(&slots), 64);
        slots.release_before(10 * per_page + per_page / 2);
        assert_eq!(resident_pages(&slots), 54);
        assert!(slots[..10 * per_page].iter().all(|&slot| slot == (0, 0)));
        assert!(slots[10 * per_page..].iter().enumerate().all(|(i, &(key, value))| key == (10 * per_page + i) as u64 && value == !key));
    }

    #[test]
    fn zero_is_never_found() {
        let mut table: AddressTable<u32> = AddressTable::default();
        assert_eq!(table.remove(0), None);
        table.insert(16, 1);
        assert!(!table.contains(0));
        table.prefetch(0);
    }
}
