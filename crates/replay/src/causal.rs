//! Ordering one round's events across threads.
//!
//! Events carry the agent writer's round, not a clock (reading a clock per
//! event costs too much; see `memgap_agent::clock`), so the events of one
//! round from several threads have no order between them but causality: a
//! thread cannot free a block before another thread allocated it, nor
//! allocate an address before another thread freed the block there. Each
//! thread's own order is kept. Only events on addresses that two threads
//! use in the round are constrained; the rest follow their thread. Threads
//! whose addresses in the round lie in ranges apart (each in an arena of
//! its own) share none, which the replay checks before anything else.
//!
//! Finding an order is a search over how far each thread has run. A greedy
//! choice (a thread that had to wait goes as soon as it can, an allocation
//! that its thread keeps goes last) finds it almost always; a bounded
//! backtracking search covers the rest, and when even that gives up (an
//! event was lost, or the round is pathological) the threads run in turn.

use rustc_hash::{FxHashMap, FxHashSet};

use memgap_trace::event::{Event, EventKind};

use crate::ThreadEvent;

/// States the search may visit per round before it settles for the greedy order.
const SEARCH_BUDGET: usize = 100_000;

#[derive(Default)]
pub(crate) struct RoundOrder {
    /// Heap address → the first thread index that used it, or `SHARED`.
    users: FxHashMap<u64, usize>,
    /// Shared address → whether a block starts there at this point.
    live: FxHashMap<u64, bool>,
    /// Per thread: its run's range in the round.
    runs: Vec<(usize, usize)>,
    /// Per thread with heap events: its lowest and highest address.
    extents: Vec<(u64, u64)>,
    /// Per thread: indices of its events on shared addresses.
    constrained: Vec<Vec<usize>>,
    /// Per event: an allocation its thread does not free again in the round.
    keeps: Vec<bool>,
    /// Shared address → (thread, index in `constrained[thread]`) of every
    /// constrained event on it, by thread and then in the thread's order.
    uses: FxHashMap<u64, Vec<(usize, usize)>>,
    ordered: Vec<ThreadEvent>,
}

const SHARED: usize = usize::MAX;

impl RoundOrder {
    /// Orders `events`, one run per thread in that thread's order. `is_live`
    /// tells whether a block starts at an address before the round; `None`:
    /// a block that some thread frees before it allocates there was live.
    pub(crate) fn order(&mut self, events: &mut [ThreadEvent], is_live: impl Fn(u64) -> Option<bool>) {
        if events.len() < 2 || events[0].thread == events[events.len() - 1].thread {
            return;
        }
        self.runs.clear();
        let mut start = 0;
        for i in 1..=events.len() {
            if i == events.len() || events[i].thread != events[start].thread {
                self.runs.push((start, i));
                start = i;
            }
        }
        if !self.find_shared(events) {
            return;
        }
        self.initial_state(events, is_live);
        self.mark_kept(events);
        let first = self.search(events, SEARCH_BUDGET);
        let schedule = first.unwrap_or_else(|| self.search(events, 0).expect("forced moves always finish"));
        self.emit(events, &schedule);
    }

    /// Finds the addresses two threads use; false if there are none.
    fn find_shared(&mut self, events: &[ThreadEvent]) -> bool {
        if self.extents_are_apart(events) {
            return false;
        }
        self.users.clear();
        self.live.clear();
        for (t, &(start, end)) in self.runs.iter().enumerate() {
            for e in &events[start..end] {
                for addr in freed_and_allocated(&e.event).into_iter().flatten() {
                    let user = self.users.entry(addr).or_insert(t);
                    if *user != t && *user != SHARED {
                        *user = SHARED;
                        self.live.insert(addr, false);
                    }
                }
            }
        }
        !self.live.is_empty()
    }

    /// Whether each thread's addresses in the round lie in a range no other
    /// thread's overlaps: then none is shared, and no map of every address
    /// is needed. The usual case: glibc gives each thread an arena of its
    /// own (the map was a fifth of the replay of 4 threads' trace).
    fn extents_are_apart(&mut self, events: &[ThreadEvent]) -> bool {
        let runs = self.runs.iter().map(|&(start, end)| &events[start..end]);
        apart(runs, &mut self.extents)
    }

