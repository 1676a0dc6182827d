//! The live set's table: block address → value, open addressing with
//! linear probing.
//!
//! Why not a `HashMap`: a replay is bound by the cache miss of each free
//! (the block was allocated long ago, its slot is anywhere in a table of
//! megabytes). This table can say where an address's slot is, so the replay
//! prefetches it some events before the free reaches it; a general map
//! cannot. Deletion shifts later entries back (no tombstones), so a table
//! that churns for hours never degrades.

/// Slots for at least this many entries are allocated on the first insert.
const MIN_SLOTS: usize = 1 << 10;

#[derive(Debug, Clone)]
pub(crate) struct AddressTable<V> {
    /// Key 0 marks an empty slot: no block lives at address 0.
    slots: Vec<(u64, V)>,
    len: usize,
    /// 64 − log2(slots.len()): the hash's top bits pick the home slot.
    shift: u32,
}

impl<V> Default for AddressTable<V> {
    fn default() -> Self {
        AddressTable { slots: Vec::new(), len: 0, shift: 64 }
    }
}

impl<V: Copy + Default> AddressTable<V> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn home(&self, key: u64) -> usize {
        // Fibonacci hashing: the multiply spreads the low bits (addresses
        // are 16-byte aligned) into the top bits kept by the shift.
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot holding `key`, if any.
    fn find(&self, key: u64) -> Option<usize> {
        if key == 0 || self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            match self.slots[i].0 {
                0 => return None,
                k if k == key => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    pub(crate) fn get(&self, key: u64) -> Option<&V> {
        self.find(key).map(|i| &self.slots[i].1)
    }

    pub(crate) fn contains(&self, key: u64) -> bool {
        self.find(key).is_some()
    }

    /// Asks the CPU to fetch the cache lines where `key`'s search starts:
    /// its home slot and the next, which a search or a removal's shift
    /// usually reads too.
    #[inline]
    pub(crate) fn prefetch(&self, key: u64) {
        if self.slots.is_empty() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let home = self.home(key);
            for slot in [&self.slots[home], &self.slots[(home + 1) & self.mask()]] {
                // SAFETY: a prefetch has no effect but on caches.
                unsafe { core::arch::x86_64::_mm_prefetch((slot as *const (u64, V)).cast::<i8>(), core::arch::x86_64::_MM_HINT_T0) };
            }
        }
    }

    /// Inserts or replaces; returns the value that was there. `key` must not be 0.
    pub(crate) fn insert(&mut self, key: u64, value: V) -> Option<V> {
        debug_assert_ne!(key, 0);
        // At most 5/8 full: linear probing's searches stay short.
        if (self.len + 1) * 8 > self.slots.len() * 5 {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            match self.slots[i].0 {
                0 => {
                    self.slots[i] = (key, value);
                    self.len += 1;
                    return None;
                }
                k if k == key => return Some(std::mem::replace(&mut self.slots[i].1, value)),
                _ => i = (i + 1) & mask,
            }
        }
    }

    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        let mut hole = self.find(key)?;
        let value = self.slots[hole].1;
        self.len -= 1;
        // Backward shift: move each later entry of the run into the hole
        // when the hole lies between its home and where it sits.
        let mask = self.mask();
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let k = self.slots[i].0;
            if k == 0 {
                break;
            }
            let home = self.home(k);
            let distance_to_entry = i.wrapping_sub(home) & mask;
            let distance_to_hole = hole.wrapping_sub(home) & mask;
            if distance_to_hole <= distance_to_entry {
                self.slots[hole] = self.slots[i];
                hole = i;
            }
        }
        self.slots[hole] = (0, V::default());
        Some(value)
    }

    fn grow(&mut self) {
        let count = (self.slots.len() * 2).max(MIN_SLOTS);
        let mut slots = Vec::with_capacity(count);
        advise_huge_pages(&slots);
        slots.resize(count, (0, V::default()));
        let old = std::mem::replace(&mut self.slots, slots);
        self.shift = 64 - count.trailing_zeros();
        self.len = 0;
        for (key, value) in old {
            if key != 0 {
                self.insert(key, value);
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        *self = AddressTable::default();
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.slots.iter().filter(|(key, _)| *key != 0).map(|(key, value)| (*key, value))
    }
}

/// Asks for transparent huge pages under a big table (where the kernel
/// leaves that to madvise): lookups land anywhere in it, and with 4 KiB
/// pages most of them would also miss the TLB.
fn advise_huge_pages<T>(slots: &Vec<T>) {
    const HUGE_PAGE: usize = 2 << 20;
    let bytes = slots.capacity() * std::mem::size_of::<T>();
    if bytes < 2 * HUGE_PAGE {
        return;
    }
    let start = (slots.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
    let end = (slots.as_ptr() as usize + bytes) & !(HUGE_PAGE - 1);
    if end > start {
        // SAFETY: advice on pages of our own allocation; it changes no contents.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
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

    #[test]
    fn zero_is_never_found() {
        let mut table: AddressTable<u32> = AddressTable::default();
        assert_eq!(table.remove(0), None);
        table.insert(16, 1);
        assert!(!table.contains(0));
        table.prefetch(0);
    }
}
