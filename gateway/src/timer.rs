//! hyper's timer for the listeners, its sleeps kept for the next: a connection's header-read
//! timeout is set anew for every request, and a kept sleep pushed to a later deadline keeps
//! its place in Tokio's timer wheel. A new place for each request costs an insertion and a
//! removal, and often a write to wake the runtime's driver (a system call).

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

/// The most sleeps kept for later.
const MAX_SPARE: usize = 1024;

type Spare = Arc<Mutex<Vec<Pin<Box<tokio::time::Sleep>>>>>;

/// A [`hyper::rt::Timer`] over Tokio's, whose sleeps go back to a shared store when hyper
/// drops them, and come out of it set to their new deadline.
#[derive(Clone, Default)]
pub(crate) struct KeptTimer {
    spare: Spare,
}

impl KeptTimer {
    fn kept(&self, deadline: tokio::time::Instant) -> KeptSleep {
        let kept = crate::locked(&self.spare).pop();
        let inner = match kept {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        KeptSleep {
            inner: Some(inner),
            spare: Arc::clone(&self.spare),
        }
    }
}

impl hyper::rt::Timer for KeptTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.kept(tokio::time::Instant::now() + duration))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.kept(deadline.into()))
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<KeptSleep>() {
            Some(kept) => kept.get_mut().sleep().reset(new_deadline.into()),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }

    fn now(&self) -> Instant {
        tokio::time::Instant::now().into()
    }
}

/// A sleep of [`KeptTimer`]'s: Tokio's, given back when dropped.
struct KeptSleep {
    /// `None` only once dropped.
    inner: Option<Pin<Box<tokio::time::Sleep>>>,
    spare: Spare,
}

impl KeptSleep {
    fn sleep(&mut self) -> Pin<&mut tokio::time::Sleep> {
        self.inner.as_mut().expect("taken only on drop").as_mut()
    }
}

impl Future for KeptSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().sleep().poll(cx)
    }
}

impl hyper::rt::Sleep for KeptSleep {}

impl Drop for KeptSleep {
    fn drop(&mut self) {
        if let Some(sleep) = self.inner.take() {
            let mut spare = crate::locked(&self.spare);
            if spare.len() < MAX_SPARE {
                spare.push(sleep);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer as _;

    #[tokio::test(start_paused = true)]
    async fn a_kept_sleep_ends_at_its_new_deadline() {
        let timer = KeptTimer::default();
        drop(timer.sleep(Duration::from_secs(30)));
        assert_eq!(timer.spare.lock().unwrap().len(), 1);
        // The kept sleep set earlier than its deadline, then later.
        let start = tokio::time::Instant::now();
        timer.sleep(Duration::from_secs(5)).await;
        assert_eq!(start.elapsed().as_secs(), 5);
        let mut sleep = timer.sleep_until(timer.now() + Duration::from_secs(60));
        timer.reset(&mut sleep, timer.now() + Duration::from_secs(20));
        let start = tokio::time::Instant::now();
        sleep.await;
        assert_eq!(start.elapsed().as_secs(), 20);
        assert_eq!(timer.spare.lock().unwrap().len(), 1);
    }
}