    /// [`Self::extents_are_apart`] for a round held as one run per thread
    /// (what the replay checks before it copies a round to order it).
    pub(crate) fn runs_are_apart<'a>(&mut self, runs: impl Iterator<Item = &'a [ThreadEvent]>) -> bool {
        apart(runs, &mut self.extents)
    }

    fn initial_state(&mut self, events: &[ThreadEvent], is_live: impl Fn(u64) -> Option<bool>) {
        let mut unknown = FxHashSet::default();
        for (addr, state) in self.live.iter_mut() {
            match is_live(*addr) {
                Some(live) => *state = live,
                None => {
                    unknown.insert(*addr);
                }
            }
        }
        if unknown.is_empty() {
            return;
        }
        let mut first_use: FxHashMap<(u32, u64), bool> = FxHashMap::default();
        for e in events {
            let [freed, allocated] = freed_and_allocated(&e.event);
            for (addr, is_free) in [(freed, true), (allocated, false)] {
                if let Some(addr) = addr {
                    first_use.entry((e.thread, addr)).or_insert(is_free);
                }
            }
        }
        for ((_, addr), is_free) in first_use {
            if is_free && unknown.contains(&addr) {
                self.live.insert(addr, true);
            }
        }
    }

    /// Lists each thread's constrained events, and marks the allocations
    /// its thread does not free again in the round.
    fn mark_kept(&mut self, events: &[ThreadEvent]) {
        self.keeps.clear();
        self.keeps.resize(events.len(), false);
        self.constrained.resize_with(self.runs.len(), Vec::new);
        self.constrained.truncate(self.runs.len());
        let mut freed_later: FxHashSet<u64> = FxHashSet::default();
        for (t, &(start, end)) in self.runs.iter().enumerate() {
            let list = &mut self.constrained[t];
            list.clear();
            freed_later.clear();
            for i in (start..end).rev() {
                let [freed, allocated] = freed_and_allocated(&events[i].event);
                let mut constrained = false;
                if let Some(addr) = allocated.filter(|a| self.live.contains_key(a)) {
                    self.keeps[i] = !freed_later.remove(&addr);
                    constrained = true;
                }
                if let Some(addr) = freed.filter(|a| self.live.contains_key(a)) {
                    freed_later.insert(addr);
                    constrained = true;
                }
                if constrained {
                    list.push(i);
                }
            }
            list.reverse();
        }
        self.uses.clear();
        for (t, list) in self.constrained.iter().enumerate() {
            for (k, &i) in list.iter().enumerate() {
                for addr in freed_and_allocated(&events[i].event).into_iter().flatten() {
                    if self.live.contains_key(&addr) {
                        self.uses.entry(addr).or_default().push((t, k));
                    }
                }
            }
        }
    }

    /// Whether thread `t`'s next constrained event is the only one that can
    /// come next on each shared address it uses: no other thread's next
    /// event on that address could go in its place. Such an event can go
    /// now without loss: any order that runs it later runs no other event
    /// on its addresses before it, so it can be moved up to now.
    fn forced(&self, events: &[ThreadEvent], t: usize, position: &[usize]) -> bool {
        let i = self.constrained[t][position[t]];
        freed_and_allocated(&events[i].event).into_iter().flatten().all(|addr| {
            let Some(&live) = self.live.get(&addr) else { return true };
            let uses = &self.uses[&addr];
            let mut u = 0;
            while u < uses.len() {
                let thread = uses[u].0;
                let run = uses[u..].partition_point(|&(other, _)| other == thread);
                if thread != t
                    && let Some(&(_, k)) = uses[u..u + run].iter().find(|&&(_, k)| k >= position[thread])
                {
                    let [freed, _] = freed_and_allocated(&events[self.constrained[thread][k]].event);
                    // A free (or a realloc in place) needs the block live, an allocation needs it gone.
                    if (freed == Some(addr)) == live {
                        return false;
                    }
                }
                u += run;
            }
            true
        })
    }

    fn ready(&self, e: &Event) -> bool {
        let [freed, allocated] = freed_and_allocated(e);
        let free_ok = freed.is_none_or(|a| self.live.get(&a).is_none_or(|&l| l));
        let alloc_ok = allocated.is_none_or(|a| freed == Some(a) || self.live.get(&a).is_none_or(|&l| !l));
        free_ok && alloc_ok
    }

    /// Applies an event to the shared addresses; returns their old states.
    fn apply(&mut self, e: &Event) -> [Option<(u64, bool)>; 2] {
        let [freed, allocated] = freed_and_allocated(e);
        let mut undo = [None, None];
        for (slot, (addr, now_live)) in [(freed, false), (allocated, true)].into_iter().enumerate() {
            if let Some(addr) = addr
                && let Some(state) = self.live.get_mut(&addr)
            {
                undo[slot] = Some((addr, *state));
                *state = now_live;
            }
        }
        undo
    }

    fn undo(&mut self, undo: [Option<(u64, bool)>; 2]) {
        for (addr, state) in undo.into_iter().rev().flatten() {
            self.live.insert(addr, state);
        }
    }

    /// The threads in the order their constrained events run. With a budget
    /// of 0 it never backtracks: when no thread can go, one goes anyway.
    fn search(&mut self, events: &[ThreadEvent], budget: usize) -> Option<Vec<usize>> {
        struct Frame {
            candidates: Vec<usize>,
            tried: usize,
            undo: [Option<(u64, bool)>; 2],
        }
        let total: usize = self.constrained.iter().map(Vec::len).sum();
        let threads = self.runs.len();
        let mut position = vec![0usize; threads];
        let mut waiting = vec![usize::MAX; threads];
        let mut schedule = Vec::with_capacity(total);
        let mut stack: Vec<Frame> = Vec::new();
        let mut dead_ends: FxHashSet<Vec<usize>> = FxHashSet::default();
        let mut visits = 0usize;
        let saved: Vec<(u64, bool)> = self.live.iter().map(|(&a, &l)| (a, l)).collect();
        let mut current = 0;
        let result = loop {
            if schedule.len() == total {
                break Some(schedule);
            }
            // Candidates, best first: a thread that waited longest, then the
            // current one; allocations that keep their address last.
            let mut candidates: Vec<((bool, usize, bool, usize), usize)> = Vec::new();
            for t in 0..threads {
                let Some(&i) = self.constrained[t].get(position[t]) else { continue };
                if self.ready(&events[i].event) {
                    candidates.push(((self.keeps[i], waiting[t], t != current, (t + threads - current) % threads), t));
                } else {
                    waiting[t] = waiting[t].min(schedule.len());
                }
            }
            candidates.sort_unstable();
            let mut candidates: Vec<usize> = match candidates.iter().find(|&&(_, t)| self.forced(events, t, &position)) {
                Some(&(_, t)) => vec![t],
                None => candidates.into_iter().map(|(_, t)| t).collect(),
            };
            visits += 1;
            if candidates.is_empty() || dead_ends.contains(&position) {
                if budget == 0 {
                    // Forced: an event was lost, or the round has no causal order.
                    candidates.push((0..threads).find(|&t| position[t] < self.constrained[t].len()).expect("events are left"));
                } else {
                    // Back up to the last choice with an untried candidate.
                    loop {
                        if visits > budget {
                            break;
                        }
                        let Some(frame) = stack.last_mut() else { break };
                        dead_ends.insert(position.clone());
                        let t = schedule.pop().expect("a frame per scheduled event");
                        position[t] -= 1;
                        let undo = std::mem::take(&mut frame.undo);
                        self.undo(undo);
                        frame.tried += 1;
                        if frame.tried < frame.candidates.len() {
                            break;
                        }
                        stack.pop();
                    }
                    let Some(frame) = stack.last_mut().filter(|f| f.tried < f.candidates.len() && visits <= budget) else { break None };
                    let t = frame.candidates[frame.tried];
                    let i = self.constrained[t][position[t]];
                    frame.undo = self.apply(&events[i].event);
                    position[t] += 1;
                    schedule.push(t);
                    waiting[t] = usize::MAX;
                    current = t;
                    continue;
                }
            }
            let t = candidates[0];
            let i = self.constrained[t][position[t]];
            let undo = self.apply(&events[i].event);
            if budget > 0 {
                stack.push(Frame { candidates, tried: 0, undo });
            }
            position[t] += 1;
            schedule.push(t);
            waiting[t] = usize::MAX;
            current = t;
        };
        for (addr, state) in saved {
            self.live.insert(addr, state);
        }
        result
    }

    /// Rewrites `events`: each constrained event in schedule order, each
    /// preceded by the rest of its thread's events up to it.
    fn emit(&mut self, events: &mut [ThreadEvent], schedule: &[usize]) {
        self.ordered.clear();
        let mut next: Vec<usize> = self.runs.iter().map(|&(start, _)| start).collect();
        let mut taken = vec![0usize; self.runs.len()];
        for &t in schedule {
            let i = self.constrained[t][taken[t]];
            taken[t] += 1;
            self.ordered.extend_from_slice(&events[next[t]..=i]);
            next[t] = i + 1;
        }
        for (t, &(_, end)) in self.runs.iter().enumerate() {
            self.ordered.extend_from_slice(&events[next[t]..end]);
        }
        events.copy_from_slice(&self.ordered);
    }
}

