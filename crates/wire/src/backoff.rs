//! The one exponential backoff of every loop that retries a peer (a client reconnecting, a
//! node registering with the manager or waiting for a recovering peer): each pause doubles
//! the next, up to a cap. The coordinator's own retries are timers of its state machine.

use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Pauses of `initial`, then twice that, and so on up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            next: initial.min(max),
            max,
        }
    }

    /// The next pause; the one after it is twice as long, up to the cap.
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(self.max);
        pause
    }

    /// Sleeps the next pause.
    pub async fn pause(&mut self) {
        tokio::time::sleep(self.next_pause()).await;
    }

    /// Sleeps the next pause and returns true, or returns false at once if the pause would
    /// end at or past `until` (the caller's deadline: give up now rather than after it).
    pub async fn pause_before(&mut self, until: Instant) -> bool {
        if Instant::now() + self.next >= until {
            return false;
        }
        self.pause().await;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(20), Duration::from_millis(100));
        let pauses: Vec<u128> = (0..5).map(|_| b.next_pause().as_millis()).collect();
        assert_eq!(pauses, [20, 40, 80, 100, 100]);
    }

    #[tokio::test]
    async fn no_pause_runs_past_the_deadline() {
        let mut b = Backoff::new(Duration::from_millis(30), Duration::from_secs(1));
        let start = Instant::now();
        assert!(b.pause_before(start + Duration::from_millis(200)).await);
        assert!(b.pause_before(start + Duration::from_millis(200)).await);
        // 30 + 60 ms slept; the next pause (120 ms) would end past 200 ms.
        assert!(!b.pause_before(start + Duration::from_millis(200)).await);
        assert!(start.elapsed() < Duration::from_millis(200));
    }
}
