//! A quantity over time (the live heap after every heap event, VmRSS at
//! every sample) kept in bounded memory while the trace is replayed: the
//! lowest and the highest value of each bucket of time, so a drawing at
//! about one bucket per pixel still shows a spike or a drop shorter than a
//! bucket. Buckets start one clock unit wide and double (neighbours merged)
//! whenever the next value falls past the last one, so the length of the
//! run need not be known in advance.

use serde::ser::{Serialize, SerializeTuple, Serializer};

/// One point of a series: serialized as `[seconds, bytes]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeriesPoint {
    pub seconds: f64,
    pub bytes: u64,
}

impl Serialize for SeriesPoint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut pair = serializer.serialize_tuple(2)?;
        pair.serialize_element(&self.seconds)?;
        pair.serialize_element(&self.bytes)?;
        pair.end()
    }
}

impl<'de> serde::Deserialize<'de> for SeriesPoint {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (seconds, bytes) = <(f64, u64)>::deserialize(deserializer)?;
        Ok(SeriesPoint { seconds, bytes })
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// (time, value) of the lowest and of the highest value in the bucket.
    low: (u64, u64),
    high: (u64, u64),
}

impl Bucket {
    fn merge(a: Option<Bucket>, b: Option<Bucket>) -> Option<Bucket> {
        match (a, b) {
            (Some(a), Some(b)) => {
                Some(Bucket { low: if b.low.1 < a.low.1 { b.low } else { a.low }, high: if b.high.1 > a.high.1 { b.high } else { a.high } })
            }
            (a, b) => a.or(b),
        }
    }
}

/// Collects a series in trace time (the clock unit of the trace's events).
#[derive(Debug, Clone)]
pub struct SeriesBuilder {
    /// Buckets kept at most; between half of it and all of it at the end.
    capacity: usize,
    origin: Option<u64>,
    /// Each bucket spans 2^width_log2 clock units.
    width_log2: u32,
    buckets: Vec<Option<Bucket>>,
    last: Option<(u64, u64)>,
}

impl SeriesBuilder {
    /// `buckets`: about how many buckets the finished series spans (it
    /// holds between `buckets` and `2 * buckets` of them, each giving at
    /// most two points).
    pub fn new(buckets: usize) -> SeriesBuilder {
        SeriesBuilder { capacity: 2 * buckets.max(1), origin: None, width_log2: 0, buckets: Vec::new(), last: None }
    }

    /// Called after every heap event: a shift, not a division, finds the bucket.
    #[inline]
    pub fn push(&mut self, time: u64, value: u64) {
        let origin = *self.origin.get_or_insert(time);
        // A time before the first one (threads merged slightly out of order) joins the first bucket.
        let since = time.saturating_sub(origin);
        let bucket_of = |width_log2: u32| since.checked_shr(width_log2).unwrap_or(0);
        let mut index = bucket_of(self.width_log2);
        while index as usize >= self.capacity {
            self.halve();
            index = bucket_of(self.width_log2);
        }
        let index = index as usize;
        if self.buckets.len() <= index {
            self.buckets.resize(index + 1, None);
        }
        let point = (time, value);
        match &mut self.buckets[index] {
            Some(bucket) => {
                if value < bucket.low.1 {
                    bucket.low = point;
                }
                if value > bucket.high.1 {
                    bucket.high = point;
                }
            }
            empty => *empty = Some(Bucket { low: point, high: point }),
        }
        self.last = Some(point);
    }

    #[cold]
    fn halve(&mut self) {
        self.buckets = self.buckets.chunks(2).map(|pair| Bucket::merge(pair[0], pair.get(1).copied().flatten())).collect();
        self.width_log2 += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_none()
    }

    /// The points in time order, each bucket's low and high, and the last
    /// value pushed (the state at the end), times converted to seconds.
    pub fn finish(&self, seconds: impl Fn(u64) -> f64) -> Vec<SeriesPoint> {
        let mut points: Vec<(u64, u64)> = Vec::with_capacity(2 * self.buckets.len() + 1);
        for bucket in self.buckets.iter().flatten() {
            let (first, second) = if bucket.low.0 <= bucket.high.0 { (bucket.low, bucket.high) } else { (bucket.high, bucket.low) };
            points.push(first);
            if second != first {
                points.push(second);
            }
        }
        if let Some(last) = self.last
            && points.last() != Some(&last)
        {
            points.push(last);
        }
        points.sort_by_key(|&(time, _)| time);
        points.dedup();
        points.into_iter().map(|(time, bytes)| SeriesPoint { seconds: seconds(time), bytes }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(values: impl IntoIterator<Item = (u64, u64)>, buckets: usize) -> Vec<SeriesPoint> {
        let mut builder = SeriesBuilder::new(buckets);
        for (time, value) in values {
            builder.push(time, value);
        }
        builder.finish(|t| t as f64)
    }

    #[test]
    fn few_values_are_kept_as_they_are() {
        let points = series([(10, 1), (20, 5), (30, 2)], 100);
        assert_eq!(points.iter().map(|p| (p.seconds, p.bytes)).collect::<Vec<_>>(), vec![(10.0, 1), (20.0, 5), (30.0, 2)]);
    }

    #[test]
    fn a_short_spike_and_a_drop_survive_a_million_values() {
        // Rises slowly to 1,000,000, spikes once, drops to 7 at 900,000 and stays there.
        let values = (0..1_000_000u64).map(|t| {
            (
                t,
                if t == 123_457 {
                    50_000_000
                } else if t >= 900_000 {
                    7
                } else {
                    t
                },
            )
        });
        let points = series(values, 1000);
        assert!(points.len() <= 4001, "{} points", points.len());
        assert!(points.len() >= 1000, "{} points", points.len());
        assert!(points.windows(2).all(|w| w[0].seconds <= w[1].seconds));
        assert!(points.iter().any(|p| p.bytes == 50_000_000 && p.seconds == 123_457.0));
        // The drop: the last high point before it and the first low point after it are close.
        let before = points.iter().rfind(|p| p.bytes > 800_000).unwrap();
        let after = points.iter().find(|p| p.bytes == 7).unwrap();
        assert!(
            before.seconds < 900_000.0 && after.seconds >= 900_000.0 && after.seconds - before.seconds < 2000.0,
            "{before:?} {after:?}"
        );
        assert_eq!(points.last().unwrap().bytes, 7);
    }

    #[test]
    fn out_of_order_times_do_not_panic() {
        let points = series([(100, 1), (50, 2), (u64::MAX, 3), (0, 4)], 4);
        assert_eq!(points.last().unwrap().bytes, 3);
        assert!(points.iter().any(|p| p.bytes == 4));
    }

    #[test]
    fn serializes_as_pairs() {
        let text = serde_json::to_string(&[SeriesPoint { seconds: 0.5, bytes: 4096 }]).unwrap();
        assert_eq!(text, "[[0.5,4096]]");
    }
}