/// Whether each run's heap addresses lie in a range no other run's
/// overlaps; `extents` is scratch space.
fn apart<'a>(runs: impl Iterator<Item = &'a [ThreadEvent]>, extents: &mut Vec<(u64, u64)>) -> bool {
    extents.clear();
    for run in runs {
        let (mut low, mut high) = (u64::MAX, 0);
        for e in run {
            for addr in freed_and_allocated(&e.event).into_iter().flatten() {
                low = low.min(addr);
                high = high.max(addr);
            }
        }
        if low <= high {
            extents.push((low, high));
        }
    }
    extents.sort_unstable();
    extents.windows(2).all(|pair| pair[0].1 < pair[1].0)
}

/// The heap block an event frees and the one it allocates, if any.
fn freed_and_allocated(e: &Event) -> [Option<u64>; 2] {
    let some = |addr: u64| (addr != 0).then_some(addr);
    match e.kind() {
        EventKind::Free => [some(e.addr), None],
        EventKind::Realloc | EventKind::Reallocarray => {
            // realloc(p, 0) returning NULL freed p; any other NULL is a
            // failure that leaves p alive.
            let freed = if e.addr != 0 || e.size == 0 { some(e.old_addr) } else { None };
            [freed, some(e.addr)]
        }
        kind if kind.is_allocation() => [None, some(e.addr)],
        _ => [None, None],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(thread: u32, kind: EventKind, addr: u64) -> ThreadEvent {
        let size = if kind == EventKind::Free { 0 } else { 32 };
        ThreadEvent { thread, tid: thread, event: Event { time: 7, kind: Some(kind), addr, size, ..Event::default() } }
    }

    fn order(mut events: Vec<ThreadEvent>, live: &[u64], oracle: bool) -> Vec<(u32, EventKind, u64)> {
        let live: FxHashSet<u64> = live.iter().copied().collect();
        RoundOrder::default().order(&mut events, |addr| oracle.then(|| live.contains(&addr)));
        events.iter().map(|e| (e.thread, e.event.kind(), e.event.addr)).collect()
    }

    use EventKind::{Free, Malloc};

    #[test]
    fn a_block_freed_by_one_thread_is_reused_by_another_after_the_free() {
        // A round holds thread 1's run, then thread 2's.
        let events = vec![event(1, Malloc, 0x100), event(1, Malloc, 0x200), event(2, Free, 0x200)];
        let ordered = order(events, &[0x200], true);
        let at = |e| ordered.iter().position(|x| *x == e).unwrap();
        assert!(at((2, Free, 0x200)) < at((1, Malloc, 0x200)), "{ordered:x?}");
        assert!(at((1, Malloc, 0x100)) < at((1, Malloc, 0x200)), "{ordered:x?}");
    }

    #[test]
    fn a_block_handed_to_another_thread_is_freed_after_it_was_allocated() {
        let events = vec![event(1, Free, 0x200), event(2, Malloc, 0x200)];
        assert_eq!(order(events, &[], true), vec![(2, Malloc, 0x200), (1, Free, 0x200)]);
    }

    #[test]
    fn without_an_oracle_a_block_freed_before_any_allocation_was_live() {
        let events = vec![event(1, Malloc, 0x200), event(2, Free, 0x200)];
        assert_eq!(order(events, &[], false), vec![(2, Free, 0x200), (1, Malloc, 0x200)]);
    }

    #[test]
    fn a_round_with_a_lost_event_still_keeps_every_event_and_each_threads_order() {
        // Two frees of one block and no allocation between: no causal order.
        let events = vec![event(1, Free, 0x200), event(1, Malloc, 0x300), event(2, Free, 0x200), event(2, Free, 0x300)];
        let ordered = order(events, &[0x200], true);
        assert_eq!(ordered.len(), 4);
        assert_eq!(ordered.iter().filter(|e| e.0 == 1).map(|e| e.2).collect::<Vec<_>>(), vec![0x200, 0x300]);
        assert_eq!(ordered.iter().filter(|e| e.0 == 2).map(|e| e.2).collect::<Vec<_>>(), vec![0x200, 0x300]);
    }

    #[test]
    fn threads_in_ranges_apart_keep_their_order_without_a_map_of_addresses() {
        // Thread 1 in one arena, thread 2 in another, thread 3 with no heap event.
        let mut events = vec![event(2, Malloc, 0x9000), event(2, Free, 0x9000), event(1, Free, 0x100), event(1, Malloc, 0x200)];
        events.push(ThreadEvent {
            thread: 3,
            tid: 3,
            event: Event { kind: Some(EventKind::Mmap), addr: 0x150, size: 4096, ..Event::default() },
        });
        let before = events.clone();
        let mut round = RoundOrder::default();
        round.order(&mut events, |_| Some(false));
        assert_eq!(events, before);
        assert!(round.users.is_empty(), "no address was looked up");
        // Ranges that overlap with no address in common: the map is built, nothing is shared.
        let mut events = vec![event(1, Malloc, 0x100), event(1, Malloc, 0x300), event(2, Malloc, 0x200)];
        let before = events.clone();
        round.order(&mut events, |_| Some(false));
        assert_eq!(events, before);
        assert_eq!(round.users.len(), 3);
    }

    /// A real interleaving of `threads` threads over `slots` addresses, as
    /// (thread, slot) pairs; each operation frees the block at the slot if
    /// one is live, else allocates one there.
    fn interleaving(threads: u32, slots: u64) -> impl Strategy<Value = (Vec<(u32, u64)>, Vec<bool>)> {
        (proptest::collection::vec((1..=threads, 0..slots), 1..80), proptest::collection::vec(any::<bool>(), slots as usize))
    }

    fn check(ops: Vec<(u32, u64)>, initially_live: Vec<bool>) -> Result<(), TestCaseError> {
        let address = |slot: u64| 0x1000 + slot * 16;
        let start: FxHashSet<u64> = (0..initially_live.len() as u64).filter(|&s| initially_live[s as usize]).map(address).collect();
        let mut live = start.clone();
        let mut happened = Vec::new();
        for (thread, slot) in ops {
            let addr = address(slot);
            let kind = if live.remove(&addr) {
                Free
            } else {
                live.insert(addr);
                Malloc
            };
            happened.push(event(thread, kind, addr));
        }
        let mut round = happened.clone();
        round.sort_by_key(|e| e.thread);
        let rebuilt = order(round, &start.iter().copied().collect::<Vec<_>>(), true);
        let mut live = start;
        for &(_, kind, addr) in &rebuilt {
            match kind {
                Free => prop_assert!(live.remove(&addr), "free of a dead block in {rebuilt:x?}"),
                _ => prop_assert!(live.insert(addr), "allocation over a live block in {rebuilt:x?}"),
            }
        }
        for thread in 1..=4 {
            let mine = |list: Vec<(u32, EventKind, u64)>| list.into_iter().filter(|e| e.0 == thread).collect::<Vec<_>>();
            prop_assert_eq!(mine(rebuilt.clone()), mine(happened.iter().map(|e| (e.thread, e.event.kind(), e.event.addr)).collect()));
        }
        Ok(())
    }

    proptest! {
        /// Any interleaving that really happened, cut into per-thread runs,
        /// is rebuilt into an order that keeps each thread's order and never
        /// frees a dead block nor allocates over a live one.
        #[test]
        fn two_threads_on_few_addresses((ops, live) in interleaving(2, 6)) {
            check(ops, live)?;
        }

        #[test]
        fn four_threads_on_few_addresses((ops, live) in interleaving(4, 6)) {
            check(ops, live)?;
        }
    }
}
